//! Golden fixtures: each bus message as it travels, pinned as JSON. Every fixture is checked
//! both ways: the value built in code encodes to exactly the fixture, and the fixture decodes
//! (through `decode`, version check included) back to that value. A change to a message or
//! to anything it is made of fails here first. Set `DIFFERENTLY_BLESS=1` to rewrite the
//! fixtures after a deliberate change (and bump `SCHEMA_VERSION` if an older consumer would
//! misread the new form).

use std::path::PathBuf;

use chrono::{DateTime, TimeZone, Utc};
use differently_bus_schema::{
    decode, Admitted, AuditHead, DecodeError, Envelope, Message, QueuedSandbox, SandboxState,
    StatusChanged, Terminating, TraceContext, WarmWork, Work, WorkOp, SCHEMA_VERSION,
};
use differently_core::sandbox::SandboxSpec;
use differently_core::{CreateSandboxRequest, OrgId, ProjectId, Sandbox, SandboxId, SandboxStatus};
use serde::Serialize;

mod public;

const SANDBOX: &str = "sbx_01JD0000000000000000000001";
const ORG: &str = "org_01JD0000000000000000000002";
const PROJECT: &str = "prj_01JD0000000000000000000003";
const SECRET: &str = "s3cret-env-value";

fn at(secs: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(1_764_000_000 + secs, 0)
        .single()
        .expect("a valid instant")
}

fn id<T>(parse: fn(&str) -> Result<T, differently_core::ids::IdParseError>, s: &str) -> T {
    parse(s).expect("a valid fixture id")
}

/// A row with every field set, an env value among them, so a fixture shows what travels.
fn row(status: SandboxStatus) -> Sandbox {
    let req: CreateSandboxRequest = serde_json::from_value(serde_json::json!({
        "template": "python:3.12",
        "resources": {"cpu": 2, "memoryMiB": 2048, "diskGiB": 10},
        "env": {"TOKEN": SECRET},
        "labels": {"team": "ml"},
        "ttlSeconds": 600,
        "idleTimeoutSeconds": 120,
        "capabilities": ["exec"],
        "region": "eu-1",
        "priority": 5
    }))
    .expect("a valid request");
    let spec = SandboxSpec::build(&req).expect("a valid spec");
    let mut s = Sandbox::queued(
        id(OrgId::parse, ORG),
        id(ProjectId::parse, PROJECT),
        spec,
        Some("idem-key-1".into()),
        at(0),
    );
    s.id = id(SandboxId::parse, SANDBOX);
    s.status = status;
    s.status_version = 3;
    s.updated_at = at(2);
    if status != SandboxStatus::Queued {
        s.pool = Some("local".into());
        s.backend_ref = Some("inst-42".into());
        s.started_at = Some(at(1));
        s.expires_at = Some(at(601));
    }
    s
}

fn envelope<T>(body: T) -> Envelope<T> {
    let mut env = Envelope::new(id(SandboxId::parse, SANDBOX), 3, body);
    env.published_at = Some(at(3));
    env.trace = TraceContext {
        traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
    };
    env
}

fn fixture_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden/fixtures")
        .join(format!("{name}.json"))
}

/// Checks `value` against fixture `name` both ways.
fn golden<T>(name: &str, value: &Envelope<T>)
where
    T: Message + Serialize + PartialEq + std::fmt::Debug,
{
    let encoded = serde_json::to_value(value).expect("encodes");
    let path = fixture_path(name);
    if std::env::var_os("DIFFERENTLY_BLESS").is_some() {
        let text = serde_json::to_string_pretty(&encoded).expect("pretty");
        std::fs::write(&path, format!("{text}\n")).expect("fixture written");
    }
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (DIFFERENTLY_BLESS=1 writes it)", path.display()));
    let pinned: serde_json::Value = serde_json::from_str(&text).expect("fixture is JSON");
    assert_eq!(
        encoded, pinned,
        "{name}: the encoding drifted from its fixture"
    );
    let decoded = decode::<T>(text.as_bytes()).expect("fixture decodes");
    assert_eq!(
        &decoded, value,
        "{name}: the fixture decodes to another value"
    );
    assert!(
        !text.contains(SECRET),
        "{name}: an env value is on the wire"
    );
    assert!(
        !text.contains("idem-key-1"),
        "{name}: an idempotency key is on the wire"
    );
}

