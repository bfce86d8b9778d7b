//! Webhooks and deliveries, against both stores: secrets sealed and rotated with overlap,
//! tenant-scoped listing, deliveries created once per (webhook, event), claimed by one
//! claimer at a time with a lease that a crashed claimer's successor takes over, and
//! persistent failure disabling the webhook with an audit record.

use std::collections::HashSet;
use std::sync::Arc;

use chrono::{Duration, Utc};
use differently_core::{OrgId, ProjectId};
use differently_store::audit::AuditFilter;
use differently_store::sealed::{self, SealKey};
use differently_store::webhooks::{
    AttemptOutcome, DeliveryStatus, DisablePolicy, NewDelivery, Webhook, WebhookPatch,
};
use differently_store::{Actor, Org, OrgStatus, Project, Store};

use crate::{Backend, Env};

macro_rules! webhook_conformance {
    ($($case:ident),+ $(,)?) => {
        mod memory {
            $(
                #[tokio::test]
                async fn $case() {
                    super::$case(&crate::Env::memory()).await;
                }
            )+
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(&crate::Env::postgres().await).await;
                }
            )+
        }
    };
}

webhook_conformance!(
    webhooks_are_stored_scoped_patched_and_deleted_with_audit,
    rotation_keeps_the_old_secret_signing_until_the_overlap_ends,
    an_event_is_enqueued_once_per_webhook,
    a_claim_is_exclusive_until_its_lease_runs_out,
    attempts_are_recorded_retried_and_redelivered,
    persistent_failure_disables_the_webhook_and_its_deliveries_wait,
    concurrent_claimers_never_share_a_delivery,
    a_flooding_tenant_does_not_hold_a_quiet_one_back,
    a_tenants_webhooks_take_turns,
    the_fan_out_cursor_is_kept_and_its_lock_is_its_own,
);

/// A cap on deliveries in flight per webhook that no case here reaches.
const ANY: usize = 1_000_000;

fn actor() -> Actor {
    Actor::Key("key_hooks".into())
}

fn ensure_seal_key() {
    let _ = sealed::set_process_key(SealKey::random().unwrap());
}

/// A fresh id with `prefix` (a ULID borrowed from an org id).
fn id(prefix: &str) -> String {
    let org = OrgId::new();
    format!("{prefix}{}", &org.as_str()[4..])
}

async fn tenant(s: &dyn Store) -> (Org, Project) {
    let o = Org {
        id: OrgId::new(),
        name: format!("o-{}", OrgId::new()),
        status: OrgStatus::Active,
        created_at: Utc::now(),
    };
    s.create_org(&o, &actor()).await.unwrap();
    let p = Project {
        id: ProjectId::new(),
        org_id: o.id.clone(),
        name: format!("p-{}", ProjectId::new()),
        created_at: Utc::now(),
    };
    s.create_project(&p, &actor()).await.unwrap();
    (o, p)
}

fn hook(org: &Org, project: &Project, types: &[&str]) -> Webhook {
    let now = Utc::now();
    Webhook {
        id: id("whk_"),
        org_id: org.id.clone(),
        project_id: project.id.clone(),
        url: "https://hooks.example.com/in".into(),
        event_types: types.iter().map(|t| t.to_string()).collect(),
        description: Some("ci".into()),
        enabled: true,
        disabled_reason: None,
        consecutive_failures: 0,
        failing_since: None,
        previous_secret_expires_at: None,
        created_at: now,
        updated_at: now,
    }
}

