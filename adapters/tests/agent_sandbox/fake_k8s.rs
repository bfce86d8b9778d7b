//! A fake Kubernetes API server serving the four agent-sandbox custom resources, with an
//! in-process stand-in for the agent-sandbox controllers, written from:
//!
//! - the CRDs and API reference of kubernetes-sigs/agent-sandbox (`k8s/crds/*.yaml`,
//!   `docs/api.md`, snapshot of 2026-08-22): `agents.x-k8s.io/v1beta1` `Sandbox`
//!   (`spec.podTemplate` required, `spec.shutdownTime`/`shutdownPolicy`, status `conditions`,
//!   `podIPs`, `serviceFQDN`) and `extensions.agents.x-k8s.io/v1beta1` `SandboxClaim`
//!   (`spec.warmPoolRef.name` required, `spec.env`, `spec.lifecycle`,
//!   `spec.additionalPodMetadata`; status `sandbox.name`, `sandbox.podIPs`, `conditions`),
//!   `SandboxTemplate` (`envVarsInjectionPolicy`, default `Disallowed`) and `SandboxWarmPool`
//!   (`replicas`, `sandboxTemplateRef`; status `replicas`, `readyReplicas`);
//! - the claim controller (`extensions/controllers/sandboxclaim_controller.go`,
//!   `computeReadyCondition`): a claim without env adopts a Ready pool sandbox and is Ready in
//!   the same status update; a claim with env cold-starts a Sandbox named like the claim, and is
//!   refused (`EnvVarsInjectionRejected`) when the template disallows env; `WarmPoolNotFound`,
//!   `TemplateNotFound`, `SandboxNotReady`, `SandboxMissing`, `ClaimExpired`; the Sandbox's
//!   Ready condition (`DependenciesReady`/`DependenciesNotReady`) is forwarded to the claim;
//! - the Kubernetes API conventions every apiserver follows: `Status` error bodies (`reason`
//!   `NotFound`, `AlreadyExists`, `Invalid`, `Unauthorized`, `Forbidden`, `UnsupportedMediaType`),
//!   a plain-text `404 page not found` for a group/version that is not served (a CRD not
//!   installed), `resourceVersion` bumped on every write, equality/existence `labelSelector`s,
//!   `limit`/`continue` paging, merge-patch only for custom resources (strategic merge is 415),
//!   unknown fields pruned silently with a `Warning` header, `status` ignored on create, and a
//!   delete that leaves the object with a `deletionTimestamp` until its finalizer is done.
//!
//! The controllers act on each request ("ticks") rather than on a clock, so tests are exact:
//! a cold sandbox is Ready `cold_ready_ticks` requests after it is made.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Value};

use crate::support::http::{self, json_resp, lock, Req};

pub const CORE: &str = "agents.x-k8s.io";
pub const EXT: &str = "extensions.agents.x-k8s.io";
/// The label a pool's unclaimed sandboxes carry (removed on adoption).
pub const WARM_LABEL: &str = "agents.x-k8s.io/warm-pool-sandbox";

/// Behaviour switches and fault injection.
#[derive(Debug)]
pub struct Knobs {
    /// Requests after its creation a cold sandbox becomes Ready.
    pub cold_ready_ticks: u64,
    /// Requests after its creation a pool sandbox becomes Ready.
    pub warm_ready_ticks: u64,
    /// Requests a deleted claim stays (finalizer) before it is gone.
    pub claim_delete_ticks: u64,
    /// Largest page a list answers, whatever `limit` asks.
    pub max_page: usize,
    /// The next requests whose path contains the string fail with the status.
    pub fail_next: VecDeque<(String, u16)>,
    /// The port the runtime listens on in each pod.
    pub runtime_port: u16,
    /// `SANDBOX_BASE_DIR` of every runtime.
    pub base_dir: String,
    /// `SANDBOX_EXEC_TIMEOUT_SECONDS` of every runtime.
    pub exec_timeout_secs: u64,
    /// New cold sandboxes end with their pod failed instead of Ready.
    pub pod_fails: bool,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            cold_ready_ticks: 3,
            warm_ready_ticks: 2,
            claim_delete_ticks: 2,
            max_page: 500,
            fail_next: VecDeque::new(),
            runtime_port: 8888,
            base_dir: "/".into(),
            exec_timeout_secs: 300,
            pod_fails: false,
        }
    }
}

