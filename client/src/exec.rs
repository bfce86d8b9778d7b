//! Commands in a sandbox: buffered (`POST …/exec`, output in the answer) or streamed
//! (`POST …/exec/stream`, output as it is written) in either format the API serves — SSE
//! (the default, JSON strings) or binary frames (binary-safe and cheaper: the CLI's choice).

use std::collections::VecDeque;

use base64::Engine;
use bytes::Bytes;
use reqwest::{Method, Response};
use serde::Deserialize;

use crate::frames::{FrameDecoder, FrameError, Piece, MEDIA_TYPE};
use crate::sse::SseParser;
use crate::{
    sandbox_path, Client, Error, ExecExit, ExecRequest, ExecResult, Result, StreamError,
    TransportError,
};

/// The format of a streamed exec's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StreamFormat {
    /// Server-sent events (`text/event-stream`).
    Sse,
    /// Binary length-prefixed frames ([`MEDIA_TYPE`]).
    #[default]
    Frames,
}

/// One piece of a streamed exec, in order; `Exit` or `Error` is the last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    /// Bytes the command wrote to stdout.
    Stdout(Bytes),
    /// Bytes it wrote to stderr.
    Stderr(Bytes),
    /// It ended with this code.
    Exit(ExecExit),
    /// The run failed after the stream began (backend lost, say).
    Error(StreamError),
}

impl Client {
    /// `POST …/exec`: runs `req` to its end and answers its output (each stream keeps
    /// 1 MiB; exit code 124 on timeout).
    pub async fn exec(&self, id: &str, req: &ExecRequest) -> Result<ExecResult> {
        check(req)?;
        self.json(Method::POST, &sandbox_path(id, "/exec"), Some(req), &[])
            .await
    }

    /// `POST …/exec/stream`: runs `req`, its output arriving as [`ExecEvent`]s.
    pub async fn exec_stream(
        &self,
        id: &str,
        req: &ExecRequest,
        format: StreamFormat,
    ) -> Result<ExecStream> {
        check(req)?;
        let path = sandbox_path(id, "/exec/stream");
        let accept = accept(format);
        let resp = self
            .call(Method::POST, &path, Some(req), &[("accept", accept)])
            .await?;
        let base64 = req.output_encoding.as_deref() == Some("base64");
        ExecStream::open(
            resp,
            format,
            format!("POST {path}"),
            self.base_url(),
            base64,
            false,
        )
    }
}

/// The `Accept` that asks for `format`.
pub(crate) fn accept(format: StreamFormat) -> &'static str {
    match format {
        StreamFormat::Sse => "text/event-stream",
        StreamFormat::Frames => MEDIA_TYPE,
    }
}

fn check(req: &ExecRequest) -> Result<()> {
    match req.command.first() {
        None => Err(Error::invalid("command", "is empty: name a program to run")),
        Some(p) if p.is_empty() => Err(Error::invalid("command[0]", "the program is empty")),
        Some(_) if req.stdin.is_some() && req.stdin_base64.is_some() => Err(Error::invalid(
            "stdin",
            "give stdin or stdinBase64, not both",
        )),
        Some(_) => Ok(()),
    }
}

enum Decoder {
    Sse { parser: SseParser, base64: bool },
    Frames(FrameDecoder),
}

/// The output of a streamed exec, read with [`next`](ExecStream::next).
pub struct ExecStream {
    resp: Response,
    decoder: Decoder,
    pending: VecDeque<ExecEvent>,
    finished: bool,
    context: String,
    base: String,
    /// The end of the body without an exit or error is a normal end (a process's output
    /// read with `follow=false` while it still runs), not a cut stream.
    open_ended: bool,
    /// The SSE `id:` of the last output event decoded (a process's output offset).
    pub(crate) last_id: Option<u64>,
}

#[derive(Deserialize)]
struct DataEvent {
    data: String,
}

impl ExecStream {
    /// Checks the answer is in `format` and reads it as one; `context` is `METHOD path`.
    pub(crate) fn open(
        resp: Response,
        format: StreamFormat,
        context: String,
        base: &str,
        base64: bool,
        open_ended: bool,
    ) -> Result<ExecStream> {
        let accept = accept(format);
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        if !content_type.starts_with(accept) {
            return Err(Error::protocol(
                context,
                format!("answered Content-Type {content_type:?}, not {accept}"),
            ));
        }
        let decoder = match format {
            StreamFormat::Sse => Decoder::Sse {
                parser: SseParser::default(),
                base64,
            },
            StreamFormat::Frames => Decoder::Frames(FrameDecoder::default()),
        };
        Ok(ExecStream {
            resp,
            decoder,
            pending: VecDeque::new(),
            finished: false,
            context,
            base: base.to_owned(),
            open_ended,
            last_id: None,
        })
    }