fn delivery(w: &Webhook, event: &str) -> NewDelivery {
    NewDelivery {
        id: id("whd_"),
        webhook_id: w.id.clone(),
        event_id: event.to_owned(),
        event_type: "sandbox.status".into(),
        body: format!(r#"{{"id":"{event}"}}"#),
    }
}

fn failure(retry_in: Option<Duration>) -> AttemptOutcome {
    AttemptOutcome {
        succeeded: false,
        response_code: Some(500),
        latency_ms: 12,
        error: Some("receiver answered 500".into()),
        response_body: Some("x".repeat(5000)),
        retry_at: retry_in.map(|d| Utc::now() + d),
    }
}

fn success() -> AttemptOutcome {
    AttemptOutcome {
        succeeded: true,
        response_code: Some(204),
        latency_ms: 3,
        error: None,
        response_body: None,
        retry_at: None,
    }
}

/// The enabled webhooks of `project` that want `event_type`, matched as the fan-out
/// matches them.
async fn wanting(
    s: &dyn Store,
    project: &ProjectId,
    event_type: &str,
) -> Result<Vec<Webhook>, differently_store::StoreError> {
    let hooks = s.enabled_webhooks(project).await?;
    Ok(hooks.into_iter().filter(|h| h.wants(event_type)).collect())
}

pub async fn webhooks_are_stored_scoped_patched_and_deleted_with_audit(env: &Env) {
    ensure_seal_key();
    let s = env.store.as_ref();
    let (o1, p1) = tenant(s).await;
    let (o2, p2) = tenant(s).await;
    let a = s
        .create_webhook(&hook(&o1, &p1, &["sandbox.status"]), b"whsec-a", &actor())
        .await
        .unwrap();
    let b = s
        .create_webhook(&hook(&o2, &p2, &[]), b"whsec-b", &actor())
        .await
        .unwrap();
    // A project of another org is not found.
    let mut cross = hook(&o1, &p2, &[]);
    cross.id = id("whk_");
    assert!(s.create_webhook(&cross, b"x", &actor()).await.is_err());

    assert_eq!(s.get_webhook(&a.id).await.unwrap().as_ref(), Some(&a));
    let listed = s.list_webhooks(&o1.id, None, None, 10).await.unwrap();
    assert_eq!(listed, vec![a.clone()]);
    assert!(s
        .list_webhooks(&o1.id, Some(&p2.id), None, 10)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        s.list_webhooks(&o2.id, Some(&p2.id), None, 10)
            .await
            .unwrap(),
        vec![b.clone()]
    );
    assert_eq!(
        s.webhook_secrets(&a.id, Utc::now()).await.unwrap(),
        Some(vec![b"whsec-a".to_vec()])
    );

    // Every enabled webhook of the project, whatever it filters on (the fan-out matches).
    assert_eq!(s.enabled_webhooks(&p1.id).await.unwrap(), vec![a.clone()]);
    assert_eq!(s.enabled_webhooks(&p2.id).await.unwrap(), vec![b.clone()]);
    // Several projects in one read (the fan-out's batch), in id order, each webhook once.
    let mut both = vec![a.clone(), b.clone()];
    both.sort_by(|x, y| x.id.cmp(&y.id));
    let projects = [p2.id.clone(), p1.id.clone(), p2.id.clone()];
    assert_eq!(s.enabled_webhooks_of(&projects).await.unwrap(), both);
    assert!(s.enabled_webhooks_of(&[]).await.unwrap().is_empty());

    // Filters: an empty list takes every type.
    assert_eq!(
        wanting(s, &p1.id, "sandbox.status").await.unwrap(),
        vec![a.clone()]
    );
    assert!(wanting(s, &p1.id, "exec.finished")
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        wanting(s, &p2.id, "exec.finished").await.unwrap(),
        vec![b.clone()]
    );

    let patched = s
        .update_webhook(
            &a.id,
            &WebhookPatch {
                url: Some("https://other.example.com/x".into()),
                description: Some(None),
                enabled: Some(false),
                ..Default::default()
            },
            &actor(),
        )
        .await
        .unwrap();
    assert_eq!(patched.url, "https://other.example.com/x");
    assert_eq!(patched.description, None);
    assert!(!patched.enabled && patched.disabled_reason.is_some());
    assert!(s.enabled_webhooks(&p1.id).await.unwrap().is_empty());
    assert_eq!(
        s.enabled_webhooks_of(&[p1.id.clone(), p2.id.clone()])
            .await
            .unwrap(),
        vec![b.clone()]
    );
    assert_eq!(patched.event_types, vec!["sandbox.status".to_owned()]);
    assert!(wanting(s, &p1.id, "sandbox.status")
        .await
        .unwrap()
        .is_empty());
    assert_eq!(s.get_webhook(&a.id).await.unwrap(), Some(patched));

    s.delete_webhook(&a.id, &actor()).await.unwrap();
    assert_eq!(s.get_webhook(&a.id).await.unwrap(), None);
    assert!(matches!(
        s.delete_webhook(&a.id, &actor()).await,
        Err(differently_store::StoreError::NotFound)
    ));

    let recs = s
        .list_audit(&AuditFilter {
            resource: Some(a.id.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    let actions: Vec<&str> = recs.iter().map(|r| r.action.as_str()).collect();
    assert_eq!(
        actions,
        ["webhook.create", "webhook.update", "webhook.delete"]
    );
    assert_eq!(
        recs[0].detail["secretFingerprint"],
        serde_json::json!(sealed::fingerprint(b"whsec-a"))
    );
    let text = serde_json::to_string(&recs).unwrap();
    assert!(!text.contains("whsec-a"), "{text}");

    // The secret is sealed: the stored bytes are not the secret.
    if let Backend::Postgres(db) = &env.backend {
        let stored: Vec<u8> =
            sqlx::query_scalar("SELECT secret_sealed FROM webhooks WHERE id = $1")
                .bind(&b.id)
                .fetch_one(db.store().pool())
                .await
                .unwrap();
        assert!(!stored.windows(7).any(|w| w == b"whsec-b"));
    }
}

pub async fn rotation_keeps_the_old_secret_signing_until_the_overlap_ends(env: &Env) {
    ensure_seal_key();
    let s = env.store.as_ref();
    let (o, p) = tenant(s).await;
    let w = s
        .create_webhook(&hook(&o, &p, &[]), b"old", &actor())
        .await
        .unwrap();
    let until = Utc::now() + Duration::hours(1);
    let r = s
        .rotate_webhook_secret(&w.id, b"new", until, &actor())
        .await
        .unwrap();
    assert!(r.previous_secret_expires_at.is_some());
    let now = Utc::now();
    assert_eq!(
        s.webhook_secrets(&w.id, now).await.unwrap(),
        Some(vec![b"new".to_vec(), b"old".to_vec()])
    );
    assert_eq!(
        s.webhook_secrets(&w.id, until + Duration::seconds(1))
            .await
            .unwrap(),
        Some(vec![b"new".to_vec()])
    );
    // A second rotation keeps only the one it replaced.
    s.rotate_webhook_secret(&w.id, b"newer", until, &actor())
        .await
        .unwrap();
    assert_eq!(
        s.webhook_secrets(&w.id, now).await.unwrap(),
        Some(vec![b"newer".to_vec(), b"new".to_vec()])
    );
    assert_eq!(s.webhook_secrets(&id("whk_"), now).await.unwrap(), None);
}

pub async fn an_event_is_enqueued_once_per_webhook(env: &Env) {
    ensure_seal_key();
    let s = env.store.as_ref();
    let (o, p) = tenant(s).await;
    let a = s
        .create_webhook(&hook(&o, &p, &[]), b"a", &actor())
        .await
        .unwrap();
    let b = s
        .create_webhook(&hook(&o, &p, &[]), b"b", &actor())
        .await
        .unwrap();
    let now = Utc::now();
    let first = [delivery(&a, "evt_1"), delivery(&b, "evt_1")];
    assert_eq!(s.enqueue_deliveries(&first, now).await.unwrap(), 2);
    // The same event read again (a redelivered bus message) creates nothing.
    let again = [
        delivery(&a, "evt_1"),
        delivery(&b, "evt_1"),
        delivery(&a, "evt_2"),
    ];
    assert_eq!(s.enqueue_deliveries(&again, now).await.unwrap(), 1);
    // A delivery for a webhook deleted in between is dropped.
    assert_eq!(
        s.enqueue_deliveries(&[delivery(&hook(&o, &p, &[]), "evt_3")], now)
            .await
            .unwrap(),
        0
    );
    let log = s.list_deliveries(&a.id, None, 10).await.unwrap();
    assert_eq!(log.len(), 2);
    assert_eq!(log[0].event_id, "evt_2", "newest first");
    assert!(log
        .iter()
        .all(|d| d.status == DeliveryStatus::Pending && d.attempts == 0));
    let page = s
        .list_deliveries(&a.id, Some(&log[0].id), 10)
        .await
        .unwrap();
    assert_eq!(page, vec![log[1].clone()]);
}

pub async fn a_claim_is_exclusive_until_its_lease_runs_out(env: &Env) {
    ensure_seal_key();
    let s = env.store.as_ref();
    let (o, p) = tenant(s).await;
    let w = s
        .create_webhook(&hook(&o, &p, &[]), b"a", &actor())
        .await
        .unwrap();
    let t0 = Utc::now();
    s.enqueue_deliveries(&[delivery(&w, "evt_1")], t0)
        .await
        .unwrap();
    let lease = Duration::seconds(30);
    let got = s.claim_deliveries(t0, lease, 10, ANY).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].body, r#"{"id":"evt_1"}"#);
    // Held: nobody else gets it…
    assert!(s
        .claim_deliveries(t0 + Duration::seconds(5), lease, 10, ANY)
        .await
        .unwrap()
        .is_empty());
    // …until the lease runs out (its claimer died mid-attempt): then another process does.
    let again = s
        .claim_deliveries(t0 + Duration::seconds(31), lease, 10, ANY)
        .await
        .unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].id, got[0].id);
    // Another handle (a restarted process) sees the same lease.
    let other = env.reopen().await;
    assert!(other
        .claim_deliveries(t0 + Duration::seconds(40), lease, 10, ANY)
        .await
        .unwrap()
        .is_empty());
}

pub async fn attempts_are_recorded_retried_and_redelivered(env: &Env) {
    ensure_seal_key();
    let s = env.store.as_ref();
    let (o, p) = tenant(s).await;
    let w = s
        .create_webhook(&hook(&o, &p, &[]), b"a", &actor())
        .await
        .unwrap();
    let t0 = Utc::now();
    s.enqueue_deliveries(&[delivery(&w, "evt_1")], t0)
        .await
        .unwrap();
    let d = s
        .claim_deliveries(t0, Duration::seconds(30), 1, ANY)
        .await
        .unwrap()
        .remove(0);
    let policy = DisablePolicy::default();
    let r = s
        .record_attempt(
            &d.id,
            &failure(Some(Duration::seconds(60))),
            &policy,
            Utc::now(),
        )
        .await
        .unwrap();
    assert_eq!(r.disabled, None);
    assert_eq!(r.delivery.status, DeliveryStatus::Pending);
    assert_eq!(r.delivery.attempts, 1);
    assert_eq!(r.delivery.response_code, Some(500));
    assert_eq!(
        r.delivery.response_body.as_ref().map(|b| b.len()),
        Some(differently_store::webhooks::MAX_RESPONSE_BODY_BYTES)
    );
    assert!(r.delivery.next_attempt_at.unwrap() > Utc::now() + Duration::seconds(50));
    // Not due yet.
    assert!(s
        .claim_deliveries(Utc::now(), Duration::seconds(30), 1, ANY)
        .await
        .unwrap()
        .is_empty());
    let hooked = s.get_webhook(&w.id).await.unwrap().unwrap();
    assert_eq!(hooked.consecutive_failures, 1);
    assert!(hooked.failing_since.is_some());

    let later = Utc::now() + Duration::seconds(61);
    let d = s
        .claim_deliveries(later, Duration::seconds(30), 1, ANY)
        .await
        .unwrap()
        .remove(0);
    let r = s
        .record_attempt(&d.id, &success(), &policy, later)
        .await
        .unwrap();
    assert_eq!(r.delivery.status, DeliveryStatus::Succeeded);
    assert_eq!(r.delivery.attempts, 2);
    assert_eq!(r.delivery.next_attempt_at, None);
    assert!(r.delivery.delivered_at.is_some());
    let hooked = s.get_webhook(&w.id).await.unwrap().unwrap();
    assert_eq!(
        (hooked.consecutive_failures, hooked.failing_since),
        (0, None)
    );

    // Redelivered on demand: due now, same event id.
    let again = s.redeliver(&d.id, Utc::now(), &actor()).await.unwrap();
    assert_eq!(again.status, DeliveryStatus::Pending);
    let claimed = s
        .claim_deliveries(Utc::now(), Duration::seconds(30), 5, ANY)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].event_id, "evt_1");
    // The schedule over: failed for good.
    let r = s
        .record_attempt(&d.id, &failure(None), &policy, Utc::now())
        .await
        .unwrap();
    assert_eq!(r.delivery.status, DeliveryStatus::Failed);
    assert_eq!(r.delivery.attempts, 3);
    assert_eq!(s.get_delivery(&d.id).await.unwrap(), Some(r.delivery));
}

