//! Tool errors the MCP layer raises itself (an argument it reads, decodes or requires) carry
//! what `/v1`'s do (docs/mcp.md): the API's envelope with `details.field` and the request's
//! `requestId`, the `/v1` code for the same refusal, and no library's wording. What it
//! refuses is what its schemas say (`tools/list`). And the bounds of what it answers: the
//! largest output a command can make is a result, never an error, and fits the 1 MiB SSE
//! event the SDKs read by default.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use differently_api::mcp::tools::{RESULT_OUTPUT_BYTES, TEXT_OUTPUT_BYTES};
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::support::{api, Answer, Api};

/// `tools/call` of `name` with `arguments` on `/mcp` (no session: answered on its own).
async fn call_tool(api: &Api, name: &str, arguments: Value) -> Answer {
    let key = api.key.clone();
    api.call(
        Method::POST,
        "/mcp",
        Some(&key),
        json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": { "name": name, "arguments": arguments } }),
        &[("accept", "application/json, text/event-stream")],
    )
    .await
}

/// The tool error of answer `a`, checked to be one and to carry the request's id.
fn tool_error(a: &Answer) -> &Value {
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let result = &a.body["result"];
    assert_eq!(result["isError"], true, "{}", a.body);
    let e = &result["structuredContent"]["error"];
    assert_eq!(e["requestId"].as_str(), Some(a.request_id()), "{}", a.body);
    e
}

#[tokio::test]
async fn an_mcp_tool_error_is_the_apis_envelope_with_the_request_id() {
    let api = api().await;
    // A missing argument is what /v1 answers for a missing field.
    for (tool, arguments, field) in [
        ("sandbox_get", json!({}), "sandboxId"),
        (
            "sandbox_extend",
            json!({ "sandboxId": "sbx_x" }),
            "ttlSeconds",
        ),
        ("sandbox_fork", json!({}), "snapshotId"),
        ("process_output", json!({ "sandboxId": "sbx_x" }), "pid"),
    ] {
        let a = call_tool(&api, tool, arguments).await;
        let e = tool_error(&a);
        assert_eq!(e["code"], "invalid_argument", "{tool}: {}", a.body);
        assert_eq!(e["details"]["field"], field, "{tool}: {}", a.body);
        assert_eq!(
            e["message"],
            format!("{field}: required"),
            "{tool}: {}",
            a.body
        );
    }
    // Content that is not base64: named, in the API's words.
    let id = api.sandbox().await;
    let a = call_tool(
        &api,
        "files_write",
        json!({ "sandboxId": id, "path": "/tmp/w.txt", "content": "!!", "encoding": "base64" }),
    )
    .await;
    let e = tool_error(&a);
    assert_eq!(e["code"], "validation_failed", "{}", a.body);
    assert_eq!(e["details"]["field"], "content", "{}", a.body);
    let message = e["message"].as_str().unwrap_or_default();
    assert!(!message.contains("Invalid symbol"), "{}", a.body);
    // An unknown argument, refused by the MCP layer too.
    let a = call_tool(&api, "sandbox_get", json!({ "sandboxId": id, "bogus": 1 })).await;
    let e = tool_error(&a);
    assert_eq!(e["code"], "invalid_argument", "{}", a.body);
    assert_eq!(e["details"]["field"], "bogus", "{}", a.body);
}

/// A message naming a key twice is refused as `/v1` refuses such a body: the tool would
/// act on the last value, a proxy in front of `/mcp` may read the first.
#[tokio::test]
async fn an_mcp_message_naming_a_key_twice_is_refused() {
    let api = api().await;
    let key = api.key.clone();
    let a = api
        .call_raw(
            Method::POST,
            "/mcp",
            Some(&key),
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sandbox_exec",
                "arguments":{"sandboxId":"sbx_x","command":["echo","1"],"command":["echo","2"]}}}"#
                .to_vec(),
            &[
                ("content-type", "application/json"),
                ("accept", "application/json, text/event-stream"),
            ],
        )
        .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.body);
    assert_eq!(a.body["error"]["code"], -32600, "{}", a.body);
    assert_eq!(
        a.body["error"]["message"], "params.arguments.command: duplicate key",
        "{}",
        a.body
    );
    assert_eq!(a.body["error"]["data"]["field"], "params.arguments.command");
}

/// The SDKs' default largest SSE event (the Python SDK's `max_sse_event_size`).
const SSE_EVENT_LIMIT: usize = 1024 * 1024;

