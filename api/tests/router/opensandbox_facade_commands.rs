//! execd's command status, logs and interrupt through the facade across two API processes
//! (two routers over one store and one bus, as behind a load balancer): a command (a `/v1`
//! process, its id the pid) started through one is read and interrupted through the other,
//! whose process routes ask the supervisor over the bus; a command of another sandbox, and
//! one whose supervisor is gone, are not found.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::support::{api_pair, Answer, Api, EXECD_TOKEN, FACADE_HOST};

const CURSOR: &str = "execd-commands-tail-cursor";

/// A raw execd call: status, headers and body bytes (event streams and logs are not JSON).
async fn raw(
    api: &Api,
    tok: &str,
    m: Method,
    id: &str,
    path: &str,
    body: Value,
) -> (StatusCode, axum::http::HeaderMap, Vec<u8>) {
    let mut req = Request::builder()
        .method(m)
        .uri(format!("/opensandbox/execd/{id}{path}"))
        .header(FACADE_HOST.0, FACADE_HOST.1)
        .header(EXECD_TOKEN, tok);
    let body = if body.is_null() {
        Body::empty()
    } else {
        req = req.header("content-type", "application/json");
        Body::from(body.to_string())
    };
    let resp = api
        .router
        .clone()
        .oneshot(req.body(body).unwrap())
        .await
        .unwrap();
    let (status, headers) = (resp.status(), resp.headers().clone());
    let bytes = axum::body::to_bytes(resp.into_body(), 4 << 20)
        .await
        .unwrap();
    (status, headers, bytes.to_vec())
}

/// A JSON execd call.
async fn execd(api: &Api, tok: &str, m: Method, id: &str, path: &str) -> Answer {
    api.call(
        m,
        &format!("/opensandbox/execd/{id}{path}"),
        None,
        Value::Null,
        &[FACADE_HOST, (EXECD_TOKEN, tok)],
    )
    .await
}