pub async fn persistent_failure_disables_the_webhook_and_its_deliveries_wait(env: &Env) {
    ensure_seal_key();
    let s = env.store.as_ref();
    let (o, p) = tenant(s).await;
    let w = s
        .create_webhook(&hook(&o, &p, &[]), b"a", &actor())
        .await
        .unwrap();
    let policy = DisablePolicy {
        min_failures: 2,
        min_duration: Duration::zero(),
    };
    let t0 = Utc::now();
    s.enqueue_deliveries(&[delivery(&w, "evt_1"), delivery(&w, "evt_2")], t0)
        .await
        .unwrap();
    let ds = s
        .claim_deliveries(t0, Duration::seconds(30), 5, ANY)
        .await
        .unwrap();
    assert_eq!(ds.len(), 2);
    let r1 = s
        .record_attempt(&ds[0].id, &failure(Some(Duration::zero())), &policy, t0)
        .await
        .unwrap();
    assert_eq!(r1.disabled, None);
    let r2 = s
        .record_attempt(&ds[1].id, &failure(Some(Duration::zero())), &policy, t0)
        .await
        .unwrap();
    let disabled = r2
        .disabled
        .expect("the second failure in a row disables it");
    assert!(!disabled.enabled);
    assert!(disabled
        .disabled_reason
        .as_deref()
        .unwrap()
        .contains("2 failed attempts"));
    // Its deliveries wait instead of failing…
    assert!(s
        .claim_deliveries(
            Utc::now() + Duration::seconds(1),
            Duration::seconds(30),
            5,
            ANY
        )
        .await
        .unwrap()
        .is_empty());
    let recs = s
        .list_audit(&AuditFilter {
            action: Some("webhook.disable".into()),
            resource: Some(w.id.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].actor, "system:webhooks");
    // …and resume when a caller enables it again, with the failure run forgotten.
    let back = s
        .update_webhook(
            &w.id,
            &WebhookPatch {
                enabled: Some(true),
                ..Default::default()
            },
            &actor(),
        )
        .await
        .unwrap();
    assert!(back.enabled && back.disabled_reason.is_none() && back.consecutive_failures == 0);
    assert_eq!(
        s.claim_deliveries(
            Utc::now() + Duration::seconds(1),
            Duration::seconds(30),
            5,
            ANY
        )
        .await
        .unwrap()
        .len(),
        2
    );
}

pub async fn concurrent_claimers_never_share_a_delivery(env: &Env) {
    ensure_seal_key();
    let s = env.store.clone();
    let (o, p) = tenant(s.as_ref()).await;
    let w = s
        .create_webhook(&hook(&o, &p, &[]), b"a", &actor())
        .await
        .unwrap();
    let t0 = Utc::now();
    let items: Vec<NewDelivery> = (0..40).map(|i| delivery(&w, &format!("evt_{i}"))).collect();
    s.enqueue_deliveries(&items, t0).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let s: Arc<dyn Store> = env.reopen().await;
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let got = s
                    .claim_deliveries(t0, Duration::seconds(60), 3, ANY)
                    .await
                    .unwrap();
                if got.is_empty() {
                    return mine;
                }
                mine.extend(got.into_iter().map(|d| d.id));
            }
        }));
    }
    let mut seen = HashSet::new();
    let mut total = 0;
    for t in tasks {
        for id in t.await.unwrap() {
            total += 1;
            assert!(seen.insert(id), "a delivery was claimed twice");
        }
    }
    assert_eq!(total, 40);
}