/// What the fake saw.
#[derive(Debug, Default)]
pub struct Record {
    pub requests: Vec<String>,
    /// Bodies of creates and patches, by resource.
    pub created: Vec<(String, Value)>,
    pub patches: Vec<(String, String, Value)>,
    pub unauthorized: u32,
    /// Requests to the router or runtime that carried an `Authorization` header.
    pub auth_on_runtime: u32,
    pub executes: Vec<String>,
}

/// One stored object and what the controllers know of it.
#[derive(Debug, Clone)]
pub struct Obj {
    pub v: Value,
    /// Tick at which a sandbox's pod is Ready.
    pub ready_at: Option<u64>,
    /// Tick at which a deleting object is gone.
    pub gone_at: Option<u64>,
}

/// The cluster's state.
#[derive(Debug, Default)]
pub struct World {
    pub tick: u64,
    pub rv: u64,
    seq: u64,
    /// (resource, namespace, name) → object.
    pub objects: BTreeMap<(String, String, String), Obj>,
}

impl World {
    pub fn next_rv(&mut self) -> String {
        self.rv += 1;
        self.rv.to_string()
    }

    pub fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    pub fn get(&self, res: &str, ns: &str, name: &str) -> Option<&Obj> {
        self.objects
            .get(&(res.to_owned(), ns.to_owned(), name.to_owned()))
    }

    pub fn get_mut(&mut self, res: &str, ns: &str, name: &str) -> Option<&mut Obj> {
        self.objects
            .get_mut(&(res.to_owned(), ns.to_owned(), name.to_owned()))
    }

    /// Stores `v` with fresh metadata.
    pub fn insert(&mut self, res: &str, ns: &str, mut v: Value, ready_at: Option<u64>) {
        let name = v["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let seq = self.next_seq();
        let rv = self.next_rv();
        let meta = &mut v["metadata"];
        meta["namespace"] = json!(ns);
        meta["uid"] = json!(format!("00000000-0000-4000-8000-{seq:012}"));
        meta["resourceVersion"] = json!(rv);
        meta["generation"] = json!(1);
        meta["creationTimestamp"] = json!(now_rfc3339());
        self.objects.insert(
            (res.to_owned(), ns.to_owned(), name),
            Obj {
                v,
                ready_at,
                gone_at: None,
            },
        );
    }

    /// Replaces the object's status when it changed, bumping its resourceVersion.
    pub fn set_status(&mut self, res: &str, ns: &str, name: &str, status: Value) {
        let rv = self.rv + 1;
        if let Some(o) = self.get_mut(res, ns, name) {
            if o.v["status"] != status {
                o.v["status"] = status;
                o.v["metadata"]["resourceVersion"] = json!(rv.to_string());
                self.rv = rv;
            }
        }
    }

    pub fn remove(&mut self, res: &str, ns: &str, name: &str) -> Option<Obj> {
        self.objects
            .remove(&(res.to_owned(), ns.to_owned(), name.to_owned()))
    }

    pub fn names(&self, res: &str) -> Vec<(String, String)> {
        self.objects
            .keys()
            .filter(|(r, _, _)| r == res)
            .map(|(_, ns, n)| (ns.clone(), n.clone()))
            .collect()
    }
}

pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

struct Inner {
    token: Mutex<String>,
    api_addr: SocketAddr,
    runtime_addr: SocketAddr,
    knobs: Mutex<Knobs>,
    record: Mutex<Record>,
    world: Mutex<World>,
}

/// A running fake cluster: the API server and the router/runtime listener.
#[derive(Clone)]
pub struct FakeCluster {
    inner: Arc<Inner>,
}

impl FakeCluster {
    pub async fn start(token: &str) -> FakeCluster {
        let (api, runtime) = (http::bind().await, http::bind().await);
        let inner = Arc::new(Inner {
            token: Mutex::new(token.to_owned()),
            api_addr: api.local_addr().unwrap(),
            runtime_addr: runtime.local_addr().unwrap(),
            knobs: Mutex::new(Knobs::default()),
            record: Mutex::new(Record::default()),
            world: Mutex::new(World::default()),
        });
        let fake = FakeCluster { inner };
        http::serve(api, Router::new().fallback(handle).with_state(fake.clone()));
        http::serve(
            runtime,
            Router::new()
                .fallback(crate::fake_runtime::handle)
                .with_state(fake.clone()),
        );
        fake
    }

