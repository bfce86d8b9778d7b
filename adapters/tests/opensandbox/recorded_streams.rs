//! The adapter's execd client fed the real execd's recorded answers
//! (`adapters/tests/fixtures/opensandbox/`): a loopback stand-in serves each recorded
//! `POST /command` response (through the server proxy and straight from execd) with its
//! recorded status, content type and chunks at their recorded offsets, and holds the stream
//! open until the recorded close (~1 s after the last event), as real execd does. The adapter's
//! parsed result must be what the command printed and exited with, written out here by hand
//! from the command (not derived from the events): exit codes, stderr apart from stdout, the
//! blank line that arrives as a `"\n"` event, the timeout's 124, a signal's 128+n, a refused
//! body, and an answer that does not wait for the close.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use differently_adapters::opensandbox::{OpenSandboxAdapter, OpenSandboxConfig};
use differently_adapters::{Adapter, AdapterError, InstanceRef};
use differently_core::SandboxId;
use serde_json::Value;

use crate::replay::load;
use crate::{cmd, key_file, KEY};

/// The recorded exchanges by number, and this server's port (for endpoint answers).
struct Stand {
    by_n: HashMap<u64, Value>,
    port: u16,
}

/// `GET …/sandboxes/case-<n>/endpoints/44772` → an endpoint on this server for case `n`;
/// `POST /rec/<n>/command` → exchange `n` as recorded; the status and interrupt routes answer
/// 404 and 200 (nothing was recorded for these commands' status).
async fn serve(State(s): State<Arc<Stand>>, req: Request) -> Response {
    let path = req.uri().path().to_owned();
    if let Some(rest) = path.strip_prefix("/v1/sandboxes/case-") {
        let n = rest.split('/').next().unwrap_or_default();
        let body = serde_json::json!({"endpoint": format!("127.0.0.1:{}/rec/{n}", s.port)});
        return Response::builder()
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
    }
    let parts: Vec<&str> = path.trim_start_matches('/').splitn(3, '/').collect();
    let (n, tail) = match parts.as_slice() {
        ["rec", n, tail] => (n.parse::<u64>().unwrap_or(0), *tail),
        _ => (0, ""),
    };
    if tail != "command" || req.method() != axum::http::Method::POST {
        let status = if req.method() == axum::http::Method::DELETE {
            200
        } else {
            404
        };
        return Response::builder()
            .status(status)
            .body(Body::from("{}"))
            .unwrap();
    }
    let ex = s.by_n.get(&n).cloned().unwrap_or(Value::Null);
    let status = ex["status"].as_u64().unwrap_or(500) as u16;
    let ctype = ex["responseHeaders"]["content-type"]
        .as_str()
        .unwrap_or("application/json")
        .to_owned();
    let mut resp = Response::builder()
        .status(status)
        .header("content-type", ctype);
    let Some(chunks) = ex["chunks"].as_array().cloned() else {
        return resp
            .body(Body::from(
                ex["responseBody"].as_str().unwrap_or_default().to_owned(),
            ))
            .unwrap();
    };
    // Held open until the recorded close; a stream whose client hung up stays open well past
    // the test (real execd kept such commands running).
    let close_ms = ex["durationMs"].as_f64().unwrap_or(30_000.0)
        - ex["responseHeadersMs"].as_f64().unwrap_or(0.0);
    let start = tokio::time::Instant::now();
    let items: Vec<(f64, String)> = chunks
        .iter()
        .map(|c| {
            (
                c[0].as_f64().unwrap_or(0.0),
                c[1].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let stream = futures::stream::unfold(
        (items.into_iter(), false),
        move |(mut it, closed)| async move {
            if closed {
                return None;
            }
            match it.next() {
                Some((at, text)) => {
                    tokio::time::sleep_until(start + Duration::from_micros((at * 1000.0) as u64))
                        .await;
                    Some((
                        Ok::<_, std::io::Error>(bytes::Bytes::from(text)),
                        (it, false),
                    ))
                }
                None => {
                    tokio::time::sleep_until(
                        start + Duration::from_micros((close_ms * 1000.0) as u64),
                    )
                    .await;
                    None
                }
            }
        },
    );
    resp = resp.header("cache-control", "no-cache");
    resp.body(Body::from_stream(stream)).unwrap()
}

/// What a recorded command must come out as.
enum Want {
    Ran(i32, &'static str, &'static str),
    Refused(&'static str),
}

#[tokio::test]
async fn recorded_execd_streams_parse_to_what_the_commands_did() {
    let (_, exchanges) = load();
    let by_n: HashMap<u64, Value> = exchanges
        .into_iter()
        .filter_map(|e| e["n"].as_u64().map(|n| (n, e)))
        .collect();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let stand = Arc::new(Stand { by_n, port });
    let app = axum::Router::new()
        .fallback(serve)
        .with_state(stand.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let key = key_file(KEY);
    let cfg: OpenSandboxConfig = serde_json::from_value(serde_json::json!({
        "apiURL": format!("http://127.0.0.1:{port}/v1"), "trust": "private",
        "apiKeyFile": key.path(), "lineEndings": "stripped",
    }))
    .unwrap();
    let a = OpenSandboxAdapter::new(cfg).unwrap();

    // (exchange through the server proxy, the same case straight from execd, outcome)
    let cases: &[(u64, Option<u64>, Want)] = &[
        (87, Some(133), Want::Ran(0, "hi\n", "")),
        // A blank line arrives as an event whose text is "\n"; the others lose theirs.
        (88, Some(134), Want::Ran(0, "first\n\nthird\n", "")),
        (89, Some(135), Want::Ran(0, "to-stdout\n", "to-stderr\n")),
        (90, Some(136), Want::Ran(3, "", "")),
        // Killed by execd's timeout (SIGKILL, evalue -1) once ours passed: 124.
        (91, Some(137), Want::Ran(124, "start\n", "")),
        (93, Some(139), Want::Ran(0, "/tmp\n", "")),
        // FOO from the sandbox's create, BAR from the command.
        (95, Some(141), Want::Ran(0, "FOO=bar BAR=baz\n", "")),
        // Output, two quiet seconds, output.
        (216, Some(217), Want::Ran(0, "before\nafter\n", "")),
        // The SDK flows' sandboxes had OSB_FLOW_TOKEN set at create, one token per flow; in
        // the proxied one several events share a chunk.
        (
            7,
            None,
            Want::Ran(0, "hello fde4e1e89480\ndone\n", "oops\n"),
        ),
        (
            30,
            None,
            Want::Ran(0, "hello 9b874a93d9c8\ndone\n", "oops\n"),
        ),
        // execd ended it with `signal: broken pipe` while the client was connected.
        (203, None, Want::Ran(141, "before\n", "")),
        (94, Some(140), Want::Refused("the cwd does not exist")),
    ];
    for (proxy, direct, want) in cases {
        for n in std::iter::once(*proxy).chain(*direct) {
            let ex = &stand.by_n[&n];
            let at = InstanceRef {
                sandbox_id: SandboxId::new(),
                backend_ref: format!("case-{n}"),
            };
            let mut req = cmd(&["true"]);
            if n == 91 || n == 137 {
                req.timeout_seconds = Some(1);
            }
            let t = Instant::now();
            let got = a.exec(&at, &req).await;
            let took = t.elapsed();
            let case = ex["case"].as_str().unwrap_or_default();
            match want {
                Want::Ran(code, out, err) => {
                    let r = got.unwrap_or_else(|e| panic!("#{n} {case}: {e}"));
                    assert_eq!(
                        (r.exit_code, r.stdout.as_str(), r.stderr.as_str()),
                        (*code, *out, *err),
                        "#{n} {case}"
                    );
                    // The answer comes with the terminal event, not with execd's close ~1 s
                    // later.
                    let last = ex["chunks"]
                        .as_array()
                        .and_then(|c| c.last())
                        .and_then(|c| c[0].as_f64())
                        .unwrap_or(0.0);
                    assert!(
                        took < Duration::from_millis(last as u64 + 600),
                        "#{n} {case}: took {took:?}, the last event came at {last} ms"
                    );
                }
                Want::Refused(why) => match got {
                    Err(AdapterError::Permanent(e)) => {
                        assert!(e.to_string().contains(why), "#{n} {case}: {e}")
                    }
                    other => panic!("#{n} {case}: {other:?}"),
                },
            }
        }
    }
}
