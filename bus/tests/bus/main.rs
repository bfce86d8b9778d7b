//! The bus contract, written once and run against both implementations: the in-process
//! `MemoryBus` and `JetStreamBus` on a private nats-server ≥ 2.10.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
mod callout;
mod events;
mod jetstream_server;
mod requests;

use differently_bus::jetstream;
use differently_bus::memory::MemoryBus;
use differently_bus::testing::NatsServer;
use differently_bus::{Bus, BusError, BusExt, Delivery, Event, Published, Pull};
use differently_bus_schema::{ConsumerDef, Envelope, Naming, StatusChanged, Work, WorkOp};
use differently_core::SandboxId;
use futures::stream::BoxStream;
use futures::StreamExt;

/// Ack-wait of the timing cases: short, so they stay fast, but far above scheduling noise.
const ACK_WAIT: Duration = Duration::from_secs(1);

/// A bus under test, with the server behind it (if any) kept alive.
struct Harness {
    bus: Arc<dyn Bus>,
    naming: Naming,
    server: Option<NatsServer>,
    /// Whether `pull` binds with `Bus::pull_ahead` rather than `Bus::pull`.
    ahead: bool,
}

impl Harness {
    async fn memory() -> Harness {
        Harness::ready(Arc::new(MemoryBus::new()), None).await
    }

    async fn jetstream() -> Harness {
        let server = NatsServer::start();
        let bus = jetstream::connect(&server.url(), 1).await.expect("connect");
        Harness::ready(Arc::new(bus), Some(server)).await
    }

    async fn ready(bus: Arc<dyn Bus>, server: Option<NatsServer>) -> Harness {
        let naming = Naming::new("t").expect("naming");
        bus.ensure_streams(&naming).await.expect("ensure_streams");
        Harness {
            bus,
            naming,
            server,
            ahead: false,
        }
    }

    /// The same, with `pull` binding ahead (`Bus::pull_ahead`).
    fn ahead(mut self) -> Harness {
        self.ahead = true;
        self
    }

    fn work(&self, pool: &str) -> String {
        self.naming.work_subject(pool, WorkOp::Create)
    }

    fn consumer(&self, pool: &str) -> ConsumerDef {
        self.naming.work_consumer(pool, ACK_WAIT)
    }

    async fn publish(&self, subject: &str, id: &str, body: &str) -> Published {
        self.bus
            .publish(subject, id, Bytes::from(body.to_owned()))
            .await
            .expect("publish")
    }

    async fn pull(&self, pool: &str) -> Box<dyn Pull> {
        let def = self.consumer(pool);
        if self.ahead {
            self.bus.pull_ahead(&def).await.expect("pull_ahead")
        } else {
            self.bus.pull(&def).await.expect("pull")
        }
    }

    async fn events(
        &self,
        filter: &str,
        after: Option<u64>,
    ) -> BoxStream<'static, Result<Event, BusError>> {
        let stream = self.naming.events_stream().name;
        self.bus
            .events(&stream, filter, after)
            .await
            .expect("events")
    }
}

async fn next(pull: &mut Box<dyn Pull>, wait: Duration) -> Option<Delivery> {
    pull.next(wait).await.expect("next")
}

fn body(d: &Delivery) -> String {
    String::from_utf8_lossy(&d.payload).into_owned()
}

async fn event(events: &mut BoxStream<'static, Result<Event, BusError>>) -> Event {
    tokio::time::timeout(Duration::from_secs(5), events.next())
        .await
        .expect("an event within 5 s")
        .expect("stream still open")
        .expect("event")
}

use events::*;
use requests::*;

