//! The placement policy engine: filter, then rank, and explain both (ARCHITECTURE.md §8).
//!
//! Pure: callers pass the request, the pools (with their live state) and the effective
//! policy, and get a decision that lists every pool considered. Filters run in a fixed
//! order, and security and residency come first and fail closed:
//!
//! 1. security and residency: `confidential`/`restricted` (and any unknown classification)
//!    never go external; an external pool needs `allowExternal: true` at every level, its
//!    name in `externalPools`, and a request that does not say `external: never`; denied
//!    pools, per-pool classifications, allowed regions and the requested region;
//! 2. capability (names from [`capabilities::CAPABILITIES`]);
//! 3. size (a pool's largest sandbox);
//! 4. capacity and health (the only exclusions a request may wait out).
//!
//! Eligible pools are then ranked by the strategy ([`rank`]). Used at admission (fail fast
//! on `Rejected`) and at activation ([`ranked`]: try the next pool when one filled).

pub mod capabilities;
pub mod explain;
pub mod filter;
pub mod rank;
pub mod types;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

pub use explain::{Decision, Explained, PoolVerdict};
pub use filter::{Exclusion, Stage};
pub use types::{
    is_sensitive, EffectivePolicy, ExternalMode, Isolation, Level, PlacementRequest, Policy,
    PoolProfile, Strategy, SENSITIVE_CLASSIFICATIONS,
};

use crate::ErrorCode;

/// Decides where `req` runs among `pools` (in configured order) under `policy`.
pub fn decide(
    req: &PlacementRequest,
    pools: &[PoolProfile],
    policy: &EffectivePolicy,
) -> Explained {
    let strategy = req.strategy.unwrap_or(policy.default_strategy);
    let verdicts: Vec<PoolVerdict> = pools
        .iter()
        .map(|p| match filter::check(req, p, policy) {
            Ok(()) => PoolVerdict {
                name: p.name().to_owned(),
                eligible: true,
                reason: Some(rank::describe(req, p)),
                score: Some(rank::score(strategy, req, p)),
                stage: None,
            },
            Err(e) => PoolVerdict {
                name: p.name().to_owned(),
                eligible: false,
                reason: Some(e.reason),
                score: None,
                stage: Some(e.stage),
            },
        })
        .collect();
    let mut explained = Explained {
        decision: Decision::Waiting {
            reason: String::new(),
        },
        pools: verdicts,
    };
    explained.decision = conclude(req, &explained);
    explained
}

/// Names of the eligible pools for `req`, best first: what activation tries in turn.
pub fn ranked(
    req: &PlacementRequest,
    pools: &[PoolProfile],
    policy: &EffectivePolicy,
) -> Vec<String> {
    decide(req, pools, policy)
        .ranking()
        .into_iter()
        .map(|v| v.name.clone())
        .collect()
}

/// Whether the pool got past `stage` (eligible pools got past every stage).
fn passed(v: &PoolVerdict, stage: Stage) -> bool {
    v.stage.is_none_or(|s| s > stage)
}

fn conclude(req: &PlacementRequest, e: &Explained) -> Decision {
    if let Some(best) = e.ranking().first() {
        return Decision::Placed {
            pool: best.name.clone(),
        };
    }
    let unknown = capabilities::unknown(&req.capabilities);
    if !unknown.is_empty() {
        return Decision::Rejected {
            code: ErrorCode::UnsupportedCapability,
            reason: format!("unknown capabilities: {}", unknown.join(", ")),
        };
    }
    let waiting: Vec<(&str, &str)> = e
        .pools
        .iter()
        .filter(|v| passed(v, Stage::Size))
        .map(|v| {
            (
                v.name.as_str(),
                v.reason.as_deref().unwrap_or("unavailable"),
            )
        })
        .collect();
    if !waiting.is_empty() {
        return Decision::Waiting {
            reason: crate::wait_reason::capacity(waiting),
        };
    }
    let permitted = e.pools.iter().any(|v| passed(v, Stage::Security));
    let capable = e.pools.iter().any(|v| passed(v, Stage::Capability));
    if permitted && !capable {
        return Decision::Rejected {
            code: ErrorCode::UnsupportedCapability,
            reason: format!(
                "no permitted pool offers every required capability ({})",
                req.capabilities.join(", ")
            ),
        };
    }
    let reason = if e.pools.is_empty() {
        "no pools are configured"
    } else if capable {
        "no permitted pool can run a sandbox of this size"
    } else {
        "no pool is permitted for this request by policy"
    };
    Decision::Rejected {
        code: ErrorCode::NoEligiblePool,
        reason: reason.to_owned(),
    }
}