    pub fn api_url(&self) -> String {
        format!("http://{}", self.inner.api_addr)
    }

    /// The sandbox router's address (the `X-Sandbox-*` header contract).
    pub fn router_url(&self) -> String {
        format!("http://{}", self.inner.runtime_addr)
    }

    /// A per-pod URL pattern served by the same listener (as a pod's own address would be).
    pub fn direct_pattern(&self) -> String {
        format!(
            "http://{}/direct/{{namespace}}/{{name}}",
            self.inner.runtime_addr
        )
    }

    pub fn set_token(&self, t: &str) {
        *lock(&self.inner.token) = t.to_owned();
    }

    pub fn knobs(&self) -> MutexGuard<'_, Knobs> {
        lock(&self.inner.knobs)
    }

    pub fn record(&self) -> MutexGuard<'_, Record> {
        lock(&self.inner.record)
    }

    pub fn world(&self) -> MutexGuard<'_, World> {
        lock(&self.inner.world)
    }

    /// Objects of `res` in `ns`, by name.
    pub fn objects(&self, res: &str, ns: &str) -> BTreeMap<String, Value> {
        self.world()
            .objects
            .iter()
            .filter(|((r, n, _), _)| r == res && n == ns)
            .map(|((_, _, name), o)| (name.clone(), o.v.clone()))
            .collect()
    }

    /// A template whose pod runs the runtime, with `env` on its container, and a warm pool
    /// of `replicas` from it; `policy` is its `envVarsInjectionPolicy` (`None`: unset).
    pub fn add_template_and_pool(
        &self,
        ns: &str,
        name: &str,
        replicas: u64,
        policy: Option<&str>,
        env: &[(&str, &str)],
    ) {
        let env: Vec<Value> = env
            .iter()
            .map(|(k, v)| json!({"name": k, "value": v}))
            .collect();
        let mut spec = json!({"podTemplate": {"spec": {"containers": [
            {"name": "runtime", "image": "python-runtime-sandbox:latest",
             "ports": [{"containerPort": 8888}], "env": env}
        ]}}});
        if let Some(p) = policy {
            spec["envVarsInjectionPolicy"] = json!(p);
        }
        let knobs = self.knobs();
        let mut w = self.world();
        let template = json!({"apiVersion": format!("{EXT}/v1beta1"), "kind": "SandboxTemplate",
            "metadata": {"name": name}, "spec": spec});
        w.insert("sandboxtemplates", ns, template, None);
        let pool = json!({"apiVersion": format!("{EXT}/v1beta1"), "kind": "SandboxWarmPool",
            "metadata": {"name": name},
            "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": name}}});
        w.insert("sandboxwarmpools", ns, pool, None);
        crate::fake_controller::reconcile(&mut w, &knobs);
    }

    /// Runs the controllers once more (as a request would).
    pub fn tick(&self) {
        let knobs = self.knobs();
        let mut w = self.world();
        w.tick += 1;
        crate::fake_controller::reconcile(&mut w, &knobs);
    }

    /// The pod of sandbox `name` as the runtime sees it: base directory and container env,
    /// when it is Ready and not being deleted.
    pub fn pod(&self, ns: &str, name: &str) -> Option<(String, Vec<(String, String)>)> {
        let base_dir = self.knobs().base_dir.clone();
        let w = self.world();
        let o = w.get("sandboxes", ns, name)?;
        let ready = o.ready_at.is_some_and(|t| t <= w.tick)
            && o.v["metadata"].get("deletionTimestamp").is_none()
            && crate::fake_controller::ready(&o.v);
        if !ready {
            return None;
        }
        let env = o.v["spec"]["podTemplate"]["spec"]["containers"][0]["env"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| {
                        Some((
                            e["name"].as_str()?.to_owned(),
                            e["value"].as_str().unwrap_or_default().to_owned(),
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some((base_dir, env))
    }

    pub(crate) fn token(&self) -> String {
        lock(&self.inner.token).clone()
    }
}

/// A Kubernetes `Status` failure body.
pub fn status(code: u16, reason: &str, message: &str, details: Value) -> Response {
    json_resp(
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": message, "reason": reason, "details": details, "code": code}),
    )
}

/// Group, version, plural, kind of a served resource.
fn resource(group: &str, version: &str, plural: &str) -> Option<&'static str> {
    if version != "v1beta1" {
        return None;
    }
    match (group, plural) {
        (CORE, "sandboxes") => Some("Sandbox"),
        (EXT, "sandboxclaims") => Some("SandboxClaim"),
        (EXT, "sandboxtemplates") => Some("SandboxTemplate"),
        (EXT, "sandboxwarmpools") => Some("SandboxWarmPool"),
        _ => None,
    }
}

fn group_of(plural: &str) -> &'static str {
    if plural == "sandboxes" {
        CORE
    } else {
        EXT
    }
}

async fn handle(State(fake): State<FakeCluster>, req: Request) -> Response {
    let r = Req::read(req, 16 << 20).await;
    fake.record()
        .requests
        .push(format!("{} {}?{}", r.method, r.path, query_string(&r)));
    let want = format!("Bearer {}", fake.token());
    if r.header("authorization") != Some(want.as_str()) {
        fake.record().unauthorized += 1;
        return status(401, "Unauthorized", "Unauthorized", json!({}));
    }
    let injected = {
        let mut k = fake.knobs();
        let pos = k
            .fail_next
            .iter()
            .position(|(p, _)| r.path.contains(p.as_str()));
        pos.and_then(|i| k.fail_next.remove(i)).map(|(_, s)| s)
    };
    if let Some(code) = injected {
        let reason = match code {
            403 => "Forbidden",
            429 => "TooManyRequests",
            500 => "InternalError",
            503 => "ServiceUnavailable",
            _ => "BadRequest",
        };
        let mut resp = status(code, reason, "injected failure", json!({}));
        if code == 429 {
            resp.headers_mut()
                .insert("retry-after", axum::http::HeaderValue::from_static("1"));
        }
        return resp;
    }
    fake.tick();
    if r.path == "/version" {
        return json_resp(
            200,
            json!({"major": "1", "minor": "33", "gitVersion": "v1.33.1-fake"}),
        );
    }
    let parts: Vec<&str> = r.path.trim_matches('/').split('/').collect();
    // /apis/{group}/{version}/namespaces/{ns}/{plural}[/{name}]
    let (group, version, ns, plural, name) = match parts.as_slice() {
        ["apis", g, v, "namespaces", ns, p] => (*g, *v, *ns, *p, None),
        ["apis", g, v, "namespaces", ns, p, n] => (*g, *v, *ns, *p, Some(*n)),
        _ => return not_served(),
    };
    let Some(kind) = resource(group, version, plural) else {
        return not_served();
    };
    crate::fake_verbs::verb(&fake, &r, kind, ns, plural, name)
}

/// What an apiserver answers for a path no API group serves (the CRD is not installed).
fn not_served() -> Response {
    (
        StatusCode::NOT_FOUND,
        [("content-type", "text/plain; charset=utf-8")],
        "404 page not found\n",
    )
        .into_response()
}

fn query_string(r: &Req) -> String {
    r.query
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// `{plural}.{group} "name"`, as Status messages name an object.
pub fn qualified(plural: &str, name: &str) -> String {
    format!("{plural}.{} \"{name}\"", group_of(plural))
}

/// Details of a Status about one object.
pub fn details(plural: &str, name: &str) -> Value {
    json!({"name": name, "group": group_of(plural), "kind": plural})
}

pub fn api_version(plural: &str) -> String {
    format!("{}/v1beta1", group_of(plural))
}
