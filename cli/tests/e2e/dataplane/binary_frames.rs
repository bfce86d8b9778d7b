//! Exec streamed as binary frames, read with the API's reference decoder.

use std::time::{Duration, Instant};

use differently_api::routes::exec::frames::{Frame, FrameDecoder, FrameType, MEDIA_TYPE};
use differently_core::SandboxId;
use serde_json::{json, Value};

use crate::harness::Opts;

use super::{assert_cancelled_on_backend, cluster, read_sse, running};

/// Reads a binary exec stream to its end with the API's reference decoder (which also
/// checks that exactly one exit or error frame ends it); returns the frames.
async fn read_frames(mut resp: reqwest::Response) -> Vec<Frame> {
    let mut decoder = FrameDecoder::default();
    let mut frames = Vec::new();
    while let Some(chunk) = resp.chunk().await.expect("frame chunk") {
        frames.extend(decoder.push(&chunk).expect("valid frames"));
    }
    decoder
        .finish()
        .expect("a complete, terminated frame stream");
    frames
}
/// The concatenated payloads of `kind` frames.
fn payload_of(frames: &[Frame], kind: FrameType) -> Vec<u8> {
    frames
        .iter()
        .filter(|f| f.kind == kind)
        .flat_map(|f| f.payload.iter().copied())
        .collect()
}
/// The JSON of the exit frame, which must be the last frame.
fn exit_of(frames: &[Frame]) -> Value {
    let last = frames.last().expect("frames");
    assert_eq!(last.kind, FrameType::Exit, "{frames:?}");
    serde_json::from_slice(&last.payload).expect("exit payload json")
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_exec_as_binary_frames() {
    let c = cluster(Opts::default()).await;
    let id = running(&c, json!({"capabilities": ["lifecycle.stop"]})).await;
    assert_eq!(c.get(&id).await["pool"], "fake");
    let path = format!("/v1/sandboxes/{id}/exec/stream");
    let stream = |accept: &'static str, body: Value| {
        c.req(reqwest::Method::POST, &path)
            .header("accept", accept)
            .json(&body)
            .send()
    };
    use base64::Engine;
    let all: Vec<u8> = (0..=255u8).rev().chain(0..=255u8).collect();
    let b64 = base64::engine::general_purpose::STANDARD.encode(&all);

    // Every byte value arrives raw (not valid UTF-8, no encoding), then the exit frame.
    // `outputEncoding` is ignored by frames.
    for enc in ["utf8", "base64"] {
        let resp = stream(
            MEDIA_TYPE,
            json!({"command": ["cat"], "stdinBase64": b64, "outputEncoding": enc}),
        )
        .await
        .expect("stream");
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["content-type"], MEDIA_TYPE);
        let frames = read_frames(resp).await;
        assert_eq!(payload_of(&frames, FrameType::Stdout), all, "{enc}");
        assert!(payload_of(&frames, FrameType::Stderr).is_empty());
        let exit = exit_of(&frames);
        assert_eq!(exit["exitCode"], 0);
        assert!(exit["durationMs"].is_u64(), "{exit}");
    }

    // Several frames of the adapter's chunks (≤ 64 KiB each, none empty), exact bytes.
    const N: usize = 300 * 1024 + 3;
    let resp = stream(
        MEDIA_TYPE,
        json!({"command": ["fake-output", N.to_string()]}),
    )
    .await
    .expect("stream");
    let frames = read_frames(resp).await;
    let out = payload_of(&frames, FrameType::Stdout);
    let want: Vec<u8> = (0..N)
        .map(|i| if i % 2 == 0 { b'y' } else { b'\n' })
        .collect();
    assert!(out == want, "{} bytes arrived, {N} expected", out.len());
    let outputs: Vec<&Frame> = frames
        .iter()
        .filter(|f| f.kind == FrameType::Stdout)
        .collect();
    assert_eq!(outputs.len(), N.div_ceil(64 * 1024));
    assert!(outputs
        .iter()
        .all(|f| !f.payload.is_empty() && f.payload.len() <= 64 * 1024));
    assert_eq!(exit_of(&frames)["exitCode"], 0);

    // Stderr is type 2; exit codes and the timeout's 124 arrive in the exit frame.
    let resp = stream(
        MEDIA_TYPE,
        json!({"command": ["fake-output", "6", "stderr"]}),
    )
    .await
    .expect("stream");
    let frames = read_frames(resp).await;
    assert_eq!(payload_of(&frames, FrameType::Stderr), b"y\ny\ny\n");
    assert!(payload_of(&frames, FrameType::Stdout).is_empty());
    let resp = stream(MEDIA_TYPE, json!({"command": ["fake-exit", "3"]}))
        .await
        .expect("stream");
    let frames = read_frames(resp).await;
    assert_eq!(frames.len(), 1, "{frames:?}");
    assert_eq!(exit_of(&frames)["exitCode"], 3);
    let started = Instant::now();
    let resp = stream(
        MEDIA_TYPE,
        json!({"command": ["sleep", "30"], "timeoutSeconds": 1}),
    )
    .await
    .expect("stream");
    assert_eq!(exit_of(&read_frames(resp).await)["exitCode"], 124);
    assert!(started.elapsed() < Duration::from_secs(10));

    // Errors before the stream starts stay JSON errors.
    let missing = SandboxId::new();
    let resp = c
        .req(
            reqwest::Method::POST,
            &format!("/v1/sandboxes/{missing}/exec/stream"),
        )
        .header("accept", MEDIA_TYPE)
        .json(&json!({"command": ["true"]}))
        .send()
        .await
        .expect("stream");
    assert_eq!(resp.status(), 404);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/json"));
    let resp = stream(MEDIA_TYPE, json!({"command": []}))
        .await
        .expect("stream");
    assert_eq!(resp.status(), 422);
    let body: Value = resp.json().await.expect("error json");
    assert_eq!(body["error"]["code"], "validation_failed", "{body}");

    // Any other Accept still gets SSE.
    for accept in ["text/event-stream", "*/*"] {
        let resp = stream(
            accept,
            json!({"command": ["cat"], "stdinBase64": b64, "outputEncoding": "base64"}),
        )
        .await
        .expect("stream");
        assert_eq!(resp.status(), 200);
        assert!(resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream"));
        let events = read_sse(resp).await;
        let mut out = Vec::new();
        for (ev, data) in &events[..events.len() - 1] {
            assert_eq!(ev, "stdout", "{accept}: {events:?}");
            let v: Value = serde_json::from_str(data).expect("event json");
            out.extend(
                base64::engine::general_purpose::STANDARD
                    .decode(v["data"].as_str().unwrap())
                    .expect("base64 data"),
            );
        }
        assert_eq!(out, all, "{accept}");
        assert_eq!(events.last().expect("exit").0, "exit");
    }

    // Audited like SSE: the program name only.
    let (s, log) = crate::audit::audit_page(
        &c,
        &c.key,
        &format!("?resource={id}&action=sandbox.exec_stream&limit=100"),
    )
    .await;
    assert_eq!(s, 200, "{log}");
    let items = log["items"].as_array().expect("audit items");
    assert_eq!(
        items
            .iter()
            .filter(|i| i["detail"]["program"] == "fake-output")
            .count(),
        2,
        "{log}"
    );
    assert!(
        !log.to_string().contains(&b64),
        "stdin leaked into the audit log"
    );

    // Hanging up on a frame stream cancels the command on the backend.
    let mut resp = stream(
        MEDIA_TYPE,
        json!({"command": ["fake-output", (10u64 << 30).to_string()]}),
    )
    .await
    .expect("stream");
    assert!(resp.chunk().await.expect("chunk").is_some());
    drop(resp);
    assert_cancelled_on_backend(&c, &id).await;
}
