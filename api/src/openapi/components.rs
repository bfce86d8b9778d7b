//! `components.schemas`: generated from the wire types (`utoipa::ToSchema`), then refined by
//! what serde cannot say ([`super::facts`]), plus the few objects the API builds without a
//! type of their own ([`super::untyped`]).
//!
//! A type is a component only when [`derived`] names it; any other type it refers to (an id,
//! a status, an inner object) is inlined where it is used, as the document always had them.

use std::collections::BTreeMap;

use differently_core::exec::{ExecRequest, ExecResult};
use differently_core::policy::{EffectivePolicy, Policy, PoolVerdict};
use differently_core::pool::{PoolHealth, PoolRecord};
use differently_core::process::{Process, SignalProcess, StartProcess, TerminalSize};
use differently_core::sandbox::SandboxView;
use differently_core::tenancy::{ApiKeyRecord, Org, Project, Quota};
use differently_core::warm::{WarmClass, WarmClasses};
use differently_core::{CreateSandboxRequest, Resources};
use differently_store::audit::{AuditEvent, Checkpoint, Problem, VerifyReport};
use differently_store::secrets::SecretInfo;
use differently_store::webhooks::{Delivery, Webhook};
use serde_json::{json, Map, Value};
use utoipa::ToSchema;

use super::{facts, untyped};
use crate::requests::page::Page;
use crate::routes::audit::{SegmentAnswer, SegmentRequest};
use crate::routes::event_credentials::{Credentials, IssueRequest};
use crate::routes::events::StatusEvent;
use crate::routes::exec::{ExitEvent, StreamErrorEvent};
use crate::routes::files::{Directory, MakeDirectory};
use crate::routes::keys::{CreateKey, CreatedKey};
use crate::routes::orgs::{CreateOrg, UpdateOrg};
use crate::routes::pools::PoolBody;
use crate::routes::ports::PendingOperation;
use crate::routes::ports::{PortAnswer, PortRequest};
use crate::routes::projects::{CreateProject, UpdateProject};
use crate::routes::queue::{MetricsSummary, QueueReport};
use crate::routes::quotas::QuotaView;
use crate::routes::sandboxes::PatchRequest;
use crate::routes::secrets::SecretRequest;
use crate::routes::snapshots::{SnapshotRequest, SnapshotView};
use crate::routes::warm::{ServedClass, WarmDocument};
use crate::routes::webhooks::{CreateWebhook, PatchWebhook, WithSecret};

/// Schemas of the wire types, by component name, and the schemas they refer to, by type name.
#[derive(Default)]
struct Derived {
    components: Vec<(&'static str, String, Value)>,
    referred: BTreeMap<String, Value>,
    /// Each component's Rust type (`std::any::type_name`), by which a body's refusal finds
    /// the schema of the type it was read as.
    rust_types: Vec<(&'static str, &'static str)>,
}

impl Derived {
    fn add<T: ToSchema>(&mut self, component: &'static str) -> &mut Self {
        let mut referred = Vec::new();
        T::schemas(&mut referred);
        for (name, schema) in referred {
            self.referred.insert(name, to_json(schema));
        }
        self.components
            .push((component, T::name().into_owned(), to_json(T::schema())));
        self.rust_types
            .push((std::any::type_name::<T>(), component));
        self
    }
}

/// The component whose schema is that of the Rust type named `type_name`
/// (`std::any::type_name`), if one is.
pub(super) fn component_of(type_name: &str) -> Option<&'static str> {
    static BY_TYPE: std::sync::OnceLock<BTreeMap<&'static str, &'static str>> =
        std::sync::OnceLock::new();
    BY_TYPE
        .get_or_init(|| derived().rust_types.into_iter().collect())
        .get(type_name)
        .copied()
}

fn to_json(schema: impl serde::Serialize) -> Value {
    serde_json::to_value(schema).unwrap_or(Value::Null)
}

