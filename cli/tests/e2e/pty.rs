//! The interactive terminal end to end: `GET /v1/sandboxes/{id}/pty` as a WebSocket against a
//! `devhost` pool (a real pseudo-terminal running `sh`), served by separate api, scheduler and
//! worker processes: a line read, a resize seen by `stty size`, SIGINT, the exit code, a
//! reattach within the grace period, its expiry, a takeover, the errors before and after the
//! upgrade, another tenant's 404, and the audit record.

use std::time::Duration;

use differently_core::{SandboxId, SandboxStatus};
use futures::{SinkExt, StreamExt};
use reqwest::Method;
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::dataplane::{cluster, running};
use crate::harness::{Cluster, Opts};
use crate::tenancy::tenant;

/// Grace period of these clusters: long enough to reattach, short enough to see it expire.
const GRACE_SECONDS: u64 = 3;

async fn pty_cluster() -> Cluster {
    cluster(Opts {
        extra_toml: format!("[api]\npty_grace_seconds = {GRACE_SECONDS}\n"),
        ..Opts::default()
    })
    .await
}

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// One terminal connection: the socket, the session id from its first frame, and the
/// terminal output seen so far.
struct Term {
    ws: Socket,
    session: String,
    seen: String,
}

/// Opens the PTY route with `query` as `key`; the handshake's status and JSON body if it fails.
async fn connect(c: &Cluster, key: &str, id: &str, query: &str) -> Result<Socket, (u16, Value)> {
    let url = format!("ws://127.0.0.1:{}/v1/sandboxes/{id}/pty?{query}", c.port);
    let mut req = url.into_client_request().expect("ws request");
    req.headers_mut().insert(
        "authorization",
        HeaderValue::from_str(&format!("Bearer {key}")).expect("header"),
    );
    match tokio_tungstenite::connect_async(req).await {
        Ok((ws, resp)) => {
            assert_eq!(resp.status().as_u16(), 101);
            Ok(ws)
        }
        Err(WsError::Http(resp)) => {
            let body = resp.body().clone().unwrap_or_default();
            Err((
                resp.status().as_u16(),
                serde_json::from_slice(&body).unwrap_or(Value::Null),
            ))
        }
        Err(e) => panic!("websocket handshake: {e}"),
    }
}

/// Opens the PTY route expecting a refusal before the upgrade; its status and body.
async fn refused(c: &Cluster, key: &str, id: &str, query: &str) -> (u16, Value) {
    match connect(c, key, id, query).await {
        Ok(_) => panic!("pty open {query:?} was upgraded; expected a refusal"),
        Err(refusal) => refusal,
    }
}

/// The next message within 10 s (`None`: the socket ended).
async fn next_msg(ws: &mut Socket) -> Option<Message> {
    match tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
        Ok(Some(Ok(m))) => Some(m),
        Ok(Some(Err(_)) | None) => None,
        Err(_) => panic!("no frame within 10 s"),
    }
}

impl Term {
    /// Opens a terminal (or reattaches with `session=`) and reads the session frame.
    async fn open(c: &Cluster, key: &str, id: &str, query: &str) -> Term {
        let mut ws = match connect(c, key, id, query).await {
            Ok(ws) => ws,
            Err((s, b)) => panic!("pty open answered {s}: {b}\n{}", c.logs()),
        };
        let first = next_msg(&mut ws).await.expect("a first frame");
        let Message::Text(t) = first else {
            panic!("first frame is not the session frame: {first:?}");
        };
        let hello: Value = serde_json::from_str(t.as_str()).expect("json");
        assert_eq!(hello["type"], "session", "{hello}");
        assert_eq!(hello["graceSeconds"], GRACE_SECONDS, "{hello}");
        Term {
            ws,
            session: hello["id"].as_str().expect("session id").to_owned(),
            seen: String::new(),
        }
    }

    async fn line(&mut self, text: &str) {
        self.ws
            .send(Message::Binary(format!("{text}\n").into_bytes().into()))
            .await
            .expect("send stdin");
    }

    async fn control(&mut self, v: Value) {
        self.ws
            .send(Message::Text(v.to_string().into()))
            .await
            .expect("send control");
    }

    /// Reads terminal output until it contains `want`; the next expectation reads after it.
    async fn expect(&mut self, want: &str) {
        while !self.seen.contains(want) {
            match next_msg(&mut self.ws).await {
                Some(Message::Binary(b)) => self.seen.push_str(&String::from_utf8_lossy(&b)),
                Some(Message::Text(t)) => {
                    panic!("control frame {t} before {want:?}; saw {:?}", self.seen)
                }
                Some(_) => {}
                None => panic!("socket ended before {want:?}; saw {:?}", self.seen),
            }
        }
        if let Some(at) = self.seen.find(want) {
            self.seen.drain(..at + want.len());
        }
    }

