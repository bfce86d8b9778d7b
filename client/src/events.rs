//! `GET /v1/events`: a tenant's events as SSE, in either of the server's two formats:
//! [`Client::events`] reads sandbox status changes (`format=status`, the flat body the SDKs
//! read first), [`Client::public_events`] the public event contract (`format=public`, the
//! same JSON as NATS and webhooks, every type, narrowed by `types`). Each event carries its
//! stream sequence as `id` (the same sequences in both formats); a stream reconnects by
//! itself after a dropped connection with `Last-Event-ID`, so no event is lost or repeated
//! while the server still holds it (24 h).

use std::collections::VecDeque;
use std::time::Duration;

use reqwest::{Method, Response};

use crate::sse::{SseEvent, SseParser};
use crate::{query, Client, Error, PublicEvent, Result, StatusEvent, TransportError};

/// Which status events, and from where.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    /// Only this project's sandboxes.
    pub project_id: Option<String>,
    /// Only this sandbox.
    pub sandbox_id: Option<String>,
    /// Resume after this sequence (`0`: everything the server still holds). `None`: new
    /// events only.
    pub after: Option<u64>,
}

/// Which public events, and from where.
#[derive(Debug, Clone, Default)]
pub struct PublicEventFilter {
    /// Only this project's.
    pub project_id: Option<String>,
    /// Only this sandbox's.
    pub sandbox_id: Option<String>,
    /// Only these types: exact (`sandbox.status.changed`) or prefixes ending in `.*`
    /// (`sandbox.exec.*`). Empty: every type. The server refuses (400, field `types`) a
    /// filter that matches no type.
    pub types: Vec<String>,
    /// Resume after this sequence (`0`: everything the server still holds). `None`: new
    /// events only.
    pub after: Option<u64>,
}

/// One event and its stream sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sequenced<T> {
    /// The stream sequence (`id:`): pass it as `after` to resume.
    pub id: u64,
    pub event: T,
}

/// A status event and its sequence.
pub type Event = Sequenced<StatusEvent>;

/// A public event and its sequence.
pub type PublicEventEntry = Sequenced<PublicEvent>;

/// Reconnects in a row before the stream gives up and yields the error.
const MAX_RECONNECTS: u32 = 5;

/// Status events, read with [`next`](EventStream::next); endless until dropped.
pub struct EventStream {
    inner: Resuming,
}

/// Public events, read with [`next`](PublicEventStream::next); endless until dropped.
pub struct PublicEventStream {
    inner: Resuming,
}

impl Client {
    /// Opens the status events stream (the first connection is made here, so a bad filter
    /// or key is an error now, not at the first event).
    pub async fn events(&self, filter: EventFilter) -> Result<EventStream> {
        let path = format!(
            "/v1/events{}",
            query(&[
                ("projectId", filter.project_id),
                ("sandboxId", filter.sandbox_id),
            ])
        );
        let inner = Resuming::open(self, path, filter.after, |name| name == "status").await?;
        Ok(EventStream { inner })
    }

    /// Opens the public events stream, `format=public` (connected here, so a bad filter —
    /// a type that matches nothing — or key is an error now).
    pub async fn public_events(&self, filter: PublicEventFilter) -> Result<PublicEventStream> {
        let types = (!filter.types.is_empty()).then(|| filter.types.join(","));
        let path = format!(
            "/v1/events{}",
            query(&[
                ("format", Some("public".to_owned())),
                ("projectId", filter.project_id),
                ("sandboxId", filter.sandbox_id),
                ("types", types),
            ])
        );
        // Every event of this format is a public event named by its type.
        let inner = Resuming::open(self, path, filter.after, |name| !name.is_empty()).await?;
        Ok(PublicEventStream { inner })
    }
}

impl EventStream {
    /// The sequence of the last event handed out (what a reconnect resumes after).
    pub fn last_event_id(&self) -> Option<u64> {
        self.inner.last_id
    }

    /// The next event; an error after [`MAX_RECONNECTS`] failed reconnects in a row, or at
    /// once for an answer that is not the API's.
    pub async fn next(&mut self) -> Option<Result<Event>> {
        let (id, ev) = match self.inner.next().await? {
            Ok(x) => x,
            Err(e) => return Some(Err(e)),
        };
        Some(
            serde_json::from_slice::<StatusEvent>(&ev.data)
                .map(|event| Event { id, event })
                .map_err(|e| {
                    Error::protocol(
                        "GET /v1/events",
                        format!("a status event is not StatusEvent: {e}"),
                    )
                }),
        )
    }
}

