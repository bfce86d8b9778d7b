//! Golden fixtures of the public events: one per type, each checked both ways and validated
//! against the JSON Schema the API serves for its type.

use differently_bus_schema::public::{
    program_name, schema, EventError, ExecFinished, ExecStarted, FileWritten, Operation,
    PlacementDecided, PublicDecodeError, SnapshotEvent, WebhookDisabled,
};
use differently_bus_schema::{
    AuditHead, Cause, EventData, EventType, Origin, PublicEvent, StatusChanged,
    PUBLIC_EVENT_VERSION,
};
use differently_core::{OrgId, ProjectId, SandboxId, SandboxStatus};
use serde_json::Value;

use super::{at, envelope, fixture_path, id, row, ORG, PROJECT, SANDBOX, SECRET};

const KEY_ID: &str = "key_01JD0000000000000000000005";

fn event(origin: Origin, disc: &str, data: EventData) -> PublicEvent {
    let sandbox = match data {
        EventData::WebhookDisabled(_) => None,
        _ => Some(id(SandboxId::parse, SANDBOX)),
    };
    PublicEvent::new(
        id(OrgId::parse, ORG),
        id(ProjectId::parse, PROJECT),
        sandbox,
        origin,
        at(2),
        disc,
        data,
    )
}

/// One event of every type, as a publisher builds it.
pub(super) fn one_of_each() -> Vec<PublicEvent> {
    let user = || Origin::user(KEY_ID);
    let op = |error: Option<EventError>| Operation {
        operation_id: "op_01JD0000000000000000000004".into(),
        operation: "pause".into(),
        error,
    };
    let snap = |size, error| SnapshotEvent {
        snapshot_id: "snp_01JD0000000000000000000006".into(),
        size_bytes: size,
        error,
    };
    let failed = || {
        Some(EventError {
            code: "provider_unavailable".into(),
            message: "the backend did not answer".into(),
        })
    };
    vec![
        {
            let mut body = StatusChanged::of(&row(SandboxStatus::Running));
            body.origin = Some(Origin::system(Cause::Backend));
            PublicEvent::from_status(&envelope(body))
        },
        event(user(), "op_1", EventData::OperationRequested(op(None))),
        event(
            Origin::system(Cause::Idle),
            "op_1",
            EventData::OperationFinished(op(None)),
        ),
        event(
            Origin::system(Cause::Backend),
            "op_1",
            EventData::OperationFailed(op(failed())),
        ),
        event(
            user(),
            "exe_1",
            EventData::ExecStarted(ExecStarted {
                exec_id: "exe_1".into(),
                program: program_name(&["sh".into(), "-c".into(), format!("echo {SECRET}")]),
            }),
        ),
        event(
            user(),
            "exe_1",
            EventData::ExecFinished(ExecFinished {
                exec_id: "exe_1".into(),
                program: "sh".into(),
                exit_code: Some(0),
                duration_ms: 1250,
                timed_out: false,
            }),
        ),
        event(
            user(),
            "/work/out.txt:4",
            EventData::FileWritten(FileWritten {
                path: "/work/out.txt".into(),
                size_bytes: 2048,
            }),
        ),
        event(
            user(),
            "snp_1",
            EventData::SnapshotCreated(snap(Some(1 << 20), None)),
        ),
        event(
            Origin::system(Cause::Backend),
            "snp_1",
            EventData::SnapshotFailed(snap(None, failed())),
        ),
        event(
            user(),
            "snp_1",
            EventData::SnapshotDeleted(snap(None, None)),
        ),
        event(
            Origin::system(Cause::Quota),
            "1",
            EventData::PlacementDecided(PlacementDecided {
                pool: "local".into(),
                region: Some("eu-1".into()),
                attempt: 1,
            }),
        ),
        event(
            Origin::system(Cause::Reconciler),
            "whk_1",
            EventData::WebhookDisabled(WebhookDisabled {
                webhook_id: "whk_01JD0000000000000000000007".into(),
                reason: "failed for 24 h".into(),
            }),
        ),
    ]
}

