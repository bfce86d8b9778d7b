//! The placement decision as the API makes it: the fail-fast check at admission (and the
//! placement a create may apply in its own admission), and the dry-run's explanation.

use std::collections::HashMap;

use chrono::Utc;
use differently_core::policy::{self, Decision, EffectivePolicy, Explained};
use differently_core::{ErrorCode, FieldError, OrgId, ProjectId, SandboxSpec};
use differently_store::placement::effective_policy;
use differently_store::{DirectPlacement, PoolSlot};

use crate::error::{ApiError, ApiResult};
use crate::AppState;

/// Maps a request-level validation error: unknown capabilities have their own code.
pub fn request_error(e: FieldError) -> ApiError {
    let code = if e.field == "capabilities" {
        ErrorCode::UnsupportedCapability
    } else {
        ErrorCode::ValidationFailed
    };
    ApiError::field(code, e)
}

/// Decides where `spec` would go now under the effective policy of `project`. With
/// `live_slots`, pools' used slots count (dry-run); without, only rejection matters
/// (admission: a full pool means waiting, not refusal).
pub async fn explain(
    state: &AppState,
    org: &OrgId,
    project: &ProjectId,
    spec: &SandboxSpec,
    live_slots: bool,
) -> ApiResult<Explained> {
    Ok(decide(state, org, project, spec, live_slots).await?.0)
}

/// [`explain`] with the effective policy it decided under.
pub async fn decide(
    state: &AppState,
    org: &OrgId,
    project: &ProjectId,
    spec: &SandboxSpec,
    live_slots: bool,
) -> ApiResult<(Explained, EffectivePolicy)> {
    let req = spec.placement_request();
    req.validate().map_err(request_error)?;
    // The create's fail-fast check may use a policy up to a second old (`policy_cache`); an
    // explanation a caller asked for reads the store.
    let (effective, used) = if live_slots {
        (
            effective_policy(state.store.as_ref(), org, project).await?,
            state.store.pool_slots_used().await?,
        )
    } else {
        (
            state
                .policies
                .effective(state.store.as_ref(), org, project)
                .await?,
            HashMap::new(),
        )
    };
    let explained = policy::decide(&req, &state.pools.profiles(&used), &effective);
    Ok((explained, effective))
}

/// The placement a create applies in its own admission (`DirectPlacement`), when allowed
/// (`[api] direct_placement`) and it decides the same as the leader would: the decision
/// placed it and no eligible pool has a concurrency cap (the admission decided without
/// live slot counts, which only rank and limit capped pools).
pub fn direct(
    state: &AppState,
    explained: &Explained,
    effective: &EffectivePolicy,
) -> Option<DirectPlacement> {
    if !state.limits.direct_placement {
        return None;
    }
    let Decision::Placed { pool } = &explained.decision else {
        return None;
    };
    let ranking = explained.ranking();
    let capped = ranking.iter().any(|v| {
        state
            .pools
            .get(&v.name)
            .is_none_or(|p| p.record.max_concurrent.is_some())
    });
    if capped {
        return None;
    }
    Some(DirectPlacement {
        pool: PoolSlot {
            name: pool.clone(),
            max_concurrent: None,
        },
        explanation: explained.record(effective, Utc::now()),
        warm_class: None,
        claim_call: false,
    })
}
