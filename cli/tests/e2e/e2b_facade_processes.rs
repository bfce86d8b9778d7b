//! E2B background processes across two API processes on one nats-server (as behind a load
//! balancer without affinity): a process started through one API's envd (`Start`, its stream
//! dropped at once) is listed, re-attached to (`Connect`) and killed (`SendSignal`) through
//! the other, which reaches the supervising API over NATS; the re-attached stream sees the
//! end. Another tenant's token on the pid finds nothing. Raw Connect-RPC requests as the SDKs
//! send them (SDK-FACADE recordings' shapes) on a `fake` pool, whose `sleep` runs no shell.
//! And a first command that makes the home a create of another process would have made.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};

use crate::harness::{free_port, Cluster, Opts};

/// A fake pool with streamed exec (the harness's `fake` pool has plain exec only), which the
/// processes resource runs processes over.
const STREAM_POOL: &str = r#"[[pools]]
name = "streams"
kind = "fake"
cost_per_cpu_hour = 1.0
[pools.settings]
ledger = "{ledger}.streams"
capabilities = ["exec", "exec.stream"]
"#;

/// A key of a new organization, bound to a new project of it.
async fn tenant_key(c: &Cluster, name: &str) -> String {
    let (s, org) = c
        .call(
            &c.key,
            Method::POST,
            "/v1/orgs",
            Some(json!({"name": name})),
        )
        .await;
    assert_eq!(s, 201, "{org}");
    let (s, prj) = c
        .call(
            &c.key,
            Method::POST,
            "/v1/projects",
            Some(json!({"orgId": org["id"], "name": "main"})),
        )
        .await;
    assert_eq!(s, 201, "{prj}");
    let scopes = ["sandboxes:read", "sandboxes:write", "sandboxes:exec"];
    let (s, key) = c
        .call(
            &c.key,
            Method::POST,
            "/v1/keys",
            Some(
                json!({"orgId": org["id"], "projectId": prj["id"], "name": name,
                        "scopes": scopes}),
            ),
        )
        .await;
    assert_eq!(s, 201, "{key}");
    key["key"].as_str().unwrap().to_owned()
}

