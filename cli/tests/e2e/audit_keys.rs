//! The audit key as operators meet it: server roles and preflight refuse to run without one,
//! preflight parses the bootstrap key as the api will, records name their key so a rotated
//! key still verifies old chains, a lost key is recovered by a signed segment (never by a
//! rewrite), and `dev --key-file` keeps the admin key across restarts.

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use differently_core::SandboxStatus;
use differently_store::audit::AuditKey;
use reqwest::Method;
use serde_json::{json, Value};

use crate::harness::{binary, free_port, output_within, Cluster, Opts, Proc};

const KEY_A: &str = "a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0";
const KEY_B: &str = "0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0a1a2a3a4a5a6a7a8a9aaabacadaeaf0";

fn key_id(hex: &str) -> String {
    AuditKey::from_hex(hex).expect("test key").key_id()
}

/// Runs `cmd` to its end, killing it after `limit` (a role that should refuse to start
/// must not hang the test when it starts after all).
fn run_bounded(mut cmd: Command, limit: Duration) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn differently");
    let (out, timed_out) = output_within(child, limit, |pid| {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    });
    assert!(!timed_out, "`differently` did not exit within {limit:?}");
    out
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_roles_and_preflight_refuse_to_run_without_an_audit_key() {
    let c = Cluster::new(Opts::default()).await;
    for role in ["api", "scheduler", "worker"] {
        let mut cmd = c.command(&["server", "--role", role]);
        cmd.env_remove("DIFFERENTLY_AUDIT_KEY");
        let out = run_bounded(cmd, Duration::from_secs(30));
        assert!(!out.status.success(), "{role} started without an audit key");
        let said = text(&out);
        assert!(
            said.contains("no audit key") && said.contains("DIFFERENTLY_AUDIT_KEY"),
            "{role}: {said}"
        );
    }

    let mut cmd = c.command(&["preflight"]);
    cmd.env_remove("DIFFERENTLY_AUDIT_KEY");
    let out = run_bounded(cmd, Duration::from_secs(60));
    assert!(!out.status.success());
    let said = text(&out);
    assert!(
        said.lines().any(|l| l.contains("FAIL")
            && l.contains("keys")
            && l.contains("DIFFERENTLY_AUDIT_KEY")),
        "{said}"
    );

    // A bootstrap key the api would refuse fails preflight, naming the config key.
    let mut cmd = c.command(&["preflight"]);
    cmd.env("DIFFERENTLY_BOOTSTRAP_KEY", "abc");
    let out = run_bounded(cmd, Duration::from_secs(60));
    assert!(!out.status.success());
    let said = text(&out);
    assert!(
        said.lines().any(|l| l.contains("FAIL")
            && l.contains("bootstrap key")
            && l.contains("bootstrap_key")),
        "{said}"
    );
    assert!(!said.contains("bootstrapKey"), "{said}");

    // With both well-formed, the key checks pass and name the audit key by its id only.
    let out = run_bounded(c.command(&["preflight"]), Duration::from_secs(60));
    let said = text(&out);
    let keys_line = said
        .lines()
        .find(|l| l.contains("keys"))
        .unwrap_or_default();
    assert!(keys_line.starts_with("ok"), "{said}");
    assert!(keys_line.contains(&key_id(&c.audit_key)), "{said}");
    assert!(
        !said.contains(&c.audit_key),
        "preflight printed the audit key"
    );
    assert!(out.status.success(), "{said}");
}

async fn verify(c: &Cluster) -> Value {
    let (s, report) = c
        .call(&c.key, Method::GET, "/v1/admin/audit/verify", None)
        .await;
    assert_eq!(s, 200, "{report}");
    report
}

async fn create_running(c: &Cluster) {
    let id = c.create_ok().await;
    c.wait_status(&id, SandboxStatus::Running, Duration::from_secs(30))
        .await;
}

