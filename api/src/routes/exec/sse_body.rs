//! The SSE rendering of a streamed exec: JSON-string events and `: ping` comments.

use std::convert::Infallible;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use differently_adapters::ExecEvent;
use differently_core::exec::OutputEncoding;
use futures::Stream;
use serde_json::json;

use super::running::{Ending, Next, Running};
use super::text::{encode, Utf8Carry};
use crate::requests::sse::HEARTBEAT;

/// What the SSE body keeps between events.
struct SseState {
    run: Running,
    enc: OutputEncoding,
    out: Utf8Carry,
    err: Utf8Carry,
    done: bool,
    /// Tail events (flushed UTF-8 remainders, then exit or error) still to send.
    tail: Vec<Event>,
    /// The byte offset after the output read so far, when events carry it as their `id`.
    offset: Option<u64>,
}

impl SseState {
    /// `ev` with the offset after `n` more bytes as its id, when ids are kept: the bytes
    /// still held back (a character cut between chunks) are not counted yet.
    fn after(&mut self, n: usize, ev: Event) -> Event {
        let Some(offset) = self.offset.as_mut() else {
            return ev;
        };
        *offset += n as u64;
        let held = (self.out.held() + self.err.held()) as u64;
        ev.id(offset.saturating_sub(held).to_string())
    }
}

fn data_event(kind: &str, data: String) -> Event {
    Event::default()
        .event(kind)
        .data(json!({ "data": data }).to_string())
}

fn sse_events(st: SseState) -> impl Stream<Item = Result<Event, Infallible>> {
    futures::stream::unfold(st, |mut st| async move {
        loop {
            if let Some(ev) = st.tail.pop() {
                return Some((Ok(ev), st));
            }
            if st.done {
                return None;
            }
            match st.run.next().await {
                Some(Next::Output(ExecEvent::Stdout(b))) => {
                    let b = st.run.merge_same_stream(b, true);
                    let data = match st.enc {
                        OutputEncoding::Base64 => encode(st.enc, &b),
                        OutputEncoding::Utf8 => st.out.push(&b),
                    };
                    if data.is_empty() {
                        st.offset = st.offset.map(|o| o + b.len() as u64);
                        continue;
                    }
                    let ev = st.after(b.len(), data_event("stdout", data));
                    return Some((Ok(ev), st));
                }
                Some(Next::Output(ExecEvent::Stderr(b))) => {
                    let b = st.run.merge_same_stream(b, false);
                    let data = match st.enc {
                        OutputEncoding::Base64 => encode(st.enc, &b),
                        OutputEncoding::Utf8 => st.err.push(&b),
                    };
                    if data.is_empty() {
                        st.offset = st.offset.map(|o| o + b.len() as u64);
                        continue;
                    }
                    let ev = st.after(b.len(), data_event("stderr", data));
                    return Some((Ok(ev), st));
                }
                Some(Next::End(end)) => {
                    st.done = true;
                    let (name, json) = match end {
                        Ending::Exit(j) => ("exit", j),
                        Ending::Error(j) => ("error", j),
                    };
                    // Popped from the back: the exit goes last.
                    st.tail.push(Event::default().event(name).data(json));
                    let rest_err = st.err.finish();
                    if !rest_err.is_empty() {
                        st.tail.push(data_event("stderr", rest_err));
                    }
                    let rest_out = st.out.finish();
                    if !rest_out.is_empty() {
                        st.tail.push(data_event("stdout", rest_out));
                    }
                }
                None => st.done = true,
            }
        }
    })
}

pub(super) fn sse_response(run: Running, enc: OutputEncoding, offset: Option<u64>) -> Response {
    let st = SseState {
        run,
        enc,
        out: Utf8Carry::default(),
        err: Utf8Carry::default(),
        done: false,
        tail: Vec::new(),
        offset,
    };
    Sse::new(sse_events(st))
        .keep_alive(KeepAlive::new().interval(HEARTBEAT).text("ping"))
        .into_response()
}
