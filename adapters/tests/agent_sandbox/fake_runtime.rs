//! The data plane of the fake cluster: the sandbox router and, behind it, the runtime in each
//! pod. Written from kubernetes-sigs/agent-sandbox (snapshot of 2026-08-22):
//!
//! - the router (`sandbox-router/README.md`): `X-Sandbox-ID` required and a DNS-1123 label,
//!   `X-Sandbox-Namespace` (default `default`) the same, `X-Sandbox-Port` (default 8888) in
//!   1-65535, errors as `{"detail": …}` (400 for each bad header, 502 "Could not connect to
//!   the backend sandbox: <id>" when the pod cannot be dialled), `GET /healthz`, and the
//!   `Authorization` header stripped before the pod sees it;
//! - the runtime (`examples/python-runtime-sandbox/main.py`, the image the SDKs' examples
//!   run): `GET /` health; `POST /execute {"command"}` split with `shlex.split` and run without
//!   a shell in `SANDBOX_BASE_DIR` (default `/app`), no env, cwd or stdin of the caller's, its
//!   own timeout (`SANDBOX_EXEC_TIMEOUT_SECONDS`, 300) and every failure (a missing program, a
//!   timeout, output that is not UTF-8, bad quoting) answered as exit code 1 with
//!   `Failed to execute command: …` on stderr; a signal-killed child is Python's negative
//!   return code; `POST /upload` (multipart part `file`, its filename the destination
//!   relative to the base directory, parents made); `GET /download/{path}`, `/list/{path}`,
//!   `/exists/{path}`, whose path is percent-decoded twice (once by the server, once by the
//!   handler); a path escaping the base directory is 403 `{"message": "Access denied"}`; a
//!   missing file 404 `{"message": "File not found"}`; a missing body field 422 in FastAPI's
//!   shape.
//!
//! Commands really run on the test host, so quoting, env, exit codes and timeouts are the
//! shell's; with the base directory `/` (the fake's default) paths are host paths.