fn start_all(c: &mut Cluster, env: &[(&str, &str)]) {
    for role in ["api", "scheduler", "worker"] {
        c.spawn(role, role, env);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_key_verifies_with_the_ring_and_a_lost_one_is_recovered_by_a_segment() {
    let mut c = Cluster::new(Opts::default()).await;
    start_all(&mut c, &[("DIFFERENTLY_AUDIT_KEY", KEY_A)]);
    c.wait_ready().await;
    create_running(&c).await;
    assert_eq!(verify(&c).await["ok"], true);

    // Every process restarts with key B; A is not configured.
    for role in ["api", "scheduler", "worker"] {
        c.kill9(role);
    }
    start_all(&mut c, &[("DIFFERENTLY_AUDIT_KEY", KEY_B)]);
    c.wait_ready().await;
    create_running(&c).await;
    let r = verify(&c).await;
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["firstBad"]["kind"], "unknown_key", "{r}");
    assert_eq!(r["unknownKeyIds"], json!([key_id(KEY_A)]), "{r}");
    assert!(
        r["firstBad"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(&key_id(KEY_A))),
        "{r}"
    );

    // Rotation: A configured as a retired key, so everything verifies and no segment is needed.
    c.kill9("api");
    c.spawn(
        "api",
        "api",
        &[
            ("DIFFERENTLY_AUDIT_KEY", KEY_B),
            ("DIFFERENTLY_AUDIT_PREVIOUS_KEYS", KEY_A),
        ],
    );
    c.wait_api().await;
    let r = verify(&c).await;
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["unverifiableRecords"], 0, "{r}");
    let (s, body) = c
        .call(
            &c.key,
            Method::POST,
            "/v1/admin/audit/segments",
            Some(json!({"reason": "not needed"})),
        )
        .await;
    assert_eq!(
        (s, body["error"]["code"].as_str()),
        (409, Some("conflict")),
        "{body}"
    );

    // Lost: A is gone for good. A segment is refused without a reason, then written.
    c.kill9("api");
    c.spawn("api", "api", &[("DIFFERENTLY_AUDIT_KEY", KEY_B)]);
    c.wait_api().await;
    let (s, body) = c
        .call(
            &c.key,
            Method::POST,
            "/v1/admin/audit/segments",
            Some(json!({"reason": "  "})),
        )
        .await;
    assert_eq!(s, 422, "{body}");
    assert_eq!(body["error"]["details"]["field"], "reason", "{body}");
    let (s, body) = c
        .call(
            &c.key,
            Method::POST,
            "/v1/admin/audit/segments",
            Some(json!({"reason": "key A lost with its vault"})),
        )
        .await;
    assert_eq!(s, 201, "{body}");
    assert_eq!(body["checkpoint"]["keyId"], key_id(KEY_B), "{body}");
    assert_eq!(
        body["checkpoint"]["segment"]["lostKeyIds"],
        json!([key_id(KEY_A)]),
        "{body}"
    );
    let report = &body["report"];
    assert_eq!(report["ok"], true, "{report}");
    assert!(
        report["unverifiableRecords"].as_u64().unwrap_or(0) > 0,
        "{report}"
    );
    assert_eq!(report["segments"][0]["reason"], "key A lost with its vault");

    // Work after the segment is checked in full, online and offline.
    create_running(&c).await;
    let r = verify(&c).await;
    assert_eq!(r["ok"], true, "{r}");
    let (s, rows) = c
        .call(&c.key, Method::GET, "/v1/audit?action=audit.segment", None)
        .await;
    assert_eq!(s, 200, "{rows}");
    let export = c
        .req(Method::GET, "/v1/admin/audit/export")
        .send()
        .await
        .expect("export")
        .text()
        .await
        .expect("export body");
    let path = c.dir.path().join("export.jsonl");
    std::fs::write(&path, &export).expect("write export");
    let offline = |key: &str| {
        Command::new(binary())
            .args(["audit", "verify"])
            .arg(&path)
            .env("DIFFERENTLY_AUDIT_KEY", key)
            .env_remove("DIFFERENTLY_AUDIT_PREVIOUS_KEYS")
            .output()
            .expect("run audit verify")
    };
    let out = offline(KEY_B);
    assert!(out.status.success(), "{}", text(&out));
    let printed: Value = serde_json::from_slice(&out.stdout).expect("report JSON");
    assert!(printed["unverifiableRecords"].as_u64().unwrap_or(0) > 0);
    // The segment is signed with B: a verifier holding only A trusts nothing after it.
    assert!(!offline(KEY_A).status.success());
}

/// Starts `dev` with `--key-file`; the lines it printed on stdout, and the process.
fn start_dev(key_file: &std::path::Path, log: &std::path::Path) -> (Vec<String>, Proc) {
    let port = free_port();
    let child = Command::new(binary())
        .args([
            "dev",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--key-file",
        ])
        .arg(key_file)
        .env_remove("DIFFERENTLY_BOOTSTRAP_KEY")
        .env_remove("DIFFERENTLY_AUDIT_KEY")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).expect("log"))
        .spawn()
        .expect("spawn dev");
    let mut proc = Proc { child };
    let stdout = proc.child.stdout.take().expect("stdout");
    let lines: Vec<String> = BufReader::new(stdout)
        .lines()
        .take(3)
        .map(|l| l.expect("line"))
        .collect();
    // The next-step hint follows the lines on stderr.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(log)
        .unwrap_or_default()
        .contains("differently dev: paste")
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    (lines, proc)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_keeps_its_admin_key_in_a_key_file_and_shows_the_audit_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key_file = dir.path().join("admin.key");
    let log = dir.path().join("dev.log");
    let (first, mut p) = start_dev(&key_file, &log);
    p.kill9();
    let key = first[1]
        .strip_prefix("export DIFFERENTLY_API_KEY=")
        .expect("key line")
        .to_owned();
    assert_eq!(
        std::fs::read_to_string(&key_file).expect("key file").trim(),
        key
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&key_file)
        .expect("stat")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let audit = first[2]
        .strip_prefix("export DIFFERENTLY_AUDIT_KEY=")
        .expect("audit key line");
    assert!(AuditKey::from_hex(audit).is_ok(), "{audit}");
    let said = std::fs::read_to_string(&log).expect("log");
    assert!(said.contains("differently sandbox create"), "{said}");
    assert!(!said.contains(&key), "the admin key is in the log");

    let (second, mut p) = start_dev(&key_file, &log);
    p.kill9();
    assert_eq!(second[1], first[1], "a restart changed the admin key");
    assert_ne!(second[2], first[2], "the audit key is new on every start");

    std::fs::write(&key_file, "not-a-key-zzq\n").expect("write");
    let out = Command::new(binary())
        .args(["dev", "--listen", "127.0.0.1:0", "--key-file"])
        .arg(&key_file)
        .env_remove("DIFFERENTLY_BOOTSTRAP_KEY")
        .output()
        .expect("run dev");
    assert!(!out.status.success());
    let said = text(&out);
    assert!(said.contains("--key-file"), "{said}");
    assert!(
        !said.contains("zzq"),
        "the malformed key was echoed: {said}"
    );
}
