//! The in-process bus for single-process `differently dev`: the JetStream semantics the
//! roles rely on (work queues shared by durable pullers, ack-wait redelivery, in-progress
//! acks, delayed naks, terminate, de-duplication by message id, an event log read from a
//! sequence), without a server and without persistence; and core request/reply between the
//! parts of the process (requests go to the first live server of a matching subject).
//!
//! One mutex guards all state and is never held across an await; one `Notify` wakes every
//! waiter after any change, and waiters re-check state themselves.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use differently_bus_schema::{ConsumerDef, Naming, Retention, StreamDef};
use futures::stream::BoxStream;
use futures::StreamExt;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::{Acker, Bus, BusError, Delivery, Event, Published, Pull, Replier, Request};

/// De-duplication window, as on the JetStream streams.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// Messages a limits stream retains at most, so a long `dev` session stays bounded.
const MAX_RETAINED: usize = 100_000;

/// Events handed to a subscriber per lock acquisition.
const EVENT_CHUNK: usize = 256;

/// An in-process bus. Clones share the same state.
#[derive(Clone, Default)]
pub struct MemoryBus {
    inner: Arc<Inner>,
}

impl MemoryBus {
    /// An empty bus; call `ensure_streams` before publishing, as with JetStream.
    pub fn new() -> Self {
        MemoryBus::default()
    }
}

#[derive(Default)]
struct Inner {
    state: Mutex<State>,
    changed: Notify,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep serving it.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[derive(Default)]
struct State {
    streams: BTreeMap<String, MemStream>,
    next_token: u64,
    /// Live `serve` calls: a subject filter and where its requests go.
    responders: Vec<(String, tokio::sync::mpsc::Sender<Request>)>,
}

/// Requests queued per server before a requester waits (within its timeout).
const SERVE_QUEUE: usize = 64;

/// Answers one request of the in-process bus.
struct MemoryReplier(tokio::sync::oneshot::Sender<Bytes>);

#[async_trait]
impl Replier for MemoryReplier {
    async fn reply(self: Box<Self>, payload: Bytes) -> Result<(), BusError> {
        // A requester that gave up dropped its receiver: the answer goes nowhere, as on NATS.
        let _ = self.0.send(payload);
        Ok(())
    }
}

struct MemStream {
    def: StreamDef,
    /// Sequence of the last stored message (0: none yet).
    last_seq: u64,
    messages: BTreeMap<u64, Stored>,
    dedup: HashMap<String, Instant>,
    dedup_order: VecDeque<(Instant, String)>,
    consumers: HashMap<String, MemConsumer>,
}

struct Stored {
    subject: String,
    payload: Bytes,
    at: Instant,
}

struct MemConsumer {
    filter: String,
    ack_wait: Duration,
    /// Next stream sequence this consumer has not yet looked at.
    cursor: u64,
    /// Delivered but not yet acked or terminated, by stream sequence.
    pending: BTreeMap<u64, InFlight>,
}

struct InFlight {
    delivered: u64,
    /// Redeliverable from this instant on (ack-wait expiry or nak delay).
    due: Instant,
    /// Identifies the latest delivery; acks of an older one may not move the timer.
    token: u64,
}

impl MemStream {
    fn new(def: StreamDef) -> Self {
        MemStream {
            def,
            last_seq: 0,
            messages: BTreeMap::new(),
            dedup: HashMap::new(),
            dedup_order: VecDeque::new(),
            consumers: HashMap::new(),
        }
    }

    fn captures(&self, subject: &str) -> bool {
        self.def
            .subjects
            .iter()
            .any(|f| subject_matches(f, subject))
    }

    fn prune(&mut self, now: Instant) {
        while let Some((at, _)) = self.dedup_order.front() {
            if now.duration_since(*at) < DUPLICATE_WINDOW {
                break;
            }
            if let Some((at, id)) = self.dedup_order.pop_front() {
                if self.dedup.get(&id) == Some(&at) {
                    self.dedup.remove(&id);
                }
            }
        }
        if self.def.retention == Retention::Limits {
            while self.messages.len() > MAX_RETAINED {
                self.messages.pop_first();
            }
            if let Some(max_age) = self.def.max_age.filter(|a| !a.is_zero()) {
                while let Some(entry) = self.messages.first_entry() {
                    if now.duration_since(entry.get().at) < max_age {
                        break;
                    }
                    entry.remove();
                }
            }
        }
    }

