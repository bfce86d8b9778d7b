//! The plugin protocol as a user runs it, every part its own OS process: `differently plugin
//! serve` (the reference plugin) and the Python example plugin pass `differently plugin
//! conformance`; a wrong token fails it; and a `differently dev` with a `remote` pool
//! pointing at the reference plugin takes a sandbox through create → exec → delete, which
//! the plugin's fake ledger witnesses.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use differently_adapters::fake::{read_ledger, LedgerOp, LedgerOutcome};
use serde_json::{json, Value};

use crate::harness::{binary, free_port, Proc};

/// A plugin process and its base URL (read from its first line: `plugin listening on …`).
struct Plugin {
    _proc: Proc,
    url: String,
}

fn start(mut cmd: Command, log: &Path) -> Plugin {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let stdout = child.stdout.take().unwrap();
    let proc = Proc { child };
    let mut lines = BufReader::new(stdout).lines();
    let first = lines.next().and_then(|l| l.ok()).unwrap_or_else(|| {
        panic!(
            "{cmd:?} printed nothing: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        )
    });
    std::thread::spawn(move || for _ in lines {});
    let url = first
        .strip_prefix("plugin listening on ")
        .and_then(|u| u.strip_suffix("/adapter/v1"))
        .unwrap_or_else(|| panic!("unexpected first line: {first}"))
        .to_owned();
    Plugin { _proc: proc, url }
}

fn reference(dir: &Path, token: &Path, extra: &[&str]) -> Plugin {
    let mut cmd = Command::new(binary());
    cmd.args(["plugin", "serve", "--listen", "127.0.0.1:0", "--token-file"])
        .arg(token)
        .args(extra);
    start(cmd, &dir.join("plugin.log"))
}

/// `differently plugin conformance URL --token-file T [--json]`: (exit code, stdout, stderr).
fn conformance(url: &str, token: &Path, json: bool) -> (i32, String, String) {
    let mut cmd = Command::new(binary());
    cmd.args(["plugin", "conformance", url, "--token-file"])
        .arg(token);
    if json {
        cmd.arg("--json");
    }
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn token_file(dir: &Path, name: &str, value: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, format!("{value}\n")).unwrap();
    p
}

#[test]
fn the_reference_plugin_passes_conformance_as_processes() {
    let dir = tempfile::tempdir().unwrap();
    // `serve` writes a new token where the file is missing; conformance reads the same file.
    let token = dir.path().join("token");
    let p = reference(dir.path(), &token, &[]);
    let written = std::fs::read_to_string(&token).unwrap();
    assert!(written.trim().len() >= 20, "a generated token");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&token).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    let (code, out, err) = conformance(&p.url, &token, false);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("CONFORMS") && out.contains("exec.timeout"),
        "{out}"
    );
    let (code, out, err) = conformance(&p.url, &token, true);
    assert_eq!(code, 0, "{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["failed"], 0, "{report:#}");
    assert_eq!(report["dialect"], "fake");
    assert_eq!(report["plugin"]["name"], "differently-reference");
    assert!(report["passed"].as_u64().unwrap() >= 30, "{report:#}");

    // A wrong token: non-zero exit, the failing check named, no token printed.
    let wrong = token_file(dir.path(), "wrong", "not-the-plugin-token");
    let (code, out, _) = conformance(&p.url, &wrong, false);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("info") && out.contains("FAIL"), "{out}");
    assert!(
        !out.contains("not-the-plugin-token") && !out.contains(written.trim()),
        "{out}"
    );

    // Fewer capabilities: the undeclared ones must be refused, and are.
    let small = reference(dir.path(), &token, &["--capabilities", "exec,files"]);
    let (code, out, err) = conformance(&small.url, &token, true);
    assert_eq!(code, 0, "{out}\n{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    let names: Vec<&str> = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["outcome"] == "pass")
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    for n in ["honesty.exec.stream", "honesty.snapshots", "files.range"] {
        assert!(names.contains(&n), "{n} in {names:?}");
    }
    // Plain http to another machine is refused before anything is sent.
    let (code, out, _) = conformance("http://192.0.2.1:9", &token, false);
    assert_eq!(code, 1);
    assert!(out.contains("only to this machine"), "{out}");
}

#[test]
fn the_python_example_plugin_passes_conformance() {
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(dir.path(), "token", "python-plugin-token-42");
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/python-plugin/plugin.py");
    let lines = std::fs::read_to_string(&script).unwrap().lines().count();
    // 300 until the protocol's `files/directories` route (about 15 lines) joined it.
    assert!(lines < 320, "the example stays small: {lines} lines");
    let mut cmd = Command::new("python3");
    cmd.arg(&script)
        .args(["--port", "0", "--token-file"])
        .arg(&token);
    if Command::new("python3").arg("--version").output().is_err() {
        panic!("python3 is needed for the Python plugin test: install Python 3.8+");
    }
    let p = start(cmd, &dir.path().join("python.log"));
    let (code, out, err) = conformance(&p.url, &token, true);
    let log = std::fs::read_to_string(dir.path().join("python.log")).unwrap_or_default();
    assert_eq!(code, 0, "{out}\n{err}\n{log}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["dialect"], "posix");
    assert_eq!(report["plugin"]["name"], "python-example");
    assert_eq!(report["failed"], 0);
}

/// A `differently dev` (URL, admin key) whose stdout's first two lines are its exports.
fn dev(dir: &Path) -> (Proc, String, String) {
    let port = free_port();
    let mut child = Command::new(binary())
        .args(["dev", "--listen", &format!("127.0.0.1:{port}"), "--root"])
        .arg(dir.join("sandboxes"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("dev.log")).unwrap())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let proc = Proc { child };
    let mut lines = BufReader::new(stdout).lines();
    let url = lines.next().unwrap().unwrap();
    let key = lines.next().unwrap().unwrap();
    std::thread::spawn(move || for _ in lines {});
    (
        proc,
        url.strip_prefix("export DIFFERENTLY_URL=")
            .unwrap()
            .to_owned(),
        key.strip_prefix("export DIFFERENTLY_API_KEY=")
            .unwrap()
            .to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_pool_runs_a_sandbox_through_the_reference_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(dir.path(), "token", "remote-pool-token-0123456789");
    let ledger = dir.path().join("plugin-ledger.jsonl");
    let plugin = reference(dir.path(), &token, &["--ledger", ledger.to_str().unwrap()]);
    let (_dev, url, key) = dev(dir.path());
    let http = reqwest::Client::new();
    let call = |method: reqwest::Method, path: &str, body: Option<Value>| {
        let mut rb = http
            .request(method, format!("{url}{path}"))
            .bearer_auth(&key);
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        async move {
            let resp = rb.send().await.unwrap();
            let s = resp.status().as_u16();
            (s, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };

    // A remote pool must say who runs the plugin.
    let settings =
        json!({"url": plugin.url, "allowHttp": true, "token": format!("file:{}", token.display())});
    let (s, e) = call(
        reqwest::Method::POST,
        "/v1/admin/pools",
        Some(json!({"name": "plugin", "kind": "remote", "settings": settings})),
    )
    .await;
    assert_eq!(
        (s, e["error"]["details"]["field"].as_str()),
        (422, Some("trust")),
        "{e}"
    );
    // An http URL without allowHttp is refused, naming the setting.
    let (s, e) = call(reqwest::Method::POST, "/v1/admin/pools", Some(json!({"name": "plugin", "kind": "remote", "trust": "private", "settings": {"url": plugin.url, "token": "env:X"}}))).await;
    assert_eq!(
        (s, e["error"]["details"]["field"].as_str()),
        (422, Some("settings.url")),
        "{e}"
    );
    let (s, p) = call(
        reqwest::Method::POST,
        "/v1/admin/pools",
        Some(json!({"name": "plugin", "kind": "remote", "trust": "private", "region": "plugin-land", "settings": settings})),
    )
    .await;
    assert_eq!(s, 201, "{p}");
    assert!(!p.to_string().contains("remote-pool-token"), "{p}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let info = loop {
        let (_, info) = call(reqwest::Method::GET, "/v1/admin/pools/plugin", None).await;
        if info["healthy"] == true {
            break info;
        }
        assert!(
            Instant::now() < deadline,
            "the remote pool never became healthy: {info}\n{}",
            std::fs::read_to_string(dir.path().join("dev.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    // Capabilities are the plugin's declaration.
    let caps = info["capabilities"].as_array().cloned().unwrap_or_default();
    assert!(
        caps.contains(&json!("exec.stream")) && caps.contains(&json!("snapshots")),
        "{info}"
    );

    // Only the remote pool is in the region: the sandbox goes there.
    let (s, sbx) = call(
        reqwest::Method::POST,
        "/v1/sandboxes",
        Some(json!({"region": "plugin-land"})),
    )
    .await;
    assert_eq!(s, 202, "{sbx}");
    let id = sbx["id"].as_str().unwrap().to_owned();
    let (_, got) = call(
        reqwest::Method::GET,
        &format!("/v1/sandboxes/{id}/wait?status=running&timeoutSeconds=20"),
        None,
    )
    .await;
    assert_eq!(
        (got["status"].as_str(), got["pool"].as_str()),
        (Some("running"), Some("plugin")),
        "{got}"
    );

    let (s, r) = call(
        reqwest::Method::POST,
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"command": ["echo", "via", "plugin"]})),
    )
    .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(
        (r["exitCode"].as_i64(), r["stdout"].as_str()),
        (Some(0), Some("via plugin\n")),
        "{r}"
    );
    // The CLI's streamed exec goes through the plugin's NDJSON stream.
    let out = Command::new(binary())
        .args(["sandbox", "exec", &id, "--", "fake-stderr", "streamed"])
        .env("DIFFERENTLY_URL", &url)
        .env("DIFFERENTLY_API_KEY", &key)
        .env("DIFFERENTLY_CLIENT_CONFIG", dir.path().join("client.toml"))
        .env_remove("DIFFERENTLY_PROFILE")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stderr), "streamed\n");

    let (s, d) = call(
        reqwest::Method::DELETE,
        &format!("/v1/sandboxes/{id}"),
        None,
    )
    .await;
    assert!(s == 202 || s == 200, "{s} {d}");
    let (_, got) = call(
        reqwest::Method::GET,
        &format!("/v1/sandboxes/{id}/wait?status=terminated&timeoutSeconds=20"),
        None,
    )
    .await;
    assert_eq!(got["status"], "terminated", "{got}");

    // The plugin's backend saw exactly one create, the execs, and the delete.
    let entries = read_ledger(&ledger).unwrap();
    let mine = |op: LedgerOp, outcome: LedgerOutcome| {
        entries
            .iter()
            .filter(|e| {
                e.op == op
                    && e.outcome == outcome
                    && e.sandbox_id.as_ref().map(|s| s.as_str()) == Some(id.as_str())
            })
            .count()
    };
    assert_eq!(
        mine(LedgerOp::Create, LedgerOutcome::Created),
        1,
        "{entries:#?}"
    );
    assert!(mine(LedgerOp::Exec, LedgerOutcome::Ok) >= 2, "{entries:#?}");
    assert_eq!(
        mine(LedgerOp::Delete, LedgerOutcome::Deleted),
        1,
        "{entries:#?}"
    );
    assert!(!std::fs::read_to_string(dir.path().join("dev.log"))
        .unwrap_or_default()
        .contains("remote-pool-token"));
}