/// Each case runs against both buses; `@bind f;` first passes each harness through `f`.
macro_rules! both {
    ($($case:ident),* $(,)?) => { both!(@bind std::convert::identity; $($case),*); };
    (@bind $bind:path; $($case:ident),* $(,)?) => {$(
        mod $case {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn memory() {
                super::$case($bind(super::Harness::memory().await)).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn jetstream() {
                super::$case($bind(super::Harness::jetstream().await)).await;
            }
        }
    )*};
}

both!(
    ensure_streams_is_idempotent,
    publish_pull_ack_leaves_nothing,
    what_came_together_is_buffered_and_nothing_more,
    next_waits_for_a_late_message,
    duplicate_msg_id_is_dropped,
    nak_redelivers_after_the_delay,
    unacked_message_redelivers_after_ack_wait,
    in_progress_holds_a_message_past_ack_wait,
    term_never_redelivers,
    pullers_of_one_durable_share_the_messages,
    pools_do_not_see_each_others_work,
    events_replay_after_a_sequence_then_follow,
    the_final_filter_reads_only_final_status_changes,
    positions_of_a_stream_and_of_a_durable_consumer,
    typed_pull_decodes_terms_malformed_and_defers_newer_versions,
    typed_events_skip_what_does_not_decode,
    a_served_request_is_answered,
    a_request_nobody_serves_is_no_responders,
    a_request_left_unanswered_times_out,
);

/// The pull cases again with consumers bound ahead (`Bus::pull_ahead`): the pull's
/// guarantees hold whichever way messages reach it.
mod ahead {
    use super::*;

    both!(@bind super::Harness::ahead;
        publish_pull_ack_leaves_nothing,
        next_waits_for_a_late_message,
        nak_redelivers_after_the_delay,
        unacked_message_redelivers_after_ack_wait,
        in_progress_holds_a_message_past_ack_wait,
        term_never_redelivers,
        pullers_of_one_durable_share_the_messages,
        pools_do_not_see_each_others_work,
        what_is_here_is_buffered_in_order,
    );
}

/// Ahead, `next_buffered` hands out what has reached this process, in publish order, and
/// never waits: whatever it does not hold yet comes through `next`, nothing twice, nothing
/// lost.
async fn what_is_here_is_buffered_in_order(h: Harness) {
    const N: usize = 20;
    let mut p = h.pull("a").await;
    for i in 0..N {
        h.publish(&h.work("a"), &format!("m{i}"), &format!("b{i}"))
            .await;
    }
    let mut bodies = Vec::new();
    let mut buffered = 0;
    while bodies.len() < N {
        let d = next(&mut p, Duration::from_secs(2))
            .await
            .unwrap_or_else(|| panic!("only {} of {N} arrived: {bodies:?}", bodies.len()));
        bodies.push(body(&d));
        d.acker.ack().await.expect("ack");
        loop {
            let asked = Instant::now();
            let d = p.next_buffered().await.expect("next_buffered");
            assert!(
                asked.elapsed() < Duration::from_millis(100),
                "next_buffered waited {:?}",
                asked.elapsed()
            );
            let Some(d) = d else { break };
            buffered += 1;
            bodies.push(body(&d));
            d.acker.ack().await.expect("ack");
        }
    }
    let want: Vec<String> = (0..N).map(|i| format!("b{i}")).collect();
    assert_eq!(bodies, want, "in publish order, each once");
    assert!(
        buffered > 0,
        "{N} messages published back to back, none held ahead"
    );
    assert!(next(&mut p, ACK_WAIT + Duration::from_millis(300))
        .await
        .is_none());
}

/// A consumer bound ahead keeps receiving through a restart of its server: the client
/// reconnects and the pull subscribes again, with no new binding by the caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_ahead_follows_a_server_restart() {
    let mut h = Harness::jetstream().await.ahead();
    let mut p = h.pull("a").await;
    h.publish(&h.work("a"), "m1", "before").await;
    let d = next(&mut p, Duration::from_secs(2))
        .await
        .expect("before the restart");
    assert_eq!(body(&d), "before");
    d.acker.ack().await.expect("ack");
    h.server.as_mut().expect("server").restart();
    // Publishing waits for the client to reconnect; keep trying for a while.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match h
            .bus
            .publish(&h.work("a"), "m2", Bytes::from("after"))
            .await
        {
            Ok(_) => break,
            Err(e) if Instant::now() < deadline => {
                eprintln!("publish after restart: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("no publish within 15 s of the restart: {e}"),
        }
    }
    // The ack of "before" was only sent: the restart may have lost it, and then "before"
    // comes again (at least once), ahead of "after".
    let mut got = Vec::new();
    while Instant::now() < deadline && got.last().map(String::as_str) != Some("after") {
        match p.next(Duration::from_secs(1)).await {
            Ok(Some(d)) => {
                got.push(body(&d));
                d.acker.ack().await.expect("ack");
            }
            Ok(None) => {}
            Err(e) => eprintln!("next after restart: {e}"),
        }
    }
    assert!(
        got == ["after"] || got == ["before", "after"],
        "the message published after the restart, through the same pull: {got:?}"
    );
}

async fn ensure_streams_is_idempotent(h: Harness) {
    h.bus
        .ensure_streams(&h.naming)
        .await
        .expect("second ensure_streams");
    h.bus
        .ensure_streams(&h.naming)
        .await
        .expect("third ensure_streams");
    h.publish(&h.work("a"), "m1", "one").await;
    let mut p = h.pull("a").await;
    let d = next(&mut p, Duration::from_secs(2))
        .await
        .expect("message after re-ensure");
    assert_eq!(body(&d), "one");
    d.acker.ack().await.expect("ack");
}

async fn publish_pull_ack_leaves_nothing(h: Harness) {
    h.publish(&h.work("a"), "m1", "hello").await;
    let mut p = h.pull("a").await;
    let d = next(&mut p, Duration::from_secs(2))
        .await
        .expect("a message");
    assert_eq!(d.subject, h.work("a"));
    assert_eq!(body(&d), "hello");
    assert_eq!(d.delivered, 1);
    d.acker.ack().await.expect("ack");
    // Past the ack-wait: an acked message never comes back.
    assert!(next(&mut p, ACK_WAIT + Duration::from_millis(500))
        .await
        .is_none());
    // Nor for a fresh binding of the same durable.
    let mut again = h.pull("a").await;
    assert!(next(&mut again, Duration::from_millis(300)).await.is_none());
}

/// `next_buffered` hands out what the consumer already holds, in order, and never waits: the
/// in-process bus holds everything published, JetStream what its last fetch brought, so a
/// message published later comes through it or through `next`, but is never lost.
async fn what_came_together_is_buffered_and_nothing_more(h: Harness) {
    for i in 1..=3 {
        h.publish(&h.work("a"), &format!("m{i}"), &format!("b{i}"))
            .await;
    }
    let mut p = h.pull("a").await;
    let first = next(&mut p, Duration::from_secs(2))
        .await
        .expect("a message");
    let mut bodies = vec![body(&first)];
    first.acker.ack().await.expect("ack");
    while let Some(d) = p.next_buffered().await.expect("next_buffered") {
        bodies.push(body(&d));
        d.acker.ack().await.expect("ack");
    }
    assert_eq!(
        bodies,
        ["b1", "b2", "b3"],
        "published together, taken together"
    );
    let asked = std::time::Instant::now();
    assert!(p.next_buffered().await.expect("next_buffered").is_none());
    assert!(
        asked.elapsed() < Duration::from_millis(200),
        "it does not wait"
    );
    h.publish(&h.work("a"), "m4", "b4").await;
    let later = match p.next_buffered().await.expect("next_buffered") {
        Some(d) => d,
        None => next(&mut p, Duration::from_secs(2))
            .await
            .expect("the later one"),
    };
    assert_eq!(body(&later), "b4");
    later.acker.ack().await.expect("ack");
    assert!(next(&mut p, Duration::from_millis(300)).await.is_none());
}

async fn next_waits_for_a_late_message(h: Harness) {
    let mut p = h.pull("a").await;
    let start = Instant::now();
    assert!(next(&mut p, Duration::from_millis(400)).await.is_none());
    let idle = start.elapsed();
    assert!(
        idle >= Duration::from_millis(350),
        "returned after {idle:?}: workers would spin"
    );
    assert!(idle < Duration::from_secs(10), "returned after {idle:?}");

    let start = Instant::now();
    assert!(next(&mut p, Duration::ZERO).await.is_none());
    let idle = start.elapsed();
    assert!(idle < Duration::from_secs(1), "a zero wait took {idle:?}");

    // Fewer messages than a fetch batch come back at once, without waiting out the request.
    h.publish(&h.work("a"), "ready", "ready").await;
    let start = Instant::now();
    let d = next(&mut p, Duration::from_secs(5))
        .await
        .expect("the ready message");
    let waited = start.elapsed();
    assert!(
        waited < Duration::from_secs(1),
        "delivered only after {waited:?}"
    );
    d.acker.ack().await.expect("ack");
    h.publish(&h.work("a"), "ready2", "ready2").await;
    // The publish is acknowledged before the pull has the message: on a busy machine it can
    // arrive a moment later. A zero wait answers at once either way (checked above) and
    // answers the message once it is there, without a fetch of its own.
    let deadline = Instant::now() + Duration::from_secs(30);
    let d = loop {
        if let Some(d) = next(&mut p, Duration::ZERO).await {
            break d;
        }
        assert!(
            Instant::now() < deadline,
            "a ready message never came with a zero wait"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(body(&d), "ready2");
    d.acker.ack().await.expect("ack");

    let bus = h.bus.clone();
    let subject = h.work("a");
    let publisher = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        bus.publish(&subject, "late", Bytes::from_static(b"late"))
            .await
    });
    let start = Instant::now();
    let d = next(&mut p, Duration::from_secs(5))
        .await
        .expect("the late message");
    let waited = start.elapsed();
    assert!(
        waited < Duration::from_secs(2),
        "delivered only after {waited:?}"
    );
    assert_eq!(body(&d), "late");
    d.acker.ack().await.expect("ack");
    publisher.await.expect("publisher task").expect("publish");
}

async fn duplicate_msg_id_is_dropped(h: Harness) {
    // The publisher learns which was dropped (a repair re-send relies on it).
    let outcomes = [
        h.publish(&h.work("a"), "same-id", "first").await,
        h.publish(&h.work("a"), "same-id", "second").await,
        h.publish(&h.work("a"), "other-id", "third").await,
    ];
    assert_eq!(
        outcomes,
        [Published::Stored, Published::Duplicate, Published::Stored]
    );
    let mut p = h.pull("a").await;
    let mut got = Vec::new();
    while let Some(d) = next(&mut p, Duration::from_millis(500)).await {
        got.push(body(&d));
        d.acker.ack().await.expect("ack");
    }
    assert_eq!(got, ["first", "third"]);
}

async fn nak_redelivers_after_the_delay(h: Harness) {
    h.publish(&h.work("a"), "m1", "retry me").await;
    let mut p = h.pull("a").await;
    let d = next(&mut p, Duration::from_secs(2))
        .await
        .expect("a message");
    assert_eq!(d.delivered, 1);
    let delay = Duration::from_millis(700);
    let naked = Instant::now();
    d.acker.nak(delay).await.expect("nak");
    let again = next(&mut p, Duration::from_secs(4))
        .await
        .expect("redelivery");
    let after = naked.elapsed();
    assert!(
        after >= delay - Duration::from_millis(150),
        "redelivered after {after:?}"
    );
    assert!(
        after < Duration::from_secs(3),
        "redelivered after {after:?}"
    );
    assert_eq!(body(&again), "retry me");
    assert_eq!(again.delivered, 2);
    again.acker.ack().await.expect("ack");
    assert!(next(&mut p, Duration::from_millis(300)).await.is_none());
}

async fn unacked_message_redelivers_after_ack_wait(h: Harness) {
    h.publish(&h.work("a"), "m1", "lost worker").await;
    let mut p = h.pull("a").await;
    let got = Instant::now();
    let d = next(&mut p, Duration::from_secs(2))
        .await
        .expect("a message");
    drop(d);
    let again = next(&mut p, Duration::from_secs(5))
        .await
        .expect("redelivery");
    let after = got.elapsed();
    assert!(
        after >= ACK_WAIT - Duration::from_millis(150),
        "redelivered after {after:?}"
    );
    assert_eq!(body(&again), "lost worker");
    assert_eq!(again.delivered, 2);
    again.acker.ack().await.expect("ack");
}

async fn in_progress_holds_a_message_past_ack_wait(h: Harness) {
    h.publish(&h.work("a"), "m1", "slow").await;
    let mut worker = h.pull("a").await;
    let mut rival = h.pull("a").await;
    let d = next(&mut worker, Duration::from_secs(2))
        .await
        .expect("a message");
    let hold = ACK_WAIT * 5 / 2;
    let keep_alive = async {
        let start = Instant::now();
        while start.elapsed() < hold {
            tokio::time::sleep(ACK_WAIT / 4).await;
            d.acker.in_progress().await.expect("in_progress");
        }
    };
    let (_, stolen) = tokio::join!(keep_alive, rival.next(hold));
    assert!(
        stolen.expect("rival next").is_none(),
        "redelivered despite in_progress"
    );
    d.acker.ack().await.expect("ack");
    assert!(next(&mut rival, ACK_WAIT + Duration::from_millis(300))
        .await
        .is_none());
}

async fn term_never_redelivers(h: Harness) {
    h.publish(&h.work("a"), "m1", "poison").await;
    let mut p = h.pull("a").await;
    let d = next(&mut p, Duration::from_secs(2))
        .await
        .expect("a message");
    d.acker.term().await.expect("term");
    assert!(next(&mut p, ACK_WAIT + Duration::from_millis(500))
        .await
        .is_none());
}

async fn pullers_of_one_durable_share_the_messages(h: Harness) {
    const N: usize = 40;
    for i in 0..N {
        h.publish(&h.work("a"), &format!("m{i}"), &format!("{i}"))
            .await;
    }
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let mut p = h.pull("a").await;
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(d) = p.next(Duration::from_millis(700)).await.expect("next") {
                got.push(body(&d));
                d.acker.ack().await.expect("ack");
            }
            got
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("puller task"));
    }
    let unique: BTreeSet<_> = all.iter().cloned().collect();
    assert_eq!(unique.len(), all.len(), "duplicates in {all:?}");
    let want: BTreeSet<_> = (0..N).map(|i| i.to_string()).collect();
    assert_eq!(unique, want);
}

