//! README's command blocks, run as written, so the documented paths cannot drift from the
//! binary: the production quickstart on a real Postgres and a private nats-server (migrate,
//! preflight, three server processes, create, exec, delete, audit verify), the `dev` blocks,
//! and the production example config through preflight.
//!
//! What a test must change, it changes by substitution and says so here: the database URL
//! (a throwaway database), the NATS URL (a private server), the API port (a free one) and the
//! devhost root (a temporary directory) — in the block and in a copy of the config it names,
//! run from a temporary directory holding that copy. Nothing else is touched.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use differently_bus::testing::NatsServer;
use differently_store::testing::TestDb;

use crate::harness::{binary, free_port, output_within};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("cli/ has a parent")
        .to_owned()
}

fn readme() -> String {
    std::fs::read_to_string(repo_root().join("README.md")).expect("read README.md")
}

/// The fenced `sh` block right after the `<!-- {marker}: … -->` comment.
fn block(readme: &str, marker: &str) -> String {
    let tag = format!("<!-- {marker}:");
    let at = readme
        .find(&tag)
        .unwrap_or_else(|| panic!("README.md has no `{tag}` block marker"));
    let rest = &readme[at..];
    let open = rest
        .find("```sh\n")
        .expect("a ```sh fence after the marker")
        + 6;
    let len = rest[open..]
        .find("\n```")
        .expect("the block's closing fence");
    rest[open..open + len].to_owned()
}