/// A command writing 1 MiB (more than `/v1` keeps) of control characters on each stream:
/// 6 bytes of JSON each, 12 MiB of `/v1` answer.
const LOUDEST: &str = "head -c 1300000 /dev/zero | tr '\\0' '\\1'; \
                       head -c 1300000 /dev/zero | tr '\\0' '\\2' >&2";

/// Checks the `sandbox_exec` result `r` of [`LOUDEST`]: the start of each stream, what is
/// left out counted, within the result's bounds.
fn check_loudest(r: &Value) {
    assert_ne!(r["isError"], true, "{}", r["structuredContent"]);
    let s = &r["structuredContent"];
    for (name, byte) in [("stdout", '\u{1}'), ("stderr", '\u{2}')] {
        let kept = s[name].as_str().expect("the stream");
        assert!(kept.chars().all(|c| c == byte), "{name}");
        assert!(!kept.is_empty(), "{name}");
        assert_eq!(s[format!("{name}Truncated")], true, "{name}");
        let omitted = s[format!("{name}OmittedBytes")].as_u64().expect("omitted");
        assert_eq!(
            kept.len() as u64 + omitted,
            1024 * 1024,
            "{name}: what /v1 kept, in the result or counted"
        );
    }
    let output = serde_json::to_string(&s["stdout"]).unwrap().len()
        + serde_json::to_string(&s["stderr"]).unwrap().len();
    assert!(output <= RESULT_OUTPUT_BYTES + 4, "{output}");
    let text = serde_json::to_string(&r["content"][0]["text"]).unwrap();
    assert!(text.len() <= TEXT_OUTPUT_BYTES + 1024, "{}", text.len());
    assert!(
        text.contains("more bytes of stdout left out of this result"),
        "{text:.300}"
    );
}

/// Buffered: `/v1`'s 12 MiB answer is read whole (the cap follows from the limits, not a
/// round 8 MiB under them), and the result is one JSON answer well under 1 MiB.
#[tokio::test]
async fn the_loudest_buffered_exec_is_a_result_that_fits_an_sse_event() {
    let root = tempfile::tempdir().expect("devhost root");
    let api = crate::support::api_with_devhost(root.path()).await;
    let id = api.live_sandbox_on("devhost").await;
    let a = call_tool(
        &api,
        "sandbox_exec",
        json!({ "sandboxId": id, "command": ["sh", "-c", LOUDEST] }),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert!(
        a.body.to_string().len() < SSE_EVENT_LIMIT - 64 * 1024,
        "{}",
        a.body.to_string().len()
    );
    check_loudest(&a.body["result"]);
}

/// Streamed (a progress token, answered as SSE): every event, progress and result, fits the
/// SDKs' default event limit, and the result is the buffered one's.
#[tokio::test]
async fn every_event_of_the_loudest_streamed_exec_fits_the_sse_event_limit() {
    let root = tempfile::tempdir().expect("devhost root");
    let api = crate::support::api_with_devhost(root.path()).await;
    let id = api.live_sandbox_on("devhost").await;
    let message = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": { "name": "sandbox_exec", "_meta": { "progressToken": "p" },
                    "arguments": { "sandboxId": id, "command": ["sh", "-c", LOUDEST] } } });
    let req = Request::builder()
        .method(Method::POST)
        .uri("/mcp")
        .header("authorization", format!("Bearer {}", api.key))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(Body::from(message.to_string()))
        .expect("request");
    let resp = api.router.clone().oneshot(req).await.expect("infallible");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let body = axum::body::to_bytes(resp.into_body(), 64 << 20)
        .await
        .expect("the stream");
    let body = String::from_utf8(body.to_vec()).expect("UTF-8");
    let mut result = None;
    let mut progress = 0;
    for event in body.split("\n\n").filter(|e| !e.is_empty()) {
        // The event's size as the Python SDK counts it: its lines, without the newlines.
        let size: usize = event.lines().map(str::len).sum();
        assert!(size <= SSE_EVENT_LIMIT, "an event of {size} bytes");
        let data = event
            .lines()
            .find_map(|l| l.strip_prefix("data: "))
            .expect("data");
        let m: Value = serde_json::from_str(data).expect("JSON");
        if m["method"] == "notifications/progress" {
            progress += 1;
        } else {
            result = Some(m["result"].clone());
        }
    }
    assert!(progress > 0, "no progress");
    check_loudest(&result.expect("the result"));
}

