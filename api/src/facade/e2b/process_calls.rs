//! envd's unary `process.Process` calls and the `StreamInput` client stream, over `/v1`'s
//! processes resource (docs/processes.md):
//!
//! | envd | `/v1` |
//! |---|---|
//! | `List` | `GET …/processes?status=running`: `cmd`, `args`, `cwd`, `tag`, `pid`; `envs` is always `{}` (a process's environment is never shown) |
//! | `SendInput` (`stdin` or `pty`) | `POST …/processes/{pid}/stdin` |
//! | `StreamInput` | the same, one call per data message, in order |
//! | `CloseStdin` | `DELETE …/processes/{pid}/stdin` |
//! | `SendSignal` (`SIGNAL_SIGKILL`, `SIGNAL_SIGTERM`) | `POST …/processes/{pid}/signal` (an ended process: `not_found`, as envd) |
//! | `Update` (`pty.size`) | `POST …/processes/{pid}/resize` |
//!
//! A pid of another sandbox or tenant is `not_found`, as `/v1` answers it (so the SDKs'
//! `kill` answers false).

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use base64::Engine;
use bytes::{Buf, BytesMut};
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::facade::opensandbox::inner::read_all;

use super::connect::{self, ConnectError};
use super::envd::{ctx, Ctx, EnvdError};
use super::process::{failed_stream, resolve, selector, stream_response, uri, Pty};
use super::Facade;

/// Largest unary request accepted (base64 input of up to about 3 MiB).
const MAX_REQUEST: usize = 4 << 20;
/// Largest message of an input stream.
const MAX_MESSAGE: usize = 4 << 20;
/// `/v1`'s largest stdin write.
const STDIN_CHUNK: usize = 1 << 20;

/// `POST /process.Process/{method}` for the unary methods.
pub async fn call(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(method): Path<String>,
    body: Body,
) -> Response {
    let c = match ctx(&f, &headers, None) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let streaming = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with(connect::STREAM_CONTENT_TYPE));
    if !matches!(
        method.as_str(),
        "List" | "SendInput" | "CloseStdin" | "SendSignal" | "Update"
    ) {
        let e = ConnectError::new(
            "unimplemented",
            format!("process.Process/{method} is not an envd method"),
        );
        return if streaming {
            failed_stream(&e)
        } else {
            e.into_response()
        };
    }
    let req = match axum::body::to_bytes(body, MAX_REQUEST).await {
        Ok(b) => connect::request(
            headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok()),
            &b,
        ),
        Err(_) => Err(ConnectError::new(
            "resource_exhausted",
            "request over 4 MiB",
        )),
    };
    let req = match req {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let answer = match method.as_str() {
        "List" => list(&f, &c).await,
        "SendInput" => send_input(&f, &c, &req).await,
        "CloseStdin" => close_stdin(&f, &c, &req).await,
        "SendSignal" => send_signal(&f, &c, &req).await,
        _ => update(&f, &c, &req).await,
    };
    match answer {
        Ok(v) => connect::unary(v),
        Err(e) => e.into_response(),
    }
}

