//! The fake envd's process service: commands started for real (`bash -c` on the test host),
//! their output sent in Connect frames as it comes, stdin, signals and timeouts.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use bytes::Bytes;
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;

use crate::support::http::{lock, Req};

use super::{connect_err, Inner, Proc, Sbx, B64};

/// One response envelope.
fn frame(flag: u8, v: &Value) -> Bytes {
    let body = v.to_string().into_bytes();
    let mut out = Vec::with_capacity(body.len() + 5);
    out.push(flag);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    Bytes::from(out)
}
pub(super) fn start(inner: &Arc<Inner>, sbx: &Sbx, r: &Req) -> Response {
    if r.header("content-type") != Some("application/connect+json") {
        return connect_err(415, "unknown", "unsupported content type");
    }
    if r.body.len() < 5 {
        return connect_err(400, "invalid_argument", "missing envelope");
    }
    let msg: Value = serde_json::from_slice(&r.body[5..]).unwrap_or(Value::Null);
    lock(&inner.record).start_bodies.push(msg.clone());
    let deadline = r
        .header("connect-timeout-ms")
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_millis);
    let (stall, keepalive, truncate) = {
        let k = lock(&inner.knobs);
        (k.stall_ms, k.keepalive_ms, k.truncate_after_frames)
    };
    let process = &msg["process"];
    let cmd = process["cmd"].as_str().unwrap_or_default().to_owned();
    let args: Vec<String> = serde_json::from_value(process["args"].clone()).unwrap_or_default();
    let envs: BTreeMap<String, String> =
        serde_json::from_value(process["envs"].clone()).unwrap_or_default();
    let cwd = process["cwd"].as_str().map(str::to_owned);
    let want_stdin = msg["stdin"].as_bool().unwrap_or(true);

    let (tx, mut rx) = mpsc::channel::<Bytes>(16);
    let inner = inner.clone();
    let env = sbx.env.clone();
    tokio::spawn(async move {
        let end_stream = |v: Value| frame(0x02, &v);
        if stall > 0 {
            tokio::time::sleep(Duration::from_millis(stall)).await;
        }
        if let Some(dir) = &cwd {
            if !std::path::Path::new(dir).is_dir() {
                let _ = tx
                    .send(end_stream(json!({"error": {"code": "invalid_argument", "message": format!("cwd '{dir}' does not exist")}})))
                    .await;
                return;
            }
        }
        let mut c = tokio::process::Command::new(&cmd);
        c.args(&args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", std::env::var("HOME").unwrap_or_default())
            .envs(&env)
            .envs(&envs)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .stdin(if want_stdin {
                std::process::Stdio::piped()
            } else {
                std::process::Stdio::null()
            })
            .kill_on_drop(true);
        if let Some(dir) = &cwd {
            c.current_dir(dir);
        }
        let mut child = match c.spawn() {
            Ok(ch) => ch,
            Err(e) => {
                let _ = tx
                    .send(end_stream(json!({"error": {"code": "internal", "message": format!("error starting process '{cmd}': {e}")}})))
                    .await;
                return;
            }
        };
        let pid = child.id().unwrap_or(0);
        let (kill_tx, mut kill_rx) = tokio::sync::oneshot::channel();
        lock(&inner.procs).insert(
            pid,
            Proc {
                stdin: child.stdin.take(),
                kill: Some(kill_tx),
                line: std::iter::once(cmd.as_str())
                    .chain(args.iter().map(String::as_str))
                    .collect::<Vec<_>>()
                    .join(" "),
            },
        );
        let mut sent = 0usize;
        let mut send = |b: Bytes| {
            sent += 1;
            let tx = tx.clone();
            let cut = truncate.is_some_and(|n| sent > n);
            async move {
                if cut {
                    false
                } else {
                    tx.send(b).await.is_ok()
                }
            }
        };
        let mut ok = send(frame(0, &json!({"event": {"start": {"pid": pid}}}))).await;
        let mut out = child.stdout.take().unwrap();
        let mut errp = child.stderr.take().unwrap();
        let (mut obuf, mut ebuf) = (vec![0u8; 8192], vec![0u8; 8192]);
        let (mut o_open, mut e_open) = (true, true);
        let started = tokio::time::Instant::now();
        let mut ka = tokio::time::interval(Duration::from_millis(keepalive.max(1)));
        ka.tick().await;
        let mut deadline_hit = false;
        let mut killed = false;
        while ok && (o_open || e_open) {
            let left = deadline.map(|d| d.saturating_sub(started.elapsed()));
            tokio::select! {
                n = out.read(&mut obuf), if o_open => match n {
                    Ok(0) | Err(_) => o_open = false,
                    Ok(n) => ok = send(frame(0, &json!({"event": {"data": {"stdout": B64.encode(&obuf[..n])}}}))).await,
                },
                n = errp.read(&mut ebuf), if e_open => match n {
                    Ok(0) | Err(_) => e_open = false,
                    Ok(n) => ok = send(frame(0, &json!({"event": {"data": {"stderr": B64.encode(&ebuf[..n])}}}))).await,
                },
                _ = ka.tick() => ok = send(frame(0, &json!({"event": {"keepalive": {}}}))).await,
                _ = &mut kill_rx, if !killed => {
                    killed = true;
                    let _ = child.start_kill();
                }
                _ = tokio::time::sleep(left.unwrap_or(Duration::from_secs(3600))), if left.is_some() => {
                    deadline_hit = true;
                    let _ = child.start_kill();
                    break;
                }
            }
        }
        if !ok || deadline_hit {
            // The client went away (or its deadline passed): envd's context ends the process.
            let _ = child.start_kill();
            let _ = child.wait().await;
            lock(&inner.procs).remove(&pid);
            lock(&inner.record).cancelled += 1;
            if deadline_hit {
                let _ = tx
                    .send(end_stream(json!({"error": {"code": "deadline_exceeded", "message": "context deadline exceeded"}})))
                    .await;
            }
            return;
        }
        let status = child.wait().await;
        lock(&inner.procs).remove(&pid);
        let end = match status {
            Ok(s) => {
                use std::os::unix::process::ExitStatusExt;
                match (s.code(), s.signal()) {
                    (Some(0), _) => json!({"exited": true, "status": "exit status 0"}),
                    (Some(c), _) => {
                        json!({"exitCode": c, "exited": true, "status": format!("exit status {c}")})
                    }
                    (None, Some(9)) => json!({"exitCode": -1, "status": "signal: killed"}),
                    (None, Some(15)) => json!({"exitCode": -1, "status": "signal: terminated"}),
                    (None, sig) => {
                        json!({"exitCode": -1, "status": format!("signal: {}", sig.unwrap_or(0))})
                    }
                }
            }
            Err(e) => json!({"exitCode": -1, "status": "error", "error": e.to_string()}),
        };
        if send(frame(0, &json!({"event": {"end": end}}))).await {
            let _ = send(end_stream(json!({}))).await;
        }
    });
    let stream = futures::stream::poll_fn(move |cx| {
        rx.poll_recv(cx).map(|o| o.map(Ok::<_, std::io::Error>))
    });
    (
        StatusCode::OK,
        [("content-type", "application/connect+json")],
        Body::from_stream(stream),
    )
        .into_response()
}