use std::path::{Component, Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use rustix::process::{Pid, Signal};
use serde_json::{json, Value};

use crate::fake_k8s::FakeCluster;
use crate::support::http::{json_resp, pct_decode, Req};

fn detail(status: u16, d: &str) -> Response {
    json_resp(status, json!({ "detail": d }))
}

fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

pub async fn handle(State(fake): State<FakeCluster>, req: Request) -> Response {
    // The path as the server received it, before any decoding.
    let raw_path = req.uri().path().to_owned();
    let r = Req::read(req, 256 << 20).await;
    if r.headers.contains_key("authorization") {
        fake.record().auth_on_runtime += 1;
    }
    if raw_path == "/healthz" {
        return json_resp(200, json!({"status": "ok"}));
    }
    // A pod's own address: /direct/{namespace}/{name}/…
    if let Some(rest) = raw_path.strip_prefix("/direct/") {
        let mut it = rest.splitn(3, '/');
        let (ns, name) = (it.next().unwrap_or(""), it.next().unwrap_or(""));
        let path = format!("/{}", it.next().unwrap_or(""));
        return match fake.pod(ns, name) {
            Some((base, env)) => runtime(&fake, &r, &path, &base, &env).await,
            None => (StatusCode::BAD_GATEWAY, "upstream connect error").into_response(),
        };
    }
    let id = r.header("x-sandbox-id").unwrap_or("").to_owned();
    if id.is_empty() {
        return detail(400, "X-Sandbox-ID header is required.");
    }
    if !dns_label(&id) {
        return detail(400, "Invalid sandbox ID format.");
    }
    let ns = r
        .header("x-sandbox-namespace")
        .unwrap_or("default")
        .to_owned();
    if !dns_label(&ns) {
        return detail(400, "Invalid namespace format.");
    }
    let port = match r.header("x-sandbox-port").map(str::parse::<u32>) {
        None => 8888,
        Some(Ok(p)) if (1..=65535).contains(&p) => p,
        Some(_) => return detail(400, "Invalid port format."),
    };
    let want_port = u32::from(fake.knobs().runtime_port);
    match fake.pod(&ns, &id) {
        Some((base, env)) if port == want_port => runtime(&fake, &r, &raw_path, &base, &env).await,
        _ => detail(
            502,
            &format!("Could not connect to the backend sandbox: {id}"),
        ),
    }
}

fn message(status: u16, m: &str) -> Response {
    json_resp(status, json!({ "message": m }))
}

/// FastAPI's answer for a missing body field.
fn missing(loc: &str) -> Response {
    json_resp(
        422,
        json!({"detail": [{"type": "missing", "loc": ["body", loc], "msg": "Field required", "input": null}]}),
    )
}

async fn runtime(
    fake: &FakeCluster,
    r: &Req,
    path: &str,
    base: &str,
    env: &[(String, String)],
) -> Response {
    // Uvicorn decodes the path once; the handlers `unquote` their parameter again.
    let decoded = pct_decode_path(path);
    let param = |prefix: &str| decoded.strip_prefix(prefix).map(pct_decode_path);
    match (&r.method, decoded.as_str()) {
        (&Method::GET, "/") => json_resp(
            200,
            json!({"status": "ok", "message": "Sandbox Runtime is active."}),
        ),
        (&Method::POST, "/execute") => {
            let Some(command) = r.json()["command"].as_str().map(str::to_owned) else {
                return missing("command");
            };
            fake.record().executes.push(command.clone());
            let secs = fake.knobs().exec_timeout_secs;
            let (stdout, stderr, exit_code) = execute(&command, base, env, secs).await;
            json_resp(
                200,
                json!({"stdout": stdout, "stderr": stderr, "exit_code": exit_code}),
            )
        }
        (&Method::POST, "/upload") => upload(r, base).await,
        (&Method::GET, p) if p.starts_with("/download/") => {
            let rel = param("/download/").unwrap_or_default();
            let Some(full) = safe_path(base, &rel) else {
                return message(403, "Access denied");
            };
            match tokio::fs::metadata(&full).await {
                Ok(m) if m.is_file() => match tokio::fs::read(&full).await {
                    Ok(bytes) => (
                        StatusCode::OK,
                        [
                            ("content-type", "application/octet-stream".to_owned()),
                            (
                                "content-disposition",
                                format!("attachment; filename=\"{rel}\""),
                            ),
                        ],
                        bytes,
                    )
                        .into_response(),
                    Err(e) => message(500, &e.to_string()),
                },
                _ => message(404, "File not found"),
            }
        }
        (&Method::GET, p) if p.starts_with("/list/") => {
            let rel = param("/list/").unwrap_or_default();
            let Some(full) = safe_path(base, &rel) else {
                return message(403, "Access denied");
            };
            let Ok(mut rd) = tokio::fs::read_dir(&full).await else {
                return message(404, "Path is not a directory");
            };
            let mut entries = Vec::new();
            while let Ok(Some(e)) = rd.next_entry().await {
                let Ok(m) = tokio::fs::metadata(e.path()).await else {
                    continue;
                };
                let mtime = m
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0.0, |d| d.as_secs_f64());
                entries.push(
                    json!({"name": e.file_name().to_string_lossy(), "size": m.len(),
                    "type": if m.is_dir() { "directory" } else { "file" }, "mod_time": mtime}),
                );
            }
            json_resp(200, Value::Array(entries))
        }
        (&Method::GET, p) if p.starts_with("/exists/") => {
            let rel = param("/exists/").unwrap_or_default();
            let Some(full) = safe_path(base, &rel) else {
                return message(403, "Access denied");
            };
            json_resp(
                200,
                json!({"path": rel, "exists": tokio::fs::metadata(&full).await.is_ok()}),
            )
        }
        _ => json_resp(404, json!({"detail": "Not Found"})),
    }
}

/// Percent-decoding of a path (`+` stays a plus, unlike form decoding).
fn pct_decode_path(s: &str) -> String {
    pct_decode(&s.replace('+', "%2B"))
}

/// `get_safe_path`: the path joined to the base directory after its leading slashes are
/// stripped, resolved, and refused when it leaves the base.
fn safe_path(base: &str, path: &str) -> Option<PathBuf> {
    let base = std::fs::canonicalize(base).ok()?;
    let mut full = base.clone();
    for c in Path::new(path.trim_start_matches('/')).components() {
        match c {
            Component::Normal(p) => {
                full.push(p);
                if let Ok(real) = std::fs::canonicalize(&full) {
                    full = real;
                }
            }
            Component::ParentDir => {
                full.pop();
            }
            _ => {}
        }
    }
    full.starts_with(&base).then_some(full)
}

/// Python's `shlex.split` (POSIX mode, no comments); its error message on bad input.
pub fn shlex_split(s: &str) -> Result<Vec<String>, &'static str> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut have = false;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {
                if have {
                    out.push(std::mem::take(&mut cur));
                    have = false;
                }
            }
            '\'' => {
                have = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(x) => cur.push(x),
                        None => return Err("No closing quotation"),
                    }
                }
            }
            '"' => {
                have = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(x @ ('"' | '\\')) => cur.push(x),
                            Some(x) => {
                                cur.push('\\');
                                cur.push(x);
                            }
                            None => return Err("No closing quotation"),
                        },
                        Some(x) => cur.push(x),
                        None => return Err("No closing quotation"),
                    }
                }
            }
            '\\' => {
                have = true;
                match chars.next() {
                    Some(x) => cur.push(x),
                    None => return Err("No escaped character"),
                }
            }
            c => {
                have = true;
                cur.push(c);
            }
        }
    }
    if have {
        out.push(cur);
    }
    Ok(out)
}

