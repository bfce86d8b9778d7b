//! `GET /v1/openapi.json`: the served OpenAPI 3.1 document of `/v1`.
//!
//! Built from the route catalogue below and from the code's own vocabularies (statuses,
//! scopes, strategies, capabilities, error codes), so clients and SDK generators read the
//! API as this binary serves it. Tests keep it honest: every route the router declares is in
//! the catalogue and the other way round, and the schemas of the objects the API serves and
//! accepts are checked against their serde shapes.

mod catalogue;
mod components;
mod facts;
#[cfg(test)]
mod tests;
mod untyped;

use std::sync::OnceLock;

use axum::http::header;
use axum::response::IntoResponse;
use serde::Serialize;
use serde_json::{json, Map, Value};

use catalogue::{catalogue, Access, Answer, Body, Op};
use components::reference;
use differently_core::ids::id_pattern;

/// The document, built once per process.
pub fn document() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(build)
}

/// `GET /v1/openapi.json` (no key needed: it describes the API, not anyone's data).
pub async fn serve() -> impl IntoResponse {
    static BYTES: OnceLock<axum::body::Bytes> = OnceLock::new();
    let bytes = BYTES.get_or_init(|| {
        axum::body::Bytes::from(serde_json::to_vec(document()).unwrap_or_default())
    });
    ([(header::CONTENT_TYPE, "application/json")], bytes.clone())
}

fn build() -> Value {
    build_with(components::schemas())
}

/// The document around `components` (its `components.schemas`).
fn build_with(components: Value) -> Value {
    let mut paths = Map::new();
    let mut tags: Vec<&str> = Vec::new();
    for op in catalogue() {
        if !tags.contains(&op.tag) {
            tags.push(op.tag);
        }
        let item = paths
            .entry(op.path.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        item[op.method] = operation(&op, &components);
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Differently",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "One REST API for isolated sandboxes, placed on backends under operator \
                policy. Errors are `{\"error\": {code, message, details, requestId}}` with a stable \
                `code`, whichever layer refuses the request; besides each operation's own \
                statuses, any path answers 405 `method_not_allowed` for a method it lacks and \
                414 `uri_too_long` for a target over 8 KiB. Lists page with `limit` and \
                `cursor`. Prose reference: docs/api.md.",
        },
        "servers": [{ "url": "/" }],
        "tags": tags.iter().map(|t| json!({ "name": t })).collect::<Vec<_>>(),
        "paths": paths,
        "components": {
            "securitySchemes": {
                "apiKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "`Authorization: Bearer dly_<keyid>_<secret>`",
                },
            },
            "responses": {
                "Error": {
                    "description": "An error with a stable code.",
                    "content": { "application/json": { "schema": reference("Error") } },
                },
            },
            "schemas": components,
        },
    })
}

/// The bounds the document states for a number of a request body.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct StatedBounds {
    pub(crate) minimum: Option<String>,
    pub(crate) maximum: Option<String>,
}

/// The `minimum` and `maximum` the document states for the number at `path` of a body read
/// as the Rust type `type_name` (`std::any::type_name`): what a refusal of a number beyond
/// its type's range quotes, so it states the same bound as the field's own check. Nothing
/// when the type is no component or the field has no stated bound.
pub(crate) fn number_bounds(type_name: &str, path: &serde_path_to_error::Path) -> StatedBounds {
    let Some(component) = components::component_of(type_name) else {
        return StatedBounds::default();
    };
    let schemas = &document()["components"]["schemas"];
    let steps: Vec<&serde_path_to_error::Segment> = path.iter().collect();
    let mut found = StatedBounds::default();
    if let Some(schema) = schemas.get(component) {
        bounds_in(schemas, schema, &steps, 0, &mut found);
    }
    found
}

/// Walks `schema` along `steps` (through references and `anyOf`/`oneOf`/`allOf` branches)
/// and takes the bounds of the first schema at its end that states any.
fn bounds_in(
    schemas: &Value,
    schema: &Value,
    steps: &[&serde_path_to_error::Segment],
    depth: usize,
    found: &mut StatedBounds,
) -> bool {
    use serde_path_to_error::Segment;
    if depth > 32 {
        return false;
    }
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        let name = r.trim_start_matches("#/components/schemas/");
        return schemas
            .get(name)
            .is_some_and(|s| bounds_in(schemas, s, steps, depth + 1, found));
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        for branch in schema
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if bounds_in(schemas, branch, steps, depth + 1, found) {
                return true;
            }
        }
    }
    let Some((step, rest)) = steps.split_first() else {
        let number = |k: &str| {
            schema
                .get(k)
                .filter(|v| v.is_number())
                .map(Value::to_string)
        };
        *found = StatedBounds {
            minimum: number("minimum"),
            maximum: number("maximum"),
        };
        return found.minimum.is_some() || found.maximum.is_some();
    };
    let next = match step {
        Segment::Map { key } => schema
            .get("properties")
            .and_then(|p| p.get(key.as_str()))
            .or_else(|| schema.get("additionalProperties").filter(|a| a.is_object())),
        Segment::Seq { .. } => schema.get("items"),
        Segment::Enum { .. } | Segment::Unknown => None,
    };
    next.is_some_and(|s| bounds_in(schemas, s, rest, depth + 1, found))
}

