//! The shared world of the delivery tests: a fresh database, a real nats-server, and a
//! receiver on 127.0.0.1 that records what came and answers by plan.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use chrono::Utc;
use differently_bus::testing::NatsServer;
use differently_bus::{Announcer, Bus};
use differently_bus_schema::public::{EventData, Origin, PublicEvent, StatusData};
use differently_bus_schema::Naming;
use differently_core::{OrgId, ProjectId, SandboxId, SandboxStatus};
use differently_store::sealed::{self, SealKey};
use differently_store::testing::TestDb;
use differently_store::webhooks::Webhook;
use differently_store::{Actor, Org, OrgStatus, Project, Store};
use differently_webhooks::signing::{verify, Secret};
use differently_webhooks::{Backoff, Deliverer, DeliveryConfig, UrlPolicy};
use tokio::sync::watch;

/// One request as the receiver saw it.
#[derive(Debug, Clone)]
pub(crate) struct Got {
    pub(crate) id: String,
    pub(crate) timestamp: String,
    pub(crate) signature: String,
    pub(crate) body: Vec<u8>,
    pub(crate) answered: u16,
}

/// A receiver: per path, the answers to give in order (the last one repeats), and what came.
#[derive(Clone, Default)]
pub(crate) struct Receiver {
    pub(crate) plan: Arc<Mutex<HashMap<String, Vec<u16>>>>,
    pub(crate) got: Arc<Mutex<HashMap<String, Vec<Got>>>>,
    /// How long a path takes to answer (a slow receiver).
    pub(crate) delay: Arc<Mutex<HashMap<String, Duration>>>,
    /// Per path: requests being answered now, and the most there ever were at once.
    pub(crate) open: Arc<Mutex<HashMap<String, (usize, usize)>>>,
}

impl Receiver {
    pub(crate) fn answer(&self, path: &str, codes: &[u16]) {
        self.plan
            .lock()
            .unwrap()
            .insert(path.into(), codes.to_vec());
    }

    pub(crate) fn slow(&self, path: &str, d: Duration) {
        self.delay.lock().unwrap().insert(path.into(), d);
    }

    /// The most requests to `path` ever in progress at once.
    pub(crate) fn most_at_once(&self, path: &str) -> usize {
        self.open.lock().unwrap().get(path).map_or(0, |o| o.1)
    }

    pub(crate) fn got(&self, path: &str) -> Vec<Got> {
        self.got
            .lock()
            .unwrap()
            .get(path)
            .cloned()
            .unwrap_or_default()
    }
}

pub(crate) async fn receive(
    State(r): State<Receiver>,
    Path(path): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> StatusCode {
    let h = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let delay = r.delay.lock().unwrap().get(&path).copied();
    if let Some(d) = delay {
        {
            let mut open = r.open.lock().unwrap();
            let o = open.entry(path.clone()).or_default();
            o.0 += 1;
            o.1 = o.1.max(o.0);
        }
        tokio::time::sleep(d).await;
        if let Some(o) = r.open.lock().unwrap().get_mut(&path) {
            o.0 -= 1;
        }
    }
    let answered = {
        let mut plan = r.plan.lock().unwrap();
        let codes = plan.entry(path.clone()).or_insert_with(|| vec![204]);
        if codes.len() > 1 {
            codes.remove(0)
        } else {
            codes[0]
        }
    };
    r.got.lock().unwrap().entry(path).or_default().push(Got {
        id: h("webhook-id"),
        timestamp: h("webhook-timestamp"),
        signature: h("webhook-signature"),
        body: body.to_vec(),
        answered,
    });
    StatusCode::from_u16(answered).unwrap()
}

pub(crate) struct World {
    pub(crate) db: TestDb,
    pub(crate) _nats: NatsServer,
    pub(crate) announcer: Announcer,
    pub(crate) receiver: Receiver,
    pub(crate) base: String,
    pub(crate) stop: watch::Sender<bool>,
}

pub(crate) fn open_policy() -> UrlPolicy {
    UrlPolicy {
        allow_http: true,
        allow_private: true,
        ..UrlPolicy::default()
    }
}

pub(crate) fn fast_config() -> DeliveryConfig {
    DeliveryConfig {
        url_policy: open_policy(),
        timeout: Duration::from_secs(5),
        backoff: Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(400),
            retry_for: Duration::from_secs(60),
        },
        poll: Duration::from_millis(50),
        ..DeliveryConfig::default()
    }
}

