//! The engine's answer, shaped as `POST /v1/placement/dry-run` serves it:
//! `{decision, pool?, code?, reason?, pools: [{name, eligible, reason?, score?}]}`.

use serde::{Deserialize, Serialize};

use super::filter::Stage;
use crate::ErrorCode;

/// Outcome of placing one sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "decision")]
pub enum Decision {
    /// Run it on this pool (the best ranked eligible pool).
    Placed { pool: String },
    /// Only capacity or health stands between the request and some pool.
    Waiting { reason: String },
    /// No permitted pool could ever take it: `no_eligible_pool` or `unsupported_capability`.
    Rejected { code: ErrorCode, reason: String },
}

/// One pool's verdict: why it was excluded, or how it scored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolVerdict {
    /// Pool name.
    pub name: String,
    /// Whether it passed every filter.
    pub eligible: bool,
    /// Exclusion reason, or for an eligible pool a short account of its score.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub reason: Option<String>,
    /// Score in [0, 100] for an eligible pool; higher ranks first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub score: Option<f64>,
    /// The stage that excluded it: `capacity` may pass by itself (the request can wait),
    /// the others will not. Absent for an eligible pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub stage: Option<Stage>,
}

/// A decision with every pool considered, in configured order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Explained {
    /// What happens to the request.
    #[serde(flatten)]
    pub decision: Decision,
    /// Every pool considered, excluded or scored.
    pub pools: Vec<PoolVerdict>,
}

impl Explained {
    /// Eligible pools in rank order (best score first, ties in configured order), so
    /// activation can try the next when the first filled concurrently.
    pub fn ranking(&self) -> Vec<&PoolVerdict> {
        let scored: Vec<(usize, f64)> = self
            .pools
            .iter()
            .enumerate()
            .filter(|(_, v)| v.eligible)
            .map(|(i, v)| (i, v.score.unwrap_or(0.0)))
            .collect();
        super::rank::order(&scored)
            .into_iter()
            .filter_map(|i| self.pools.get(i))
            .collect()
    }

    /// The stored placement explanation (`GET …/placement`): this decision with the
    /// effective policy it was made under (the trust report shows it for external
    /// placements) and when. One shape whoever decided: the leader or an admission.
    pub fn record(
        &self,
        policy: &super::EffectivePolicy,
        decided_at: chrono::DateTime<chrono::Utc>,
    ) -> serde_json::Value {
        let mut doc = serde_json::to_value(self).unwrap_or_default();
        if let Some(obj) = doc.as_object_mut() {
            obj.insert(
                "policy".into(),
                serde_json::to_value(policy).unwrap_or_default(),
            );
            obj.insert("decidedAt".into(), serde_json::json!(decided_at));
        }
        doc
    }
}