async fn pools_do_not_see_each_others_work(h: Harness) {
    h.publish(&h.work("a"), "for-a", "a-work").await;
    h.publish(
        &h.naming.work_subject("b", WorkOp::Delete),
        "for-b",
        "b-work",
    )
    .await;
    let mut b = h.pull("b").await;
    let d = next(&mut b, Duration::from_secs(2))
        .await
        .expect("b's message");
    assert_eq!(body(&d), "b-work");
    d.acker.ack().await.expect("ack");
    assert!(next(&mut b, Duration::from_millis(500)).await.is_none());
    let mut a = h.pull("a").await;
    let d = next(&mut a, Duration::from_secs(2))
        .await
        .expect("a's message");
    assert_eq!(body(&d), "a-work");
    d.acker.ack().await.expect("ack");
    assert!(next(&mut a, Duration::from_millis(500)).await.is_none());
}

fn work_envelope(v: u32) -> (SandboxId, String) {
    let id = SandboxId::new();
    let mut env = Envelope::new(
        id.clone(),
        1,
        Work {
            op: WorkOp::Create,
            pool: "p".into(),
            op_id: None,
            terminating: None,
            warm: None,
        },
    );
    env.v = v;
    let json = String::from_utf8(env.encode().expect("encode")).expect("utf-8");
    (id, json)
}

