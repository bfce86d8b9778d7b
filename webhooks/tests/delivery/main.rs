//! Webhook delivery end to end inside one process, on the real parts: Postgres (a fresh
//! database), a real nats-server (JetStream), and a real HTTP receiver on 127.0.0.1 that
//! verifies every signature as a Standard Webhooks receiver does.

#![allow(clippy::unwrap_used)]

mod fan_out;
mod world;

use std::time::Duration;

use chrono::Utc;
use differently_bus_schema::public::{
    Cause, EventData, ExecFinished, ExecStarted, Origin, PublicEvent,
};
use differently_bus_schema::EventType;
use differently_core::SandboxId;
use differently_store::webhooks::{DeliveryStatus, DisablePolicy, Webhook};
use differently_store::{Actor, Project};
use differently_webhooks::signing::Secret;
use differently_webhooks::{Deliverer, DeliveryConfig, UrlPolicy};
use futures::StreamExt;

use world::*;

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
