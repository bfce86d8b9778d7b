//! Ranking of eligible pools. Only pools that passed every filter are scored, so no
//! ranking can undo a security or residency decision.
//!
//! A score is a weighted sum of five terms, each in [0, 1], with weights summing to 100.
//! The strategy's primary term weighs 90, so it dominates; the others break near-ties.
//! Scores are rounded to two decimals and ties go to the pool configured first.

use super::types::{PlacementRequest, PoolProfile, Strategy, UNKNOWN_CREATE_SECONDS};

/// The score terms of one pool, each in [0, 1], higher is better.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Terms {
    /// 1 for a private pool, 0 for an external one.
    pub trust: f64,
    /// 1 / (1 + hourly cost of the requested CPUs).
    pub cost: f64,
    /// 10 / (10 + typical create seconds).
    pub speed: f64,
    /// Share of concurrency slots free (1 without a cap).
    pub headroom: f64,
    /// 1 when the pool is in the preferred region.
    pub locality: f64,
}

/// Weights (trust, cost, speed, headroom, locality) per strategy; each row sums to 100.
fn weights(strategy: Strategy) -> [f64; 5] {
    match strategy {
        Strategy::PrivateFirst => [90.0, 4.0, 3.0, 1.0, 2.0],
        Strategy::Cheapest => [4.0, 90.0, 3.0, 1.0, 2.0],
        Strategy::Fastest => [4.0, 3.0, 90.0, 1.0, 2.0],
        Strategy::LeastLoaded => [4.0, 3.0, 2.0, 90.0, 1.0],
    }
}

/// A non-negative finite value, or `fallback`.
fn sane(x: f64, fallback: f64) -> f64 {
    if x.is_finite() && x >= 0.0 {
        x
    } else {
        fallback
    }
}

/// The terms of `pool` for `req`. Bad numbers (negative, NaN) count as the worst case.
pub fn terms(req: &PlacementRequest, pool: &PoolProfile) -> Terms {
    let hourly = sane(pool.cost_per_cpu_hour, f64::INFINITY) * f64::from(req.resources.cpu);
    let create = pool
        .typical_create_seconds
        .map_or(UNKNOWN_CREATE_SECONDS, |s| sane(s, UNKNOWN_CREATE_SECONDS));
    let headroom = match pool.view.max_concurrent {
        Some(max) if max > 0 => f64::from(max.saturating_sub(pool.used_slots)) / f64::from(max),
        Some(_) => 0.0,
        None => 1.0,
    };
    let preferred = req.prefer_region.as_deref().or(req.region.as_deref());
    let locality = match (preferred, pool.view.region.as_deref()) {
        (Some(a), Some(b)) if a == b => 1.0,
        _ => 0.0,
    };
    Terms {
        trust: if pool.is_external() { 0.0 } else { 1.0 },
        cost: if hourly.is_finite() {
            1.0 / (1.0 + hourly)
        } else {
            0.0
        },
        speed: 10.0 / (10.0 + create),
        headroom,
        locality,
    }
}

/// The score of `pool` under `strategy`, in [0, 100], rounded to two decimals.
pub fn score(strategy: Strategy, req: &PlacementRequest, pool: &PoolProfile) -> f64 {
    let t = terms(req, pool);
    let w = weights(strategy);
    let raw =
        w[0] * t.trust + w[1] * t.cost + w[2] * t.speed + w[3] * t.headroom + w[4] * t.locality;
    (raw * 100.0).round() / 100.0
}

/// A short account of how `pool` scored, for the explanation.
pub fn describe(req: &PlacementRequest, pool: &PoolProfile) -> String {
    let trust = if pool.is_external() {
        "external"
    } else {
        "private"
    };
    let hourly = sane(pool.cost_per_cpu_hour, f64::INFINITY) * f64::from(req.resources.cpu);
    let create = match pool.typical_create_seconds {
        Some(s) if s.is_finite() && s >= 0.0 => format!("~{s}s create"),
        _ => "create time unknown".to_owned(),
    };
    let slots = match pool.view.max_concurrent {
        Some(max) => format!("{}/{max} slots used", pool.used_slots),
        None => "no slot cap".to_owned(),
    };
    format!("{trust}, cost {hourly:.2}/h, {create}, {slots}")
}

/// Indices of the scored entries in rank order: best score first, then configured order.
pub fn order(scores: &[(usize, f64)]) -> Vec<usize> {
    let mut v = scores.to_vec();
    v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    v.into_iter().map(|(i, _)| i).collect()
}
