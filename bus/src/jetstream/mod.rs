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

mod connect;
mod events;
mod positions;
mod provision;
mod publish;
mod pull;
mod pull_ahead;
mod reply;
mod stream_epoch;
mod version;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::Context;
use async_trait::async_trait;
use bytes::Bytes;
use differently_bus_schema::{ConsumerDef, Naming, StreamDef};
use futures::stream::BoxStream;

use crate::{Bus, BusError, Event, Published, Pull, Request};

pub use connect::{
    connect, connect_with, ConnectOptions, NatsAuth, DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_PING_INTERVAL, SETUP_TIMEOUT,
};
pub use provision::DUPLICATE_WINDOW;
pub use version::{check_server_version, parse_version, MIN_SERVER_VERSION};

/// The bus over a JetStream connection. Cheap to clone.
#[derive(Clone)]
pub struct JetStreamBus {
    js: Context,
    /// The same connection with a short request timeout, for consumer and stream set-up: a
    /// request to a stream without a leader (an election) then fails in seconds and is
    /// retried, instead of blocking its caller for the full publish timeout.
    setup: Context,
    /// Counts (re)connections. A pull request in flight when the connection moved to another
    /// server is lost with the old one, so a waiting pull re-issues its request at once
    /// instead of sitting out its expiry.
    reconnects: tokio::sync::watch::Receiver<u64>,
    replicas: usize,
    fetch_batch: usize,
    /// Streams ensured so far, to recreate after a server lost its store.
    known: Arc<Mutex<Vec<StreamDef>>>,
    /// The creation time of each stream event readers follow, so they notice one made anew.
    epochs: stream_epoch::Epochs,
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
}

/// Each operation is in the module named after it; this only routes the trait to them.
#[async_trait]
impl Bus for JetStreamBus {
    async fn ensure_streams(&self, naming: &Naming) -> Result<(), BusError> {
        self.ensure_all_streams(naming).await
    }

    async fn publish(
        &self,
        subject: &str,
        msg_id: &str,
        payload: Bytes,
    ) -> Result<Published, BusError> {
        self.publish_deduplicated(subject, msg_id, payload).await
    }

    async fn pull(&self, consumer: &ConsumerDef) -> Result<Box<dyn Pull>, BusError> {
        self.bind_pull(consumer).await
    }

    async fn pull_ahead(&self, consumer: &ConsumerDef) -> Result<Box<dyn Pull>, BusError> {
        self.bind_pull_ahead(consumer).await
    }

    async fn events(
        &self,
        stream: &str,
        filter: &str,
        after: Option<u64>,
    ) -> Result<BoxStream<'static, Result<Event, BusError>>, BusError> {
        self.read_events(stream, filter, after).await
    }

    async fn last_sequence(&self, stream: &str) -> Result<u64, BusError> {
        self.stream_last_sequence(stream).await
    }

    async fn consumer_ack_floor(
        &self,
        stream: &str,
        durable: &str,
    ) -> Result<Option<u64>, BusError> {
        self.durable_ack_floor(stream, durable).await
    }

    async fn delete_consumer(&self, stream: &str, durable: &str) -> Result<(), BusError> {
        self.delete_durable(stream, durable).await
    }

    async fn serve(&self, subject: &str) -> Result<BoxStream<'static, Request>, BusError> {
        self.serve_requests(subject).await
    }

    async fn request(
        &self,
        subject: &str,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<Bytes, BusError> {
        self.send_request(subject, payload, timeout).await
    }

    async fn request_all(
        &self,
        subject: &str,
        payload: Bytes,
        quiet: Duration,
        deadline: Duration,
    ) -> Result<Vec<Bytes>, BusError> {
        self.gather(subject, payload, quiet, deadline).await
    }
}
