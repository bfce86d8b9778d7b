//! Table-driven tests of each rule of the engine.

use serde_json::json;

use super::*;
use crate::pool::{PoolView, Trust};
use crate::{CreateSandboxRequest, Resources, SandboxSpec};

fn pool(name: &str, trust: Trust, region: Option<&str>, caps: &[&str]) -> PoolProfile {
    PoolProfile::new(PoolView {
        name: name.into(),
        kind: "fake".into(),
        trust,
        region: region.map(Into::into),
        capabilities: caps.iter().map(|s| s.to_string()).collect(),
        max_concurrent: None,
        healthy: true,
    })
}

fn private(name: &str) -> PoolProfile {
    pool(name, Trust::Private, Some("dc1"), &["exec", "files"])
}

fn external(name: &str) -> PoolProfile {
    pool(name, Trust::External, Some("dc1"), &["exec", "files"])
}

fn req(classification: &str) -> PlacementRequest {
    PlacementRequest {
        resources: Resources::DEFAULT,
        capabilities: vec![],
        classification: classification.into(),
        region: None,
        strategy: None,
        external: ExternalMode::Allowed,
        prefer_region: None,
        pinned_pool: None,
    }
}

fn with_caps(caps: &[&str]) -> PlacementRequest {
    PlacementRequest {
        capabilities: caps.iter().map(|s| s.to_string()).collect(),
        ..req("internal")
    }
}

fn policy(v: serde_json::Value) -> Policy {
    serde_json::from_value(v).unwrap()
}

/// Every level allows external placement and names `names`.
fn open_external(names: &[&str]) -> EffectivePolicy {
    let p = policy(json!({"allowExternal": true, "externalPools": names}));
    EffectivePolicy::intersect(&p, &p, &p)
}

fn reason_of<'a>(e: &'a Explained, name: &str) -> Option<&'a str> {
    e.pools
        .iter()
        .find(|v| v.name == name)
        .and_then(|v| v.reason.as_deref())
}

fn rejected_code(e: &Explained) -> Option<ErrorCode> {
    match &e.decision {
        Decision::Rejected { code, .. } => Some(*code),
        _ => None,
    }
}

#[test]
fn sensitive_classifications_never_go_external_even_when_policy_allows() {
    let pools = [external("ext")];
    let cases = [
        ("public", None),
        ("internal", None),
        (
            "confidential",
            Some("classification confidential not allowed on external pools"),
        ),
        (
            "restricted",
            Some("classification restricted not allowed on external pools"),
        ),
        // Not in the configured set: fails closed.
        (
            "secret",
            Some("classification secret not allowed on external pools"),
        ),
    ];
    for (class, want) in cases {
        let e = decide(&req(class), &pools, &open_external(&["ext"]));
        assert_eq!(
            reason_of(&e, "ext").filter(|_| want.is_some()),
            want,
            "{class}"
        );
        match want {
            None => assert_eq!(e.decision, Decision::Placed { pool: "ext".into() }),
            Some(_) => assert_eq!(rejected_code(&e), Some(ErrorCode::NoEligiblePool)),
        }
    }
}

