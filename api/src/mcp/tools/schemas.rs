//! The tool list: each tool's name, description, input schema and hints, apart from what the
//! tools do (`super`), so the contract an MCP client sees reads in one place.

use serde_json::{json, Value};

use super::MAX_WAIT_SECONDS;

/// The tool list, with input schemas.
pub fn list() -> Value {
    let sandbox_id = json!({ "type": "string", "description": "The sandbox's id (sbx_…)." });
    let resources = json!({
        "type": "object",
        "description": "CPU cores, memory and disk; omitted fields take the installation's defaults.",
        "properties": {
            "cpu": { "type": "integer", "minimum": 1, "maximum": 256 },
            "memoryMiB": { "type": "integer", "minimum": 128, "maximum": 1048576 },
            "diskGiB": { "type": "integer", "minimum": 0, "maximum": 16384 },
        },
        "additionalProperties": false,
    });
    let create_props = json!({
        "template": { "type": "string", "description": "The template or container image to start (e.g. python:3.12)." },
        "resources": resources,
        "profile": { "type": "string", "enum": ["small", "medium", "large", "xlarge"], "description": "A named resource size instead of resources." },
        "env": { "type": "object", "additionalProperties": { "type": "string" }, "description": "Environment variables of every command. Values are sealed at rest and never shown again." },
        "labels": { "type": "object", "additionalProperties": { "type": "string" }, "description": "Labels to find the sandbox by." },
        "ttlSeconds": { "type": "integer", "minimum": 1, "maximum": 2592000, "description": "Seconds until the sandbox is deleted (extend with sandbox_extend)." },
        "idleTimeoutSeconds": { "type": "integer", "minimum": 1, "maximum": 2592000 },
        "projectId": { "type": "string", "description": "The project to create in (a key bound to a project uses its own)." },
        "capabilities": { "type": "array", "items": { "type": "string" } },
        "region": { "type": "string" },
        "priority": { "type": "integer", "minimum": -100, "maximum": 100 },
        "waitSeconds": { "type": "integer", "minimum": 1, "maximum": MAX_WAIT_SECONDS, "description": "How long to wait for the sandbox to run (default 120)." },
    });
    let mut fork_props = create_props.clone();
    fork_props["snapshotId"] =
        json!({ "type": "string", "description": "The ready snapshot to start from (snp_…)." });
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
                "status": { "type": "string", "description": "Only sandboxes with this status (queued, provisioning, running, paused, stopped, terminating, terminated, failed)." },
                "labels": { "type": "object", "additionalProperties": { "type": "string" }, "description": "Only sandboxes carrying every one of these labels." },
                "projectId": { "type": "string" },
                "limit": { "type": "integer", "minimum": 1, "maximum": 1000 },
                "cursor": { "type": "string", "description": "nextCursor of the previous page." },
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
            "inputSchema": obj(json!({
                "sandboxId": sandbox_id,
                "command": { "type": "array", "items": { "type": "string" }, "minItems": 1, "description": "The program and its arguments, e.g. [\"sh\", \"-c\", \"ls -l\"]." },
                "cwd": { "type": "string", "description": "Absolute working directory." },
                "env": { "type": "object", "additionalProperties": { "type": "string" }, "description": "Variables over the sandbox's own." },
                "timeoutSeconds": { "type": "integer", "minimum": 1, "maximum": 86400 },
                "stdin": { "type": "string", "description": "Text given on standard input." },
                "stdinBase64": { "type": "string", "description": "Bytes given on standard input, base64." },
                "outputEncoding": { "type": "string", "enum": ["utf8", "base64"] },
            }), &["sandboxId", "command"]),
            "annotations": { "destructiveHint": true, "openWorldHint": true },
        },
        {
            "name": "files_read",
            "title": "Read a file",
            "description": "Reads a file of the sandbox: text when it is UTF-8, else base64 (or as asked). At most 1 MiB (truncated: true beyond). Needs files:read.",
            "inputSchema": obj(json!({
                "sandboxId": sandbox_id,
                "path": { "type": "string", "description": "Absolute path." },
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
                "path": { "type": "string", "description": "Absolute path." },
                "content": { "type": "string" },
                "encoding": { "type": "string", "enum": ["text", "base64"], "description": "How content is given (default text)." },
                "mode": { "type": "string", "pattern": "^[0-7]{3,4}$", "description": "Octal permissions, e.g. 644." },
            }), &["sandboxId", "path", "content"]),
            "annotations": { "destructiveHint": true },
        },
        {
            "name": "files_list",
            "title": "List a directory",
            "description": "Lists a directory of the sandbox: path, type, size, mode, modifiedAt. Needs files:read.",
            "inputSchema": obj(json!({
                "sandboxId": sandbox_id,
                "path": { "type": "string", "description": "Absolute path of the directory." },
                "depth": { "type": "integer", "minimum": 1, "description": "How deep to descend (default 1)." },
            }), &["sandboxId", "path"]),
            "annotations": { "readOnlyHint": true },
        },
        {
            "name": "files_mkdir",
            "title": "Make a directory",
            "description": "Makes a directory of the sandbox and its missing parents (mkdir -p; parents 755). Returns path and created: false when a directory was already there (left as it was). A file at the path or among its parents is a conflict. Needs files:write.",
            "inputSchema": obj(json!({
                "sandboxId": sandbox_id,
                "path": { "type": "string", "description": "Absolute path of the directory." },
                "mode": { "type": "string", "pattern": "^0?[0-7]{3}$", "description": "Octal permission bits of the directory when made, 000-777, e.g. 750 (default 755)." },
            }), &["sandboxId", "path"]),
            "annotations": { "destructiveHint": false, "idempotentHint": true },
        },
        {
            "name": "snapshot_create",
            "title": "Snapshot a sandbox",
            "description": "Snapshots a sandbox and waits until the snapshot is ready (or failed); returns the snapshot, whose id sandbox_fork takes. Needs sandboxes:write.",
            "inputSchema": obj(json!({
                "sandboxId": sandbox_id,
                "name": { "type": "string" },
                "waitSeconds": { "type": "integer", "minimum": 1, "maximum": MAX_WAIT_SECONDS },
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
                "port": { "type": "integer", "minimum": 1, "maximum": 65535 },
                "expiresSeconds": { "type": "integer", "minimum": 1, "maximum": 604800 },
            }), &["sandboxId", "port"]),
        },
        {
            "name": "sandbox_extend",
            "title": "Extend the TTL",
            "description": "Sets the sandbox to expire ttlSeconds from now. Needs sandboxes:write.",
            "inputSchema": obj(json!({
                "sandboxId": sandbox_id,
                "ttlSeconds": { "type": "integer", "minimum": 1, "maximum": 2592000 },
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