/// The fixture name of a type: `public-sandbox.status.changed`.
pub(super) fn fixture_name(t: EventType) -> String {
    format!("public-{t}")
}

#[test]
fn every_type_has_one_golden_event_that_fits_its_schema() {
    let events = one_of_each();
    let types: Vec<EventType> = events.iter().map(PublicEvent::event_type).collect();
    assert_eq!(types, EventType::ALL, "one event of every type, in order");
    for e in events {
        let name = fixture_name(e.event_type());
        let encoded = serde_json::to_value(&e).expect("encodes");
        let path = fixture_path(&name);
        if std::env::var_os("DIFFERENTLY_BLESS").is_some() {
            let text = serde_json::to_string_pretty(&encoded).expect("pretty");
            std::fs::write(&path, format!("{text}\n")).expect("fixture written");
        }
        let text = std::fs::read_to_string(&path).unwrap_or_else(|err| {
            panic!("{}: {err} (DIFFERENTLY_BLESS=1 writes it)", path.display())
        });
        let pinned: Value = serde_json::from_str(&text).expect("fixture is JSON");
        assert_eq!(
            encoded, pinned,
            "{name}: the encoding drifted from its fixture"
        );
        let back = PublicEvent::decode(text.as_bytes()).expect("fixture decodes");
        assert_eq!(back, e, "{name}: the fixture decodes to another value");
        let errors = validate(&schema(e.event_type()), &pinned, "$");
        assert!(
            errors.is_empty(),
            "{name} does not fit its schema: {errors:#?}"
        );
        // …and fits no other type's schema: `type` is pinned per schema.
        for other in EventType::ALL.into_iter().filter(|t| *t != e.event_type()) {
            assert!(
                !validate(&schema(other), &pinned, "$").is_empty(),
                "{name} fits {other}"
            );
        }
        assert!(
            !text.contains(SECRET),
            "{name}: a secret is in a public event"
        );
    }
}

#[test]
fn a_status_event_never_carries_internal_fields() {
    let mut body = StatusChanged::of(&row(SandboxStatus::Running));
    body.audit_head = Some(AuditHead {
        chain: "org:chain-secret".into(),
        seq: 17,
        hash: "ab".repeat(32),
    });
    body.origin = Some(Origin::user(KEY_ID));
    let internal = envelope(body);
    let internal_text = String::from_utf8(internal.encode().expect("encodes")).expect("utf-8");
    // The internal event does carry them: the conversion, not luck, keeps them out.
    for needle in [
        "backendRef",
        "inst-42",
        "auditHead",
        "chain-secret",
        "abab",
        "envKeys",
    ] {
        assert!(
            internal_text.contains(needle),
            "{needle} not in the internal event"
        );
    }
    let public = PublicEvent::from_status(&internal);
    let text = String::from_utf8(public.encode().expect("encodes")).expect("utf-8");
    for needle in [
        "backendRef",
        "inst-42",
        "auditHead",
        "chain-secret",
        "abab",
        "envKeys",
        "TOKEN",
        SECRET,
        "idem-key-1",
        "traceparent",
    ] {
        assert!(!text.contains(needle), "{needle} leaked into {text}");
    }
    assert_eq!(public.cause, Cause::User);
    assert_eq!(
        public.actor.as_ref().map(|a| a.key_id.as_str()),
        Some(KEY_ID)
    );
    assert_eq!(public.id, format!("{SANDBOX}:sandbox.status.changed:3"));
    // A status event from a publisher that did not say why is the backend's.
    let mut old = internal.clone();
    old.body.origin = None;
    assert_eq!(PublicEvent::from_status(&old).cause, Cause::Backend);
    assert_eq!(PublicEvent::from_status(&old).actor, None);
}