#[test]
fn external_needs_every_level_the_name_and_the_request() {
    let yes = json!({"allowExternal": true, "externalPools": ["ext"]});
    let cases = [
        (
            json!({}),
            yes.clone(),
            yes.clone(),
            ExternalMode::Allowed,
            Some("external placement not allowed by global policy"),
        ),
        (
            yes.clone(),
            json!({}),
            yes.clone(),
            ExternalMode::Allowed,
            Some("external placement not allowed by org policy"),
        ),
        (
            yes.clone(),
            yes.clone(),
            json!({"allowExternal": false}),
            ExternalMode::Allowed,
            Some("external placement not allowed by project policy"),
        ),
        // Named below but not by the global level: not named.
        (
            json!({"allowExternal": true}),
            yes.clone(),
            yes.clone(),
            ExternalMode::Allowed,
            Some("pool not named in externalPools"),
        ),
        // Global names it; a lower level narrows the list.
        (
            yes.clone(),
            json!({"allowExternal": true, "externalPools": ["other"]}),
            yes.clone(),
            ExternalMode::Allowed,
            Some("pool not named in externalPools"),
        ),
        // Lower levels that name nothing keep the global list.
        (
            yes.clone(),
            json!({"allowExternal": true}),
            json!({"allowExternal": true}),
            ExternalMode::Allowed,
            None,
        ),
        (
            yes.clone(),
            yes.clone(),
            yes.clone(),
            ExternalMode::Never,
            Some("request does not allow external pools (external: never)"),
        ),
        (
            yes.clone(),
            yes.clone(),
            yes.clone(),
            ExternalMode::Required,
            None,
        ),
    ];
    for (i, (g, o, p, mode, want)) in cases.into_iter().enumerate() {
        let eff = EffectivePolicy::intersect(&policy(g), &policy(o), &policy(p));
        let r = PlacementRequest {
            external: mode,
            ..req("internal")
        };
        let e = decide(&r, &[external("ext")], &eff);
        match want {
            Some(reason) => {
                assert_eq!(reason_of(&e, "ext"), Some(reason), "case {i}");
                assert_eq!(
                    rejected_code(&e),
                    Some(ErrorCode::NoEligiblePool),
                    "case {i}"
                );
            }
            None => assert_eq!(
                e.decision,
                Decision::Placed { pool: "ext".into() },
                "case {i}"
            ),
        }
    }
}

#[test]
fn required_external_mode_excludes_private_pools() {
    let r = PlacementRequest {
        external: ExternalMode::Required,
        ..req("internal")
    };
    let e = decide(
        &r,
        &[private("p"), external("ext")],
        &open_external(&["ext"]),
    );
    assert_eq!(e.decision, Decision::Placed { pool: "ext".into() });
    assert_eq!(
        reason_of(&e, "p"),
        Some("request requires an external pool (external: required)")
    );
}

#[test]
fn no_policy_means_private_only() {
    let e = decide(
        &req("public"),
        &[external("ext"), private("p")],
        &EffectivePolicy::default(),
    );
    assert_eq!(e.decision, Decision::Placed { pool: "p".into() });
    assert_eq!(
        reason_of(&e, "ext"),
        Some("external placement not allowed by global policy")
    );
}

#[test]
fn denied_pools_classifications_and_regions_filter() {
    let mut eu = private("eu");
    eu.view.region = Some("eu-west".into());
    let mut noregion = private("nr");
    noregion.view.region = None;
    let pools = [private("p"), eu, noregion];
    let cases: [(serde_json::Value, PlacementRequest, [Option<&str>; 3]); 5] = [
        (
            json!({"deniedPools": ["p"]}),
            req("internal"),
            [Some("pool denied by policy"), None, None],
        ),
        (
            json!({"allowedClassifications": ["public"]}),
            req("internal"),
            [Some("classification internal not allowed on this pool"); 3],
        ),
        (
            json!({"poolClassifications": {"eu": ["public"]}}),
            req("internal"),
            [
                None,
                Some("classification internal not allowed on this pool"),
                None,
            ],
        ),
        (
            json!({"allowedRegions": ["dc1"]}),
            req("internal"),
            [
                None,
                Some("region eu-west not allowed"),
                Some("pool declares no region; policy allows only listed regions"),
            ],
        ),
        (
            json!({}),
            PlacementRequest {
                region: Some("eu-west".into()),
                ..req("internal")
            },
            [
                Some("region dc1 is not the requested eu-west"),
                None,
                Some("pool declares no region; request asks for eu-west"),
            ],
        ),
    ];
    for (i, (p, r, want)) in cases.into_iter().enumerate() {
        let eff = EffectivePolicy::intersect(&policy(p), &Policy::default(), &Policy::default());
        let e = decide(&r, &pools, &eff);
        for (v, w) in e.pools.iter().zip(want) {
            match w {
                Some(reason) => {
                    assert!(!v.eligible, "case {i} {}", v.name);
                    assert_eq!(v.reason.as_deref(), Some(reason), "case {i} {}", v.name);
                    assert_eq!(v.stage, Some(Stage::Security));
                }
                None => assert!(v.eligible, "case {i} {}: {:?}", v.name, v.reason),
            }
        }
    }
}

