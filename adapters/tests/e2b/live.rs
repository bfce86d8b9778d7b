//! The same scenario against a real E2B account. Opt in with `DIFFERENTLY_TEST_E2B_API_KEY`,
//! then `cargo test -p differently-adapters --test e2b -- --ignored live`. Optional:
//! `DIFFERENTLY_TEST_E2B_SETTINGS` (JSON merged into the pool settings, e.g.
//! `{"template":"base","maxTimeoutSeconds":86400}`). The run creates two sandboxes and one
//! snapshot on the account and removes them at the end; it costs a few sandbox-minutes.
//!
//! The scenario also runs against the fake on every `cargo test`, so the live test's own
//! code is known to work before anyone spends an account on it.

use std::time::{Duration, Instant};

use differently_adapters::e2b::{E2bAdapter, E2bConfig};
use differently_adapters::{Adapter, AdapterError, InstanceState};
use differently_core::ids::InstallationId;

use crate::support::cases::files_round_trip;
use crate::support::live::{self, done};
use crate::{at, cmd, create_req, key_file, setup};

/// Every adapter method once, against whatever E2B `a` talks to; files go under `dir`.
async fn scenario(a: &E2bAdapter, dir: &str) {
    let inst = InstallationId::new();
    let req = create_req(&inst);

    let t = Instant::now();
    let i = a.create(&req).await.expect("create");
    let again = a.create(&req).await.expect("create again");
    assert_eq!(i.backend_ref, again.backend_ref, "create is idempotent");
    let r = at(&i);
    done("create", t);

    let t = Instant::now();
    let found = a.find(&req.sandbox_id).await.expect("find");
    assert_eq!(found.map(|f| f.backend_ref), Some(i.backend_ref.clone()));
    let listed = a.list(&inst).await.expect("list");
    assert_eq!(listed.len(), 1, "{listed:?}");
    done("find/list", t);

    let t = Instant::now();
    let res = a
        .exec(
            &r,
            &cmd(&["bash", "-c", "echo $SANDBOX_VAR; echo err >&2; exit 7"]),
        )
        .await
        .expect("exec");
    assert_eq!(
        (res.exit_code, res.stdout.as_str(), res.stderr.as_str()),
        (7, "from-create\n", "err\n")
    );
    let mut slow = cmd(&["sleep", "30"]);
    slow.timeout_seconds = Some(2);
    assert_eq!(a.exec(&r, &slow).await.expect("timeout").exit_code, 124);
    let mut bad = cmd(&["pwd"]);
    bad.cwd = Some("/nonexistent/differently".into());
    let e = a.exec(&r, &bad).await.expect_err("bad cwd");
    assert!(
        matches!(&e, AdapterError::Permanent(m) if m.field() == Some("cwd")),
        "{e:?}"
    );
    let (tx, mut rx) = tokio::sync::mpsc::channel(8);
    let two = cmd(&["bash", "-c", "echo 1; sleep 0.2; echo 2"]);
    let stream = a.exec_stream(&r, &two, tx);
    let read = async {
        let mut n = 0;
        while rx.recv().await.is_some() {
            n += 1;
        }
        n
    };
    let (exit, pieces) = tokio::join!(stream, read);
    assert_eq!(exit.expect("stream").exit_code, 0);
    assert!(pieces >= 1);
    done("exec", t);

    let t = Instant::now();
    files_round_trip(a, &r, dir).await;
    done("files", t);

    let t = Instant::now();
    a.pause(&r).await.expect("pause");
    a.pause(&r).await.expect("pause again");
    let state = a
        .find(&req.sandbox_id)
        .await
        .expect("find")
        .map(|f| f.state);
    assert_eq!(state, Some(InstanceState::Paused));
    a.resume(&r).await.expect("resume");
    assert_eq!(
        a.exec(&r, &cmd(&["true"])).await.expect("exec").exit_code,
        0
    );
    done("pause/resume", t);

    let t = Instant::now();
    let snap = a
        .snapshot(&r, "snp_01JLIVETESTSNAP")
        .await
        .expect("snapshot");
    assert_eq!(
        a.snapshot(&r, "snp_01JLIVETESTSNAP").await.expect("again"),
        snap
    );
    let mut from = create_req(&inst);
    from.env.clear();
    from.from_snapshot = Some(snap.backend_ref.clone());
    let restored = a.create(&from).await.expect("restore");
    let out = a
        .exec(&at(&restored), &cmd(&["bash", "-c", "echo $SANDBOX_VAR"]))
        .await
        .expect("exec in restore");
    assert_eq!(out.exit_code, 0);
    a.delete(&from.sandbox_id).await.expect("delete restore");
    a.delete_snapshot(&snap.backend_ref)
        .await
        .expect("delete snapshot");
    done("snapshots", t);

    let t = Instant::now();
    a.renew(&r, Duration::from_secs(600)).await.expect("renew");
    a.health().await.expect("health");
    a.delete(&req.sandbox_id).await.expect("delete");
    a.delete(&req.sandbox_id).await.expect("delete again");
    assert_eq!(a.find(&req.sandbox_id).await.expect("find"), None);
    done("delete", t);
}

#[tokio::test]
#[ignore = "live: set DIFFERENTLY_TEST_E2B_API_KEY and run with --ignored"]
async fn live_e2b() {
    let [key] = live::required(
        ["DIFFERENTLY_TEST_E2B_API_KEY"],
        &["DIFFERENTLY_TEST_E2B_SETTINGS"],
        "E2B",
    );
    let key = key_file(&key);
    let settings = live::with_settings_from(
        serde_json::json!({
            "apiKeyFile": key.path(),
            "timeouts": {"readySeconds": 120, "createSeconds": 300},
        }),
        "DIFFERENTLY_TEST_E2B_SETTINGS",
    );
    let cfg: E2bConfig = serde_json::from_value(settings).expect("settings");
    let a = E2bAdapter::new(cfg).expect("adapter");
    scenario(&a, "/home/user").await;
}

#[tokio::test]
async fn live_scenario_against_the_fake() {
    let s = setup(serde_json::json!({})).await;
    let dir = tempfile::tempdir().unwrap();
    scenario(&s.adapter, &dir.path().display().to_string()).await;
}
