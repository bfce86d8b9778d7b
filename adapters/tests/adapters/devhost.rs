//! The devhost adapter against real processes and files on this host: its lifecycle and exec
//! here; the rest of its data plane (`data_plane`), running under bubblewrap (`isolation`)
//! and background processes (`process`) in the submodules.

use std::time::{Duration, Instant};

use differently_adapters::devhost::{
    DevhostAdapter, DevhostConfig, DevhostTag, IsolationMode, TAG_FILE,
};
use differently_adapters::{Adapter, AdapterError, InstanceRef};
use differently_core::exec::ExecRequest;
use differently_core::ids::InstallationId;
use differently_core::SandboxId;

use crate::{create_req, exec_req};

mod data_plane;
mod isolation;
mod process;

/// An adapter (`isolation = "none"`) on a fresh root with one sandbox created in it.
async fn sandbox() -> (tempfile::TempDir, DevhostAdapter, InstanceRef) {
    sandbox_with(IsolationMode::None).await
}

/// An adapter with `isolation` on a fresh root with one sandbox created in it.
async fn sandbox_with(
    isolation: IsolationMode,
) -> (tempfile::TempDir, DevhostAdapter, InstanceRef) {
    let root = tempfile::tempdir().expect("tempdir");
    let a = DevhostAdapter::new(DevhostConfig {
        root: root.path().to_path_buf(),
        isolation,
    });
    let sbx = SandboxId::new();
    let i = a
        .create(&create_req(&sbx, &InstallationId::new()))
        .await
        .expect("create");
    let at = InstanceRef {
        sandbox_id: sbx,
        backend_ref: i.backend_ref,
    };
    (root, a, at)
}

fn sh(script: &str) -> ExecRequest {
    exec_req(&["sh", "-c", script])
}

fn body_of(bytes: &'static [u8]) -> differently_adapters::ByteStream {
    use futures::StreamExt;
    futures::stream::iter(vec![Ok(bytes::Bytes::from_static(bytes))]).boxed()
}

async fn read_all(
    a: &DevhostAdapter,
    at: &InstanceRef,
    path: &str,
) -> Result<Vec<u8>, AdapterError> {
    use futures::StreamExt;
    let dl = a.download(at, path, None).await?;
    let parts: Vec<_> = dl.body.collect().await;
    let mut out = Vec::new();
    for p in parts {
        out.extend_from_slice(&p?);
    }
    Ok(out)
}

#[tokio::test]
async fn lifecycle_dir_tag_idempotent_list_delete() {
    let root = tempfile::tempdir().expect("tempdir");
    let a = DevhostAdapter::new(DevhostConfig {
        root: root.path().join("nested"),
        isolation: IsolationMode::None,
    });
    let (sbx, inst) = (SandboxId::new(), InstallationId::new());
    assert!(a
        .list(&inst)
        .await
        .expect("list of missing root")
        .is_empty());

    let first = a.create(&create_req(&sbx, &inst)).await.expect("create");
    assert_eq!(first.backend_ref, sbx.as_str());
    let dir = a.sandbox_dir(&sbx);
    assert!(dir.is_dir());
    let tag: DevhostTag =
        serde_json::from_slice(&std::fs::read(dir.join(TAG_FILE)).expect("tag")).expect("tag json");
    assert_eq!((&tag.sandbox_id, &tag.installation_id), (&sbx, &inst));

    std::fs::write(dir.join("keep.txt"), "x").expect("write");
    let second = a
        .create(&create_req(&sbx, &inst))
        .await
        .expect("create again");
    assert_eq!(first, second);
    assert!(
        dir.join("keep.txt").exists(),
        "idempotent create keeps the instance"
    );

    let other = SandboxId::new();
    a.create(&create_req(&other, &InstallationId::new()))
        .await
        .expect("create other");
    assert_eq!(a.list(&inst).await.expect("list"), vec![first.clone()]);
    assert_eq!(a.find(&sbx).await.expect("find"), Some(first));

    a.delete(&sbx).await.expect("delete");
    assert!(!dir.exists());
    assert_eq!(a.find(&sbx).await.expect("find"), None);
    a.delete(&sbx).await.expect("delete of missing succeeds");
    assert!(a.list(&inst).await.expect("list").is_empty());
    assert_eq!(
        a.capabilities(),
        [
            "exec",
            "exec.stream",
            "exec.stdin",
            "files",
            "lifecycle.pause",
            "snapshots",
            "warm",
            // The host has util-linux `setsid` (devhost needs it for a terminal).
            "exec.pty",
            "ports.expose"
        ]
        .map(String::from)
        .to_vec()
    );
    assert_eq!(a.isolation(), "none");
    a.health().await.expect("healthy");
}

