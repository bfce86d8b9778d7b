//! Recorded replays: every exchange recorded against a real OpenSandbox 1.1.1 server and a real
//! execd (`adapters/tests/fixtures/opensandbox/opensandbox-server-1.1.1-docker.jsonl`; its
//! origin and how to record it again are in that folder's README) is sent, in recorded order, to a fresh fake
//! (`Variant::Real`, Docker), and the fake's answer must match the recorded one in status,
//! content-type family, presence of the headers that matter (`HEADERS_THAT_MATTER`: Location,
//! Deprecation, Content-Range, Accept-Ranges, Content-Disposition, the log cursor), JSON body
//! shape (same keys recursively, same JSON types, equal error `code`s, arrays empty on both
//! sides or alike in their first item; ids, timestamps, ports and other values ignored; a
//! non-JSON body only empty or not) and event-stream
//! framing (NDJSON vs `data:` SSE, blank-line separators, the sequence of event types and their
//! keys). So the fake cannot drift from the real server unnoticed.
//!
//! Ids are mapped as the recording learned them: a sandbox/snapshot id a recorded response
//! carried becomes the id the fake answered in the same place, a command id from the stream's
//! `init` event likewise, and the host port of a sandbox's execd (learned from its endpoint
//! answer) becomes the fake's execd base. `/tmp` in requests becomes a temp dir (the fake's files
//! are host files), and timestamps in request bodies are moved forward by (now − recording time).
//!
//! Groups: `sdk-flow-server-proxy` and `sdk-flow-direct` create their own sandbox, so each runs
//! on its own fresh fake. `lifecycle`, `server-proxy`, `execd-direct` and `snapshot` share
//! sandboxes (the proxy and execd cases use the sandbox `lifecycle/create` made), so they run
//! interleaved, in recorded order, on one fresh fake. Where the recording waited (a status
//! asked for after a background command had ended), the replay waits until the fake's has. A
//! request the recording sent while a stream that did not complete was still open (the next
//! exchange names the stream's command: its interrupt) is sent once the fake's stream has got
//! as far as the recorded one had, and the stream is read on after it.
//!
//! Allowed nondeterminism (documented in the recordings' SUMMARY): the order of stdout and
//! stderr events against each other, `ping` frames (timer-driven: the real execd sometimes
//! sends none before a quick command's end, sometimes one after it), anything after the
//! terminal `execution_complete`/`error` event (a late `ping`, the ~1 s before close), and
//! `execution_time` (omitted when 0 ms). A stream whose recorded client hung up
//! (`clientAborted`) is dropped by the replay once the recorded events have arrived. The status
//! requests the recording sent 1, 4 and 8 s after such a hang-up are sent at once (their shape
//! is checked, `running: true`); that a hang-up does not end a command on real execd is what
//! `cases::a_caller_who_goes_away_leaves_no_command_running` holds the fake and adapter to.
//!
//! Exchanges excluded (by case label; #203 by number), with why:
//!
//! | case | why |
//! |---|---|
//! | `*/metrics-watch*` | the client hung up on a 2 s-interval stream of host numbers (`{json}\n` frames) that the fake does not serve; nothing in Differently reads it |
//! | `server-proxy/command-client-disconnect` #203 | right after a `/metrics/watch` cut, real execd itself ended this command with `signal: broken pipe` while the client was still connected (a quirk of that sequence); the other disconnects (#215, #221, #223, #230, #234) are replayed, with the hang-up made when the recorded events have arrived |
//! | `server-proxy/command-slow-pings`, `execd-direct/command-slow-pings` | exist to show the 3 s ping timer; each costs 3+ s for no shape the other streams lack (pings are not compared) |
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use base64::Engine;
use futures::StreamExt;
use serde_json::Value;

use crate::fake_server::{FakeRuntime, FakeServer, Variant};
use crate::KEY;

const RECORDING: &str = "opensandbox-server-1.1.1-docker.jsonl";
const RECORDED_API: &str = "127.0.0.1:8090";

/// Case labels (after `group/`) left out, with the reason in the module doc's table.
fn excluded(ex: &Value) -> bool {
    let case = ex["case"].as_str().unwrap_or("");
    let label = case.split_once('/').map_or(case, |(_, l)| l);
    // The one disconnect execd itself ended (broken pipe, right after a watch cut).
    ex["n"] == 203 || label.starts_with("metrics-watch") || label == "command-slow-pings"
}