pub(crate) async fn world() -> World {
    let _ = sealed::set_process_key(SealKey::random().unwrap());
    let db = TestDb::new().await;
    let nats = NatsServer::start();
    let bus: Arc<dyn Bus> = Arc::new(
        differently_bus::jetstream::connect(&nats.url(), 1)
            .await
            .unwrap(),
    );
    let naming = Naming::new("wh").unwrap();
    bus.ensure_streams(&naming).await.unwrap();
    let receiver = Receiver::default();
    let app = Router::new()
        .route("/{path}", post(receive))
        .with_state(receiver.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let (stop, _) = watch::channel(false);
    World {
        db,
        _nats: nats,
        announcer: Announcer::new(bus, naming),
        receiver,
        base,
        stop,
    }
}

impl World {
    pub(crate) fn store(&self) -> Arc<dyn Store> {
        Arc::new(self.db.store())
    }

    pub(crate) fn start(&self, config: DeliveryConfig) {
        self.start_until(config, self.stop.subscribe());
    }

    /// A delivering process of its own, stopped by `stop`, on its own connection pool (as
    /// another worker process would be).
    pub(crate) fn start_until(&self, config: DeliveryConfig, stop: watch::Receiver<bool>) {
        let d = Deliverer {
            store: self.store(),
            announcer: self.announcer.clone(),
            config,
        };
        tokio::spawn(d.run(stop));
    }

    /// Event ids `path` received, sorted.
    pub(crate) fn ids_at(&self, path: &str) -> Vec<String> {
        let mut ids: Vec<String> = self.receiver.got(path).into_iter().map(|g| g.id).collect();
        ids.sort();
        ids
    }

    pub(crate) fn public_stream(&self) -> String {
        self.announcer.naming().public_stream().name
    }

    pub(crate) async fn tenant(&self) -> (Org, Project) {
        let s = self.store();
        let actor = Actor::Key("key_t".into());
        let o = Org {
            id: OrgId::new(),
            name: format!("o-{}", OrgId::new()),
            status: OrgStatus::Active,
            created_at: Utc::now(),
        };
        s.create_org(&o, &actor).await.unwrap();
        let p = Project {
            id: ProjectId::new(),
            org_id: o.id.clone(),
            name: format!("p-{}", ProjectId::new()),
            created_at: Utc::now(),
        };
        s.create_project(&p, &actor).await.unwrap();
        (o, p)
    }

    pub(crate) async fn hook(
        &self,
        o: &Org,
        p: &Project,
        path: &str,
        types: &[&str],
    ) -> (Webhook, Secret) {
        let secret = Secret::generate().unwrap();
        let now = Utc::now() - chrono::Duration::seconds(1);
        let w = Webhook {
            id: format!("whk_{}", ulid_of()),
            org_id: o.id.clone(),
            project_id: p.id.clone(),
            url: format!("{}/{path}", self.base),
            event_types: types.iter().map(|t| t.to_string()).collect(),
            description: None,
            enabled: true,
            disabled_reason: None,
            consecutive_failures: 0,
            failing_since: None,
            previous_secret_expires_at: None,
            created_at: now,
            updated_at: now,
        };
        let w = self
            .store()
            .create_webhook(&w, secret.as_bytes(), &Actor::Key("key_t".into()))
            .await
            .unwrap();
        (w, secret)
    }

    pub(crate) async fn status_event(&self, p: &Project, version: i64) -> PublicEvent {
        let e = PublicEvent::new(
            p.org_id.clone(),
            p.id.clone(),
            Some(SandboxId::new()),
            Origin::user("key_t"),
            Utc::now(),
            &version.to_string(),
            EventData::StatusChanged(StatusData {
                status: SandboxStatus::Running,
                status_reason: None,
                status_version: version,
                pool: Some("p".into()),
            }),
        );
        self.announcer.public(&e).await.unwrap();
        e
    }
}

pub(crate) fn ulid_of() -> String {
    OrgId::new().as_str()[4..].to_owned()
}

/// Waits up to 20 s for `f` to hold.
pub(crate) async fn eventually<F: FnMut() -> Fut, Fut: std::future::Future<Output = bool>>(
    what: &str,
    mut f: F,
) {
    let until = tokio::time::Instant::now() + Duration::from_secs(20);
    while tokio::time::Instant::now() < until {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

pub(crate) fn verifies(secret: &Secret, g: &Got) -> bool {
    verify(
        secret,
        &g.id,
        &g.timestamp,
        &g.signature,
        &g.body,
        Utc::now().timestamp(),
    )
    .is_ok()
}