/// envd's `ProcessInfo` of a `/v1` `Process`.
fn info(p: &Value) -> Value {
    let argv: Vec<&str> = p["command"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let (cmd, args) = argv.split_first().map_or(("", &[][..]), |(c, a)| (*c, a));
    let mut config = json!({ "cmd": cmd, "args": args, "envs": {} });
    if let Some(cwd) = p["cwd"].as_str() {
        config["cwd"] = json!(cwd);
    }
    let mut out = json!({ "config": config, "pid": p["pid"] });
    if let Some(tag) = p["tag"].as_str() {
        out["tag"] = json!(tag);
    }
    out
}

async fn list(f: &Facade, c: &Ctx) -> Result<Value, EnvdError> {
    let listed = c
        .json(
            f,
            Method::GET,
            &format!("{}?status=running", uri(c, None, "")),
            None,
        )
        .await?;
    let processes: Vec<Value> = listed["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(info)
        .collect();
    Ok(json!({ "processes": processes }))
}

/// The pid a request's `process` selector names.
async fn pid_of(f: &Facade, c: &Ctx, req: &Value) -> Result<u32, EnvdError> {
    let sel = selector(req)?;
    resolve(f, c, &sel).await
}

/// Base64 as the SDKs send `bytes`: standard or URL-safe, padded or not.
pub(super) fn b64_bytes(field: &str, s: &str) -> Result<Vec<u8>, ConnectError> {
    let standard: String = s
        .trim()
        .trim_end_matches('=')
        .chars()
        .map(|ch| match ch {
            '-' => '+',
            '_' => '/',
            ch => ch,
        })
        .collect();
    base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(standard)
        .map_err(|e| ConnectError::field(field, e))
}

/// The bytes of envd's `ProcessInput` (`{"stdin": …}` or `{"pty": …}`).
fn input_bytes(input: &Value, field: &str) -> Result<Vec<u8>, ConnectError> {
    for kind in ["stdin", "pty"] {
        if let Some(s) = input.get(kind).and_then(Value::as_str) {
            return b64_bytes(&format!("{field}.{kind}"), s);
        }
    }
    if input.get("stdin").is_some() || input.get("pty").is_some() {
        return Err(ConnectError::field(field, "input bytes must be base64"));
    }
    Err(ConnectError::field(field, "names neither stdin nor pty"))
}

/// Writes `bytes` to the process's stdin (its terminal for a PTY), in `/v1`'s chunks.
async fn write_stdin(f: &Facade, c: &Ctx, pid: u32, bytes: &[u8]) -> Result<(), EnvdError> {
    for chunk in bytes.chunks(STDIN_CHUNK) {
        let resp =
            f.v1.call(
                &c.caller,
                Method::POST,
                &uri(c, Some(pid), "/stdin"),
                &[(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/octet-stream"),
                )],
                Body::from(Bytes::copy_from_slice(chunk)),
            )
            .await
            .map_err(|e| ConnectError::new("internal", e.message))?;
        let status = resp.status();
        if !status.is_success() {
            let body = read_all(resp).await.unwrap_or_default();
            return Err(EnvdError::from_v1(&c.sandbox, status, &body));
        }
    }
    Ok(())
}

async fn send_input(f: &Facade, c: &Ctx, req: &Value) -> Result<Value, EnvdError> {
    let pid = pid_of(f, c, req).await?;
    let bytes = input_bytes(&req["input"], "input")?;
    write_stdin(f, c, pid, &bytes).await?;
    Ok(json!({}))
}

async fn close_stdin(f: &Facade, c: &Ctx, req: &Value) -> Result<Value, EnvdError> {
    let pid = pid_of(f, c, req).await?;
    c.json(f, Method::DELETE, &uri(c, Some(pid), "/stdin"), None)
        .await?;
    Ok(json!({}))
}

/// The `/v1` signal of envd's `Signal` (a name or its number).
fn signal_name(v: &Value) -> Result<&'static str, ConnectError> {
    let name = match v {
        Value::String(s) => s.as_str(),
        Value::Number(n) => match n.as_u64() {
            Some(9) => "SIGNAL_SIGKILL",
            Some(15) => "SIGNAL_SIGTERM",
            _ => "",
        },
        _ => "",
    };
    match name {
        "SIGNAL_SIGKILL" => Ok("KILL"),
        "SIGNAL_SIGTERM" => Ok("TERM"),
        _ => Err(ConnectError::field(
            "signal",
            format!("{v} is not SIGNAL_SIGKILL or SIGNAL_SIGTERM"),
        )),
    }
}

async fn send_signal(f: &Facade, c: &Ctx, req: &Value) -> Result<Value, EnvdError> {
    let signal = signal_name(&req["signal"])?;
    let pid = pid_of(f, c, req).await?;
    // envd forgets a process when it ends, so signalling one that has ended is `not_found`
    // (the SDKs' `kill` answers false); `/v1` accepts it as a no-op.
    let p = c.json(f, Method::GET, &uri(c, Some(pid), ""), None).await?;
    if p["status"] != "running" {
        return Err(ConnectError::new(
            "not_found",
            format!("process with pid {pid} is not running"),
        )
        .into());
    }
    c.json(
        f,
        Method::POST,
        &uri(c, Some(pid), "/signal"),
        Some(&json!({ "signal": signal })),
    )
    .await?;
    Ok(json!({}))
}

async fn update(f: &Facade, c: &Ctx, req: &Value) -> Result<Value, EnvdError> {
    let pid = pid_of(f, c, req).await?;
    let pty: Option<Pty> = match req.get("pty").filter(|p| !p.is_null()) {
        Some(p) => {
            Some(serde_json::from_value(p.clone()).map_err(|e| ConnectError::field("pty", e))?)
        }
        None => None,
    };
    // Only a terminal's size can be updated; an update naming none changes nothing.
    if let Some(size) = pty.and_then(|p| p.size) {
        c.json(
            f,
            Method::POST,
            &uri(c, Some(pid), "/resize"),
            Some(&json!({ "cols": size.cols, "rows": size.rows })),
        )
        .await?;
    }
    Ok(json!({}))
}

/// `POST /process.Process/StreamInput`: a client stream of `{"start": {"process": …}}`, then
/// `{"data": {"input": …}}` and `{"keepalive": {}}` messages, each input written as it
/// arrives; answered once the client ends its stream (`{}` and the end envelope), or at the
/// first error (the end envelope with it).
pub async fn stream_input(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let c = match ctx(&f, &headers, None) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let (tx, rx) = mpsc::channel(2);
    match relay_input(&f, &c, body).await {
        Ok(()) => {
            let _ = tx.try_send(connect::message(&json!({})));
            let _ = tx.try_send(connect::end(None));
        }
        Err(EnvdError::Rpc(e)) => {
            let _ = tx.try_send(connect::end(Some(&e)));
        }
        Err(gone) => return gone.into_response(),
    }
    let mut r = stream_response(rx);
    *r.status_mut() = StatusCode::OK;
    r
}

/// The next complete envelope's JSON in `buf`, taken out of it.
fn next_message(buf: &mut BytesMut) -> Result<Option<Value>, ConnectError> {
    if buf.len() < 5 {
        return Ok(None);
    }
    if buf[0] & 0x01 != 0 {
        return Err(ConnectError::new(
            "unimplemented",
            "compressed messages are not supported (send identity encoding)",
        ));
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if len > MAX_MESSAGE {
        return Err(ConnectError::new(
            "resource_exhausted",
            "an input message is over 4 MiB",
        ));
    }
    if buf.len() < 5 + len {
        return Ok(None);
    }
    buf.advance(5);
    let json = buf.split_to(len);
    crate::requests::body::read_value(&json)
        .map(Some)
        .map_err(|e| ConnectError::malformed("message", e))
}

/// Reads the input stream and writes its data to the process it started with.
async fn relay_input(f: &Facade, c: &Ctx, body: Body) -> Result<(), EnvdError> {
    let mut data = body.into_data_stream();
    let mut buf = BytesMut::new();
    let mut pid: Option<u32> = None;
    loop {
        while let Some(msg) = next_message(&mut buf)? {
            if let Some(start) = msg.get("start") {
                let p = pid_of(f, c, start).await?;
                // The process must exist now, as envd checks it at the start message.
                c.json(f, Method::GET, &uri(c, Some(p), ""), None).await?;
                pid = Some(p);
            } else if let Some(d) = msg.get("data") {
                let Some(p) = pid else {
                    return Err(ConnectError::field("data", "sent before the start message").into());
                };
                let bytes = input_bytes(&d["input"], "data.input")?;
                write_stdin(f, c, p, &bytes).await?;
            }
            // `keepalive` (and anything unknown) carries nothing.
        }
        match data.next().await {
            Some(Ok(chunk)) => buf.extend_from_slice(&chunk),
            Some(Err(_)) => {
                return Err(ConnectError::new("canceled", "the input stream broke off").into())
            }
            None => break,
        }
    }
    if !buf.is_empty() {
        return Err(ConnectError::field("body", "the stream ends inside a message").into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_input_message_naming_a_key_twice_is_invalid_argument() {
        let json = br#"{"data":{"stdin":"YQ==","stdin":"Yg=="}}"#;
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&[0]);
        buf.extend_from_slice(&u32::try_from(json.len()).unwrap_or(0).to_be_bytes());
        buf.extend_from_slice(json);
        let e = next_message(&mut buf).expect_err("refused");
        assert_eq!(e.code, "invalid_argument");
        assert_eq!(e.message, "data.stdin: duplicate key");
    }

    #[test]
    fn a_listed_process_shows_no_environment() {
        let p = json!({"pid": 1048577, "command": ["/bin/bash", "-l", "-c", "cat"],
                       "cwd": "/home/user", "tag": null, "status": "running"});
        assert_eq!(
            info(&p),
            json!({"config": {"cmd": "/bin/bash", "args": ["-l", "-c", "cat"], "envs": {},
                              "cwd": "/home/user"}, "pid": 1048577})
        );
    }

    #[test]
    fn input_is_base64_of_any_spelling() {
        for s in ["aGk/Pw==", "aGk/Pw", "aGk_Pw"] {
            assert_eq!(input_bytes(&json!({"stdin": s}), "input").unwrap(), b"hi??");
        }
        assert_eq!(input_bytes(&json!({"pty": "eA=="}), "input").unwrap(), b"x");
        let e = input_bytes(&json!({"stdin": "@@"}), "input").unwrap_err();
        assert!(e.message.starts_with("input.stdin"), "{e:?}");
        assert!(input_bytes(&json!({}), "input").is_err());
    }

    #[test]
    fn signals_are_envds_two() {
        assert_eq!(signal_name(&json!("SIGNAL_SIGKILL")).unwrap(), "KILL");
        assert_eq!(signal_name(&json!(15)).unwrap(), "TERM");
        let e = signal_name(&json!("SIGNAL_UNSPECIFIED")).unwrap_err();
        assert!(e.message.starts_with("signal"), "{e:?}");
    }

    #[test]
    fn input_messages_are_split_from_any_chunking() {
        let mut all = BytesMut::new();
        all.extend_from_slice(&connect::message(
            &json!({"start": {"process": {"pid": 1}}}),
        ));
        all.extend_from_slice(&connect::message(&json!({"keepalive": {}})));
        let mut buf = BytesMut::new();
        let mut got = vec![];
        for b in all.iter() {
            buf.extend_from_slice(&[*b]);
            while let Some(m) = next_message(&mut buf).unwrap() {
                got.push(m);
            }
        }
        assert_eq!(got.len(), 2);
        assert_eq!(got[1], json!({"keepalive": {}}));
        assert!(buf.is_empty());
        let mut big = BytesMut::from(&[0u8, 0xff, 0, 0, 0][..]);
        assert_eq!(
            next_message(&mut big).unwrap_err().code,
            "resource_exhausted"
        );
    }
}