/// The wire name of a serializable value (a status, a scope, a strategy).
pub(super) fn wire<T: Serialize>(value: T) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

fn access_text(access: Access) -> String {
    match access {
        Access::Public => "none".to_owned(),
        Access::Scope(s) => format!("scope {}", wire(s).as_str().unwrap_or_default()),
        Access::EitherScope(a, b) => format!(
            "scope {} or {}",
            wire(a).as_str().unwrap_or_default(),
            wire(b).as_str().unwrap_or_default()
        ),
        Access::OwnOrgOrAdmin => "an admin key, or a key of the organization concerned".to_owned(),
        Access::Admin => "scope admin".to_owned(),
    }
}

/// The error statuses an operation can answer: those of every authenticated route, of every
/// route that names a thing or takes input, and its own.
fn error_statuses(op: &Op) -> Vec<u16> {
    let mut out = vec![500];
    if op.access != Access::Public {
        // 503: the database cannot be reached (with `Retry-After`).
        out.extend([401, 403, 429, 503]);
    }
    if op.path.contains('{') {
        // 400: a path segment that is not UTF-8; 404: no such thing (or another tenant's).
        out.extend([400, 404]);
    }
    if !matches!(op.body, Body::None) || !op.query.is_empty() {
        out.push(400);
    }
    if !matches!(op.body, Body::None) {
        // 408: the body did not arrive within the body read timeout.
        out.extend([408, 413]);
    }
    if op.idempotent {
        // The key reused with another body, or while its first request runs.
        out.push(409);
    }
    out.extend(op.errors);
    out.sort_unstable();
    out.dedup();
    out
}

/// The schema of a path parameter: ids by their prefix, names by their alphabet.
fn path_param_schema(path: &str, name: &str) -> Value {
    let collection = path
        .split('/')
        .take_while(|seg| *seg != format!("{{{name}}}"))
        .last()
        .unwrap_or_default();
    let prefix = match collection {
        "sandboxes" => Some(differently_core::SandboxId::PREFIX),
        "snapshots" => Some(differently_core::ids::SnapshotId::PREFIX),
        "orgs" => Some(differently_core::OrgId::PREFIX),
        "projects" => Some(differently_core::ProjectId::PREFIX),
        "keys" => Some(differently_core::KeyId::PREFIX),
        "webhooks" => Some(facts::WEBHOOK_PREFIX),
        "deliveries" => Some(facts::DELIVERY_PREFIX),
        _ => None,
    };
    match (prefix, collection) {
        // A ULID: 26 characters of Crockford base 32 (either case).
        (Some(p), _) => json!({ "type": "string", "pattern": id_pattern(p) }),
        (None, "pools") => json!({ "type": "string", "pattern": "^[a-z0-9][a-z0-9-]{0,62}$" }),
        (None, "secrets") => {
            json!({ "type": "string", "pattern": "^[a-z0-9][a-z0-9._-]{0,62}$" })
        }
        // The control plane's pid: 32 bits, never 0.
        (None, "processes") => json!({ "type": "integer", "minimum": 1, "maximum": u32::MAX }),
        (None, "credentials") => {
            json!({ "type": "string", "pattern": "^evc_[0-9A-Za-z]{26}$" })
        }
        // A public event type: exactly one of the known ones.
        (None, "schemas") => {
            let alternatives: Vec<String> = differently_bus_schema::EventType::ALL
                .iter()
                .map(|t| t.as_str().replace('.', "\\."))
                .collect();
            json!({ "type": "string", "pattern": format!("^(?:{})$", alternatives.join("|")) })
        }
        _ => json!({ "type": "string" }),
    }
}

/// A file path's pattern, first part: no `..` component anywhere.
pub(super) const NO_PARENT: &str = "^(?!.*(?:^|/)\\.\\.(?:/|$))";
/// A file path's pattern, second part for a file's own routes: absolute, and some component
/// is neither empty nor `.` (so not the root, however it is spelled).
pub(super) const BELOW_ROOT: &str = "/(?:.*/)?(?:[^/.]|\\.[^/])";

