//! The same scenario against a real Vercel team. Opt in with `DIFFERENTLY_TEST_VERCEL_TOKEN`,
//! `DIFFERENTLY_TEST_VERCEL_TEAM_ID` and `DIFFERENTLY_TEST_VERCEL_PROJECT_ID`, then
//! `cargo test -p differently-adapters --test vercel -- --ignored live`. Optional:
//! `DIFFERENTLY_TEST_VERCEL_SETTINGS` (JSON merged into the pool settings). The run creates one
//! sandbox and deletes it; it costs a few sandbox-minutes.
//!
//! The scenario also runs against the fake on every `cargo test`.

use std::time::{Duration, Instant};

use differently_adapters::vercel::{VercelAdapter, VercelConfig};
use differently_adapters::{Adapter, InstanceState};
use differently_core::ids::InstallationId;

use crate::support::cases::files_round_trip;
use crate::support::live::{self, done};
use crate::{at, cmd, create_req, setup, token_file};

async fn scenario(a: &VercelAdapter, dir: &str) {
    let inst = InstallationId::new();
    let req = create_req(&inst);
    let t = Instant::now();
    let i = a.create(&req).await.expect("create");
    assert_eq!(
        a.create(&req).await.expect("again").backend_ref,
        i.backend_ref
    );
    let r = at(&i);
    assert_eq!(a.list(&inst).await.expect("list").len(), 1);
    done("create", t);

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
    let mut input = cmd(&["cat"]);
    input.stdin = Some("in".into());
    assert_eq!(a.exec(&r, &input).await.expect("stdin").stdout, "in");
    done("exec", t);

    let t = Instant::now();
    files_round_trip(a, &r, dir).await;
    done("files", t);

    if a.settings().persistent {
        let t = Instant::now();
        a.stop(&r).await.expect("stop");
        a.stop(&r).await.expect("stop again");
        let st = a
            .find(&req.sandbox_id)
            .await
            .expect("find")
            .map(|f| f.state);
        assert_eq!(st, Some(InstanceState::Stopped));
        a.start(&r).await.expect("start");
        assert_eq!(
            a.exec(&r, &cmd(&["true"])).await.expect("exec").exit_code,
            0
        );
        done("stop/start", t);
    }

    let t = Instant::now();
    a.renew(&r, Duration::from_secs(900)).await.expect("renew");
    a.health().await.expect("health");
    a.delete(&req.sandbox_id).await.expect("delete");
    a.delete(&req.sandbox_id).await.expect("delete again");
    assert_eq!(a.find(&req.sandbox_id).await.expect("find"), None);
    done("delete", t);
}

#[tokio::test]
#[ignore = "live: set DIFFERENTLY_TEST_VERCEL_TOKEN, DIFFERENTLY_TEST_VERCEL_TEAM_ID and DIFFERENTLY_TEST_VERCEL_PROJECT_ID and run with --ignored"]
async fn live_vercel() {
    let [token, team, project] = live::required(
        [
            "DIFFERENTLY_TEST_VERCEL_TOKEN",
            "DIFFERENTLY_TEST_VERCEL_TEAM_ID",
            "DIFFERENTLY_TEST_VERCEL_PROJECT_ID",
        ],
        &["DIFFERENTLY_TEST_VERCEL_SETTINGS"],
        "Vercel",
    );
    let token = token_file(&token);
    let settings = live::with_settings_from(
        serde_json::json!({
            "teamId": team, "projectId": project, "tokenFile": token.path(),
            "timeouts": {"readySeconds": 180},
        }),
        "DIFFERENTLY_TEST_VERCEL_SETTINGS",
    );
    let cfg: VercelConfig = serde_json::from_value(settings).expect("settings");
    let a = VercelAdapter::new(cfg).expect("adapter");
    scenario(&a, "/vercel/sandbox").await;
}

#[tokio::test]
async fn live_scenario_against_the_fake() {
    let s = setup(serde_json::json!({})).await;
    let dir = tempfile::tempdir().unwrap();
    scenario(&s.adapter, &dir.path().display().to_string()).await;
}