/// One tenant's backlog of 10 500 deliveries, all due an hour before a quiet tenant's first
/// one: the quiet one is in the very first claim, the flooder never has more than its cap
/// in flight, and with a single free slot the quiet tenant (nothing in flight) goes before
/// the flooder (its cap nearly used), however old the flooder's backlog.
pub async fn a_flooding_tenant_does_not_hold_a_quiet_one_back(env: &Env) {
    ensure_seal_key();
    let s = env.store.as_ref();
    let (fo, fp) = tenant(s).await;
    let (qo, qp) = tenant(s).await;
    let flood = s
        .create_webhook(&hook(&fo, &fp, &[]), b"f", &actor())
        .await
        .unwrap();
    let quiet = s
        .create_webhook(&hook(&qo, &qp, &[]), b"q", &actor())
        .await
        .unwrap();
    let t0 = Utc::now();
    let backlog: Vec<NewDelivery> = (0..10_500)
        .map(|i| delivery(&flood, &format!("evt_f{i}")))
        .collect();
    for chunk in backlog.chunks(2_000) {
        s.enqueue_deliveries(chunk, t0 - Duration::hours(1))
            .await
            .unwrap();
    }
    s.enqueue_deliveries(&[delivery(&quiet, "evt_q1")], t0)
        .await
        .unwrap();
    let lease = Duration::seconds(60);
    let cap = 4;

    let first = s.claim_deliveries(t0, lease, 8, cap).await.unwrap();
    let of = |ds: &[differently_store::webhooks::Delivery], w: &Webhook| {
        ds.iter().filter(|d| d.webhook_id == w.id).count()
    };
    assert_eq!(
        of(&first, &quiet),
        1,
        "the quiet tenant's delivery is in the first claim"
    );
    assert_eq!(of(&first, &flood), cap, "the flooder gets its cap, no more");
    // Nothing recorded yet: the flooder's cap is used, so a claim with room gets nothing.
    assert!(s
        .claim_deliveries(t0, lease, 8, cap)
        .await
        .unwrap()
        .is_empty());

    // One of the flooder's attempts ends; the quiet tenant's first one too, and it has
    // another event. One slot free: the quiet tenant (none in flight) takes it, although
    // the flooder has 10 496 deliveries due for an hour longer.
    let policy = DisablePolicy::default();
    let flood_ids: Vec<String> = first
        .iter()
        .filter(|d| d.webhook_id == flood.id)
        .map(|d| d.id.clone())
        .collect();
    s.record_attempt(&flood_ids[0], &success(), &policy, t0)
        .await
        .unwrap();
    let q1 = first.iter().find(|d| d.webhook_id == quiet.id).unwrap();
    s.record_attempt(&q1.id, &success(), &policy, t0)
        .await
        .unwrap();
    s.enqueue_deliveries(&[delivery(&quiet, "evt_q2")], t0)
        .await
        .unwrap();
    let one = s.claim_deliveries(t0, lease, 1, cap).await.unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(
        one[0].event_id, "evt_q2",
        "the quiet tenant takes the one free slot"
    );
    // The next slot is the flooder's again, up to its cap, and its oldest first.
    let next = s.claim_deliveries(t0, lease, 8, cap).await.unwrap();
    assert_eq!(of(&next, &flood), 1, "three in flight, a cap of four");
    assert_eq!(next.len(), 1);
    let oldest_left = backlog
        .iter()
        .map(|n| n.id.clone())
        .filter(|id| !flood_ids.contains(id))
        .min()
        .unwrap();
    assert_eq!(
        next[0].id, oldest_left,
        "a webhook's own deliveries stay in order"
    );
}

