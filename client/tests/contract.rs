//! The client's models against `docs/openapi.json`, the document the server generates from
//! its own types: field by field, every property the document gives an object is a field of
//! the model (not left in `extra`, not dropped), with a type that reads the documented value,
//! and a model sends nothing the document does not list.
//!
//! The models stay a copy (tolerant of what a newer server adds, statuses as strings) rather
//! than the server's types; this test is what keeps the copy honest.

use std::collections::BTreeSet;

use differently_client::*;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Map, Value};

fn document() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json");
    let text = std::fs::read_to_string(path).expect("docs/openapi.json (the generated document)");
    serde_json::from_str(&text).expect("docs/openapi.json is JSON")
}

fn schema<'a>(doc: &'a Value, name: &str) -> &'a Value {
    let s = &doc["components"]["schemas"][name];
    assert!(s.is_object(), "docs/openapi.json has no schema {name}");
    s
}

/// A value of `schema` with every property present (`all`) or only the required ones, each
/// non-null and non-empty, so no `skip_serializing_if` hides a field.
fn example(doc: &Value, schema: &Value, all: bool) -> Value {
    if let Some(r) = schema["$ref"].as_str() {
        let name = r.trim_start_matches("#/components/schemas/");
        return example(doc, &doc["components"]["schemas"][name], all);
    }
    if let Some(value) = schema.get("const") {
        return value.clone();
    }
    if let Some(branches) = schema["anyOf"].as_array().or(schema["oneOf"].as_array()) {
        let branch = branches
            .iter()
            .find(|b| b["type"] != "null")
            .unwrap_or(&Value::Null);
        return example(doc, branch, all);
    }
    if let Some(values) = schema["enum"].as_array() {
        return values
            .iter()
            .find(|v| !v.is_null())
            .cloned()
            .unwrap_or(Value::Null);
    }
    let ty = match &schema["type"] {
        Value::String(t) => t.as_str(),
        Value::Array(ts) => ts
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .unwrap_or("null"),
        _ if schema.get("properties").is_some() => "object",
        // Free-form (settings, details, schemas): any object.
        _ => return json!({ "any": "value" }),
    };
    match ty {
        "string" => json!("s"),
        "integer" => json!(7),
        "number" => json!(1.5),
        "boolean" => json!(true),
        "array" => json!([example(doc, &schema["items"], all)]),
        "object" => {
            let mut o = Map::new();
            let required: BTreeSet<&str> = schema["required"]
                .as_array()
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            if let Some(props) = schema["properties"].as_object() {
                for (name, p) in props {
                    if all || required.contains(name.as_str()) {
                        o.insert(name.clone(), example(doc, p, all));
                    }
                }
            } else if schema["additionalProperties"].is_object() {
                o.insert(
                    "k".into(),
                    example(doc, &schema["additionalProperties"], all),
                );
            }
            Value::Object(o)
        }
        _ => Value::Null,
    }
}

/// The `extra` map of a model that keeps unknown fields.
trait Extra {
    fn extra(&self) -> &Map<String, Value>;
}

macro_rules! extra {
    ($($t:ty),*) => {$(
        impl Extra for $t {
            fn extra(&self) -> &Map<String, Value> {
                &self.extra
            }
        }
    )*};
}
extra!(
    Sandbox,
    Snapshot,
    Org,
    Project,
    Key,
    Pool,
    Webhook,
    WebhookDelivery,
    PublicEvent,
    EventCredentials,
    MadeDir
);

/// Reads the full example of `name` into `T` and writes it back unchanged; `extra` says what
/// the model left unknown. With `served`, the model also reads an answer with only the
/// required fields (a request body is only ever written by the client).
fn check<T: DeserializeOwned + Serialize>(
    doc: &Value,
    name: &str,
    served: bool,
    extra: impl Fn(&T) -> Vec<String>,
) -> Vec<String> {
    let mut out = Vec::new();
    let full = example(doc, schema(doc, name), true);
    match serde_json::from_value::<T>(full.clone()) {
        Err(e) => out.push(format!("{name}: the model does not read {full}: {e}")),
        Ok(model) => {
            for field in extra(&model) {
                out.push(format!(
                    "{name}.{field}: documented, but not a field of the model"
                ));
            }
            let back = serde_json::to_value(&model).expect("serializes");
            if back != full {
                out.push(format!(
                    "{name}: written back as {back}, documented as {full}"
                ));
            }
        }
    }
    let minimal = example(doc, schema(doc, name), false);
    if served {
        if let Err(e) = serde_json::from_value::<T>(minimal.clone()) {
            out.push(format!(
                "{name}: the model needs more than the required fields {minimal}: {e}"
            ));
        }
    }
    out
}

