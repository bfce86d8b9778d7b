//! One in-process API per test, and one way to call it.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode};
use axum::Router;
use chrono::Utc;
use differently_adapters::pools::PoolSet;
use differently_api::auth::cache as auth_cache;
use differently_api::caches::policy as policy_cache;
use differently_api::control::event_hub::EventHub;
use differently_api::data_plane::activity;
use differently_api::requests::ratelimit;
use differently_api::{AppState, BootstrapKey, Inner, Limits, Tenant};
use differently_bus::memory::MemoryBus;
use differently_bus::{Announcer, Bus};
use differently_bus_schema::Naming;
use differently_core::pool::{PoolRecord, PoolSource, Trust};
use differently_store::memory::MemoryStore;
use differently_store::Store;
use serde_json::{json, Value};
use tower::ServiceExt;

/// A running API: its router, the bootstrap (admin) key and the bootstrap tenant.
pub struct Api {
    pub router: Router,
    /// The store under the router, for a test to set up what the API cannot make here.
    pub store: Arc<dyn Store>,
    /// The pools under the router (one fake pool, `fake`).
    pub pools: PoolSet,
    /// The bus under the router (shared by an [`api_pair`]) and its naming.
    pub bus: Arc<dyn Bus>,
    pub naming: Naming,
    pub key: String,
    pub tenant: Tenant,
}

/// What a call answered.
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Value,
}

impl Answer {
    /// The served `X-Request-Id`.
    pub fn request_id(&self) -> &str {
        self.headers["x-request-id"].to_str().expect("ascii")
    }

    /// The error body's `code`.
    pub fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }
}

/// The fake pool every test places on.
fn fake_pool() -> PoolRecord {
    let now = Utc::now();
    PoolRecord {
        name: "fake".into(),
        kind: "fake".into(),
        trust: Trust::Private,
        region: None,
        max_concurrent: None,
        isolation: None,
        cost_per_cpu_hour: 0.0,
        typical_create_seconds: Some(0.1),
        settings: json!({ "capabilities": ["exec", "exec.stream", "files", "snapshots"] }),
        source: PoolSource::Config,
        created_at: now,
        updated_at: now,
    }
}

/// A fresh API over its own memory store and bus. Creates are not placed in their
/// admission (`direct_placement` off), so they stay queued: no scheduler runs here.
pub async fn api() -> Api {
    api_with(Limits {
        direct_placement: false,
        ..Limits::default()
    })
    .await
}

/// `api` with these limits.
pub async fn api_with(limits: Limits) -> Api {
    api_over(&Shared::new().await, limits).await
}

/// What the API processes of one installation share: the store, the bus, the pools (so a
/// backend instance made through one is reached through another) and the bootstrap key
/// (which seals execd tokens).
pub struct Shared {
    store: Arc<dyn Store>,
    bus: Arc<dyn Bus>,
    naming: Naming,
    pools: PoolSet,
    key: String,
}

impl Shared {
    /// A fresh memory store, memory bus and fake pool.
    pub async fn new() -> Shared {
        Shared::with_pools(vec![fake_pool()]).await
    }

    /// A fresh memory store and memory bus, and `pools`.
    pub async fn with_pools(pools: Vec<PoolRecord>) -> Shared {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let bus: Arc<dyn Bus> = Arc::new(MemoryBus::new());
        let naming = Naming::new("dly").expect("naming");
        bus.ensure_streams(&naming).await.expect("streams");
        let (pools, bad) = PoolSet::from_records(pools);
        assert!(bad.is_empty(), "fake pool: {bad:?}");
        Shared {
            store,
            bus,
            naming,
            pools,
            key: differently_api::generate_key(),
        }
    }
}

/// `api` whose pools are the fake one and a devhost pool `devhost` running commands as plain
/// local processes (`isolation = "none"`) in directories under `root`: for what only a real
/// backend checks, such as a `cwd` that does not exist.
pub async fn api_with_devhost(root: &std::path::Path) -> Api {
    let now = Utc::now();
    let devhost = PoolRecord {
        name: "devhost".into(),
        kind: "devhost".into(),
        settings: json!({ "root": root, "isolation": "none" }),
        created_at: now,
        updated_at: now,
        ..fake_pool()
    };
    let shared = Shared::with_pools(vec![fake_pool(), devhost]).await;
    api_over(
        &shared,
        Limits {
            direct_placement: false,
            ..Limits::default()
        },
    )
    .await
}

