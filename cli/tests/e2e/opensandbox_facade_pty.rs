//! execd's PTY through the OpenSandbox facade, end to end on separate api, scheduler and worker
//! processes with a `devhost` pool (a real pseudo-terminal) and a `fake` pool without
//! `exec.pty`. Two clients: Differently's own `opensandbox` ADAPTER pointed at the facade (a
//! faithful execd PTY client: lifecycle endpoint → execd token → `POST /pty` → the socket), and
//! a raw WebSocket speaking execd's framing for what the adapter never sends (JSON `signal`,
//! a second socket, a takeover, the status and delete routes, refusals).

use std::time::Duration;

use bytes::Bytes;
use differently_adapters::opensandbox::config::{OpenSandboxConfig, Trust};
use differently_adapters::opensandbox::OpenSandboxAdapter;
use differently_adapters::{Adapter, InstanceRef, PtyInput, PtyRequest, PtySignal, PtySize};
use futures::{SinkExt, StreamExt};
use reqwest::Method;
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::dataplane::{cluster, running};
use crate::harness::{Cluster, Opts};

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

const TOKEN: &str = "x-differently-execd-token";

/// The execd token the facade's endpoint answer carries for sandbox `id` (as `key`).
async fn execd_token(c: &Cluster, key: &str, id: &str) -> String {
    let resp = reqwest::Client::new()
        .get(format!(
            "{}/opensandbox/v1/sandboxes/{id}/endpoints/44772",
            c.url()
        ))
        .header("OPEN-SANDBOX-API-KEY", key)
        .send()
        .await
        .expect("endpoint");
    assert_eq!(resp.status().as_u16(), 200);
    let ep: Value = resp.json().await.expect("json");
    ep["headers"][TOKEN]
        .as_str()
        .unwrap_or_else(|| panic!("no execd token in {ep}"))
        .to_owned()
}

/// One execd HTTP call on sandbox `id`; `auth` is a header pair (or none).
async fn execd(
    c: &Cluster,
    auth: Option<(&str, &str)>,
    method: Method,
    id: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut r =
        reqwest::Client::new().request(method, format!("{}/opensandbox/execd/{id}{path}", c.url()));
    if let Some((k, v)) = auth {
        r = r.header(k, v);
    }
    if let Some(b) = body {
        r = r.json(&b);
    }
    let resp = r.send().await.expect("execd call");
    let s = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    (s, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Opens `GET /pty/{sid}/ws{query}`; the handshake's status and body when refused.
async fn connect(
    c: &Cluster,
    token: &str,
    id: &str,
    sid: &str,
    query: &str,
) -> Result<Socket, (u16, Value)> {
    let url = format!(
        "ws://127.0.0.1:{}/opensandbox/execd/{id}/pty/{sid}/ws{query}",
        c.port
    );
    let mut req = url.into_client_request().expect("ws request");
    req.headers_mut()
        .insert(TOKEN, HeaderValue::from_str(token).expect("header"));
    match tokio_tungstenite::connect_async(req).await {
        Ok((ws, _)) => Ok(ws),
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

/// A raw execd terminal client: the socket and the output seen so far.
struct Term {
    ws: Socket,
    seen: String,
}

impl Term {
    async fn next(&mut self) -> Option<Message> {
        match tokio::time::timeout(Duration::from_secs(15), self.ws.next()).await {
            Ok(Some(Ok(m))) => Some(m),
            Ok(Some(Err(_)) | None) => None,
            Err(_) => panic!("no frame within 15 s; saw {:?}", self.seen),
        }
    }

    /// Reads frames until a JSON frame of `kind`; output on the way is kept.
    async fn json(&mut self, kind: &str) -> Value {
        loop {
            match self.next().await {
                Some(Message::Text(t)) => {
                    let v: Value = serde_json::from_str(t.as_str()).expect("json frame");
                    if v["type"] == kind {
                        return v;
                    }
                    assert_ne!(v["type"], "error", "{v}; saw {:?}", self.seen);
                }
                Some(Message::Binary(b)) => self.output(&b),
                Some(_) => {}
                None => panic!("socket ended before a {kind} frame; saw {:?}", self.seen),
            }
        }
    }

    fn output(&mut self, b: &[u8]) {
        let payload = match b.first() {
            Some(0x01 | 0x02) => &b[1..],
            Some(0x03) => {
                assert!(b.len() >= 9, "a replay frame has an offset");
                &b[9..]
            }
            other => panic!("unknown binary frame type {other:?}"),
        };
        self.seen.push_str(&String::from_utf8_lossy(payload));
    }

    /// Reads output until it contains `want`, then forgets what came up to it.
    async fn expect(&mut self, want: &str) {
        while !self.seen.contains(want) {
            match self.next().await {
                Some(Message::Binary(b)) => self.output(&b),
                Some(Message::Text(t)) => panic!("{t} before {want:?}; saw {:?}", self.seen),
                Some(_) => {}
                None => panic!("socket ended before {want:?}; saw {:?}", self.seen),
            }
        }
        let at = self.seen.find(want).unwrap_or(0);
        self.seen.drain(..at + want.len());
    }

    async fn stdin(&mut self, text: &str) {
        let mut f = vec![0x00];
        f.extend_from_slice(text.as_bytes());
        self.ws
            .send(Message::Binary(f.into()))
            .await
            .expect("stdin");
    }

    async fn control(&mut self, v: Value) {
        self.ws
            .send(Message::Text(v.to_string().into()))
            .await
            .expect("control");
    }

    /// The close frame's code, reading past anything before it.
    async fn closed_with(&mut self) -> Option<u16> {
        loop {
            match self.next().await {
                Some(Message::Close(f)) => return f.map(|f| u16::from(f.code)),
                Some(Message::Binary(b)) => self.output(&b),
                Some(_) => {}
                None => return None,
            }
        }
    }
}

async fn open(c: &Cluster, token: &str, id: &str, sid: &str, query: &str) -> Term {
    match connect(c, token, id, sid, query).await {
        Ok(ws) => Term {
            ws,
            seen: String::new(),
        },
        Err((s, b)) => panic!("pty socket answered {s}: {b}\n{}", c.logs()),
    }
}

/// What the adapter's terminal wrote, read up to what a test waits for.
struct Output<'a> {
    rx: &'a mut mpsc::Receiver<Bytes>,
    seen: String,
}

impl Output<'_> {
    async fn expect(&mut self, want: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        while !self.seen.contains(want) {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(b)) => self.seen.push_str(&String::from_utf8_lossy(&b)),
                Ok(None) => panic!("terminal ended before {want:?}; saw {:?}", self.seen),
                Err(_) => panic!("no {want:?} within 15 s; saw {:?}", self.seen),
            }
        }
        let at = self.seen.find(want).unwrap_or(0);
        self.seen.drain(..at + want.len());
    }
}

