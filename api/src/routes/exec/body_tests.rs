//! The two renderings of a streamed exec, fed by real runs: frames and SSE bytes, merging of
//! queued output, heartbeats, and a single line sent at once.

use std::time::Duration;

use axum::body::Bytes;
use axum::http::header;
use differently_adapters::{AdapterError, ExecEvent, ExecExit};
use differently_core::exec::OutputEncoding;
use futures::StreamExt;
use serde_json::json;
use tokio::sync::mpsc;

use super::frame_body::{frame_chunks, FrameState};
use super::frames::{self, Frame, FrameDecoder, FrameType};
use super::running::Running;
use super::sse_body::sse_response;
use super::{COALESCE_LIMIT, STREAM_BUFFER};
use crate::error::ApiError;
use crate::requests::sse::HEARTBEAT;

/// A run whose adapter writes `events` and then ends with `end`, after `pause` if given.
fn run_of(
    events: Vec<ExecEvent>,
    pause: Option<Duration>,
    end: Result<ExecExit, AdapterError>,
) -> Running {
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    let task = tokio::spawn(async move {
        if let Some(p) = pause {
            tokio::time::sleep(p).await;
        }
        for ev in events {
            let _ = tx.send(ev).await;
        }
        end
    });
    Running::of_task(rx, task)
}

async fn frame_body(run: Running, every: Duration) -> (Vec<Bytes>, Vec<Frame>) {
    let chunks: Vec<Bytes> = frame_chunks(FrameState::new(run, every))
        .map(|c| match c {
            Ok(c) => c,
            Err(e) => match e {},
        })
        .collect()
        .await;
    let mut d = FrameDecoder::default();
    let mut frames = Vec::new();
    for c in &chunks {
        frames.extend(d.push(c).unwrap());
    }
    d.finish().unwrap();
    (chunks, frames)
}

#[tokio::test]
async fn frame_body_carries_raw_bytes_then_the_exit() {
    let binary = Bytes::from_static(b"\xff\xfe\x00y\n");
    let run = run_of(
        vec![
            ExecEvent::Stdout(binary.clone()),
            ExecEvent::Stdout(Bytes::new()),
            ExecEvent::Stderr(Bytes::from_static(b"err")),
        ],
        None,
        Ok(ExecExit {
            exit_code: 3,
            duration_ms: 12,
        }),
    );
    let (_, frames) = frame_body(run, HEARTBEAT).await;
    let kinds: Vec<FrameType> = frames.iter().map(|f| f.kind).collect();
    assert_eq!(
        kinds,
        [FrameType::Stdout, FrameType::Stderr, FrameType::Exit]
    );
    assert_eq!(frames[0].payload, binary);
    assert_eq!(&frames[1].payload[..], b"err");
    let exit: serde_json::Value = serde_json::from_slice(&frames[2].payload).unwrap();
    assert_eq!(exit, json!({"exitCode": 3, "durationMs": 12}));
}

#[tokio::test]
async fn frame_body_ends_with_an_error_frame_on_failure() {
    let run = run_of(
        vec![ExecEvent::Stdout(Bytes::from_static(b"a"))],
        None,
        Err(AdapterError::unavailable("backend down")),
    );
    let (_, frames) = frame_body(run, HEARTBEAT).await;
    assert_eq!(frames.len(), 2);
    assert_eq!(frames[1].kind, FrameType::Error);
    let err: serde_json::Value = serde_json::from_slice(&frames[1].payload).unwrap();
    assert_eq!(
        err["code"],
        json!(ApiError::from(AdapterError::unavailable(String::new())).code)
    );
    assert!(err["message"].is_string());
}

#[tokio::test]
async fn a_quiet_frame_stream_sends_heartbeats() {
    let run = run_of(
        vec![ExecEvent::Stdout(Bytes::from_static(b"late"))],
        Some(Duration::from_millis(250)),
        Ok(ExecExit {
            exit_code: 0,
            duration_ms: 250,
        }),
    );
    let (_, frames) = frame_body(run, Duration::from_millis(40)).await;
    let beats = frames
        .iter()
        .take_while(|f| f.kind == FrameType::Heartbeat)
        .count();
    assert!(beats >= 2, "{frames:?}");
    assert!(frames
        .iter()
        .all(|f| f.kind != FrameType::Heartbeat || f.payload.is_empty()));
    assert_eq!(frames[beats].kind, FrameType::Stdout);
    assert_eq!(frames[beats + 1].kind, FrameType::Exit);
}

