//! End-to-end tests: the real `differently` binary as separate OS processes (api, scheduler,
//! worker) on a real Postgres database and a real nats-server ≥ 2.10, with the `fake`
//! backend's cross-process ledger as the witness of every backend call.
#![allow(clippy::unwrap_used)] // test helpers may panic: that is how a test fails

mod harness;

mod audit;
mod audit_chain;
mod audit_keys;
mod bad_input;
mod bus_hang;
mod cli_offline;
mod client_cli;
mod client_cli_dev;
mod client_cli_warm;
mod client_cli_webhooks;
mod crash;
mod dataplane;
mod deploy_metrics;
mod dev;
mod dev_webhooks;
mod devhost_files;
mod docs_paths;
mod e2b_code_interpreter;
mod e2b_facade;
mod e2b_facade_bench;
mod e2b_facade_osb;
mod e2b_facade_processes;
mod env_at_rest;
mod exec_held;
/// The adapters' test HTTP scaffolding, which their fake servers (included below) use as
/// `crate::support::http`.
#[allow(dead_code, clippy::all)]
#[path = "../../../adapters/tests/support/http.rs"]
mod support_http;
mod support {
    pub(crate) use super::support_http as http;
}
/// The fake Azure Container Apps session pool, an external pool of the hybrid providers test.
#[allow(dead_code, clippy::all)]
#[path = "../../../adapters/tests/azure_sessions/fake_server.rs"]
mod fake_azure;
/// The fake Cloudflare Sandbox Bridge Worker (its exec route is `crate::fake_exec`), an
/// external pool of the hybrid providers test.
#[allow(dead_code, clippy::all)]
#[path = "../../../adapters/tests/cloudflare/fake_bridge.rs"]
mod fake_bridge;
#[allow(dead_code, clippy::all)]
#[path = "../../../adapters/tests/agent_sandbox/fake_controller.rs"]
mod fake_controller;
/// The fake Daytona of the adapter tests, for the hybrid placement test's external pool.
#[allow(dead_code, clippy::all)]
#[path = "../../../adapters/tests/daytona/fake_server.rs"]
mod fake_daytona;
/// The fake E2B (control plane and envd) of the adapter tests, the hybrid test's second
/// external pool.
#[allow(dead_code, clippy::all)]
#[path = "../../../adapters/tests/e2b/fake_server.rs"]
mod fake_e2b;
#[allow(dead_code, clippy::all)]
#[path = "../../../adapters/tests/cloudflare/fake_exec.rs"]
mod fake_exec;
/// The fake Kubernetes cluster of the agent-sandbox adapter tests (API server, stand-in
/// controllers, router and runtime), the private pool of the hybrid providers test; its
/// modules name each other as `crate::fake_k8s`, `crate::fake_controller`, ….
#[allow(dead_code, clippy::all)]
#[path = "../../../adapters/tests/agent_sandbox/fake_k8s.rs"]
mod fake_k8s;
/// The adapters' fake OpenSandbox server (the real 1.1.1 server's behaviour), for the P8
/// bench and the hybrid placement test's private pool.
#[allow(dead_code, clippy::all)]
#[path = "../../../adapters/tests/opensandbox/fake_server.rs"]
mod fake_opensandbox;
/// The fake OpenSandbox server's `/pty` (its `fake_server` names it as `crate::fake_pty`).
#[allow(dead_code, clippy::all)]
#[path = "../../../adapters/tests/opensandbox/fake_pty.rs"]
mod fake_pty;
/// The fake Runloop API, an external pool of the hybrid providers test.
#[allow(dead_code, clippy::all)]
#[path = "../../../adapters/tests/runloop/fake/mod.rs"]
mod fake_runloop;
#[allow(dead_code, clippy::all)]
#[path = "../../../adapters/tests/agent_sandbox/fake_runtime.rs"]
mod fake_runtime;
#[allow(dead_code, clippy::all)]
#[path = "../../../adapters/tests/agent_sandbox/fake_verbs.rs"]
mod fake_verbs;
/// The fake OpenSandbox server's version switch (its `fake_server` names it as
/// `crate::fake_versions`).
#[allow(dead_code, clippy::all)]
#[path = "../../../adapters/tests/opensandbox/fake_versions.rs"]
mod fake_versions;
mod hybrid;
mod hybrid_placement;
mod hybrid_providers;
mod idempotency;
mod lifecycle;
mod logs_order;
mod mcp;
mod mcp_inspector;
mod nats_cluster;
mod observability;
mod openapi;
mod opensandbox_facade;
mod opensandbox_facade_bench;
mod opensandbox_facade_commands;
mod opensandbox_facade_pty;
mod opensandbox_live;
mod placement;
mod plugin;
mod processes;
mod pty;
mod quota;
mod readme;
mod schemathesis;
mod spine;
mod tenancy;
mod warm_claims;
mod warm_crash;
mod webhooks;
