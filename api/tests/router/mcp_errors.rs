//! Tool errors the MCP layer raises itself (an argument it reads, decodes or requires) carry
//! what `/v1`'s do (docs/mcp.md): the API's envelope with `details.field` and the request's
//! `requestId`, the `/v1` code for the same refusal, and no library's wording.

use axum::http::{Method, StatusCode};
use serde_json::{json, Value};

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
