//! `sandbox_exec`: the command through `/v1` exec, buffered or (with a progress token)
//! streamed, its output kept as `/v1` keeps it and cut to what one result carries.

use super::*;

/// Output of one stream, kept up to [`MAX_OUTPUT_BYTES`].
#[derive(Default)]
pub(super) struct Kept {
    bytes: Vec<u8>,
    truncated: bool,
}

impl Kept {
    pub(super) fn len(&self) -> usize {
        self.bytes.len()
    }

    pub(super) fn push(&mut self, b: &[u8]) {
        let room = MAX_OUTPUT_BYTES.saturating_sub(self.bytes.len());
        if b.len() > room {
            self.truncated = true;
        }
        self.bytes.extend_from_slice(&b[..b.len().min(room)]);
    }

    pub(super) fn render(&self, base64: bool) -> String {
        if base64 {
            base64::engine::general_purpose::STANDARD.encode(&self.bytes)
        } else {
            String::from_utf8_lossy(&self.bytes).into_owned()
        }
    }
}

/// `sandbox_exec`: `/v1` exec (buffered) — or, when the caller asked for progress,
/// `/v1` exec/stream, each chunk of output sent as a progress notification as it arrives.
pub(super) async fn exec(
    v1: &dyn V1,
    logs: &CommandLogs,
    mut args: Map<String, Value>,
    progress: Option<Progress>,
) -> ToolResult {
    let id = sandbox_id(&args)?;
    let raw_id = string(&args, "sandboxId")?.to_owned();
    args.remove("sandboxId");
    let program = args
        .get("command")
        .and_then(|c| c.get(0))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let base64 = args.get("outputEncoding").and_then(Value::as_str) == Some("base64");
    let body = Value::Object(args);
    let result = match progress {
        None => {
            get_json_capped(
                v1,
                V1Request::json(Method::POST, format!("/v1/sandboxes/{id}/exec"), &body),
                MAX_EXEC_ANSWER_BYTES,
            )
            .await?
        }
        Some(p) => {
            let req = V1Request::json(
                Method::POST,
                format!("/v1/sandboxes/{id}/exec/stream"),
                &body,
            )
            .header(header::ACCEPT, HeaderValue::from_static(MEDIA_TYPE));
            let resp = call_streamed(v1, req).await?;
            stream_exec(resp.body, &p, base64).await?
        }
    };
    // The log keeps each stream's tail of what /v1 kept, before the result leaves any out.
    logs.record(&raw_id, LogEntry::new(program.unwrap_or_default(), &result));
    Ok(output::result(&result, base64))
}

async fn stream_exec(
    mut body: futures::stream::BoxStream<'static, Result<Bytes, String>>,
    p: &Progress,
    base64: bool,
) -> ToolResult {
    let mut dec = FrameDecoder::default();
    let (mut out, mut err) = (Kept::default(), Kept::default());
    let mut live = ProgressText::default();
    let mut end: Option<(FrameType, Bytes)> = None;
    let mut ready = None;
    loop {
        let next = match ready.take() {
            Some(next) => next,
            None => body.next().await,
        };
        let Some(chunk) = next else { break };
        let chunk = chunk.map_err(ToolError::transport)?;
        let frames = dec
            .push(&chunk)
            .map_err(|e| ToolError::new("internal", format!("exec stream: {e}")))?;
        for f in frames {
            match f.kind {
                FrameType::Stdout => {
                    out.push(&f.payload);
                    live.push(0, &f.payload, p);
                }
                FrameType::Stderr => {
                    err.push(&f.payload);
                    live.push(1, &f.payload, p);
                }
                FrameType::Exit | FrameType::Error => end = Some((f.kind, f.payload)),
                FrameType::Heartbeat => {}
            }
        }
        // Output already waiting joins this notification (up to its 16 KiB), so a fast
        // command makes few full notifications rather than one per chunk; a slow one's
        // output is sent as soon as it arrives.
        match body.next().now_or_never() {
            Some(next) => ready = Some(next),
            None => live.flush(p),
        }
    }
    live.finish(p);
    let parse = |b: &Bytes| serde_json::from_slice::<Value>(b).unwrap_or(Value::Null);
    match end {
        Some((FrameType::Exit, payload)) => {
            let exit = parse(&payload);
            Ok(json!({
                "exitCode": exit["exitCode"],
                "durationMs": exit["durationMs"],
                "stdout": out.render(base64),
                "stderr": err.render(base64),
                "stdoutTruncated": out.truncated,
                "stderrTruncated": err.truncated,
            }))
        }
        Some((_, payload)) => {
            let e = parse(&payload);
            Err(ToolError::new(
                e["code"].as_str().unwrap_or("internal"),
                e["message"].as_str().unwrap_or("the command failed"),
            ))
        }
        None => Err(ToolError::new(
            "provider_unavailable",
            "the command's output stream ended without an exit code",
        )),
    }
}