/// Headers a client acts on: each must be present on the fake's answer exactly when it was on
/// the recorded one.
const HEADERS_THAT_MATTER: &[&str] = &[
    "location",
    "deprecation",
    "content-range",
    "accept-ranges",
    "content-disposition",
    "execd-commands-tail-cursor",
];

fn recording_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/opensandbox")
        .join(RECORDING)
}

/// The recording's header and exchanges; fails naming the path when it is missing.
pub fn load() -> (Value, Vec<Value>) {
    let path = recording_path();
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "the recorded OpenSandbox exchanges are missing: {} ({e}); they are part of the \
             repository (adapters/tests/fixtures/opensandbox/{RECORDING}): restore the file",
            path.display()
        )
    });
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Value = serde_json::from_str(lines.next().expect("header line")).unwrap();
    let ex = lines.map(|l| serde_json::from_str(l).unwrap()).collect();
    (header, ex)
}

fn group(ex: &Value) -> &str {
    ex["case"]
        .as_str()
        .unwrap_or("")
        .split('/')
        .next()
        .unwrap_or("")
}

/// Text or `{base64}` body as bytes.
fn body_bytes(v: &Value) -> Vec<u8> {
    match v {
        Value::String(s) => s.as_bytes().to_vec(),
        Value::Object(o) => base64::engine::general_purpose::STANDARD
            .decode(o["base64"].as_str().unwrap_or(""))
            .unwrap(),
        _ => Vec::new(),
    }
}

fn replace_bytes(hay: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    if from.is_empty() {
        return hay.to_vec();
    }
    let mut out = Vec::with_capacity(hay.len());
    let mut i = 0;
    while i < hay.len() {
        if hay[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(hay[i]);
            i += 1;
        }
    }
    out
}

/// One replay: the fake, what was learned, and what differed.
struct Replay {
    fake: FakeServer,
    client: reqwest::Client,
    /// recorded id → fake id
    ids: BTreeMap<String, String>,
    /// recorded execd `host:port` → fake `host:port/{id}`
    execd: HashMap<String, String>,
    tmp: tempfile::TempDir,
    shift: chrono::Duration,
    diffs: Vec<String>,
    replayed: usize,
}

impl Replay {
    async fn new(shift: chrono::Duration) -> Replay {
        let fake = FakeServer::start(Variant::Real, FakeRuntime::Docker, KEY).await;
        Replay {
            fake,
            client: reqwest::Client::builder().no_proxy().build().unwrap(),
            ids: BTreeMap::new(),
            execd: HashMap::new(),
            tmp: tempfile::tempdir().unwrap(),
            shift,
            diffs: Vec::new(),
            replayed: 0,
        }
    }

    fn map_text(&self, s: &str) -> String {
        let mut out = s.to_owned();
        for (rec, fake) in &self.ids {
            out = out.replace(rec, fake);
        }
        out
    }

    fn map_bytes(&self, b: &[u8]) -> Vec<u8> {
        let mut out = b.to_vec();
        for (rec, fake) in &self.ids {
            out = replace_bytes(&out, rec.as_bytes(), fake.as_bytes());
        }
        let tmp = self.tmp.path().to_string_lossy().into_owned();
        replace_bytes(&out, b"/tmp", tmp.as_bytes())
    }

    fn url(&self, ex: &Value) -> Option<String> {
        let url = ex["url"].as_str()?;
        let rest = url.strip_prefix("http://")?;
        let (host, path) = rest.split_once('/').map_or((rest, ""), |(h, p)| (h, p));
        let path = format!("/{path}");
        let tmp = self.tmp.path().to_string_lossy().into_owned();
        let path = self
            .map_text(&path)
            .replace("%2Ftmp", &tmp.replace('/', "%2F"));
        if host == RECORDED_API {
            let api = self.fake.api_url();
            let origin = api.trim_end_matches("/v1");
            return Some(format!("{origin}{path}"));
        }
        let base = self.execd.get(host)?;
        let rest = path.strip_prefix("/proxy/44772").unwrap_or(&path);
        Some(format!("http://{base}/proxy/44772{rest}"))
    }

