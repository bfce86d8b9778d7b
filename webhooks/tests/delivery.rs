//! Webhook delivery end to end inside one process, on the real parts: Postgres (a fresh
//! database), a real nats-server (JetStream), and a real HTTP receiver on 127.0.0.1 that
//! verifies every signature as a Standard Webhooks receiver does.

#![allow(clippy::unwrap_used)]

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
use differently_bus_schema::public::{
    Cause, EventData, ExecFinished, ExecStarted, Origin, PublicEvent, StatusData,
};
use differently_bus_schema::{EventType, Naming};
use differently_core::{OrgId, ProjectId, SandboxId, SandboxStatus};
use differently_store::sealed::{self, SealKey};
use differently_store::testing::TestDb;
use differently_store::webhooks::{DeliveryStatus, DisablePolicy, Webhook};
use differently_store::{Actor, Org, OrgStatus, Project, Store};
use differently_webhooks::signing::{verify, Secret};
use differently_webhooks::{Backoff, Deliverer, DeliveryConfig, UrlPolicy};
use futures::StreamExt;
use tokio::sync::watch;

/// One request as the receiver saw it.
#[derive(Debug, Clone)]
struct Got {
    id: String,
    timestamp: String,
    signature: String,
    body: Vec<u8>,
    answered: u16,
}

/// A receiver: per path, the answers to give in order (the last one repeats), and what came.
#[derive(Clone, Default)]
struct Receiver {
    plan: Arc<Mutex<HashMap<String, Vec<u16>>>>,
    got: Arc<Mutex<HashMap<String, Vec<Got>>>>,
    /// How long a path takes to answer (a slow receiver).
    delay: Arc<Mutex<HashMap<String, Duration>>>,
    /// Per path: requests being answered now, and the most there ever were at once.
    open: Arc<Mutex<HashMap<String, (usize, usize)>>>,
}

impl Receiver {
    fn answer(&self, path: &str, codes: &[u16]) {
        self.plan
            .lock()
            .unwrap()
            .insert(path.into(), codes.to_vec());
    }

    fn slow(&self, path: &str, d: Duration) {
        self.delay.lock().unwrap().insert(path.into(), d);
    }

    /// The most requests to `path` ever in progress at once.
    fn most_at_once(&self, path: &str) -> usize {
        self.open.lock().unwrap().get(path).map_or(0, |o| o.1)
    }

    fn got(&self, path: &str) -> Vec<Got> {
        self.got
            .lock()
            .unwrap()
            .get(path)
            .cloned()
            .unwrap_or_default()
    }
}