#[test]
fn capabilities_match_by_name_alias_and_isolation() {
    let mut vm = pool(
        "vm",
        Trust::Private,
        Some("dc1"),
        &["exec", "lifecycle.pause", "snapshots"],
    );
    vm.isolation = Some(Isolation::Microvm);
    let mut ct = pool(
        "ct",
        Trust::Private,
        Some("dc1"),
        &["exec", "lifecycle.pause-resume"],
    );
    ct.isolation = Some(Isolation::Container);
    let pools = [vm, ct];
    let cases: [(&[&str], Option<&str>, Option<&str>); 6] = [
        (&["exec"], None, None),
        (&["lifecycle.pause-resume"], None, None),
        (
            &["snapshots.disk"],
            None,
            Some("missing capabilities: snapshots.disk"),
        ),
        (
            &["isolation.microvm"],
            None,
            Some("missing capabilities: isolation.microvm"),
        ),
        (&["isolation.container"], None, None),
        (
            &["gpu", "snapshots"],
            Some("missing capabilities: gpu"),
            Some("missing capabilities: gpu, snapshots"),
        ),
    ];
    for (caps, want_vm, want_ct) in cases {
        let e = decide(&with_caps(caps), &pools, &EffectivePolicy::default());
        assert_eq!(
            reason_of(&e, "vm").filter(|_| want_vm.is_some()),
            want_vm,
            "{caps:?}"
        );
        assert_eq!(
            reason_of(&e, "ct").filter(|_| want_ct.is_some()),
            want_ct,
            "{caps:?}"
        );
    }
}

#[test]
fn capacity_and_health_make_the_request_wait() {
    let mut sick = private("sick");
    sick.view.healthy = false;
    let mut full = private("full");
    full.view.max_concurrent = Some(3);
    full.used_slots = 3;
    let e = decide(
        &req("internal"),
        &[sick.clone(), full.clone()],
        &EffectivePolicy::default(),
    );
    assert_eq!(
        e.decision,
        Decision::Waiting {
            reason: "waiting for capacity: sick (unhealthy); full (full 3/3)".into()
        }
    );
    assert_eq!(reason_of(&e, "full"), Some("full 3/3"));
    full.used_slots = 2;
    let e = decide(&req("internal"), &[sick, full], &EffectivePolicy::default());
    assert_eq!(
        e.decision,
        Decision::Placed {
            pool: "full".into()
        }
    );
}

#[test]
fn rejection_codes_follow_the_seeds() {
    let mut small = private("small");
    small.max_sandbox = Some(Resources {
        cpu: 1,
        memory_mib: 1024,
        disk_gib: 5,
    });
    let big = PlacementRequest {
        resources: Resources {
            cpu: 4,
            ..Resources::DEFAULT
        },
        ..req("internal")
    };
    let cases: [(PlacementRequest, Vec<PoolProfile>, ErrorCode); 6] = [
        (req("internal"), vec![], ErrorCode::NoEligiblePool),
        (with_caps(&["exec"]), vec![], ErrorCode::NoEligiblePool),
        (
            with_caps(&["teleport"]),
            vec![private("p")],
            ErrorCode::UnsupportedCapability,
        ),
        (
            with_caps(&["teleport"]),
            vec![],
            ErrorCode::UnsupportedCapability,
        ),
        // Permitted pool without the capability.
        (
            with_caps(&["gpu"]),
            vec![private("p")],
            ErrorCode::UnsupportedCapability,
        ),
        // The only pool with the capability is not permitted: policy, not capability.
        (
            with_caps(&["gpu"]),
            vec![pool("ext", Trust::External, Some("dc1"), &["gpu"])],
            ErrorCode::NoEligiblePool,
        ),
    ];
    for (i, (r, pools, code)) in cases.into_iter().enumerate() {
        let e = decide(&r, &pools, &EffectivePolicy::default());
        assert_eq!(rejected_code(&e), Some(code), "case {i}: {e:?}");
        assert_eq!(e.pools.len(), pools.len());
    }
    let e = decide(&big, &[small], &EffectivePolicy::default());
    assert_eq!(rejected_code(&e), Some(ErrorCode::NoEligiblePool));
    assert_eq!(
        reason_of(&e, "small"),
        Some("too large: 4 CPU asked, pool runs at most 1")
    );
}