/// Starts `argv` in the background through `api`; the command id from the `init` event.
async fn start(api: &Api, tok: &str, id: &str, argv: &[&str]) -> String {
    let (status, _, body) = raw(
        api,
        tok,
        Method::POST,
        id,
        "/command",
        json!({"argv": argv, "background": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let text = String::from_utf8(body).unwrap();
    let init: Value = text
        .split("\n\n")
        .filter(|f| !f.trim().is_empty())
        .map(|f| serde_json::from_str::<Value>(f).unwrap())
        .find(|ev| ev["type"] == "init")
        .expect("an init event");
    init["text"].as_str().unwrap().to_owned()
}

/// The status of `cmd` through `api` once `done` holds for it (within 30 s).
async fn status_when(
    api: &Api,
    tok: &str,
    id: &str,
    cmd: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let a = execd(api, tok, Method::GET, id, &format!("/command/status/{cmd}")).await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.body);
        if done(&a.body) {
            return a.body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "status never settled: {}",
            a.body
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn assert_not_found(a: &Answer, why: &str) {
    assert_eq!(a.status, StatusCode::NOT_FOUND, "{}", a.body);
    let msg = a.body["message"].as_str().unwrap_or_default();
    assert!(msg.contains(why), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_logs_and_interrupt_answer_through_another_api_process() {
    let (a, b) = api_pair().await;
    let id = a.live_sandbox().await;
    let tok = a.facade_execd_token(&id).await;

    // 1.2 MB of output, more than two pages.
    const TOTAL: usize = 1_200_000;
    let total = TOTAL.to_string();
    let cmd = start(&a, &tok, &id, &["fake-output", &total]).await;
    let st = status_when(&b, &tok, &id, &cmd, |s| s["running"] == false).await;
    assert_eq!(st["id"], cmd.as_str());
    assert_eq!(st["exit_code"], 0, "{st}");
    assert_eq!(st["content"], format!("fake-output {total}"));

    // Logs through B, page by page: each at most 512 KiB, the cursor header where the next
    // starts; what comes back is the whole output.
    let mut out = Vec::new();
    let mut cursor: Option<usize> = None;
    let mut pages = 0;
    loop {
        let q = cursor.map(|c| format!("?cursor={c}")).unwrap_or_default();
        let (status, headers, body) = raw(
            &b,
            &tok,
            Method::GET,
            &id,
            &format!("/command/{cmd}/logs{q}"),
            Value::Null,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        assert!(body.len() <= 512 << 10, "a page of {} bytes", body.len());
        let next: usize = headers[CURSOR].to_str().unwrap().parse().unwrap();
        assert_eq!(next, cursor.unwrap_or(0) + body.len());
        out.extend_from_slice(&body);
        pages += 1;
        if body.is_empty() {
            break;
        }
        cursor = Some(next);
        assert!(pages < 10, "the cursor does not advance");
    }
    assert_eq!(out.len(), TOTAL);
    assert!(out.chunks(2).all(|c| c == b"y\n"), "the output is y\\n");
    assert_eq!(pages, 4, "three pages and an empty one at the end");
    // The owner itself answers the same page.
    let (_, ha, from_a) = raw(
        &a,
        &tok,
        Method::GET,
        &id,
        &format!("/command/{cmd}/logs?cursor=524288"),
        Value::Null,
    )
    .await;
    assert_eq!(from_a, out[524288..2 * 524288]);
    assert_eq!(ha[CURSOR], "1048576");

    // Interrupt through B: the command started through A stops.
    let sleeper = start(&a, &tok, &id, &["sleep", "60"]).await;
    let st = execd(
        &b,
        &tok,
        Method::GET,
        &id,
        &format!("/command/status/{sleeper}"),
    )
    .await;
    assert_eq!(st.body["running"], true, "{}", st.body);
    let i = execd(
        &b,
        &tok,
        Method::DELETE,
        &id,
        &format!("/command?id={sleeper}"),
    )
    .await;
    assert_eq!(i.status, StatusCode::OK, "{}", i.body);
    let st = status_when(&b, &tok, &id, &sleeper, |s| s["running"] == false).await;
    assert_eq!(st["exit_code"], -1, "{st}");
    assert_eq!(st["error"], "signal: killed", "{st}");

    // A command of another sandbox is not found, through either process, for every route.
    let other = a.live_sandbox().await;
    let other_tok = a.facade_execd_token(&other).await;
    for api in [&a, &b] {
        for (m, path) in [
            (Method::GET, format!("/command/status/{cmd}")),
            (Method::GET, format!("/command/{cmd}/logs")),
            (Method::DELETE, format!("/command?id={sleeper}")),
        ] {
            let r = execd(api, &other_tok, m, &other, &path).await;
            assert_not_found(&r, "not found");
        }
    }

    // Ids this facade never issued: an older facade's `<instance>-<ulid>`, a pid of a
    // supervisor slot nobody holds, forms that are not a pid.
    let unknown = ((4000u32 << 20) | 1).to_string();
    for bad in [
        "01jd0000000000000000000000-01jd0000000000000000000001".to_owned(),
        unknown.clone(),
        format!("{cmd}.%3E"),
        format!("-{cmd}"),
    ] {
        let r = execd(
            &b,
            &tok,
            Method::GET,
            &id,
            &format!("/command/status/{bad}"),
        )
        .await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{bad}: {}", r.body);
    }
    let r = execd(
        &b,
        &tok,
        Method::GET,
        &id,
        &format!("/command/status/{unknown}"),
    )
    .await;
    assert_not_found(&r, "the API process that ran it is gone");

    // The owner stops: its commands are gone with it, and B says so. While the owner's
    // answerer is going away a question may go unanswered: that is a 503 saying to retry,
    // never a wrong answer.
    drop(a);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r = execd(
            &b,
            &tok,
            Method::GET,
            &id,
            &format!("/command/status/{cmd}"),
        )
        .await;
        if r.status == StatusCode::NOT_FOUND {
            assert_not_found(&r, "the API process that ran it is gone");
            break;
        }
        if r.status == StatusCode::SERVICE_UNAVAILABLE {
            assert_eq!(
                r.body["code"], "DIFFERENTLY::COMMAND_OWNER_UNAVAILABLE",
                "{}",
                r.body
            );
        } else {
            assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still answered after the owner stopped"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = execd(
        &b,
        &tok,
        Method::DELETE,
        &id,
        &format!("/command?id={sleeper}"),
    )
    .await;
    assert_not_found(&r, "the API process that ran it is gone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_that_does_not_answer_is_503_and_retryable() {
    let (a, b) = api_pair().await;
    let id = a.live_sandbox().await;
    let tok = a.facade_execd_token(&id).await;
    // A supervisor that serves its slot's subject but never answers (hung, or overloaded).
    let slot = 4001u16;
    let mut served = b.bus.serve(&b.naming.process_subject(slot)).await.unwrap();
    let holding = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Some(r) = futures::StreamExt::next(&mut served).await {
            held.push(r);
        }
    });
    let cmd = ((u32::from(slot) << 20) | 1).to_string();
    let started = tokio::time::Instant::now();
    let r = execd(
        &b,
        &tok,
        Method::GET,
        &id,
        &format!("/command/status/{cmd}"),
    )
    .await;
    let took = started.elapsed();
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.body);
    assert_eq!(
        r.body["code"], "DIFFERENTLY::COMMAND_OWNER_UNAVAILABLE",
        "{}",
        r.body
    );
    assert_eq!(r.headers["retry-after"], "1");
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(5),
        "{took:?}"
    );
    holding.abort();
}

/// Opens a foreground command's event stream through `api`: the command id from `init`, and
/// the rest of the stream (events as JSON, in order) for the caller to read or drop.
async fn open(
    api: &Api,
    tok: &str,
    id: &str,
    argv: &[&str],
) -> (String, futures::stream::BoxStream<'static, Value>) {
    let req = Request::builder()
        .method(Method::POST)
        .uri(format!("/opensandbox/execd/{id}/command"))
        .header(FACADE_HOST.0, FACADE_HOST.1)
        .header(EXECD_TOKEN, tok)
        .header("content-type", "application/json")
        .body(Body::from(json!({ "argv": argv }).to_string()))
        .unwrap();
    let resp = api.router.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    // Frames are JSON objects each followed by a blank line; a chunk may hold several.
    let events = futures::stream::unfold(
        (resp.into_body().into_data_stream(), String::new()),
        |(mut data, mut carry)| async move {
            loop {
                if let Some(n) = carry.find("\n\n") {
                    let frame: String = carry.drain(..n + 2).collect();
                    if frame.trim().is_empty() {
                        continue;
                    }
                    let ev: Value = serde_json::from_str(frame.trim()).unwrap();
                    return Some((ev, (data, carry)));
                }
                let chunk = futures::StreamExt::next(&mut data).await?.unwrap();
                carry.push_str(std::str::from_utf8(&chunk).unwrap());
            }
        },
    );
    let mut events = futures::StreamExt::boxed(events);
    let init = next_event(&mut events).await;
    assert_eq!(init["type"], "init", "{init}");
    (init["text"].as_str().unwrap().to_owned(), events)
}

/// The next event that is not a `ping`, within 10 s.
async fn next_event(events: &mut futures::stream::BoxStream<'static, Value>) -> Value {
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(10), futures::StreamExt::next(events))
            .await
            .expect("an event within 10 s")
            .expect("the stream is still open");
        if ev["type"] != "ping" {
            return ev;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreground_commands_are_processes_any_api_process_reads_and_interrupts() {
    let (a, b) = api_pair().await;
    let id = a.live_sandbox().await;
    let tok = a.facade_execd_token(&id).await;

    // A foreground command streams its lines and its end; its id is a pid that B knows.
    let (cmd, mut events) = open(&a, &tok, &id, &["echo", "one", "two"]).await;
    assert!(cmd.parse::<u32>().is_ok(), "the id is a pid: {cmd}");
    let out = next_event(&mut events).await;
    assert_eq!(
        (&out["type"], &out["text"]),
        (&json!("stdout"), &json!("one two"))
    );
    let end = next_event(&mut events).await;
    assert_eq!(end["type"], "execution_complete", "{end}");
    let st = status_when(&b, &tok, &id, &cmd, |s| s["running"] == false).await;
    assert_eq!(
        (&st["exit_code"], &st["error"]),
        (&json!(0), &Value::Null),
        "{st}"
    );
    assert_eq!(st["content"], "echo one two");
    let (s, _, logs) = raw(
        &b,
        &tok,
        Method::GET,
        &id,
        &format!("/command/{cmd}/logs"),
        Value::Null,
    )
    .await;
    assert_eq!((s, logs), (StatusCode::OK, b"one two\n".to_vec()));
    // It is a /v1 process of the sandbox, tagged as the facade's.
    let listed = a
        .call(
            Method::GET,
            &format!("/v1/sandboxes/{id}/processes"),
            Some(&a.key),
            Value::Null,
            &[],
        )
        .await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.body);
    let mine = listed.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == json!(cmd.parse::<u32>().unwrap()))
        .unwrap_or_else(|| panic!("pid {cmd} in {}", listed.body))
        .clone();
    assert_eq!(mine["tag"], "opensandbox.argv", "{mine}");

    // A failing one ends with execd's error event, and its status says how.
    let (cmd, mut events) = open(&a, &tok, &id, &["fake-exit", "3"]).await;
    let end = next_event(&mut events).await;
    assert_eq!(end["type"], "error", "{end}");
    assert_eq!(end["error"]["evalue"], "3", "{end}");
    let st = status_when(&b, &tok, &id, &cmd, |s| s["running"] == false).await;
    assert_eq!(
        (&st["exit_code"], &st["error"]),
        (&json!(3), &json!("exit status 3")),
        "{st}"
    );

    // Interrupted through B while A streams it: the stream ends as execd's killed command.
    let (cmd, mut events) = open(&a, &tok, &id, &["sleep", "60"]).await;
    let i = execd(&b, &tok, Method::DELETE, &id, &format!("/command?id={cmd}")).await;
    assert_eq!(i.status, StatusCode::OK, "{}", i.body);
    let end = next_event(&mut events).await;
    assert_eq!(end["type"], "error", "{end}");
    assert_eq!(end["error"]["evalue"], "-1", "{end}");
    assert_eq!(
        end["error"]["traceback"],
        json!(["signal: killed"]),
        "{end}"
    );

    // A client that goes away takes its foreground command with it.
    let (cmd, events) = open(&a, &tok, &id, &["sleep", "60"]).await;
    drop(events);
    let st = status_when(&b, &tok, &id, &cmd, |s| s["running"] == false).await;
    assert_eq!(
        (&st["exit_code"], &st["error"]),
        (&json!(-1), &json!("signal: killed")),
        "{st}"
    );
}