    /// Stores a message unless its id was seen inside the window. Returns whether stored.
    fn store(&mut self, subject: &str, msg_id: &str, payload: Bytes, now: Instant) -> bool {
        self.prune(now);
        if self.dedup.contains_key(msg_id) {
            return false;
        }
        self.dedup.insert(msg_id.to_owned(), now);
        self.dedup_order.push_back((now, msg_id.to_owned()));
        self.last_seq += 1;
        self.messages.insert(
            self.last_seq,
            Stored {
                subject: subject.to_owned(),
                payload,
                at: now,
            },
        );
        self.prune(now);
        true
    }

    /// Hands the next message of `durable` out: the oldest due redelivery, else the next
    /// new matching message; when there is none, says when a redelivery falls due.
    fn take(&mut self, durable: &str, now: Instant, token: u64) -> Take {
        let Some(consumer) = self.consumers.get_mut(durable) else {
            return Take::Idle(None);
        };
        // Acked messages of a work queue are gone; forget pending entries whose message
        // expired or was removed.
        consumer
            .pending
            .retain(|seq, _| self.messages.contains_key(seq));
        let due = consumer
            .pending
            .iter()
            .find(|(_, f)| f.due <= now)
            .map(|(s, _)| *s);
        let seq = match due {
            Some(seq) => Some(seq),
            None => {
                let next = self
                    .messages
                    .range(consumer.cursor..)
                    .find(|(seq, m)| {
                        subject_matches(&consumer.filter, &m.subject)
                            && !consumer.pending.contains_key(seq)
                    })
                    .map(|(s, _)| *s);
                match next {
                    Some(seq) => {
                        consumer.cursor = seq + 1;
                        Some(seq)
                    }
                    None => {
                        consumer.cursor = self.last_seq + 1;
                        None
                    }
                }
            }
        };
        let Some(seq) = seq else {
            return Take::Idle(consumer.pending.values().map(|f| f.due).min());
        };
        let Some(m) = self.messages.get(&seq) else {
            return Take::Idle(None);
        };
        let flight = consumer.pending.entry(seq).or_insert(InFlight {
            delivered: 0,
            due: now,
            token,
        });
        flight.delivered += 1;
        flight.due = now + consumer.ack_wait;
        flight.token = token;
        Take::Got(Taken {
            seq,
            subject: m.subject.clone(),
            payload: m.payload.clone(),
            delivered: flight.delivered,
        })
    }
}

/// Outcome of looking for a consumer's next message.
enum Take {
    Got(Taken),
    /// Nothing deliverable now; a pending message falls due at this instant, if any.
    Idle(Option<Instant>),
}

struct Taken {
    seq: u64,
    subject: String,
    payload: Bytes,
    delivered: u64,
}

/// NATS subject matching: tokens split on `.`, `*` matches one token, `>` one or more
/// trailing tokens.
pub fn subject_matches(filter: &str, subject: &str) -> bool {
    let mut f = filter.split('.');
    let mut s = subject.split('.');
    loop {
        match (f.next(), s.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[async_trait]
impl Bus for MemoryBus {
    async fn ensure_streams(&self, naming: &Naming) -> Result<(), BusError> {
        let mut st = self.inner.lock();
        for def in naming.streams() {
            match st.streams.get_mut(&def.name) {
                None => {
                    st.streams.insert(def.name.clone(), MemStream::new(def));
                }
                Some(existing) if existing.def.retention != def.retention => {
                    return Err(BusError::Setup(
                        format!(
                            "stream {} exists with retention {:?}, expected {:?}",
                            def.name, existing.def.retention, def.retention
                        )
                        .into(),
                    ));
                }
                Some(existing) => existing.def = def,
            }
        }
        Ok(())
    }

    async fn publish(
        &self,
        subject: &str,
        msg_id: &str,
        payload: Bytes,
    ) -> Result<Published, BusError> {
        let stored = {
            let mut st = self.inner.lock();
            let stream = st
                .streams
                .values_mut()
                .find(|s| s.captures(subject))
                .ok_or_else(|| {
                    BusError::Publish(format!("{subject}: no stream captures it").into())
                })?;
            stream.store(subject, msg_id, payload, Instant::now())
        };
        if !stored {
            return Ok(Published::Duplicate);
        }
        self.inner.changed.notify_waiters();
        Ok(Published::Stored)
    }

    async fn pull(&self, consumer: &ConsumerDef) -> Result<Box<dyn Pull>, BusError> {
        let mut st = self.inner.lock();
        let stream = st.streams.get_mut(&consumer.stream).ok_or_else(|| {
            BusError::Setup(
                format!(
                    "consumer {}: no stream {}",
                    consumer.durable, consumer.stream
                )
                .into(),
            )
        })?;
        let first = stream
            .messages
            .keys()
            .next()
            .copied()
            .unwrap_or(stream.last_seq + 1);
        let c = stream
            .consumers
            .entry(consumer.durable.clone())
            .or_insert(MemConsumer {
                filter: consumer.filter.clone(),
                ack_wait: consumer.ack_wait,
                cursor: first,
                pending: BTreeMap::new(),
            });
        if c.filter != consumer.filter {
            // As a JetStream consumer update: look at the stream again under the new filter.
            c.filter = consumer.filter.clone();
            c.cursor = first;
        }
        c.ack_wait = consumer.ack_wait;
        Ok(Box::new(MemoryPull {
            inner: self.inner.clone(),
            stream: consumer.stream.clone(),
            durable: consumer.durable.clone(),
        }))
    }

    async fn events(
        &self,
        stream: &str,
        filter: &str,
        after: Option<u64>,
    ) -> Result<BoxStream<'static, Result<Event, BusError>>, BusError> {
        let cursor = {
            let st = self.inner.lock();
            let s = st
                .streams
                .get(stream)
                .ok_or_else(|| BusError::Setup(format!("no stream {stream}").into()))?;
            match after {
                Some(after) => after.saturating_add(1),
                None => s.last_seq + 1,
            }
        };
        let reader = EventReader {
            inner: self.inner.clone(),
            stream: stream.to_owned(),
            filter: filter.to_owned(),
            cursor,
            following: false,
            ready: VecDeque::new(),
        };
        Ok(futures::stream::unfold(reader, |mut r| async move {
            let item = r.next().await;
            Some((item, r))
        })
        .boxed())
    }

    async fn last_sequence(&self, stream: &str) -> Result<u64, BusError> {
        let st = self.inner.lock();
        st.streams
            .get(stream)
            .map(|s| s.last_seq)
            .ok_or_else(|| BusError::Setup(format!("no stream {stream}").into()))
    }

    async fn consumer_ack_floor(
        &self,
        stream: &str,
        durable: &str,
    ) -> Result<Option<u64>, BusError> {
        let st = self.inner.lock();
        let s = st
            .streams
            .get(stream)
            .ok_or_else(|| BusError::Setup(format!("no stream {stream}").into()))?;
        // Everything below the first message still in flight, or below the cursor.
        Ok(s.consumers.get(durable).map(|c| {
            let below = c.pending.keys().next().copied().unwrap_or(c.cursor);
            below.saturating_sub(1)
        }))
    }

    async fn delete_consumer(&self, stream: &str, durable: &str) -> Result<(), BusError> {
        let mut st = self.inner.lock();
        if let Some(s) = st.streams.get_mut(stream) {
            s.consumers.remove(durable);
        }
        Ok(())
    }

    async fn serve(&self, subject: &str) -> Result<BoxStream<'static, Request>, BusError> {
        let (tx, rx) = tokio::sync::mpsc::channel(SERVE_QUEUE);
        {
            let mut st = self.inner.lock();
            st.responders.retain(|(_, tx)| !tx.is_closed());
            st.responders.push((subject.to_owned(), tx));
        }
        Ok(
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) })
                .boxed(),
        )
    }

    async fn request(
        &self,
        subject: &str,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<Bytes, BusError> {
        let deadline = Instant::now() + timeout;
        let server = {
            let mut st = self.inner.lock();
            st.responders.retain(|(_, tx)| !tx.is_closed());
            st.responders
                .iter()
                .find(|(filter, _)| subject_matches(filter, subject))
                .map(|(_, tx)| tx.clone())
        };
        let Some(server) = server else {
            return Err(BusError::NoResponders(subject.into()));
        };
        let (answer, answered) = tokio::sync::oneshot::channel();
        let request = Request::new(subject.to_owned(), payload, Box::new(MemoryReplier(answer)));
        let timed_out = || {
            BusError::Timeout(
                format!("{subject}: no answer within {} ms", timeout.as_millis()).into(),
            )
        };
        match tokio::time::timeout_at(deadline, server.send(request)).await {
            Err(_) => return Err(timed_out()),
            // The server went away since it was looked up.
            Ok(Err(_)) => return Err(BusError::NoResponders(subject.into())),
            Ok(Ok(())) => {}
        }
        match tokio::time::timeout_at(deadline, answered).await {
            Ok(Ok(bytes)) => Ok(bytes),
            // Dropped unanswered (on NATS the requester would wait out its timeout): said
            // at once, as the timeout it would have become.
            Ok(Err(_)) => Err(BusError::Timeout(
                format!("{subject}: the request was dropped unanswered").into(),
            )),
            Err(_) => Err(timed_out()),
        }
    }
}

