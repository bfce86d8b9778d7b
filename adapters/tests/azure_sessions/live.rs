//! Opt-in run of every adapter method against a real Azure `Shell` session pool. Ignored by
//! default:
//!
//! ```text
//! DIFFERENTLY_TEST_AZURE_SESSIONS_ENDPOINT=https://<region>.dynamicsessions.io/subscriptions/…/sessionPools/<pool> \
//! DIFFERENTLY_TEST_AZURE_SESSIONS_TOKEN=$(az account get-access-token --resource https://dynamicsessions.io --query accessToken -o tsv) \
//!   cargo test -p differently-adapters --test azure_sessions live -- --ignored --nocapture
//! ```
//!
//! The token's identity needs the Azure ContainerApps Session Executor role on the pool. It
//! allocates one session with a fresh installation id and deletes it at the end, also when an
//! assertion fails half way (a guard deletes it); sessions are billed while allocated.

use std::time::Instant;

use differently_adapters::azure_sessions::{AzureSessionsAdapter, AzureSessionsConfig};
use differently_adapters::{Adapter, AdapterError, InstanceState};
use differently_core::ids::InstallationId;

use crate::support::{cases, live};
use crate::{at, cmd, create_req};

const ENDPOINT_VAR: &str = "DIFFERENTLY_TEST_AZURE_SESSIONS_ENDPOINT";
const TOKEN_VAR: &str = "DIFFERENTLY_TEST_AZURE_SESSIONS_TOKEN";

fn adapter() -> AzureSessionsAdapter {
    // The endpoint is the Shell pool's poolManagementEndpoint; the token an Entra token for
    // https://dynamicsessions.io.
    let [endpoint, _] = live::required(
        [ENDPOINT_VAR, TOKEN_VAR],
        &["DIFFERENTLY_TEST_AZURE_SESSIONS_SETTINGS (JSON merged over the settings)"],
        "Azure dynamic sessions",
    );
    let v = live::with_settings_from(
        serde_json::json!({
            "poolManagementEndpoint": endpoint,
            "tokenEnv": TOKEN_VAR,
        }),
        "DIFFERENTLY_TEST_AZURE_SESSIONS_SETTINGS",
    );
    let cfg: AzureSessionsConfig = serde_json::from_value(v).unwrap();
    AzureSessionsAdapter::new(cfg).unwrap()
}

#[tokio::test]
#[ignore = "live: set DIFFERENTLY_TEST_AZURE_SESSIONS_ENDPOINT and _TOKEN and run with --ignored (see tests/azure_sessions/live.rs)"]
async fn live_azure_sessions_runs_every_method() {
    let adapter = adapter();
    let t = Instant::now();
    adapter.health().await.unwrap();
    live::done("health", t);
    let installation = InstallationId::new();
    let req = create_req(&installation);
    let by_hand = format!("delete the session of {} by hand", req.sandbox_id);
    let _guard = live::Cleanup::new(&adapter, vec![req.sandbox_id.clone()], by_hand).retrying(10);
    let t = Instant::now();
    let inst = adapter.create(&req).await.unwrap();
    assert_eq!(inst.state, InstanceState::Running);
    assert_eq!(
        adapter.create(&req).await.unwrap().backend_ref,
        inst.backend_ref
    );
    live::done("create", t);
    let i = at(&inst);
    let listed = adapter.list(&installation).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");

    let t = Instant::now();
    let mut r = cmd(&[
        "sh",
        "-c",
        "printf '%s' \"$SANDBOX_VAR $X\"; echo e >&2; exit 3",
    ]);
    r.env.insert("X".into(), "it's".into());
    let out = adapter.exec(&i, &r).await.unwrap();
    assert_eq!(
        (out.exit_code, out.stdout.as_str(), out.stderr.as_str()),
        (3, "from-create it's", "e\n")
    );
    let mut stdin = cmd(&["cat"]);
    stdin.stdin = Some("a\nb".into());
    assert_eq!(adapter.exec(&i, &stdin).await.unwrap().stdout, "a\nb");
    let mut slow = cmd(&["sleep", "20"]);
    slow.timeout_seconds = Some(2);
    assert_eq!(adapter.exec(&i, &slow).await.unwrap().exit_code, 124);
    live::done("exec", t);

    let t = Instant::now();
    cases::files_round_trip(&adapter, &i, "/tmp").await;
    live::done("files", t);

    adapter.delete(&req.sandbox_id).await.unwrap();
    assert!(adapter.find(&req.sandbox_id).await.unwrap().is_none());
    assert_eq!(
        adapter.exec(&i, &cmd(&["true"])).await.unwrap_err(),
        AdapterError::NotFound
    );
}
