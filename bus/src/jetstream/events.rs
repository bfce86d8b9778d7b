//! Event readers: ordered consumers from a sequence, made again whenever they fail, end or
//! the connection moves.

use std::time::Duration;

use async_nats::jetstream::consumer::{pull, DeliverPolicy};
use futures::stream::BoxStream;
use futures::StreamExt;

use super::stream_epoch::made_anew;
use super::JetStreamBus;
use crate::error::Detail;
use crate::{BusError, Event};

/// Events buffered between a reader and its consumer.
const EVENT_BUFFER: usize = 256;

/// Longest pull request of an event reader (its idle heartbeat is half of it).
const EVENT_PULL_EXPIRY: Duration = Duration::from_secs(2);

/// Longest one attempt to make an event reader may take before a fresh one is made.
const EVENT_READER_ATTEMPT: Duration = Duration::from_secs(3);

impl JetStreamBus {
    /// [`crate::Bus::events`]: a stream of events that outlives its readers.
    pub(super) async fn read_events(
        &self,
        stream: &str,
        filter: &str,
        after: Option<u64>,
    ) -> Result<BoxStream<'static, Result<Event, BusError>>, BusError> {
        // The first reader is made here, so a stream that cannot be read is the caller's error;
        // after that a background task keeps one alive (see `follow_events`).
        let (reader, start) = self.event_reader(stream, filter, after).await?;
        let (tx, rx) = tokio::sync::mpsc::channel(EVENT_BUFFER);
        let me = self.clone();
        let (stream, filter) = (stream.to_owned(), filter.to_owned());
        tokio::spawn(async move { me.follow_events(stream, filter, reader, start, tx).await });
        Ok(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        })
        .boxed())
    }
}

impl JetStreamBus {
    /// An ordered reader of `stream`'s messages on `filter` after sequence `after` (from the
    /// stream's current end when `None`), and the sequence it starts after.
    ///
    /// Only "from now" asks for the stream's info (its last sequence). A reader made again
    /// after a node loss knows where it is and creates its consumer by stream name: a
    /// `STREAM.INFO` that the stream's leader does not answer (it can stay unanswered for over
    /// a minute after a node dies) then cannot keep it from coming back.
    async fn event_reader(
        &self,
        stream: &str,
        filter: &str,
        after: Option<u64>,
    ) -> Result<(BoxStream<'static, Result<Event, BusError>>, u64), BusError> {
        // "From now" is pinned to a sequence, so a reader made again later resumes exactly
        // where this one was instead of skipping what came in between.
        let start = match after {
            Some(after) => after,
            None => {
                let s = self.stream_or_setup_error(stream).await?;
                s.cached_info().state.last_sequence
            }
        };
        let consumer = self
            .setup
            .create_consumer_on_stream(
                pull::OrderedConfig {
                    filter_subject: filter.to_owned(),
                    deliver_policy: DeliverPolicy::ByStartSequence {
                        start_sequence: start + 1,
                    },
                    // The client's idle heartbeat follows the expiry (half of it): a reader
                    // whose server died is noticed and made again within seconds, not the
                    // 30 s that the default 15 s heartbeat takes.
                    max_expires: EVENT_PULL_EXPIRY,
                    ..Default::default()
                },
                stream,
            )
            .await
            .map_err(|e| {
                BusError::Setup(Detail::caused(format!("event reader on {stream}: {e}"), e))
            })?;
        let messages = consumer.messages().await.map_err(|e| {
            BusError::Consume(Detail::caused(format!("event reader on {stream}: {e}"), e))
        })?;
        let events = messages.filter_map(move |m| async move {
            let event = (|| {
                let m = m.map_err(|e| {
                    BusError::Consume(Detail::caused(format!("event stream: {e}"), e))
                })?;
                let seq = m
                    .info()
                    .map_err(|e| {
                        BusError::Consume(Detail::caused(format!("event metadata: {e}"), e))
                    })?
                    .stream_sequence;
                Ok(Event {
                    seq,
                    subject: m.subject.to_string(),
                    payload: m.payload.clone(),
                })
            })();
            // The client remakes a lost ordered consumer on its own, from the stream's start
            // when it had delivered nothing yet: what this reader already passed is dropped.
            match event {
                Ok(ev) if ev.seq <= start => None,
                other => Some(other),
            }
        });
        Ok((events.boxed(), start))
    }