impl PublicEventStream {
    /// The sequence of the last event handed out (what a reconnect resumes after).
    pub fn last_event_id(&self) -> Option<u64> {
        self.inner.last_id
    }

    /// The next event; an error after [`MAX_RECONNECTS`] failed reconnects in a row, or at
    /// once for an answer that is not the API's.
    pub async fn next(&mut self) -> Option<Result<PublicEventEntry>> {
        let (id, ev) = match self.inner.next().await? {
            Ok(x) => x,
            Err(e) => return Some(Err(e)),
        };
        Some(
            serde_json::from_slice::<PublicEvent>(&ev.data)
                .map(|event| PublicEventEntry { id, event })
                .map_err(|e| {
                    Error::protocol(
                        "GET /v1/events?format=public",
                        format!("a {:?} event is not a public event: {e}", ev.event),
                    )
                }),
        )
    }
}

/// One SSE connection that resumes after the last event it handed out; the formats differ
/// only in which events they take and how they decode them.
struct Resuming {
    client: Client,
    /// The route with its query, without the resume point (that travels as a header).
    path: String,
    last_id: Option<u64>,
    resp: Option<Response>,
    parser: SseParser,
    pending: VecDeque<(u64, SseEvent)>,
    failures: u32,
    /// Whether an event of this name belongs to the stream (others are skipped).
    accept: fn(&str) -> bool,
}

impl Resuming {
    async fn open(
        client: &Client,
        path: String,
        after: Option<u64>,
        accept: fn(&str) -> bool,
    ) -> Result<Resuming> {
        let mut s = Resuming {
            client: client.clone(),
            path,
            last_id: after,
            resp: None,
            parser: SseParser::default(),
            pending: VecDeque::new(),
            failures: 0,
            accept,
        };
        s.connect().await?;
        Ok(s)
    }

    async fn connect(&mut self) -> Result<()> {
        let mut rb = self
            .client
            .authorized(Method::GET, &self.path)
            .header("accept", "text/event-stream");
        if let Some(id) = self.last_id {
            rb = rb.header("last-event-id", id.to_string());
        }
        self.parser = SseParser::default();
        self.resp = Some(self.client.send(&Method::GET, &self.path, rb).await?);
        Ok(())
    }

    /// The next accepted event with its sequence, which becomes the resume point.
    async fn next(&mut self) -> Option<Result<(u64, SseEvent)>> {
        loop {
            if let Some((id, ev)) = self.pending.pop_front() {
                self.last_id = Some(id);
                return Some(Ok((id, ev)));
            }
            let chunk = match self.resp.as_mut() {
                Some(r) => {
                    let url = r.url().to_string();
                    r.chunk().await.map_err(|e| {
                        Error::from(TransportError::new("GET", &url, self.client.base_url(), e))
                    })
                }
                None => Ok(None),
            };
            match chunk {
                Ok(Some(bytes)) => {
                    self.failures = 0;
                    for ev in self.parser.push(&bytes) {
                        if !(self.accept)(&ev.event) {
                            continue;
                        }
                        match ev.id.as_deref().map(str::parse::<u64>) {
                            Some(Ok(id)) => self.pending.push_back((id, ev)),
                            _ => {
                                return Some(Err(Error::protocol(
                                    "GET /v1/events",
                                    format!("a {:?} event without a numeric id", ev.event),
                                )))
                            }
                        }
                    }
                }
                // The connection ended or broke: resume after the last event handed out.
                Ok(None) | Err(Error::Transport(_)) => {
                    self.resp = None;
                    self.failures += 1;
                    if self.failures > 1 {
                        let back_off = 200u64 << self.failures.min(4);
                        tokio::time::sleep(Duration::from_millis(back_off)).await;
                    }
                    if let Err(e) = self.connect().await {
                        if self.failures >= MAX_RECONNECTS || !matches!(e, Error::Transport(_)) {
                            return Some(Err(e));
                        }
                    }
                }
                Err(e) => return Some(Err(e)),
            }
        }
    }
}