#[test]
fn strategies_rank_eligible_pools() {
    let mut slow_private = private("priv");
    slow_private.typical_create_seconds = Some(60.0);
    slow_private.cost_per_cpu_hour = 0.5;
    let mut cheap_ext = external("cheap");
    cheap_ext.cost_per_cpu_hour = 0.01;
    cheap_ext.typical_create_seconds = Some(30.0);
    let mut fast_ext = external("fast");
    fast_ext.cost_per_cpu_hour = 0.2;
    fast_ext.typical_create_seconds = Some(1.0);
    fast_ext.view.max_concurrent = Some(10);
    fast_ext.used_slots = 9;
    let pools = [slow_private, cheap_ext, fast_ext];
    let eff = open_external(&["cheap", "fast"]);
    let cases = [
        (None, ["priv", "fast", "cheap"]),
        (Some(Strategy::PrivateFirst), ["priv", "fast", "cheap"]),
        (Some(Strategy::Cheapest), ["cheap", "fast", "priv"]),
        (Some(Strategy::Fastest), ["fast", "cheap", "priv"]),
        (Some(Strategy::LeastLoaded), ["priv", "cheap", "fast"]),
    ];
    for (strategy, want) in cases {
        let r = PlacementRequest {
            strategy,
            ..req("internal")
        };
        assert_eq!(ranked(&r, &pools, &eff), want, "{strategy:?}");
        let e = decide(&r, &pools, &eff);
        assert_eq!(
            e.decision,
            Decision::Placed {
                pool: want[0].into()
            }
        );
    }
}

#[test]
fn ties_go_to_the_configured_order_and_the_next_pool_is_ranked_second() {
    let pools = [private("a"), private("b"), private("c")];
    let eff = EffectivePolicy::default();
    assert_eq!(ranked(&req("internal"), &pools, &eff), ["a", "b", "c"]);
    // Activation: "a" filled concurrently; the live view ranks the others.
    let mut live = pools.clone();
    live[0].view.max_concurrent = Some(1);
    live[0].used_slots = 1;
    assert_eq!(ranked(&req("internal"), &live, &eff), ["b", "c"]);
}

#[test]
fn default_strategy_comes_from_the_most_specific_level_and_the_request_wins() {
    let g = policy(json!({"defaultStrategy": "fastest"}));
    let o = policy(json!({"defaultStrategy": "cheapest"}));
    let none = Policy::default();
    assert_eq!(
        EffectivePolicy::intersect(&g, &none, &none).default_strategy,
        Strategy::Fastest
    );
    assert_eq!(
        EffectivePolicy::intersect(&g, &o, &none).default_strategy,
        Strategy::Cheapest
    );
    assert_eq!(
        EffectivePolicy::intersect(&none, &none, &none).default_strategy,
        Strategy::PrivateFirst
    );
    let mut cheap = private("cheap");
    cheap.cost_per_cpu_hour = 0.0;
    cheap.typical_create_seconds = Some(100.0);
    let mut fast = private("fast");
    fast.cost_per_cpu_hour = 1.0;
    fast.typical_create_seconds = Some(1.0);
    let pools = [cheap, fast];
    let eff = EffectivePolicy::intersect(&g, &o, &none);
    assert_eq!(ranked(&req("internal"), &pools, &eff)[0], "cheap");
    let r = PlacementRequest {
        strategy: Some(Strategy::Fastest),
        ..req("internal")
    };
    assert_eq!(ranked(&r, &pools, &eff)[0], "fast");
}