    /// Forwards `reader`'s events to `tx` until `tx`'s receiver is gone. An ordered consumer
    /// is an in-memory, single-replica consumer on one server: when that server is lost the
    /// reader errs, ends or (seen in a 3-node cluster) silently stops. So a reader is made
    /// again, after the last event forwarded, whenever it errs or ends and whenever the
    /// connection moved to another server; each restart is logged and counted in
    /// `differently_bus_event_reader_restarts_total{why}`.
    ///
    /// After a reconnect the old reader is kept and read while its replacement is made: its
    /// consumer lives on the stream's leader, which is usually still there, and making a new
    /// consumer waits for the meta group's leader, which is not (an election, 4–9 s, when the
    /// lost node led it). Events are forwarded once each, in stream order, by sequence.
    ///
    /// A stream made anew (a server that lost its store; see `stream_epoch`) starts its
    /// sequences again: the reader is made again from its start, and its events are forwarded
    /// with their new, lower sequences. Events the new stream had stored beyond the old
    /// position before this was noticed (at most [`STREAM_CHECK`] after) come twice.
    ///
    /// [`STREAM_CHECK`]: super::stream_epoch::STREAM_CHECK
    async fn follow_events(
        self,
        stream: String,
        filter: String,
        mut reader: BoxStream<'static, Result<Event, BusError>>,
        mut last: u64,
        tx: tokio::sync::mpsc::Sender<Result<Event, BusError>>,
    ) {
        type Made = BoxStream<'static, Result<Event, BusError>>;
        let mut reconnects = self.reconnects.clone();
        reconnects.borrow_and_update();
        let mut epoch = self.stream_epoch(&stream);
        let mut born = *epoch.borrow_and_update();
        // A replacement being made while the current reader is still read.
        let mut replacement: Option<futures::future::BoxFuture<'static, Made>> = None;
        loop {
            let why: &'static str = tokio::select! {
                item = reader.next() => match item {
                    Some(Ok(ev)) => {
                        if ev.seq > last {
                            last = ev.seq;
                            if tx.send(Ok(ev)).await.is_err() {
                                return;
                            }
                        }
                        continue;
                    }
                    Some(Err(e)) => {
                        tracing::warn!(stream, filter, error = %e, "bus: event reader failed");
                        "error"
                    }
                    None => "ended",
                },
                Ok(()) = reconnects.changed(), if replacement.is_none() => {
                    Self::count_restart(&stream, &filter, last, "reconnected");
                    replacement = Some(Box::pin(self.clone().remake_reader(
                        stream.clone(),
                        filter.clone(),
                        last,
                    )));
                    continue;
                }
                made = async { replacement.as_mut().expect("guarded").await }, if replacement.is_some() => {
                    replacement = None;
                    reader = made;
                    continue;
                }
                Ok(()) = epoch.changed() => {
                    let now = *epoch.borrow_and_update();
                    if !made_anew(&mut born, now) {
                        continue;
                    }
                    tracing::warn!(stream, filter, after = last, "bus: the stream was made anew (its server lost its store?); reading it again from its start");
                    last = 0;
                    replacement = None;
                    "made anew"
                }
                () = tx.closed() => return,
            };
            // The current reader is gone: wait for a replacement (the one under way, if any).
            Self::count_restart(&stream, &filter, last, why);
            let making = match replacement.take() {
                Some(under_way) => under_way,
                None => Box::pin(
                    self.clone()
                        .remake_reader(stream.clone(), filter.clone(), last),
                ),
            };
            tokio::select! {
                made = making => reader = made,
                () = tx.closed() => return,
            }
        }
    }

    fn count_restart(stream: &str, filter: &str, last: u64, why: &'static str) {
        metrics::counter!("differently_bus_event_reader_restarts_total", "why" => why).increment(1);
        tracing::info!(
            stream,
            filter,
            after = last,
            why,
            "bus: event reader restarting"
        );
    }

    /// A new reader after sequence `last`, retried (each attempt bounded, backing off to 1 s)
    /// until one is made. The caller drops it when no one reads any more.
    async fn remake_reader(
        self,
        stream: String,
        filter: String,
        last: u64,
    ) -> BoxStream<'static, Result<Event, BusError>> {
        let mut delay = Duration::from_millis(100);
        loop {
            let attempt = self.event_reader(&stream, &filter, Some(last));
            let made = tokio::time::timeout(EVENT_READER_ATTEMPT, attempt)
                .await
                .unwrap_or_else(|_| {
                    Err(BusError::Setup(Detail::new(format!(
                        "event reader on {stream}: not made within {} ms",
                        EVENT_READER_ATTEMPT.as_millis()
                    ))))
                });
            match made {
                Ok((r, _)) => return r,
                Err(e) => {
                    tracing::warn!(stream, filter, error = %e, "bus: cannot make an event reader yet; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(1));
                }
            }
        }
    }
}
