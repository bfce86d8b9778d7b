//! The tool list: each tool's name, description, input schema and hints, apart from what the
//! tools do (`super`), so the contract an MCP client sees reads in one place.
//!
//! An argument the tool passes to `/v1` (a body field, a query parameter) takes its schema
//! from `/v1`'s OpenAPI document, the one the server is tested against, so bounds, enums and
//! patterns are exactly what the server accepts; a body tool (`sandbox_create`,
//! `sandbox_fork`, `sandbox_exec`, `process_start`) takes every field of its body. The
//! document's schemas are put in the form agent hosts read: references inlined, and `null`
//! left out of types and enums (a null argument is the same as leaving it out), so each
//! argument has one `type` (the MCP Inspector converts `--tool-arg` values by it). The
//! descriptions are written here for agents. Every tool refuses an argument its schema does
//! not name (`super::call`).

use std::sync::OnceLock;

use serde_json::{json, Map, Value};

use super::MAX_WAIT_SECONDS;

/// Where an argument's schema is in `/v1`'s document.
#[derive(Debug, Clone, Copy)]
pub(super) enum Source<'a> {
    /// Field `field` of the body schema `component`.
    Body { component: &'a str, field: &'a str },
    /// Query parameter `param` of the operation `method path`.
    Query {
        method: &'a str,
        path: &'a str,
        param: &'a str,
    },
}

/// The schema of `source` from `/v1`'s document (`{}` if it is not there: the tests say so),
/// with `description` over the document's when given.
pub(super) fn v1(source: Source<'_>, description: Option<&str>) -> Value {
    let doc = crate::openapi::document();
    let schemas = &doc["components"]["schemas"];
    let (found, doc_description) = match source {
        Source::Body { component, field } => (schemas[component]["properties"].get(field), None),
        Source::Query {
            method,
            path,
            param,
        } => {
            let p = doc["paths"][path][method]["parameters"]
                .as_array()
                .and_then(|ps| ps.iter().find(|p| p["name"] == param && p["in"] == "query"));
            (
                p.map(|p| &p["schema"]),
                p.and_then(|p| p.get("description")),
            )
        }
    };
    let mut schema = found.map_or_else(|| json!({}), |s| plain(s, schemas, 0));
    match (description, doc_description) {
        (Some(d), _) => schema["description"] = json!(d),
        (None, Some(d)) if schema.get("description").is_none() => schema["description"] = d.clone(),
        _ => {}
    }
    schema
}

/// Every field of body schema `component` but those in `leave_out`, each with its
/// description from `described` when it has one there.
pub(super) fn body_fields(component: &str, leave_out: &[&str], described: &Value) -> Value {
    let doc = crate::openapi::document();
    let mut props = Map::new();
    if let Some(fields) = doc["components"]["schemas"][component]["properties"].as_object() {
        for name in fields.keys().filter(|n| !leave_out.contains(&n.as_str())) {
            let field = name.as_str();
            let schema = v1(Source::Body { component, field }, described[name].as_str());
            props.insert(name.clone(), schema);
        }
    }
    Value::Object(props)
}

