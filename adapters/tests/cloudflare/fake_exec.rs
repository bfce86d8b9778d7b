//! The fake bridge's `/exec`: a command really run on the test host, its output streamed as
//! the bridge streams it (Server-Sent Events, one `stdout`/`stderr` event per chunk with the
//! chunk base64-encoded, then `exit` with `{"exit_code": N}`, or a terminal `error`).
//!
//! As in the real container, output reaches the bridge as text: the container's process
//! service decodes each stream as UTF-8 (a decoder that keeps a split character for the next
//! chunk, and replaces invalid bytes with U+FFFD), and the bridge base64-encodes that text's
//! UTF-8 bytes. The command string is the bridge's own: every argv element shell-quoted
//! (`shellQuote`, with `$'…'` for anything unsafe) and joined with spaces, run by bash.
//! `timeout_ms` is not applied: the container's streaming execute handler does not pass it on.

use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use base64::Engine;
use bytes::Bytes;
use serde_json::json;
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;

/// The bridge's `shellQuote`: safe tokens as they are, anything else in ANSI-C quotes.
pub fn shell_quote(arg: &str) -> String {
    let safe = !arg.is_empty()
        && arg
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"@%+=:,./-".contains(&b));
    if safe {
        return arg.to_owned();
    }
    let escaped = arg
        .replace('\\', "\\\\")
        .replace('\'', "\\'")
        .replace('\n', "\\n")
        .replace('\r', "\\r")
        .replace('\t', "\\t");
    format!("$'{escaped}'")
}

/// A streaming UTF-8 decoder: complete characters out, a split one kept for the next chunk.
#[derive(Default)]
struct Utf8Stream {
    carry: Vec<u8>,
}

impl Utf8Stream {
    fn push(&mut self, chunk: &[u8]) -> String {
        let mut bytes = std::mem::take(&mut self.carry);
        bytes.extend_from_slice(chunk);
        let mut out = String::new();
        let mut rest: &[u8] = &bytes;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    break;
                }
                Err(e) => {
                    let (good, bad) = rest.split_at(e.valid_up_to());
                    out.push_str(std::str::from_utf8(good).unwrap_or_default());
                    match e.error_len() {
                        Some(n) => {
                            out.push('\u{FFFD}');
                            rest = &bad[n..];
                        }
                        None => {
                            self.carry = bad.to_vec();
                            break;
                        }
                    }
                }
            }
        }
        out
    }

    fn finish(&mut self) -> String {
        if self.carry.is_empty() {
            String::new()
        } else {
            self.carry.clear();
            "\u{FFFD}".to_owned()
        }
    }
}

/// One SSE event as the bridge's `writeSSE` frames it.
fn sse(event: &str, data: &str) -> Bytes {
    let payload: Vec<String> = data.split('\n').map(|l| format!("data: {l}")).collect();
    Bytes::from(format!("event: {event}\n{}\n\n", payload.join("\n")))
}

/// How a run is set up.
pub struct Run {
    pub argv: Vec<String>,
    /// The host directory the command starts in (the container path, resolved).
    pub dir: std::path::PathBuf,
    /// Commands of this container still running.
    pub running: Arc<AtomicUsize>,
    /// Process group ids of this container's commands, so a destroy can kill them.
    pub groups: Arc<std::sync::Mutex<Vec<i32>>>,
    /// End the stream after this many events, without `exit` (a cut connection).
    pub cut_after: Option<usize>,
}

/// The SSE answer of `run`; the command goes on to its end even if the client goes away
/// (the real bridge does not cancel the SDK's exec when its stream is dropped).
pub fn stream(run: Run) -> Response {
    let command = run
        .argv
        .iter()
        .map(|a| shell_quote(a))
        .collect::<Vec<_>>()
        .join(" ");
    let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
    tokio::spawn(drive(run, command, tx));
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<Bytes, std::io::Error>(b), rx))
    });
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(Body::from_stream(body))
        .unwrap_or_default()
}

async fn drive(run: Run, command: String, tx: mpsc::UnboundedSender<Bytes>) {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut child = match tokio::process::Command::new("bash")
        .arg("-c")
        .arg(&command)
        .current_dir(&run.dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            let _ = tx.send(sse(
                "error",
                &json!({"error": format!("exec failed: {e}"), "code": "exec_transport_error"})
                    .to_string(),
            ));
            return;
        }
    };
    run.running.fetch_add(1, Ordering::SeqCst);
    if let Some(pid) = child.id() {
        crate::support::http::lock(&run.groups).push(pid as i32);
    }
    let (Some(mut out), Some(mut err)) = (child.stdout.take(), child.stderr.take()) else {
        run.running.fetch_sub(1, Ordering::SeqCst);
        return;
    };
    let (mut dec_out, mut dec_err) = (Utf8Stream::default(), Utf8Stream::default());
    let (mut buf_out, mut buf_err) = (vec![0u8; 8192], vec![0u8; 8192]);
    let (mut out_open, mut err_open) = (true, true);
    let mut sent = 0usize;
    let mut cut = false;
    let send = |event: &str, text: String, sent: &mut usize, cut: &mut bool| {
        if text.is_empty() || *cut {
            return;
        }
        let _ = tx.send(sse(event, &b64.encode(text.as_bytes())));
        *sent += 1;
        if run.cut_after.is_some_and(|n| *sent >= n) {
            *cut = true;
        }
    };
    while out_open || err_open {
        tokio::select! {
            n = out.read(&mut buf_out), if out_open => match n {
                Ok(0) | Err(_) => {
                    out_open = false;
                    let t = dec_out.finish();
                    send("stdout", t, &mut sent, &mut cut);
                }
                Ok(n) => {
                    let t = dec_out.push(&buf_out[..n]);
                    send("stdout", t, &mut sent, &mut cut);
                }
            },
            n = err.read(&mut buf_err), if err_open => match n {
                Ok(0) | Err(_) => {
                    err_open = false;
                    let t = dec_err.finish();
                    send("stderr", t, &mut sent, &mut cut);
                }
                Ok(n) => {
                    let t = dec_err.push(&buf_err[..n]);
                    send("stderr", t, &mut sent, &mut cut);
                }
            },
        }
    }
    let status = child.wait().await;
    run.running.fetch_sub(1, Ordering::SeqCst);
    if cut {
        return;
    }
    use std::os::unix::process::ExitStatusExt;
    let code = match status {
        Ok(s) => s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0)),
        Err(e) => {
            let _ = tx.send(sse(
                "error",
                &json!({"error": e.to_string(), "code": "exec_error"}).to_string(),
            ));
            return;
        }
    };
    let _ = tx.send(sse("exit", &json!({"exit_code": code}).to_string()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_character_waits_for_its_end_and_bad_bytes_are_replaced() {
        let mut d = Utf8Stream::default();
        let euro = "€".as_bytes();
        assert_eq!(d.push(&euro[..1]), "");
        assert_eq!(d.push(&euro[1..]), "€");
        assert_eq!(d.push(b"a\xffb"), "a\u{FFFD}b");
        assert_eq!(d.push(&euro[..2]), "");
        assert_eq!(d.finish(), "\u{FFFD}");
        assert_eq!(shell_quote("a b"), "$'a b'");
        assert_eq!(shell_quote("it's\n"), "$'it\\'s\\n'");
        assert_eq!(shell_quote("/x-y"), "/x-y");
    }
}
