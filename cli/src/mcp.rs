//! `differently mcp`: the MCP server over stdio, for agent hosts that start a local process.
//! The engine is the API's own (`differently_api::mcp`); here every tool call goes to the
//! API over HTTP through `differently-client` with the configured key (`DIFFERENTLY_URL`,
//! `DIFFERENTLY_API_KEY`, or a profile), so it is the same `/v1` call as `/mcp` makes in process.
//!
//! Messages are newline-delimited JSON-RPC on stdin and stdout; nothing else is written to
//! stdout. Requests run concurrently, so `notifications/cancelled` can stop one that runs.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use differently_api::mcp::{
    decode, CommandLogs, Message, Notifier, Server, Subscriptions, V1Request, V1Response, V1,
};
use differently_client::Client;
use futures::future::BoxFuture;
use serde_json::Value;
use std::io::{BufRead, Read, Write};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use crate::client::{self, Target};

/// Longest message read from stdin (a `files_write` of 1 MiB in base64 fits).
const MAX_LINE: usize = 4 * 1024 * 1024;

/// `/v1` over HTTP with the configured key.
struct Remote(Client);

impl V1 for Remote {
    fn call(&self, req: V1Request) -> BoxFuture<'static, Result<V1Response, String>> {
        let mut rb = self.0.authorized(req.method, &req.path);
        for (k, v) in req.headers {
            rb = rb.header(k, v);
        }
        let rb = rb.body(req.body);
        Box::pin(async move {
            let resp = rb.send().await.map_err(|e| e.to_string())?;
            let status = resp.status();
            let headers = resp.headers().clone();
            let body = futures::stream::unfold(Some(resp), |resp| async move {
                let mut resp = resp?;
                match resp.chunk().await {
                    Ok(Some(c)) => Some((Ok(c), Some(resp))),
                    Ok(None) => None,
                    Err(e) => Some((Err(e.to_string()), None)),
                }
            });
            Ok(V1Response {
                status,
                headers,
                body: Box::pin(body),
            })
        })
    }
}

/// Serves MCP on stdin/stdout until stdin ends.
pub async fn run(target: &Target) -> ExitCode {
    let api = match target.client() {
        Ok(c) => c,
        Err(e) => return client::fail(&e),
    };
    let server = Server::new(Arc::new(Remote(api)), Arc::new(CommandLogs::default()));
    let (out, mut outgoing) = Notifier::channel();
    // Plain threads for stdin and stdout: blocking reads and writes of the process's own
    // streams, kept off the runtime.
    let writer = std::thread::spawn(move || {
        let mut stdout = std::io::stdout().lock();
        while let Some(m) = outgoing.blocking_recv() {
            let mut line = m.to_string().into_bytes();
            line.push(b'\n');
            if stdout.write_all(&line).is_err() || stdout.flush().is_err() {
                return;
            }
        }
    });
    let (lines_tx, mut lines) = mpsc::channel::<Result<Vec<u8>, usize>>(16);
    std::thread::spawn(move || read_lines(lines_tx));
    let subs = Subscriptions::new(out.clone());
    let inflight: Arc<Mutex<HashMap<String, AbortHandle>>> = Arc::default();
    while let Some(line) = lines.recv().await {
        let line = match line {
            Ok(l) => l,
            Err(len) => {
                out.respond(
                    differently_api::mcp::RpcError::new(
                        differently_api::mcp::code::INVALID_REQUEST,
                        format!("a message of {len}+ bytes; at most {MAX_LINE} are read"),
                    )
                    .response(Value::Null),
                )
                .await;
                continue;
            }
        };
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match decode(&line) {
            Err(e) => {
                out.respond(e).await;
            }
            Ok(Message::Response) => {}
            Ok(Message::Notification { method, params }) => {
                if method == "notifications/cancelled" {
                    if let Some(rid) = params.get("requestId") {
                        let h = inflight
                            .lock()
                            .ok()
                            .and_then(|mut m| m.remove(&rid.to_string()));
                        if let Some(h) = h {
                            h.abort();
                        }
                    }
                }
            }
            Ok(Message::Request { id, method, params }) => {
                let key = id.to_string();
                let (server, out, subs, inflight2) =
                    (server.clone(), out.clone(), subs.clone(), inflight.clone());
                let done_key = key.clone();
                // Registered before it can finish, so its own removal never races the insert.
                let mut map = inflight.lock().unwrap_or_else(|p| p.into_inner());
                let task = tokio::spawn(async move {
                    let resp = server.request(id, &method, params, &out, &subs).await;
                    // A request cancelled meanwhile gets no response (the spec's rule).
                    let still = inflight2
                        .lock()
                        .map(|mut m| m.remove(&done_key).is_some())
                        .unwrap_or(true);
                    if still {
                        out.respond(resp).await;
                    }
                });
                map.insert(key, task.abort_handle());
            }
        }
    }
    subs.clear();
    drop(subs);
    drop(out);
    drop(server);
    // Requests still running are answered before exiting only if stdout is still read;
    // the host closed stdin, so they are cut short.
    for (_, h) in inflight
        .lock()
        .map(|mut m| std::mem::take(&mut *m))
        .unwrap_or_default()
    {
        h.abort();
    }
    let _ = tokio::task::spawn_blocking(move || writer.join()).await;
    ExitCode::SUCCESS
}

/// Reads stdin a line at a time (`Err(len)` for a line over [`MAX_LINE`], whose rest is
/// skipped) until it ends or the server stops listening.
fn read_lines(tx: mpsc::Sender<Result<Vec<u8>, usize>>) {
    let mut stdin = std::io::stdin().lock();
    loop {
        let mut line = Vec::new();
        match (&mut stdin)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
        {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) => {
                eprintln!("differently mcp: reading stdin: {e}");
                return;
            }
        }
        let item = if line.len() > MAX_LINE && line.last() != Some(&b'\n') {
            let len = line.len();
            let mut rest = Vec::new();
            loop {
                rest.clear();
                match (&mut stdin).take(64 * 1024).read_until(b'\n', &mut rest) {
                    Ok(0) | Err(_) => break,
                    Ok(_) if rest.last() == Some(&b'\n') => break,
                    Ok(_) => {}
                }
            }
            Err(len)
        } else {
            Ok(line)
        };
        if tx.blocking_send(item).is_err() {
            return;
        }
    }
}
