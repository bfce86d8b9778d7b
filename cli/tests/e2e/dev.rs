//! `differently dev` as a user runs it from the README, and the NATS version gate.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use differently_bus::testing::NatsServer;
use serde_json::{json, Value};

use crate::harness::{binary, free_port, Proc};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_mode_runs_a_real_command() {
    let root = tempfile::tempdir().unwrap();
    let port = free_port();
    let log = root.path().join("dev.log");
    let child = Command::new(binary())
        .args(["dev", "--listen", &format!("127.0.0.1:{port}"), "--root"])
        .arg(root.path().join("sandboxes"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let mut proc = Proc { child };
    let stdout = proc.child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let url_line = lines.next().unwrap().unwrap();
    let key_line = lines.next().unwrap().unwrap();
    let url = url_line
        .strip_prefix("export DIFFERENTLY_URL=")
        .expect("url export")
        .to_owned();
    let key = key_line
        .strip_prefix("export DIFFERENTLY_API_KEY=")
        .expect("key export")
        .to_owned();
    assert_eq!(url, format!("http://127.0.0.1:{port}"));

    let http = reqwest::Client::new();
    let created: Value = http
        .post(format!("{url}/v1/sandboxes"))
        .bearer_auth(&key)
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["id"].as_str().unwrap().to_owned();
    let running: Value = http
        .get(format!(
            "{url}/v1/sandboxes/{id}/wait?status=running&timeoutSeconds=10"
        ))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(running["status"], "running", "{running}");
    let out: Value = http
        .post(format!("{url}/v1/sandboxes/{id}/exec"))
        .bearer_auth(&key)
        .json(&json!({"command": ["sh", "-c", "echo hi"], "env": {}, "cwd": "/", "timeoutSeconds": 30}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(out["exitCode"], 0, "{out}");
    assert_eq!(out["stdout"], "hi\n");
    assert!(root.path().join("sandboxes").join(&id).is_dir());

    let r = http
        .delete(format!("{url}/v1/sandboxes/{id}"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let done: Value = http
        .get(format!(
            "{url}/v1/sandboxes/{id}/wait?status=terminated&timeoutSeconds=10"
        ))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(done["status"], "terminated");
    assert!(
        !root.path().join("sandboxes").join(&id).exists(),
        "the working directory is gone"
    );
    proc.kill9();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_older_than_2_10_are_refused() {
    let old = Path::new("/usr/sbin/nats-server");
    assert!(
        old.exists(),
        "this test needs the packaged nats-server 2.9.x at /usr/sbin/nats-server (apt-get install nats-server)"
    );
    let nats = NatsServer::start_with(old);
    let out = Command::new(binary())
        .args(["server", "--role", "worker"])
        .env(
            "DIFFERENTLY_DATABASE_URL",
            "postgres://postgres@127.0.0.1:5432/postgres",
        )
        .env("DIFFERENTLY_NATS_URL", nats.url())
        .env("DIFFERENTLY_CONFIG", "/dev/null")
        .env("DIFFERENTLY_AUDIT_KEY", "00".repeat(32))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("2.10"), "{stderr}");
}
