//! Property tests over random pools, three policy levels and requests.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::sample::subsequence;
use proptest::strategy::Strategy;

use super::*;
use crate::pool::{PoolView, Trust};
use crate::sandbox::CLASSIFICATIONS;
use crate::Resources;

const NAMES: [&str; 6] = ["a", "b", "c", "d", "e", "f"];
const REGIONS: [&str; 3] = ["dc1", "eu-west", "us-east"];

fn cap_names() -> Vec<&'static str> {
    capabilities::CAPABILITIES.iter().map(|c| c.name).collect()
}

fn strings(v: Vec<&str>) -> Vec<String> {
    v.into_iter().map(str::to_owned).collect()
}

fn names_subset() -> impl Strategy<Value = Vec<String>> {
    subsequence(NAMES.to_vec(), 0..=NAMES.len()).prop_map(strings)
}

fn classes_subset() -> impl Strategy<Value = Vec<String>> {
    subsequence(CLASSIFICATIONS.to_vec(), 0..=CLASSIFICATIONS.len()).prop_map(strings)
}

fn strategy() -> impl Strategy<Value = super::Strategy> {
    proptest::sample::select(super::Strategy::ALL.to_vec())
}

fn arb_pool(name: &'static str) -> impl Strategy<Value = PoolProfile> {
    (
        (
            prop::bool::weighted(0.5),
            prop::option::weighted(0.85, proptest::sample::select(REGIONS.to_vec())),
            subsequence(cap_names(), 0..=12),
            prop::option::of(prop_oneof![
                Just(Isolation::Container),
                Just(Isolation::Microvm)
            ]),
            prop::bool::weighted(0.85),
        ),
        (
            prop::option::of(1u32..4),
            0u32..5,
            0u32..300,
            prop::option::of(0u32..120),
            prop::option::weighted(0.3, 1u32..8),
        ),
    )
        .prop_map(
            move |((ext, region, caps, isolation, healthy), (max, used, cost, create, max_cpu))| {
                PoolProfile {
                    view: PoolView {
                        name: name.to_owned(),
                        kind: "fake".into(),
                        trust: if ext { Trust::External } else { Trust::Private },
                        region: region.map(str::to_owned),
                        capabilities: strings(caps),
                        max_concurrent: max,
                        healthy,
                    },
                    isolation,
                    cost_per_cpu_hour: f64::from(cost) / 100.0,
                    typical_create_seconds: create.map(f64::from),
                    used_slots: used,
                    max_sandbox: max_cpu.map(|cpu| Resources { cpu, ..BIG }),
                }
            },
        )
}

/// Large memory and disk, so random size limits only bite on CPU.
const BIG: Resources = Resources {
    cpu: 256,
    memory_mib: Resources::MAX_MEMORY_MIB,
    disk_gib: Resources::MAX_DISK_GIB,
};

fn arb_pools() -> impl Strategy<Value = Vec<PoolProfile>> {
    subsequence(NAMES.to_vec(), 0..=NAMES.len())
        .prop_flat_map(|names| names.into_iter().map(arb_pool).collect::<Vec<_>>())
}

/// One level. Restrictions appear now and then (they compound over three levels), and
/// external placement is mostly allowed, so every outcome is exercised.
fn arb_policy(global: bool) -> impl Strategy<Value = Policy> {
    let named = if global {
        prop::option::weighted(
            0.9,
            subsequence(NAMES.to_vec(), 2..=NAMES.len()).prop_map(strings),
        )
        .boxed()
    } else {
        prop::option::weighted(0.3, names_subset()).boxed()
    };
    (
        prop::option::weighted(0.1, classes_subset()),
        prop::collection::btree_map(
            proptest::sample::select(NAMES.to_vec()).prop_map(str::to_owned),
            classes_subset(),
            0..2,
        ),
        prop::option::weighted(
            0.15,
            subsequence(REGIONS.to_vec(), 0..=REGIONS.len()).prop_map(strings),
        ),
        prop_oneof![12 => Just(Some(true)), 1 => Just(Some(false)), 1 => Just(None)],
        named,
        prop_oneof![
            4 => Just(vec![]),
            1 => subsequence(NAMES.to_vec(), 1..=1).prop_map(strings),
        ],
        prop::option::of(strategy()),
    )
        .prop_map(
            |(classes, pool_classes, regions, allow, ext, denied, strat): (
                _,
                BTreeMap<String, Vec<String>>,
                _,
                _,
                _,
                _,
                _,
            )| Policy {
                allowed_classifications: classes,
                pool_classifications: pool_classes,
                allowed_regions: regions,
                allow_external: allow,
                external_pools: ext,
                denied_pools: denied,
                default_strategy: strat,
            },
        )
}