#[tokio::test]
async fn sse_body_is_unchanged() {
    let run = run_of(
        vec![
            ExecEvent::Stdout(Bytes::from_static(b"a\n\xe2\x98")),
            ExecEvent::Stderr(Bytes::from_static(b"b\n")),
            ExecEvent::Stdout(Bytes::from_static(b"\x83")),
        ],
        None,
        Ok(ExecExit {
            exit_code: 7,
            duration_ms: 5,
        }),
    );
    let resp = sse_response(run, OutputEncoding::Utf8, None);
    assert_eq!(resp.headers()[header::CONTENT_TYPE], "text/event-stream");
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    // The bytes the SSE path produced before the frame format existed.
    assert_eq!(
        String::from_utf8(body.to_vec()).unwrap(),
        "event: stdout\ndata: {\"data\":\"a\\n\"}\n\n\
         event: stderr\ndata: {\"data\":\"b\\n\"}\n\n\
         event: stdout\ndata: {\"data\":\"☃\"}\n\n\
         event: exit\ndata: {\"durationMs\":5,\"exitCode\":7}\n\n"
    );
}

/// A run whose `events` are all queued before the body reads any, ending after `end_after`.
fn queued_run(events: Vec<ExecEvent>, end_after: Duration) -> Running {
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    for ev in events {
        tx.try_send(ev).unwrap();
    }
    let task = tokio::spawn(async move {
        tokio::time::sleep(end_after).await;
        drop(tx);
        Ok(ExecExit {
            exit_code: 0,
            duration_ms: 1,
        })
    });
    Running::of_task(rx, task)
}

fn out(b: &'static [u8]) -> ExecEvent {
    ExecEvent::Stdout(Bytes::from_static(b))
}

fn err(b: &'static [u8]) -> ExecEvent {
    ExecEvent::Stderr(Bytes::from_static(b))
}

#[tokio::test]
async fn queued_output_goes_out_as_one_frame_body_chunk() {
    let events = vec![out(b"a"), out(b""), out(b"b"), err(b"c"), out(b"d")];
    let run = queued_run(events, Duration::ZERO);
    let (chunks, frames) = frame_body(run, HEARTBEAT).await;
    // Every queued frame in the first chunk, in order; the exit frame follows alone.
    assert_eq!(chunks.len(), 2, "{chunks:?}");
    let mut d = FrameDecoder::default();
    let first: Vec<(FrameType, Vec<u8>)> = d
        .push(&chunks[0])
        .unwrap()
        .into_iter()
        .map(|f| (f.kind, f.payload.to_vec()))
        .collect();
    assert_eq!(
        first,
        [
            (FrameType::Stdout, b"a".to_vec()),
            (FrameType::Stdout, b"b".to_vec()),
            (FrameType::Stderr, b"c".to_vec()),
            (FrameType::Stdout, b"d".to_vec()),
        ]
    );
    assert_eq!(frames.last().map(|f| f.kind), Some(FrameType::Exit));
}

#[tokio::test]
async fn a_frame_body_chunk_stops_merging_at_the_limit() {
    let big = || ExecEvent::Stdout(Bytes::from(vec![b'x'; 64 * 1024]));
    let events = (0..STREAM_BUFFER).map(|_| big()).collect();
    let (chunks, frames) = frame_body(queued_run(events, Duration::ZERO), HEARTBEAT).await;
    let per_chunk = COALESCE_LIMIT / (64 * 1024);
    assert_eq!(
        chunks[0].len(),
        per_chunk * (frames::HEADER_LEN + 64 * 1024)
    );
    let total: usize = frames
        .iter()
        .filter(|f| f.kind == FrameType::Stdout)
        .count();
    assert_eq!(total, STREAM_BUFFER);
}

