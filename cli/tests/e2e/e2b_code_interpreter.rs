//! `e2b-code-interpreter` through the E2B facade's port proxy: the official SDK (PyPI
//! `e2b-code-interpreter` 2.11.5 over `e2b` 2.63.0, from `DIFFERENTLY_E2B_CI_PYTHON`;
//! scripts/test installs both pinned) runs e2b_ci_client.py against a real
//! `differently dev`, and the JSON report it prints is asserted on here.
//!
//! First on the dev's own `local` pool (devhost under bubblewrap, no network, so no ports):
//! the SDK gets a clear `SandboxException` naming what is missing. Then on a devhost pool
//! with `isolation = "none"` (its ports are this host's loopback ports), where the SDK first
//! finds nothing on port 49999 (again a clear `SandboxException`, not the `TimeoutException`
//! E2B's 502 would give), then starts fixtures/code_interpreter_server.py (a test double of
//! E2B's code-interpreter server) in the sandbox with `commands.run(background=True)` and
//! runs code: stdout, a result, an error with its traceback, env vars, contexts (create, run
//! in, list, restart, remove, then 404), and a `run_code` timeout whose closed connection
//! reaches the server (it logs the execution as cancelled). Raw requests show the token rules
//! and that the sandbox's answers come back unchanged.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

use crate::client_cli_dev::Dev;
use crate::e2b_facade::{flow_report, ok, raised, tenant_key};

/// The pinned SDK versions scripts/test installs.
const CI_VERSION: &str = "2.11.5";
const E2B_VERSION: &str = "2.63.0";

/// The Python of `DIFFERENTLY_E2B_CI_PYTHON`, checked to have the pinned SDKs.
fn python() -> String {
    let var = "DIFFERENTLY_E2B_CI_PYTHON";
    let python = std::env::var(var).unwrap_or_else(|_| "python3".into());
    let probe = Command::new(&python)
        .args([
            "-c",
            "from importlib.metadata import version as v; \
             print(v('e2b-code-interpreter'), v('e2b'))",
        ])
        .output();
    let found = probe
        .as_ref()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    let want = format!("{CI_VERSION} {E2B_VERSION}");
    assert_eq!(
        found.as_deref(),
        Some(want.as_str()),
        "{python} does not have e2b-code-interpreter {CI_VERSION} with e2b {E2B_VERSION}: \
         install them (pip install e2b=={E2B_VERSION} e2b-code-interpreter=={CI_VERSION}) in \
         a venv and set {var} to its python (scripts/test does)"
    );
    python
}

fn here(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/e2e")
        .join(file)
}

/// Runs the client script's `phase` with `key`; its report.
async fn phase(python: &str, dev: &Dev, key: &str, phase: &str, tag: &str) -> Value {
    let out = tokio::process::Command::new(python)
        .arg(here("e2b_ci_client.py"))
        .env("E2B_API_URL", format!("{}/e2b", dev.url))
        .env("E2B_SANDBOX_URL", format!("{}/e2b/envd", dev.url))
        .env("E2B_API_KEY", key)
        .env("PHASE", phase)
        .env("TAG", tag)
        .env("SERVER", here("fixtures/code_interpreter_server.py"))
        .env_remove("E2B_DOMAIN")
        .env_remove("E2B_DEBUG")
        .output()
        .await
        .unwrap();
    let r = flow_report(dev, &format!("e2b_ci_client.py ({phase})"), &out);
    eprintln!("{phase}: {r}");
    r
}

/// Adds pool `plain` (devhost, commands unisolated, so its ports are reachable), denies the
/// dev's `local` pool so new sandboxes land on `plain`, and waits until `plain` is healthy.
async fn plain_pool(dev: &Dev) {
    let root = dev.dir.path().join("plain");
    dev.post(
        "/v1/admin/pools",
        json!({
            "name": "plain", "kind": "devhost", "trust": "private",
            "settings": { "root": root, "isolation": "none" },
        }),
    )
    .await;
    crate::e2b_facade_osb::only_pool(dev, "plain").await;
}

/// An execution's report (the step succeeded).
fn exec<'a>(r: &'a Value, step: &str) -> &'a Value {
    ok(r, step)
}

