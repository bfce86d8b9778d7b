//! The served objects, built from the types that serve them, against their schemas.

use super::*;

/// The objects the document once described only in prose (found by both SDKs' drift tests):
/// placement explanations, audit records, checkpoints, verification, segments and secrets,
/// built from the types that serve them.
#[test]
fn explanations_and_audit_objects_fit_their_schemas() {
    use differently_core::policy::{Decision, EffectivePolicy, Explained, PoolVerdict};
    use differently_store::audit::{
        AuditEvent, AuditKey, ChainHead, Checkpoint, NewAuditEvent, Problem, ProblemKind, Segment,
        SegmentInfo, VerifyReport,
    };

    let verdicts = vec![
        PoolVerdict {
            name: "local".into(),
            eligible: true,
            reason: Some("private".into()),
            score: Some(97.5),
            stage: None,
        },
        PoolVerdict {
            name: "e2b".into(),
            eligible: false,
            reason: None,
            score: None,
            stage: None,
        },
    ];
    for decision in [
        Decision::Placed {
            pool: "local".into(),
        },
        Decision::Waiting {
            reason: "capacity".into(),
        },
        Decision::Rejected {
            code: ErrorCode::NoEligiblePool,
            reason: "none".into(),
        },
    ] {
        let e = Explained {
            decision,
            pools: verdicts.clone(),
        };
        assert_fits("DryRun", &e);
        let mut stored = e.record(&EffectivePolicy::default(), Utc::now());
        assert_fits("Placement", &stored);
        if matches!(e.decision, Decision::Waiting { .. }) {
            // As the scheduler stores a candidate parked behind a limit.
            stored["wall"] = json!(differently_core::accounting::Wall::Org.as_str());
            assert_fits("Placement", &stored);
        }
    }
    let key = AuditKey::from_bytes([7; 32]);
    let event = |resource: &str| NewAuditEvent {
        org_id: Some(OrgId::new()),
        project_id: Some(ProjectId::new()),
        actor: "key:k".into(),
        action: "sandbox.exec".into(),
        resource: resource.into(),
        outcome: "ok".into(),
        detail: json!({ "program": "echo" }),
    };
    let first = AuditEvent::chained(&key, "c".into(), None, event("s"), Utc::now(), None);
    let second = AuditEvent::chained(
        &key,
        "c".into(),
        Some((first.chain_seq, first.hash.clone())),
        event("s"),
        Utc::now(),
        Some("req".into()),
    );
    assert_fits("AuditEvent", &first);
    assert_fits("AuditEvent", &second);
    assert_eq!(field_names(&second), property_names("AuditEvent"));
    let heads = vec![ChainHead {
        chain: "c".into(),
        chain_seq: 2,
        hash: second.hash.clone(),
    }];
    let cp = Checkpoint::next(&key, None, heads.clone(), Utc::now());
    let seg = Checkpoint::next_segment(
        &key,
        Some(&cp),
        heads,
        Utc::now(),
        Some(Segment {
            reason: "key lost".into(),
            lost_key_ids: vec!["abc".into()],
        }),
    );
    assert_fits("Checkpoint", &cp);
    assert_fits("Checkpoint", &seg);
    assert_eq!(field_names(&seg), property_names("Checkpoint"));
    let problem = Problem {
        kind: ProblemKind::UnknownKey,
        chain: "c".into(),
        chain_seq: 1,
        seq: None,
        message: "m".into(),
    };
    let report = VerifyReport {
        ok: false,
        chains: 1,
        records: 2,
        checkpoints: 2,
        unchained_records: 0,
        first_bad: Some(problem.clone()),
        problems: vec![problem],
        unverifiable_records: 1,
        unverifiable_checkpoints: 0,
        unknown_key_ids: vec!["abc".into()],
        segments: vec![SegmentInfo {
            seq: 2,
            at: Utc::now(),
            key_id: None,
            reason: "key lost".into(),
            lost_key_ids: vec![],
        }],
    };
    assert_fits("Verification", &report);
    assert_eq!(field_names(&report), property_names("Verification"));
    assert_fits(
        "AuditSegment",
        json!({ "checkpoint": seg, "report": report }),
    );
    let secret = differently_store::secrets::SecretInfo {
        name: "osb".into(),
        fingerprint: "sha256:0123456789abcdef".into(),
        updated_by: "key:k".into(),
        updated_at: Utc::now(),
        created_at: Utc::now(),
    };
    assert_fits("Secret", &secret);
    assert_eq!(field_names(&secret), property_names("Secret"));
    // None of them is prose only any more.
    for name in [
        "Placement",
        "DryRun",
        "AuditEvent",
        "Verification",
        "Checkpoint",
        "AuditSegment",
        "Secret",
        "TrustReport",
    ] {
        assert!(!property_names(name).is_empty(), "{name} has no properties");
    }
}