#[test]
fn intersect_narrows_and_unions() {
    let g = policy(json!({
        "allowedClassifications": ["public", "internal", "confidential"],
        "allowedRegions": ["dc1", "eu-west"],
        "poolClassifications": {"a": ["public", "internal"]},
        "deniedPools": ["x"],
        "allowExternal": true,
        "externalPools": ["e1", "e2"]
    }));
    let o = policy(json!({
        "allowedClassifications": ["internal", "restricted"],
        "poolClassifications": {"a": ["internal", "confidential"], "b": ["public"]},
        "deniedPools": ["y"],
        "allowExternal": true,
        "externalPools": ["e2", "e3"]
    }));
    let p = policy(json!({"allowedRegions": ["eu-west", "us-east"], "allowExternal": true}));
    let eff = EffectivePolicy::intersect(&g, &o, &p);
    let set = |v: &[&str]| {
        v.iter()
            .map(|s| s.to_string())
            .collect::<std::collections::BTreeSet<_>>()
    };
    assert_eq!(eff.allowed_classifications, Some(set(&["internal"])));
    assert_eq!(eff.allowed_regions, Some(set(&["eu-west"])));
    assert_eq!(eff.pool_classifications["a"], set(&["internal"]));
    assert_eq!(eff.pool_classifications["b"], set(&["public"]));
    assert_eq!(eff.denied_pools, set(&["x", "y"]));
    assert_eq!(eff.external_pools, set(&["e2"]));
    assert!(eff.allows_external());
}

#[test]
fn bad_request_fields_are_named() {
    let spec = SandboxSpec::build(&CreateSandboxRequest::default()).unwrap();
    let cases = [
        (
            CreateSandboxRequest {
                strategy: Some("fastest-ever".into()),
                ..Default::default()
            },
            "strategy",
        ),
        (
            CreateSandboxRequest {
                external: Some("sometimes".into()),
                ..Default::default()
            },
            "external",
        ),
    ];
    for (create, field) in cases {
        let e = PlacementRequest::from_create(&create, &spec).unwrap_err();
        assert_eq!(e.field, field);
    }
    let create = CreateSandboxRequest {
        capabilities: Some(vec!["exec".into(), "teleport".into()]),
        strategy: Some("cheapest".into()),
        external: Some("never".into()),
        ..Default::default()
    };
    let spec2 = SandboxSpec::build(&create).unwrap();
    let e = PlacementRequest::from_create(&create, &spec2).unwrap_err();
    assert_eq!(
        (e.field.as_str(), e.message.as_str()),
        ("capabilities", "unknown capabilities: teleport")
    );

    let ok = CreateSandboxRequest {
        capabilities: Some(vec![
            "snapshots.disk".into(),
            "lifecycle.pause-resume".into(),
        ]),
        strategy: Some("cheapest".into()),
        external: Some("never".into()),
        ..Default::default()
    };
    let r = PlacementRequest::from_create(&ok, &SandboxSpec::build(&ok).unwrap()).unwrap();
    assert_eq!(
        (r.strategy, r.external),
        (Some(Strategy::Cheapest), ExternalMode::Never)
    );

    let mut r = req("secret");
    assert_eq!(r.validate().unwrap_err().field, "classification");
    r.classification = "internal".into();
    r.region = Some(String::new());
    assert_eq!(r.validate().unwrap_err().field, "region");

    let e = "bogus".parse::<Strategy>().unwrap_err();
    assert_eq!(e.field, "strategy");
    assert!(
        e.message
            .contains("private-first, cheapest, fastest, least-loaded"),
        "{}",
        e.message
    );
    for s in Strategy::ALL {
        assert_eq!(s.as_str().parse::<Strategy>().unwrap(), s);
        assert_eq!(serde_json::to_value(s).unwrap(), json!(s.as_str()));
    }
    for m in ExternalMode::ALL {
        assert_eq!(m.as_str().parse::<ExternalMode>().unwrap(), m);
        assert_eq!(serde_json::to_value(m).unwrap(), json!(m.as_str()));
    }
}