/// Two API processes of one installation (as behind a load balancer), each with its own
/// router and in-memory state, over one store and one bus.
pub async fn api_pair() -> (Api, Api) {
    let shared = Shared::new().await;
    let limits = || Limits {
        direct_placement: false,
        ..Limits::default()
    };
    (
        api_over(&shared, limits()).await,
        api_over(&shared, limits()).await,
    )
}

/// One API process over `shared`.
pub async fn api_over(shared: &Shared, limits: Limits) -> Api {
    let Shared {
        store,
        bus,
        naming,
        pools,
        key,
    } = shared;
    let tenant = differently_api::ensure_bootstrap_tenant(store.as_ref())
        .await
        .expect("tenant");
    let state = AppState::new(Inner {
        events: EventHub::start(bus.clone(), naming.clone(), store.clone()),
        announcer: Announcer::new(bus.clone(), naming.clone()),
        store: store.clone(),
        pools: pools.clone(),
        bootstrap_key: BootstrapKey::from_key(key).expect("bootstrap key"),
        tenant: tenant.clone(),
        faults: Default::default(),
        key_requests: ratelimit::Buckets::new(limits.key_rate),
        auth_failures: differently_api::auth::throttle::AuthFailures::new(limits.auth_failure_rate),
        auth_cache: auth_cache::AuthCache::default(),
        activity: activity::ActivityBuffer::default(),
        policies: policy_cache::PolicyCache::default(),
        warm: differently_api::caches::warm::WarmCache::default(),
        ptys: differently_api::data_plane::pty_sessions::PtySessions::default(),
        processes: Default::default(),
        event_auth: None,
        limits,
    });
    Api {
        router: differently_api::router(state),
        store: store.clone(),
        pools: pools.clone(),
        bus: bus.clone(),
        naming: naming.clone(),
        key: key.clone(),
        tenant,
    }
}

impl Api {
    /// Calls `method path` with `key` (none: unauthenticated), a JSON body (`Value::Null`:
    /// none) and extra headers.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        key: Option<&str>,
        body: Value,
        headers: &[(&str, &str)],
    ) -> Answer {
        self.call_from(None, method, path, key, body, headers).await
    }

    /// `call` as if from TCP peer `peer` (none: no peer address known, as in `call`).
    pub async fn call_from(
        &self,
        peer: Option<&str>,
        method: Method,
        path: &str,
        key: Option<&str>,
        body: Value,
        headers: &[(&str, &str)],
    ) -> Answer {
        let (raw, mut all) = if body.is_null() {
            (Vec::new(), Vec::new())
        } else {
            (
                body.to_string().into_bytes(),
                vec![("content-type", "application/json")],
            )
        };
        all.extend_from_slice(headers);
        self.call_raw_from(peer, method, path, key, raw, &all).await
    }

    /// `call` with the body's bytes as given (none when empty) and only the given headers.
    pub async fn call_raw(
        &self,
        method: Method,
        path: &str,
        key: Option<&str>,
        raw: Vec<u8>,
        headers: &[(&str, &str)],
    ) -> Answer {
        self.call_raw_from(None, method, path, key, raw, headers)
            .await
    }

    /// `call_raw` as if from TCP peer `peer`.
    pub async fn call_raw_from(
        &self,
        peer: Option<&str>,
        method: Method,
        path: &str,
        key: Option<&str>,
        raw: Vec<u8>,
        headers: &[(&str, &str)],
    ) -> Answer {
        let method_name = method.as_str().to_ascii_lowercase();
        let mut req = Request::builder().method(method).uri(path);
        if let Some(peer) = peer {
            let addr: std::net::SocketAddr = format!("{peer}:40000").parse().expect("peer");
            req = req.extension(axum::extract::ConnectInfo(addr));
        }
        if let Some(k) = key {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let body = if raw.is_empty() {
            Body::empty()
        } else {
            Body::from(raw)
        };
        let resp = self
            .router
            .clone()
            .oneshot(req.body(body).expect("request"))
            .await
            .expect("infallible");
        let status = resp.status();
        assert_documented(&method_name, path, status);
        let headers = resp.headers().clone();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .expect("body");
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("JSON body")
        };
        Answer {
            status,
            headers,
            body,
        }
    }

    /// `call` with the bootstrap key and no extra headers.
    pub async fn admin(&self, method: Method, path: &str, body: Value) -> Answer {
        self.call(method, path, Some(&self.key.clone()), body, &[])
            .await
    }

    /// A new key of the bootstrap org (or of `org`) with `scopes`.
    pub async fn key_with(&self, org: Option<&str>, scopes: &[&str]) -> String {
        let mut body = json!({ "name": "router-test", "scopes": scopes });
        if let Some(org) = org {
            body["orgId"] = json!(org);
        }
        let a = self.admin(Method::POST, "/v1/keys", body).await;
        assert_eq!(a.status, StatusCode::CREATED, "create key: {}", a.body);
        a.body["key"].as_str().expect("key").to_owned()
    }

    /// A sandbox of the bootstrap tenant, created with the bootstrap key; its id.
    pub async fn sandbox(&self) -> String {
        let a = self.admin(Method::POST, "/v1/sandboxes", json!({})).await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "create: {}", a.body);
        a.body["id"].as_str().expect("id").to_owned()
    }
}