#[test]
fn queue_and_metrics_summaries_fit_their_schemas() {
    use crate::routes::queue::{summarize, OrgQueue, QueueReport, ReasonCount};
    let report = QueueReport {
        generated_at: chrono::Utc::now(),
        total: 2,
        truncated: false,
        orgs: vec![OrgQueue {
            org_id: differently_core::OrgId::new().to_string(),
            org_name: Some("acme".into()),
            depth: 2,
            oldest_queued_at: chrono::Utc::now(),
            oldest_sandbox_id: differently_core::SandboxId::new().to_string(),
            walls: [("org".to_owned(), 1), ("unknown".to_owned(), 1)].into(),
            reasons: vec![ReasonCount {
                reason: "waiting: org cpu quota 2/2".into(),
                count: 1,
            }],
        }],
    };
    assert_fits("QueueReport", &report);
    assert_eq!(field_names(&report), property_names("QueueReport"));
    let summary = summarize("differently_admissions_total{outcome=\"admitted\"} 1\n");
    assert_fits("MetricsSummary", &summary);
    assert_eq!(field_names(&summary), property_names("MetricsSummary"));
}

#[test]
fn warm_classes_fit_their_schemas() {
    use differently_core::warm::{WarmClass, WarmClasses};
    use differently_core::Resources;
    let full = WarmClass {
        name: "py".into(),
        size: 2,
        max_size: Some(4),
        refill_per_second: 0.5,
        max_age_seconds: 600,
        template: Some("python:3.12".into()),
        resources: Some(Resources::DEFAULT),
    };
    // Every field set: the serialized keys are exactly the schema's, and the values fit.
    assert_fits("WarmClass", &full);
    assert_eq!(field_names(&full), property_names("WarmClass"));
    let bare: WarmClass =
        serde_json::from_value(json!({ "name": "d", "size": 0, "refillPerSecond": 1 }))
            .expect("the schema's required fields are enough");
    assert_fits("WarmClass", &bare);
    let put = json!({ "classes": [&full, &bare] });
    assert_fits("WarmClassesRequest", &put);
    let back: WarmClasses = serde_json::from_value(put).expect("the type takes the request");
    assert_eq!(back.classes, vec![full.clone(), bare.clone()]);
    // As `GET /v1/admin/pools/{name}/warm` serves them: each class and its counts.
    let served: Vec<Value> = [full, bare]
        .iter()
        .map(|c| {
            let mut v = serde_json::to_value(c).unwrap();
            v["ready"] = json!(1);
            v["creating"] = json!(0);
            v["claimsPerMinute"] = json!(0.5);
            v["hitRatio"] = json!(0.75);
            v
        })
        .collect();
    assert_fits("WarmClasses", json!({ "classes": served }));
    let mut none_matched = served[1].clone();
    none_matched["claimsPerMinute"] = json!(0);
    none_matched["hitRatio"] = Value::Null;
    assert_fits("WarmClasses", json!({ "classes": [none_matched] }));
    let mut status = property_names("WarmClass");
    status.extend([
        "ready".to_owned(),
        "creating".to_owned(),
        "claimsPerMinute".to_owned(),
        "hitRatio".to_owned(),
    ]);
    assert_eq!(status, property_names("WarmClassStatus"));
}

/// The schema's required property names.
fn required_names(schema: &str) -> BTreeSet<String> {
    document()["components"]["schemas"][schema]["required"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// What the webhook routes serve has exactly the fields the schemas list, all present; a
/// delivery's body and lease stay internal.
#[test]
fn served_webhooks_and_deliveries_have_exactly_their_schemas_fields() {
    use differently_store::webhooks::{Delivery, DeliveryStatus, Webhook};
    let now = Utc::now();
    let w = Webhook {
        id: "whk_01ARZ3NDEKTSV4RRFFQ69G5FAV".into(),
        org_id: OrgId::new(),
        project_id: ProjectId::new(),
        url: "https://h.example.com/".into(),
        event_types: vec![],
        description: None,
        enabled: true,
        disabled_reason: None,
        consecutive_failures: 0,
        failing_since: None,
        previous_secret_expires_at: None,
        created_at: now,
        updated_at: now,
    };
    assert_fits("Webhook", &w);
    assert_eq!(field_names(&w), property_names("Webhook"));
    assert_eq!(field_names(&w), required_names("Webhook"));
    let d = Delivery {
        id: "whd_01ARZ3NDEKTSV4RRFFQ69G5FAV".into(),
        webhook_id: w.id.clone(),
        org_id: w.org_id.clone(),
        project_id: w.project_id.clone(),
        event_id: "e".into(),
        event_type: "sandbox.status.changed".into(),
        body: "{\"secret-free\":true}".into(),
        status: DeliveryStatus::Pending,
        attempts: 0,
        next_attempt_at: Some(now),
        response_code: None,
        latency_ms: None,
        last_error: None,
        response_body: None,
        created_at: now,
        updated_at: now,
        delivered_at: None,
        lease_until: None,
    };
    assert_fits("WebhookDelivery", &d);
    assert_eq!(field_names(&d), property_names("WebhookDelivery"));
    assert_eq!(field_names(&d), required_names("WebhookDelivery"));
    let served = serde_json::to_value(&d).unwrap_or_default();
    assert!(served.get("body").is_none() && served.get("leaseUntil").is_none());
    let mut with = property_names("Webhook");
    with.insert("secret".into());
    assert_eq!(with, property_names("WebhookWithSecret"));
    assert_eq!(with, required_names("WebhookWithSecret"));
}
