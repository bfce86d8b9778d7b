//! Opt-in run of every adapter method against a real Freestyle account. Ignored by default:
//!
//! ```text
//! DIFFERENTLY_TEST_FREESTYLE_API_KEY=… [DIFFERENTLY_TEST_FREESTYLE_API_URL=https://api.freestyle.sh] \
//!   cargo test -p differently-adapters --test freestyle live -- --ignored --nocapture
//! ```
//!
//! It creates one VM labelled with a fresh installation id and deletes it at the end, also
//! when an assertion fails half way.

use bytes::Bytes;
use differently_adapters::freestyle::FreestyleAdapter;
use differently_adapters::{Adapter, AdapterError, ByteStream, InstanceState};
use differently_core::ids::InstallationId;
use futures::StreamExt;

use crate::support::live;
use crate::{at, cmd, create_req};

const KEY_VAR: &str = "DIFFERENTLY_TEST_FREESTYLE_API_KEY";

#[tokio::test]
#[ignore = "live: set DIFFERENTLY_TEST_FREESTYLE_API_KEY and run with --ignored (see tests/freestyle/live.rs)"]
async fn live_freestyle_runs_every_method() {
    let adapter = live::keyed_adapter(
        "Freestyle",
        KEY_VAR,
        300,
        &[("DIFFERENTLY_TEST_FREESTYLE_API_URL", "apiURL")],
        FreestyleAdapter::new,
    );
    adapter.health().await.unwrap();
    let installation = InstallationId::new();
    let req = create_req(&installation);
    let by_hand = format!("delete the VM with slug of {} by hand", req.sandbox_id);
    let guard = live::Cleanup::new(&adapter, vec![req.sandbox_id.clone()], by_hand);
    let inst = adapter.create(&req).await.unwrap();
    assert_eq!(inst.state, InstanceState::Running);
    assert_eq!(
        adapter.create(&req).await.unwrap().backend_ref,
        inst.backend_ref
    );
    assert_eq!(adapter.list(&installation).await.unwrap().len(), 1);
    let i = at(&inst);

    let r = adapter
        .exec(
            &i,
            &cmd(&["sh", "-c", "printf %s \"$SANDBOX_VAR\"; echo e >&2; exit 3"]),
        )
        .await
        .unwrap();
    assert_eq!(
        (r.exit_code, r.stdout.as_str(), r.stderr.as_str()),
        (3, "from-create", "e\n")
    );
    let mut slow = cmd(&["sleep", "20"]);
    slow.timeout_seconds = Some(2);
    assert_eq!(adapter.exec(&i, &slow).await.unwrap().exit_code, 124);

    let body: ByteStream = Box::pin(futures::stream::once(async {
        Ok::<_, AdapterError>(Bytes::from_static(b"live"))
    }));
    adapter
        .upload(&i, "/root/differently-live.txt", Some(0o640), body)
        .await
        .unwrap();
    let d = adapter
        .download(&i, "/root/differently-live.txt", None)
        .await
        .unwrap();
    let bytes: Vec<u8> = d.body.map(|c| c.unwrap().to_vec()).concat().await;
    assert_eq!(bytes, b"live");
    let listed = adapter.list_files(&i, "/root", 1).await.unwrap();
    let f = listed
        .iter()
        .find(|e| e.path == "/root/differently-live.txt")
        .unwrap();
    assert_eq!(f.mode, 0o640);
    adapter
        .delete_file(&i, "/root/differently-live.txt")
        .await
        .unwrap();

    adapter.pause(&i).await.unwrap();
    adapter.resume(&i).await.unwrap();
    adapter.stop(&i).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(10)).await;
    assert_eq!(
        adapter.find(&req.sandbox_id).await.unwrap().unwrap().state,
        InstanceState::Stopped,
        "a powered-off VM stays off"
    );
    adapter.start(&i).await.unwrap();
    assert_eq!(
        adapter.exec(&i, &cmd(&["true"])).await.unwrap().exit_code,
        0
    );
    drop(guard);
    assert!(adapter.find(&req.sandbox_id).await.unwrap().is_none());
}
