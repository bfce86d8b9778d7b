//! The MCP server as an agent host reaches it: the official MCP Python SDK (PyPI `mcp`, from
//! `DIFFERENTLY_MCP_PYTHON`; scripts/test installs it pinned) drives a real `differently dev`
//! over both transports — Streamable HTTP at `/mcp` and `differently mcp` over stdio —
//! through mcp_client.py, whose JSON report is asserted on here: initialize, tools, create,
//! exec, files, a denied scope, a malformed argument, output over the cap, the loudest output
//! (over 1 MiB of control characters per stream, buffered and streamed through the SDK's
//! default 1 MiB SSE event), a streamed command's progress before its end, a cancelled command that never finishes, resources, a snapshot
//! forked into a running sandbox with its files, a port URL on a pool that exposes ports, and
//! another organization's key reaching nothing of the first's.

use std::path::PathBuf;
use std::process::Command;

use serde_json::{json, Value};

use crate::client_cli_dev::Dev;
use crate::harness::binary;

fn python() -> String {
    let python = std::env::var("DIFFERENTLY_MCP_PYTHON").unwrap_or_else(|_| "python3".into());
    let probe = Command::new(&python)
        .args(["-c", "import mcp.client.streamable_http"])
        .output();
    assert!(
        probe.as_ref().is_ok_and(|o| o.status.success()),
        "{python} cannot import the MCP SDK: install it (pip install mcp==2.3.0) or set \
         DIFFERENTLY_MCP_PYTHON to a Python that has it (scripts/test does)"
    );
    python
}

