//! Opt-in run against a deployed Cloudflare Sandbox Bridge Worker. Ignored by default:
//!
//! ```text
//! DIFFERENTLY_TEST_CLOUDFLARE_BRIDGE_URL=https://<worker>.<account>.workers.dev \
//! DIFFERENTLY_TEST_CLOUDFLARE_API_KEY=<the bridge's SANDBOX_API_KEY> \
//!   [DIFFERENTLY_TEST_CLOUDFLARE_SETTINGS='{"ports":"public"}'] \
//!   cargo test -p differently-adapters --test cloudflare live -- --ignored --nocapture
//! ```
//!
//! It runs the conformance kit (which creates and deletes its own sandboxes), then one
//! sandbox through exec, stdin, a timeout and files, deleted at the end also when an
//! assertion fails half way (a guard deletes it). Containers bill while they run.

use std::time::Instant;

use differently_adapters::cloudflare::CloudflareAdapter;
use differently_adapters::Adapter;
use differently_core::ids::InstallationId;

use crate::support::{cases, live};
use crate::{adapter_of, at, cmd, create_req};

const URL_VAR: &str = "DIFFERENTLY_TEST_CLOUDFLARE_BRIDGE_URL";
const KEY_VAR: &str = "DIFFERENTLY_TEST_CLOUDFLARE_API_KEY";

fn adapter() -> CloudflareAdapter {
    live::required(
        [URL_VAR, KEY_VAR],
        &["DIFFERENTLY_TEST_CLOUDFLARE_SETTINGS"],
        "Cloudflare bridge",
    );
    let v = live::with_keys_from(
        serde_json::json!({"apiKeyEnv": KEY_VAR, "timeouts": {"requestSeconds": 120}}),
        &[(URL_VAR, "bridgeURL")],
    );
    adapter_of(live::with_settings_from(
        v,
        "DIFFERENTLY_TEST_CLOUDFLARE_SETTINGS",
    ))
}

#[tokio::test]
#[ignore = "needs a deployed bridge: DIFFERENTLY_TEST_CLOUDFLARE_BRIDGE_URL and _API_KEY"]
async fn live_bridge() {
    let a = adapter();
    let t = Instant::now();
    a.health().await.expect("health");
    live::done("health", t);

    let t = Instant::now();
    let report = crate::support::conformance::passes(&a).await;
    eprintln!("{}", report.table());
    live::done("conformance", t);

    let t = Instant::now();
    let made = a
        .create(&create_req(&InstallationId::new()))
        .await
        .expect("create");
    let by_hand = format!("destroy the bridge sandbox of {} by hand", made.sandbox_id);
    let _cleanup = live::Cleanup::new(&a, vec![made.sandbox_id.clone()], by_hand);
    let r = at(&made);
    live::done("create", t);

    let t = Instant::now();
    let mut req = cmd(&["sh", "-c", "cat; echo \"$SANDBOX_VAR\"; whoami >&2"]);
    req.stdin = Some("from stdin\n".into());
    let res = a.exec(&r, &req).await.expect("exec");
    assert_eq!(res.exit_code, 0);
    assert_eq!(res.stdout, "from stdin\nfrom-create\n");
    eprintln!("commands run as {}", res.stderr.trim());
    live::done("exec", t);

    let t = Instant::now();
    cases::exec_timeout_is_124_and_a_missing_cwd_names_the_field(&a, &r).await;
    live::done("exec timeout and cwd", t);

    let t = Instant::now();
    cases::files_round_trip(&a, &r, "/workspace").await;
    cases::files_round_trip(&a, &r, "/tmp").await;
    live::done("files", t);
}