/// Output on its way to progress notifications: every byte, in order, as text, at most
/// [`MAX_PROGRESS_MESSAGE`] bytes of output per notification (a larger piece is split, not
/// cut), a character split between two frames of a stream kept whole.
#[derive(Default)]
struct ProgressText {
    /// Per stream (stdout, stderr): the start of a character the next frame completes.
    held: [Vec<u8>; 2],
    message: String,
    /// Output bytes in `message`.
    in_message: usize,
    /// Output bytes sent or in `message`: the notification's `progress`.
    bytes: u64,
}

impl ProgressText {
    fn push(&mut self, stream: usize, payload: &[u8], p: &Progress) {
        let mut data = std::mem::take(&mut self.held[stream]);
        data.extend_from_slice(payload);
        let ready = data.len() - incomplete_tail(&data);
        let mut rest = &data[..ready];
        while !rest.is_empty() {
            let room = MAX_PROGRESS_MESSAGE - self.in_message;
            let mut cut = rest.len().min(room);
            if cut < rest.len() {
                // Back to the start of the character the cut falls in.
                let start = (cut.saturating_sub(3)..=cut)
                    .rev()
                    .find(|i| rest[*i] & 0xc0 != 0x80)
                    .unwrap_or(cut);
                if start == 0 && self.in_message > 0 {
                    self.flush(p);
                    continue;
                }
                if start > 0 {
                    cut = start;
                }
            }
            self.add(&rest[..cut]);
            rest = &rest[cut..];
            if self.in_message >= MAX_PROGRESS_MESSAGE {
                self.flush(p);
            }
        }
        self.held[stream] = data[ready..].to_vec();
    }

    fn add(&mut self, bytes: &[u8]) {
        self.message.push_str(&String::from_utf8_lossy(bytes));
        self.in_message += bytes.len();
        self.bytes += bytes.len() as u64;
    }

    /// Sends what is waiting, if anything.
    fn flush(&mut self, p: &Progress) {
        if !self.message.is_empty() {
            p.send(self.bytes, std::mem::take(&mut self.message));
        }
        self.in_message = 0;
    }

    /// Sends the rest, an unfinished character included (as U+FFFD), at the end.
    fn finish(&mut self, p: &Progress) {
        for stream in 0..2 {
            let held = std::mem::take(&mut self.held[stream]);
            if !held.is_empty() {
                if self.in_message + held.len() > MAX_PROGRESS_MESSAGE {
                    self.flush(p);
                }
                self.add(&held);
            }
        }
        self.flush(p);
    }
}