/// Global, org and project levels.
fn arb_levels() -> impl Strategy<Value = (Policy, Policy, Policy)> {
    (arb_policy(true), arb_policy(false), arb_policy(false))
}

fn arb_request() -> impl Strategy<Value = PlacementRequest> {
    let mut caps = cap_names();
    caps.push("teleport");
    (
        // "secret" is outside the configured set: it must fail closed.
        prop_oneof![
            4 => Just("public"),
            4 => Just("internal"),
            2 => Just("confidential"),
            2 => Just("restricted"),
            1 => Just("secret"),
        ],
        prop_oneof![4 => Just(vec![]), 3 => subsequence(caps, 0..=2)],
        prop::option::weighted(0.2, proptest::sample::select(REGIONS.to_vec())),
        prop::option::of(strategy()),
        prop_oneof![
            1 => Just(ExternalMode::Never),
            6 => Just(ExternalMode::Allowed),
            1 => Just(ExternalMode::Required),
        ],
        1u32..8,
        prop::option::of(proptest::sample::select(REGIONS.to_vec())),
    )
        .prop_map(
            |(class, caps, region, strat, external, cpu, prefer)| PlacementRequest {
                resources: Resources {
                    cpu,
                    ..Resources::DEFAULT
                },
                capabilities: strings(caps),
                classification: class.to_owned(),
                region: region.map(str::to_owned),
                strategy: strat,
                external,
                prefer_region: prefer.map(str::to_owned),
                pinned_pool: None,
            },
        )
}

fn pool_named<'a>(pools: &'a [PoolProfile], name: &str) -> &'a PoolProfile {
    pools.iter().find(|p| p.name() == name).unwrap()
}

fn level_allows_class(p: &Policy, pool: &str, class: &str) -> bool {
    p.allowed_classifications
        .as_ref()
        .is_none_or(|l| l.iter().any(|c| c == class))
        && p.pool_classifications
            .get(pool)
            .is_none_or(|l| l.iter().any(|c| c == class))
}

