//! The background-process tools (docs/processes.md): an agent starts a server or a long build,
//! goes on with other calls, and comes back for its output, feeds it input or stops it. Each
//! is the `/v1` processes call it names; the output is read without waiting (`follow=false`)
//! from an offset the previous read returned, so an agent polls instead of holding a call open.

use axum::http::{header, HeaderValue, Method};
use futures::StreamExt;
use serde_json::{json, Map, Value};

use super::args::{enc, opt_int, opt_string, sandbox_id, string};
use super::exec_tool::Kept;
use super::output;
use super::schemas::{body_fields, v1, Source};
use super::{call_streamed, get_json, ok, ToolError, ToolResult, MAX_OUTPUT_BYTES};
use crate::mcp::v1::{V1Request, V1};
use crate::routes::exec::frames::{FrameDecoder, FrameType, MEDIA_TYPE};

/// The `pid` argument: a positive 32-bit number.
fn pid(args: &Map<String, Value>) -> Result<u32, ToolError> {
    match opt_int(args, "pid")? {
        Some(p) => u32::try_from(p).ok().filter(|p| *p != 0).ok_or_else(|| {
            ToolError::field("validation_failed", "pid", "pid must be 1–4294967295")
        }),
        None => Err(super::args::missing("pid")),
    }
}

/// Runs process tool `name`; `None` when it is not one.
pub(super) async fn call(
    v1: &dyn V1,
    name: &str,
    mut args: Map<String, Value>,
) -> Option<ToolResult> {
    let result = match name {
        "process_start" => start(v1, &mut args).await,
        "process_list" => list(v1, &args).await,
        "process_output" => output(v1, &args).await,
        "process_stdin" => stdin(v1, &args).await,
        "process_signal" => signal(v1, &args).await,
        _ => return None,
    };
    Some(result)
}

/// `process_start`: the arguments but `sandboxId` are the `/v1` body, validated by `/v1`.
async fn start(v1: &dyn V1, args: &mut Map<String, Value>) -> ToolResult {
    let id = sandbox_id(args)?;
    args.remove("sandboxId");
    let body = Value::Object(std::mem::take(args));
    let req = V1Request::json(Method::POST, format!("/v1/sandboxes/{id}/processes"), &body);
    ok(get_json(v1, req).await?)
}

async fn list(v1: &dyn V1, args: &Map<String, Value>) -> ToolResult {
    let id = sandbox_id(args)?;
    let q = match opt_string(args, "status")? {
        Some(s) => format!("?status={}", enc(s)),
        None => String::new(),
    };
    let req = V1Request::new(Method::GET, format!("/v1/sandboxes/{id}/processes{q}"));
    ok(get_json(v1, req).await?)
}

/// `process_output`: the output kept since `from` (as text), the offset to read from next,
/// and how the process stands (its exit code once it ended).
async fn output(v1: &dyn V1, args: &Map<String, Value>) -> ToolResult {
    let id = sandbox_id(args)?;
    let pid = pid(args)?;
    let from = opt_int(args, "from")?.unwrap_or(0);
    let path = format!("/v1/sandboxes/{id}/processes/{pid}/output?from={from}&follow=false");
    let req = V1Request::new(Method::GET, path)
        .header(header::ACCEPT, HeaderValue::from_static(MEDIA_TYPE));
    let mut body = call_streamed(v1, req).await?.body;
    let mut dec = FrameDecoder::default();
    let (mut out, mut err) = (Kept::default(), Kept::default());
    let mut next = from;
    let mut error = None;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(ToolError::transport)?;
        let frames = dec
            .push(&chunk)
            .map_err(|e| ToolError::new("internal", format!("process output: {e}")))?;
        for f in frames {
            match f.kind {
                FrameType::Stdout | FrameType::Stderr => {
                    if out.len() + err.len() >= MAX_OUTPUT_BYTES {
                        // Read again from `next` for the rest.
                        break;
                    }
                    next += f.payload.len() as u64;
                    if f.kind == FrameType::Stdout {
                        out.push(&f.payload);
                    } else {
                        err.push(&f.payload);
                    }
                }
                FrameType::Error => {
                    error = serde_json::from_slice::<Value>(&f.payload).ok();
                }
                FrameType::Exit | FrameType::Heartbeat => {}
            }
        }
    }
    if let Some(e) = error {
        return Err(ToolError::new(
            e["code"].as_str().unwrap_or("internal"),
            e["message"].as_str().unwrap_or("the process failed"),
        ));
    }
    let process = get_json(
        v1,
        V1Request::new(Method::GET, format!("/v1/sandboxes/{id}/processes/{pid}")),
    )
    .await?;
    let structured = json!({
        "stdout": out.render(false),
        "stderr": err.render(false),
        "next": next,
        "status": process["status"],
        "exitCode": process["exitCode"],
        "outputDropped": process["outputDropped"],
    });
    Ok(json!({
        "content": [{ "type": "text", "text": output_text(pid, from, &structured) }],
        "structuredContent": structured,
    }))
}

