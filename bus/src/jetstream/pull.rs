//! The work-queue consumer that fetches small batches (`Bus::pull`), and the acks of both
//! pull consumers.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull, consumer::PullConsumer, AckKind};
use async_trait::async_trait;
use differently_bus_schema::ConsumerDef;
use futures::StreamExt;

use super::JetStreamBus;
use crate::error::Detail;
use crate::{Acker, BusError, Delivery, Pull};

/// Messages fetched per pull request. Buffered messages age against `ack_wait`, so keep it
/// modest.
pub(super) const DEFAULT_FETCH_BATCH: usize = 8;

/// Longest one pull request waits at the server. A request is lost without a word when the
/// consumer's leader hangs or dies (the request went to it), and the consumer's next leader
/// knows nothing of it; and a request made through a node that then hangs has its messages
/// delivered into that node, to be redelivered only after `ack_wait`. Short requests bound
/// both: the next one goes to whoever leads now. An idle consumer costs one request a second.
pub(super) const PULL_EXPIRY: Duration = Duration::from_secs(1);

/// How long after a request's expiry its closing status may be missing before the request
/// counts as lost and the next is made.
const PULL_STATUS_SLACK: Duration = Duration::from_millis(500);

/// A message fetched but not yet handed out, with when it arrived (its ack-wait runs).
struct Buffered {
    message: jetstream::Message,
    fetched: Instant,
}

/// A pull request kept open at the server across calls: the server pushes messages into it
/// as they are stored, up to the number asked, until it expires.
struct OpenRequest {
    batch: pull::Batch,
    /// When its closing status is overdue: the request counts as lost and the next is made.
    overdue_at: tokio::time::Instant,
}

/// A bound durable pull consumer. The first call takes what the server has now (a fetch
/// that does not wait); when that is nothing, and from then on, it leaves one request open,
/// of the caller's room, that serves this and the next calls as messages come. So a steady
/// trickle costs one request per room's worth of messages (or per [`PULL_EXPIRY`] when
/// idle) rather than one per message, and no process asks for more than it can start on.
struct JetStreamPull {
    consumer: PullConsumer,
    reconnects: tokio::sync::watch::Receiver<u64>,
    ack_wait: Duration,
    /// Most messages one request asks for.
    batch: usize,
    /// How many messages the caller can take now ([`Pull::set_room`]).
    room: usize,
    buffer: VecDeque<Buffered>,
    open: Option<OpenRequest>,
    /// Whether the last request was one left open that ended as asked (its count reached or
    /// its time up). The next then waits on another at once: the server pushes into it what
    /// it holds anyway. A fetch of what is there comes first only at the start and after a
    /// failure, so messages published together are handed over together then.
    streaming: bool,
    /// Since when pulls have found the consumer without a leader, without a message since.
    electing_since: Option<Instant>,
}

/// How long a pull that found its consumer without a leader waits before the next.
const ELECTION_RETRY: Duration = Duration::from_millis(250);

/// How long pulls may find their consumer without a leader before the caller is told (and
/// binds again, which recreates a consumer a server lost with its store). NATS elects a new
/// leader within its raft election timeout (4–9 s) plus a round.
const ELECTION_PATIENCE: Duration = Duration::from_secs(15);

/// The shortest expiry the server takes for a request that waits.
const MIN_EXPIRY: Duration = Duration::from_millis(10);

/// What one wait on a pull request came to.
enum Took {
    /// A message, put in the buffer.
    Message,
    /// The request ended (its count reached, expired, nothing there) or was given up.
    Ended,
    /// The caller's time ran out with the request still open.
    TimedOut,
}

impl JetStreamPull {
    /// Whether a pull's error `e` says the consumer has no leader right now ("no responders",
    /// 503; "leadership change", 409), which the next pull, to the next leader, gets over,
    /// unlike a consumer that is gone. Rebinding instead (stream and consumer info, each a
    /// request that waits out its timeout while the leader is elected) costs seconds.
    fn electing(&mut self, e: &str) -> bool {
        let transient = e.contains("503") || e.contains("Leadership Change");
        if !transient {
            return false;
        }
        let since = *self.electing_since.get_or_insert_with(Instant::now);
        if since.elapsed() >= ELECTION_PATIENCE {
            self.electing_since = None;
            return false;
        }
        tracing::debug!(error = %e, "bus: pull found the consumer without a leader; pulling again");
        true
    }

