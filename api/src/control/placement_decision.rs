//! The placement decision as the API makes it: the fail-fast check at admission (and the
//! placement a create may apply in its own admission), and the dry-run's explanation.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::Utc;
use differently_core::policy::{self, Decision, EffectivePolicy, Explained};
use differently_core::{ErrorCode, FieldError, OrgId, ProjectId, SandboxSpec};
use differently_store::placement::effective_policy;
use differently_store::{DirectPlacement, PoolSlot};

use crate::caches::warm::WarmView;
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
    let (explained, effective, _) = decide_warm(state, org, project, spec, live_slots).await?;
    Ok((explained, effective))
}

/// [`decide`] with the warm view it ranked by ([`prefer_warm`]): the cached one for a
/// create (`live_slots` false), a fresh read for an explanation a caller asked for.
pub async fn decide_warm(
    state: &AppState,
    org: &OrgId,
    project: &ProjectId,
    spec: &SandboxSpec,
    live_slots: bool,
) -> ApiResult<(Explained, EffectivePolicy, Arc<WarmView>)> {
    let req = spec.placement_request();
    req.validate().map_err(request_error)?;
    // The create's fail-fast check may use a policy up to a second old (`caches::policy`); an
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
    let mut explained = policy::decide(&req, &state.pools.profiles(&used), &effective);
    let warm = if live_slots {
        Arc::new(WarmView::read(state.store.as_ref()).await?)
    } else {
        state.warm.view(state.store.as_ref()).await?
    };
    prefer_warm(&mut explained, spec, &warm);
    Ok((explained, effective, warm))
}

/// Warm capacity ranks among the pools policy placed on, never beyond them: when the
/// decision is to place, the best-ranked eligible pool holding a ready instance of the class
/// the create matches is chosen instead, and each eligible pool with a matching class says
/// so in its reason (`warm: ready (class X)`, or `warm: none ready (class X)`). Excluded
/// pools and decisions to wait or refuse are left as policy made them.
pub fn prefer_warm(explained: &mut Explained, spec: &SandboxSpec, warm: &WarmView) {
    if !matches!(explained.decision, Decision::Placed { .. }) {
        return;
    }
    let ranking: Vec<String> = explained.ranking().iter().map(|v| v.name.clone()).collect();
    let mut chosen = None;
    for name in &ranking {
        let Some(class) = warm.class_for(name, spec) else {
            continue;
        };
        let ready = warm.ready(name, &class.name);
        let note = if ready > 0 {
            chosen.get_or_insert_with(|| name.clone());
            format!("warm: ready (class {})", class.name)
        } else {
            format!("warm: none ready (class {})", class.name)
        };
        if let Some(v) = explained.pools.iter_mut().find(|v| &v.name == name) {
            v.reason = Some(match v.reason.take() {
                Some(r) if !r.is_empty() => format!("{r}; {note}"),
                _ => note,
            });
        }
    }
    if let Some(pool) = chosen {
        explained.decision = Decision::Placed { pool };
    }
}

/// The placement a create applies in its own admission (`DirectPlacement`), when allowed
/// (`[api] direct_placement`) and it decides the same as the leader would:
///
/// - the decision placed it and no eligible pool has a concurrency cap (the admission
///   decided without live slot counts, which only rank and limit capped pools): placed warm
///   or cold;
/// - the decision placed it on a **capped** pool with a class the create matches: a claim
///   only (`DirectPlacement::claim_only`). A warm instance already holds a slot of the cap,
///   so the store applies it only when a ready instance is left, a live slot is free and no
///   queued sandbox may be waiting for the pool; otherwise the create is queued for the
///   leader, never placed cold.
///
/// The pool's class the create matches, if any, goes with it (`warm_class`): the admission
/// claims a ready instance of it when one is left, and `claim_call` says whether the pool's
/// adapter must then be called before the instance is the tenant's.
pub fn direct(
    state: &AppState,
    explained: &Explained,
    effective: &EffectivePolicy,
    spec: &SandboxSpec,
    warm: &WarmView,
) -> Option<DirectPlacement> {
    if !state.limits.direct_placement {
        return None;
    }
    let Decision::Placed { pool } = &explained.decision else {
        return None;
    };
    let chosen = state.pools.get(pool)?;
    let warm_class = warm.class_for(pool, spec).map(|c| c.name.clone());
    let max_concurrent = chosen.record.max_concurrent;
    if max_concurrent.is_some() {
        // A claim only, and only with a class to claim from.
        warm_class.as_ref()?;
    } else {
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
    }
    let claim_call = warm_class.is_some() && chosen.adapter.claim_call();
    Some(DirectPlacement {
        pool: PoolSlot {
            name: pool.clone(),
            max_concurrent,
        },
        explanation: explained.record(effective, Utc::now()),
        warm_class,
        claim_call,
    })
}