    /// The next piece; `None` after the last (`Exit` or `Error`).
    pub async fn next(&mut self) -> Option<Result<ExecEvent>> {
        loop {
            if let Some(ev) = self.pending.pop_front() {
                if matches!(ev, ExecEvent::Exit(_) | ExecEvent::Error(_)) {
                    self.finished = true;
                    self.pending.clear();
                }
                return Some(Ok(ev));
            }
            if self.finished {
                return None;
            }
            let chunk = match self.resp.chunk().await {
                Ok(c) => c,
                Err(e) => {
                    self.finished = true;
                    let url = self.resp.url().to_string();
                    let method = self.context.split(' ').next().unwrap_or("POST");
                    return Some(Err(TransportError::new(method, &url, &self.base, e).into()));
                }
            };
            let Some(chunk) = chunk else {
                self.finished = true;
                let why = match &self.decoder {
                    Decoder::Frames(d) => match d.finish() {
                        Err(FrameError::Unterminated) if self.open_ended => return None,
                        r => r.err().map(|e| e.to_string()),
                    },
                    Decoder::Sse { .. } if self.open_ended => return None,
                    Decoder::Sse { .. } => None,
                }
                .unwrap_or_else(|| "the stream ended without an exit or error".to_owned());
                return Some(Err(Error::protocol(self.context.clone(), why)));
            };
            if let Err(e) = self.decode(chunk) {
                self.finished = true;
                return Some(Err(e));
            }
        }
    }

    fn decode(&mut self, chunk: Bytes) -> Result<()> {
        let context = &self.context;
        let bad = |m: String| Error::protocol(context.clone(), m);
        match &mut self.decoder {
            Decoder::Frames(d) => {
                let mut pieces = Vec::new();
                d.push(chunk, &mut pieces).map_err(|e| bad(e.to_string()))?;
                for p in pieces {
                    self.pending.push_back(match p {
                        Piece::Stdout(b) => ExecEvent::Stdout(b),
                        Piece::Stderr(b) => ExecEvent::Stderr(b),
                        Piece::Exit(j) => ExecEvent::Exit(
                            serde_json::from_slice(&j)
                                .map_err(|e| bad(format!("the exit frame is not ExecExit: {e}")))?,
                        ),
                        Piece::Error(j) => ExecEvent::Error(stream_error(&j).map_err(|e| {
                            bad(format!("the error frame is not StreamError: {e}"))
                        })?),
                    });
                }
            }
            Decoder::Sse { parser, base64 } => {
                for ev in parser.push(&chunk) {
                    let out = match ev.event.as_str() {
                        "stdout" | "stderr" => {
                            let d: DataEvent = serde_json::from_slice(&ev.data).map_err(|e| {
                                bad(format!("a {} event is not {{\"data\": …}}: {e}", ev.event))
                            })?;
                            let bytes = if *base64 {
                                Bytes::from(
                                    base64::engine::general_purpose::STANDARD
                                        .decode(d.data.as_bytes())
                                        .map_err(|e| bad(format!("output is not base64: {e}")))?,
                                )
                            } else {
                                Bytes::from(d.data)
                            };
                            if let Some(id) = ev.id.as_deref().and_then(|i| i.parse().ok()) {
                                self.last_id = Some(id);
                            }
                            if ev.event == "stdout" {
                                ExecEvent::Stdout(bytes)
                            } else {
                                ExecEvent::Stderr(bytes)
                            }
                        }
                        "exit" => ExecEvent::Exit(
                            serde_json::from_slice(&ev.data)
                                .map_err(|e| bad(format!("the exit event is not ExecExit: {e}")))?,
                        ),
                        "error" => ExecEvent::Error(stream_error(&ev.data).map_err(|e| {
                            bad(format!("the error event is not StreamError: {e}"))
                        })?),
                        // A newer server's event kind: skipped, not an error.
                        _ => continue,
                    };
                    self.pending.push_back(out);
                }
            }
        }
        Ok(())
    }
}

/// An error event's body: `{code, message}`, or the same inside the API's error envelope
/// (`{"error": {…}}`), which a failed process's output ends with.
fn stream_error(body: &[u8]) -> std::result::Result<StreamError, serde_json::Error> {
    #[derive(Deserialize)]
    struct Envelope {
        error: StreamError,
    }
    serde_json::from_slice(body).or_else(|e| {
        serde_json::from_slice::<Envelope>(body)
            .map(|env| env.error)
            .map_err(|_| e)
    })
}
