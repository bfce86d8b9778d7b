//! Opt-in run of every adapter method, then the conformance kit, against a real Runloop
//! account. Ignored by default:
//!
//! ```text
//! DIFFERENTLY_TEST_RUNLOOP_API_KEY=ak_… \
//!   [DIFFERENTLY_TEST_RUNLOOP_API_URL=https://api.runloop.ai] \
//!   [DIFFERENTLY_TEST_RUNLOOP_BLUEPRINT=<blueprint id or name>] \
//!   cargo test -p differently-adapters --test runloop live -- --ignored --nocapture
//! ```
//!
//! It creates devboxes (and one disk snapshot) tagged with fresh ids and shuts them down at
//! the end, also when an assertion fails half way (a guard deletes them). It spends the
//! account's credits for a few minutes. Per-case timings are printed.

use std::time::{Duration, Instant};

use bytes::Bytes;
use differently_adapters::runloop::RunloopAdapter;
use differently_adapters::{Adapter, AdapterError, ByteStream, ExecEvent, InstanceState};
use differently_core::ids::InstallationId;
use futures::StreamExt;

use crate::support::live;
use crate::{at, cmd, create_req};

const KEY_VAR: &str = "DIFFERENTLY_TEST_RUNLOOP_API_KEY";

fn adapter() -> RunloopAdapter {
    live::keyed_adapter(
        "Runloop",
        KEY_VAR,
        600,
        &[
            ("DIFFERENTLY_TEST_RUNLOOP_API_URL", "apiURL"),
            ("DIFFERENTLY_TEST_RUNLOOP_BLUEPRINT", "blueprint"),
        ],
        RunloopAdapter::new,
    )
}

#[tokio::test]
#[ignore = "live: set DIFFERENTLY_TEST_RUNLOOP_API_KEY and run with --ignored (see tests/runloop/live.rs)"]
async fn live_runloop_runs_every_method() {
    let adapter = adapter();
    let t = Instant::now();
    adapter.health().await.unwrap();
    live::done("health", t);
    let installation = InstallationId::new();
    let req = create_req(&installation);
    let by_hand = format!("shut down the devbox tagged {} by hand", req.sandbox_id);
    // A snapshot still being written refuses the shutdown for a while: many attempts.
    let mut guard =
        live::Cleanup::new(&adapter, vec![req.sandbox_id.clone()], by_hand).retrying(40);
    let t = Instant::now();
    let inst = adapter.create(&req).await.unwrap();
    assert_eq!(inst.state, InstanceState::Running);
    assert_eq!(
        adapter.create(&req).await.unwrap().backend_ref,
        inst.backend_ref
    );
    live::done("create (and again)", t);
    let i = at(&inst);
    let listed = adapter.list(&installation).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");

    let t = Instant::now();
    let mut r = cmd(&["sh", "-c", "printf '%s' \"$SANDBOX_VAR $X\"; exit 3"]);
    r.env.insert("X".into(), "it's".into());
    let out = adapter.exec(&i, &r).await.unwrap();
    assert_eq!(
        (out.exit_code, out.stdout.as_str()),
        (3, "from-create it's")
    );
    let mut slow = cmd(&["sleep", "20"]);
    slow.timeout_seconds = Some(2);
    assert_eq!(adapter.exec(&i, &slow).await.unwrap().exit_code, 124);
    let (tx, mut rx) = tokio::sync::mpsc::channel(8);
    let streamed = cmd(&["sh", "-c", "echo a; sleep 1; echo b >&2"]);
    let (exit, events) = tokio::join!(adapter.exec_stream(&i, &streamed, tx), async {
        let mut v = Vec::new();
        while let Some(e) = rx.recv().await {
            v.push(e);
        }
        v
    });
    assert_eq!(exit.unwrap().exit_code, 0);
    assert!(
        events.iter().any(|e| matches!(e, ExecEvent::Stderr(_))),
        "{events:?}"
    );
    live::done("exec, timeout, stream", t);

    let t = Instant::now();
    let body: ByteStream = Box::pin(futures::stream::once(async {
        Ok::<_, AdapterError>(Bytes::from_static(b"live"))
    }));
    let path = "/tmp/differently-live/file.txt";
    adapter.upload(&i, path, Some(0o600), body).await.unwrap();
    let d = adapter.download(&i, path, None).await.unwrap();
    let bytes: Vec<u8> = d.body.map(|c| c.unwrap().to_vec()).concat().await;
    assert_eq!(bytes, b"live");
    let listing = adapter
        .list_files(&i, "/tmp/differently-live", 1)
        .await
        .unwrap();
    let f = listing.iter().find(|e| e.path == path).unwrap();
    assert_eq!(f.mode, 0o600);
    adapter.delete_file(&i, path).await.unwrap();
    assert!(matches!(
        adapter.download(&i, path, None).await.err(),
        Some(AdapterError::PathNotFound(_))
    ));
    live::done("files", t);

    let t = Instant::now();
    let port = adapter.expose_port(&i, 3000, None).await.unwrap();
    println!(
        "tunnel URL host: {}",
        port.url.split('/').nth(2).unwrap_or("")
    );
    live::done("ports", t);

    let t = Instant::now();
    let snap_id = format!("snp_live{}", chrono::Utc::now().timestamp());
    let mut snap = adapter.snapshot(&i, &snap_id).await.unwrap();
    guard.snapshot = Some(snap.backend_ref.clone());
    for _ in 0..90 {
        if snap.ready {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        snap = adapter.snapshot(&i, &snap_id).await.unwrap();
    }
    assert!(snap.ready, "snapshot not complete after 3 minutes");
    live::done("snapshot", t);

    let t = Instant::now();
    adapter.stop(&i).await.unwrap();
    adapter.start(&i).await.unwrap();
    assert_eq!(
        adapter.exec(&i, &cmd(&["true"])).await.unwrap().exit_code,
        0
    );
    live::done("suspend and resume", t);
    drop(guard);
    assert!(adapter.find(&req.sandbox_id).await.unwrap().is_none());
}

#[tokio::test]
#[ignore = "live: set DIFFERENTLY_TEST_RUNLOOP_API_KEY and run with --ignored (see tests/runloop/live.rs)"]
async fn live_runloop_passes_the_conformance_kit() {
    let adapter = adapter();
    let t = Instant::now();
    let report = crate::support::conformance::passes(&adapter).await;
    eprintln!("{}", report.table());
    live::done("conformance kit", t);
}