#[tokio::test(flavor = "multi_thread")]
async fn e2b_code_interpreter_runs_code_through_the_port_proxy() {
    let python = python();
    // The plain pool's port 49999 is this host's: it must be free for the double.
    let probe = std::net::TcpListener::bind("127.0.0.1:49999");
    assert!(
        probe.is_ok(),
        "127.0.0.1:49999 is in use on this host; the code interpreter test double needs it \
         (stop what listens there): {probe:?}"
    );
    drop(probe);
    let dev = Dev::start();
    let key = tenant_key(&dev, "e2b-ci").await;
    let tag = format!("{}", std::process::id());

    // A pool without ports: a clear refusal naming what is missing.
    let r = phase(&python, &dev, &key, "unsupported", &tag).await;
    for step in ["run_code", "contexts"] {
        let m = raised(&r, step, "SandboxException");
        assert!(
            !r[step]["mro"]
                .as_array()
                .unwrap()
                .contains(&json!("TimeoutException")),
            "{r}"
        );
        assert!(
            m.starts_with("501 Not Implemented")
                && m.contains("has no code interpreter")
                && m.contains("cannot expose port 49999")
                && m.contains("(devhost) does not support ports.expose"),
            "{step}: {m}"
        );
    }

    plain_pool(&dev).await;
    let home_existed = Path::new("/home/user").exists();
    let r = phase(&python, &dev, &key, "flow", &tag).await;
    if !home_existed {
        let _ = std::fs::remove_dir("/home/user");
    }
    assert_eq!(r["has_traffic_token"], true, "{r}");

    // Nothing on 49999 yet: a SandboxException (503) naming what is missing, for the calls
    // with the envd token (`/execute`) and those with only the traffic token (`/contexts`).
    for step in ["nothing_run", "nothing_contexts"] {
        let m = raised(&r, step, "SandboxException");
        assert!(
            m.starts_with("503 Service Unavailable")
                && m.contains("serves no code interpreter on port 49999")
                && m.contains("nothing listens there"),
            "{step}: {m}"
        );
        assert!(
            !r[step]["mro"]
                .as_array()
                .unwrap()
                .contains(&json!("TimeoutException")),
            "{r}"
        );
    }

    // Code runs: stdout, the last expression's value, the execution count.
    exec(&r, "ready");
    let run = exec(&r, "run");
    assert_eq!(run["stdout"], json!(["hello 41\n"]), "{run}");
    assert_eq!(run["results"], json!(["42"]), "{run}");
    assert_eq!(run["error"], Value::Null, "{run}");
    assert!(run["count"].as_u64().unwrap() >= 2, "{run}");
    let streamed = exec(&r, "streamed");
    assert_eq!(streamed["stdout"], json!(["out line\n"]), "{streamed}");
    assert_eq!(streamed["stderr"], json!(["err line\n"]), "{streamed}");
    assert_eq!(
        r["seen"],
        json!([["stdout", "out line\n"], ["stderr", "err line\n"]])
    );
    let error = &exec(&r, "error")["error"];
    assert_eq!(error["name"], "ValueError", "{error}");
    assert_eq!(error["value"], "bad value", "{error}");
    let tb = error["traceback"].as_str().unwrap();
    assert!(
        tb.contains("raise ValueError('bad value')") && tb.contains("in f"),
        "{tb}"
    );
    assert_eq!(exec(&r, "envs")["results"], json!(["'from-envs'"]));

    // Contexts: their own namespaces, listed, restarted (emptied), removed.
    let ctx = &r["context"];
    assert_eq!(ctx["language"], "python");
    assert_eq!(ctx["cwd"], "/tmp");
    let id = ctx["id"].as_str().unwrap();
    assert_eq!(exec(&r, "ctx_set")["error"], Value::Null);
    assert_eq!(exec(&r, "ctx_get")["results"], json!(["7"]));
    assert_eq!(exec(&r, "default_get")["error"]["name"], "NameError");
    assert!(ok(&r, "listed").as_array().unwrap().contains(&json!(id)));
    ok(&r, "restart");
    assert_eq!(exec(&r, "after_restart")["error"]["name"], "NameError");
    ok(&r, "remove");
    assert!(!ok(&r, "listed_after")
        .as_array()
        .unwrap()
        .contains(&json!(id)));
    let m = raised(&r, "removed_run", "NotFoundException");
    assert!(m.contains(&format!("Context {id} not found")), "{m}");

    // The timeout: the SDK's TimeoutException after about 3 s, and the server saw the close.
    raised(&r, "timeout", "TimeoutException");
    let took = r["timeout_seconds"].as_f64().unwrap();
    assert!((2.5..30.0).contains(&took), "timeout took {took} s");
    let log: Vec<&str> = r["server_log"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let cancelled = log.iter().find(|l| l.starts_with("cancelled "));
    assert!(
        cancelled.is_some(),
        "the close never reached the server: {log:?}"
    );
    let n = cancelled.unwrap().trim_start_matches("cancelled ");
    assert!(log.contains(&format!("execute {n}").as_str()), "{log:?}");
    assert!(log.contains(&format!("restart {id}").as_str()), "{log:?}");
    assert!(log.contains(&format!("delete {id}").as_str()), "{log:?}");
    eprintln!(
        "close reached the server {:.2} s after run_code began",
        r["cancel_seen_after"].as_f64().unwrap()
    );
    assert_eq!(exec(&r, "after_cancel")["results"], json!(["'still here'"]));

    // Raw requests: no token is 401, a token not for the sandbox is E2B's 502, and the
    // sandbox's own answers (text, a 404 with the query kept) come back unchanged.
    assert_eq!(r["raw_no_token"][0], 401, "{r}");
    assert_eq!(r["raw_wrong_token"][0], 502, "{r}");
    let gone: Value = serde_json::from_str(r["raw_wrong_token"][2].as_str().unwrap()).unwrap();
    assert_eq!(
        gone["message"],
        format!("The sandbox {} was not found", r["id"].as_str().unwrap())
    );
    assert_eq!(r["raw_health"], json!([200, "text/plain", "OK"]));
    assert_eq!(
        r["raw_unknown"],
        json!([404, "text/plain", "Not Found: /nowhere?a=1"])
    );
    assert_eq!(r["raw_port_word"][0], 400, "{r}");
}