    /// Reads until `end` and returns what came before it.
    async fn until(&mut self, end: &str) -> String {
        while !self.seen.contains(end) {
            match next_msg(&mut self.ws).await {
                Some(Message::Binary(b)) => self.seen.push_str(&String::from_utf8_lossy(&b)),
                Some(_) => {}
                None => panic!("socket ended before {end:?}; saw {:?}", self.seen),
            }
        }
        let at = self.seen.find(end).unwrap_or(0);
        let before = self.seen[..at].to_owned();
        self.seen.drain(..at + end.len());
        before
    }

    /// Reads to the final JSON frame (output before it is kept); then the socket closes.
    async fn last_control(&mut self) -> Value {
        loop {
            match next_msg(&mut self.ws).await {
                Some(Message::Binary(b)) => self.seen.push_str(&String::from_utf8_lossy(&b)),
                Some(Message::Text(t)) => {
                    let v: Value = serde_json::from_str(t.as_str()).expect("json");
                    // After it: the close, and nothing else.
                    match next_msg(&mut self.ws).await {
                        Some(Message::Close(_)) | None => return v,
                        Some(other) => panic!("frame after the final one: {other:?}"),
                    }
                }
                Some(_) => {}
                None => panic!("socket ended without a final frame; saw {:?}", self.seen),
            }
        }
    }
}

fn process_alive(pid: &str) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