/// How many bytes at the end of `b` start a UTF-8 character that is not complete there.
fn incomplete_tail(b: &[u8]) -> usize {
    for back in 1..=b.len().min(3) {
        let byte = b[b.len() - back];
        if byte & 0xc0 == 0x80 {
            continue;
        }
        let need = match byte {
            0xc0..=0xdf => 2,
            0xe0..=0xef => 3,
            0xf0..=0xf7 => 4,
            _ => 1,
        };
        return if back < need { back } else { 0 };
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(rx: &mut tokio::sync::mpsc::Receiver<Value>) -> Vec<(u64, String)> {
        let mut got = Vec::new();
        while let Ok(m) = rx.try_recv() {
            let params = &m["params"];
            got.push((
                params["progress"].as_u64().expect("progress"),
                params["message"].as_str().expect("message").to_owned(),
            ));
        }
        got
    }

    #[test]
    fn progress_carries_every_byte_in_order_in_pieces_of_at_most_16_kib() {
        let (out, mut rx) = Notifier::channel();
        let p = Progress {
            token: json!("t"),
            out,
        };
        let mut live = ProgressText::default();
        let text = "☃".repeat(10_000) + &"a".repeat(40_000);
        let b = text.as_bytes();
        // A character split between frames, a frame far over 16 KiB, stderr in between.
        live.push(0, &b[..1], &p);
        live.push(0, &b[1..50_001], &p);
        live.flush(&p);
        live.push(1, b"err", &p);
        live.push(0, &b[50_001..], &p);
        live.finish(&p);
        let got = messages(&mut rx);
        let all: String = got.iter().map(|(_, m)| m.as_str()).collect();
        assert_eq!(all.replacen("err", "", 1), text, "every byte, none mangled");
        assert!(got.iter().all(|(_, m)| m.len() <= MAX_PROGRESS_MESSAGE));
        assert!(
            got.windows(2).all(|w| w[0].0 < w[1].0),
            "progress increases"
        );
        assert_eq!(got.last().map(|g| g.0), Some(b.len() as u64 + 3));
    }

    /// A `/v1` that answers 200 with `len` bytes.
    struct Answers(usize);

    impl V1 for Answers {
        fn call(
            &self,
            _: V1Request,
        ) -> futures::future::BoxFuture<'static, Result<super::super::super::V1Response, String>>
        {
            let body = Bytes::from(vec![b' '; self.0]);
            Box::pin(async move {
                Ok(super::super::super::V1Response {
                    status: StatusCode::OK,
                    headers: Default::default(),
                    body: futures::stream::iter([Ok(body)]).boxed(),
                })
            })
        }
    }

    #[tokio::test]
    async fn an_answer_over_the_cap_is_an_internal_error_not_an_outage() {
        let req = V1Request::new(Method::POST, "/v1/sandboxes/sbx_x/exec");
        let e = get_json_capped(&Answers(101), req, 100)
            .await
            .expect_err("over the cap");
        assert_eq!(e.code, "internal", "{e:?}");
        assert_eq!(
            e.message,
            "the answer of POST /v1/sandboxes/sbx_x/exec is longer than the 100 bytes the MCP \
             server reads of it (an internal limit)"
        );
    }

    #[test]
    fn the_exec_answer_cap_holds_the_worst_answer_the_limits_allow() {
        let worst = differently_core::exec::ExecResult {
            exit_code: i32::MIN,
            stdout: "\u{1}".repeat(MAX_OUTPUT_BYTES),
            stderr: "\u{1f}".repeat(MAX_OUTPUT_BYTES),
            stdout_truncated: true,
            stderr_truncated: true,
            duration_ms: u64::MAX,
        };
        let len = serde_json::to_vec(&worst).expect("JSON").len();
        assert!(len <= MAX_EXEC_ANSWER_BYTES, "{len}");
        assert!(
            MAX_EXEC_ANSWER_BYTES - len <= EXEC_ANSWER_OVERHEAD,
            "sized from the worst case, not far above it"
        );
    }

    #[test]
    fn a_progress_notification_of_the_worst_output_fits_an_sse_event_with_room() {
        for byte in [0x01u8, 0xff, b'"'] {
            let (out, mut rx) = Notifier::channel();
            let p = Progress {
                token: json!("a-progress-token"),
                out,
            };
            let mut live = ProgressText::default();
            live.push(0, &vec![byte; 3 * MAX_PROGRESS_MESSAGE], &p);
            live.finish(&p);
            while let Ok(m) = rx.try_recv() {
                let event = format!("event: message\ndata: {m}\n\n");
                assert!(event.len() < 128 * 1024, "{byte:#x}: {}", event.len());
            }
        }
    }
}