/// The `opensandbox` adapter with the facade as its OpenSandbox server (direct endpoints: the
/// execd token, never the key, on every execd call).
fn adapter_on_the_facade(c: &Cluster) -> OpenSandboxAdapter {
    const KEY_ENV: &str = "DIFFERENTLY_TEST_FACADE_PTY_KEY";
    std::env::set_var(KEY_ENV, &c.key);
    OpenSandboxAdapter::new(OpenSandboxConfig {
        api_url: Some(format!("{}/opensandbox/v1", c.url())),
        trust: Some(Trust::Private),
        use_server_proxy: Some(false),
        api_key_env: Some(KEY_ENV.into()),
        ..OpenSandboxConfig::default()
    })
    .expect("an opensandbox adapter on the facade")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_opensandbox_adapter_drives_a_devhost_terminal_through_the_facade() {
    let c = cluster(Opts::default()).await;
    let id = running(&c, json!({"capabilities": ["exec.pty"]})).await;
    let adapter = adapter_on_the_facade(&c);
    let at = InstanceRef {
        sandbox_id: id.clone(),
        backend_ref: id.to_string(),
    };
    let req = PtyRequest {
        command: vec!["sh".into()],
        env: [("GREETING".to_owned(), "hi".to_owned())].into(),
        cwd: None,
        size: PtySize {
            cols: 100,
            rows: 30,
        },
    };
    let (in_tx, in_rx) = mpsc::channel(8);
    let (out_tx, mut out_rx) = mpsc::channel::<Bytes>(64);
    let run = tokio::spawn(async move { adapter.pty(&at, &req, in_rx, out_tx).await });
    let mut out = Output {
        rx: &mut out_rx,
        seen: String::new(),
    };
    let line = |s: &str| PtyInput::Stdin(Bytes::from(format!("{s}\n")));
    // Env through the command line, output, and the size the adapter sent after `connected`.
    in_tx.send(line("echo $GREETING-there")).await.unwrap();
    out.expect("hi-there").await;
    in_tx.send(line("stty size")).await.unwrap();
    out.expect("30 100").await;
    in_tx
        .send(PtyInput::Resize(PtySize {
            cols: 120,
            rows: 40,
        }))
        .await
        .unwrap();
    in_tx.send(line("stty size")).await.unwrap();
    out.expect("40 120").await;
    // INT (the adapter types ^C) interrupts the foreground job, not the shell.
    in_tx
        .send(line("sleep 30; echo not-interrupted"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    in_tx.send(PtyInput::Signal(PtySignal::Int)).await.unwrap();
    in_tx.send(line("echo after-int")).await.unwrap();
    out.expect("after-int\r\n").await;
    assert!(!out.seen.contains("not-interrupted"), "{:?}", out.seen);
    in_tx.send(line("exit 7")).await.unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(15), run)
        .await
        .expect("the terminal ends")
        .expect("task")
        .expect("the adapter's pty call through the facade");
    assert_eq!(exit.exit_code, 7);

    // The open was audited as /v1's terminal is, under the key the token names.
    let records = crate::audit::records_of(&c, &id, "sandbox.pty").await;
    assert_eq!(records.len(), 1, "one sandbox.pty record: {records:?}");
    assert!(
        !Value::Array(records).to_string().contains("hi"),
        "the env value stays out of the audit record"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn execd_pty_framing_signals_sessions_and_refusals_through_the_facade() {
    let c = cluster(Opts::default()).await;
    let id = running(&c, json!({"capabilities": ["exec.pty"]}))
        .await
        .to_string();
    let token = execd_token(&c, &c.key, &id).await;
    let auth = Some((TOKEN, token.as_str()));

    // Refusals before any session: no token, a tampered one, another tenant, a pool without
    // exec.pty.
    let body = json!({"command": "echo hi"});
    let (s, e) = execd(&c, None, Method::POST, &id, "/pty", Some(body.clone())).await;
    assert_eq!(s, 401, "{e}");
    let bad = format!("{token}x");
    let (s, e) = execd(
        &c,
        Some((TOKEN, &bad)),
        Method::POST,
        &id,
        "/pty",
        Some(body.clone()),
    )
    .await;
    assert_eq!(s, 401, "a tampered token: {e}");
    let other = crate::tenancy::tenant(&c, "osb-pty-b").await;
    let (s, e) = execd(
        &c,
        Some(("OPEN-SANDBOX-API-KEY", &other.key)),
        Method::POST,
        &id,
        "/pty",
        Some(body.clone()),
    )
    .await;
    assert_eq!(s, 404, "another tenant's sandbox: {e}");
    assert_eq!(e["code"], "DIFFERENTLY::SANDBOX_NOT_FOUND", "{e}");
    let fake = running(&c, json!({"capabilities": ["lifecycle.stop"]}))
        .await
        .to_string();
    let fake_token = execd_token(&c, &c.key, &fake).await;
    let (s, e) = execd(
        &c,
        Some((TOKEN, &fake_token)),
        Method::POST,
        &fake,
        "/pty",
        Some(body.clone()),
    )
    .await;
    assert_eq!(s, 501, "{e}");
    assert_eq!(e["code"], "NOT_SUPPORTED", "{e}");
    assert!(
        e["message"].as_str().unwrap_or("").contains("exec.pty"),
        "{e}"
    );
    // A token is for its own sandbox only.
    let (s, e) = execd(
        &c,
        Some((TOKEN, &fake_token)),
        Method::POST,
        &id,
        "/pty",
        Some(body),
    )
    .await;
    assert_eq!(s, 401, "another sandbox's token: {e}");

    // A session: bash runs the command line (the `[[ ]]` is bash's), reads stdin, sees a
    // resize, and a JSON SIGINT reaches it.
    let script = "[[ -n $BASH_VERSION ]] && echo is-bash; read a; echo \"got:$a\"; read b; \
                  stty size; trap 'echo caught-int; exit 5' INT; echo waiting; \
                  while :; do sleep 0.1; done";
    let (s, created) = execd(
        &c,
        auth,
        Method::POST,
        &id,
        "/pty",
        Some(json!({"cwd": "/", "command": script})),
    )
    .await;
    assert_eq!(s, 201, "{created}");
    let sid = created["session_id"]
        .as_str()
        .expect("session_id")
        .to_owned();
    let (s, st) = execd(&c, auth, Method::GET, &id, &format!("/pty/{sid}"), None).await;
    assert_eq!(s, 200, "{st}");
    assert_eq!(
        st["running"], false,
        "nothing runs before the first socket: {st}"
    );
    let (s, e) = execd(&c, auth, Method::GET, &id, "/pty/pty_nope", None).await;
    assert_eq!(s, 404, "{e}");
    assert_eq!(e["code"], "CONTEXT_NOT_FOUND", "{e}");
    match connect(&c, &token, &id, "pty_nope", "").await {
        Err((404, e)) => assert_eq!(e["code"], "CONTEXT_NOT_FOUND", "{e}"),
        Err(other) => panic!("unknown session socket: {other:?}"),
        Ok(_) => panic!("an unknown session was upgraded"),
    }
    // Another sandbox's token cannot reach this session, nor another tenant's key.
    match connect(&c, &fake_token, &id, &sid, "").await {
        Err((401, _)) => {}
        other => panic!("another sandbox's token on the socket: {:?}", other.err()),
    }

    let mut t = open(&c, &token, &id, &sid, "").await;
    let hello = t.json("connected").await;
    assert_eq!(hello["session_id"], sid.as_str(), "{hello}");
    assert_eq!(hello["mode"], "pty", "{hello}");
    t.expect("is-bash").await;
    let (s, st) = execd(&c, auth, Method::GET, &id, &format!("/pty/{sid}"), None).await;
    assert_eq!(s, 200, "{st}");
    assert_eq!(st["running"], true, "{st}");
    // A second socket is refused while this one holds the session.
    match connect(&c, &token, &id, &sid, "").await {
        Err((409, e)) => assert_eq!(e["code"], "ALREADY_CONNECTED", "{e}"),
        Err(other) => panic!("second socket: {other:?}"),
        Ok(_) => panic!("a second socket was upgraded without takeover"),
    }
    t.stdin("hello pty\n").await;
    t.expect("got:hello pty").await;
    t.control(json!({"type": "resize", "cols": 91, "rows": 33}))
        .await;
    t.stdin("\n").await;
    t.expect("33 91").await;
    t.expect("waiting").await;
    // A ping is answered.
    t.control(json!({"type": "ping"})).await;
    t.json("pong").await;

    // Takeover: the new socket gets the session, the old one is closed with 4001.
    let mut t2 = open(&c, &token, &id, &sid, "?takeover=1").await;
    t2.json("connected").await;
    assert_eq!(t.closed_with().await, Some(4001), "the taken-over socket");
    t2.control(json!({"type": "signal", "signal": "SIGINT"}))
        .await;
    let exit = t2.json("exit").await;
    assert!(t2.seen.contains("caught-int"), "{:?}", t2.seen);
    assert_eq!(exit["exit_code"], 5, "{exit}");
    assert_eq!(t2.closed_with().await, Some(1000));
    let (s, st) = execd(&c, auth, Method::GET, &id, &format!("/pty/{sid}"), None).await;
    assert_eq!(s, 200, "{st}");
    assert_eq!(st["running"], false, "{st}");
    assert!(st["output_offset"].as_u64().unwrap_or(0) > 0, "{st}");
    // Delete forgets it.
    let (s, e) = execd(&c, auth, Method::DELETE, &id, &format!("/pty/{sid}"), None).await;
    assert_eq!(s, 200, "{e}");
    let (s, e) = execd(&c, auth, Method::GET, &id, &format!("/pty/{sid}"), None).await;
    assert_eq!(s, 404, "{e}");

    // A session deleted while its program runs: the socket sees the program end.
    let (s, created) = execd(
        &c,
        auth,
        Method::POST,
        &id,
        "/pty",
        Some(json!({"command": "echo up; sleep 60"})),
    )
    .await;
    assert_eq!(s, 201, "{created}");
    let sid = created["session_id"].as_str().unwrap().to_owned();
    let mut t = open(&c, &token, &id, &sid, "").await;
    t.json("connected").await;
    t.expect("up").await;
    let (s, e) = execd(&c, auth, Method::DELETE, &id, &format!("/pty/{sid}"), None).await;
    assert_eq!(s, 200, "{e}");
    // execd closes the socket of a deleted session (no exit frame is promised).
    tokio::time::timeout(Duration::from_secs(15), t.closed_with())
        .await
        .expect("the socket closes after delete");
    let (s, e) = execd(&c, auth, Method::GET, &id, &format!("/pty/{sid}"), None).await;
    assert_eq!(s, 404, "{e}");
}