/// Follows one stream from a sequence, reading the stored log so a slow reader never
/// misses events that are still retained.
struct EventReader {
    inner: Arc<Inner>,
    stream: String,
    filter: String,
    cursor: u64,
    /// Set after the first read: from then on, events dropped by retention before they
    /// were read are reported rather than skipped.
    following: bool,
    ready: VecDeque<Event>,
}

impl EventReader {
    async fn next(&mut self) -> Result<Event, BusError> {
        loop {
            if let Some(e) = self.ready.pop_front() {
                return Ok(e);
            }
            let notified = self.inner.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let st = self.inner.lock();
                let Some(s) = st.streams.get(&self.stream) else {
                    return Err(BusError::Consume(
                        format!("stream {} is gone", self.stream).into(),
                    ));
                };
                let first = s.messages.keys().next().copied().unwrap_or(s.last_seq + 1);
                let lost = s.def.retention == Retention::Limits && first > self.cursor;
                if lost && self.following {
                    let missed = (self.cursor, first - 1);
                    self.cursor = first;
                    return Err(BusError::Consume(
                        format!(
                            "events {}..={} of {} left retention before they were read",
                            missed.0, missed.1, self.stream
                        )
                        .into(),
                    ));
                }
                // Like JetStream, a start before the oldest retained event starts there.
                self.following = true;
                for (seq, m) in s.messages.range(self.cursor..) {
                    self.cursor = seq + 1;
                    if subject_matches(&self.filter, &m.subject) {
                        self.ready.push_back(Event {
                            seq: *seq,
                            subject: m.subject.clone(),
                            payload: m.payload.clone(),
                        });
                        if self.ready.len() >= EVENT_CHUNK {
                            break;
                        }
                    }
                }
                if self.ready.is_empty() {
                    self.cursor = self.cursor.max(s.last_seq + 1);
                }
            }
            if self.ready.is_empty() {
                notified.await;
            }
        }
    }
}