fn failed(why: &str) -> (String, String, i64) {
    (
        String::new(),
        format!("Failed to execute command: {why}"),
        1,
    )
}

async fn execute(
    command: &str,
    base: &str,
    env: &[(String, String)],
    timeout_secs: u64,
) -> (String, String, i64) {
    let args = match shlex_split(command) {
        Ok(a) if !a.is_empty() => a,
        Ok(_) => return failed("list index out of range"),
        Err(e) => return failed(e),
    };
    let mut cmd = tokio::process::Command::new(&args[0]);
    cmd.args(&args[1..])
        .current_dir(base)
        .envs(env.iter().cloned())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return failed(&format!(
                "[Errno 2] No such file or directory: '{}'",
                args[0]
            ))
        }
        Err(e) => return failed(&e.to_string()),
    };
    let pid = child.id();
    let out =
        tokio::time::timeout(Duration::from_secs(timeout_secs), child.wait_with_output()).await;
    let out = match out {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => return failed(&e.to_string()),
        Err(_) => {
            // The whole group (`process_group(0)` made the child its leader), by the system
            // call: `kill -KILL -<pgid>` without `--` is read by procps-ng's kill(1) as
            // kill(-1, SIGKILL), which killed every process on the test machine.
            if let Some(group) = pid
                .and_then(|p| i32::try_from(p).ok())
                .and_then(Pid::from_raw)
            {
                let _ = rustix::process::kill_process_group(group, Signal::KILL);
            }
            return failed(&format!(
                "Command '{args:?}' timed out after {timeout_secs} seconds"
            ));
        }
    };
    let code = match (
        out.status.code(),
        std::os::unix::process::ExitStatusExt::signal(&out.status),
    ) {
        (Some(c), _) => i64::from(c),
        (None, Some(sig)) => -i64::from(sig),
        (None, None) => 1,
    };
    // `text=True`: output that is not UTF-8 fails the whole call.
    match (String::from_utf8(out.stdout), String::from_utf8(out.stderr)) {
        (Ok(o), Ok(e)) => (o, e, code),
        (Err(e), _) | (_, Err(e)) => failed(&format!(
            "'utf-8' codec can't decode byte 0x{:02x} in position {}: invalid start byte",
            e.as_bytes()[e.utf8_error().valid_up_to()],
            e.utf8_error().valid_up_to()
        )),
    }
}

/// The multipart part named `file`: its filename and bytes.
fn multipart_file(headers: &HeaderMap, body: &[u8]) -> Option<(String, Vec<u8>)> {
    let ct = headers.get("content-type")?.to_str().ok()?;
    let boundary = ct.split("boundary=").nth(1)?.trim_matches('"');
    let delim = format!("--{boundary}");
    let text = body;
    let mut pos = 0;
    let find = |hay: &[u8], needle: &[u8], from: usize| {
        hay.get(from..)?
            .windows(needle.len())
            .position(|w| w == needle)
            .map(|p| p + from)
    };
    while let Some(start) = find(text, delim.as_bytes(), pos) {
        let head_start = start + delim.len() + 2;
        let head_end = find(text, b"\r\n\r\n", head_start)?;
        let head = String::from_utf8_lossy(&text[head_start..head_end]).into_owned();
        let data_start = head_end + 4;
        let next = find(text, format!("\r\n{delim}").as_bytes(), data_start)?;
        if head.contains("name=\"file\"") {
            let filename = head
                .split("filename=\"")
                .nth(1)?
                .split('"')
                .next()?
                .to_owned();
            return Some((filename, text[data_start..next].to_vec()));
        }
        pos = next + 2;
    }
    None
}

async fn upload(r: &Req, base: &str) -> Response {
    let Some((filename, bytes)) = multipart_file(&r.headers, &r.body) else {
        return missing("file");
    };
    let Some(full) = safe_path(base, &filename) else {
        return message(403, "Access denied");
    };
    if let Some(parent) = full.parent() {
        if let Err(e) = tokio::fs::create_dir_all(parent).await {
            return message(500, &format!("File upload failed: {e}"));
        }
    }
    match tokio::fs::write(&full, &bytes).await {
        Ok(()) => message(200, &format!("File '{filename}' uploaded successfully.")),
        Err(e) => message(500, &format!("File upload failed: {e}")),
    }
}