/// A sandbox on the devhost pool (the only one with `exec.pty`).
async fn devhost_sandbox(c: &Cluster) -> SandboxId {
    running(c, json!({"capabilities": ["exec.pty"]})).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pty_runs_sh_resizes_interrupts_reattaches_and_exits_with_its_code() {
    let c = pty_cluster().await;
    let id = devhost_sandbox(&c).await;
    let sb = c.get(&id).await;
    assert_eq!(sb["pool"], "dev", "{sb}");
    let id = id.to_string();

    let query = "command=sh&cols=80&rows=24&env=PS1%3D%24%20&env=PTY_SECRET%3Dhunter2-pty";
    let mut t = Term::open(&c, &c.key, &id, query).await;
    // `sh` reads a whole line from the terminal (the echoed command says `$x`, the output
    // says what was read).
    t.line("read x; echo got:$x").await;
    t.line("hello world").await;
    t.expect("got:hello world").await;
    t.line("stty size").await;
    t.expect("24 80").await;
    t.control(json!({"type": "resize", "cols": 132, "rows": 40}))
        .await;
    t.line("stty size").await;
    t.expect("40 132").await;
    // SIGINT interrupts `sleep 100`; the shell answers the next line at once. The command
    // says it runs (then becomes the sleep), so the signal never races the shell starting it.
    t.line("sh -c 'echo sle\"\"eping; exec sleep 100'; echo after-sl\"\"eep")
        .await;
    t.expect("sleeping").await;
    t.control(json!({"type": "signal", "signal": "INT"})).await;
    t.line("echo alive-$((20+1))").await;
    t.expect("alive-21").await;

    // Drop the socket (no close frame) while a command is about to print; reattach within
    // the grace period and get what it printed meanwhile.
    t.line("sleep 1; echo meanwhile-$((6*7))").await;
    let session = t.session.clone();
    drop(t);
    tokio::time::sleep(Duration::from_millis(1800)).await;
    let mut again = Term::open(&c, &c.key, &id, &format!("session={session}")).await;
    assert_eq!(again.session, session);
    again.expect("meanwhile-42").await;

    // Another tenant sees neither the sandbox nor the session.
    let other = tenant(&c, "pty-other").await;
    for q in ["command=sh".to_owned(), format!("session={session}")] {
        let (s, body) = refused(&c, &other.key, &id, &q).await;
        assert_eq!(s, 404, "{q}: {body}");
        assert_eq!(body["error"]["code"], "not_found", "{body}");
    }

    again.line("exit 3").await;
    let last = again.last_control().await;
    assert_eq!(last, json!({"type": "exit", "exitCode": 3}));
    // An ended session cannot be reattached.
    let (s, body) = refused(&c, &c.key, &id, &format!("session={session}")).await;
    assert_eq!(s, 404, "{body}");

    // Audited like exec: the open and the reattach, program name only.
    let records =
        crate::audit::records_of(&c, &SandboxId::parse(&id).unwrap(), "sandbox.pty").await;
    assert_eq!(records.len(), 2, "{records:?}");
    let text = serde_json::to_string(&records).unwrap();
    assert!(
        records.iter().all(|r| r["detail"]["program"] == "sh"),
        "{text}"
    );
    assert!(
        records.iter().any(|r| r["detail"]["reattach"] == true),
        "{text}"
    );
    assert!(
        !text.contains("hunter2"),
        "env value leaked into the audit log: {text}"
    );
    assert!(
        !c.logs().contains("hunter2"),
        "env value leaked into the logs"
    );
    let report = crate::audit::verify(&c).await;
    assert_eq!(report["ok"], true, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pty_refuses_bad_opens_and_ends_sessions_on_grace_expiry_and_takeover() {
    let c = pty_cluster().await;
    let dev = devhost_sandbox(&c).await.to_string();
    let fake = running(&c, json!({"capabilities": ["lifecycle.stop"]}))
        .await
        .to_string();

    // Before the upgrade: the JSON envelope with a stable code and the field.
    for (q, field) in [
        ("cols=0", "cols"),
        ("rows=5000", "rows"),
        ("env=NOVALUE", "env"),
        ("cwd=relative", "cwd"),
        ("shell=bash", "shell"),
    ] {
        let (s, body) = refused(&c, &c.key, &dev, q).await;
        assert_eq!(s, 400, "{q}: {body}");
        assert_eq!(body["error"]["code"], "invalid_argument", "{q}: {body}");
        assert_eq!(body["error"]["details"]["field"], field, "{q}: {body}");
    }
    let plain = c
        .req(Method::GET, &format!("/v1/sandboxes/{dev}/pty"))
        .send()
        .await
        .expect("plain get");
    assert_eq!(plain.status().as_u16(), 400);
    let body: Value = plain.json().await.expect("json");
    assert_eq!(body["error"]["code"], "invalid_argument", "{body}");
    let (s, body) = refused(&c, &c.key, &fake, "").await;
    assert_eq!(s, 501, "{body}");
    assert_eq!(body["error"]["code"], "unsupported_operation", "{body}");
    let (s, body) = refused(&c, &c.key, &dev, "session=pty_nope").await;
    assert_eq!(
        (s, &body["error"]["code"]),
        (404, &json!("not_found")),
        "{body}"
    );

    // After the upgrade: a bad control frame gets an error frame naming the field, then close.
    let mut t = Term::open(&c, &c.key, &dev, "command=sh").await;
    t.control(json!({"type": "resize", "cols": 0, "rows": 10}))
        .await;
    let err = t.last_control().await;
    assert_eq!(err["type"], "error", "{err}");
    assert_eq!(err["code"], "invalid_argument", "{err}");
    assert_eq!(err["field"], "cols", "{err}");

    // A missing cwd fails in the adapter, after the upgrade: an error frame.
    let mut t = Term::open(&c, &c.key, &dev, "command=sh&cwd=%2Fno%2Fsuch").await;
    let err = t.last_control().await;
    assert_eq!(err["type"], "error", "{err}");
    assert!(
        err["message"].as_str().unwrap_or("").contains("cwd"),
        "{err}"
    );

    // Takeover: a second attach wins, the first gets an error frame and close code 4001.
    let mut first = Term::open(&c, &c.key, &dev, "command=sh").await;
    first.line("echo one-$((0+1))").await;
    first.expect("one-1").await;
    let mut second = Term::open(&c, &c.key, &dev, &format!("session={}", first.session)).await;
    let mut taken = None;
    loop {
        match next_msg(&mut first.ws).await {
            Some(Message::Text(t)) => {
                taken = Some(serde_json::from_str::<Value>(t.as_str()).unwrap())
            }
            Some(Message::Close(Some(f))) => {
                assert_eq!(u16::from(f.code), 4001);
                break;
            }
            Some(_) => {}
            None => panic!("first socket ended without a close frame"),
        }
    }
    let taken = taken.expect("an error frame before the close");
    assert_eq!(taken["code"], "conflict", "{taken}");
    second.line("echo pid-$((1+1)):$$:").await;
    second.expect("pid-2:").await;
    let pid = second.until(":").await;
    assert!(
        pid.chars().all(|c| c.is_ascii_digit()) && !pid.is_empty(),
        "{pid:?}"
    );
    assert!(process_alive(&pid), "the shell runs");

    // Grace expiry: nobody reattaches, the program is hung up and the session is gone.
    let session = second.session.clone();
    drop(second);
    tokio::time::sleep(Duration::from_secs(GRACE_SECONDS + 3)).await;
    assert!(!process_alive(&pid), "the shell outlived the grace period");
    let (s, body) = refused(&c, &c.key, &dev, &format!("session={session}")).await;
    assert_eq!(s, 404, "{body}");

    // Not running: a paused sandbox is 409 before the upgrade.
    let (s, body) = c
        .call(
            &c.key,
            Method::POST,
            &format!("/v1/sandboxes/{dev}/pause"),
            None,
        )
        .await;
    assert!(s == 200 || s == 202, "{s} {body}");
    c.wait_status(
        &SandboxId::parse(&dev).unwrap(),
        SandboxStatus::Paused,
        Duration::from_secs(30),
    )
    .await;
    let (s, body) = refused(&c, &c.key, &dev, "").await;
    assert_eq!(s, 409, "{body}");
    assert_eq!(body["error"]["code"], "conflict", "{body}");
}
