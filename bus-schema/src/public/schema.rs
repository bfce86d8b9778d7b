//! A JSON Schema (draft 2020-12) for every public event type, written next to the types so
//! a change to one shows beside the other; the golden tests validate every fixture against
//! its schema. `additionalProperties` is left open on purpose: a newer minor version may add
//! optional fields, and subscribers must ignore what they do not know.

use differently_core::SandboxStatus;
use serde_json::{json, Value};

use super::{Cause, EventType, PUBLIC_EVENT_VERSION};

fn id_of(prefix: &str) -> Value {
    json!({ "type": "string", "pattern": format!("^{prefix}_[0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{{26}}$") })
}

fn object(required: &[&str], properties: Value) -> Value {
    json!({ "type": "object", "required": required, "properties": properties })
}

fn error() -> Value {
    json!({ "type": ["object", "null"], "required": ["code", "message"],
            "properties": { "code": { "type": "string" }, "message": { "type": "string" } } })
}

fn operation() -> Value {
    object(
        &["operationId", "operation", "error"],
        json!({ "operationId": { "type": "string" }, "operation": { "type": "string" },
                "error": error() }),
    )
}

fn snapshot() -> Value {
    object(
        &["snapshotId", "sizeBytes", "error"],
        json!({ "snapshotId": { "type": "string" },
                "sizeBytes": { "type": ["integer", "null"], "minimum": 0 },
                "error": error() }),
    )
}

/// The schema of `data` for events of type `t`.
fn data_schema(t: EventType) -> Value {
    let statuses: Vec<&str> = SandboxStatus::ALL.iter().map(|s| s.as_str()).collect();
    match t {
        EventType::StatusChanged => object(
            &["status", "statusReason", "statusVersion", "pool"],
            json!({ "status": { "enum": statuses },
                    "statusReason": { "type": ["string", "null"] },
                    "statusVersion": { "type": "integer", "minimum": 0 },
                    "pool": { "type": ["string", "null"] } }),
        ),
        EventType::OperationRequested
        | EventType::OperationFinished
        | EventType::OperationFailed => operation(),
        EventType::ExecStarted => object(
            &["execId", "program"],
            json!({ "execId": { "type": "string" }, "program": { "type": "string", "maxLength": 64 } }),
        ),
        EventType::ExecFinished => object(
            &["execId", "program", "exitCode", "durationMs"],
            json!({ "execId": { "type": "string" },
                    "program": { "type": "string", "maxLength": 64 },
                    "exitCode": { "type": ["integer", "null"] },
                    "durationMs": { "type": "integer", "minimum": 0 },
                    "timedOut": { "type": "boolean" } }),
        ),
        EventType::FileWritten => object(
            &["path", "sizeBytes"],
            json!({ "path": { "type": "string" }, "sizeBytes": { "type": "integer", "minimum": 0 } }),
        ),
        EventType::SnapshotCreated | EventType::SnapshotFailed | EventType::SnapshotDeleted => {
            snapshot()
        }
        EventType::PlacementDecided => object(
            &["pool", "region", "attempt"],
            json!({ "pool": { "type": "string" }, "region": { "type": ["string", "null"] },
                    "attempt": { "type": "integer", "minimum": 1 } }),
        ),
        EventType::WebhookDisabled => object(
            &["webhookId", "reason"],
            json!({ "webhookId": { "type": "string" }, "reason": { "type": "string" } }),
        ),
    }
}

/// The envelope every public event shares, with `type` open (any known type).
pub fn envelope_schema() -> Value {
    let types: Vec<&str> = EventType::ALL.iter().map(|t| t.as_str()).collect();
    envelope(json!({ "enum": types }), json!({ "type": "object" }))
}

fn envelope(ty: Value, data: Value) -> Value {
    let causes: Vec<&str> = Cause::ALL.iter().map(|c| c.as_str()).collect();
    json!({
        "type": "object",
        "required": ["version", "id", "type", "time", "orgId", "projectId", "sandboxId",
                     "cause", "actor", "data"],
        "properties": {
            "version": { "const": PUBLIC_EVENT_VERSION },
            "id": { "type": "string", "minLength": 1 },
            "type": ty,
            "time": { "type": "string", "format": "date-time" },
            "orgId": id_of("org"),
            "projectId": id_of("prj"),
            "sandboxId": { "oneOf": [id_of("sbx"), { "type": "null" }] },
            "cause": { "enum": causes },
            "actor": { "oneOf": [
                { "type": "object", "required": ["keyId"], "properties": { "keyId": { "type": "string" } } },
                { "type": "null" }
            ] },
            "data": data
        }
    })
}

/// The full schema of events of type `t`.
pub fn schema(t: EventType) -> Value {
    let mut s = envelope(json!({ "const": t.as_str() }), data_schema(t));
    if let Some(obj) = s.as_object_mut() {
        obj.insert(
            "$schema".into(),
            json!("https://json-schema.org/draft/2020-12/schema"),
        );
        obj.insert(
            "$id".into(),
            json!(format!(
                "https://differently.dev/schemas/events/v{PUBLIC_EVENT_VERSION}/{t}.json"
            )),
        );
        obj.insert("title".into(), json!(t.as_str()));
    }
    s
}

/// Every type with its schema, in documentation order.
pub fn schemas() -> Vec<(EventType, Value)> {
    EventType::ALL.into_iter().map(|t| (t, schema(t))).collect()
}
