//! The binary rendering of a streamed exec (length-prefixed frames, [`super::frames`]), and
//! the `Accept` negotiation that selects it.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{header, HeaderMap};
use bytes::BytesMut;
use differently_adapters::ExecEvent;
use futures::Stream;
use tokio::time::Instant;

use super::frames::{self, FrameType};
use super::running::{Ending, Next, Running};
use super::COALESCE_LIMIT;

/// What the frame body keeps between body chunks.
pub(super) struct FrameState {
    run: Running,
    /// Body chunks (frame headers and payloads) still to send, in order.
    pending: VecDeque<Bytes>,
    done: bool,
    /// Quiet time after which a heartbeat is sent (`HEARTBEAT`; shorter in tests).
    every: Duration,
    /// When the last frame was produced; a heartbeat follows `every` after it.
    last_frame: Instant,
    /// Armed for `last_frame + every` lazily: it is moved only when it fires, so busy
    /// streams do not touch the timer once per chunk.
    heartbeat: Pin<Box<tokio::time::Sleep>>,
}

impl FrameState {
    pub(super) fn new(run: Running, every: Duration) -> FrameState {
        FrameState {
            run,
            pending: VecDeque::new(),
            done: false,
            every,
            last_frame: Instant::now(),
            heartbeat: Box::pin(tokio::time::sleep(every)),
        }
    }
}

/// The binary body: the output event that woke it and every one already queued after it
/// (up to `COALESCE_LIMIT`), as frames in one body chunk.
pub(super) fn frame_chunks(st: FrameState) -> impl Stream<Item = Result<Bytes, Infallible>> {
    futures::stream::unfold(st, |mut st| async move {
        loop {
            if let Some(chunk) = st.pending.pop_front() {
                return Some((Ok(chunk), st));
            }
            if st.done {
                return None;
            }
            let next = tokio::select! {
                biased;
                next = st.run.next() => next,
                () = &mut st.heartbeat => {
                    if Instant::now() >= st.last_frame + st.every {
                        st.pending.push_back(frames::heartbeat());
                        st.last_frame = Instant::now();
                    }
                    let at = st.last_frame + st.every;
                    st.heartbeat.as_mut().reset(at);
                    continue;
                }
            };
            match next {
                Some(Next::Output(first)) => {
                    let mut body = BytesMut::new();
                    let mut ev = Some(first);
                    while let Some(e) = ev.take() {
                        match e {
                            ExecEvent::Stdout(b) => {
                                frames::output(FrameType::Stdout, &b, &mut body)
                            }
                            ExecEvent::Stderr(b) => {
                                frames::output(FrameType::Stderr, &b, &mut body)
                            }
                        }
                        if body.len() < COALESCE_LIMIT {
                            ev = st.run.ready();
                        }
                    }
                    if !body.is_empty() {
                        st.pending.push_back(body.freeze());
                    }
                }
                Some(Next::End(end)) => {
                    let (kind, json) = match end {
                        Ending::Exit(j) => (FrameType::Exit, j),
                        Ending::Error(j) => (FrameType::Error, j),
                    };
                    st.pending.push_back(frames::control(kind, json.as_bytes()));
                    st.done = true;
                }
                None => st.done = true,
            }
            if !st.pending.is_empty() {
                st.last_frame = Instant::now();
            }
        }
    })
}

/// Whether the client asked for frames: `Accept` names [`frames::MEDIA_TYPE`] with a
/// non-zero `q` no lower than that of any range SSE satisfies (`text/event-stream`,
/// `text/*`, `*/*`). Everything else, including no `Accept` at all, gets SSE, so existing
/// clients see no change; `application/*` alone does not opt in.
pub(crate) fn wants_frames(headers: &HeaderMap) -> bool {
    let (mut frames_q, mut sse_q) = (None::<f32>, None::<f32>);
    let ranges = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','));
    for range in ranges {
        let mut parts = range.split(';');
        let media = parts.next().unwrap_or("").trim();
        let mut q = Some(1.0f32);
        for p in parts {
            if let Some((k, v)) = p.split_once('=') {
                if k.trim().eq_ignore_ascii_case("q") {
                    q = v
                        .trim()
                        .parse::<f32>()
                        .ok()
                        .filter(|q| (0.0..=1.0).contains(q));
                }
            }
        }
        // A malformed q makes the range unusable rather than guessing.
        let Some(q) = q else { continue };
        let slot = if media.eq_ignore_ascii_case(frames::MEDIA_TYPE) {
            &mut frames_q
        } else if ["text/event-stream", "text/*", "*/*"]
            .iter()
            .any(|m| media.eq_ignore_ascii_case(m))
        {
            &mut sse_q
        } else {
            continue;
        };
        *slot = Some(slot.map_or(q, |old| old.max(q)));
    }
    match frames_q {
        Some(f) => f > 0.0 && sse_q.is_none_or(|s| f >= s),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn accept(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(header::ACCEPT, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn only_an_explicit_accept_selects_frames() {
        let t = frames::MEDIA_TYPE;
        for (values, want) in [
            (vec![], false),
            (vec!["*/*"], false),
            (vec!["text/event-stream"], false),
            (vec!["application/*"], false),
            (vec!["application/json"], false),
            (vec![t], true),
            (vec!["Application/Vnd.Differently.Exec-Stream"], true),
            (vec![&format!("{t}, text/event-stream")], true),
            (vec![&format!("text/event-stream, {t}")], true),
            (vec![&format!("{t};q=0.5, text/event-stream")], false),
            (vec![&format!("{t};q=0.5, application/json")], true),
            (vec![&format!("{t} ; q=0.9, */*;q=0.1")], true),
            (vec![&format!("{t};q=0")], false),
            (vec![&format!("{t};q=banana")], false),
            (vec!["text/event-stream;q=0.2", t], true),
        ] {
            assert_eq!(wants_frames(&accept(&values)), want, "{values:?}");
        }
    }
}