/// `process_output`'s text rendering: how the process stands and where to read on, then the
/// output as text (not as JSON, whose escapes would repeat it longer), up to
/// [`super::TEXT_OUTPUT_BYTES`] as `sandbox_exec`'s.
fn output_text(pid: u32, from: u64, s: &Value) -> String {
    let mut text = format!(
        "process {pid} {}",
        s["status"].as_str().unwrap_or("unknown")
    );
    if !s["exitCode"].is_null() {
        text.push_str(&format!(", exit code {}", s["exitCode"]));
    }
    text.push_str(&format!(
        "; output from byte {from} to {} (pass from: {} to read on)",
        s["next"], s["next"]
    ));
    if s["outputDropped"].as_u64().is_some_and(|d| d > 0) {
        text.push_str(&format!(
            "; {} older bytes were dropped",
            s["outputDropped"]
        ));
    }
    let streams = ["stdout", "stderr"].map(|name| output::Excerpt {
        field: name,
        heading: name.to_owned(),
        all: s[name].as_str().unwrap_or_default(),
        omitted: 0,
    });
    output::excerpts(&mut text, &streams, false);
    text
}

/// `process_stdin`: writes `data` (if any), then closes stdin when `close` is true.
async fn stdin(v1: &dyn V1, args: &Map<String, Value>) -> ToolResult {
    let id = sandbox_id(args)?;
    let pid = pid(args)?;
    let data = opt_string(args, "data")?;
    let close = match args.get("close") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(ToolError::field(
                "invalid_argument",
                "close",
                "close must be a boolean",
            ))
        }
    };
    if data.is_none() && !close {
        return Err(ToolError::field(
            "validation_failed",
            "data",
            "give data, close: true, or both",
        ));
    }
    let path = format!("/v1/sandboxes/{id}/processes/{pid}/stdin");
    if let Some(data) = data {
        let req = V1Request {
            method: Method::POST,
            path: path.clone(),
            headers: vec![(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            )],
            body: axum::body::Bytes::from(data.to_owned()),
        };
        get_json(v1, req).await?;
    }
    if close {
        get_json(v1, V1Request::new(Method::DELETE, path)).await?;
    }
    ok(json!({ "written": data.map_or(0, str::len), "closed": close }))
}

async fn signal(v1: &dyn V1, args: &Map<String, Value>) -> ToolResult {
    let id = sandbox_id(args)?;
    let pid = pid(args)?;
    let signal = string(args, "signal")?;
    let body = json!({ "signal": signal });
    let req = V1Request::json(
        Method::POST,
        format!("/v1/sandboxes/{id}/processes/{pid}/signal"),
        &body,
    );
    get_json(v1, req).await?;
    ok(json!({ "pid": pid, "signal": signal }))
}

