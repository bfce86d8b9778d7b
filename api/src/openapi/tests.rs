//! The document against the router's source and the types' serde shapes.

use std::collections::BTreeSet;

use chrono::Utc;
use differently_core::exec::{ExecRequest, ExecResult};
use differently_core::tenancy::{ApiKeyRecord, Org, OrgStatus, Project, Quota, Scope};
use differently_core::{
    CreateSandboxRequest, ErrorCode, OrgId, ProjectId, Sandbox, SandboxSpec, SandboxStatus,
};

use super::*;

mod fits;
mod generated;

/// The `.rs` files of `src/` and everything under `src/routes/` (one module per resource);
/// other subdirectories (this one) are not router modules.
fn router_sources(src: &std::path::Path) -> Vec<std::path::PathBuf> {
    fn walk(dir: &std::path::Path, descend: bool, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("source dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                if descend || path.file_name().is_some_and(|n| n == "routes") {
                    walk(&path, true, out);
                }
            } else if path.extension().and_then(|e| e.to_str()) == Some("rs") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(src, false, &mut out);
    out
}

/// `(method, path)` of every `.route(…)` the crate's router modules declare, read from
/// their source so that a route added without a catalogue entry fails here.
fn declared_routes() -> BTreeSet<(String, String)> {
    let src = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src"));
    let mut out = BTreeSet::new();
    for path in router_sources(src) {
        let text = std::fs::read_to_string(&path).expect("source");
        for (start, _) in text.match_indices(".route(") {
            let rest = &text[start + ".route(".len()..];
            let rest = rest.trim_start();
            let Some(rest) = rest.strip_prefix('"') else {
                continue;
            };
            let end = rest.find('"').expect("closing quote");
            let route = rest[..end].to_owned();
            // The methods are the calls inside `.route(…)` named after an HTTP method.
            let mut depth = 1usize;
            let mut args_end = rest.len();
            for (i, c) in rest[end..].char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' => {
                        depth -= 1;
                        if depth == 0 {
                            args_end = end + i;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let args = &rest[end..args_end];
            let mut found = false;
            for method in ["get", "post", "put", "patch", "delete"] {
                let call = format!("{method}(");
                for (at, _) in args.match_indices(&call) {
                    let before = args[..at].chars().next_back();
                    if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                        continue;
                    }
                    out.insert((method.to_owned(), route.clone()));
                    found = true;
                }
            }
            assert!(
                found,
                "no method found for route {route} in {}",
                path.display()
            );
        }
    }
    out
}

#[test]
fn the_catalogue_lists_exactly_the_routes_the_router_declares() {
    let declared = declared_routes();
    assert!(declared.len() > 50, "the scan found only {declared:?}");
    let documented: BTreeSet<(String, String)> = catalogue()
        .iter()
        .map(|op| (op.method.to_owned(), op.path.to_owned()))
        .collect();
    let undocumented: Vec<_> = declared.difference(&documented).collect();
    let unserved: Vec<_> = documented.difference(&declared).collect();
    assert!(
        undocumented.is_empty(),
        "served but not in the catalogue: {undocumented:?}"
    );
    assert!(
        unserved.is_empty(),
        "in the catalogue but not served: {unserved:?}"
    );
}

