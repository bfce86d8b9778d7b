//! `GET /v1/events`: sandbox status changes as SSE. Each event carries its stream sequence as
//! `id`; the stream reconnects by itself after a dropped connection with `Last-Event-ID`, so
//! no event is lost or repeated while the server still holds it (24 h).

use std::collections::VecDeque;
use std::time::Duration;

use reqwest::{Method, Response};

use crate::sse::SseParser;
use crate::{query, Client, Error, Result, StatusEvent, TransportError};

/// Which events, and from where.
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

/// One status event and its sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The stream sequence (`id:`): pass it as `after` to resume.
    pub id: u64,
    pub event: StatusEvent,
}

/// Reconnects in a row before the stream gives up and yields the error.
const MAX_RECONNECTS: u32 = 5;

/// Status events, read with [`next`](EventStream::next); endless until dropped.
pub struct EventStream {
    client: Client,
    filter: EventFilter,
    last_id: Option<u64>,
    resp: Option<Response>,
    parser: SseParser,
    pending: VecDeque<Event>,
    failures: u32,
}

impl Client {
    /// Opens the events stream (the first connection is made here, so a bad filter or key
    /// is an error now, not at the first event).
    pub async fn events(&self, filter: EventFilter) -> Result<EventStream> {
        let mut s = EventStream {
            client: self.clone(),
            last_id: filter.after,
            filter,
            resp: None,
            parser: SseParser::default(),
            pending: VecDeque::new(),
            failures: 0,
        };
        s.connect().await?;
        Ok(s)
    }
}

impl EventStream {
    /// The sequence of the last event handed out (what a reconnect resumes after).
    pub fn last_event_id(&self) -> Option<u64> {
        self.last_id
    }

    async fn connect(&mut self) -> Result<()> {
        let path = format!(
            "/v1/events{}",
            query(&[
                ("projectId", self.filter.project_id.clone()),
                ("sandboxId", self.filter.sandbox_id.clone()),
            ])
        );
        let mut rb = self
            .client
            .authorized(Method::GET, &path)
            .header("accept", "text/event-stream");
        if let Some(id) = self.last_id {
            rb = rb.header("last-event-id", id.to_string());
        }
        self.parser = SseParser::default();
        self.resp = Some(self.client.send(&Method::GET, &path, rb).await?);
        Ok(())
    }

    /// The next event; an error after [`MAX_RECONNECTS`] failed reconnects in a row, or at
    /// once for an answer that is not the API's (then the stream is done).
    pub async fn next(&mut self) -> Option<Result<Event>> {
        loop {
            if let Some(ev) = self.pending.pop_front() {
                self.last_id = Some(ev.id);
                return Some(Ok(ev));
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
                        if ev.event != "status" {
                            continue;
                        }
                        let id = match ev.id.as_deref().map(str::parse::<u64>) {
                            Some(Ok(id)) => id,
                            _ => {
                                return Some(Err(Error::protocol(
                                    "GET /v1/events",
                                    "a status event without a numeric id",
                                )))
                            }
                        };
                        match serde_json::from_slice::<StatusEvent>(&ev.data) {
                            Ok(event) => self.pending.push_back(Event { id, event }),
                            Err(e) => {
                                return Some(Err(Error::protocol(
                                    "GET /v1/events",
                                    format!("a status event is not StatusEvent: {e}"),
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