/// Keys for the script: org A read-only, one of another organization's project with every
/// scope, and one of a third organization whose policy denies the devhost pool, so its
/// sandboxes land on a `fake` pool that exposes ports (devhost under bubblewrap has none).
async fn keys(dev: &Dev) -> (String, String, String) {
    let orgs: Value = reqwest::Client::new()
        .get(format!("{}/v1/orgs", dev.url))
        .bearer_auth(&dev.key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let org_a = orgs["items"][0]["id"].as_str().unwrap().to_owned();
    let read = dev
        .post(
            "/v1/keys",
            json!({ "orgId": org_a, "name": "mcp-read", "scopes": ["sandboxes:read"] }),
        )
        .await;
    let org_b = dev.post("/v1/orgs", json!({ "name": "org-b" })).await;
    let all = [
        "sandboxes:read",
        "sandboxes:write",
        "sandboxes:exec",
        "files:read",
        "files:write",
    ];
    // Bound to a project of its own organization: it sees only that project.
    let prj_b = dev
        .post(
            "/v1/projects",
            json!({ "orgId": org_b["id"], "name": "prj-b" }),
        )
        .await;
    let b = dev.post(
        "/v1/keys",
        json!({ "orgId": org_b["id"], "projectId": prj_b["id"], "name": "mcp-b", "scopes": all }),
    )
    .await;
    dev.post(
        "/v1/admin/pools",
        json!({ "name": "ported", "kind": "fake",
                "settings": { "capabilities": ["ports.expose"] } }),
    )
    .await;
    let org_c = dev.post("/v1/orgs", json!({ "name": "org-c" })).await;
    let org_c_id = org_c["id"].as_str().unwrap();
    let resp = reqwest::Client::new()
        .put(format!("{}/v1/orgs/{org_c_id}/policy", dev.url))
        .bearer_auth(&dev.key)
        .json(&json!({ "deniedPools": ["local"] }))
        .send()
        .await
        .unwrap();
    assert!(
        resp.status().is_success(),
        "org C policy: {}",
        resp.status()
    );
    let prj_c = dev
        .post(
            "/v1/projects",
            json!({ "orgId": org_c_id, "name": "prj-c" }),
        )
        .await;
    let c = dev
        .post(
            "/v1/keys",
            json!({ "orgId": org_c_id, "projectId": prj_c["id"], "name": "mcp-c", "scopes": all }),
        )
        .await;
    (
        read["key"].as_str().unwrap().to_owned(),
        b["key"].as_str().unwrap().to_owned(),
        c["key"].as_str().unwrap().to_owned(),
    )
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/mcp_client.py")
}

async fn run_transport(transport: &str) -> Value {
    let python = python();
    let dev = Dev::start();
    let (read_key, b_key, c_key) = keys(&dev).await;
    let out = tokio::process::Command::new(python)
        .arg(script())
        .arg(transport)
        .env("DIFFERENTLY_URL", &dev.url)
        .env("KEY_A", &dev.key)
        .env("KEY_READ", read_key)
        .env("KEY_B", b_key)
        .env("KEY_C", c_key)
        .env("BIN", binary())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "mcp_client.py {transport} failed:\n{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut report: Value =
        serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap();
    // The audit records the tool calls left on org A's sandbox, as the REST calls leave them.
    let sid = report["sandboxId"].as_str().unwrap_or_default().to_owned();
    let audit: Value = reqwest::Client::new()
        .get(format!("{}/v1/audit?resource={sid}&limit=200", dev.url))
        .bearer_auth(&dev.key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    report["audit"] = audit["items"].clone();
    report
}

fn error_code(outcome: &Value) -> &str {
    assert_eq!(outcome["isError"], true, "not a tool error: {outcome}");
    outcome["structured"]["error"]["code"].as_str().unwrap()
}

fn check(r: &Value, transport: &str) {
    let t = transport;
    assert_eq!(r["serverName"], "differently");
    assert_eq!(r["protocolVersion"], "2025-11-25", "{t}");
    let tools: Vec<&str> = r["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for name in [
        "sandbox_create",
        "sandbox_list",
        "sandbox_get",
        "sandbox_exec",
        "files_read",
        "files_write",
        "files_list",
        "files_mkdir",
        "snapshot_create",
        "sandbox_fork",
        "port_url",
        "sandbox_extend",
        "sandbox_delete",
        "process_start",
        "process_list",
        "process_output",
        "process_stdin",
        "process_signal",
    ] {
        assert!(tools.contains(&name), "{t}: {name} missing from {tools:?}");
    }
    // A background process through the tools: started, read, fed, listed, killed.
    let pid = &r["processStart"]["structured"]["pid"];
    assert!(pid.as_u64().is_some(), "{t}");
    assert_eq!(r["processStart"]["structured"]["status"], "running", "{t}");
    let seen = r["processSeen"].as_str().unwrap_or_default();
    assert!(seen.contains("ready") && seen.contains("got over"), "{t}");
    assert_eq!(r["processStdin"]["structured"]["written"], 5, "{t}");
    assert_eq!(
        r["processList"]["structured"]["items"][0]["pid"], *pid,
        "{t}"
    );
    assert_eq!(r["processKill"]["isError"], false, "{t}");
    assert_eq!(r["processEnded"]["structured"]["status"], "exited", "{t}");
    assert_eq!(r["processEnded"]["structured"]["exitCode"], 137, "{t}");
    assert_eq!(r["schemasOk"], true);
    let sid = r["sandboxId"].as_str().unwrap();
    assert_eq!(r["create"]["structured"]["status"], "running", "{t}");
    // The env value given at create is never in a result (its name is).
    let all = r.to_string();
    assert!(!all.contains("s3cr3t-value"), "{t}: an env value leaked");
    assert_eq!(
        r["create"]["structured"]["envKeys"],
        json!(["SECRET_TOKEN"])
    );
    assert_eq!(r["get"]["structured"]["id"], sid);
    assert_eq!(r["list"]["structured"]["items"][0]["id"], sid);
    assert_eq!(r["exec"]["structured"]["exitCode"], 3);
    assert_eq!(r["exec"]["structured"]["stdout"], "hi\n");
    assert_eq!(r["exec"]["structured"]["stderr"], "oops\n");
    assert!(r["exec"]["text"].as_str().unwrap().contains("exit code 3"));
    assert_eq!(r["read"]["structured"]["content"], "hello from mcp\n");
    assert_eq!(r["readB64"]["structured"]["encoding"], "base64");
    assert_eq!(r["readB64"]["structured"]["content"], "AP8B/g==");
    assert!(r["listFiles"].to_string().contains("/tmp/hello.txt"));
    // A directory made with its parent and mode, then already there; a file in the way is
    // the API's conflict.
    assert_eq!(
        r["mkdir"]["structured"],
        json!({ "path": "/tmp/made/deep", "created": true }),
        "{t}"
    );
    assert_eq!(
        r["mkdirAgain"]["structured"],
        json!({ "path": "/tmp/made/deep", "created": false }),
        "{t}"
    );
    assert_eq!(error_code(&r["mkdirOnFile"]), "conflict", "{t}");
    assert_eq!(
        r["mkdirOnFile"]["structured"]["error"]["details"]["reason"], "exists_not_directory",
        "{t}"
    );
    let made = &r["mkdirListed"]["structured"]["items"][0];
    assert_eq!(
        (
            &made["path"],
            &made["type"],
            made["mode"].as_u64().map(|m| m & 0o7777)
        ),
        (&json!("/tmp/made/deep"), &json!("dir"), Some(0o750)),
        "{t}: {}",
        r["mkdirListed"]
    );
    // Validation is /v1's: a wrong type is invalid_argument, a bound validation_failed, each
    // naming the field, as tool errors.
    assert_eq!(error_code(&r["malformed"]), "invalid_argument");
    assert_eq!(
        r["malformed"]["structured"]["error"]["details"]["field"],
        "command"
    );
    assert_eq!(error_code(&r["badTtl"]), "validation_failed");
    assert_eq!(
        r["badTtl"]["structured"]["error"]["details"]["field"],
        "ttlSeconds"
    );
    assert_eq!(r["extend"]["isError"], false);
    // Output over the cap: 1 MiB kept by /v1, flagged; the result carries its first 768 KiB
    // and counts the rest.
    assert_eq!(r["overCap"]["stdoutLen"], 768 * 1024, "{t}");
    assert_eq!(r["overCap"]["structured"]["stdoutTruncated"], true);
    assert_eq!(
        r["overCap"]["structured"]["stdoutOmittedBytes"],
        256 * 1024,
        "{t}"
    );
    // The loudest output /v1 keeps (1 MiB of control characters per stream, 12 MiB as /v1's
    // JSON), buffered and streamed through the SDK's defaults (a 1 MiB SSE event over HTTP):
    // a result, the start of each stream in it and the rest counted, never an error.
    for (case, byte) in [("loudBuffered", "\u{1}"), ("loudStreamed", "\u{1}")] {
        let o = &r[case];
        assert_eq!(o["isError"], false, "{t}: {case}: {o}");
        for (name, byte) in [("stdout", byte), ("stderr", "\u{2}")] {
            let s = &o[name];
            assert_eq!(s["distinct"], json!([byte]), "{t}: {case}.{name}: {o}");
            assert_eq!(s["truncated"], true, "{t}: {case}.{name}: {o}");
            assert_eq!(
                s["len"].as_u64().unwrap() + s["omitted"].as_u64().unwrap(),
                1024 * 1024,
                "{t}: {case}.{name}: what /v1 kept is in the result or counted: {o}"
            );
        }
        assert!(
            o["textLen"].as_u64().unwrap() < 80 * 1024,
            "{t}: {case}: the text does not repeat the output: {o}"
        );
    }
    assert!(
        r["loudStreamed"]["progressMessages"].as_u64().unwrap() > 0,
        "{t}: {}",
        r["loudStreamed"]
    );
    let big = &r["bigStreamed"];
    assert_eq!(big["isError"], false, "{t}: {big}");
    assert_eq!(big["stdout"]["distinct"], json!(["a"]), "{t}: {big}");
    assert_eq!(
        big["stdout"]["len"].as_u64().unwrap() + big["stdout"]["omitted"].as_u64().unwrap(),
        1024 * 1024,
        "{t}: {big}"
    );
    // Progress before the end: "first" arrived about 2 s before the result.
    assert_eq!(r["streamed"]["structured"]["stdout"], "first\nsecond\n");
    let first = &r["progress"][0];
    assert_eq!(first["message"], "first\n", "{t}: {}", r["progress"]);
    assert!(
        first["beforeEndSeconds"].as_f64().unwrap() > 1.0,
        "{t}: progress came only at the end: {}",
        r["progress"]
    );
    // The cancelled command was stopped: its marker file was never written.
    assert_eq!(error_code(&r["afterCancel"]), "not_found", "{t}");
    assert_eq!(r["resourceTemplates"].as_array().unwrap().len(), 2);
    assert!(r["events"]["events"].to_string().contains("sandbox.exec"));
    assert_eq!(r["logs"]["commands"][0]["exitCode"], 3);
    assert_eq!(r["logs"]["commands"][0]["program"], "sh");
    assert_eq!(r["snapshot"]["structured"]["status"], "ready", "{t}");
    // A fork of that snapshot runs, on the pool that holds it, with the snapshot's files.
    let fork = &r["fork"];
    assert_eq!(fork["isError"], false, "{t}: {fork}");
    assert_eq!(fork["structured"]["status"], "running", "{t}: {fork}");
    assert_ne!(fork["structured"]["id"], r["sandboxId"], "{t}");
    assert_eq!(fork["structured"]["pool"], "local", "{t}: {fork}");
    assert_eq!(
        r["forkRead"]["structured"]["content"], "hello from mcp\n",
        "{t}: {}",
        r["forkRead"]
    );
    // devhost exposes no ports: the API's own refusal, as a tool error.
    assert_eq!(error_code(&r["port"]), "unsupported_operation");
    // A pool that does expose them: the URL, with its port and expiry.
    let ported = &r["portedUrl"];
    assert_eq!(ported["isError"], false, "{t}: {ported}");
    assert_eq!(r["ported"]["structured"]["pool"], "ported", "{t}");
    let url = ported["structured"]["url"].as_str().unwrap();
    assert!(
        url.starts_with("https://fake.invalid/") && url.contains("/8080"),
        "{t}: {ported}"
    );
    assert!(
        ported["structured"]["expiresAt"].is_string(),
        "{t}: {ported}"
    );
    assert!(
        ported["text"].as_str().unwrap().contains(url),
        "{t}: {ported}"
    );
    // A key without sandboxes:exec is refused by /v1, as a tool error; it still reads.
    assert_eq!(error_code(&r["denied"]), "permission_denied", "{t}");
    assert_eq!(r["readOnlyGet"]["isError"], false);
    // Another organization's key reaches nothing of org A's, through any tool.
    for (tool, outcome) in r["crossTenant"].as_object().unwrap() {
        assert_eq!(
            error_code(outcome),
            "not_found",
            "{t}: {tool} reached org A: {outcome}"
        );
    }
    assert_eq!(r["crossTenantList"], json!([]), "{t}");
    assert!(
        r["crossTenantResource"]
            .as_str()
            .unwrap()
            .contains("no resource"),
        "{t}: {}",
        r["crossTenantResource"]
    );
    assert_eq!(r["delete"]["structured"]["status"], "terminating", "{t}");
    // Each mapped /v1 call left its own audit record, with the caller's key as the actor.
    let audit = r["audit"].as_array().expect("audit items");
    let actions: Vec<&str> = audit.iter().filter_map(|a| a["action"].as_str()).collect();
    for want in [
        "sandbox.admit",
        "sandbox.exec",
        "file.upload",
        "file.download",
        "file.list",
        "file.mkdir",
        "snapshot.create",
        "sandbox.renew",
        "sandbox.exec_stream",
        "sandbox.terminating",
    ] {
        assert!(
            actions.contains(&want),
            "{t}: no {want} record in {actions:?}"
        );
    }
    let exec = audit
        .iter()
        .find(|a| a["action"] == "sandbox.exec")
        .expect("an exec record");
    assert!(
        exec["actor"].as_str().unwrap().starts_with("key:"),
        "{t}: {exec}"
    );
    // Secrets never reach the audit trail.
    assert!(!r["audit"].to_string().contains("s3cr3t-value"), "{t}");
}

#[tokio::test]
async fn mcp_python_sdk_over_streamable_http() {
    let r = run_transport("http").await;
    check(&r, "http");
}

#[tokio::test]
async fn mcp_python_sdk_over_stdio() {
    let r = run_transport("stdio").await;
    check(&r, "stdio");
}

/// What the spec asks of the HTTP transport beyond what the SDK exercises: 401 with
/// `WWW-Authenticate`, 405-or-stream for GET, an unknown session is 404, an unsupported
/// protocol version header is 400.
#[tokio::test]
async fn mcp_http_transport_edges() {
    let dev = Dev::start();
    let http = reqwest::Client::new();
    let url = format!("{}/mcp", dev.url);
    let ping = json!({ "jsonrpc": "2.0", "id": 1, "method": "ping" });
    let r = http.post(&url).json(&ping).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .starts_with("Bearer"));
    let r = http
        .post(&url)
        .bearer_auth("dly_key_nope_nope")
        .json(&ping)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = http
        .post(&url)
        .bearer_auth(&dev.key)
        .header("mcp-session-id", "mcps_forged_00")
        .json(&ping)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = http
        .post(&url)
        .bearer_auth(&dev.key)
        .header("mcp-protocol-version", "1999-01-01")
        .json(&ping)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = http
        .get(&url)
        .bearer_auth(&dev.key)
        .header("accept", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    let r = http
        .post(&url)
        .bearer_auth(&dev.key)
        .json(&json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let v: Value = http
        .post(&url)
        .bearer_auth(&dev.key)
        .json(&json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call",
                        "params": { "name": "no_such_tool", "arguments": {} } }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["error"]["code"], -32602, "{v}");
}
