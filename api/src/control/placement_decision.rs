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

/// A dry run's answer: the policy's decision (`explained`, decided with live slot counts),
/// then what the create meets after the policy, as the store's admission and the leader's
/// activation would apply them now: an admission limit (a sandbox bigger than a quota, a
/// quota of no active sandbox, a full queue) makes it `rejected` with `quota_exceeded`, and
/// a quota that is used up now makes a placed request `waiting` with the limit's `reason`
/// and its `wall`, as `GET …/placement` would explain the queued sandbox. Without this a dry
/// run said `placed` for a create the API refuses with 429 or queues.
pub async fn dry_run(
    state: &AppState,
    org: &OrgId,
    project: &ProjectId,
    spec: &SandboxSpec,
    explained: Explained,
) -> ApiResult<serde_json::Value> {
    use differently_core::accounting::{check_admission_limits, waiting_reason, PoolCap, Wall};
    use differently_core::Sandbox;
    use differently_store::QuotaScope;

    let mut doc = serde_json::to_value(&explained).map_err(ApiError::internal)?;
    if matches!(explained.decision, Decision::Rejected { .. }) {
        return Ok(doc);
    }
    let (org_scope, project_scope) = (
        QuotaScope::Org(org.clone()),
        QuotaScope::Project(project.clone()),
    );
    let org_quota = state
        .store
        .get_quota(&org_scope)
        .await?
        .unwrap_or_default()
        .or(&state.limits.quota_defaults);
    let project_quota = state
        .store
        .get_quota(&project_scope)
        .await?
        .unwrap_or_default();
    let org_used = state.store.usage(&org_scope).await?;
    let project_used = state.store.usage(&project_scope).await?;
    let sbx = Sandbox::queued(org.clone(), project.clone(), spec.clone(), None, Utc::now());
    let org_level = (&org_used, &org_quota);
    let project_level = (&project_used, &project_quota);
    let set = |doc: &mut serde_json::Value, fields: &[(&str, serde_json::Value)]| {
        if let Some(o) = doc.as_object_mut() {
            o.remove("pool");
            for (k, v) in fields {
                o.insert((*k).to_owned(), v.clone());
            }
        }
    };
    if let Err(refused) = check_admission_limits(&sbx, org_level, project_level) {
        set(
            &mut doc,
            &[
                ("decision", "rejected".into()),
                ("code", ErrorCode::QuotaExceeded.as_str().into()),
                ("reason", refused.message.into()),
            ],
        );
        return Ok(doc);
    }
    if matches!(explained.decision, Decision::Placed { .. }) {
        // The pool's own cap is the policy's (live slots: a full pool is not eligible now).
        let no_cap = PoolCap {
            name: "",
            max_concurrent: None,
        };
        if let Some((wall, reason)) = waiting_reason(org_level, project_level, 0, &sbx, no_cap) {
            debug_assert!(wall != Wall::Pool);
            set(
                &mut doc,
                &[
                    ("decision", "waiting".into()),
                    ("reason", reason.into()),
                    ("wall", wall.as_str().into()),
                ],
            );
        }
    }
    Ok(doc)
}