/// The components generated from types: the component name, then the type.
fn derived() -> Derived {
    let mut d = Derived::default();
    d.add::<Resources>("Resources")
        .add::<SandboxView>("Sandbox")
        .add::<CreateSandboxRequest>("CreateSandboxRequest")
        .add::<ExecRequest>("ExecRequest")
        .add::<ExecResult>("ExecResult")
        .add::<StartProcess>("StartProcess")
        .add::<Process>("Process")
        .add::<SignalProcess>("SignalProcess")
        .add::<TerminalSize>("TerminalSize")
        .add::<Org>("Org")
        .add::<Project>("Project")
        .add::<ApiKeyRecord>("Key")
        .add::<Quota>("Quota")
        .add::<Policy>("Policy")
        .add::<EffectivePolicy>("EffectivePolicy")
        .add::<PoolVerdict>("PoolVerdict")
        .add::<PoolRecord>("PoolRecord")
        .add::<PoolHealth>("PoolHealth")
        .add::<WarmClass>("WarmClass")
        .add::<WarmClasses>("WarmClassesRequest")
        .add::<SnapshotView>("Snapshot")
        .add::<SnapshotRequest>("SnapshotRequest")
        .add::<PatchRequest>("UpdateSandboxRequest")
        .add::<PortRequest>("PortRequest")
        .add::<PortAnswer>("PortAnswer")
        .add::<MakeDirectory>("MakeDirectory")
        .add::<Directory>("Directory")
        .add::<CreateOrg>("CreateOrgRequest")
        .add::<UpdateOrg>("UpdateOrgRequest")
        .add::<CreateProject>("CreateProjectRequest")
        .add::<UpdateProject>("UpdateProjectRequest")
        .add::<CreateKey>("CreateKeyRequest")
        .add::<CreatedKey>("CreatedKey")
        .add::<QuotaView>("QuotaView")
        .add::<SegmentRequest>("AuditSegmentRequest")
        .add::<IssueRequest>("EventCredentialsRequest")
        .add::<PoolBody>("PoolRequest")
        .add::<CreateWebhook>("CreateWebhookRequest")
        .add::<PatchWebhook>("UpdateWebhookRequest")
        .add::<ExitEvent>("ExecExit")
        .add::<StreamErrorEvent>("StreamError")
        .add::<PendingOperation>("PendingOperation")
        .add::<ServedClass>("WarmClassStatus")
        .add::<WarmDocument>("WarmClasses")
        .add::<QueueReport>("QueueReport")
        .add::<MetricsSummary>("MetricsSummary")
        .add::<StatusEvent>("StatusEvent")
        .add::<Credentials>("EventCredentials")
        .add::<crate::error::ErrorBody>("Error")
        .add::<crate::Health>("Health")
        .add::<crate::routes::trust::TrustReport>("TrustReport")
        .add::<crate::routes::pools::PoolInfo>("Pool")
        .add::<crate::routes::event_schemas::SchemaList>("EventSchemaList");
    // The store's records as the admin and webhook routes serve them.
    d.add::<AuditEvent>("AuditEvent")
        .add::<Problem>("AuditProblem")
        .add::<VerifyReport>("Verification")
        .add::<Checkpoint>("Checkpoint")
        .add::<SegmentAnswer>("AuditSegment")
        .add::<SecretInfo>("Secret")
        .add::<SecretRequest>("SecretRequest")
        .add::<Webhook>("Webhook")
        .add::<WithSecret>("WebhookWithSecret")
        .add::<Delivery>("WebhookDelivery");
    // Every list is one page type; its items are the component of their type.
    d.add::<Page<SandboxView>>("SandboxList")
        .add::<Page<SnapshotView>>("SnapshotList")
        .add::<Page<Process>>("ProcessList")
        .add::<Page<Org>>("OrgList")
        .add::<Page<Project>>("ProjectList")
        .add::<Page<ApiKeyRecord>>("KeyList")
        .add::<Page<AuditEvent>>("AuditList")
        .add::<Page<SecretInfo>>("SecretList")
        .add::<Page<Webhook>>("WebhookList")
        .add::<Page<Delivery>>("WebhookDeliveryList")
        .add::<crate::routes::pools::PoolList>("PoolList");
    d
}