/// The arguments a tool's required fields get in [`every_tool_schema_agrees_with_the_tool`]
/// (the sandbox `id` exists, the rest need not).
fn required_args(tool: &Value, id: &str) -> serde_json::Map<String, Value> {
    let mut args = serde_json::Map::new();
    for r in tool["inputSchema"]["required"]
        .as_array()
        .expect("required")
    {
        let name = r.as_str().expect("a name");
        let v = match name {
            "sandboxId" => json!(id),
            "command" => json!(["true"]),
            "path" => json!("/tmp"),
            "content" => json!("x"),
            "pid" => json!(1),
            "signal" => json!("TERM"),
            "port" => json!(8080),
            "ttlSeconds" => json!(60),
            "snapshotId" => json!("snp_01m99aaaaaaaaaaaaaaaaaaaaa"),
            other => panic!("no value for required {other}"),
        };
        args.insert(name.to_owned(), v);
    }
    if tool["inputSchema"]["properties"]
        .get("waitSeconds")
        .is_some()
    {
        args.insert("waitSeconds".to_owned(), json!(1));
    }
    args
}

/// The field a tool error names, if the answer is one.
fn refused_field(a: &Answer) -> Option<String> {
    let r = &a.body["result"];
    if r["isError"] != true {
        return None;
    }
    let e = &r["structuredContent"]["error"];
    Some(
        e["details"]["field"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

/// What `tools/list` says each tool takes is what it takes (an exploratory test validated
/// arguments against the schemas with `jsonschema`, and the server disagreed): an argument
/// outside the schema is refused, and for each argument's bounds (integer range, string
/// length, enum) the value just beyond is refused naming it, and the value at the bound is
/// not, nor a large number where no maximum is stated (the tools that create and wait are
/// checked beyond the bound only). That the body tools take every field of their bodies is
/// `mcp::tools::schemas`'s unit test.
#[tokio::test]
async fn every_tool_schema_agrees_with_the_tool() {
    let api = api().await;
    let id = api.live_sandbox().await;
    let key = api.key.clone();
    let listed = api
        .call(
            Method::POST,
            "/mcp",
            Some(&key),
            json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/list" }),
            &[("accept", "application/json, text/event-stream")],
        )
        .await;
    let tools = listed.body["result"]["tools"]
        .as_array()
        .expect("tools")
        .clone();
    assert_eq!(tools.len(), 18);
    let mut checked = 0;
    for tool in &tools {
        let name = tool["name"].as_str().expect("name");
        let base = required_args(tool, &id);
        let with = |arg: &str, v: Value| {
            let mut a = base.clone();
            a.insert(arg.to_owned(), v);
            Value::Object(a)
        };
        let a = call_tool(&api, name, with("bogus", json!(1))).await;
        assert_eq!(
            refused_field(&a).as_deref(),
            Some("bogus"),
            "{name}: {}",
            a.body
        );
        let waits = matches!(name, "sandbox_create" | "sandbox_fork" | "snapshot_create");
        for (arg, s) in tool["inputSchema"]["properties"]
            .as_object()
            .expect("props")
        {
            let mut beyond = Vec::new();
            let mut at = Vec::new();
            if let Some(max) = s["maximum"].as_i64() {
                beyond.push(json!(max + 1));
                at.push(json!(max));
            }
            if let Some(min) = s["minimum"].as_i64() {
                beyond.push(json!(min - 1));
                at.push(json!(min));
            }
            if s["type"] == "integer" && s.get("maximum").is_none() {
                // No bound stated: the server states none either.
                at.push(json!(1u64 << 53));
            }
            if let Some(max) = s["maxLength"].as_u64() {
                beyond.push(json!("x".repeat(max as usize + 1)));
                at.push(json!("x".repeat(max as usize)));
            }
            if let Some(min) = s["minLength"].as_u64().filter(|m| *m > 0) {
                beyond.push(json!("x".repeat(min as usize - 1)));
            }
            if let Some(values) = s["enum"].as_array() {
                beyond.push(json!("not-one-of-them"));
                at.push(values[0].clone());
            }
            for v in beyond {
                let a = call_tool(&api, name, with(arg, v.clone())).await;
                assert_eq!(
                    refused_field(&a).as_deref(),
                    Some(arg.as_str()),
                    "{name}: {arg} = {v:.40} is beyond the schema's bound: {}",
                    a.body
                );
                checked += 1;
            }
            // At the bound: accepted (an error, if any, is about something else).
            if waits || arg == "waitSeconds" {
                continue;
            }
            for v in at {
                let a = call_tool(&api, name, with(arg, v.clone())).await;
                assert_ne!(
                    refused_field(&a).as_deref(),
                    Some(arg.as_str()),
                    "{name}: {arg} = {v:.40} is within the schema: {}",
                    a.body
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 60, "{checked}");
}

/// A result carrying a file or a process's output carries it once: whole in
/// `structuredContent`, and in the text rendering (for clients without structured content)
/// as text up to `TEXT_OUTPUT_BYTES` with a line saying where the rest is — never the whole
/// file or output a second time, nor the structured content serialized again.
#[tokio::test]
async fn a_file_or_output_is_in_a_result_once() {
    let root = tempfile::tempdir().expect("devhost root");
    let api = crate::support::api_with_devhost(root.path()).await;
    let id = api.live_sandbox_on("devhost").await;
    let big = 200 * 1024;
    let ok = |a: &Answer| {
        assert_eq!(a.status, StatusCode::OK, "{}", a.body);
        assert_ne!(a.body["result"]["isError"], true, "{}", a.body);
        a.body["result"].clone()
    };
    let text_of = |r: &Value| r["content"][0]["text"].as_str().expect("text").to_owned();

    // A large file: whole in the structured content, an excerpt in the text.
    let content = "a".repeat(big);
    ok(&call_tool(
        &api,
        "files_write",
        json!({ "sandboxId": id, "path": "/tmp/big.txt", "content": content }),
    )
    .await);
    let a = call_tool(
        &api,
        "files_read",
        json!({ "sandboxId": id, "path": "/tmp/big.txt" }),
    )
    .await;
    let r = ok(&a);
    assert_eq!(
        r["structuredContent"]["content"].as_str().map(str::len),
        Some(big)
    );
    let text = text_of(&r);
    assert!(text.len() <= TEXT_OUTPUT_BYTES + 1024, "{}", text.len());
    assert!(
        text.ends_with(&format!(
            "[… {} more bytes in structuredContent.content]",
            big - TEXT_OUTPUT_BYTES
        )),
        "{:.200}",
        &text[text.len() - 200..]
    );
    let whole = a.body.to_string().len();
    assert!(whole < big + TEXT_OUTPUT_BYTES + 4096, "{whole} bytes");

    // A small one: the text is what was read, then the file itself, once.
    let small = "hello\n\"quoted\"\n";
    ok(&call_tool(
        &api,
        "files_write",
        json!({ "sandboxId": id, "path": "/tmp/small.txt", "content": small }),
    )
    .await);
    let r = ok(&call_tool(
        &api,
        "files_read",
        json!({ "sandboxId": id, "path": "/tmp/small.txt" }),
    )
    .await);
    assert_eq!(r["structuredContent"]["content"], small);
    assert_eq!(
        text_of(&r),
        format!(
            "/tmp/small.txt: {} bytes of text\n--- /tmp/small.txt ---\n{small}",
            small.len()
        )
    );

    // A process's output: the same, with how it stands and where to read on.
    let started = ok(&call_tool(
        &api,
        "process_start",
        json!({ "sandboxId": id, "command": ["sh", "-c", format!("head -c {big} /dev/zero | tr '\\0' b; echo '\"e\"' >&2")] }),
    )
    .await);
    let pid = started["structuredContent"]["pid"].as_u64().expect("pid");
    let mut ended = None;
    for _ in 0..200 {
        let a = call_tool(
            &api,
            "process_output",
            json!({ "sandboxId": id, "pid": pid }),
        )
        .await;
        let r = ok(&a);
        if r["structuredContent"]["status"] == "exited" {
            ended = Some((a.body.to_string().len(), r));
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let (whole, r) = ended.expect("the process ends");
    let s = &r["structuredContent"];
    assert_eq!(s["stdout"].as_str().map(str::len), Some(big), "{s:.200}");
    assert_eq!(s["stderr"], "\"e\"\n");
    let text = text_of(&r);
    assert!(
        text.starts_with(&format!(
            "process {pid} exited, exit code 0; output from byte 0 to {} (pass from: {} to read on)\n--- stdout ---\nbbb",
            s["next"], s["next"]
        )),
        "{text:.300}"
    );
    assert!(text.len() <= TEXT_OUTPUT_BYTES + 1024, "{}", text.len());
    assert!(text.contains("more bytes in structuredContent.stdout]"));
    assert!(
        text.ends_with("--- stderr ---\n\"e\"\n"),
        "{}",
        &text[text.len() - 100..]
    );
    assert!(whole < big + TEXT_OUTPUT_BYTES + 4096, "{whole} bytes");
}