    /// Moves RFC 3339 timestamps in a JSON request body forward by `shift`.
    fn shift_times(&self, v: &mut Value) {
        match v {
            Value::String(s) => {
                if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
                    let t = t.with_timezone(&chrono::Utc) + self.shift;
                    *s = t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true);
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|x| self.shift_times(x)),
            Value::Object(o) => o.values_mut().for_each(|x| self.shift_times(x)),
            _ => {}
        }
    }

    /// Replays `ex`; true when it also replayed `next` (sent while `ex`'s stream was open).
    async fn exchange(&mut self, ex: &Value, next: Option<&Value>) -> bool {
        let mut consumed = false;
        let n = ex["n"].as_u64().unwrap_or(0);
        let case = ex["case"].as_str().unwrap_or("").to_owned();
        let Some(url) = self.url(ex) else {
            self.diffs
                .push(format!("#{n} {case}: no fake address for {}", ex["url"]));
            return false;
        };
        let method =
            reqwest::Method::from_bytes(ex["method"].as_str().unwrap().as_bytes()).unwrap();
        let mut body = self.map_bytes(&body_bytes(&ex["requestBody"]));
        if let Ok(mut v) = serde_json::from_slice::<Value>(&body) {
            self.shift_times(&mut v);
            body = serde_json::to_vec(&v).unwrap();
        }
        self.wait_like_the_recording(ex, &url).await;
        let mut req = self.client.request(method, &url);
        if let Some(h) = ex["requestHeaders"].as_object() {
            for (k, v) in h {
                let lk = k.to_ascii_lowercase();
                if [
                    "host",
                    "content-length",
                    "connection",
                    "accept-encoding",
                    "transfer-encoding",
                ]
                .contains(&lk.as_str())
                {
                    continue;
                }
                let v = v.as_str().unwrap_or("").replace("<api-key>", KEY);
                req = req.header(k.as_str(), v);
            }
        }
        if !body.is_empty() {
            req = req.body(body);
        }
        let resp = match tokio::time::timeout(Duration::from_secs(15), req.send()).await {
            Ok(Ok(r)) => r,
            other => {
                self.diffs
                    .push(format!("#{n} {case}: request failed: {other:?}"));
                return false;
            }
        };
        self.replayed += 1;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let rec_headers: BTreeMap<String, String> = ex["responseHeaders"]
            .as_object()
            .map(|o| {
                o.iter()
                    .map(|(k, v)| (k.to_ascii_lowercase(), v.as_str().unwrap_or("").to_owned()))
                    .collect()
            })
            .unwrap_or_default();
        let family = |ct: Option<&str>| {
            ct.map(|c| {
                c.split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase()
            })
        };
        let rec_ct = family(rec_headers.get("content-type").map(String::as_str));
        let fake_ct = family(headers.get("content-type").and_then(|v| v.to_str().ok()));
        let mut d = Vec::new();
        let rec_status = ex["status"].as_u64().unwrap_or(0) as u16;
        if status != rec_status {
            d.push(format!("status {status}, recorded {rec_status}"));
        }
        if rec_ct != fake_ct {
            d.push(format!("content-type {fake_ct:?}, recorded {rec_ct:?}"));
        }
        for h in HEADERS_THAT_MATTER {
            if rec_headers.contains_key(*h) != headers.contains_key(*h) {
                d.push(format!(
                    "header {h}: fake {:?}, recorded {:?}",
                    headers.get(*h),
                    rec_headers.get(*h)
                ));
            }
        }
        let rec_body = body_bytes(&ex["responseBody"]);
        if rec_ct.as_deref() == Some("text/event-stream") {
            let mut stream: Body = Box::pin(resp.bytes_stream());
            let mut fake_body = Vec::new();
            // A request the recording sent while this stream was open (it names the stream's
            // command, e.g. its interrupt): once the fake's stream has got as far as the
            // recorded one had, send it, then read the stream on.
            let rec_evs = frames(&rec_body).map(|f| f.1).unwrap_or_default();
            let rec_cmd = rec_evs
                .first()
                .filter(|e| e["type"] == "init")
                .and_then(|e| e["text"].as_str())
                .map(str::to_owned);
            let overlap = next.filter(|nx| {
                ex["clientAborted"] != true
                    && rec_cmd
                        .as_ref()
                        .is_some_and(|c| nx["url"].as_str().unwrap_or("").contains(c.as_str()))
                    && !rec_evs
                        .iter()
                        .any(|e| is_terminal(e) && e["type"] == "execution_complete")
            });
            if let Some(nx) = overlap {
                let want = progress(&rec_evs);
                read_until(&mut stream, &mut fake_body, |evs| progress(evs) >= want).await;
                if let (Ok((_, fev)), true) = (frames(&fake_body), !rec_evs.is_empty()) {
                    self.learn_stream(&rec_evs, &fev);
                }
                Box::pin(self.exchange(nx, None)).await;
                consumed = true;
            }
            if ex["clientAborted"] == true {
                // The recorded client hung up once these events had arrived: so does the
                // replay (the stream is dropped), and what follows shows what execd did then.
                let want = progress(&rec_evs);
                read_until(&mut stream, &mut fake_body, |evs| progress(evs) >= want).await;
                drop(stream);
            } else {
                read_stream(&mut stream, &mut fake_body).await;
            }
            let rec = frames(&rec_body);
            let fake = frames(&fake_body);
            match (rec, fake) {
                (Ok((rk, rev)), Ok((fk, fev))) => {
                    if rk != fk {
                        d.push(format!("stream framing {fk}, recorded {rk}"));
                    }
                    self.learn_stream(&rev, &fev);
                    let (r, f) = (normalize(&rev), normalize(&fev));
                    if r != f {
                        d.push(format!("events {f:?}, recorded {r:?}"));
                    }
                }
                (r, f) => d.push(format!("stream unparsable: recorded {r:?}, fake {f:?}")),
            }
        } else {
            // The fake's paths are under the temp dir standing for `/tmp`.
            let tmp = self.tmp.path().to_string_lossy().into_owned();
            let fake_body = resp.bytes().await.unwrap_or_default().to_vec();
            let fake_body = replace_bytes(&fake_body, tmp.as_bytes(), b"/tmp");
            let rec_json = serde_json::from_slice::<Value>(&rec_body);
            let fake_json = serde_json::from_slice::<Value>(&fake_body);
            match (rec_json, fake_json) {
                (Ok(r), Ok(f)) => {
                    self.learn(&r, &f);
                    shape_diff("$", &r, &f, &mut d);
                }
                (Ok(_), Err(_)) => d.push(format!(
                    "body not JSON: {:?}",
                    String::from_utf8_lossy(&fake_body)
                )),
                (Err(_), Ok(f)) if !rec_body.is_empty() => {
                    d.push(format!("body is JSON {f}, recorded text"))
                }
                _ => {
                    if rec_body.is_empty() != fake_body.is_empty() {
                        d.push(format!(
                            "body emptiness differs: fake {:?}, recorded {:?}",
                            String::from_utf8_lossy(&fake_body),
                            String::from_utf8_lossy(&rec_body)
                        ));
                    }
                }
            }
        }
        for x in d {
            self.diffs.push(format!("#{n} {case}: {x}"));
        }
        consumed
    }

    /// Where the recording waited for a background command (a status asked for once it had
    /// ended, `running: false`; its log asked for once it had printed), wait until the fake's
    /// command is there too (at most 5 s; both requests are idempotent GETs).
    async fn wait_like_the_recording(&self, ex: &Value, url: &str) {
        let rec = body_bytes(&ex["responseBody"]);
        let get = ex["method"] == "GET";
        let finished = get
            && url.contains("/command/status/")
            && serde_json::from_slice::<Value>(&rec).is_ok_and(|v| v["running"] == false);
        let printed = get && url.contains("/logs") && ex["status"] == 200 && !rec.is_empty();
        if !finished && !printed {
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            let there = match self.client.get(url).send().await {
                Ok(r) => {
                    let b = r.bytes().await.unwrap_or_default();
                    if finished {
                        serde_json::from_slice::<Value>(&b).is_ok_and(|v| v["running"] == false)
                    } else {
                        !b.is_empty()
                    }
                }
                Err(_) => true,
            };
            if there {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Learns ids from a recorded and a fake JSON answer to the same request.
    fn learn(&mut self, rec: &Value, fake: &Value) {
        match (rec, fake) {
            (Value::Object(r), Value::Object(f)) => {
                for (k, rv) in r {
                    let Some(fv) = f.get(k) else { continue };
                    match (k.as_str(), rv, fv) {
                        ("id" | "sandboxId" | "snapshotId", Value::String(a), Value::String(b)) => {
                            // The first answer naming an id (its create) teaches it; lists may
                            // order differently.
                            if a != b {
                                self.ids.entry(a.clone()).or_insert_with(|| b.clone());
                            }
                        }
                        ("endpoint", Value::String(a), Value::String(b)) => {
                            if let (Some((rh, rp)), Some(fb)) =
                                (a.split_once('/'), b.strip_suffix("/proxy/44772"))
                            {
                                if rh != RECORDED_API && rp == "proxy/44772" {
                                    self.execd.insert(rh.to_owned(), fb.to_owned());
                                }
                            }
                        }
                        _ => self.learn(rv, fv),
                    }
                }
            }
            (Value::Array(r), Value::Array(f)) if r.len() == f.len() => {
                r.iter().zip(f).for_each(|(a, b)| self.learn(a, b));
            }
            _ => {}
        }
    }

    fn learn_stream(&mut self, rec: &[Value], fake: &[Value]) {
        if let (Some(r), Some(f)) = (rec.first(), fake.first()) {
            if let (Some("init"), Some(a), Some(b)) =
                (r["type"].as_str(), r["text"].as_str(), f["text"].as_str())
            {
                self.ids.entry(a.to_owned()).or_insert_with(|| b.to_owned());
            }
        }
    }
}

fn is_terminal(v: &Value) -> bool {
    matches!(v["type"].as_str(), Some("execution_complete" | "error"))
}

/// Reads an event stream until its terminal event (what comes after it is timing, not shape),
/// its end, or 15 s.
async fn read_stream(s: &mut Body, buf: &mut Vec<u8>) {
    read_until(s, buf, |evs| evs.iter().any(is_terminal)).await
}

type Body = std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>;

/// Reads whole frames until `enough` says so, the stream ends, or 15 s pass.
async fn read_until(s: &mut Body, buf: &mut Vec<u8>, enough: impl Fn(&[Value]) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        if buf.ends_with(b"\n\n") {
            if let Ok((_, evs)) = frames(buf) {
                if enough(&evs) {
                    return;
                }
            }
        }
        match tokio::time::timeout_at(deadline, s.next()).await {
            Ok(Some(Ok(chunk))) => buf.extend_from_slice(&chunk),
            _ => return,
        }
    }
}

/// Events other than pings and the end: what must have arrived before a request the
/// recording sent while the stream was still open.
fn progress(evs: &[Value]) -> usize {
    evs.iter()
        .filter(|e| e["type"] != "ping" && !is_terminal(e))
        .count()
}

/// Splits an event stream into its framing kind and its events.
fn frames(body: &[u8]) -> Result<(&'static str, Vec<Value>), String> {
    let text = String::from_utf8_lossy(body);
    let mut kinds = BTreeSet::new();
    let mut evs = Vec::new();
    for f in text.split("\n\n").filter(|f| !f.is_empty()) {
        let (kind, json) = match f.strip_prefix("data:") {
            Some(rest) => ("sse data:", rest.trim_start()),
            None => ("bare JSON + blank line", f),
        };
        kinds.insert(kind);
        let v: Value = serde_json::from_str(json).map_err(|e| format!("frame {f:?}: {e}"))?;
        evs.push(v);
        if is_terminal(evs.last().unwrap()) {
            break;
        }
    }
    match kinds.len() {
        0 | 1 => Ok((kinds.into_iter().next().unwrap_or("empty"), evs)),
        _ => Err(format!("mixed framing {kinds:?}")),
    }
}

/// Events as `type{keys}`, with the allowed nondeterminism taken out.
fn normalize(evs: &[Value]) -> Vec<String> {
    let mut out: Vec<(String, String)> = Vec::new();
    for e in evs {
        let ty = e["type"].as_str().unwrap_or("?").to_owned();
        if ty == "ping" {
            continue;
        }
        let mut shape = Vec::new();
        shape_keys(e, &mut shape, "");
        shape.retain(|k| k != "execution_time");
        out.push((ty.clone(), format!("{ty}{{{}}}", shape.join(","))));
        if is_terminal(e) {
            break;
        }
    }
    // stdout/stderr are separate tails: no order between them within a run of output.
    let mut res = Vec::new();
    let mut run: Vec<String> = Vec::new();
    for (ty, s) in out {
        if ty == "stdout" || ty == "stderr" {
            run.push(s);
        } else {
            run.sort();
            res.append(&mut run);
            res.push(s);
        }
    }
    run.sort();
    res.append(&mut run);
    res
}

fn shape_keys(v: &Value, out: &mut Vec<String>, prefix: &str) {
    if let Value::Object(o) = v {
        for (k, x) in o {
            let p = format!("{prefix}{k}");
            out.push(p.clone());
            shape_keys(x, out, &format!("{p}."));
        }
    }
}

fn ty(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Differences in shape: keys, JSON types, error codes.
fn shape_diff(at: &str, rec: &Value, fake: &Value, d: &mut Vec<String>) {
    if ty(rec) != ty(fake) {
        d.push(format!(
            "{at}: {} ({fake}), recorded {} ({rec})",
            ty(fake),
            ty(rec)
        ));
        return;
    }
    match (rec, fake) {
        (Value::Object(r), Value::Object(f)) => {
            let rk: BTreeSet<&String> = r.keys().collect();
            let fk: BTreeSet<&String> = f.keys().collect();
            if rk != fk {
                d.push(format!(
                    "{at}: keys {fk:?}, recorded {rk:?} (fake {fake}, recorded {rec})"
                ));
                return;
            }
            for (k, rv) in r {
                let p = format!("{at}.{k}");
                if k == "code" && rv.is_string() && rv != &f[k] {
                    d.push(format!("{p}: {}, recorded {rv}", f[k]));
                }
                shape_diff(&p, rv, &f[k], d);
            }
        }
        (Value::Array(r), Value::Array(f)) => {
            if r.is_empty() != f.is_empty() {
                d.push(format!("{at}: {} items, recorded {}", f.len(), r.len()));
                return;
            }
            if let (Some(a), Some(b)) = (r.first(), f.first()) {
                shape_diff(&format!("{at}[0]"), a, b, d);
            }
        }
        _ => {}
    }
}

async fn run_group(exs: Vec<Value>, shift: chrono::Duration) -> (usize, usize, Vec<String>) {
    let mut rp = Replay::new(shift).await;
    // The recorded registry lookup failed (no network): the fake fails that image's pull.
    for ex in &exs {
        if ex["case"]
            .as_str()
            .unwrap_or("")
            .ends_with("/create-image-unpullable")
        {
            let body: Value =
                serde_json::from_slice(&body_bytes(&ex["requestBody"])).unwrap_or(Value::Null);
            if let Some(i) = body["image"]["uri"].as_str() {
                rp.fake.knobs().bad_images.push(i.to_owned());
            }
        }
    }
    let total = exs.len();
    let todo: Vec<&Value> = exs.iter().filter(|ex| !excluded(ex)).collect();
    let mut i = 0;
    while i < todo.len() {
        let consumed = rp.exchange(todo[i], todo.get(i + 1).copied()).await;
        i += if consumed { 2 } else { 1 };
    }
    (rp.replayed, total, rp.diffs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn recorded_exchanges_replay_against_the_fake() {
    let started = Instant::now();
    let (header, all) = load();
    let recorded_at =
        chrono::DateTime::parse_from_rfc3339(header["recordedFrom"].as_str().unwrap())
            .unwrap()
            .with_timezone(&chrono::Utc);
    let shift = chrono::Utc::now() - recorded_at;
    let pick = |g: &[&str]| -> Vec<Value> {
        all.iter()
            .filter(|e| g.contains(&group(e)))
            .cloned()
            .collect()
    };
    let shared = ["lifecycle", "server-proxy", "execd-direct", "snapshot"];
    let (a, b, c) = tokio::join!(
        run_group(pick(&["sdk-flow-server-proxy"]), shift),
        run_group(pick(&["sdk-flow-direct"]), shift),
        run_group(pick(&shared), shift),
    );
    let mut per_group: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for e in &all {
        let g = per_group.entry(group(e)).or_default();
        g.1 += 1;
        if !excluded(e) {
            g.0 += 1;
        }
    }
    for (g, (replayed, total)) in &per_group {
        eprintln!("replay {g}: {replayed}/{total} exchanges");
    }
    eprintln!(
        "replayed {} of {} exchanges in {:?}",
        a.0 + b.0 + c.0,
        all.len(),
        started.elapsed()
    );
    let diffs: Vec<String> = [a.2, b.2, c.2].concat();
    assert!(
        diffs.is_empty(),
        "the fake diverges from the recorded real server on {} exchange(s):\n{}",
        diffs.len(),
        diffs.join("\n")
    );
}