    /// The open request ended as asked (its count reached or its time up): the next waits on
    /// a new one at once.
    fn ended_as_asked(&mut self) {
        self.streaming = true;
        self.open = None;
    }

    /// Buffers a message a request brought: the consumer has a leader.
    fn took(&mut self, message: jetstream::Message) {
        self.electing_since = None;
        self.buffer.push_back(Buffered {
            message,
            fetched: Instant::now(),
        });
    }

    /// How many messages the next request asks for.
    fn asking(&self) -> usize {
        self.room.clamp(1, self.batch)
    }

    /// A request's error: `Ok` (after a pause) when the consumer is only electing a leader,
    /// so the caller asks again; the error otherwise.
    async fn request_failed(
        &mut self,
        e: async_nats::Error,
        pause: Duration,
    ) -> Result<(), BusError> {
        if self.electing(&e.to_string()) {
            // Asked again by the caller, of whoever leads then.
            tokio::time::sleep(ELECTION_RETRY.min(pause)).await;
            return Ok(());
        }
        Err(BusError::Consume(Detail::caused(format!("pull: {e}"), e)))
    }

    /// Takes what the server holds for the consumer now, up to the caller's room, without
    /// waiting for more: the request ends with a status as soon as that is handed over.
    async fn fill_now(&mut self) -> Result<(), BusError> {
        self.reconnects.borrow_and_update();
        let mut batch = self
            .consumer
            .fetch()
            .max_messages(self.asking())
            .messages()
            .await
            .map_err(|e| BusError::Consume(Detail::caused(format!("pull request: {e}"), e)))?;
        // The server ends every request with a status; this bound only guards a lost one.
        let deadline = tokio::time::Instant::now() + PULL_STATUS_SLACK;
        loop {
            let next = tokio::select! {
                n = tokio::time::timeout_at(deadline, batch.next()) => n,
                // The request went to a server this client has left: ask again.
                Ok(()) = self.reconnects.changed() => break,
            };
            match next {
                Ok(Some(Ok(message))) => self.took(message),
                Ok(Some(Err(e))) => {
                    if self.buffer.is_empty() {
                        return self.request_failed(e, ELECTION_RETRY).await;
                    }
                    tracing::debug!(error = %e, "pull request ended early");
                    break;
                }
                Ok(None) | Err(_) => break,
            }
        }
        Ok(())
    }

    /// Leaves a request open that waits up to `wait` (at most [`PULL_EXPIRY`]) for messages.
    async fn open(&mut self, wait: Duration) -> Result<(), BusError> {
        self.reconnects.borrow_and_update();
        let expires = wait.min(PULL_EXPIRY);
        let batch = self
            .consumer
            .batch()
            .max_messages(self.asking())
            .expires(expires)
            .messages()
            .await
            .map_err(|e| BusError::Consume(Detail::caused(format!("pull request: {e}"), e)))?;
        self.open = Some(OpenRequest {
            batch,
            overdue_at: tokio::time::Instant::now() + expires + PULL_STATUS_SLACK,
        });
        Ok(())
    }

    /// Waits until `deadline` for the open request's next message.
    async fn take_open(&mut self, deadline: tokio::time::Instant) -> Result<Took, BusError> {
        let Some(open) = self.open.as_mut() else {
            return Ok(Took::Ended);
        };
        let until = deadline.min(open.overdue_at);
        let next = tokio::select! {
            n = tokio::time::timeout_at(until, open.batch.next()) => n,
            // The request went to a server this client has left: ask again.
            Ok(()) = self.reconnects.changed() => {
                tracing::debug!("bus: connection moved; re-issuing the pull request");
                self.open = None;
                return Ok(Took::Ended);
            }
        };
        match next {
            Ok(Some(Ok(message))) => {
                self.took(message);
                Ok(Took::Message)
            }
            Ok(Some(Err(e))) => {
                self.open = None;
                let pause = deadline.saturating_duration_since(tokio::time::Instant::now());
                self.request_failed(e, pause).await?;
                Ok(Took::Ended)
            }
            Ok(None) => {
                self.ended_as_asked();
                Ok(Took::Ended)
            }
            Err(_) if tokio::time::Instant::now() >= open.overdue_at => {
                self.open = None;
                Ok(Took::Ended)
            }
            Err(_) => Ok(Took::TimedOut),
        }
    }