#[test]
fn admitted_carries_the_queued_row_without_env_values() {
    let s = row(SandboxStatus::Queued);
    let env = envelope(Admitted {
        org_id: s.org_id.clone(),
        project_id: s.project_id.clone(),
        sandbox: Some(Box::new(QueuedSandbox::of(&s))),
    });
    golden("admitted", &env);
    let hint = env.body.sandbox.clone().expect("row").into_placement_row();
    assert_eq!(hint.spec.placement_request(), s.spec.placement_request());
    assert!(hint.spec.env.is_empty());
    assert_eq!(
        env.body.sandbox.as_ref().map(|q| q.spec.env_keys.clone()),
        Some(vec!["TOKEN".to_owned()])
    );
}

#[test]
fn admitted_without_a_row() {
    let s = row(SandboxStatus::Queued);
    golden(
        "admitted-bare",
        &envelope(Admitted {
            org_id: s.org_id,
            project_id: s.project_id,
            sandbox: None,
        }),
    );
}

#[test]
fn work_messages() {
    golden(
        "work-create",
        &envelope(Work {
            op: WorkOp::Create,
            pool: "local".into(),
            op_id: None,
            terminating: None,
            warm: None,
        }),
    );
    golden(
        "work-delete",
        &envelope(Work {
            op: WorkOp::Delete,
            pool: "local".into(),
            op_id: None,
            terminating: Some(Terminating {
                reason: Some("deleted by key_01".into()),
            }),
            warm: None,
        }),
    );
    golden(
        "work-snapshot",
        &envelope(Work {
            op: WorkOp::Snapshot,
            pool: "local".into(),
            op_id: Some("op_01JD0000000000000000000004".into()),
            terminating: None,
            warm: None,
        }),
    );
}

/// A warm instance has no sandbox row: the envelope's sandbox id is the instance's own id,
/// at status version 0, and the body names its class.
fn warm_envelope(op: WorkOp) -> Envelope<Work> {
    let mut env = envelope(Work {
        op,
        pool: "local".into(),
        op_id: None,
        terminating: None,
        warm: Some(WarmWork {
            class: "py-small".into(),
        }),
    });
    env.status_version = 0;
    env
}

#[test]
fn warm_work_messages() {
    golden("work-warmcreate", &warm_envelope(WorkOp::WarmCreate));
    golden("work-warmdelete", &warm_envelope(WorkOp::WarmDelete));
    // A claim is about the sandbox that claimed the instance (same id), like a create.
    golden(
        "work-claim",
        &envelope(Work {
            op: WorkOp::Claim,
            pool: "local".into(),
            op_id: None,
            terminating: None,
            warm: None,
        }),
    );
    assert!(WorkOp::WarmCreate.is_warm() && WorkOp::WarmDelete.is_warm());
    assert!(!WorkOp::Claim.is_warm() && !WorkOp::Create.is_warm());
    // The subject tokens follow the others' (lowercase, one token): every pool's consumer
    // filters `dly.work.<pool>.>`, so it receives them.
    let naming = differently_bus_schema::Naming::default();
    assert_eq!(
        naming.work_subject("local", WorkOp::WarmCreate),
        "dly.work.local.warmcreate"
    );
    assert_eq!(
        naming.work_subject("local", WorkOp::WarmDelete),
        "dly.work.local.warmdelete"
    );
    assert_eq!(
        naming.work_subject("local", WorkOp::Claim),
        "dly.work.local.claim"
    );
    assert_eq!(
        naming
            .work_consumer("local", std::time::Duration::from_secs(30))
            .filter,
        "dly.work.local.>"
    );
}

#[test]
fn work_from_before_warm_pools_still_decodes() {
    // The fixtures pinned before warm pools existed decode with no warm part.
    for name in ["work-create", "work-delete", "work-snapshot"] {
        let text = std::fs::read_to_string(fixture_path(name)).expect("fixture");
        let env = decode::<Work>(text.as_bytes()).expect("decodes");
        assert_eq!(env.body.warm, None, "{name}");
    }
}

