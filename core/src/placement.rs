//! First placement policy: the first healthy private pool that offers the required
//! capabilities (and region, when asked). The full policy engine replaces `decide` later;
//! its contract (filter, explain, decide) stays.

use serde::{Deserialize, Serialize};

use crate::pool::{PoolView, Trust};
use crate::{ErrorCode, SandboxSpec};

/// Outcome of placing one sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "decision")]
pub enum Decision {
    /// Run it on this pool now.
    Placed { pool: String },
    /// Some pool could take it, but none can right now.
    Waiting { reason: String },
    /// No pool could ever take it.
    Rejected { code: ErrorCode, reason: String },
}

/// One pool's verdict, for the placement explanation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolVerdict {
    pub name: String,
    pub eligible: bool,
    pub reason: Option<String>,
}

/// A decision together with why each pool was or was not chosen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Explained {
    pub decision: Decision,
    pub pools: Vec<PoolVerdict>,
}

/// Decides where `spec` runs among `pools` (in configured order).
pub fn decide(spec: &SandboxSpec, pools: &[PoolView]) -> Explained {
    let unknown = spec.unknown_capabilities();
    if !unknown.is_empty() {
        return Explained {
            decision: Decision::Rejected {
                code: ErrorCode::UnsupportedCapability,
                reason: format!("unknown capabilities: {}", unknown.join(", ")),
            },
            pools: vec![],
        };
    }
    let mut verdicts = Vec::with_capacity(pools.len());
    let mut placed = None;
    let mut capable = 0;
    for p in pools {
        let reason = if p.trust == Trust::External {
            Some("external pools need an explicit policy".to_owned())
        } else if !p.offers_all(&spec.capabilities) {
            let missing: Vec<_> = spec
                .capabilities
                .iter()
                .filter(|c| !p.capabilities.contains(c))
                .map(String::as_str)
                .collect();
            Some(format!("missing capabilities: {}", missing.join(", ")))
        } else if spec.region.is_some() && spec.region != p.region {
            Some("different region".to_owned())
        } else {
            capable += 1;
            if !p.healthy {
                Some("unhealthy".to_owned())
            } else {
                None
            }
        };
        if reason.is_none() && placed.is_none() {
            placed = Some(p.name.clone());
        }
        verdicts.push(PoolVerdict {
            name: p.name.clone(),
            eligible: reason.is_none(),
            reason,
        });
    }
    let decision = match placed {
        Some(pool) => Decision::Placed { pool },
        None if capable > 0 => Decision::Waiting {
            reason: "waiting: no healthy pool".to_owned(),
        },
        None => Decision::Rejected {
            code: if spec.capabilities.is_empty() {
                ErrorCode::NoEligiblePool
            } else {
                ErrorCode::UnsupportedCapability
            },
            reason: "no pool can run this sandbox".to_owned(),
        },
    };
    Explained {
        decision,
        pools: verdicts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CreateSandboxRequest;

    fn pool(name: &str, caps: &[&str], healthy: bool) -> PoolView {
        PoolView {
            name: name.into(),
            kind: "fake".into(),
            trust: Trust::Private,
            region: None,
            capabilities: caps.iter().map(|s| s.to_string()).collect(),
            max_concurrent: None,
            healthy,
        }
    }

    fn spec(caps: &[&str]) -> SandboxSpec {
        SandboxSpec::build(&CreateSandboxRequest {
            capabilities: Some(caps.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn first_healthy_capable_pool_wins() {
        let pools = [
            pool("a", &["exec"], false),
            pool("b", &[], true),
            pool("c", &["exec"], true),
        ];
        let e = decide(&spec(&["exec"]), &pools);
        assert_eq!(e.decision, Decision::Placed { pool: "c".into() });
        assert_eq!(e.pools[0].reason.as_deref(), Some("unhealthy"));
        assert!(!e.pools[1].eligible);
    }

    #[test]
    fn capable_but_unhealthy_waits_and_incapable_rejects() {
        let pools = [pool("a", &["exec"], false)];
        assert!(matches!(
            decide(&spec(&["exec"]), &pools).decision,
            Decision::Waiting { .. }
        ));
        assert!(matches!(
            decide(&spec(&["snapshots"]), &pools).decision,
            Decision::Rejected {
                code: ErrorCode::UnsupportedCapability,
                ..
            }
        ));
        assert!(matches!(
            decide(&spec(&["teleport"]), &pools).decision,
            Decision::Rejected {
                code: ErrorCode::UnsupportedCapability,
                ..
            }
        ));
        assert!(matches!(
            decide(&spec(&[]), &[]).decision,
            Decision::Rejected {
                code: ErrorCode::NoEligiblePool,
                ..
            }
        ));
    }

    #[test]
    fn external_pools_are_never_chosen_without_policy() {
        let mut p = pool("ext", &[], true);
        p.trust = Trust::External;
        assert!(matches!(
            decide(&spec(&[]), &[p]).decision,
            Decision::Rejected { .. }
        ));
    }
}