#[test]
fn the_document_is_well_formed() {
    let doc = document();
    assert_eq!(doc["openapi"], "3.1.0");
    let mut ids = BTreeSet::new();
    for op in catalogue() {
        assert!(ids.insert(op.id), "operationId {} twice", op.id);
        let served = &doc["paths"][op.path][op.method];
        assert_eq!(served["operationId"], op.id);
        assert!(
            op.answers
                .iter()
                .any(|a| !matches!(a, Answer::Json(s, _) | Answer::Empty(s) if *s >= 300)),
            "{} has no success answer",
            op.id
        );
        let params: Vec<&str> = served["parameters"]
            .as_array()
            .map(|ps| ps.iter().filter_map(|p| p["name"].as_str()).collect())
            .unwrap_or_default();
        for name in path_params(op.path) {
            assert!(
                params.contains(&name),
                "{}: path parameter {name} undeclared",
                op.id
            );
        }
    }
    // Every reference resolves.
    let text = serde_json::to_string(doc).expect("serializes");
    for (at, _) in text.match_indices("\"$ref\":\"#/components/") {
        let rest = &text[at + "\"$ref\":\"#/components/".len()..];
        let target = &rest[..rest.find('"').expect("end of ref")];
        let (kind, name) = target.split_once('/').expect("kind/name");
        assert!(
            doc["components"][kind].get(name).is_some(),
            "unresolved reference {target}"
        );
    }
}

/// JSON Schema type names a value satisfies.
fn type_names(v: &Value) -> &'static [&'static str] {
    match v {
        Value::Null => &["null"],
        Value::Bool(_) => &["boolean"],
        Value::Number(n) if n.is_i64() || n.is_u64() => &["integer", "number"],
        Value::Number(_) => &["number"],
        Value::String(_) => &["string"],
        Value::Array(_) => &["array"],
        Value::Object(_) => &["object"],
    }
}