/// `schema` as agent hosts read it: `$ref`s inlined, a `null` branch of `anyOf`/`oneOf`
/// dropped (its other branch taken), `null` left out of `type` and `enum`.
fn plain(schema: &Value, schemas: &Value, depth: usize) -> Value {
    let Value::Object(m) = schema else {
        return schema.clone();
    };
    if depth > 32 {
        return schema.clone();
    }
    let mut out = Map::new();
    if let Some(r) = m.get("$ref").and_then(Value::as_str) {
        let name = r.rsplit('/').next().unwrap_or_default();
        if let Value::Object(target) = plain(&schemas[name], schemas, depth + 1) {
            out = target;
        }
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(branches)) = m.get(key) {
            let kept: Vec<&Value> = branches.iter().filter(|b| b["type"] != "null").collect();
            if kept.len() == 1 && kept.len() < branches.len() {
                if let Value::Object(inner) = plain(kept[0], schemas, depth + 1) {
                    out.extend(inner);
                }
            }
        }
    }
    for (k, v) in m {
        let v = match k.as_str() {
            "$ref" => continue,
            "anyOf" | "oneOf" if !out.is_empty() => continue,
            "type" => match v {
                Value::Array(types) => {
                    let types: Vec<Value> =
                        types.iter().filter(|t| *t != "null").cloned().collect();
                    match <[Value; 1]>::try_from(types) {
                        Ok([one]) => one,
                        Err(many) => Value::Array(many),
                    }
                }
                other => other.clone(),
            },
            "enum" => Value::Array(
                v.as_array()
                    .map(|e| e.iter().filter(|x| !x.is_null()).cloned().collect())
                    .unwrap_or_default(),
            ),
            "properties" | "patternProperties" => Value::Object(
                v.as_object()
                    .map(|ps| {
                        ps.iter()
                            .map(|(n, s)| (n.clone(), plain(s, schemas, depth + 1)))
                            .collect()
                    })
                    .unwrap_or_default(),
            ),
            "required" | "default" | "examples" | "example" | "const" | "pattern" => v.clone(),
            _ => match v {
                Value::Array(items) => {
                    Value::Array(items.iter().map(|s| plain(s, schemas, depth + 1)).collect())
                }
                other => plain(other, schemas, depth + 1),
            },
        };
        out.insert(k.clone(), v);
    }
    Value::Object(out)
}

/// The tool list, with input schemas (built once: the document it reads does not change).
pub fn list() -> Value {
    tools().clone()
}

/// [`list`], borrowed.
pub(super) fn tools() -> &'static Value {
    static TOOLS: OnceLock<Value> = OnceLock::new();
    TOOLS.get_or_init(build)
}