/// Within one tenant, a webhook with a backlog does not hold back its sibling: each
/// webhook's oldest delivery comes before any webhook's second.
pub async fn a_tenants_webhooks_take_turns(env: &Env) {
    ensure_seal_key();
    let s = env.store.as_ref();
    let (o, p) = tenant(s).await;
    let busy = s
        .create_webhook(&hook(&o, &p, &[]), b"b", &actor())
        .await
        .unwrap();
    let calm = s
        .create_webhook(&hook(&o, &p, &[]), b"c", &actor())
        .await
        .unwrap();
    let t0 = Utc::now();
    let backlog: Vec<NewDelivery> = (0..50)
        .map(|i| delivery(&busy, &format!("evt_b{i}")))
        .collect();
    s.enqueue_deliveries(&backlog, t0 - Duration::minutes(10))
        .await
        .unwrap();
    s.enqueue_deliveries(&[delivery(&calm, "evt_c1")], t0)
        .await
        .unwrap();
    let got = s
        .claim_deliveries(t0, Duration::seconds(60), 2, ANY)
        .await
        .unwrap();
    let mut events: Vec<&str> = got.iter().map(|d| d.event_id.as_str()).collect();
    events.sort();
    let oldest = backlog.iter().min_by_key(|n| n.id.clone()).unwrap();
    let mut want = vec![oldest.event_id.as_str(), "evt_c1"];
    want.sort();
    assert_eq!(events, want);
}

