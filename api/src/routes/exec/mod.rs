//! Exec: `POST /v1/sandboxes/{id}/exec` (collected, size-capped) and
//! `POST /v1/sandboxes/{id}/exec/stream` (SSE, or binary frames on request). Both go straight
//! from this replica to the pool's adapter (no bus hop) and count as activity; an idle sandbox
//! is woken first.
//!
//! Streaming: the adapter writes `ExecEvent`s into a bounded channel (`STREAM_BUFFER`
//! chunks of at most 64 KiB); the body takes events as hyper can write them, so a slow reader
//! fills the channel and the command blocks on its pipe: memory stays bounded whatever the
//! output size. Each body chunk (one HTTP chunk on the wire) carries the event that woke the
//! body plus whatever further output is already queued, up to `COALESCE_LIMIT` bytes: a
//! command writing 4 KiB at a time reaches the client in pieces as large as the client's own
//! pace allows, and a single line is still sent the moment it arrives (the body never waits
//! for more). A client that disconnects drops the body, which closes
//! the channel, which cancels the command on the backend. The only time limit is the request's
//! own `timeoutSeconds` (exit code 124).
//!
//! Two response formats share that run ([`Running`]) and differ only in how an event becomes
//! body bytes. SSE (the default) carries each chunk as a JSON string (UTF-8 text or base64)
//! with `: ping` comments every `HEARTBEAT`. `Accept: application/vnd.differently.exec-stream`
//! selects length-prefixed binary frames ([`frames`]): raw bytes with no escaping on either
//! side, for clients that want throughput or exact bytes; heartbeat frames replace the pings.
//!
//! Collected exec uses the streaming path when the pool has `exec.stream`, so output is
//! binary-safe (`outputEncoding: "base64"`) and capped at `OUTPUT_CAP_BYTES` per stream with
//! `stdoutTruncated`/`stderrTruncated` set (the command still runs to completion). Without
//! `exec.stream` the adapter's own exec is used, and base64 output is refused (501) rather than
//! faked from lossy text.
//!
//! Both handlers take the data plane's one walk ([`crate::data_plane::DataCall`]): the record
//! staged while the adapter prepares the command, the command let go once it is staged, and
//! no answer before the record is durable.
//!
//! One module per concern: the handlers (`collected`, `stream`), the run both formats read
//! (`running`), their renderings (`sse_body`, `frame_body`, with the frame codec in `frames`)
//! and text decoding (`text`).

#[cfg(test)]
mod body_tests;
mod collected;
mod frame_body;
pub mod frames;
mod running;
pub(crate) use running::{Ending, ExitEvent, Running, StreamErrorEvent};
mod sse_body;
mod stream;
pub(crate) use frame_body::wants_frames;
pub(crate) use stream::respond;
mod text;

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::routing::post;
use axum::Router;
use base64::Engine;
use differently_core::exec::ExecRequest;
use differently_core::ErrorCode;

use crate::error::{ApiError, ApiResult};
use crate::requests::body::parse_json_allowing_nul;
use crate::AppState;

/// Output kept per stream by collected exec.
pub use differently_core::exec::OUTPUT_CAP_BYTES;
/// Chunks buffered between the adapter and the response body.
pub const STREAM_BUFFER: usize = 8;
/// Longest a streamed exec's answer waits for its command's first output or end before the
/// head (200) goes out: a command the backend refuses before it starts (a `cwd` that does
/// not exist) is answered with the usual JSON error within it, as buffered exec answers it;
/// one that fails later ends its stream with an `error` event. Only a command quiet for this
/// long has its head wait for it.
pub const START_WINDOW: std::time::Duration = std::time::Duration::from_millis(250);
/// Output bytes past which a body chunk stops taking in further queued events (one more
/// event of at most 64 KiB may still join it).
pub const COALESCE_LIMIT: usize = 256 * 1024;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/sandboxes/{id}/exec", post(collected::exec))
        .route("/v1/sandboxes/{id}/exec/stream", post(stream::exec_stream))
}

/// An exec body as both exec handlers read it (strict JSON, NUL allowed only in `stdin`,
/// the request's own checks, `stdinBase64` decodable); public for the fuzzers.
pub fn parse_exec(body: &Bytes) -> ApiResult<ExecRequest> {
    let req: ExecRequest = parse_json_allowing_nul(body, &["stdin"])?;
    req.validate()
        .map_err(|e| ApiError::field(ErrorCode::ValidationFailed, e))?;
    if let Some(b) = &req.stdin_base64 {
        if base64::engine::general_purpose::STANDARD.decode(b).is_err() {
            return Err(ApiError::field(
                ErrorCode::ValidationFailed,
                differently_core::FieldError::new("stdinBase64", "is not valid base64"),
            ));
        }
    }
    Ok(req)
}

/// `req` with the sandbox's base env under its own (a warm sandbox's env; see
/// [`crate::data_plane::running_rows::call_env_of`]); borrowed as is when there is none.
pub(super) fn with_base_env<'r>(
    req: &'r ExecRequest,
    base: &BTreeMap<String, String>,
) -> std::borrow::Cow<'r, ExecRequest> {
    if base.is_empty() {
        return std::borrow::Cow::Borrowed(req);
    }
    let mut with = req.clone();
    with.env = crate::data_plane::running_rows::merged_env(base, req.env.clone());
    std::borrow::Cow::Owned(with)
}

/// [`with_base_env`] for a request shared with the stream's task.
pub(super) fn with_base_env_shared(
    req: &std::sync::Arc<ExecRequest>,
    base: &BTreeMap<String, String>,
) -> std::sync::Arc<ExecRequest> {
    match with_base_env(req, base) {
        std::borrow::Cow::Borrowed(_) => req.clone(),
        std::borrow::Cow::Owned(with) => std::sync::Arc::new(with),
    }
}
