//! Provisioning: streams and durable consumers made to match their definitions, and made
//! again when a server lost its store.

use std::time::Duration;

use async_nats::jetstream::{
    consumer::{pull, AckPolicy, PullConsumer},
    context::{GetStreamError, GetStreamErrorKind},
    stream::{Config as StreamConfig, RetentionPolicy, StorageType, Stream},
    ErrorCode,
};
use differently_bus_schema::{ConsumerDef, Naming, Retention, StreamDef};

use super::JetStreamBus;
use crate::error::Detail;
use crate::BusError;

/// Window in which a repeated `Nats-Msg-Id` is dropped by the server.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// Unacknowledged messages a durable may have outstanding; generous, because the real limit
/// is the pool's capacity, enforced in Postgres.
const MAX_ACK_PENDING: i64 = 10_000;

/// Whether NATS subject `subject` matches `pattern` (`*` one token, `>` the rest).
fn subject_matches(pattern: &str, subject: &str) -> bool {
    let mut p = pattern.split('.');
    let mut t = subject.split('.');
    loop {
        match (p.next(), t.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// How long stream set-up keeps retrying while a fresh cluster elects its streams' leaders.
const SETTLE_FOR: Duration = Duration::from_secs(20);

/// Whether a set-up error is the cluster settling (a stream just made by another process,
/// a leader being elected), which a retry outlives.
fn settling(e: &BusError) -> bool {
    let text = e.to_string().to_ascii_lowercase();
    [
        "not found",
        "timed out",
        "timeout",
        "no responders",
        "leader",
        "unavailable",
    ]
    .iter()
    .any(|w| text.contains(w))
}

/// The server answered "stream not found".
fn stream_missing(e: &GetStreamError) -> bool {
    matches!(e.kind(), GetStreamErrorKind::JetStream(j) if j.error_code() == ErrorCode::STREAM_NOT_FOUND)
}

impl JetStreamBus {
    fn stream_config(&self, def: &StreamDef) -> StreamConfig {
        StreamConfig {
            name: def.name.clone(),
            subjects: def.subjects.clone(),
            retention: match def.retention {
                Retention::WorkQueue => RetentionPolicy::WorkQueue,
                Retention::Limits => RetentionPolicy::Limits,
            },
            max_age: def.max_age.unwrap_or_default(),
            max_bytes: def.max_bytes.unwrap_or(-1),
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
            || have.max_bytes != want.max_bytes
            || have.duplicate_window != want.duplicate_window
            || have.num_replicas != want.num_replicas;
        if differs {
            tracing::info!(stream = %def.name, "updating stream configuration");
            let updated = StreamConfig {
                subjects: want.subjects,
                max_age: want.max_age,
                max_bytes: want.max_bytes,
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

    /// [`Self::ensure_stream`], again while the cluster is settling: on a fresh cluster the
    /// stream another process has just created (R3) answers "stream not found" to its info
    /// until its first leader is elected, and processes starting together hit that window
    /// (one `api` start in about a dozen exited on it). What the server refuses for good (a
    /// retention that cannot change) is not retried.
    async fn ensure_stream_settled(&self, def: &StreamDef) -> Result<(), BusError> {
        let deadline = tokio::time::Instant::now() + SETTLE_FOR;
        let mut wait = Duration::from_millis(100);
        loop {
            match self.ensure_stream(def).await {
                Ok(()) => return Ok(()),
                Err(e) if settling(&e) && tokio::time::Instant::now() + wait < deadline => {
                    tracing::info!(stream = %def.name, error = %e, "bus setup: the stream is not ready yet; retrying");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(1));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// After a publish to `subject` found no stream: if the stream this bus ensured for that
    /// subject is really gone from the server (its store was lost), recreates it and says so.
    /// A stream that is only electing a leader answers no lookup either way and is left alone,
    /// so an election costs one short lookup, not a re-creation.
    pub(super) async fn recreate_lost_stream_for(&self, subject: &str) -> bool {
        let Some(def) = self
            .known()
            .into_iter()
            .find(|d| d.subjects.iter().any(|p| subject_matches(p, subject)))
        else {
            return false;
        };
        match self.setup.get_stream(&def.name).await {
            Err(e) if stream_missing(&e) => self.recreate(&def).await,
            _ => false,
        }
    }

    /// Creates again a stream this bus ensured before and the server no longer has (its store
    /// was lost); whether that worked.
    async fn recreate(&self, def: &StreamDef) -> bool {
        tracing::warn!(stream = %def.name, "bus: stream missing on the server (store lost?); recreating it");
        match self.ensure_stream(def).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(stream = %def.name, error = %e, "bus: cannot recreate the stream");
                false
            }
        }
    }

    fn known(&self) -> Vec<StreamDef> {
        self.known.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// [`stream`](Self::stream), its failure as the bus's set-up error naming the stream.
    pub(super) async fn stream_or_setup_error(&self, name: &str) -> Result<Stream, BusError> {
        self.stream(name)
            .await
            .map_err(|e| BusError::Setup(Detail::caused(format!("stream {name}: {e}"), e)))
    }

    /// `get_stream` (with the short set-up timeout), recreating a stream this bus ensured
    /// before if the server lost it.
    pub(super) async fn stream(&self, name: &str) -> Result<Stream, GetStreamError> {
        match self.setup.get_stream(name).await {
            Err(e) if stream_missing(&e) => {
                let Some(def) = self.known().into_iter().find(|d| d.name == name) else {
                    return Err(e);
                };
                if !self.recreate(&def).await {
                    return Err(e);
                }
                self.setup.get_stream(name).await
            }
            other => other,
        }
    }

    pub(super) async fn consumer(&self, def: &ConsumerDef) -> Result<PullConsumer, BusError> {
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

impl JetStreamBus {
    /// [`crate::Bus::ensure_streams`]: every stream of `naming`, remembered for recreation.
    pub(super) async fn ensure_all_streams(&self, naming: &Naming) -> Result<(), BusError> {
        for def in naming.streams() {
            self.ensure_stream_settled(&def).await?;
            let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
            if !known.iter().any(|k| k.name == def.name) {
                known.push(def);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn subjects_match_patterns_token_by_token() {
        assert!(super::subject_matches("dly.work.>", "dly.work.fake.create"));
        assert!(super::subject_matches("dly.admit.*", "dly.admit.org_1"));
        assert!(!super::subject_matches("dly.admit.*", "dly.admit.org_1.x"));
        assert!(!super::subject_matches("dly.work.>", "dly.work"));
        assert!(!super::subject_matches("dly.evt.>", "dlyx.evt.a"));
        assert!(super::subject_matches("a.b", "a.b"));
    }
}
