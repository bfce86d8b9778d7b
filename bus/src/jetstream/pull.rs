//! The work-queue consumer that fetches small batches (`Bus::pull`), and the acks of both
//! pull consumers.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::PullConsumer, AckKind};
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

/// A bound durable pull consumer that fetches small batches and hands them out one by one.
struct JetStreamPull {
    consumer: PullConsumer,
    reconnects: tokio::sync::watch::Receiver<u64>,
    ack_wait: Duration,
    batch: usize,
    buffer: VecDeque<Buffered>,
    /// Since when pulls have found the consumer without a leader, without a message since.
    electing_since: Option<Instant>,
}

/// How long a pull that found its consumer without a leader waits before the next.
const ELECTION_RETRY: Duration = Duration::from_millis(250);

/// How long pulls may find their consumer without a leader before the caller is told (and
/// binds again, which recreates a consumer a server lost with its store). NATS elects a new
/// leader within its raft election timeout (4–9 s) plus a round.
const ELECTION_PATIENCE: Duration = Duration::from_secs(15);

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

    /// Fetches up to `batch` messages, waiting up to `wait` for the first one.
    async fn fill(&mut self, wait: Duration) -> Result<(), BusError> {
        // The server rejects pull requests with a tiny expiry; a no-wait fetch covers those.
        self.reconnects.borrow_and_update();
        let wait = wait.min(PULL_EXPIRY);
        let mut request = self.consumer.fetch().max_messages(self.batch);
        if wait >= Duration::from_millis(10) {
            request = request.expires(wait);
        }
        let mut batch = request
            .messages()
            .await
            .map_err(|e| BusError::Consume(Detail::caused(format!("pull request: {e}"), e)))?;
        // The server ends every request with a status; this bound only guards a lost one.
        let deadline = tokio::time::Instant::now() + wait + PULL_STATUS_SLACK;
        loop {
            let next = tokio::select! {
                n = tokio::time::timeout_at(deadline, batch.next()) => n,
                // The request went to a server this client has left: ask again.
                Ok(()) = self.reconnects.changed() => {
                    tracing::debug!("bus: connection moved; re-issuing the pull request");
                    break;
                }
            };
            match next {
                Ok(Some(Ok(message))) => {
                    self.electing_since = None;
                    self.buffer.push_back(Buffered {
                        message,
                        fetched: Instant::now(),
                    })
                }
                Ok(Some(Err(e))) => {
                    if self.buffer.is_empty() {
                        if self.electing(&e.to_string()) {
                            // Asked again at once by the caller, of whoever leads then.
                            tokio::time::sleep(ELECTION_RETRY.min(wait)).await;
                            return Ok(());
                        }
                        return Err(BusError::Consume(Detail::caused(format!("pull: {e}"), e)));
                    }
                    tracing::debug!(error = %e, "pull request ended early");
                    break;
                }
                Ok(None) | Err(_) => break,
            }
        }
        Ok(())
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

/// A fetched message as the caller gets it; `confirm`: whether its acks wait for the
/// server's confirmation.
pub(super) fn delivery_of(
    message: jetstream::Message,
    confirm: bool,
) -> Result<Delivery, BusError> {
    let delivered = message
        .info()
        .map_err(|e| BusError::Consume(Detail::caused(format!("message metadata: {e}"), e)))?
        .delivered;
    let (message, acker) = message.split();
    Ok(Delivery {
        subject: message.subject.to_string(),
        payload: message.payload,
        delivered: u64::try_from(delivered).unwrap_or(1).max(1),
        acker: Box::new(JetStreamAcker { acker, confirm }),
    })
}

#[async_trait]
impl Pull for JetStreamPull {
    async fn next(&mut self, wait: Duration) -> Result<Option<Delivery>, BusError> {
        // Several short requests rather than one long one (see `PULL_EXPIRY`).
        let deadline = Instant::now() + wait;
        let message = loop {
            if let Some(m) = self.pop().await {
                break m;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            self.fill(left).await?;
            if let Some(m) = self.pop().await {
                break m;
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
        };
        delivery_of(message, true).map(Some)
    }

    /// What the last fetch brought beyond the message handed out: a fetch asks for up to
    /// `batch` and takes whatever is there.
    async fn next_buffered(&mut self) -> Result<Option<Delivery>, BusError> {
        self.pop().await.map(|m| delivery_of(m, true)).transpose()
    }
}

/// Acks of `pull` consumers go through the server's confirmation (double ack) so a
/// returned `Ok` means the server saw it; those of `pull_ahead` consumers are only sent.
struct JetStreamAcker {
    acker: jetstream::message::Acker,
    confirm: bool,
}

impl JetStreamAcker {
    async fn send(&self, kind: AckKind) -> Result<(), BusError> {
        let sent = if self.confirm {
            self.acker.double_ack_with(kind).await
        } else {
            self.acker.ack_with(kind).await
        };
        sent.map_err(|e| BusError::Consume(Detail::caused(format!("{kind:?}: {e}"), e)))
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
            buffer: VecDeque::new(),
            electing_since: None,
        }))
    }
}
