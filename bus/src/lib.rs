//! The bus: a `Bus` trait over JetStream (production) and an in-process implementation
//! (`differently dev`). Both give the same semantics: work-queue streams with durable pull
//! consumers, explicit acks, in-progress acks, delayed naks and de-duplication by message id;
//! a limits stream of events that subscribers read from a sequence; and core request/reply
//! (nothing stored) between processes that must ask each other something.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use differently_bus_schema::{ConsumerDef, Naming};
use futures::stream::BoxStream;

pub mod announce;
pub mod callout;
pub mod error;
pub mod jetstream;
pub mod memory;
#[cfg(feature = "test-support")]
pub mod testing;
pub mod trace;
pub mod typed;

pub use announce::Announcer;
pub use error::BusError;
pub use typed::{decode_event, decode_public, BusExt, Typed, TypedEvent, TypedPull};

/// What the stream did with a publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    /// Stored: consumers will see it.
    Stored,
    /// Dropped: a message with the same id was stored inside the de-duplication window. A
    /// repair re-send that comes back `Duplicate` found nothing lost.
    Duplicate,
}

/// Message transport between the roles. Postgres stays the truth; the bus is the fast path.
#[async_trait]
pub trait Bus: Send + Sync + 'static {
    /// Creates every stream of `naming` (idempotent; safe to run on every start).
    async fn ensure_streams(&self, naming: &Naming) -> Result<(), BusError>;

    /// Publishes `payload` on `subject` and waits for the stream to store it. A second
    /// publish with the same `msg_id` inside the de-duplication window is dropped, and says so.
    async fn publish(
        &self,
        subject: &str,
        msg_id: &str,
        payload: Bytes,
    ) -> Result<Published, BusError>;

    /// Binds to (creating if needed) a durable pull consumer. Several processes binding the
    /// same durable share its messages. A waiting pull asks for at most what its caller has
    /// room for ([`Pull::set_room`]) and keeps that request open across calls; acks are sent
    /// without waiting for the server's confirmation (a lost one is a redelivery, which every
    /// consumer absorbs).
    async fn pull(&self, consumer: &ConsumerDef) -> Result<Box<dyn Pull>, BusError>;

    /// Like [`Bus::pull`], for a consumer whose handling is idempotent and quick: messages
    /// come ahead of the caller over one standing subscription (a handful held by this
    /// process, pushed the moment they are stored, whatever the caller's room). Not for work
    /// queues: a message held here waits for this process even while another is idle. A bus
    /// that keeps nothing ahead answers `pull`.
    async fn pull_ahead(&self, consumer: &ConsumerDef) -> Result<Box<dyn Pull>, BusError> {
        self.pull(consumer).await
    }

    /// Reads the event stream under `filter`, starting after sequence `after`
    /// (`None`: only new events). Each item carries its stream sequence.
    async fn events(
        &self,
        stream: &str,
        filter: &str,
        after: Option<u64>,
    ) -> Result<BoxStream<'static, Result<Event, BusError>>, BusError>;

    /// The sequence of the last message stored in `stream` (0: none yet). A reader that
    /// keeps its own position checks it against this: a position beyond it means the stream
    /// was made anew and its sequences started again.
    async fn last_sequence(&self, stream: &str) -> Result<u64, BusError>;

    /// The stream sequence a durable consumer of `stream` has acked everything through (its
    /// ack floor); `None` when no such consumer exists. For moving off a durable consumer
    /// without skipping or re-reading more than it had left.
    async fn consumer_ack_floor(
        &self,
        stream: &str,
        durable: &str,
    ) -> Result<Option<u64>, BusError>;

    /// Removes a durable consumer of `stream` (nothing to do when there is none).
    async fn delete_consumer(&self, stream: &str, durable: &str) -> Result<(), BusError>;

    /// Serves requests on `subject` (core request/reply: nothing is stored, a request with
    /// nobody serving fails at once) until the returned stream is dropped. When this returns,
    /// requests from any process reach the stream.
    async fn serve(&self, subject: &str) -> Result<BoxStream<'static, Request>, BusError>;

    /// Sends `payload` to whoever serves `subject` and waits up to `timeout` for its answer.
    /// [`BusError::NoResponders`] when nobody serves the subject, [`BusError::Timeout`] when
    /// no answer came in time: a caller can tell a gone responder from a slow one.
    async fn request(
        &self,
        subject: &str,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<Bytes, BusError>;

    /// Sends `payload` to everyone serving `subject` and gathers their answers: until
    /// `deadline` for the first, then until no further answer came for `quiet`. Empty when
    /// nobody serves the subject. For questions every process answers for its own part (a
    /// list of what each holds). The default asks one server, which is everyone on a bus of
    /// one process (the in-process bus of `differently dev`).
    async fn request_all(
        &self,
        subject: &str,
        payload: Bytes,
        quiet: Duration,
        deadline: Duration,
    ) -> Result<Vec<Bytes>, BusError> {
        let _ = quiet;
        match self.request(subject, payload, deadline).await {
            Ok(answer) => Ok(vec![answer]),
            Err(BusError::NoResponders(_)) => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }
}

/// One request received by [`Bus::serve`], answered with [`Request::reply`].
pub struct Request {
    pub subject: String,
    pub payload: Bytes,
    replier: Box<dyn Replier>,
}

impl Request {
    /// A request whose answer goes through `replier` (for implementations of [`Bus`]).
    pub fn new(subject: String, payload: Bytes, replier: Box<dyn Replier>) -> Request {
        Request {
            subject,
            payload,
            replier,
        }
    }

    /// Answers the request. An answer to a requester that gave up is dropped silently, as
    /// NATS does.
    pub async fn reply(self, payload: Bytes) -> Result<(), BusError> {
        self.replier.reply(payload).await
    }
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("subject", &self.subject)
            .field("bytes", &self.payload.len())
            .finish_non_exhaustive()
    }
}