/// A consumer of the typed pull sees only decoded messages: a malformed one is terminated
/// (never redelivered), one of a newer schema major is left for later (redelivered after
/// `NEWER_VERSION_DELAY`), and a good one arrives decoded with its delivery.
async fn typed_pull_decodes_terms_malformed_and_defers_newer_versions(h: Harness) {
    let (good_id, good) = work_envelope(differently_bus_schema::SCHEMA_VERSION);
    let (_, newer) = work_envelope(differently_bus_schema::SCHEMA_VERSION + 1);
    h.publish(&h.work("p"), "bad", "{\"v\":1,\"body\":\"nope\"}")
        .await;
    h.publish(&h.work("p"), "newer", &newer).await;
    h.publish(&h.work("p"), "good", &good).await;
    let mut pull = h
        .bus
        .pull_typed::<Work>(&h.consumer("p"))
        .await
        .expect("typed pull");
    let mut got = None;
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.is_none() && Instant::now() < deadline {
        got = pull.next(Duration::from_millis(500)).await.expect("next");
    }
    let typed = got.expect("the good message within 5 s");
    assert_eq!(typed.env.sandbox_id, good_id);
    assert_eq!(typed.env.body.op, WorkOp::Create);
    assert_eq!(typed.delivery.delivered, 1);
    typed.delivery.acker.ack().await.expect("ack");

    // What is left on the raw consumer: only the newer-version message, back after its delay.
    let mut raw = h.pull("p").await;
    let back = next(
        &mut raw,
        differently_bus::typed::NEWER_VERSION_DELAY + Duration::from_secs(3),
    )
    .await
    .expect("the newer-version message is redelivered, not dropped");
    assert_eq!(body(&back), newer);
    assert!(back.delivered >= 2, "delivered {}", back.delivered);
    back.acker.ack().await.expect("ack");
    assert!(
        next(&mut raw, Duration::from_millis(1500)).await.is_none(),
        "the malformed one was terminated"
    );
}