fn known<T>(_: &T) -> Vec<String> {
    Vec::new()
}

fn unknown<T: Extra>(model: &T) -> Vec<String> {
    model.extra().keys().cloned().collect()
}

#[test]
fn the_models_have_exactly_the_documents_fields() {
    let doc = document();
    let d = &doc;
    let mut problems = Vec::new();
    problems.extend(check::<Resources>(d, "Resources", true, known));
    problems.extend(check::<Sandbox>(d, "Sandbox", true, unknown));
    problems.extend(check::<CreateSandbox>(
        d,
        "CreateSandboxRequest",
        false,
        known,
    ));
    problems.extend(check::<UpdateSandbox>(
        d,
        "UpdateSandboxRequest",
        false,
        known,
    ));
    problems.extend(check::<ExecRequest>(d, "ExecRequest", false, known));
    problems.extend(check::<ExecResult>(d, "ExecResult", true, known));
    problems.extend(check::<ExecExit>(d, "ExecExit", true, known));
    problems.extend(check::<StreamError>(d, "StreamError", true, known));
    problems.extend(check::<FileList>(d, "FileList", true, known));
    problems.extend(check::<MakeDirectory>(d, "MakeDirectory", false, known));
    problems.extend(check::<MadeDir>(d, "Directory", true, unknown));
    problems.extend(check::<PortAnswer>(d, "PortAnswer", true, known));
    problems.extend(check::<PendingOperation>(
        d,
        "PendingOperation",
        true,
        known,
    ));
    problems.extend(check::<Snapshot>(d, "Snapshot", true, unknown));
    problems.extend(check::<StatusEvent>(d, "StatusEvent", true, known));
    problems.extend(check::<Org>(d, "Org", true, unknown));
    problems.extend(check::<UpdateOrg>(d, "UpdateOrgRequest", false, known));
    problems.extend(check::<Project>(d, "Project", true, unknown));
    problems.extend(check::<Key>(d, "Key", true, unknown));
    problems.extend(check::<CreatedKey>(
        d,
        "CreatedKey",
        true,
        |k: &CreatedKey| unknown(&k.record),
    ));
    problems.extend(check::<CreateKey>(d, "CreateKeyRequest", false, known));
    problems.extend(check::<Quota>(d, "Quota", true, known));
    problems.extend(check::<Policy>(d, "Policy", true, known));
    problems.extend(check::<Pool>(d, "Pool", true, unknown));
    problems.extend(check::<PoolRequest>(d, "PoolRequest", false, known));
    problems.extend(check::<WarmClass>(d, "WarmClass", false, known));
    problems.extend(check::<WarmClasses>(d, "WarmClasses", true, known));
    problems.extend(check::<Webhook>(d, "Webhook", true, unknown));
    problems.extend(check::<WebhookWithSecret>(
        d,
        "WebhookWithSecret",
        true,
        |w: &WebhookWithSecret| unknown(&w.webhook),
    ));
    problems.extend(check::<CreateWebhook>(
        d,
        "CreateWebhookRequest",
        false,
        known,
    ));
    problems.extend(check::<UpdateWebhook>(
        d,
        "UpdateWebhookRequest",
        false,
        known,
    ));
    problems.extend(check::<WebhookDelivery>(
        d,
        "WebhookDelivery",
        true,
        unknown,
    ));
    problems.extend(check::<PublicEvent>(d, "PublicEvent", true, unknown));
    problems.extend(check::<EventCredentialsRequest>(
        d,
        "EventCredentialsRequest",
        false,
        known,
    ));
    problems.extend(check::<EventCredentials>(
        d,
        "EventCredentials",
        true,
        unknown,
    ));
    assert!(
        problems.is_empty(),
        "client/src/models.rs departs from docs/openapi.json:\n{}",
        problems.join("\n")
    );
}