mod lock_order;

/// The fan-out's cursor starts absent, keeps the last save (which may move back: a stream
/// made anew) across handles, and the fan-out's lock is held by one at a time and apart from
/// the scheduler's.
async fn the_fan_out_cursor_is_kept_and_its_lock_is_its_own(env: &Env) {
    use differently_store::Lead;
    let s = &env.store;
    assert_eq!(s.fan_out_cursor().await.unwrap(), None);
    s.save_fan_out_cursor(41).await.unwrap();
    s.save_fan_out_cursor(42).await.unwrap();
    let other = env.reopen().await;
    assert_eq!(other.fan_out_cursor().await.unwrap(), Some(42));
    other.save_fan_out_cursor(0).await.unwrap();
    assert_eq!(s.fan_out_cursor().await.unwrap(), Some(0));

    let fan_out = s.try_lead_as(Lead::WebhookFanOut).await.unwrap();
    assert!(fan_out.is_some(), "a free lock is taken");
    assert!(
        other
            .try_lead_as(Lead::WebhookFanOut)
            .await
            .unwrap()
            .is_none(),
        "a held fan-out lock is refused to another handle"
    );
    let scheduler = other.try_lead().await.unwrap();
    assert!(
        scheduler.is_some(),
        "the scheduler's lock is not the fan-out's"
    );
    drop(fan_out);
    let mut again = None;
    for _ in 0..100 {
        again = other.try_lead_as(Lead::WebhookFanOut).await.unwrap();
        if again.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(again.is_some(), "a dropped fan-out lock is free again");
}
