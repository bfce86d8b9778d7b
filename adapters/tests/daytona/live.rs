//! Opt-in run of every adapter method against a real Daytona account. Ignored by default:
//!
//! ```text
//! DIFFERENTLY_TEST_DAYTONA_API_KEY=dtn_… \
//!   [DIFFERENTLY_TEST_DAYTONA_API_URL=https://app.daytona.io/api] \
//!   [DIFFERENTLY_TEST_DAYTONA_TOOLBOX_URL=https://proxy.app.daytona.io/toolbox] \
//!   [DIFFERENTLY_TEST_DAYTONA_TARGET=us] \
//!   cargo test -p differently-adapters --test daytona live -- --ignored --nocapture
//! ```
//!
//! It creates one sandbox (and one snapshot) labelled with a fresh installation id and
//! deletes both at the end, also when an assertion fails half way (a guard deletes them).
//! It spends the account's credits for a few minutes.

use std::time::Duration;

use bytes::Bytes;
use differently_adapters::daytona::DaytonaAdapter;
use differently_adapters::{Adapter, AdapterError, ByteStream, ExecEvent, InstanceState};
use differently_core::ids::InstallationId;
use futures::StreamExt;

use crate::support::live;
use crate::{at, cmd, create_req};

const KEY_VAR: &str = "DIFFERENTLY_TEST_DAYTONA_API_KEY";

fn adapter() -> DaytonaAdapter {
    live::keyed_adapter(
        "Daytona",
        KEY_VAR,
        300,
        &[
            ("DIFFERENTLY_TEST_DAYTONA_API_URL", "apiURL"),
            ("DIFFERENTLY_TEST_DAYTONA_TOOLBOX_URL", "toolboxURL"),
            ("DIFFERENTLY_TEST_DAYTONA_TARGET", "target"),
        ],
        DaytonaAdapter::new,
    )
}

#[tokio::test]
#[ignore = "live: set DIFFERENTLY_TEST_DAYTONA_API_KEY and run with --ignored (see tests/daytona/live.rs)"]
async fn live_daytona_runs_every_method() {
    let adapter = adapter();
    adapter.health().await.unwrap();
    let installation = InstallationId::new();
    let req = create_req(&installation);
    let by_hand = format!("delete the sandbox labelled {} by hand", req.sandbox_id);
    let mut guard =
        live::Cleanup::new(&adapter, vec![req.sandbox_id.clone()], by_hand).retrying(20);
    let inst = adapter.create(&req).await.unwrap();
    assert_eq!(inst.state, InstanceState::Running);
    assert_eq!(
        adapter.create(&req).await.unwrap().backend_ref,
        inst.backend_ref
    );
    let i = at(&inst);
    let listed = adapter.list(&installation).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");

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

    let body: ByteStream = Box::pin(futures::stream::once(async {
        Ok::<_, AdapterError>(Bytes::from_static(b"live"))
    }));
    adapter
        .upload(&i, "/tmp/differently-live.txt", Some(0o600), body)
        .await
        .unwrap();
    let d = adapter
        .download(&i, "/tmp/differently-live.txt", None)
        .await
        .unwrap();
    let bytes: Vec<u8> = d.body.map(|c| c.unwrap().to_vec()).concat().await;
    assert_eq!(bytes, b"live");
    let listing = adapter.list_files(&i, "/tmp", 1).await.unwrap();
    let f = listing
        .iter()
        .find(|e| e.path == "/tmp/differently-live.txt")
        .unwrap();
    assert_eq!(f.mode, 0o600);
    adapter
        .delete_file(&i, "/tmp/differently-live.txt")
        .await
        .unwrap();

    let port = adapter.expose_port(&i, 3000, None).await.unwrap();
    println!(
        "signed preview URL: {}",
        port.url.split('?').next().unwrap_or("")
    );

    let snap_id = format!("snp_live{}", chrono::Utc::now().timestamp());
    let mut snap = adapter.snapshot(&i, &snap_id).await.unwrap();
    guard.snapshot = Some(snap.backend_ref.clone());
    for _ in 0..60 {
        if snap.ready {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        snap = adapter.snapshot(&i, &snap_id).await.unwrap();
    }
    assert!(snap.ready, "snapshot not active after 2 minutes");

    adapter.stop(&i).await.unwrap();
    adapter.start(&i).await.unwrap();
    assert_eq!(
        adapter.exec(&i, &cmd(&["true"])).await.unwrap().exit_code,
        0
    );
    drop(guard);
    assert!(adapter.find(&req.sandbox_id).await.unwrap().is_none());
}