/// Runs `script` with bash in `dir`, `differently` first on PATH, in its own process group
/// (killed at the end, so background servers do not outlive the test); bounded by `limit`.
fn run_script(script: &str, dir: &Path, env: &[(&str, String)], limit: Duration) -> Output {
    let bin_dir = Path::new(binary()).parent().expect("binary dir").to_owned();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new("setsid");
    cmd.arg("bash")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for var in [
        "DIFFERENTLY_URL",
        "DIFFERENTLY_API_KEY",
        "DIFFERENTLY_AUDIT_KEY",
        "DIFFERENTLY_AUDIT_PREVIOUS_KEYS",
        "DIFFERENTLY_BOOTSTRAP_KEY",
        "DIFFERENTLY_DATABASE_URL",
        "DIFFERENTLY_NATS_URL",
        "DIFFERENTLY_CONFIG",
        "DIFFERENTLY_LISTEN",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().expect("spawn setsid bash (util-linux)");
    // setsid made bash a process group leader: the group is its pid.
    let kill_group = |group: u32| {
        let _ = Command::new("kill")
            .args(["-9", "--", &format!("-{group}")])
            .status();
    };
    let group = child.id();
    let (out, timed_out) = output_within(child, limit, kill_group);
    // Finished or not, background servers the block started must not outlive the test.
    kill_group(group);
    assert!(
        !timed_out,
        "the block did not finish within {limit:?}\n{}",
        said(&out, dir)
    );
    out
}

/// Everything the block and its servers printed.
fn said(out: &Output, dir: &Path) -> String {
    let mut text = format!(
        "--- stdout\n{}\n--- stderr\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for log in ["api.log", "scheduler.log", "worker.log"] {
        if let Ok(t) = std::fs::read_to_string(dir.join("logs").join(log)) {
            text.push_str(&format!("\n--- {log}\n{t}"));
        }
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_production_quickstart_runs_as_written() {
    let db = TestDb::new().await;
    let nats = NatsServer::start();
    let work = tempfile::tempdir().expect("tempdir");
    let port = free_port().to_string();
    let root = work.path().join("sandboxes");
    let listen = format!("127.0.0.1:{port}");
    let sub = |text: &str| {
        text.replace("postgres://postgres@127.0.0.1:5432/differently", db.url())
            .replace("nats://127.0.0.1:4222", &nats.url())
            .replace("127.0.0.1:8080", &listen)
            .replace("/tmp/differently-devhost", &root.display().to_string())
            .replace(
                "LOGS=$(mktemp -d)",
                &format!("LOGS={}", work.path().join("logs").display()),
            )
    };
    std::fs::create_dir(work.path().join("logs")).expect("mkdir logs");
    let script = block(&readme(), "quickstart");
    // The roles' logs go to a directory of their own, never into the reader's checkout.
    assert!(script.contains("LOGS=$(mktemp -d)"), "{script}");
    for line in script.lines().filter(|l| l.contains("differently server")) {
        assert!(
            line.contains("> $LOGS/"),
            "a log in the working directory: {line}"
        );
    }
    assert!(
        script.contains("CONFIG=deploy/differently.devhost.toml"),
        "{script}"
    );
    std::fs::create_dir(work.path().join("deploy")).expect("mkdir deploy");
    let config = std::fs::read_to_string(repo_root().join("deploy/differently.devhost.toml"))
        .expect("read deploy/differently.devhost.toml");
    std::fs::write(
        work.path().join("deploy/differently.devhost.toml"),
        sub(&config),
    )
    .expect("write config copy");

    let out = run_script(&sub(&script), work.path(), &[], Duration::from_secs(180));
    let text = said(&out, work.path());
    assert!(out.status.success(), "the quickstart failed\n{text}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("hello from "), "{text}");
    assert!(stdout.contains("audit chain verifies"), "{text}");
    // preflight said ok for everything, and nothing printed a key.
    assert!(!stdout.contains("FAIL"), "{text}");
    let key_lines = stdout.lines().filter(|l| l.contains("dly_key_")).count();
    assert_eq!(key_lines, 0, "a key was printed\n{text}");
}

/// Starts `differently dev`; its export lines and the process (killed on drop).
fn start_dev(dir: &Path) -> (Vec<(String, String)>, crate::harness::Proc) {
    use std::io::{BufRead, BufReader};
    let port = free_port();
    let child = Command::new(binary())
        .args(["dev", "--listen", &format!("127.0.0.1:{port}"), "--root"])
        .arg(dir.join("sandboxes"))
        .env_remove("DIFFERENTLY_AUDIT_KEY")
        .env_remove("DIFFERENTLY_BOOTSTRAP_KEY")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("dev.log")).expect("log"))
        .spawn()
        .expect("spawn dev");
    let mut proc = crate::harness::Proc { child };
    let stdout = proc.child.stdout.take().expect("stdout");
    let exports = BufReader::new(stdout)
        .lines()
        .take(3)
        .map(|l| {
            let l = l.expect("line");
            let (k, v) = l
                .strip_prefix("export ")
                .and_then(|kv| kv.split_once('='))
                .unwrap_or_else(|| panic!("not an export line: {l}"));
            (k.to_owned(), v.to_owned())
        })
        .collect();
    (exports, proc)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dev_blocks_run_as_written() {
    let work = tempfile::tempdir().expect("tempdir");
    let (exports, _dev) = start_dev(work.path());
    let names: Vec<&str> = exports.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        [
            "DIFFERENTLY_URL",
            "DIFFERENTLY_API_KEY",
            "DIFFERENTLY_AUDIT_KEY"
        ]
    );
    let env: Vec<(&str, String)> = exports
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    let text = readme();
    for marker in ["try-curl", "try-cli"] {
        let script = format!("set -euo pipefail\n{}", block(&text, marker));
        let out = run_script(&script, work.path(), &env, Duration::from_secs(90));
        let said = said(&out, work.path());
        assert!(out.status.success(), "{marker} failed\n{said}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("hi"),
            "{marker}: no output of the command\n{said}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_production_example_config_passes_preflight_but_for_its_unreachable_backend() {
    let db = TestDb::new().await;
    let nats = NatsServer::start();
    let work = tempfile::tempdir().expect("tempdir");
    // The example's backend host does not exist here; point it at a closed loopback port.
    let closed = format!("http://127.0.0.1:{}/v1", free_port());
    let config = std::fs::read_to_string(repo_root().join("deploy/differently.example.toml"))
        .expect("read deploy/differently.example.toml")
        .replace("https://opensandbox.internal:8090/v1", &closed);
    assert!(config.contains("kind = \"opensandbox\""), "{config}");
    let path = work.path().join("differently.toml");
    std::fs::write(&path, config).expect("write config");
    let key = String::from_utf8_lossy(
        &Command::new(binary())
            .args(["key", "generate"])
            .output()
            .expect("key generate")
            .stdout,
    )
    .trim()
    .to_owned();
    let run = |args: &[&str]| {
        Command::new(binary())
            .args(args)
            .arg("--config")
            .arg(&path)
            .env("DIFFERENTLY_DATABASE_URL", db.url())
            .env("DIFFERENTLY_NATS_URL", nats.url())
            .env("DIFFERENTLY_BOOTSTRAP_KEY", &key)
            .env("DIFFERENTLY_AUDIT_KEY", "00ff".repeat(16))
            .env("OPENSANDBOX_API_KEY", "test-opensandbox-key")
            .env_remove("DIFFERENTLY_AUDIT_PREVIOUS_KEYS")
            .output()
            .expect("run differently")
    };
    let out = run(&["migrate"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&["preflight"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    let failed: Vec<&str> = stdout.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert_eq!(failed.len(), 1, "{stdout}");
    assert!(failed[0].contains("pool osb"), "{stdout}");
    assert!(!stdout.contains("test-opensandbox-key"), "{stdout}");
}