    /// The next buffered message still worth handing out. One held past its ack-wait has
    /// been (or will be) redelivered, so it is dropped rather than processed twice here; one
    /// held a good part of it gets its timer restarted.
    async fn pop(&mut self) -> Option<jetstream::Message> {
        while let Some(b) = self.buffer.pop_front() {
            let age = b.fetched.elapsed();
            if age >= self.ack_wait {
                continue;
            }
            if age >= self.ack_wait / 4 {
                if let Err(e) = b.message.ack_with(AckKind::Progress).await {
                    tracing::debug!(error = %e, "refreshing a buffered message failed");
                }
            }
            return Some(b.message);
        }
        None
    }
}

/// A fetched message as the caller gets it.
pub(super) fn delivery_of(message: jetstream::Message) -> Result<Delivery, BusError> {
    let delivered = message
        .info()
        .map_err(|e| BusError::Consume(Detail::caused(format!("message metadata: {e}"), e)))?
        .delivered;
    let (message, acker) = message.split();
    Ok(Delivery {
        subject: message.subject.to_string(),
        payload: message.payload,
        delivered: u64::try_from(delivered).unwrap_or(1).max(1),
        acker: Box::new(JetStreamAcker { acker }),
    })
}

#[async_trait]
impl Pull for JetStreamPull {
    async fn next(&mut self, wait: Duration) -> Result<Option<Delivery>, BusError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(m) = self.pop().await {
                return delivery_of(m).map(Some);
            }
            if self.open.is_none() {
                if !std::mem::take(&mut self.streaming) {
                    self.fill_now().await?;
                    if let Some(m) = self.pop().await {
                        return delivery_of(m).map(Some);
                    }
                }
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                if left < MIN_EXPIRY {
                    return Ok(None);
                }
                self.open(left).await?;
            }
            match self.take_open(deadline).await? {
                Took::Message => {}
                Took::TimedOut => return Ok(None),
                Took::Ended if tokio::time::Instant::now() >= deadline => return Ok(None),
                Took::Ended => {}
            }
        }
    }

    /// What the last fetch brought beyond the message handed out, then what the open
    /// request already holds: never a new request, never a wait.
    async fn next_buffered(&mut self) -> Result<Option<Delivery>, BusError> {
        if let Some(m) = self.pop().await {
            return delivery_of(m).map(Some);
        }
        use futures::FutureExt;
        let Some(open) = self.open.as_mut() else {
            return Ok(None);
        };
        match open.batch.next().now_or_never() {
            Some(Some(Ok(message))) => delivery_of(message).map(Some),
            Some(Some(Err(e))) => {
                self.open = None;
                tracing::debug!(error = %e, "pull request ended early");
                Ok(None)
            }
            Some(None) => {
                self.ended_as_asked();
                Ok(None)
            }
            None => Ok(None),
        }
    }

    fn set_room(&mut self, room: usize) {
        self.room = room;
    }
}

/// Acks are sent, not confirmed (no double ack): a lost one only means the message comes
/// again after its ack-wait, which every consumer absorbs anyway, and waiting for the
/// confirmation held a worker's slot for a round trip and cost nats-server a reply per ack.
struct JetStreamAcker {
    acker: jetstream::message::Acker,
}

impl JetStreamAcker {
    async fn send(&self, kind: AckKind) -> Result<(), BusError> {
        self.acker
            .ack_with(kind)
            .await
            .map_err(|e| BusError::Consume(Detail::caused(format!("{kind:?}: {e}"), e)))
    }
}

#[async_trait]
impl Acker for JetStreamAcker {
    async fn ack(&self) -> Result<(), BusError> {
        self.send(AckKind::Ack).await
    }

    async fn nak(&self, delay: Duration) -> Result<(), BusError> {
        self.send(AckKind::Nak(Some(delay))).await
    }

    async fn in_progress(&self) -> Result<(), BusError> {
        self.send(AckKind::Progress).await
    }

    async fn term(&self) -> Result<(), BusError> {
        self.send(AckKind::Term).await
    }
}

impl JetStreamBus {
    /// [`crate::Bus::pull`]: the consumer bound, nothing fetched yet.
    pub(super) async fn bind_pull(
        &self,
        consumer: &ConsumerDef,
    ) -> Result<Box<dyn Pull>, BusError> {
        let c = self.consumer(consumer).await?;
        Ok(Box::new(JetStreamPull {
            consumer: c,
            reconnects: self.reconnects.clone(),
            ack_wait: consumer.ack_wait,
            batch: self.fetch_batch,
            room: self.fetch_batch,
            buffer: VecDeque::new(),
            open: None,
            streaming: false,
            electing_since: None,
        }))
    }
}