fn build() -> Value {
    let sandbox_id = json!({ "type": "string", "description": "The sandbox's id (sbx_…)." });
    let create_described = json!({
        "template": "The template or container image to start (e.g. python:3.12).",
        "resources": "CPU cores, memory and disk; omitted fields take the installation's defaults.",
        "profile": "A named resource size instead of resources.",
        "env": "Environment variables of every command. Values are sealed at rest and never shown again.",
        "labels": "Labels to find the sandbox by.",
        "ttlSeconds": "Seconds until the sandbox is deleted (extend with sandbox_extend).",
        "idleTimeoutSeconds": "Seconds without activity after which the sandbox is paused or stopped.",
        "projectId": "The project to create in (a key bound to a project uses its own).",
        "capabilities": "What the sandbox's pool must offer.",
        "classification": "How sensitive the sandbox's data is; placement policy may restrict where each may run.",
        "region": "Only pools of this region.",
        "strategy": "How eligible pools are ranked (default: the policy's).",
        "external": "Whether external (third-party) pools may, may not, or must be used.",
        "priority": "Queue priority, higher first.",
    });
    // `fromSnapshot` is sandbox_fork's `snapshotId`.
    let mut create_props =
        body_fields("CreateSandboxRequest", &["fromSnapshot"], &create_described);
    create_props["waitSeconds"] = json!({ "type": "integer", "minimum": 1, "maximum": MAX_WAIT_SECONDS, "description": "How long to wait for the sandbox to run (default 120)." });
    let mut fork_props = create_props.clone();
    fork_props["snapshotId"] =
        json!({ "type": "string", "description": "The ready snapshot to start from (snp_…)." });
    let mut exec_props = body_fields(
        "ExecRequest",
        &[],
        &json!({
            "command": "The program and its arguments, e.g. [\"sh\", \"-c\", \"ls -l\"].",
            "cwd": "Absolute working directory.",
            "env": "Variables over the sandbox's own.",
            "timeoutSeconds": "Killed (exit code 124) after this long.",
            "stdin": "Text given on standard input.",
            "stdinBase64": "Bytes given on standard input, base64.",
            "outputEncoding": "utf8 (default) or base64 for binary output.",
        }),
    );
    exec_props["sandboxId"] = sandbox_id.clone();
    let body =
        |component, field, description| v1(Source::Body { component, field }, Some(description));
    let query = |method, path, param, description: Option<&str>| {
        v1(
            Source::Query {
                method,
                path,
                param,
            },
            description,
        )
    };
    let files = "/v1/sandboxes/{id}/files";
    let listing = "/v1/sandboxes/{id}/files/list";
    let obj = |props: Value, required: &[&str]| json!({ "type": "object", "properties": props, "required": required, "additionalProperties": false });
    let mut tools = json!([
        {
            "name": "sandbox_create",
            "title": "Create a sandbox",
            "description": "Creates a sandbox from a template (image) and waits until it is running; returns the sandbox. Needs sandboxes:write.",
            "inputSchema": obj(create_props, &[]),
            "annotations": { "destructiveHint": false, "openWorldHint": false },
        },
        {
            "name": "sandbox_list",
            "title": "List sandboxes",
            "description": "Lists the sandboxes the key can see, newest first, one page at a time. Needs sandboxes:read.",
            "inputSchema": obj(json!({
                "status": query("get", "/v1/sandboxes", "status", None),
                "labels": { "type": "object", "additionalProperties": { "type": "string" }, "description": "Only sandboxes carrying every one of these labels." },
                "projectId": query("get", "/v1/sandboxes", "projectId", None),
                "limit": query("get", "/v1/sandboxes", "limit", None),
                "cursor": query("get", "/v1/sandboxes", "cursor", Some("nextCursor of the previous page.")),
            }), &[]),
            "annotations": { "readOnlyHint": true },
        },
        {
            "name": "sandbox_get",
            "title": "Get a sandbox",
            "description": "The sandbox: status, template, resources, labels, env names (never values), expiry. Needs sandboxes:read.",
            "inputSchema": obj(json!({ "sandboxId": sandbox_id }), &["sandboxId"]),
            "annotations": { "readOnlyHint": true },
        },
        {
            "name": "sandbox_exec",
            "title": "Run a command",
            "description": "Runs a command (an argv array, no shell unless you run one) in a running sandbox and returns stdout, stderr and exitCode. Each stream keeps 1 MiB (…Truncated beyond); the result carries the first 768 KiB of both as JSON text, …OmittedBytes counting the rest. With a progress token, all output is streamed as progress notifications while it runs. A timeout gives exit code 124. Needs sandboxes:exec.",
            "inputSchema": obj(exec_props, &["sandboxId", "command"]),
            "annotations": { "destructiveHint": true, "openWorldHint": true },
        },
        {
            "name": "files_read",
            "title": "Read a file",
            "description": "Reads a file of the sandbox: text when it is UTF-8, else base64 (or as asked). At most 1 MiB (truncated: true beyond). Needs files:read.",
            "inputSchema": obj(json!({
                "sandboxId": sandbox_id,
                "path": query("get", files, "path", Some("Absolute path.")),
                "encoding": { "type": "string", "enum": ["text", "base64"], "description": "Force an encoding (default: text when valid UTF-8)." },
            }), &["sandboxId", "path"]),
            "annotations": { "readOnlyHint": true },
        },
        {
            "name": "files_write",
            "title": "Write a file",
            "description": "Writes a file of the sandbox (replacing it), from text or base64, at most 1 MiB. Needs files:write.",
            "inputSchema": obj(json!({
                "sandboxId": sandbox_id,
                "path": query("put", files, "path", Some("Absolute path.")),
                "content": { "type": "string", "description": "The file's content, as encoding says." },
                "encoding": { "type": "string", "enum": ["text", "base64"], "description": "How content is given (default text)." },
                "mode": query("put", files, "mode", Some("Octal permissions, e.g. 644.")),
            }), &["sandboxId", "path", "content"]),
            "annotations": { "destructiveHint": true },
        },
        {
            "name": "files_list",
            "title": "List a directory",
            "description": "Lists a directory of the sandbox: path, type, size, mode, modifiedAt. Needs files:read.",
            "inputSchema": obj(json!({
                "sandboxId": sandbox_id,
                "path": query("get", listing, "path", Some("Absolute path of the directory.")),
                "depth": query("get", listing, "depth", Some("How deep to descend (default 1).")),
            }), &["sandboxId", "path"]),
            "annotations": { "readOnlyHint": true },
        },
        {
            "name": "files_mkdir",
            "title": "Make a directory",
            "description": "Makes a directory of the sandbox and its missing parents (mkdir -p; parents 755). Returns path and created: false when a directory was already there (left as it was). A file at the path or among its parents is a conflict. Needs files:write.",
            "inputSchema": obj(json!({
                "sandboxId": sandbox_id,
                "path": body("MakeDirectory", "path", "Absolute path of the directory."),
                "mode": body("MakeDirectory", "mode", "Octal permission bits of the directory when made, 000-777, e.g. 750 (default 755)."),
            }), &["sandboxId", "path"]),
            "annotations": { "destructiveHint": false, "idempotentHint": true },
        },
        {
            "name": "snapshot_create",
            "title": "Snapshot a sandbox",
            "description": "Snapshots a sandbox and waits until the snapshot is ready (or failed); returns the snapshot, whose id sandbox_fork takes. Needs sandboxes:write.",
            "inputSchema": obj(json!({
                "sandboxId": sandbox_id,
                "name": body("SnapshotRequest", "name", "A name for the snapshot."),
                "waitSeconds": { "type": "integer", "minimum": 1, "maximum": MAX_WAIT_SECONDS, "description": "How long to wait for the snapshot to be ready (default 120)." },
            }), &["sandboxId"]),
        },
        {
            "name": "sandbox_fork",
            "title": "Fork a snapshot",
            "description": "Creates a new sandbox from a ready snapshot (in the snapshot's project) and waits until it is running. Takes sandbox_create's arguments too. Needs sandboxes:write.",
            "inputSchema": obj(fork_props, &["snapshotId"]),
        },
        {
            "name": "port_url",
            "title": "Expose a port",
            "description": "A URL reaching a port the sandbox listens on, with its expiry. Needs sandboxes:write.",
            "inputSchema": obj(json!({
                "sandboxId": sandbox_id,
                "port": body("PortRequest", "port", "The port the sandbox listens on."),
                "expiresSeconds": body("PortRequest", "expiresSeconds", "Seconds the URL works for."),
            }), &["sandboxId", "port"]),
        },
        {
            "name": "sandbox_extend",
            "title": "Extend the TTL",
            "description": "Sets the sandbox to expire ttlSeconds from now. Needs sandboxes:write.",
            "inputSchema": obj(json!({
                "sandboxId": sandbox_id,
                "ttlSeconds": body("UpdateSandboxRequest", "ttlSeconds", "Seconds from now until the sandbox is deleted."),
            }), &["sandboxId", "ttlSeconds"]),
        },
        {
            "name": "sandbox_delete",
            "title": "Delete a sandbox",
            "description": "Deletes the sandbox (it becomes terminating, then terminated). Needs sandboxes:write.",
            "inputSchema": obj(json!({ "sandboxId": sandbox_id }), &["sandboxId"]),
            "annotations": { "destructiveHint": true },
        },
    ]);
    if let Value::Array(list) = &mut tools {
        list.extend(super::processes::schemas(&sandbox_id));
    }
    tools
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str) -> &'static Value {
        tools()
            .as_array()
            .and_then(|ts| ts.iter().find(|t| t["name"] == name))
            .unwrap_or_else(|| panic!("no tool {name}"))
    }

    fn names(props: &Value) -> Vec<String> {
        let mut n: Vec<String> = props.as_object().expect("object").keys().cloned().collect();
        n.sort();
        n
    }

    /// No `null` type or enum value, `$ref` or `anyOf` anywhere in `schema`.
    fn check_plain(schema: &Value, at: &str) {
        match schema {
            Value::Object(m) => {
                assert!(!m.contains_key("$ref") && !m.contains_key("anyOf"), "{at}");
                if let Some(t) = m.get("type") {
                    assert!(t.is_string(), "{at}: type {t}");
                    assert_ne!(t, "null", "{at}");
                }
                if let Some(e) = m.get("enum") {
                    assert!(
                        e.as_array().is_some_and(|e| e.iter().all(|v| !v.is_null())),
                        "{at}"
                    );
                }
                for (k, v) in m {
                    check_plain(v, &format!("{at}.{k}"));
                }
            }
            Value::Array(items) => items.iter().for_each(|v| check_plain(v, at)),
            _ => {}
        }
    }

    /// Every argument has one `type` (a failed look-up in the document would leave `{}`),
    /// and the schemas are what hosts read: no `null`, no references left.
    #[test]
    fn every_argument_has_one_type_and_no_null() {
        for t in tools().as_array().expect("tools") {
            let schema = &t["inputSchema"];
            assert_eq!(schema["type"], "object", "{}", t["name"]);
            assert_eq!(schema["additionalProperties"], false, "{}", t["name"]);
            for (arg, s) in schema["properties"].as_object().expect("properties") {
                assert!(s["type"].is_string(), "{}.{arg}: {s}", t["name"]);
                assert!(
                    s["description"].is_string(),
                    "{}.{arg}: no description",
                    t["name"]
                );
            }
            for r in schema["required"].as_array().expect("required") {
                assert!(
                    schema["properties"]
                        .get(r.as_str().unwrap_or_default())
                        .is_some(),
                    "{}: {r}",
                    t["name"]
                );
            }
            check_plain(schema, t["name"].as_str().unwrap_or_default());
        }
    }

    /// A body tool takes every field its `/v1` body takes (bar `fromSnapshot`, which is
    /// sandbox_fork's `snapshotId`), with the document's bounds: a field added to the body
    /// is an argument without another change here.
    #[test]
    fn a_body_tool_takes_every_field_of_its_body() {
        let schemas = &crate::openapi::document()["components"]["schemas"];
        for (tool_name, component, leave_out, own) in [
            (
                "sandbox_create",
                "CreateSandboxRequest",
                &["fromSnapshot"][..],
                &["waitSeconds"][..],
            ),
            (
                "sandbox_fork",
                "CreateSandboxRequest",
                &["fromSnapshot"][..],
                &["snapshotId", "waitSeconds"][..],
            ),
            ("sandbox_exec", "ExecRequest", &[][..], &["sandboxId"][..]),
            ("process_start", "StartProcess", &[][..], &["sandboxId"][..]),
        ] {
            let body = &schemas[component]["properties"];
            let mut want: Vec<String> = names(body)
                .into_iter()
                .filter(|n| !leave_out.contains(&n.as_str()))
                .chain(own.iter().map(|n| n.to_string()))
                .collect();
            want.sort();
            let props = &tool(tool_name)["inputSchema"]["properties"];
            assert_eq!(names(props), want, "{tool_name}");
            for field in names(body)
                .iter()
                .filter(|n| !leave_out.contains(&n.as_str()))
            {
                let mut ours = props[field].clone();
                let mut theirs = plain(&body[field], schemas, 0);
                for s in [&mut ours, &mut theirs] {
                    if let Value::Object(m) = s {
                        m.remove("description");
                    }
                }
                assert_eq!(ours, theirs, "{tool_name}.{field}");
            }
        }
    }

    /// The two disagreements found by an exploratory test, by name.
    #[test]
    fn create_takes_classification_and_strategy_and_a_listing_is_16_deep_at_most() {
        let create = &tool("sandbox_create")["inputSchema"]["properties"];
        assert_eq!(create["classification"]["enum"][1], "internal");
        assert_eq!(create["strategy"]["enum"][1], "cheapest");
        let depth = &tool("files_list")["inputSchema"]["properties"]["depth"];
        assert_eq!(
            (&depth["minimum"], &depth["maximum"]),
            (&json!(1), &json!(16))
        );
    }

    #[test]
    fn plain_inlines_references_and_leaves_null_out() {
        let schemas = json!({ "Size": { "type": "object", "properties": {
            "cols": { "type": ["integer", "null"], "minimum": 1 },
            "type": { "enum": ["a", null], "type": ["string", "null"] } } } });
        let got = plain(
            &json!({ "anyOf": [{ "$ref": "#/components/schemas/Size" }, { "type": "null" }],
                     "description": "d" }),
            &schemas,
            0,
        );
        assert_eq!(
            got,
            json!({ "type": "object", "description": "d", "properties": {
                "cols": { "type": "integer", "minimum": 1 },
                "type": { "enum": ["a"], "type": "string" } } })
        );
    }
}