/// The `Host` the facade tests send (the facade builds endpoint URLs from it).
pub const FACADE_HOST: (&str, &str) = ("host", "facade.test:8080");
/// The header carrying a facade execd token.
pub const EXECD_TOKEN: &str = "x-differently-execd-token";

impl Api {
    /// The facade's execd token for sandbox `id`, from its direct-mode endpoint answer.
    pub async fn facade_execd_token(&self, id: &str) -> String {
        let key = self.key.clone();
        let ep = self
            .call(
                Method::GET,
                &format!("/opensandbox/v1/sandboxes/{id}/endpoints/44772?use_server_proxy=false"),
                None,
                Value::Null,
                &[FACADE_HOST, ("open-sandbox-api-key", &key)],
            )
            .await;
        assert_eq!(ep.status, StatusCode::OK, "{}", ep.body);
        ep.body["headers"][EXECD_TOKEN]
            .as_str()
            .expect("the endpoint's execd token")
            .to_owned()
    }

    /// A new sandbox of the bootstrap tenant activated on the fake pool directly in the store
    /// (no scheduler runs here): its id and the activated row.
    async fn activated_sandbox(&self) -> (differently_core::SandboxId, differently_core::Sandbox) {
        self.activated_sandbox_on("fake").await
    }

    /// [`Api::activated_sandbox`] on pool `pool`.
    async fn activated_sandbox_on(
        &self,
        pool: &str,
    ) -> (differently_core::SandboxId, differently_core::Sandbox) {
        let id = self.sandbox().await;
        let sid = differently_core::SandboxId::parse(&id).expect("sandbox id");
        let slot = differently_store::PoolSlot {
            name: pool.into(),
            max_concurrent: None,
        };
        let activated = self
            .store
            .activate(&sid, &slot, &Default::default(), Utc::now())
            .await
            .expect("activate");
        let differently_store::Activation::Activated(row) = activated else {
            panic!("activate: {activated:?}");
        };
        (sid, row)
    }

    /// A sandbox of the bootstrap tenant moved to `running` on the fake pool directly in the
    /// store (no scheduler or worker runs here; no backend instance); its id.
    pub async fn running_sandbox(&self) -> String {
        let (sid, _) = self.activated_sandbox().await;
        self.store
            .mark_running(&sid, "fake-ref", Utc::now())
            .await
            .expect("running");
        sid.to_string()
    }

    /// A running sandbox with an instance on the fake backend, so data-plane calls (exec,
    /// files) reach it: made by the pool's adapter, as a worker would.
    pub async fn live_sandbox(&self) -> String {
        self.live_sandbox_on("fake").await
    }

    /// [`Api::live_sandbox`] on pool `pool` (its backend really makes the instance).
    pub async fn live_sandbox_on(&self, pool_name: &str) -> String {
        let (sid, row) = self.activated_sandbox_on(pool_name).await;
        let pool = self.pools.get(pool_name).expect("the pool");
        let instance = pool
            .adapter
            .create(&differently_adapters::contract::CreateInstance {
                sandbox_id: sid.clone(),
                installation_id: self.store.installation_id().await.expect("installation"),
                template: None,
                resources: row.spec.resources,
                env: Default::default(),
                ttl_seconds: row.spec.ttl_seconds,
                from_snapshot: None,
            })
            .await
            .expect("the fake backend creates");
        self.store
            .mark_running(&sid, &instance.backend_ref, Utc::now())
            .await
            .expect("running");
        sid.to_string()
    }