#[tokio::test]
async fn exec_stdout_stderr_and_exit_code() {
    let (_root, a, at) = sandbox().await;
    let r = a.exec(&at, &sh("echo hi")).await.expect("exec");
    assert_eq!(
        (r.exit_code, r.stdout.as_str(), r.stderr.as_str()),
        (0, "hi\n", "")
    );

    let r = a
        .exec(&at, &sh("echo out; echo err >&2"))
        .await
        .expect("exec");
    assert_eq!((r.stdout.as_str(), r.stderr.as_str()), ("out\n", "err\n"));

    assert_eq!(a.exec(&at, &sh("exit 3")).await.expect("exec").exit_code, 3);
    assert_eq!(
        a.exec(&at, &sh("kill -9 $$"))
            .await
            .expect("exec")
            .exit_code,
        137
    );
}

#[tokio::test]
async fn exec_env_is_clean() {
    let (_root, a, at) = sandbox().await;
    let leak = format!("DIFFERENTLY_TEST_LEAK_{}", std::process::id());
    std::env::set_var(&leak, "leaked");
    let mut req = sh(&format!(r#"echo "$FOO|$LANG|$HOME|${{{leak}-unset}}""#));
    req.env.insert("FOO".into(), "bar".into());
    let r = a.exec(&at, &req).await.expect("exec");
    let home = a.sandbox_dir(&at.sandbox_id);
    assert_eq!(r.stdout, format!("bar|C.UTF-8|{}|unset\n", home.display()));
    // The request's env wins over the defaults.
    let mut req = sh(r#"echo "$LANG""#);
    req.env.insert("LANG".into(), "en_US.UTF-8".into());
    assert_eq!(
        a.exec(&at, &req).await.expect("exec").stdout,
        "en_US.UTF-8\n"
    );
}

/// Arguments or a variable longer than Linux passes to a program (`E2BIG`) are the request's
/// fault: an invalid field naming what to shorten, not a retryable failure that the API would
/// answer as the backend being unavailable.
#[tokio::test]
async fn exec_beyond_the_kernels_argument_limit_is_invalid_naming_the_field() {
    let (_root, a, at) = sandbox().await;
    let big = "x".repeat(200 * 1024);
    let mut req = sh("echo ${#BIG}");
    req.env.insert("BIG".into(), big.clone());
    let refusal = |e: AdapterError| match e {
        AdapterError::Permanent(r) => (r.field(), r.message().to_owned()),
        other => panic!("not a permanent refusal: {other:?}"),
    };
    let (field, message) = refusal(a.exec(&at, &req).await.expect_err("a 200 KiB variable"));
    assert_eq!(field, Some("env"), "{message}");
    assert!(message.contains("env BIG: too long"), "{message}");
    let (field, message) = refusal(
        a.exec(&at, &exec_req(&["echo", &big]))
            .await
            .expect_err("a 200 KiB argument"),
    );
    assert_eq!(field, Some("command"), "{message}");
    assert!(message.contains("an argument is too long"), "{message}");
    // Under the limit it runs.
    let mut req = sh("echo ${#BIG}");
    req.env.insert("BIG".into(), "x".repeat(100 * 1024));
    assert_eq!(a.exec(&at, &req).await.expect("exec").stdout, "102400\n");
}

#[tokio::test]
async fn exec_cwd_is_relative_to_the_sandbox() {
    let (_root, a, at) = sandbox().await;
    let dir = a.sandbox_dir(&at.sandbox_id);
    std::fs::create_dir_all(dir.join("work/sub")).expect("mkdir");

    let r = a.exec(&at, &exec_req(&["pwd"])).await.expect("exec");
    assert_eq!(r.stdout.trim_end(), dir.display().to_string());
    let mut req = exec_req(&["pwd"]);
    req.cwd = Some("/work/sub".into());
    let r = a.exec(&at, &req).await.expect("exec");
    assert_eq!(
        r.stdout.trim_end(),
        dir.join("work/sub").display().to_string()
    );

    req.cwd = Some("/work/../..".into());
    assert!(matches!(
        a.exec(&at, &req).await,
        Err(AdapterError::Permanent(_))
    ));
    req.cwd = Some("/nope".into());
    assert!(matches!(
        a.exec(&at, &req).await,
        Err(AdapterError::Permanent(_))
    ));
}

#[tokio::test]
async fn exec_stdin_is_delivered() {
    let (_root, a, at) = sandbox().await;
    let mut req = exec_req(&["cat"]);
    req.stdin = Some("line one\nline two".into());
    let r = a.exec(&at, &req).await.expect("exec");
    assert_eq!((r.exit_code, r.stdout.as_str()), (0, "line one\nline two"));
    // Without stdin the program sees EOF at once instead of hanging.
    let r = a.exec(&at, &exec_req(&["cat"])).await.expect("exec");
    assert_eq!((r.exit_code, r.stdout.as_str()), (0, ""));
}

/// Whether `pid` is gone (or a zombie waiting for its reaper).
fn process_gone(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[tokio::test]
async fn exec_timeout_kills_the_process_group() {
    let (_root, a, at) = sandbox().await;
    let mut req = sh("sleep 30 & echo $! > bg.pid; echo started; sleep 30");
    req.timeout_seconds = Some(1);
    let started = Instant::now();
    let r = a.exec(&at, &req).await.expect("exec");
    let took = started.elapsed();
    assert_eq!(r.exit_code, 124);
    assert_eq!(r.stdout, "started\n", "output before the timeout is kept");
    // Far below the 30 s the command would take: a bound a busy machine cannot break.
    assert!(took < Duration::from_secs(15), "took {took:?}");
    assert!(r.duration_ms >= 1000);

    let pid = std::fs::read_to_string(a.sandbox_dir(&at.sandbox_id).join("bg.pid")).expect("pid");
    let pid = pid.trim();
    let deadline = Instant::now() + Duration::from_secs(2);
    while !process_gone(pid) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(process_gone(pid), "background child {pid} survived");
}

#[tokio::test]
async fn exec_output_is_capped_at_one_mib() {
    let (_root, a, at) = sandbox().await;
    let r = a
        .exec(
            &at,
            &sh("head -c 3000000 /dev/zero | tr '\\0' a; echo small >&2"),
        )
        .await
        .expect("exec");
    assert_eq!(r.exit_code, 0);
    assert_eq!(r.stdout.len(), 1024 * 1024);
    assert!(r.stdout_truncated);
    assert_eq!(r.stderr, "small\n");
    assert!(!r.stderr_truncated);
}

#[tokio::test]
async fn exec_missing_program_and_missing_sandbox() {
    let (_root, a, at) = sandbox().await;
    let r = a
        .exec(&at, &exec_req(&["definitely-not-a-program-xyz"]))
        .await
        .expect("exec");
    assert_eq!(r.exit_code, 127);
    assert!(
        r.stderr.contains("definitely-not-a-program-xyz"),
        "{}",
        r.stderr
    );

    let gone = InstanceRef {
        sandbox_id: SandboxId::new(),
        backend_ref: "x".into(),
    };
    assert_eq!(
        a.exec(&gone, &exec_req(&["true"])).await,
        Err(AdapterError::NotFound)
    );
}

/// Set in the copy of this test binary that `commands_start_with_default_signal_dispositions`
/// starts with INT, QUIT and HUP ignored.
const SIGNALS_CHILD: &str = "DIFFERENTLY_DEVHOST_SIGNALS_CHILD";

/// A control plane started in the background (`differently dev &`, `nohup`) ignores INT, QUIT
/// or HUP; its commands must not inherit that (^C in `exec -it` would interrupt nothing).
/// The test runs itself again under a shell that ignores them, and checks there that a plain
/// child does inherit the ignore (so the check can fail) while a devhost command does not.
#[tokio::test]
async fn commands_start_with_default_signal_dispositions() {
    let script = "kill -INT $$; echo survived";
    if std::env::var_os(SIGNALS_CHILD).is_some() {
        let plain = std::process::Command::new("sh")
            .args(["-c", script])
            .output()
            .expect("sh");
        assert_eq!(
            String::from_utf8_lossy(&plain.stdout),
            "survived\n",
            "this process was meant to ignore INT"
        );
        let (_root, a, at) = sandbox().await;
        let r = a.exec(&at, &sh(script)).await.expect("exec");
        assert_eq!((r.exit_code, r.stdout.as_str()), (130, ""), "{r:?}");
        return;
    }
    let exe = std::env::current_exe().expect("the test binary");
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("trap '' INT QUIT HUP; exec \"$0\" \"$@\"")
        .arg(exe)
        .args([
            "--exact",
            "devhost::commands_start_with_default_signal_dispositions",
            "--nocapture",
        ])
        .env(SIGNALS_CHILD, "1")
        .output()
        .expect("run the test binary again");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("1 passed"),
        "the inner test did not run: {text}"
    );
}