/// An E2B sandbox created through `base`'s control plane: its id and envd token.
async fn create(http: &reqwest::Client, base: &str, key: &str) -> (String, String) {
    let resp = http
        .post(format!("{base}/e2b/v2/sandboxes"))
        .header("x-api-key", key)
        .json(&json!({"templateID": "base", "timeout": 300}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let v: Value = resp.json().await.unwrap();
    (
        v["sandboxID"].as_str().unwrap().to_owned(),
        v["envdAccessToken"].as_str().unwrap().to_owned(),
    )
}

fn envelope(msg: &Value) -> Vec<u8> {
    let json = serde_json::to_vec(msg).unwrap();
    let mut v = vec![0u8];
    v.extend_from_slice(&(json.len() as u32).to_be_bytes());
    v.extend_from_slice(&json);
    v
}

/// An envd request to `base` for sandbox `sbx` with `token`.
fn envd(
    http: &reqwest::Client,
    base: &str,
    sbx: &str,
    token: &str,
    method: &str,
) -> reqwest::RequestBuilder {
    http.post(format!("{base}/e2b/envd/process.Process/{method}"))
        .header("x-access-token", token)
        .header("e2b-sandbox-id", sbx)
        .header("e2b-sandbox-port", "49983")
        .header("connect-protocol-version", "1")
}

/// A unary call: status and JSON body.
async fn unary(req: reqwest::RequestBuilder, body: Value) -> (u16, Value) {
    let resp = req.json(&body).send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Reads a Connect stream's messages as `(flags, json)` until `n` arrived or it ends.
struct Messages {
    resp: reqwest::Response,
    buf: Vec<u8>,
}

impl Messages {
    async fn open(req: reqwest::RequestBuilder, msg: &Value) -> Messages {
        let resp = req
            .header("content-type", "application/connect+json")
            .header("keepalive-ping-interval", "1")
            .body(envelope(msg))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        Messages { resp, buf: vec![] }
    }

    /// The next message that is not a keepalive, within 60 s.
    async fn next(&mut self) -> Option<(u8, Value)> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if self.buf.len() >= 5 {
                let n = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]])
                    as usize;
                if self.buf.len() >= 5 + n {
                    let flags = self.buf[0];
                    let v: Value = serde_json::from_slice(&self.buf[5..5 + n]).unwrap();
                    self.buf.drain(..5 + n);
                    if v["event"].get("keepalive").is_some() {
                        continue;
                    }
                    return Some((flags, v));
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.resp.chunk()).await {
                Ok(Ok(Some(b))) => self.buf.extend_from_slice(&b),
                Ok(_) => return None,
                Err(_) => panic!("no message within 60 s"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_process_reattaches_and_is_killed_through_another_api_process() {
    let mut c = Cluster::new(Opts {
        more_pools: STREAM_POOL.into(),
        ..Opts::default()
    })
    .await;
    let listen2 = format!("127.0.0.1:{}", free_port());
    c.spawn("api", "api", &[]);
    c.spawn("api2", "api", &[("DIFFERENTLY_LISTEN", &listen2)]);
    c.spawn("scheduler", "scheduler", &[]);
    c.spawn("worker", "worker", &[]);
    c.wait_ready().await;
    c.deny_fake_pool().await;
    let key_a = tenant_key(&c, "e2b-proc-a").await;
    let key_b = tenant_key(&c, "e2b-proc-b").await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(90))
        .build()
        .unwrap();
    let one = c.url();
    let two = format!("http://{listen2}");
    let (sbx, token) = create(&http, &one, &key_a).await;
    // (Create answers once the sandbox runs.)
    let (sbx_b, token_b) = create(&http, &two, &key_b).await;

    // Started through the first API, its stream dropped after the start event.
    let start = json!({"process": {"cmd": "sleep", "args": ["600"]}, "stdin": false});
    let mut s = Messages::open(envd(&http, &one, &sbx, &token, "Start"), &start).await;
    let (flags, first) = s.next().await.expect("the start event");
    assert_eq!(flags, 0);
    let pid = first["event"]["start"]["pid"].as_u64().expect("a pid");
    drop(s);

    // Listed, re-attached to and killed through the second.
    let (st, listed) = unary(envd(&http, &two, &sbx, &token, "List"), json!({})).await;
    assert_eq!(st, 200, "{listed}");
    let mine: Vec<&Value> = listed["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["pid"] == pid)
        .collect();
    assert_eq!(
        mine,
        vec![
            &json!({"config": {"cmd": "sleep", "args": ["600"], "envs": {},
                               "cwd": "/home/user"}, "pid": pid})
        ],
        "{listed}"
    );
    let mut re = Messages::open(
        envd(&http, &two, &sbx, &token, "Connect"),
        &json!({"process": {"pid": pid}}),
    )
    .await;
    let (_, first) = re.next().await.expect("the start event");
    assert_eq!(first, json!({"event": {"start": {"pid": pid}}}));

    // Another tenant's token on the pid, through its own sandbox: not found, on either API.
    for base in [&one, &two] {
        let (st, b) = unary(
            envd(&http, base, &sbx_b, &token_b, "SendSignal"),
            json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}),
        )
        .await;
        assert_eq!((st, &b["code"]), (404, &json!("not_found")), "{b}");
        let (st, b) = unary(envd(&http, base, &sbx_b, &token_b, "List"), json!({})).await;
        assert_eq!((st, &b), (200, &json!({"processes": []})));
    }

    let (st, b) = unary(
        envd(&http, &two, &sbx, &token, "SendSignal"),
        json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}),
    )
    .await;
    assert_eq!(st, 200, "{b}\n{}", c.logs());
    let (flags, end) = re.next().await.expect("the end event");
    assert_eq!(flags, 0, "{end}");
    assert_eq!(end["event"]["end"]["exitCode"], 137, "{end}");
    assert_eq!(re.next().await, Some((2, json!({}))));
    let (_, listed) = unary(envd(&http, &one, &sbx, &token, "List"), json!({})).await;
    assert!(
        !listed["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["pid"] == pid),
        "{listed}"
    );
}

/// A devhost pool (it checks a command's `cwd`), and the first command of a sandbox whose
/// home this API process never made: one created through `/v1` and connected to through the
/// facade, as one created through another API process is. `Start` finds `/home/user`
/// missing, makes it and starts once more; the command runs there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_command_makes_a_home_no_create_of_this_process_made() {
    let root = tempfile::tempdir().expect("tempdir");
    let c = Cluster::started(Opts {
        more_pools: format!(
            "[[pools]]\nname = \"dev\"\nkind = \"devhost\"\n[pools.settings]\nroot = \"{}\"\nisolation = \"none\"\n",
            root.path().display()
        ),
        ..Opts::default()
    })
    .await;
    let (s, created) = c.create(json!({"capabilities": ["files"]})).await;
    assert_eq!(s, 202, "{created}");
    let sbx = created["id"].as_str().expect("id").to_owned();
    let id = differently_core::SandboxId::parse(&sbx).expect("sandbox id");
    c.wait_status(
        &id,
        differently_core::SandboxStatus::Running,
        Duration::from_secs(30),
    )
    .await;
    let list_home = format!("/v1/sandboxes/{sbx}/files/list?path=/home");
    let (s, home) = c.call(&c.key, Method::GET, &list_home, None).await;
    assert!(
        s == 404 || home["items"] == json!([]),
        "no home before: {s} {home}"
    );
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(90))
        .build()
        .unwrap();
    let base = c.url();
    let resp = http
        .post(format!("{base}/e2b/sandboxes/{sbx}/connect"))
        .header("x-api-key", &c.key)
        .json(&json!({"timeout": 300}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let token = resp.json::<Value>().await.unwrap()["envdAccessToken"]
        .as_str()
        .expect("a token")
        .to_owned();

    let start = json!({"process": {"cmd": "/bin/sh", "args": ["-c", "pwd; echo $HOME"]}});
    let mut s = Messages::open(envd(&http, &base, &sbx, &token, "Start"), &start).await;
    let mut out = Vec::new();
    let mut exit = None;
    while let Some((flags, m)) = s.next().await {
        if flags == 2 {
            assert_eq!(m, json!({}), "the end envelope carries no error");
            break;
        }
        let ev = &m["event"];
        if let Some(d) = ev["data"]["stdout"].as_str() {
            use base64::Engine;
            out.extend(base64::engine::general_purpose::STANDARD.decode(d).unwrap());
        }
        if let Some(e) = ev.get("end") {
            exit = e["exitCode"].as_i64().or(Some(0));
        }
    }
    assert_eq!(exit, Some(0), "{}", c.logs());
    // `isolation = "none"`: `pwd` is the host's path of the sandbox's `/home/user`.
    let out = String::from_utf8_lossy(&out);
    assert!(
        out.ends_with("/home/user\n/home/user\n") && out.contains(&sbx),
        "{out}"
    );
    let (s, home) = c.call(&c.key, Method::GET, &list_home, None).await;
    assert_eq!(s, 200, "{home}");
    assert_eq!(home["items"][0]["path"], "/home/user", "{home}");
}