/// How a served request is answered; one per bus implementation.
#[async_trait]
pub trait Replier: Send {
    /// Sends the answer.
    async fn reply(self: Box<Self>, payload: Bytes) -> Result<(), BusError>;
}

/// A bound pull consumer.
#[async_trait]
pub trait Pull: Send {
    /// Waits up to `wait` for the next message; `Ok(None)` when none arrived.
    async fn next(&mut self, wait: Duration) -> Result<Option<Delivery>, BusError>;

    /// The next message this consumer already holds, without asking the server or waiting:
    /// lets a caller take what arrived together as one batch. `Ok(None)` when it holds none
    /// (always, for a consumer that keeps nothing ahead).
    async fn next_buffered(&mut self) -> Result<Option<Delivery>, BusError> {
        Ok(None)
    }

    /// Tells the pull how many messages its caller can start on now, the next one included.
    /// A pull that keeps a request open at the server asks for no more than this, so work
    /// does not wait in a process that has no room for it while another has.
    fn set_room(&mut self, _room: usize) {}
}

/// Acknowledgement operations of one delivered message.
#[async_trait]
pub trait Acker: Send + Sync {
    /// Done: remove it.
    async fn ack(&self) -> Result<(), BusError>;
    /// Not done: redeliver after `delay`.
    async fn nak(&self, delay: Duration) -> Result<(), BusError>;
    /// Still working: restart the ack-wait timer.
    async fn in_progress(&self) -> Result<(), BusError>;
    /// Never redeliver (poison message).
    async fn term(&self) -> Result<(), BusError>;
}

/// One message handed to a consumer.
pub struct Delivery {
    pub subject: String,
    pub payload: Bytes,
    /// 1 on first delivery, then counts redeliveries.
    pub delivered: u64,
    pub acker: Box<dyn Acker>,
}

/// One event read from the event stream.
#[derive(Debug, Clone)]
pub struct Event {
    pub seq: u64,
    pub subject: String,
    pub payload: Bytes,
}