/// The schema of a query parameter of `op`, with the bounds the handlers enforce.
fn query_schema(op: &Op, name: &str, ty: &str) -> Value {
    let id = |prefix: &str| json!({ "type": "string", "pattern": id_pattern(prefix) });
    match name {
        "limit" => {
            json!({ "type": "integer", "minimum": 1, "maximum": crate::requests::page::MAX_PAGE,
                           "default": crate::requests::page::DEFAULT_PAGE })
        }
        "timeoutSeconds" => json!({ "type": "integer", "minimum": 0, "default": 30,
            "maximum": crate::routes::sandboxes::MAX_WAIT_SECONDS }),
        // Opaque: whatever `nextCursor` said. What it is made of is the server's business and
        // may change; one the server did not issue is a 400 naming `cursor`.
        "cursor" => json!({ "type": "string", "minLength": 1 }),
        "status" if op.id == "listProcesses" => {
            json!({ "type": "string", "enum": ["running", "exited", "failed"] })
        }
        "status" => json!({ "type": "string",
            "enum": differently_core::SandboxStatus::ALL.map(wire) }),
        "from" => json!({ "type": "integer", "minimum": 0, "default": 0 }),
        "follow" => json!({ "type": "boolean", "default": true }),
        "projectId" => id(differently_core::ProjectId::PREFIX),
        "orgId" => id(differently_core::OrgId::PREFIX),
        // Repeatable (`?label=a=1&label=b=2`): every one must match.
        "label" => json!({ "type": "array", "items": { "type": "string", "pattern": "=" } }),
        "since" | "until" => json!({ "type": "string", "format": "date-time" }),
        // Absolute, without a `..` component (`files::validate_path`). Only a listing may
        // name the root: a file read, written or deleted is below it (the root is always a
        // directory: a read or write of it is 409, a delete 422), so at least one component
        // is not `.`.
        "path" if op.id == "listFiles" => {
            json!({ "type": "string", "pattern": format!("{NO_PARENT}/") })
        }
        "path" => json!({ "type": "string", "pattern": format!("{NO_PARENT}{BELOW_ROOT}") }),
        // What `u32::from_str_radix(_, 8)` reads, up to 0o7777.
        "mode" => json!({ "type": "string", "pattern": "^\\+?0*[0-7]{1,4}$" }),
        "depth" => json!({ "type": "integer", "minimum": 1,
            "maximum": crate::routes::files::MAX_DEPTH }),
        "cols" | "rows" => json!({ "type": "integer", "minimum": 1,
            "maximum": differently_adapters::PTY_MAX_SIDE }),
        // Repeated (`form` style, exploded): `command=sh&command=-c&command=…`.
        "command" => json!({ "type": "array", "items": { "type": "string", "minLength": 1 } }),
        "env" => json!({ "type": "array",
            "items": { "type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*=" } }),
        "cwd" => json!({ "type": "string", "pattern": "^/" }),
        "session" => json!({ "type": "string", "pattern": "^pty_" }),
        _ => json!({ "type": ty }),
    }
}

/// The headers of a WebSocket opening handshake (RFC 6455, 4.1), as required parameters: a
/// route answering 101 is an upgrade, not a plain GET, and a request without them is a 400.
fn websocket_headers() -> [Value; 4] {
    [
        json!({ "name": "Connection", "in": "header", "required": true,
            "description": "Must include the `Upgrade` token.",
            "schema": { "type": "string", "pattern": "[Uu][Pp][Gg][Rr][Aa][Dd][Ee]" } }),
        json!({ "name": "Upgrade", "in": "header", "required": true,
            "schema": { "type": "string", "enum": ["websocket"] } }),
        json!({ "name": "Sec-WebSocket-Version", "in": "header", "required": true,
            "schema": { "type": "string", "enum": ["13"] } }),
        json!({ "name": "Sec-WebSocket-Key", "in": "header", "required": true,
            "description": "16 random bytes, base64.",
            "schema": { "type": "string", "pattern": "^[A-Za-z0-9+/]{22}==$" } }),
    ]
}

/// Names of the `{…}` segments of a path.
pub(super) fn path_params(path: &str) -> impl Iterator<Item = &str> {
    path.split('/')
        .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
}

