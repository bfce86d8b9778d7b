//! The filters, in the order they run: security and residency (fail closed), capability,
//! size, then capacity and health. The first failing check names the pool's exclusion.

use serde::{Deserialize, Serialize};

use super::capabilities;
use super::types::{is_sensitive, EffectivePolicy, ExternalMode, PlacementRequest, PoolProfile};

/// The filter stage that excluded a pool. Ordered: a later stage means the pool got further.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// Classification, trust and external permission, denied pools, region.
    Security,
    /// Required capabilities.
    Capability,
    /// The request is larger than the pool can ever run.
    Size,
    /// Health and concurrency slots: may change by itself, so the request can wait.
    Capacity,
}

/// Why one pool was excluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exclusion {
    /// Where it was excluded.
    pub stage: Stage,
    /// Stable, human-readable reason.
    pub reason: String,
}

/// One filter: the exclusion reason, if the pool fails it.
type Check = fn(&PlacementRequest, &PoolProfile, &EffectivePolicy) -> Option<String>;

/// Runs every stage on one pool; `Ok` means eligible.
pub fn check(
    req: &PlacementRequest,
    pool: &PoolProfile,
    policy: &EffectivePolicy,
) -> Result<(), Exclusion> {
    let stages: [(Stage, Check); 4] = [
        (Stage::Security, security),
        (Stage::Capability, |r, p, _| capability(r, p)),
        (Stage::Size, |r, p, _| size(r, p)),
        (Stage::Capacity, |_, p, _| capacity(p)),
    ];
    for (stage, run) in stages {
        if let Some(reason) = run(req, pool, policy) {
            return Err(Exclusion { stage, reason });
        }
    }
    Ok(())
}

/// Security and residency. Runs first; every unknown or missing fact excludes the pool.
pub fn security(
    req: &PlacementRequest,
    pool: &PoolProfile,
    policy: &EffectivePolicy,
) -> Option<String> {
    if let Some(pin) = &req.pinned_pool {
        if pin != pool.name() {
            return Some(format!("pinned to pool {pin}, which holds its snapshot"));
        }
    }
    let class = req.classification.as_str();
    if pool.is_external() {
        if is_sensitive(class) {
            return Some(format!(
                "classification {class} not allowed on external pools"
            ));
        }
        if let Some(level) = policy.external_forbidden_by {
            return Some(format!("external placement not allowed by {level} policy"));
        }
        if !policy.external_pools.contains(pool.name()) {
            return Some("pool not named in externalPools".to_owned());
        }
        if req.external == ExternalMode::Never {
            return Some("request does not allow external pools (external: never)".to_owned());
        }
    } else if req.external == ExternalMode::Required {
        return Some("request requires an external pool (external: required)".to_owned());
    }
    if policy.denied_pools.contains(pool.name()) {
        return Some("pool denied by policy".to_owned());
    }
    if !policy.allows_classification(pool.name(), class) {
        return Some(format!("classification {class} not allowed on this pool"));
    }
    let pool_region = pool.view.region.as_deref();
    if !policy.allows_region(pool_region) {
        return Some(match pool_region {
            Some(r) => format!("region {r} not allowed"),
            None => "pool declares no region; policy allows only listed regions".to_owned(),
        });
    }
    if let Some(want) = req.region.as_deref() {
        match pool_region {
            Some(r) if r == want => {}
            Some(r) => return Some(format!("region {r} is not the requested {want}")),
            None => return Some(format!("pool declares no region; request asks for {want}")),
        }
    }
    None
}

/// Capabilities: unknown names are never offered; otherwise lists what the pool lacks.
pub fn capability(req: &PlacementRequest, pool: &PoolProfile) -> Option<String> {
    let unknown = capabilities::unknown(&req.capabilities);
    if !unknown.is_empty() {
        return Some(format!("unknown capabilities: {}", unknown.join(", ")));
    }
    let missing: Vec<&str> = req
        .capabilities
        .iter()
        .map(String::as_str)
        .filter(|c| !capabilities::offers(&pool.view, pool.isolation, c))
        .collect();
    if missing.is_empty() {
        None
    } else {
        Some(format!("missing capabilities: {}", missing.join(", ")))
    }
}

/// Static size limit of the pool.
pub fn size(req: &PlacementRequest, pool: &PoolProfile) -> Option<String> {
    let max = pool.max_sandbox?;
    let r = req.resources;
    if r.cpu > max.cpu {
        Some(format!(
            "too large: {} CPU asked, pool runs at most {}",
            r.cpu, max.cpu
        ))
    } else if r.memory_mib > max.memory_mib {
        Some(format!(
            "too large: {} MiB memory asked, pool runs at most {}",
            r.memory_mib, max.memory_mib
        ))
    } else if r.disk_gib > max.disk_gib {
        Some(format!(
            "too large: {} GiB disk asked, pool runs at most {}",
            r.disk_gib, max.disk_gib
        ))
    } else {
        None
    }
}

/// Health and concurrency slots, from the live view.
pub fn capacity(pool: &PoolProfile) -> Option<String> {
    if !pool.view.healthy {
        return Some("unhealthy".to_owned());
    }
    match pool.view.max_concurrent {
        Some(max) if pool.used_slots >= max => Some(format!("full {}/{max}", pool.used_slots)),
        _ => None,
    }
}