/// Every component schema of the document.
pub(super) fn schemas() -> Value {
    let (mut s, _) = generated();
    untyped::add(&mut s);
    // Every string a request carries is refused with a NUL (`crate::requests::nul`), except exec's
    // `stdin`, which is the caller's data. (Bodies named other than `…Request` are listed.)
    for (name, schema) in s.iter_mut() {
        if name.ends_with("Request") || matches!(name.as_str(), "Policy" | "Quota" | "StartProcess")
        {
            forbid_nul(schema, name == "ExecRequest");
        }
    }
    Value::Object(s)
}

/// The schemas generated from types, refined by the facts; and the facts that found no
/// field.
pub(super) fn generated() -> (Map<String, Value>, Vec<String>) {
    let d = derived();
    // A page's type name is the page's, not its items': only item types are referred to.
    let names: BTreeMap<&str, &str> = d
        .components
        .iter()
        .filter(|(component, _, _)| !component.ends_with("List"))
        .map(|(component, ty, _)| (ty.as_str(), *component))
        .collect();
    let mut s = Map::new();
    for (component, _, schema) in &d.components {
        let mut schema = schema.clone();
        resolve(&mut schema, &names, &d.referred, 0);
        normalize(&mut schema);
        s.insert((*component).to_owned(), schema);
    }
    // A flattening struct takes its flattened component as the facts refined it; then its
    // own facts apply.
    let flattening: Vec<String> = s
        .iter()
        .filter(|(_, schema)| schema.get("allOf").is_some())
        .map(|(name, _)| name.clone())
        .collect();
    let mut missed = facts::apply(&mut s, |c| !flattening.iter().any(|f| f == c));
    let flat: Vec<(String, Value)> = flattening
        .iter()
        .filter_map(|name| Some((name.clone(), flattened(&s[name], &s)?)))
        .collect();
    s.extend(flat);
    missed.extend(facts::apply(&mut s, |c| flattening.iter().any(|f| f == c)));
    (s, missed)
}

/// A struct with a `#[serde(flatten)]` field (`allOf` of the flattened component and its own
/// fields) as the one object it is on the wire; `None` when `schema` is no such struct.
fn flattened(schema: &Value, components: &Map<String, Value>) -> Option<Value> {
    let parts = schema.get("allOf")?.as_array()?;
    let mut properties = Map::new();
    let mut required: Vec<Value> = Vec::new();
    for part in parts {
        let part = match part.get("$ref").and_then(Value::as_str) {
            Some(r) => components.get(r.trim_start_matches(REF_PREFIX))?,
            None => part,
        };
        properties.extend(part.get("properties")?.as_object()?.clone());
        for r in part["required"].as_array().into_iter().flatten() {
            if !required.contains(r) {
                required.push(r.clone());
            }
        }
    }
    Some(json!({ "type": "object", "properties": properties, "required": required }))
}