/// A bound durable of the in-process bus.
struct MemoryPull {
    inner: Arc<Inner>,
    stream: String,
    durable: String,
}

#[async_trait]
impl Pull for MemoryPull {
    async fn next(&mut self, wait: Duration) -> Result<Option<Delivery>, BusError> {
        let deadline = Instant::now() + wait;
        loop {
            let notified = self.inner.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let wake = {
                let mut st = self.inner.lock();
                st.next_token += 1;
                let token = st.next_token;
                let stream = st.streams.get_mut(&self.stream).ok_or_else(|| {
                    BusError::Consume(format!("stream {} is gone", self.stream).into())
                })?;
                match stream.take(&self.durable, Instant::now(), token) {
                    Take::Got(Taken {
                        seq,
                        subject,
                        payload,
                        delivered,
                    }) => {
                        return Ok(Some(Delivery {
                            subject,
                            payload,
                            delivered,
                            acker: Box::new(MemoryAcker {
                                inner: self.inner.clone(),
                                stream: self.stream.clone(),
                                durable: self.durable.clone(),
                                seq,
                                token,
                            }),
                        }));
                    }
                    Take::Idle(due) => due,
                }
            };
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let until = wake.map_or(deadline, |w| w.min(deadline));
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(until) => {}
            }
        }
    }

    /// The in-process stream holds every message: whatever is due now is "buffered".
    async fn next_buffered(&mut self) -> Result<Option<Delivery>, BusError> {
        self.next(Duration::ZERO).await
    }
}