    /// Finishes every pending operation as done, as a worker would, until dropped: so a
    /// route that waits for its operation answers at once instead of after its wait bound.
    pub fn complete_ops(&self) -> tokio::task::JoinHandle<()> {
        let store = self.store.clone();
        tokio::spawn(async move {
            loop {
                let now = Utc::now() + chrono::TimeDelta::seconds(1);
                for op in store.pending_ops(now, 100).await.unwrap_or_default() {
                    let _ = store
                        .finish_op(
                            &op.id,
                            differently_store::lifecycle::OpState::Done,
                            json!({}),
                            None,
                            Utc::now(),
                        )
                        .await;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        })
    }
}

/// Asserts `a` is an error envelope with `code` whose `requestId` is the served
/// `X-Request-Id`.
pub fn assert_error(a: &Answer, status: StatusCode, code: &str) {
    assert_eq!(a.status, status, "{}", a.body);
    assert_eq!(a.code(), code, "{}", a.body);
    assert!(a.body["error"]["message"].is_string(), "{}", a.body);
    assert_eq!(
        a.body["error"]["requestId"].as_str(),
        Some(a.request_id()),
        "{}",
        a.body
    );
}

/// [`assert_error`], and the error names `field` in `details.field`.
pub fn assert_field_error(a: &Answer, status: StatusCode, code: &str, field: &str) {
    assert_error(a, status, code);
    assert_eq!(a.body["error"]["details"]["field"], field, "{}", a.body);
}

/// Fails when the served OpenAPI document does not list `status` among the answers of the
/// operation `method path`: every status a router test sees must be documented, so the
/// document cannot drift from the server. 405 and 414 are answered before any operation is
/// chosen (a method the path does not have, a target too long to route), and a path no
/// operation matches is the router's 404; those are the document's `info` prose.
fn assert_documented(method: &str, path: &str, status: StatusCode) {
    if matches!(status.as_u16(), 405 | 414) {
        return;
    }
    let path = path.split('?').next().unwrap_or_default();
    let Some((template, op)) = operation_for(method, path) else {
        return;
    };
    assert!(
        op["responses"].get(status.as_str()).is_some(),
        "{method} {template} answered {status}, which the OpenAPI document does not list"
    );
}

/// The document's operation for a concrete path: the template that matches it with the
/// most literal segments (`…/files/list` before `…/files/{x}`).
fn operation_for(method: &str, path: &str) -> Option<(String, &'static Value)> {
    let doc = differently_api::openapi::document();
    let segments: Vec<&str> = path.split('/').collect();
    let mut best: Option<(usize, String, &'static Value)> = None;
    for (template, item) in doc["paths"].as_object()? {
        let parts: Vec<&str> = template.split('/').collect();
        if parts.len() != segments.len() {
            continue;
        }
        let mut literal = 0;
        let matches = parts.iter().zip(&segments).all(|(t, s)| {
            if t.starts_with('{') {
                true
            } else {
                literal += 1;
                t == s
            }
        });
        let Some(op) = item.get(method).filter(|_| matches) else {
            continue;
        };
        if best.as_ref().is_none_or(|(l, _, _)| literal > *l) {
            best = Some((literal, template.clone(), op));
        }
    }
    best.map(|(_, t, op)| (t, op))
}

/// Marks `pools` healthy, as a worker's probe would (none runs here), so placement may
/// choose them.
pub fn healthy(api: &Api, pools: &[&str]) {
    let now = Utc::now();
    let health: Vec<_> = pools
        .iter()
        .map(|n| differently_core::pool::PoolHealth {
            name: (*n).into(),
            healthy: true,
            capabilities: vec!["exec".into()],
            error: None,
            checked_at: now,
            checked_by: "test".into(),
            backend: None,
        })
        .collect();
    api.pools
        .apply_health(&health, now, std::time::Duration::from_secs(3600));
}

/// A fake pool `name` registered through the API (`source: api`), offering exec, with the
/// given concurrency cap, put in the store as `POST /v1/admin/pools` would. The caller syncs
/// it into `api`'s registry (a sync replaces the registry), then makes it [`healthy`].
pub async fn api_pool(api: &Api, name: &str, max_concurrent: Option<u32>) -> PoolRecord {
    let now = Utc::now();
    let record = PoolRecord {
        name: name.into(),
        kind: "fake".into(),
        trust: Trust::Private,
        region: None,
        max_concurrent,
        isolation: None,
        cost_per_cpu_hour: 0.0,
        typical_create_seconds: Some(0.1),
        settings: json!({ "capabilities": ["exec"] }),
        source: PoolSource::Api,
        created_at: now,
        updated_at: now,
    };
    api.store
        .upsert_pool(&record, &differently_store::Actor::System("test"))
        .await
        .expect("the pool is stored");
    record
}