#[test]
fn bad_policy_fields_are_named() {
    assert!(serde_json::from_value::<Policy>(json!({"allowExternals": true})).is_err());
    assert!(serde_json::from_value::<Policy>(json!({"defaultStrategy": "random"})).is_err());
    let cases = [
        (
            json!({"allowedClassifications": ["secret"]}),
            "allowedClassifications",
        ),
        (
            json!({"poolClassifications": {"a": ["secret"]}}),
            "poolClassifications.a",
        ),
        (
            json!({"poolClassifications": {"Bad Name": ["public"]}}),
            "poolClassifications.Bad Name",
        ),
        (json!({"allowedRegions": [""]}), "allowedRegions"),
        (json!({"externalPools": ["-x"]}), "externalPools"),
        (json!({"deniedPools": ["UPPER"]}), "deniedPools"),
    ];
    for (v, field) in cases {
        assert_eq!(
            policy(v.clone()).validate().unwrap_err().field,
            field,
            "{v}"
        );
    }
    assert!(policy(json!({
        "allowedClassifications": ["public"], "poolClassifications": {"a": ["internal"]},
        "allowedRegions": ["dc1"], "allowExternal": true, "externalPools": ["e"],
        "deniedPools": ["d"], "defaultStrategy": "least-loaded"
    }))
    .validate()
    .is_ok());
}

#[test]
fn explanation_serializes_to_the_dry_run_shape() {
    let mut sick = private("sick");
    sick.view.healthy = false;
    let pools = [external("ext"), sick, private("p")];
    let e = decide(&req("internal"), &pools, &EffectivePolicy::default());
    let v = serde_json::to_value(&e).unwrap();
    assert_eq!(
        v,
        json!({
            "decision": "placed",
            "pool": "p",
            "pools": [
                {"name": "ext", "eligible": false,
                 "reason": "external placement not allowed by global policy",
                 "stage": "security"},
                {"name": "sick", "eligible": false, "reason": "unhealthy", "stage": "capacity"},
                {"name": "p", "eligible": true,
                 "reason": "private, cost 0.00/h, create time unknown, no slot cap",
                 "score": 95.43}
            ]
        })
    );
    let back: Explained = serde_json::from_value(v).unwrap();
    assert_eq!(back.decision, e.decision);

    let e = decide(
        &with_caps(&["gpu"]),
        &pools[2..],
        &EffectivePolicy::default(),
    );
    assert_eq!(
        serde_json::to_value(&e).unwrap(),
        json!({
            "decision": "rejected",
            "code": "unsupported_capability",
            "reason": "no permitted pool offers every required capability (gpu)",
            "pools": [{"name": "p", "eligible": false, "reason": "missing capabilities: gpu",
                       "stage": "capability"}]
        })
    );
    let e = decide(&req("internal"), &pools[1..2], &EffectivePolicy::default());
    assert_eq!(
        serde_json::to_value(&e).unwrap(),
        json!({
            "decision": "waiting",
            "reason": "waiting for capacity: sick (unhealthy)",
            "pools": [{"name": "sick", "eligible": false, "reason": "unhealthy",
                       "stage": "capacity"}]
        })
    );
}

#[test]
fn profile_deserializes_flat_with_defaults() {
    let p: PoolProfile = serde_json::from_value(json!({
        "name": "os", "kind": "opensandbox", "trust": "private", "region": "dc1",
        "capabilities": ["exec"], "maxConcurrent": 50, "healthy": true,
        "isolation": "microvm", "costPerCpuHour": 0.02
    }))
    .unwrap();
    assert_eq!(p.isolation, Some(Isolation::Microvm));
    assert_eq!(p.used_slots, 0);
    assert_eq!(p.view.max_concurrent, Some(50));
}

#[test]
fn a_pinned_request_goes_only_to_its_pool() {
    let mut r = req("internal");
    r.pinned_pool = Some("b".into());
    let e = decide(
        &r,
        &[private("a"), private("b")],
        &EffectivePolicy::default(),
    );
    assert_eq!(e.decision, Decision::Placed { pool: "b".into() });
    assert!(e.pools[0]
        .reason
        .as_deref()
        .unwrap_or("")
        .contains("pinned to pool b"));
    r.pinned_pool = Some("gone".into());
    let e = decide(&r, &[private("a")], &EffectivePolicy::default());
    assert!(
        matches!(
            e.decision,
            Decision::Rejected {
                code: ErrorCode::NoEligiblePool,
                ..
            }
        ),
        "{e:?}"
    );
}