fn operation(op: &Op, components: &Value) -> Value {
    let mut params: Vec<Value> = path_params(op.path)
        .map(|name| {
            json!({ "name": name, "in": "path", "required": true,
                    "schema": path_param_schema(op.path, name) })
        })
        .collect();
    params.extend(op.query.iter().map(|(name, ty, description)| {
        // A file's `path` is required, except for a listing (the root by default).
        let required = *name == "path" && op.id != "listFiles";
        let mut schema = query_schema(op, name, ty);
        components::forbid_nul(&mut schema, false);
        json!({ "name": name, "in": "query", "required": required,
                "description": description, "schema": schema })
    }));
    if op.answers.iter().any(|a| matches!(a, Answer::Upgrade(_))) {
        params.extend(websocket_headers());
    }
    if op.idempotent {
        params.push(json!({
            "name": "Idempotency-Key", "in": "header", "required": false,
            "description": "1-255 characters. A retry by the same API key with the same key \
                and body gets the first answer (header `Idempotent-Replayed: true`; where that \
                answer held a secret shown once, a new API key's or webhook's, 409 naming what \
                was created by `details.id`, its secret not shown again); with another body, \
                or while the first request runs, 409.",
            "schema": { "type": "string", "minLength": 1, "maxLength": 255 },
        }));
    }
    let mut responses = Map::new();
    for answer in op.answers {
        let (status, body) = match *answer {
            Answer::Json(status, schema) => (
                status,
                json!({ "description": schema,
                        "content": { "application/json": { "schema": reference(schema) } } }),
            ),
            Answer::Empty(status) => (status, json!({ "description": "No content." })),
            Answer::Stream(description) => {
                // An event stream is text, not one JSON value: its events are named here
                // with the schema of each event's `data` (`x-events`, as OpenAPI 3.1 has no
                // way to type the items of a stream).
                let events = if op.id == "execStream" || op.id == "processOutput" {
                    json!({ "stdout": { "type": "string" }, "stderr": { "type": "string" },
                            "exit": reference("ExecExit"), "error": reference("StreamError") })
                } else {
                    let mut events = json!({ "status": reference("StatusEvent") });
                    for t in differently_bus_schema::EventType::ALL {
                        events[t.as_str()] = reference("PublicEvent");
                    }
                    events
                };
                let names: Vec<&String> = events
                    .as_object()
                    .map(|e| e.keys().collect())
                    .unwrap_or_default();
                // The schema is of one event as a client's SSE parser reads it (its `event`
                // name and its `data` text), as OpenAPI 3.2's `itemSchema` and Schemathesis
                // read an event stream.
                let mut content = json!({ "text/event-stream": {
                    "schema": { "type": "object", "required": ["data"],
                        "properties": { "event": { "type": "string", "enum": names },
                            "data": { "type": "string" }, "id": { "type": "string" },
                            "retry": { "type": "integer" } },
                        "description": "Server-sent events: `event:`, `id:` and `data:` lines \
                            per event, a blank line between events; `:` lines are keep-alives. \
                            `x-events` gives the schema of each event's `data` (JSON)." },
                    "x-events": events,
                } });
                if op.id == "execStream" {
                    content["application/vnd.differently.exec-stream"] =
                        json!({ "schema": { "type": "string", "format": "binary" } });
                }
                (
                    200,
                    json!({ "description": description, "content": content }),
                )
            }
            Answer::Bytes => {
                let content = json!({ "application/octet-stream":
                    { "schema": { "type": "string", "format": "binary" } } });
                responses.insert(
                    "206".to_owned(),
                    json!({ "description": "The requested range.", "content": content.clone() }),
                );
                (
                    200,
                    json!({ "description": "The file.", "content": content }),
                )
            }
            Answer::Upgrade(description) => (101, json!({ "description": description })),
            Answer::JsonLines => (
                200,
                json!({ "description": "One AuditEvent per line.",
                        "content": { "application/x-ndjson": { "schema": { "type": "string" } } } }),
            ),
        };
        responses.insert(status.to_string(), body);
    }
    for status in error_statuses(op) {
        responses.insert(
            status.to_string(),
            json!({ "$ref": "#/components/responses/Error" }),
        );
    }
    let mut o = json!({
        "operationId": op.id,
        "tags": [op.tag],
        "summary": op.summary,
        "x-differently-access": access_text(op.access),
        "responses": responses,
    });
    if !params.is_empty() {
        o["parameters"] = Value::Array(params);
    }
    match op.body {
        Body::None => {}
        Body::Json(schema) => {
            // An empty body is read as `{}`: it may be left out unless the schema needs a
            // field.
            let required = components[schema]["required"]
                .as_array()
                .is_some_and(|r| !r.is_empty());
            o["requestBody"] = json!({ "required": required,
                "content": { "application/json": { "schema": reference(schema) } } });
        }
        Body::Bytes => {
            o["requestBody"] = json!({ "required": true,
                "content": { "application/octet-stream":
                    { "schema": { "type": "string", "format": "binary" } } } });
        }
    }
    o["security"] = if op.access == Access::Public {
        json!([])
    } else {
        json!([{ "apiKey": [] }])
    };
    o
}