async fn receive(
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

struct World {
    db: TestDb,
    _nats: NatsServer,
    announcer: Announcer,
    receiver: Receiver,
    base: String,
    stop: watch::Sender<bool>,
}

fn open_policy() -> UrlPolicy {
    UrlPolicy {
        allow_http: true,
        allow_private: true,
        ..UrlPolicy::default()
    }
}

fn fast_config() -> DeliveryConfig {
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

async fn world() -> World {
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
    fn store(&self) -> Arc<dyn Store> {
        Arc::new(self.db.store())
    }

    fn start(&self, config: DeliveryConfig) {
        self.start_until(config, self.stop.subscribe());
    }

    /// A delivering process of its own, stopped by `stop`, on its own connection pool (as
    /// another worker process would be).
    fn start_until(&self, config: DeliveryConfig, stop: watch::Receiver<bool>) {
        let d = Deliverer {
            store: self.store(),
            announcer: self.announcer.clone(),
            config,
        };
        tokio::spawn(d.run(stop));
    }

    /// Event ids `path` received, sorted.
    fn ids_at(&self, path: &str) -> Vec<String> {
        let mut ids: Vec<String> = self.receiver.got(path).into_iter().map(|g| g.id).collect();
        ids.sort();
        ids
    }

    fn public_stream(&self) -> String {
        self.announcer.naming().public_stream().name
    }

    async fn tenant(&self) -> (Org, Project) {
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

    async fn hook(&self, o: &Org, p: &Project, path: &str, types: &[&str]) -> (Webhook, Secret) {
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

    async fn status_event(&self, p: &Project, version: i64) -> PublicEvent {
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

fn ulid_of() -> String {
    OrgId::new().as_str()[4..].to_owned()
}

/// Waits up to 20 s for `f` to hold.
async fn eventually<F: FnMut() -> Fut, Fut: std::future::Future<Output = bool>>(
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

fn verifies(secret: &Secret, g: &Got) -> bool {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_answering_500_then_200_accepts_the_signed_event_once() {
    let w = world().await;
    let (o, p) = w.tenant().await;
    let (hook, secret) = w.hook(&o, &p, "flaky", &["sandbox.status.*"]).await;
    w.receiver.answer("flaky", &[500, 200]);
    w.start(fast_config());
    let e = w.status_event(&p, 1).await;
    let store = w.store();
    eventually("the delivery to succeed", || {
        let store = store.clone();
        let id = hook.id.clone();
        async move {
            let log = store.list_deliveries(&id, None, 10).await.unwrap();
            log.first()
                .is_some_and(|d| d.status == DeliveryStatus::Succeeded)
        }
    })
    .await;
    let got = w.receiver.got("flaky");
    assert_eq!(
        got.iter().map(|g| g.answered).collect::<Vec<_>>(),
        [500, 200]
    );
    assert!(
        got.iter().all(|g| g.id == e.id),
        "the same webhook-id on every attempt"
    );
    assert!(
        got.iter().all(|g| verifies(&secret, g)),
        "every attempt is signed"
    );
    // The body is the public event, exactly.
    let sent: PublicEvent = serde_json::from_slice(&got[1].body).unwrap();
    assert_eq!(sent, e);
    let log = store.list_deliveries(&hook.id, None, 10).await.unwrap();
    assert_eq!(log.len(), 1);
    assert_eq!((log[0].attempts, log[0].response_code), (2, Some(200)));
    assert!(log[0].latency_ms.is_some());
    // Redelivered on demand: once more, same id, still verifying.
    store
        .redeliver(&log[0].id, Utc::now(), &Actor::Key("key_t".into()))
        .await
        .unwrap();
    eventually("the redelivery", || async {
        w.receiver.got("flaky").len() == 3
    })
    .await;
    let third = &w.receiver.got("flaky")[2];
    assert!(third.id == e.id && verifies(&secret, third));
    let _ = w.stop.send(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_webhooks_never_cross_and_filters_apply() {
    let w = world().await;
    let (oa, pa) = w.tenant().await;
    let (ob, pb) = w.tenant().await;
    let (_, sa) = w.hook(&oa, &pa, "a", &[]).await;
    let (_, sb) = w.hook(&ob, &pb, "b", &["sandbox.status.changed"]).await;
    let (_, _) = w.hook(&ob, &pb, "b-exec-only", &["sandbox.exec.*"]).await;
    w.start(fast_config());
    let mut ids_a = Vec::new();
    let mut ids_b = Vec::new();
    for v in 1..=3 {
        ids_a.push(w.status_event(&pa, v).await.id);
        ids_b.push(w.status_event(&pb, v).await.id);
    }
    eventually("both receivers to get their three events", || async {
        w.receiver.got("a").len() == 3 && w.receiver.got("b").len() == 3
    })
    .await;
    let mut got_a: Vec<String> = w.receiver.got("a").iter().map(|g| g.id.clone()).collect();
    let mut got_b: Vec<String> = w.receiver.got("b").iter().map(|g| g.id.clone()).collect();
    got_a.sort();
    got_b.sort();
    ids_a.sort();
    ids_b.sort();
    assert_eq!(got_a, ids_a);
    assert_eq!(got_b, ids_b);
    for g in w.receiver.got("a") {
        let e: PublicEvent = serde_json::from_slice(&g.body).unwrap();
        assert_eq!(e.org_id, oa.id);
        assert!(verifies(&sa, &g) && !verifies(&sb, &g));
    }
    // A filter that matches nothing published receives nothing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(w.receiver.got("b-exec-only").is_empty());
    let _ = w.stop.send(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_a_rotation_both_secrets_sign() {
    let w = world().await;
    let (o, p) = w.tenant().await;
    let (hook, old) = w.hook(&o, &p, "rot", &[]).await;
    let new = Secret::generate().unwrap();
    w.store()
        .rotate_webhook_secret(
            &hook.id,
            new.as_bytes(),
            Utc::now() + chrono::Duration::hours(1),
            &Actor::Key("key_t".into()),
        )
        .await
        .unwrap();
    w.start(fast_config());
    w.status_event(&p, 1).await;
    eventually("the delivery", || async {
        !w.receiver.got("rot").is_empty()
    })
    .await;
    let g = &w.receiver.got("rot")[0];
    assert_eq!(g.signature.split(' ').count(), 2, "{}", g.signature);
    assert!(verifies(&old, g) && verifies(&new, g));
    let _ = w.stop.send(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistent_failure_disables_the_webhook_and_says_so_on_the_public_stream() {
    let w = world().await;
    let (o, p) = w.tenant().await;
    let (hook, _) = w.hook(&o, &p, "down", &[]).await;
    w.receiver.answer("down", &[503]);
    w.start(DeliveryConfig {
        disable: DisablePolicy {
            min_failures: 3,
            min_duration: chrono::Duration::zero(),
        },
        ..fast_config()
    });
    let naming = w.announcer.naming().clone();
    let mut events = w
        .announcer
        .bus()
        .events(
            &naming.public_stream().name,
            &naming.public_org_filter(&o.id),
            Some(0),
        )
        .await
        .unwrap();
    w.status_event(&p, 1).await;
    let store = w.store();
    eventually("the webhook to be disabled", || {
        let store = store.clone();
        let id = hook.id.clone();
        async move { !store.get_webhook(&id).await.unwrap().unwrap().enabled }
    })
    .await;
    let h = store.get_webhook(&hook.id).await.unwrap().unwrap();
    assert!(h.disabled_reason.unwrap().contains("3 failed attempts"));
    assert_eq!(
        w.receiver.got("down").len(),
        3,
        "no attempt after the one that disabled it"
    );
    let disabled = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(ev) = events.next().await {
            let e = PublicEvent::decode(&ev.unwrap().payload).unwrap();
            if let EventData::WebhookDisabled(d) = &e.data {
                return (e.clone(), d.clone());
            }
        }
        panic!("stream ended");
    })
    .await
    .expect("a webhook.disabled event");
    assert_eq!(disabled.1.webhook_id, hook.id);
    assert_eq!(disabled.0.cause, Cause::Reconciler);
    assert_eq!(disabled.0.project_id, p.id);
    let _ = w.stop.send(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_url_is_checked_again_at_delivery_time() {
    let w = world().await;
    let (o, p) = w.tenant().await;
    // Stored while the operator allowed loopback; delivered by a process that does not.
    let (hook, _) = w.hook(&o, &p, "inside", &[]).await;
    w.start(DeliveryConfig {
        url_policy: UrlPolicy {
            allow_http: true,
            allow_private: false,
            ..UrlPolicy::default()
        },
        ..fast_config()
    });
    w.status_event(&p, 1).await;
    let store = w.store();
    eventually("a refused attempt", || {
        let store = store.clone();
        let id = hook.id.clone();
        async move {
            let log = store.list_deliveries(&id, None, 10).await.unwrap();
            log.first().is_some_and(|d| d.attempts >= 1)
        }
    })
    .await;
    let d = &store.list_deliveries(&hook.id, None, 10).await.unwrap()[0];
    assert!(
        d.last_error.as_deref().unwrap().contains("loopback"),
        "{:?}",
        d.last_error
    );
    assert_eq!(d.response_code, None);
    assert!(
        w.receiver.got("inside").is_empty(),
        "nothing reached the loopback receiver"
    );
    let _ = w.stop.send(true);
}

/// An exec's two events of one project, published together.
fn exec_events(p: &Project) -> [PublicEvent; 2] {
    let sandbox = SandboxId::new();
    let event = |discriminator: &str, data: EventData| {
        PublicEvent::new(
            p.org_id.clone(),
            p.id.clone(),
            Some(sandbox.clone()),
            Origin::user("key_t"),
            Utc::now(),
            discriminator,
            data,
        )
    };
    [
        event(
            "exec_1",
            EventData::ExecStarted(ExecStarted {
                exec_id: "exec_1".into(),
                program: "echo".into(),
            }),
        ),
        event(
            "exec_1",
            EventData::ExecFinished(ExecFinished {
                exec_id: "exec_1".into(),
                program: "echo".into(),
                exit_code: Some(0),
                duration_ms: 3,
                timed_out: false,
            }),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_gives_each_event_its_own_deliveries_and_names_the_one_it_cannot_read() {
    let w = world().await;
    let (oa, pa) = w.tenant().await;
    let (ob, pb) = w.tenant().await;
    let (all_a, _) = w.hook(&oa, &pa, "all-a", &[]).await;
    let (finished_a, _) = w
        .hook(&oa, &pa, "finished-a", &["sandbox.exec.finished"])
        .await;
    let (all_b, _) = w.hook(&ob, &pb, "all-b", &["sandbox.exec.*"]).await;
    let [started, finished] = exec_events(&pa);
    let [b_started, _] = exec_events(&pb);
    let d = Deliverer {
        store: w.store(),
        announcer: w.announcer.clone(),
        config: fast_config(),
    };
    let (s, f, bs) = (
        started.encode().unwrap(),
        finished.encode().unwrap(),
        b_started.encode().unwrap(),
    );
    let naming = w.announcer.naming();
    let subject = |e: &PublicEvent| {
        naming.public_subject(
            &e.org_id,
            &e.project_id,
            e.sandbox_id.as_ref(),
            e.event_type(),
        )
    };
    let (sa, sf, sb) = (subject(&started), subject(&finished), subject(&b_started));
    // A project with no webhook: its events are passed over by subject, undecoded (these
    // bytes would not decode).
    let (oc, pc) = w.tenant().await;
    let quiet = naming.public_subject(&oc.id, &pc.id, None, EventType::ExecStarted);
    let batch: [(&str, &[u8]); 7] = [
        (&sa, &s),
        ("somewhere.else", b"not a public event"),
        (&sf, &f),
        (&sb, &bs),
        (&sa, &s),
        (&quiet, b"not a public event either"),
        (&sa, b"unreadable, for a project with webhooks"),
    ];
    let answers = d.fan_batch(&batch).await.unwrap();
    assert_eq!(answers.len(), 7);
    assert!(answers[1].is_err(), "the unreadable one is named");
    assert!(
        answers[6].is_err(),
        "an unreadable one of a watched project is named"
    );
    assert!(
        answers
            .iter()
            .enumerate()
            .all(|(i, a)| i == 1 || i == 6 || a.is_ok()),
        "{answers:?}"
    );
    let store = w.store();
    let events_of = |hook: &Webhook| {
        let (store, id) = (store.clone(), hook.id.clone());
        async move {
            let mut ids: Vec<(String, String)> = store
                .list_deliveries(&id, None, 10)
                .await
                .unwrap()
                .into_iter()
                .map(|d| (d.event_id, d.event_type))
                .collect();
            ids.sort();
            ids
        }
    };
    let mut both = vec![
        (started.id.clone(), "sandbox.exec.started".to_owned()),
        (finished.id.clone(), "sandbox.exec.finished".to_owned()),
    ];
    both.sort();
    // The event given twice in the batch is delivered once.
    assert_eq!(events_of(&all_a).await, both);
    assert_eq!(
        events_of(&finished_a).await,
        vec![(finished.id.clone(), "sandbox.exec.finished".to_owned())]
    );
    assert_eq!(
        events_of(&all_b).await,
        vec![(b_started.id.clone(), "sandbox.exec.started".to_owned())]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_waiting_together_are_all_delivered_and_a_poison_one_does_not_hold_them() {
    let w = world().await;
    let (o, p) = w.tenant().await;
    w.hook(&o, &p, "waiting", &[]).await;
    // Published before the fan-out starts: its first fetch takes them together.
    let mut ids = Vec::new();
    for round in 0..3 {
        for e in exec_events(&p) {
            w.announcer.public(&e).await.unwrap();
            ids.push(e.id.clone());
        }
        let junk = format!("{}.pub.junk", w.announcer.naming().prefix());
        w.announcer
            .bus()
            .publish(
                &junk,
                &format!("junk-{round}"),
                bytes::Bytes::from_static(b"{}"),
            )
            .await
            .unwrap();
    }
    w.start(fast_config());
    eventually("all six events delivered", || async {
        w.receiver.got("waiting").len() >= 6
    })
    .await;
    // Nothing more comes (no duplicate from a batch acked twice or read again).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut got: Vec<String> = w
        .receiver
        .got("waiting")
        .iter()
        .map(|g| g.id.clone())
        .collect();
    got.sort();
    ids.sort();
    assert_eq!(got, ids);
    let _ = w.stop.send(true);
}

/// One tenant's slow receiver has a backlog of 3 000 deliveries, due an hour before another
/// tenant's event is published. First in first out, that event would wait for the whole
/// backlog (minutes at eight 200 ms requests at once); claimed fairly, it is delivered while
/// the backlog has barely begun, and the flooder never has more than its cap in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_tenant_does_not_delay_a_quiet_tenants_delivery() {
    let w = world().await;
    let (fo, fp) = w.tenant().await;
    let (qo, qp) = w.tenant().await;
    let (flood, _) = w.hook(&fo, &fp, "flood", &[]).await;
    let (_, quiet_secret) = w.hook(&qo, &qp, "quiet", &[]).await;
    w.receiver.slow("flood", Duration::from_millis(200));
    let backlog: Vec<differently_store::webhooks::NewDelivery> = (0..3_000)
        .map(|i| differently_store::webhooks::NewDelivery {
            id: format!("whd_{}", ulid_of()),
            webhook_id: flood.id.clone(),
            event_id: format!("evt_flood_{i}"),
            event_type: "sandbox.status.changed".into(),
            body: "{}".into(),
        })
        .collect();
    w.store()
        .enqueue_deliveries(&backlog, Utc::now() - chrono::Duration::hours(1))
        .await
        .unwrap();
    let config = DeliveryConfig {
        concurrency: 8,
        per_webhook: 4,
        ..fast_config()
    };
    w.start(config.clone());
    eventually("the flood to start", || async {
        !w.receiver.got("flood").is_empty()
    })
    .await;
    let e = w.status_event(&qp, 1).await;
    // A generous deadline for a busy machine; first in first out needs over a minute.
    eventually("the quiet tenant's delivery", || async {
        !w.receiver.got("quiet").is_empty()
    })
    .await;
    let sent = w.receiver.got("flood").len();
    assert!(
        sent < backlog.len() / 2,
        "the quiet delivery waited for the backlog ({sent} of {} sent first)",
        backlog.len()
    );
    let got = &w.receiver.got("quiet")[0];
    assert_eq!(got.id, e.id);
    assert!(verifies(&quiet_secret, got));
    assert!(
        w.receiver.most_at_once("flood") <= config.per_webhook,
        "{} of the flooder's requests at once, over its cap of {}",
        w.receiver.most_at_once("flood"),
        config.per_webhook
    );
    let _ = w.stop.send(true);
}

/// One process leads the fan-out at a time. When it stops, another takes over from the
/// cursor the first saved: the events published after are delivered, and none twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_takes_the_fan_out_over_when_the_first_stops() {
    let w = world().await;
    let (o, p) = w.tenant().await;
    w.hook(&o, &p, "handover", &[]).await;
    let (stop_first, first_stopped) = watch::channel(false);
    w.start_until(fast_config(), first_stopped);
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(w.status_event(&p, 1).await.id);
    }
    eventually("the first process delivers three events", || async {
        w.ids_at("handover").len() >= 3
    })
    .await;
    // The second stands by while the first leads.
    let (stop_second, second_stopped) = watch::channel(false);
    w.start_until(fast_config(), second_stopped);
    let store = w.store();
    let last = w
        .announcer
        .bus()
        .last_sequence(&w.public_stream())
        .await
        .unwrap();
    eventually("the cursor saved through the third event", || async {
        store.fan_out_cursor().await.unwrap() >= Some(last)
    })
    .await;
    let _ = stop_first.send(true);
    for _ in 0..3 {
        ids.push(w.status_event(&p, 2).await.id);
    }
    eventually("the second process delivers the next three", || async {
        w.ids_at("handover").len() >= 6
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    ids.sort();
    assert_eq!(w.ids_at("handover"), ids, "each event once");
    let _ = stop_second.send(true);
}

/// The first fan-out of this version starts where the durable consumer that earlier
/// versions shared had acked through, and removes that consumer: an event it acked is not
/// delivered again, one it held unacked and one published later are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fan_out_takes_over_from_the_durable_consumer_of_earlier_versions() {
    let w = world().await;
    let (o, p) = w.tenant().await;
    w.hook(&o, &p, "upgrade", &[]).await;
    let stream = w.public_stream();
    let bus = w.announcer.bus().clone();
    let legacy = differently_bus_schema::ConsumerDef {
        stream: stream.clone(),
        durable: differently_bus_schema::naming::WEBHOOK_CONSUMER.to_owned(),
        filter: format!("{}.pub.>", w.announcer.naming().prefix()),
        ack_wait: Duration::from_secs(30),
    };
    let mut pull = bus.pull(&legacy).await.unwrap();
    let acked = w.status_event(&p, 1).await;
    let held = w.status_event(&p, 2).await;
    let first = pull.next(Duration::from_secs(5)).await.unwrap().unwrap();
    first.acker.ack().await.unwrap();
    let second = pull.next(Duration::from_secs(5)).await.unwrap().unwrap();
    drop(second);
    drop(pull);
    eventually(
        "the old consumer's ack floor is the first event",
        || async {
            bus.consumer_ack_floor(&stream, &legacy.durable)
                .await
                .unwrap()
                == Some(1)
        },
    )
    .await;
    w.start(fast_config());
    let later = w.status_event(&p, 3).await;
    eventually("the held and the later event delivered", || async {
        w.ids_at("upgrade").len() >= 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut want = vec![held.id.clone(), later.id.clone()];
    want.sort();
    assert_eq!(
        w.ids_at("upgrade"),
        want,
        "not the acked one ({})",
        acked.id
    );
    assert_eq!(
        bus.consumer_ack_floor(&stream, &legacy.durable)
            .await
            .unwrap(),
        None,
        "the old durable consumer is removed"
    );
    let _ = w.stop.send(true);
}

/// A saved cursor beyond the stream's last sequence (the stream was made anew, a server
/// that lost its store) would wait for sequences that come only much later: the fan-out
/// reads the stream from its start instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_beyond_the_streams_end_reads_it_from_its_start() {
    let w = world().await;
    let (o, p) = w.tenant().await;
    w.hook(&o, &p, "anew", &[]).await;
    let store = w.store();
    store.save_fan_out_cursor(1_000_000).await.unwrap();
    let e = w.status_event(&p, 1).await;
    w.start(fast_config());
    eventually("the event delivered", || async {
        !w.ids_at("anew").is_empty()
    })
    .await;
    assert_eq!(w.ids_at("anew"), vec![e.id.clone()]);
    let cursor = store.fan_out_cursor().await.unwrap();
    assert!(
        cursor.is_some_and(|c| c < 1_000_000),
        "the cursor starts again: {cursor:?}"
    );
    let _ = w.stop.send(true);
}

/// The public stream made anew under a leading fan-out (a NATS server that lost its store:
/// the stream comes back empty and its sequences start again). The fan-out's reader would
/// wait for sequences past what it had read; the fan-out notices the stream ends before
/// that and reads the new stream from its start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_made_anew_under_the_fan_out_is_read_from_its_start() {
    let w = world().await;
    let (o, p) = w.tenant().await;
    w.hook(&o, &p, "amnesia", &[]).await;
    w.start(fast_config());
    let mut ids = Vec::new();
    for version in 1..=3 {
        ids.push(w.status_event(&p, version).await.id);
    }
    eventually("three events delivered", || async {
        w.ids_at("amnesia").len() >= 3
    })
    .await;
    let admin = differently_bus::jetstream::connect(&w._nats.url(), 1)
        .await
        .unwrap();
    admin
        .context()
        .delete_stream(w.public_stream())
        .await
        .unwrap();
    w.announcer
        .bus()
        .ensure_streams(w.announcer.naming())
        .await
        .unwrap();
    let on_the_new_stream = w.status_event(&p, 4).await;
    assert_eq!(
        w.announcer
            .bus()
            .last_sequence(&w.public_stream())
            .await
            .unwrap(),
        1,
        "the new stream starts again"
    );
    ids.push(on_the_new_stream.id.clone());
    eventually("the event on the new stream delivered", || async {
        w.ids_at("amnesia").len() >= 4
    })
    .await;
    ids.sort();
    assert_eq!(w.ids_at("amnesia"), ids);
    let _ = w.stop.send(true);
}