fn level_allows_region(p: &Policy, region: Option<&str>) -> bool {
    match (&p.allowed_regions, region) {
        (None, _) => true,
        (Some(l), Some(r)) => l.iter().any(|x| x == r),
        (Some(_), None) => false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// (1) restricted/confidential (or unknown) never lands on an external pool, whatever the ranking.
    #[test]
    fn sensitive_never_external(
        req in arb_request(), pools in arb_pools(),
        (g, o, p) in arb_levels(),
    ) {
        // The random levels, and levels that allow every external pool outright.
        let open = Policy {
            allow_external: Some(true),
            external_pools: Some(strings(NAMES.to_vec())),
            ..Policy::default()
        };
        let policies = [
            EffectivePolicy::intersect(&g, &o, &p),
            EffectivePolicy::intersect(&open, &open, &open),
        ];
        for (strat, eff) in super::Strategy::ALL.into_iter().flat_map(|s| policies.iter().map(move |e| (s, e))) {
            let req = PlacementRequest { strategy: Some(strat), ..req.clone() };
            let e = decide(&req, &pools, eff);
            if is_sensitive(&req.classification) {
                for v in e.pools.iter().filter(|v| v.eligible) {
                    prop_assert!(!pool_named(&pools, &v.name).is_external());
                }
                for name in ranked(&req, &pools, eff) {
                    prop_assert!(!pool_named(&pools, &name).is_external());
                }
            }
        }
    }

    /// (2) an eligible external pool implies every level allows external, the pool is named
    /// by the global level and by every lower level that names pools, and the request allows it.
    #[test]
    fn external_needs_every_level_and_the_name(
        req in arb_request(), pools in arb_pools(),
        (g, o, p) in arb_levels(),
    ) {
        let eff = EffectivePolicy::intersect(&g, &o, &p);
        let e = decide(&req, &pools, &eff);
        for v in e.pools.iter().filter(|v| v.eligible) {
            if pool_named(&pools, &v.name).is_external() {
                for level in [&g, &o, &p] {
                    prop_assert_eq!(level.allow_external, Some(true));
                }
                prop_assert!(g.external_pools.iter().flatten().any(|n| *n == v.name));
                for level in [&o, &p] {
                    prop_assert!(level.external_pools.as_ref().is_none_or(|l| l.contains(&v.name)));
                }
                prop_assert_ne!(req.external, ExternalMode::Never);
            }
        }
    }

    /// (3) the intersection never allows what any level forbids, and an eligible pool is
    /// permitted by the global level alone (lower levels only narrow).
    #[test]
    fn intersect_is_within_every_level(
        req in arb_request(), pools in arb_pools(),
        (g, o, p) in arb_levels(),
    ) {
        let eff = EffectivePolicy::intersect(&g, &o, &p);
        let levels = [&g, &o, &p];
        for name in NAMES {
            for class in CLASSIFICATIONS {
                if eff.allows_classification(name, class) {
                    for l in levels {
                        prop_assert!(level_allows_class(l, name, class));
                    }
                }
            }
            if eff.external_pools.contains(name) {
                prop_assert!(g.external_pools.iter().flatten().any(|n| n == name));
                for l in [&o, &p] {
                    prop_assert!(l.external_pools.as_ref().is_none_or(|x| x.iter().any(|n| n == name)));
                }
            }
            for l in levels {
                if l.denied_pools.iter().any(|n| n == name) {
                    prop_assert!(eff.denied_pools.contains(name));
                }
            }
        }
        for region in REGIONS.iter().copied().map(Some).chain([None]) {
            if eff.allows_region(region) {
                for l in levels {
                    prop_assert!(level_allows_region(l, region));
                }
            }
        }
        if eff.allows_external() {
            for l in levels {
                prop_assert_eq!(l.allow_external, Some(true));
            }
        }
        let open = Policy { allow_external: Some(true), ..Policy::default() };
        let global_only = EffectivePolicy::intersect(&g, &open, &open);
        for pool in &pools {
            if filter::security(&req, pool, &eff).is_none() {
                prop_assert!(filter::security(&req, pool, &global_only).is_none());
            }
        }
    }

    /// (4) when rejected, the code is unsupported_capability exactly when a capability name
    /// is unknown or some pool passed security and residency but none had the capabilities;
    /// waiting exactly when only capacity or health stands in the way.
    #[test]
    fn rejection_code_is_exact(
        req in arb_request(), pools in arb_pools(),
        (g, o, p) in arb_levels(),
    ) {
        let eff = EffectivePolicy::intersect(&g, &o, &p);
        let e = decide(&req, &pools, &eff);
        let permitted: Vec<&PoolProfile> =
            pools.iter().filter(|x| filter::security(&req, x, &eff).is_none()).collect();
        let capable: Vec<&PoolProfile> =
            permitted.iter().copied().filter(|x| filter::capability(&req, x).is_none()).collect();
        let sized = capable.iter().any(|x| filter::size(&req, x).is_none());
        let unknown = !capabilities::unknown(&req.capabilities).is_empty();
        match &e.decision {
            Decision::Rejected { code, .. } => {
                prop_assert!(!sized);
                let expect = if unknown || (!permitted.is_empty() && capable.is_empty()) {
                    ErrorCode::UnsupportedCapability
                } else {
                    ErrorCode::NoEligiblePool
                };
                prop_assert_eq!(*code, expect);
            }
            Decision::Waiting { .. } => {
                prop_assert!(sized && !unknown);
                prop_assert!(e.pools.iter().all(|v| !v.eligible));
            }
            Decision::Placed { .. } => prop_assert!(sized && !unknown),
        }
    }

    /// (5) the same input gives the same output, to the byte.
    #[test]
    fn deterministic(
        req in arb_request(), pools in arb_pools(),
        (g, o, p) in arb_levels(),
    ) {
        let a = decide(&req, &pools, &EffectivePolicy::intersect(&g, &o, &p));
        let b = decide(&req.clone(), &pools.clone(), &EffectivePolicy::intersect(&g, &o, &p));
        prop_assert_eq!(serde_json::to_string(&a).unwrap(), serde_json::to_string(&b).unwrap());
        prop_assert_eq!(a, b);
    }

    /// (6) the chosen pool is eligible, has the top score, and heads the ranking; every pool
    /// is explained in configured order, with a score exactly when eligible.
    #[test]
    fn chosen_pool_is_eligible_and_best(
        req in arb_request(), pools in arb_pools(),
        (g, o, p) in arb_levels(),
    ) {
        let eff = EffectivePolicy::intersect(&g, &o, &p);
        let e = decide(&req, &pools, &eff);
        let names: Vec<&str> = e.pools.iter().map(|v| v.name.as_str()).collect();
        let configured: Vec<&str> = pools.iter().map(|x| x.name()).collect();
        prop_assert_eq!(names, configured);
        for v in &e.pools {
            prop_assert_eq!(v.eligible, v.score.is_some());
            prop_assert!(v.reason.is_some());
        }
        let order = ranked(&req, &pools, &eff);
        prop_assert_eq!(order.len(), e.pools.iter().filter(|v| v.eligible).count());
        if let Decision::Placed { pool } = &e.decision {
            let chosen = e.pools.iter().find(|v| &v.name == pool).unwrap();
            prop_assert!(chosen.eligible);
            let top = e.pools.iter().filter_map(|v| v.score).fold(f64::MIN, f64::max);
            prop_assert_eq!(chosen.score, Some(top));
            prop_assert_eq!(order.first(), Some(pool));
        } else {
            prop_assert!(order.is_empty());
        }
    }
}