#[tokio::test]
async fn queued_sse_output_merges_per_stream_in_order() {
    let events = vec![out(b"a"), out(b"b\n"), err(b"c"), err(b"d"), out(b"e")];
    let resp = sse_response(
        queued_run(events, Duration::ZERO),
        OutputEncoding::Utf8,
        None,
    );
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8(body.to_vec()).unwrap(),
        "event: stdout\ndata: {\"data\":\"ab\\n\"}\n\n\
         event: stderr\ndata: {\"data\":\"cd\"}\n\n\
         event: stdout\ndata: {\"data\":\"e\"}\n\n\
         event: exit\ndata: {\"durationMs\":1,\"exitCode\":0}\n\n"
    );
}

/// Latency: one short line while the command keeps running goes out at once, in both
/// formats (the body merges only what is already queued, it never waits for more).
#[tokio::test]
async fn a_single_line_is_sent_at_once() {
    let wait = Duration::from_secs(2);
    let run = queued_run(vec![out(b"hi\n")], Duration::from_secs(60));
    let mut body = std::pin::pin!(frame_chunks(FrameState::new(run, HEARTBEAT)));
    let first = tokio::time::timeout(wait, body.next())
        .await
        .expect("the line was not sent within 2 s")
        .unwrap()
        .unwrap_or_else(|e| match e {});
    let got = FrameDecoder::default().push(&first).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].kind, &got[0].payload[..]),
        (FrameType::Stdout, &b"hi\n"[..])
    );

    let run = queued_run(vec![out(b"hi\n")], Duration::from_secs(60));
    let mut body = sse_response(run, OutputEncoding::Utf8, None)
        .into_body()
        .into_data_stream();
    let first = tokio::time::timeout(wait, body.next())
        .await
        .expect("the SSE line was not sent within 2 s")
        .unwrap()
        .unwrap();
    assert_eq!(&first[..], b"event: stdout\ndata: {\"data\":\"hi\\n\"}\n\n");
}

/// A call that fails before any output is handed back by `started` as its error (the JSON
/// answer); one that printed, ended, or stayed quiet for the window goes on as a stream with
/// everything it produced, in order.
#[tokio::test]
async fn started_hands_back_only_a_failure_before_any_output() {
    let window = Duration::from_millis(200);
    let bad_cwd = || AdapterError::invalid_field("cwd", "cwd /nope does not exist in the sandbox");
    let mut run = run_of(vec![], None, Err(bad_cwd()));
    let e = run
        .started(window)
        .await
        .expect_err("refused before it started");
    assert_eq!(e.code, differently_core::ErrorCode::ValidationFailed);
    assert_eq!(e.details, Some(json!({ "field": "cwd" })));

    // Output, then the same failure: the command ran, so the stream carries both.
    let mut run = run_of(
        vec![ExecEvent::Stdout(Bytes::from_static(b"hi\n"))],
        None,
        Err(bad_cwd()),
    );
    run.started(window).await.expect("started");
    let (_, frames) = frame_body(run, HEARTBEAT).await;
    let kinds: Vec<FrameType> = frames.iter().map(|f| f.kind).collect();
    assert_eq!(kinds, [FrameType::Stdout, FrameType::Error]);

    // An exit without output: the exit, once.
    let exit = ExecExit {
        exit_code: 0,
        duration_ms: 1,
    };
    let mut run = run_of(vec![], None, Ok(exit));
    run.started(window).await.expect("started");
    let (_, frames) = frame_body(run, HEARTBEAT).await;
    let kinds: Vec<FrameType> = frames.iter().map(|f| f.kind).collect();
    assert_eq!(kinds, [FrameType::Exit]);

    // Quiet past the window: the head goes out, a later failure is the stream's error.
    let mut run = run_of(vec![], Some(window * 2), Err(bad_cwd()));
    let t0 = std::time::Instant::now();
    run.started(window).await.expect("waited out");
    assert!(t0.elapsed() < window * 2, "waited only the window");
    let (_, frames) = frame_body(run, HEARTBEAT).await;
    let kinds: Vec<FrameType> = frames.iter().map(|f| f.kind).collect();
    assert_eq!(kinds, [FrameType::Error]);
}
