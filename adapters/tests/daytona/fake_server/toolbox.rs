//! The fake toolbox: commands run for real (on the test host, in their own process group) and
//! files on host paths, as the toolbox API answers them.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;

use crate::support::http::{json_resp, lock, Req};

use super::{next_id, toolbox_error, Cmd, Inner};

/// Kills a command's whole process group (`kill(1)`: the workspace forbids `unsafe`).
async fn kill_group(pid: Option<u32>) {
    if let Some(pid) = pid {
        let _ = tokio::process::Command::new("kill")
            .args(["-KILL", "--", &format!("-{pid}")])
            .status()
            .await;
    }
}
/// Shell-words splitting, as the daemon's execute does (no shell runs the command).
fn split_words(s: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '\'' => break,
                        ch => cur.push(ch),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '"' => break,
                        '\\' => cur.push(chars.next()?),
                        ch => cur.push(ch),
                    }
                }
            }
            '\\' => {
                in_word = true;
                cur.push(chars.next()?);
            }
            c if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        out.push(cur);
    }
    Some(out)
}
fn file_info(path: &std::path::Path) -> Option<Value> {
    let md = std::fs::symlink_metadata(path).ok()?;
    let ft = md.file_type();
    let perm = md.permissions().mode() & 0o777;
    let kind = if ft.is_symlink() {
        'L'
    } else if ft.is_dir() {
        'd'
    } else {
        '-'
    };
    let rwx: String = (0..9)
        .map(|i| {
            if perm & (1 << (8 - i)) == 0 {
                '-'
            } else {
                ['r', 'w', 'x'][i % 3]
            }
        })
        .collect();
    let modified: chrono::DateTime<chrono::Utc> = md.modified().ok()?.into();
    Some(json!({
        "name": path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        "isDir": ft.is_dir(), "size": md.len(), "mode": format!("{kind}{rwx}"),
        "permissions": format!("{perm:04o}"), "modifiedAt": modified.to_rfc3339(),
        "modTime": modified.to_string(), "owner": "daytona", "group": "daytona",
    }))
}
/// The part named `file` of a multipart body.
fn multipart_file(headers: &HeaderMap, body: &[u8]) -> Option<Vec<u8>> {
    let ct = headers.get("content-type")?.to_str().ok()?;
    let boundary = ct.split("boundary=").nth(1)?.trim_matches('"');
    let delim = format!("--{boundary}");
    let text = body;
    let find = |hay: &[u8], needle: &[u8], from: usize| {
        hay[from..]
            .windows(needle.len())
            .position(|w| w == needle)
            .map(|p| p + from)
    };
    let mut pos = find(text, delim.as_bytes(), 0)?;
    loop {
        let start = pos + delim.len();
        let next = find(text, delim.as_bytes(), start)?;
        let part = &text[start..next];
        let head_end = find(part, b"\r\n\r\n", 0)?;
        let head = String::from_utf8_lossy(&part[..head_end]);
        if head.contains("name=\"file\"") {
            let content = &part[head_end + 4..];
            return Some(content.strip_suffix(b"\r\n").unwrap_or(content).to_vec());
        }
        pos = next;
    }
}
pub(super) async fn toolbox(inner: &Arc<Inner>, r: &Req) -> Response {
    let Some(rest) = r.path.strip_prefix("/toolbox/") else {
        return toolbox_error(404, "NOT_FOUND", "no such route");
    };
    let (sbx_id, route) = rest.split_once('/').unwrap_or((rest, ""));
    let route = format!("/{route}");
    let env = {
        let mut sbxs = lock(&inner.sandboxes);
        let Some(s) = sbxs.get_mut(sbx_id).filter(|s| s.state != "destroyed") else {
            return json_resp(
                404,
                json!({"statusCode": 404, "code": "NOT_FOUND", "source": "proxy",
                       "message": format!("sandbox {sbx_id} not found")}),
            );
        };
        if !matches!(s.state.as_str(), "started" | "snapshotting") {
            return json_resp(
                400,
                json!({"statusCode": 400, "code": "BAD_REQUEST", "source": "proxy",
                       "message": format!("sandbox is not running (state: {})", s.state)}),
            );
        }
        if s.boot_502_left > 0 {
            s.boot_502_left -= 1;
            return (StatusCode::BAD_GATEWAY, "Bad Gateway").into_response();
        }
        s.env.clone()
    };
    let seg: Vec<&str> = route.split('/').filter(|s| !s.is_empty()).collect();
    let path = r.q("path").map(std::path::PathBuf::from);
    let not_found = || toolbox_error(404, "NOT_FOUND", "file or directory not found");
    match (r.method.clone(), seg.as_slice()) {
        (Method::GET, ["version"]) => json_resp(200, json!({"version": "0.190.0"})),
        (Method::POST, ["process", "execute"]) => {
            let Ok(b) = serde_json::from_slice::<Value>(&r.body) else {
                return toolbox_error(400, "BAD_REQUEST", "invalid JSON");
            };
            lock(&inner.record).execute_bodies.push(b.clone());
            let Some(argv) = b["command"].as_str().and_then(split_words) else {
                return toolbox_error(400, "BAD_REQUEST", "invalid command");
            };
            if argv.is_empty() {
                return toolbox_error(400, "BAD_REQUEST", "empty command");
            }
            let timeout = b["timeout"].as_u64().filter(|t| *t > 0).unwrap_or(10);
            let mut cmd = tokio::process::Command::new(&argv[0]);
            cmd.args(&argv[1..])
                .envs(&env)
                .stdin(Stdio::null())
                .process_group(0)
                .kill_on_drop(true);
            if let Some(envs) = b["envs"].as_object() {
                for (k, v) in envs {
                    cmd.env(k, v.as_str().unwrap_or_default());
                }
            }
            if let Some(cwd) = b["cwd"].as_str() {
                if !std::path::Path::new(cwd).is_dir() {
                    return toolbox_error(
                        400,
                        "BAD_REQUEST",
                        &format!("chdir {cwd}: no such file or directory"),
                    );
                }
                cmd.current_dir(cwd);
            }
            // Output combined, as the toolbox answers it.
            let (reader, writer) = match std::io::pipe() {
                Ok(p) => p,
                Err(e) => return toolbox_error(500, "INTERNAL", &e.to_string()),
            };
            let Ok(w2) = writer.try_clone() else {
                return toolbox_error(500, "INTERNAL", "pipe");
            };
            cmd.stdout(writer).stderr(w2);
            let mut child = match cmd.spawn() {
                Ok(c) => c,
                Err(e) => return json_resp(200, json!({"exitCode": 127, "result": e.to_string()})),
            };
            drop(cmd);
            let read = tokio::task::spawn_blocking(move || {
                let mut out = Vec::new();
                let mut reader = reader;
                let _ = std::io::Read::read_to_end(&mut reader, &mut out);
                out
            });
            match tokio::time::timeout(Duration::from_secs(timeout), child.wait()).await {
                Ok(status) => {
                    let code = status.ok().and_then(|s| {
                        use std::os::unix::process::ExitStatusExt;
                        s.code().or(s.signal().map(|n| 128 + n))
                    });
                    let out = read.await.unwrap_or_default();
                    json_resp(
                        200,
                        json!({"exitCode": code, "result": String::from_utf8_lossy(&out)}),
                    )
                }
                Err(_) => {
                    kill_group(child.id()).await;
                    let _ = child.kill().await;
                    toolbox_error(
                        408,
                        "PROCESS_EXECUTION_TIMEOUT",
                        "command execution timeout",
                    )
                }
            }
        }
        (Method::POST, ["process", "session"]) => {
            let Ok(b) = serde_json::from_slice::<Value>(&r.body) else {
                return toolbox_error(400, "BAD_REQUEST", "invalid JSON");
            };
            let sid = b["sessionId"].as_str().unwrap_or_default().to_owned();
            let mut sessions = lock(&inner.sessions);
            let key = (sbx_id.to_owned(), sid.clone());
            if sid.is_empty() || sessions.contains_key(&key) {
                return toolbox_error(409, "CONFLICT", "session already exists");
            }
            sessions.insert(key, HashMap::new());
            StatusCode::CREATED.into_response()
        }
        (Method::DELETE, ["process", "session", sid]) => {
            match lock(&inner.sessions).remove(&(sbx_id.to_owned(), (*sid).to_owned())) {
                Some(cmds) => {
                    for (_, mut c) in cmds {
                        if let Some(k) = c.kill.take() {
                            if lock(&c.exit_code).is_none() && k.send(()).is_ok() {
                                lock(&inner.record).killed += 1;
                            }
                        }
                    }
                    StatusCode::NO_CONTENT.into_response()
                }
                None => toolbox_error(404, "NOT_FOUND", "session not found"),
            }
        }
        (Method::POST, ["process", "session", sid, "exec"]) => {
            let Ok(b) = serde_json::from_slice::<Value>(&r.body) else {
                return toolbox_error(400, "BAD_REQUEST", "invalid JSON");
            };
            let command = b["command"].as_str().unwrap_or_default().to_owned();
            let key = (sbx_id.to_owned(), (*sid).to_owned());
            if !lock(&inner.sessions).contains_key(&key) {
                return toolbox_error(404, "NOT_FOUND", "session not found");
            }
            let mut child = match tokio::process::Command::new("bash")
                .arg("-c")
                .arg(&command)
                .envs(&env)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .process_group(0)
                .kill_on_drop(true)
                .spawn()
            {
                Ok(c) => c,
                Err(e) => return toolbox_error(500, "INTERNAL", &e.to_string()),
            };
            let cmd_id = next_id(inner);
            let (kill_tx, kill_rx) = tokio::sync::oneshot::channel::<()>();
            let stdout = Arc::new(Mutex::new(Vec::new()));
            let stderr = Arc::new(Mutex::new(Vec::new()));
            let exit_code = Arc::new(Mutex::new(None));
            for (pipe, buf) in [
                (
                    child
                        .stdout
                        .take()
                        .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
                    stdout.clone(),
                ),
                (
                    child
                        .stderr
                        .take()
                        .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
                    stderr.clone(),
                ),
            ] {
                if let Some(mut pipe) = pipe {
                    tokio::spawn(async move {
                        let mut chunk = [0u8; 4096];
                        while let Ok(n) = pipe.read(&mut chunk).await {
                            if n == 0 {
                                break;
                            }
                            lock(&buf).extend_from_slice(&chunk[..n]);
                        }
                    });
                }
            }
            let code = exit_code.clone();
            tokio::spawn(async move {
                let status = tokio::select! {
                    s = child.wait() => s.ok(),
                    _ = kill_rx => {
                        kill_group(child.id()).await;
                        let _ = child.kill().await;
                        child.wait().await.ok()
                    }
                };
                // Let the pipe readers drain.
                tokio::time::sleep(Duration::from_millis(20)).await;
                let c = status.and_then(|s| {
                    use std::os::unix::process::ExitStatusExt;
                    s.code().or(s.signal().map(|n| 128 + n))
                });
                *lock(&code) = Some(c.unwrap_or(-1));
            });
            if let Some(cmds) = lock(&inner.sessions).get_mut(&key) {
                cmds.insert(
                    cmd_id.clone(),
                    Cmd {
                        stdout,
                        stderr,
                        exit_code,
                        kill: Some(kill_tx),
                        command,
                    },
                );
            }
            json_resp(202, json!({"cmdId": cmd_id}))
        }
        (Method::GET, ["process", "session", sid, "command", cmd, tail @ ..]) => {
            let logs = matches!(tail, ["logs"]);
            if logs {
                let delay = lock(&inner.knobs).logs_delay_ms;
                if delay > 0 {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                }
            }
            let key = (sbx_id.to_owned(), (*sid).to_owned());
            let sessions = lock(&inner.sessions);
            let Some(c) = sessions.get(&key).and_then(|cmds| cmds.get(*cmd)) else {
                return toolbox_error(404, "NOT_FOUND", "command not found");
            };
            if !logs {
                return json_resp(
                    200,
                    json!({"id": cmd, "command": c.command, "exitCode": *lock(&c.exit_code)}),
                );
            }
            let out = String::from_utf8_lossy(&lock(&c.stdout)).into_owned();
            let err = String::from_utf8_lossy(&lock(&c.stderr)).into_owned();
            let body =
                json!({"stdout": out, "stderr": err, "output": format!("{out}{err}")}).to_string();
            let truncate = {
                let mut k = lock(&inner.knobs);
                let t = k.truncate_logs > 0;
                k.truncate_logs = k.truncate_logs.saturating_sub(1);
                t
            };
            if truncate {
                // Half the body, then the connection breaks (no chunked terminator).
                let half = Bytes::from(body.as_bytes()[..body.len() / 2].to_vec());
                let chunks: Vec<Result<Bytes, std::io::Error>> =
                    vec![Ok(half), Err(std::io::Error::other("cut"))];
                return Response::builder()
                    .status(200)
                    .header("content-type", "application/json")
                    .body(Body::from_stream(futures::stream::iter(chunks)))
                    .unwrap();
            }
            json_resp(200, serde_json::from_str(&body).unwrap())
        }
        (Method::GET, ["files"]) => {
            let Some(p) = path else {
                return toolbox_error(400, "BAD_REQUEST", "path is required");
            };
            let Ok(rd) = std::fs::read_dir(&p) else {
                return not_found();
            };
            let mut items: Vec<Value> = rd
                .filter_map(Result::ok)
                .filter_map(|e| file_info(&e.path()))
                .collect();
            items.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
            json_resp(200, Value::Array(items))
        }
        (Method::GET, ["files", "info"]) => match path.as_deref().and_then(file_info) {
            Some(v) => json_resp(200, v),
            None => not_found(),
        },
        (Method::GET, ["files", "download"]) => {
            let Some(p) = path else {
                return toolbox_error(400, "BAD_REQUEST", "path is required");
            };
            if p.is_dir() {
                return toolbox_error(400, "BAD_REQUEST", "path is a directory");
            }
            match std::fs::read(&p) {
                Ok(bytes) => (
                    StatusCode::OK,
                    [("content-type", "application/octet-stream")],
                    bytes,
                )
                    .into_response(),
                Err(_) => not_found(),
            }
        }
        (Method::POST, ["files", "upload"]) => {
            let Some(p) = path else {
                return toolbox_error(400, "BAD_REQUEST", "path is required");
            };
            let Some(content) = multipart_file(&r.headers, &r.body) else {
                return toolbox_error(400, "BAD_REQUEST", "no file part");
            };
            if let Some(parent) = p.parent() {
                let _ = std::fs::create_dir_all(parent);
            }
            match std::fs::write(&p, content) {
                Ok(()) => json_resp(200, json!({})),
                Err(e) => toolbox_error(400, "BAD_REQUEST", &e.to_string()),
            }
        }
        (Method::POST, ["files", "permissions"]) => {
            let Some(p) = path else {
                return toolbox_error(400, "BAD_REQUEST", "path is required");
            };
            if !p.exists() {
                return not_found();
            }
            if let Some(mode) = r.q("mode") {
                // Octal, as Daytona's daemon parses it.
                let Ok(bits) = u32::from_str_radix(mode, 8) else {
                    return toolbox_error(400, "BAD_REQUEST", "invalid mode");
                };
                let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(bits));
            }
            json_resp(200, json!({}))
        }
        (Method::DELETE, ["files"]) => {
            let Some(p) = path else {
                return toolbox_error(400, "BAD_REQUEST", "path is required");
            };
            let Ok(md) = std::fs::symlink_metadata(&p) else {
                return not_found();
            };
            let res = if md.is_dir() {
                std::fs::remove_dir(&p)
            } else {
                std::fs::remove_file(&p)
            };
            match res {
                Ok(()) => StatusCode::NO_CONTENT.into_response(),
                Err(e) => toolbox_error(400, "BAD_REQUEST", &e.to_string()),
            }
        }
        _ => toolbox_error(404, "NOT_FOUND", &format!("no route {} {route}", r.method)),
    }
}