/// The process tools' entries of the tool list (arguments passed to `/v1` take their schema
/// from its document, as in `schemas`).
pub(super) fn schemas(sandbox_id: &Value) -> Vec<Value> {
    let obj = |props: Value, required: &[&str]| json!({ "type": "object", "properties": props, "required": required, "additionalProperties": false });
    let mut start_props = body_fields(
        "StartProcess",
        &[],
        &json!({
            "command": "Program and arguments (argv).",
            "env": "Variables over the sandbox's own.",
            "cwd": "Absolute working directory.",
            "timeoutSeconds": "Killed (exit 124) after this long; default: runs until it exits or is stopped.",
            "stdin": "Keep stdin open for process_stdin (the pool must offer exec.stdin).",
            "tag": "A label to find it by in process_list.",
            "pty": "Run it on a terminal of this size (the pool must offer exec.pty).",
        }),
    );
    start_props["sandboxId"] = sandbox_id.clone();
    let query = |path, param, description| {
        v1(
            Source::Query {
                method: "get",
                path,
                param,
            },
            description,
        )
    };
    let pid = json!({ "type": "integer", "minimum": 1, "maximum": 4294967295u64, "description": "The process's pid, as process_start returned it." });
    vec![
        json!({
            "name": "process_start",
            "title": "Start a background process",
            "description": "Starts a command in the background (a server, a long build) and returns at once with its pid; read its output with process_output, feed it with process_stdin, stop it with process_signal. Needs sandboxes:exec.",
            "inputSchema": obj(start_props, &["sandboxId", "command"]),
            "annotations": { "destructiveHint": false, "openWorldHint": false },
        }),
        json!({
            "name": "process_list",
            "title": "List background processes",
            "description": "Lists the sandbox's background processes, running and recently ended. Needs sandboxes:read or sandboxes:exec.",
            "inputSchema": obj(json!({
                "sandboxId": sandbox_id,
                "status": query("/v1/sandboxes/{id}/processes", "status", None),
            }), &["sandboxId"]),
            "annotations": { "readOnlyHint": true },
        }),
        json!({
            "name": "process_output",
            "title": "Read a background process's output",
            "description": "Returns the output written since byte offset `from` (default 0) without waiting, `next` (the offset to pass next time), and the process's status and exit code. Needs sandboxes:exec.",
            "inputSchema": obj(json!({
                "sandboxId": sandbox_id,
                "pid": pid,
                "from": query(
                    "/v1/sandboxes/{id}/processes/{pid}/output",
                    "from",
                    Some("Byte offset to read from: `next` of the previous read (default 0)."),
                ),
            }), &["sandboxId", "pid"]),
            "annotations": { "readOnlyHint": true },
        }),
        json!({
            "name": "process_stdin",
            "title": "Write to a background process's stdin",
            "description": "Writes `data` to the process's stdin and/or closes it (`close: true`). The process must have been started with stdin: true. Needs sandboxes:exec.",
            "inputSchema": obj(json!({
                "sandboxId": sandbox_id,
                "pid": pid,
                "data": { "type": "string", "description": "Text to write." },
                "close": { "type": "boolean", "description": "Close stdin (after writing data)." },
            }), &["sandboxId", "pid"]),
            "annotations": { "destructiveHint": false, "openWorldHint": false },
        }),
        json!({
            "name": "process_signal",
            "title": "Signal a background process",
            "description": "Sends INT, TERM, KILL or HUP to the process (KILL stops it for sure). Needs sandboxes:exec.",
            "inputSchema": obj(json!({
                "sandboxId": sandbox_id,
                "pid": pid,
                "signal": v1(Source::Body { component: "SignalProcess", field: "signal" }, Some("The signal to send.")),
            }), &["sandboxId", "pid", "signal"]),
            "annotations": { "destructiveHint": true, "openWorldHint": false },
        }),
    ]
}