#[test]
fn a_newer_public_version_is_refused_and_an_unknown_field_ignored() {
    let e = &one_of_each()[0];
    let mut v = serde_json::to_value(e).expect("encodes");
    v["addedLater"] = serde_json::json!(true);
    v["data"]["alsoLater"] = serde_json::json!(1);
    let back = PublicEvent::decode(v.to_string().as_bytes()).expect("extra fields are ignored");
    assert_eq!(&back, e);
    v["version"] = serde_json::json!(PUBLIC_EVENT_VERSION + 1);
    assert!(matches!(
        PublicEvent::decode(v.to_string().as_bytes()),
        Err(PublicDecodeError::NewerVersion { .. })
    ));
    assert!(matches!(
        PublicEvent::decode(b"{}"),
        Err(PublicDecodeError::Malformed(_))
    ));
}

/// A validator for the subset of JSON Schema the event schemas use (`type`, `const`, `enum`,
/// `required`, `properties`, `oneOf`, `pattern`, `minimum`, `minLength`, `maxLength`):
/// every violation, with its path.
fn validate(schema: &Value, v: &Value, path: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let Some(s) = schema.as_object() else {
        return vec![format!("{path}: schema is not an object")];
    };
    for (k, rule) in s {
        match k.as_str() {
            "type" => {
                let allowed: Vec<&str> = match rule {
                    Value::String(t) => vec![t.as_str()],
                    Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
                    _ => vec![],
                };
                let actual = match v {
                    Value::Null => "null",
                    Value::Bool(_) => "boolean",
                    Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
                    Value::Number(_) => "number",
                    Value::String(_) => "string",
                    Value::Array(_) => "array",
                    Value::Object(_) => "object",
                };
                if !allowed
                    .iter()
                    .any(|a| *a == actual || (*a == "number" && actual == "integer"))
                {
                    errs.push(format!("{path}: {actual} is not {allowed:?}"));
                }
            }
            "const" if rule != v => errs.push(format!("{path}: {v} is not {rule}")),
            "enum" if !rule.as_array().is_some_and(|a| a.contains(v)) => {
                errs.push(format!("{path}: {v} is not one of {rule}"))
            }
            "required" => {
                for f in rule
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                {
                    if v.is_object() && v.get(f).is_none() {
                        errs.push(format!("{path}: {f} is missing"));
                    }
                }
            }
            "properties" => {
                for (f, sub) in rule.as_object().into_iter().flatten() {
                    if let Some(fv) = v.get(f) {
                        errs.extend(validate(sub, fv, &format!("{path}.{f}")));
                    }
                }
            }
            "oneOf" => {
                let fits = rule
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|sub| validate(sub, v, path).is_empty())
                    .count();
                if fits != 1 {
                    errs.push(format!("{path}: fits {fits} of oneOf"));
                }
            }
            "pattern" => {
                if let (Some(p), Some(t)) = (rule.as_str(), v.as_str()) {
                    let re = regex::Regex::new(p).expect("a valid pattern");
                    if !re.is_match(t) {
                        errs.push(format!("{path}: {t:?} does not match {p}"));
                    }
                }
            }
            "minimum" => {
                if let (Some(m), Some(n)) = (rule.as_f64(), v.as_f64()) {
                    if n < m {
                        errs.push(format!("{path}: {n} < {m}"));
                    }
                }
            }
            "minLength" | "maxLength" => {
                if let (Some(m), Some(t)) = (rule.as_u64(), v.as_str()) {
                    let n = t.chars().count() as u64;
                    if (k == "minLength" && n < m) || (k == "maxLength" && n > m) {
                        errs.push(format!("{path}: length {n} breaks {k} {m}"));
                    }
                }
            }
            "$schema" | "$id" | "title" | "format" | "description" | "const" | "enum" => {}
            other => errs.push(format!("{path}: the test validator does not know {other}")),
        }
    }
    errs
}