#[test]
fn status_changed_carries_the_client_view_and_internal_hints() {
    let s = row(SandboxStatus::Running);
    let mut body = StatusChanged::of(&s);
    body.audit_head = Some(AuditHead {
        chain: format!("org:{ORG}"),
        seq: 17,
        hash: "ab".repeat(32),
    });
    let env = envelope(body);
    golden("status-changed", &env);
    let view = env
        .body
        .view
        .clone()
        .map(|v| differently_core::sandbox::SandboxView::from(*v));
    assert_eq!(view, Some(s.view()));
    assert_eq!(SandboxState::of(&s), SandboxState::from(s.view()));
}

#[test]
fn messages_from_older_publishers_still_decode() {
    // Before explicit wire types, an admission carried the whole row (env values included)
    // and a status event the core view; both decode into today's types, dropping the rest.
    let s = row(SandboxStatus::Queued);
    let legacy = serde_json::json!({
        "v": 1, "sandboxId": SANDBOX, "statusVersion": 3,
        "body": {"orgId": ORG, "projectId": PROJECT, "sandbox": serde_json::to_value(&s).expect("row")}
    });
    let text = legacy.to_string();
    assert!(text.contains(SECRET));
    let env = decode::<Admitted>(text.as_bytes()).expect("a legacy admission decodes");
    let hint = env.body.sandbox.expect("row").into_placement_row();
    assert_eq!(hint.spec.placement_request(), s.spec.placement_request());
    assert!(hint.spec.env.is_empty(), "env values are dropped on read");

    let r = row(SandboxStatus::Running);
    let legacy = serde_json::json!({
        "v": 1, "sandboxId": SANDBOX, "statusVersion": 3,
        "body": {"orgId": ORG, "projectId": PROJECT, "status": "running", "statusReason": null,
                 "pool": "local", "at": at(2), "view": serde_json::to_value(r.view()).expect("view")}
    });
    let env = decode::<StatusChanged>(legacy.to_string().as_bytes()).expect("decodes");
    assert_eq!(
        env.body
            .view
            .map(|v| differently_core::sandbox::SandboxView::from(*v)),
        Some(r.view())
    );
}

#[test]
fn decode_refuses_a_newer_major_and_names_what_is_wrong() {
    let newer = format!(
        r#"{{"v":{},"sandboxId":"{SANDBOX}","statusVersion":1,"body":{{"op":"create","pool":"p","new":1}}}}"#,
        SCHEMA_VERSION + 1
    );
    match decode::<Work>(newer.as_bytes()) {
        Err(DecodeError::NewerVersion { found, supported }) => {
            assert_eq!((found, supported), (SCHEMA_VERSION + 1, SCHEMA_VERSION));
        }
        other => panic!("expected NewerVersion, got {other:?}"),
    }
    assert!(matches!(
        decode::<Work>(b"not json"),
        Err(DecodeError::NotAnEnvelope(_))
    ));
    let wrong_body =
        format!(r#"{{"v":1,"sandboxId":"{SANDBOX}","statusVersion":1,"body":{{"op":"fly"}}}}"#);
    let err = decode::<Work>(wrong_body.as_bytes()).expect_err("an unknown op");
    assert!(
        matches!(err, DecodeError::Malformed { kind: "work", .. }),
        "{err}"
    );
    assert!(err.to_string().contains("work"), "{err}");
}

#[test]
fn no_fixture_is_missing_or_left_over() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/fixtures");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("fixture dir")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut expected: Vec<String> = [
        "admitted-bare.json",
        "admitted.json",
        "status-changed.json",
        "work-claim.json",
        "work-create.json",
        "work-delete.json",
        "work-snapshot.json",
        "work-warmcreate.json",
        "work-warmdelete.json",
    ]
    .map(String::from)
    .into();
    expected.extend(
        differently_bus_schema::EventType::ALL.map(|t| format!("{}.json", public::fixture_name(t))),
    );
    expected.sort();
    assert_eq!(
        names, expected,
        "every fixture has a test and every test its fixture"
    );
}
