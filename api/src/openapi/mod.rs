//! `GET /v1/openapi.json`: the served OpenAPI 3.1 document of `/v1`.
//!
//! Built from the route catalogue below and from the code's own vocabularies (statuses,
//! scopes, strategies, capabilities, error codes), so clients and SDK generators read the
//! API as this binary serves it. Tests keep it honest: every route the router declares is in
//! the catalogue and the other way round, and the schemas of the objects the API serves and
//! accepts are checked against their serde shapes.

mod catalogue;
mod schemas;
#[cfg(test)]
mod tests;

use std::sync::OnceLock;

use axum::http::header;
use axum::response::IntoResponse;
use serde::Serialize;
use serde_json::{json, Map, Value};

use catalogue::{catalogue, Access, Answer, Body, Op};
use schemas::{reference, schemas};
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
    let mut paths = Map::new();
    let mut tags: Vec<&str> = Vec::new();
    for op in catalogue() {
        if !tags.contains(&op.tag) {
            tags.push(op.tag);
        }
        let item = paths
            .entry(op.path.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        item[op.method] = operation(&op);
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Differently",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "One REST API for isolated sandboxes, placed on backends under operator \
                policy. Errors are `{\"error\": {code, message, details}}` with a stable `code`; \
                lists page with `limit` and `cursor`. Prose reference: docs/api.md.",
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
            "schemas": schemas(),
        },
    })
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
        out.extend([401, 403, 429]);
    }
    if op.path.contains('{') {
        out.push(404);
    }
    if matches!(op.body, Body::Json(_)) || !op.query.is_empty() {
        out.push(400);
    }
    if matches!(op.body, Body::Json(_)) {
        out.push(413);
    }
    out.extend(op.errors);
    out.sort_unstable();
    out.dedup();
    out
}

/// Names of the `{…}` segments of a path.
pub(super) fn path_params(path: &str) -> impl Iterator<Item = &str> {
    path.split('/')
        .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
}

fn operation(op: &Op) -> Value {
    let mut params: Vec<Value> = path_params(op.path)
        .map(|name| {
            json!({ "name": name, "in": "path", "required": true, "schema": { "type": "string" } })
        })
        .collect();
    params.extend(op.query.iter().map(|(name, ty, description)| {
        json!({ "name": name, "in": "query", "required": false,
                "description": description, "schema": { "type": ty } })
    }));
    if op.idempotent {
        params.push(json!({
            "name": "Idempotency-Key", "in": "header", "required": false,
            "description": "1-255 characters. A retry by the same API key with the same key \
                and body gets the first answer (header `Idempotent-Replayed: true`; for a new \
                API key, 409 naming the key created, whose secret is not shown again); with \
                another body, or while the first request runs, 409.",
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
                let mut content =
                    json!({ "text/event-stream": { "schema": { "type": "string" } } });
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
            o["requestBody"] = json!({ "required": true,
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
