//! Opt-in run of every adapter method against a real cluster with agent-sandbox installed (a
//! kind cluster is enough: the controller, the extensions, the sandbox router, and a
//! SandboxWarmPool of `examples/python-runtime-sandbox` whose template allows env injection).
//! Ignored by default:
//!
//! ```text
//! DIFFERENTLY_TEST_K8S_API_URL=https://127.0.0.1:6443 \
//! DIFFERENTLY_TEST_K8S_TOKEN=$(kubectl create token differently -n sandboxes) \
//! DIFFERENTLY_TEST_K8S_WARM_POOL=python-sandbox-warmpool \
//!   [DIFFERENTLY_TEST_K8S_NAMESPACE=default] [DIFFERENTLY_TEST_K8S_CA_BUNDLE=/path/ca.crt] \
//!   [DIFFERENTLY_TEST_K8S_SETTINGS='{"runtime": {"routerURL": "http://127.0.0.1:8080"}}'] \
//!   cargo test -p differently-adapters --test agent_sandbox live -- --ignored --nocapture
//! ```
//!
//! The router must be reachable from where the test runs (`kubectl port-forward
//! svc/sandbox-router-svc 8080:8080`, then `runtime.routerURL` as above). The claims it makes
//! carry a fresh installation id and are deleted at the end, also when an assertion fails.

use std::time::Instant;

use differently_adapters::agent_sandbox::{AgentSandboxAdapter, AgentSandboxConfig};
use differently_adapters::{Adapter, InstanceState};
use differently_core::ids::InstallationId;

use crate::support::{cases, live};
use crate::{at, cmd, create_req};

fn adapter() -> AgentSandboxAdapter {
    live::required(
        [
            "DIFFERENTLY_TEST_K8S_API_URL",
            "DIFFERENTLY_TEST_K8S_TOKEN",
            "DIFFERENTLY_TEST_K8S_WARM_POOL",
        ],
        &[
            "DIFFERENTLY_TEST_K8S_NAMESPACE",
            "DIFFERENTLY_TEST_K8S_CA_BUNDLE",
            "DIFFERENTLY_TEST_K8S_SETTINGS",
        ],
        "agent-sandbox",
    );
    let v = live::with_keys_from(
        serde_json::json!({"tokenEnv": "DIFFERENTLY_TEST_K8S_TOKEN", "timeouts": {"readySeconds": 300}}),
        &[
            ("DIFFERENTLY_TEST_K8S_API_URL", "apiServerURL"),
            ("DIFFERENTLY_TEST_K8S_WARM_POOL", "warmPool"),
            ("DIFFERENTLY_TEST_K8S_NAMESPACE", "namespace"),
            ("DIFFERENTLY_TEST_K8S_CA_BUNDLE", "caBundle"),
        ],
    );
    let v = live::with_settings_from(v, "DIFFERENTLY_TEST_K8S_SETTINGS");
    let cfg: AgentSandboxConfig = serde_json::from_value(v).unwrap();
    AgentSandboxAdapter::new(cfg).unwrap()
}

#[tokio::test]
#[ignore = "live: set DIFFERENTLY_TEST_K8S_API_URL, _TOKEN and _WARM_POOL and run with --ignored (see tests/agent_sandbox/live.rs)"]
async fn live_agent_sandbox_runs_every_method() {
    let adapter = adapter();
    let t = Instant::now();
    adapter.health().await.unwrap();
    live::done("health", t);
    let installation = InstallationId::new();
    let by_hand = "delete the claims labelled differently-sandbox-id by hand";
    let mut guard = live::Cleanup::new(&adapter, Vec::new(), by_hand);

    // Without env: adopted from the warm pool.
    let mut warm = create_req(&installation);
    warm.env.clear();
    guard.sandboxes.push(warm.sandbox_id.clone());
    let t = Instant::now();
    let inst = adapter.create(&warm).await.unwrap();
    live::done("create from the warm pool", t);
    assert_eq!(inst.state, InstanceState::Running);
    assert_eq!(
        adapter
            .exec(&at(&inst), &cmd(&["true"]))
            .await
            .unwrap()
            .exit_code,
        0
    );

    // With env: cold-started (the template must allow env injection).
    let cold = create_req(&installation);
    guard.sandboxes.push(cold.sandbox_id.clone());
    let t = Instant::now();
    let inst = adapter.create(&cold).await.unwrap();
    live::done("create with env (cold)", t);
    assert_eq!(
        adapter.create(&cold).await.unwrap().backend_ref,
        inst.backend_ref
    );
    let r = at(&inst);
    assert_eq!(adapter.list(&installation).await.unwrap().len(), 2);

    let t = Instant::now();
    let mut req = cmd(&["sh", "-c", "printf '%s' \"$SANDBOX_VAR $X\"; exit 3"]);
    req.env.insert("X".into(), "it's".into());
    let out = adapter.exec(&r, &req).await.unwrap();
    assert_eq!(
        (out.exit_code, out.stdout.as_str()),
        (3, "from-create it's")
    );
    cases::exec_timeout_is_124_and_a_missing_cwd_names_the_field(&adapter, &r).await;
    live::done("exec", t);

    let base = adapter.settings().base_dir.clone();
    let t = Instant::now();
    cases::files_round_trip(&adapter, &r, if base == "/" { "/tmp" } else { &base }).await;
    live::done("files", t);

    adapter
        .renew(&r, std::time::Duration::from_secs(900))
        .await
        .unwrap();
    let ids = std::mem::take(&mut guard.sandboxes);
    drop(guard);
    for id in ids {
        assert!(adapter.find(&id).await.unwrap().is_none());
    }
}