/// Acknowledges one delivery of the in-process bus.
struct MemoryAcker {
    inner: Arc<Inner>,
    stream: String,
    durable: String,
    seq: u64,
    token: u64,
}

enum AckOp {
    Ack,
    Nak(Duration),
    Progress,
    Term,
}

impl MemoryAcker {
    fn apply(&self, op: AckOp) -> Result<(), BusError> {
        {
            let mut st = self.inner.lock();
            let stream = st.streams.get_mut(&self.stream).ok_or_else(|| {
                BusError::Consume(format!("stream {} is gone", self.stream).into())
            })?;
            let work_queue = stream.def.retention == Retention::WorkQueue;
            let Some(consumer) = stream.consumers.get_mut(&self.durable) else {
                return Err(BusError::Consume(
                    format!("consumer {} is gone", self.durable).into(),
                ));
            };
            let now = Instant::now();
            match op {
                AckOp::Ack | AckOp::Term => {
                    // An ack of an older delivery still settles the message, as on JetStream.
                    if consumer.pending.remove(&self.seq).is_some() && work_queue {
                        stream.messages.remove(&self.seq);
                    }
                }
                AckOp::Nak(delay) => {
                    if let Some(f) = consumer.pending.get_mut(&self.seq) {
                        if f.token == self.token {
                            f.due = now + delay;
                        }
                    }
                }
                AckOp::Progress => {
                    let ack_wait = consumer.ack_wait;
                    if let Some(f) = consumer.pending.get_mut(&self.seq) {
                        if f.token == self.token {
                            f.due = now + ack_wait;
                        }
                    }
                }
            }
        }
        self.inner.changed.notify_waiters();
        Ok(())
    }
}

#[async_trait]
impl Acker for MemoryAcker {
    async fn ack(&self) -> Result<(), BusError> {
        self.apply(AckOp::Ack)
    }

    async fn nak(&self, delay: Duration) -> Result<(), BusError> {
        self.apply(AckOp::Nak(delay))
    }

    async fn in_progress(&self) -> Result<(), BusError> {
        self.apply(AckOp::Progress)
    }

    async fn term(&self) -> Result<(), BusError> {
        self.apply(AckOp::Term)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_reader_outrun_by_retention_is_told() {
        let bus = MemoryBus::new();
        let naming = Naming::default();
        bus.ensure_streams(&naming).await.expect("ensure");
        let stream = naming.events_stream().name;
        let publish = |i: usize| {
            let bus = bus.clone();
            async move {
                let subject = format!("dly.evt.o.p.s{}", i % 7);
                bus.publish(&subject, &i.to_string(), Bytes::new())
                    .await
                    .expect("publish");
            }
        };
        publish(0).await;
        let mut events = bus
            .events(&stream, "dly.evt.>", Some(0))
            .await
            .expect("events");
        assert_eq!(events.next().await.expect("item").expect("event").seq, 1);
        for i in 1..MAX_RETAINED + 10 {
            publish(i).await;
        }
        let lost = events.next().await.expect("item");
        assert!(matches!(lost, Err(BusError::Consume(_))), "{lost:?}");
        let first = events.next().await.expect("item").expect("event");
        assert_eq!(first.seq, 11);
    }

    #[test]
    fn wildcards_follow_nats_rules() {
        assert!(subject_matches("a.b.c", "a.b.c"));
        assert!(subject_matches("a.*.c", "a.x.c"));
        assert!(!subject_matches("a.*.c", "a.x.y.c"));
        assert!(subject_matches("a.>", "a.b"));
        assert!(subject_matches("a.>", "a.b.c.d"));
        assert!(!subject_matches("a.>", "a"));
        assert!(!subject_matches("a.b", "a.b.c"));
        assert!(!subject_matches("a.b.c", "a.b"));
        assert!(subject_matches("dly.work.p.>", "dly.work.p.create"));
        assert!(!subject_matches("dly.work.p.>", "dly.work.q.create"));
    }
}