/// A reference to component `name`.
pub(super) fn reference(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

const REF_PREFIX: &str = "#/components/schemas/";

/// Points references at components by their component name and inlines the schemas of
/// types that are not components.
fn resolve(
    schema: &mut Value,
    names: &BTreeMap<&str, &str>,
    referred: &BTreeMap<String, Value>,
    depth: usize,
) {
    match schema {
        Value::Object(o) => {
            if let Some(Value::String(r)) = o.get("$ref") {
                let ty = r.trim_start_matches(REF_PREFIX).to_owned();
                if let Some(component) = names.get(ty.as_str()) {
                    *schema = reference(component);
                    return;
                }
                if let Some(inner) = referred.get(&ty).filter(|_| depth < 16) {
                    *schema = inner.clone();
                    resolve(schema, names, referred, depth + 1);
                    return;
                }
            }
            for v in o.values_mut() {
                resolve(v, names, referred, depth);
            }
        }
        Value::Array(items) => {
            for v in items {
                resolve(v, names, referred, depth);
            }
        }
        _ => {}
    }
}

/// Formats that only say how wide a Rust number is: not part of the wire contract.
const WIDTHS: [&str; 4] = ["int32", "int64", "float", "double"];

/// The document's conventions over utoipa's: no Rust widths, no doc-comment prose (the
/// document's descriptions are written for API users, in [`super::facts`]), string keys
/// unstated, and a nullable field as a type list (a primitive) or `anyOf` with null.
fn normalize(schema: &mut Value) {
    match schema {
        Value::Object(o) => {
            let width = o
                .get("format")
                .and_then(Value::as_str)
                .is_some_and(|f| WIDTHS.contains(&f));
            if width {
                o.remove("format");
                // An unsigned width's implied minimum (the document states bounds in facts).
                if o.get("minimum") == Some(&json!(0)) || o.get("minimum") == Some(&json!(0.0)) {
                    o.remove("minimum");
                }
            }
            o.remove("description");
            if o.get("propertyNames") == Some(&json!({ "type": "string" })) {
                o.remove("propertyNames");
            }
            if let Some(Value::Object(props)) = o.get_mut("properties") {
                props.values_mut().for_each(normalize);
            }
            for key in ["items", "additionalProperties", "not"] {
                if let Some(v) = o.get_mut(key) {
                    normalize(v);
                }
            }
            for key in ["oneOf", "anyOf", "allOf", "prefixItems"] {
                if let Some(Value::Array(vs)) = o.get_mut(key) {
                    vs.iter_mut().for_each(normalize);
                }
            }
            if let Some(merged) = nullable(o) {
                *schema = merged;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(normalize),
        _ => {}
    }
}

/// `oneOf: [null, X]` (utoipa's `Option<T>`) as `{type: [t, "null"]}` for a one-type
/// non-object, else `anyOf: [X, null]`.
fn nullable(o: &Map<String, Value>) -> Option<Value> {
    let branches = o.get("oneOf")?.as_array()?;
    let null_branch = json!({ "type": "null" });
    if branches.len() != 2 || !branches.contains(&null_branch) {
        return None;
    }
    let other = branches.iter().find(|b| **b != null_branch)?.clone();
    let mut rest = o.clone();
    rest.remove("oneOf");
    let mut out = match other.get("type").and_then(Value::as_str) {
        Some(t) if t != "object" && other.get("$ref").is_none() => {
            let mut merged = other.clone();
            merged["type"] = json!([t, "null"]);
            if let Some(Value::Array(values)) = merged.get_mut("enum") {
                values.push(Value::Null);
            }
            merged
        }
        _ => json!({ "anyOf": [other, null_branch] }),
    };
    if let Some(target) = out.as_object_mut() {
        target.extend(rest);
    }
    Some(out)
}

/// The pattern of a string without a NUL.
pub(super) const NO_NUL: &str = "^[^\\u0000]*$";

/// Adds [`NO_NUL`] to every string in `schema` (values, object keys, items); with
/// `keep_stdin`, not to a top-level `stdin`.
pub(super) fn forbid_nul(schema: &mut Value, keep_stdin: bool) {
    let Some(o) = schema.as_object_mut() else {
        return;
    };
    let is_string = match o.get("type") {
        Some(Value::String(t)) => t == "string",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "string"),
        _ => false,
    };
    if is_string {
        add_no_nul(o);
    }
    if let Some(Value::Object(names)) = o.get_mut("propertyNames") {
        add_no_nul(names);
    }
    if let Some(Value::Object(props)) = o.get_mut("properties") {
        for (k, v) in props.iter_mut() {
            if !(keep_stdin && k == "stdin") {
                forbid_nul(v, false);
            }
        }
    }
    for key in ["additionalProperties", "items"] {
        if let Some(v) = o.get_mut(key) {
            forbid_nul(v, false);
        }
    }
    for key in ["anyOf", "prefixItems"] {
        if let Some(Value::Array(vs)) = o.get_mut(key) {
            vs.iter_mut().for_each(|v| forbid_nul(v, false));
        }
    }
}

fn add_no_nul(o: &mut Map<String, Value>) {
    if o.contains_key("pattern") {
        o.insert("allOf".to_owned(), json!([{ "pattern": NO_NUL }]));
    } else {
        o.insert("pattern".to_owned(), json!(NO_NUL));
    }
}