/// Where `value` departs from `schema` (the subset of JSON Schema this document uses).
fn departures(schema: &Value, value: &Value, at: &str) -> Vec<String> {
    let doc = document();
    if let Some(r) = schema["$ref"].as_str() {
        let name = r.trim_start_matches("#/components/schemas/");
        return departures(&doc["components"]["schemas"][name], value, at);
    }
    if let Some(branches) = schema["anyOf"].as_array() {
        return if branches.iter().any(|b| departures(b, value, at).is_empty()) {
            vec![]
        } else {
            vec![format!("{at}: {value} matches no branch")]
        };
    }
    let mut out = Vec::new();
    let allowed: Vec<&str> = match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    if !allowed.is_empty() && !type_names(value).iter().any(|t| allowed.contains(t)) {
        out.push(format!("{at}: {value} is not {allowed:?}"));
        return out;
    }
    if let Some(values) = schema["enum"].as_array() {
        if !values.contains(value) {
            out.push(format!("{at}: {value} is not one of {values:?}"));
        }
    }
    match value {
        Value::Object(fields) => {
            let props = schema["properties"].as_object();
            for name in schema["required"].as_array().into_iter().flatten() {
                let name = name.as_str().unwrap_or_default();
                if !fields.contains_key(name) {
                    out.push(format!("{at}.{name}: required but absent"));
                }
            }
            for (name, field) in fields {
                let sub = format!("{at}.{name}");
                match (
                    props.and_then(|p| p.get(name)),
                    &schema["additionalProperties"],
                ) {
                    (Some(s), _) => out.extend(departures(s, field, &sub)),
                    (None, extra @ Value::Object(_)) => out.extend(departures(extra, field, &sub)),
                    (None, _) if props.is_some() => out.push(format!("{sub}: not in the schema")),
                    (None, _) => {}
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                out.extend(departures(&schema["items"], item, &format!("{at}[{i}]")));
            }
        }
        _ => {}
    }
    out
}

fn assert_fits(schema: &str, value: impl Serialize) {
    let value = serde_json::to_value(value).expect("serializes");
    let found = departures(&reference(schema), &value, schema);
    assert!(
        found.is_empty(),
        "{schema} departs from {value}:\n{}",
        found.join("\n")
    );
}

/// The schema's property names, which must be exactly what the type (de)serializes.
fn property_names(schema: &str) -> BTreeSet<String> {
    document()["components"]["schemas"][schema]["properties"]
        .as_object()
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default()
}

fn field_names(value: impl Serialize) -> BTreeSet<String> {
    match serde_json::to_value(value).expect("serializes") {
        Value::Object(fields) => fields.keys().cloned().collect(),
        other => panic!("not an object: {other}"),
    }
}

fn sandbox() -> Sandbox {
    let req: CreateSandboxRequest = serde_json::from_value(json!({
        "env": { "K": "secret" }, "labels": { "team": "a" }, "idleTimeoutSeconds": 60,
    }))
    .expect("request");
    let spec = SandboxSpec::build(&req).expect("spec");
    let mut s = Sandbox::queued(OrgId::new(), ProjectId::new(), spec, None, Utc::now());
    s.status = SandboxStatus::Running;
    s.pool = Some("local".into());
    s.started_at = Some(Utc::now());
    s
}

#[test]
fn served_objects_fit_their_schemas() {
    let s = sandbox();
    assert_fits("Sandbox", s.view());
    assert_eq!(field_names(s.view()), property_names("Sandbox"));
    let mut queued = s.clone();
    queued.status = SandboxStatus::Queued;
    queued.pool = None;
    queued.started_at = None;
    assert_fits("Sandbox", queued.view());
    assert_fits(
        "SandboxList",
        crate::requests::page::Page {
            items: vec![s.view()],
            next_cursor: Some("c".into()),
        },
    );
    let result = ExecResult {
        exit_code: 124,
        stdout: "out".into(),
        stderr: String::new(),
        stdout_truncated: true,
        stderr_truncated: false,
        duration_ms: 3,
    };
    assert_fits("ExecResult", &result);
    assert_eq!(field_names(&result), property_names("ExecResult"));
    let org = Org {
        id: OrgId::new(),
        name: "acme".into(),
        status: OrgStatus::Suspended,
        created_at: Utc::now(),
    };
    assert_fits("Org", &org);
    assert_eq!(field_names(&org), property_names("Org"));
    let project = Project {
        id: ProjectId::new(),
        org_id: org.id.clone(),
        name: "p".into(),
        created_at: Utc::now(),
    };
    assert_fits("Project", &project);
    assert_eq!(field_names(&project), property_names("Project"));
    let key = ApiKeyRecord {
        id: differently_core::KeyId::new(),
        org_id: org.id.clone(),
        project_id: None,
        name: "ci".into(),
        scopes: Scope::ALL.to_vec(),
        hash: "never served".into(),
        created_at: Utc::now(),
        expires_at: None,
        revoked_at: Some(Utc::now()),
        last_used_at: None,
    };
    assert_fits("Key", &key);
    assert_eq!(field_names(&key), property_names("Key"));
    let snapshot = crate::routes::snapshots::SnapshotView {
        id: differently_core::ids::SnapshotId::new(),
        org_id: org.id.clone(),
        project_id: project.id.clone(),
        sandbox_id: s.id.clone(),
        pool: "local".into(),
        name: None,
        status: differently_store::lifecycle::SnapshotStatus::Ready,
        status_reason: None,
        created_at: Utc::now(),
        updated_at: Utc::now(),
    };
    assert_fits("Snapshot", &snapshot);
    assert_eq!(field_names(&snapshot), property_names("Snapshot"));
}

#[tokio::test]
async fn every_error_code_fits_the_error_schema() {
    for code in ErrorCode::ALL {
        let e = crate::error::ApiError::new(code, "m").with_details(json!({ "field": "x" }));
        let response = e.into_response();
        assert_eq!(response.status().as_u16(), code.http_status());
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .expect("body");
        let value: Value = serde_json::from_slice(&body).expect("json");
        assert_fits("Error", value);
    }
}

#[test]
fn accepted_bodies_have_exactly_the_fields_their_types_take() {
    // These types serialize every field (none is skipped), so their key sets are what
    // deserialization accepts; unknown fields are refused.
    assert_eq!(
        field_names(CreateSandboxRequest::default()),
        property_names("CreateSandboxRequest")
    );
    assert_eq!(field_names(Quota::default()), property_names("Quota"));
    let exec: ExecRequest = serde_json::from_value(json!({ "command": ["true"] })).expect("exec");
    assert_eq!(field_names(&exec), property_names("ExecRequest"));
    // Every value the document offers for the create request's vocabularies is accepted.
    let create = &document()["components"]["schemas"]["CreateSandboxRequest"]["properties"];
    for field in ["profile", "classification", "strategy", "external"] {
        for value in create[field]["enum"].as_array().expect("enum") {
            let req: CreateSandboxRequest =
                serde_json::from_value(json!({ field: value })).expect("deserializes");
            SandboxSpec::build(&req)
                .unwrap_or_else(|e| panic!("{field} = {value} is refused: {e}"));
        }
    }
    for value in create["capabilities"]["items"]["enum"]
        .as_array()
        .expect("enum")
    {
        let req: CreateSandboxRequest =
            serde_json::from_value(json!({ "capabilities": [value] })).expect("deserializes");
        SandboxSpec::build(&req).unwrap_or_else(|e| panic!("capability {value}: {e}"));
    }
}

#[test]
fn policies_and_pools_fit_their_schemas() {
    use differently_core::policy::{Isolation, Policy, Strategy};
    use differently_core::pool::{PoolHealth, PoolRecord, PoolSource, Trust};
    // Every field set: the serialized keys are exactly the schema's, and the values fit.
    let full = Policy {
        allowed_classifications: Some(vec!["internal".into()]),
        pool_classifications: [("fake".to_owned(), vec!["public".to_owned()])].into(),
        allowed_regions: Some(vec!["eu".into()]),
        allow_external: Some(true),
        external_pools: Some(vec!["e2b".into()]),
        denied_pools: vec!["old".into()],
        default_strategy: Some(Strategy::ALL[0]),
    };
    assert_fits("Policy", &full);
    assert_eq!(field_names(&full), property_names("Policy"));
    assert_fits("Policy", Policy::default());
    // What the schema offers, the type accepts.
    let back: Policy = serde_json::from_value(serde_json::to_value(&full).unwrap()).unwrap();
    assert_eq!(back, full);

    let record = PoolRecord {
        name: "fake".into(),
        kind: "fake".into(),
        trust: Trust::Private,
        region: None,
        max_concurrent: Some(10),
        isolation: Some(Isolation::Microvm),
        cost_per_cpu_hour: 0.5,
        typical_create_seconds: None,
        settings: json!({ "apiKeySecret": "name-only" }),
        source: PoolSource::Api,
        created_at: Utc::now(),
        updated_at: Utc::now(),
    };
    assert_fits("PoolRecord", &record);
    assert_eq!(field_names(&record), property_names("PoolRecord"));
    let health = PoolHealth {
        name: "fake".into(),
        healthy: false,
        capabilities: vec!["exec".into()],
        error: Some("down".into()),
        checked_at: Utc::now(),
        checked_by: "host:1".into(),
        backend: None,
    };
    assert_eq!(field_names(&health), property_names("PoolHealth"));
    // As `GET /v1/admin/pools` serves it: the record, flattened, and its live state.
    let mut served = serde_json::to_value(&record).unwrap();
    let live = json!({ "capabilities": ["exec"], "healthy": false,
        "health": serde_json::to_value(&health).unwrap(), "usedSlots": 3 });
    for (k, v) in live.as_object().unwrap() {
        served[k] = v.clone();
    }
    // The backend's fields, as `routes::pools::Backend` serializes them, for every status.
    use differently_adapters::VerifiedStatus as V;
    for (version, verified) in [
        (None, V::Live),
        (Some("1.1.1"), V::Replayed),
        (Some("1.3.0"), V::FakeOnly),
        (None, V::Unknown),
    ] {
        let backend = crate::routes::pools::Backend {
            backend_version: version.map(str::to_owned),
            verified,
            verified_basis: "why".into(),
        };
        for (k, v) in serde_json::to_value(&backend).unwrap().as_object().unwrap() {
            served[k] = v.clone();
        }
        assert_fits("Pool", &served);
    }
    assert_eq!(field_names(&served), property_names("Pool"));
}

#[test]
fn bounds_in_the_document_are_the_codes_constants() {
    use differently_core::exec::MAX_EXEC_TIMEOUT_SECONDS;
    use differently_core::sandbox::MAX_TTL_SECONDS;
    use differently_core::Resources;
    let schemas = &document()["components"]["schemas"];
    let bounds = |v: &Value| (v["minimum"].as_u64(), v["maximum"].as_u64());
    let create = &schemas["CreateSandboxRequest"]["properties"];
    assert_eq!(
        bounds(&create["ttlSeconds"]),
        (Some(1), Some(MAX_TTL_SECONDS))
    );
    assert_eq!(
        bounds(&schemas["UpdateSandboxRequest"]["properties"]["ttlSeconds"]),
        (Some(1), Some(MAX_TTL_SECONDS))
    );
    let resources = &create["resources"]["anyOf"][0]["properties"];
    assert_eq!(
        bounds(&resources["cpu"]),
        (Some(1), Some(u64::from(Resources::MAX_CPU)))
    );
    assert_eq!(
        bounds(&resources["memoryMiB"]),
        (
            Some(Resources::MIN_MEMORY_MIB),
            Some(Resources::MAX_MEMORY_MIB)
        )
    );
    assert_eq!(
        bounds(&resources["diskGiB"]),
        (Some(0), Some(Resources::MAX_DISK_GIB))
    );
    assert_eq!(
        bounds(&schemas["ExecRequest"]["properties"]["timeoutSeconds"]),
        (Some(1), Some(MAX_EXEC_TIMEOUT_SECONDS))
    );
    assert_eq!(
        bounds(&schemas["PortRequest"]["properties"]["port"]),
        (Some(1), Some(65535))
    );
    // Every `limit` query parameter states the page bounds and default of `page`.
    for op in catalogue() {
        for p in document()["paths"][op.path][op.method]["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["name"] == "limit")
        {
            assert_eq!(
                bounds(&p["schema"]),
                (Some(1), Some(u64::from(crate::requests::page::MAX_PAGE))),
                "{}",
                op.id
            );
            assert_eq!(
                p["schema"]["default"],
                crate::requests::page::DEFAULT_PAGE,
                "{}",
                op.id
            );
        }
    }
}

#[test]
fn path_ids_are_patterned_by_their_prefix() {
    use differently_core::ids::SnapshotId;
    use differently_core::{KeyId, OrgId, ProjectId, SandboxId};
    let examples = [
        ("/v1/sandboxes/{id}", SandboxId::new().to_string()),
        ("/v1/snapshots/{id}", SnapshotId::new().to_string()),
        ("/v1/orgs/{id}", OrgId::new().to_string()),
        ("/v1/projects/{id}", ProjectId::new().to_string()),
        ("/v1/keys/{id}", KeyId::new().to_string()),
    ];
    for (path, id) in examples {
        let pattern = path_param_schema(path, "id")["pattern"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        // The id's prefix, then a ULID as `Id::parse` reads it: Crockford base 32 (no I, L,
        // O, U), either case.
        let (prefix, ulid) = id.split_once('_').expect("prefixed");
        assert_eq!(
            pattern,
            format!("^{prefix}_[0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{{26}}$"),
            "{path}"
        );
        let crockford = |c: char| c.is_ascii_alphanumeric() && !"ILOUilou".contains(c);
        assert!(ulid.len() == 26 && ulid.chars().all(crockford));
        // What the pattern refuses, `parse` refuses too.
        for refused in ["I", "L", "O", "U", "i", "u"] {
            let bad = format!("{prefix}_{refused}{}", &ulid[1..]);
            assert!(
                SandboxId::parse(&bad.replacen(prefix, "sbx", 1)).is_err(),
                "{bad}"
            );
        }
    }
    // Every path parameter of the document has a pattern, or is a bounded integer (a pid).
    for op in catalogue() {
        for name in path_params(op.path) {
            let schema = path_param_schema(op.path, name);
            let bounded = schema["type"] == "integer"
                && schema["minimum"].is_number()
                && schema["maximum"].is_number();
            assert!(
                schema["pattern"].is_string() || bounded,
                "{} {}: {{{name}}} has no pattern",
                op.method,
                op.path
            );
        }
    }
}

#[test]
fn a_body_is_required_only_when_its_schema_needs_a_field() {
    let doc = document();
    for op in catalogue() {
        let Body::Json(schema) = op.body else {
            continue;
        };
        let needs = doc["components"]["schemas"][schema]["required"]
            .as_array()
            .is_some_and(|r| !r.is_empty());
        assert_eq!(
            doc["paths"][op.path][op.method]["requestBody"]["required"], needs,
            "{}",
            op.id
        );
        if !needs {
            // What an empty body is read as is acceptable to the schema.
            assert!(
                departures(&reference(schema), &json!({}), schema).is_empty(),
                "{}",
                op.id
            );
        }
    }
}

#[test]
fn event_streams_are_text_event_stream_with_typed_events() {
    let doc = document();
    for id in ["events", "execStream", "processOutput"] {
        let op = catalogue().into_iter().find(|o| o.id == id).expect("op");
        let content = &doc["paths"][op.path][op.method]["responses"]["200"]["content"];
        let sse = &content["text/event-stream"];
        // One event: its name (one of `x-events`) and its data.
        let events = sse["x-events"].as_object().expect("x-events");
        assert!(!events.is_empty(), "{id}");
        let names = sse["schema"]["properties"]["event"]["enum"]
            .as_array()
            .expect("event names");
        assert_eq!(names.len(), events.len(), "{id}");
        assert!(names
            .iter()
            .all(|n| events.contains_key(n.as_str().unwrap_or_default())));
        assert_eq!(
            sse["schema"]["properties"]["data"]["type"], "string",
            "{id}"
        );
        assert!(content.get("application/json").is_none(), "{id}");
    }
}

#[test]
fn every_documented_error_status_has_an_error_code() {
    for op in catalogue() {
        for status in error_statuses(&op) {
            assert!(
                status == 416 || ErrorCode::ALL.iter().any(|c| c.http_status() == status),
                "{}: {status} is documented but no code is served with it",
                op.id
            );
        }
    }
}

/// The parameters of operation `id` in the served document.
fn parameters_of(id: &str) -> Vec<Value> {
    let op = catalogue()
        .into_iter()
        .find(|o| o.id == id)
        .unwrap_or_else(|| panic!("no operation {id}"));
    document()["paths"][op.path][op.method]["parameters"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[test]
fn cursors_are_opaque_strings() {
    let mut lists = 0;
    for op in catalogue() {
        for p in parameters_of(op.id)
            .iter()
            .filter(|p| p["name"] == "cursor")
        {
            lists += 1;
            let schema = &p["schema"];
            assert_eq!(schema["type"], "string", "{}", op.id);
            assert_eq!(schema["minLength"], 1, "{}", op.id);
            // No shape beyond the NUL every string refuses: an id or a number today, anything
            // tomorrow.
            assert_eq!(schema["pattern"], components::NO_NUL, "{}: {schema}", op.id);
        }
    }
    assert!(lists >= 5, "the lists have cursors");
}

#[test]
fn only_a_listing_may_name_the_root_directory() {
    let schema_of = |id: &str| {
        parameters_of(id)
            .into_iter()
            .find(|p| p["name"] == "path")
            .map(|p| {
                p["schema"]["pattern"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .unwrap_or_else(|| panic!("{id} has a path"))
    };
    assert_eq!(schema_of("listFiles"), format!("{NO_PARENT}/"));
    // The lookahead refusing `..` needs an engine with lookaround; what follows it is a plain
    // regular expression, tried here on the root's spellings and on files below it.
    let below = regex::Regex::new(&format!("^{BELOW_ROOT}")).expect("a regular expression");
    for id in ["uploadFile", "downloadFile", "deleteFile"] {
        assert_eq!(schema_of(id), format!("{NO_PARENT}{BELOW_ROOT}"), "{id}");
    }
    for root in ["/", "//", "/.", "/./", "/./.", "tmp/a", ""] {
        assert!(
            !below.is_match(root),
            "{root:?} passes as a file below the root"
        );
    }
    for file in ["/a", "/.a", "/./b", "/tmp/x", "//a", "/a/", "/..a"] {
        assert!(below.is_match(file), "{file:?} is refused");
    }
}

#[test]
fn the_terminal_is_documented_as_a_websocket_upgrade() {
    let op = catalogue()
        .into_iter()
        .find(|o| o.id == "openPty")
        .expect("openPty");
    let served = &document()["paths"][op.path][op.method];
    assert!(served["responses"]["101"].is_object(), "{served}");
    let headers: Vec<(String, bool)> = parameters_of("openPty")
        .iter()
        .filter(|p| p["in"] == "header")
        .map(|p| {
            (
                p["name"].as_str().unwrap_or_default().to_owned(),
                p["required"] == true,
            )
        })
        .collect();
    for name in [
        "Connection",
        "Upgrade",
        "Sec-WebSocket-Version",
        "Sec-WebSocket-Key",
    ] {
        assert!(
            headers.contains(&(name.to_owned(), true)),
            "{name} is not a required header: {headers:?}"
        );
    }
    // No other operation is an upgrade.
    for other in catalogue().into_iter().filter(|o| o.id != "openPty") {
        assert!(
            !parameters_of(other.id)
                .iter()
                .any(|p| p["name"] == "Sec-WebSocket-Key"),
            "{}",
            other.id
        );
    }
}

/// The bounds a refusal of a number beyond its type's range quotes are the document's, found
/// through the body type's component, references and nested objects and arrays.
#[test]
fn number_bounds_are_found_by_the_body_type_and_the_json_path() {
    fn at<T: serde::de::DeserializeOwned + std::fmt::Debug>(
        body: serde_json::Value,
    ) -> StatedBounds {
        let err = serde_path_to_error::deserialize::<_, T>(&body).expect_err("refused");
        number_bounds(std::any::type_name::<T>(), err.path())
    }
    let stated = |min: Option<&str>, max: &str| StatedBounds {
        minimum: min.map(str::to_owned),
        maximum: Some(max.to_owned()),
    };
    assert_eq!(
        at::<ExecRequest>(json!({ "command": ["ls"], "timeoutSeconds": -1 })),
        stated(Some("1"), "86400")
    );
    assert_eq!(
        at::<CreateSandboxRequest>(
            json!({ "resources": { "cpu": -1, "memoryMiB": 512, "diskGiB": 1 } })
        ),
        stated(Some("1"), &differently_core::Resources::MAX_CPU.to_string())
    );
    assert_eq!(
        at::<Quota>(json!({ "maxActive": -1 })),
        stated(
            Some("0"),
            &differently_core::tenancy::MAX_QUOTA_COUNT.to_string()
        )
    );
    assert_eq!(
        at::<differently_core::warm::WarmClasses>(
            json!({ "classes": [{ "name": "a", "size": 1, "refillPerSecond": 1.0 }, { "name": "b", "size": -1, "refillPerSecond": 1.0 }] })
        ),
        stated(Some("0"), &differently_core::warm::MAX_SIZE.to_string())
    );
    // A type that is no component states nothing.
    assert_eq!(
        at::<std::collections::BTreeMap<String, u8>>(json!({ "a": -1 })),
        StatedBounds::default()
    );
}
