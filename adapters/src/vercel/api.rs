//! Vercel Sandbox's REST API (`provider-specs/vercel-sandbox/API.md`): sandboxes by name,
//! their sessions (the running microVM), commands streamed as NDJSON, files. Every request
//! names the team (`teamId`); the token goes as `Authorization: Bearer` to the API only.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use reqwest::{Method, RequestBuilder, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::config::Settings;
use crate::credentials::Credentials;
use crate::error::Reason;
use crate::http::{HttpClient, HttpClientBuilder, HttpConfigError};
use crate::kit::paths::segment;
use crate::kit::ErrorAnswer;
use crate::{AdapterError, ExecEvent};

/// A sandbox (`{sandbox, session, routes}` answers carry one).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Sandbox {
    pub name: String,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub current_session_id: Option<String>,
    #[serde(default)]
    pub tags: Option<BTreeMap<String, String>>,
}

/// A session: the microVM of one run.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Session {
    pub id: String,
    #[serde(default)]
    pub status: String,
    /// Milliseconds the session may run from its start.
    #[serde(default)]
    pub timeout: Option<u64>,
    /// Epoch milliseconds.
    #[serde(default)]
    pub started_at: Option<i64>,
}

/// A port's public route.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct Route {
    pub url: String,
    pub port: u16,
}

/// `{sandbox, session, routes}`.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct Answer {
    pub sandbox: Sandbox,
    #[serde(default)]
    pub session: Option<Session>,
    #[serde(default)]
    pub routes: Vec<Route>,
}

/// The body of `POST /v3/sandboxes`.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NewSandbox {
    pub project_id: String,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Milliseconds.
    pub timeout: u64,
    pub resources: Value,
    pub persistent: bool,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    pub tags: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
}

/// HTTP client bound to one Vercel team: the kit's client, which sends the token as
/// `Authorization: Bearer` to the API only, re-reads it after a 401/403 and scrubs it from
/// every message; Vercel's own error answers go through [`map_status`].
#[derive(Debug, Clone)]
pub(crate) struct Api {
    pub(crate) http: HttpClient,
    base: String,
    team: String,
    project: String,
}

/// `{"error": {"code", "message"}}`.
#[derive(Debug, Default, Deserialize)]
struct ErrorBody {
    #[serde(default)]
    error: Option<ErrorInner>,
}

#[derive(Debug, Default, Deserialize)]
struct ErrorInner {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
}

/// An error answer through [`map_status`] (the client scrubs the result).
fn map_answer(op: &str, a: &ErrorAnswer) -> AdapterError {
    map_status(op, a.status, &a.body, a.retry_after)
}

/// Status and body → `AdapterError` (the caller scrubs the message). `retry_after` is the
/// answer's `Retry-After`, kept on capacity errors.
pub(crate) fn map_status(
    op: &str,
    status: StatusCode,
    body: &[u8],
    retry_after: Option<std::time::Duration>,
) -> AdapterError {
    let e = serde_json::from_slice::<ErrorBody>(body)
        .ok()
        .and_then(|b| b.error)
        .unwrap_or_else(|| ErrorInner {
            code: String::new(),
            message: String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
        });
    let text = format!("{op}: HTTP {} {}: {}", status.as_u16(), e.code, e.message);
    match status.as_u16() {
        401 => AdapterError::permanent(format!(
            "{op}: Vercel refused the access token (HTTP 401); check the pool's token reference"
        )),
        403 => AdapterError::permanent(format!(
            "{op}: Vercel does not allow this token to do that in team or project (HTTP 403 {})",
            e.code
        )),
        404 => AdapterError::NotFound,
        // A stopped session (persistent sandboxes resume on the next use).
        410 if e.code != "snapshot_not_found" => {
            AdapterError::transient(format!("stopped: {text}"))
        }
        422 if matches!(e.code.as_str(), "sandbox_stopping" | "sandbox_snapshotting") => {
            AdapterError::transient(text)
        }
        // Vercel's plan (402) and rate/concurrency (429) limits: placement tries the next pool.
        402 | 429 => crate::http::capacity_error(
            op,
            status,
            &format!("Vercel plan or rate limit: {}", e.message),
            retry_after,
        ),
        400 if e.message.to_ascii_lowercase().contains("timeout") => AdapterError::Permanent(
            Reason::from(format!(
                "{text} (the TTL is longer than this Vercel plan allows; see maxTimeoutSeconds)"
            ))
            .on_field("ttlSeconds"),
        ),
        501 => AdapterError::Unsupported(text),
        408 | 500..=599 => AdapterError::transient(text),
        _ => AdapterError::permanent(text),
    }
}

/// One line of a command's NDJSON output.
#[derive(Debug, Default, Deserialize)]
struct Line {
    #[serde(default)]
    command: Option<Command>,
    #[serde(default)]
    stream: Option<String>,
    #[serde(default)]
    data: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Command {
    id: String,
    #[serde(default)]
    exit_code: Option<i32>,
}

/// How a command run ended without an exit code.
pub(crate) enum RunError {
    /// The API refused the command: it never ran.
    NotStarted(AdapterError),
    /// It ran; what happened after.
    Started(AdapterError),
}

impl Api {
    pub(crate) fn new(
        settings: &Settings,
        credentials: &Credentials,
    ) -> Result<Self, HttpConfigError> {
        let http = HttpClientBuilder::new("Vercel", settings.api_url.clone())
            .auth(
                "Authorization",
                "access token",
                settings.credential.clone(),
                settings.initial_token.clone(),
            )
            .bearer()
            .errors(map_answer)
            .request_timeout(settings.request_timeout)
            .retries(2, Duration::from_millis(200))
            .build(credentials)?;
        Ok(Api {
            http,
            base: settings.api_url.clone(),
            team: settings.team_id.clone(),
            project: settings.project_id.clone(),
        })
    }

    fn api(&self, method: Method, path: &str) -> RequestBuilder {
        self.http
            .api(method, path)
            .query(&[("teamId", self.team.as_str())])
    }

    /// A request without the overall timeout (streams watch themselves).
    fn streaming(&self, method: Method, path: &str) -> RequestBuilder {
        self.http
            .to(method, &format!("{}{path}", self.base))
            .query(&[("teamId", self.team.as_str())])
    }

    /// `POST /v3/sandboxes`. Not retried: the name makes a repeat a 409, found by name.
    pub(crate) async fn create(&self, body: &NewSandbox) -> Result<Answer, AdapterError> {
        let rb = self.api(Method::POST, "/v3/sandboxes").json(body);
        self.http.json(rb, "create sandbox").await
    }

    /// `GET /v2/sandboxes/{name}`; with `resume`, a stopped one gets a new session.
    pub(crate) async fn get(&self, name: &str, resume: bool) -> Result<Answer, AdapterError> {
        let mut rb = self
            .api(Method::GET, &format!("/v2/sandboxes/{}", segment(name)))
            .query(&[("projectId", self.project.as_str())]);
        if resume {
            rb = rb.query(&[("resume", "true")]);
        }
        self.http.json(rb, "get sandbox").await
    }

    /// Every sandbox of the project tagged `key:value` (all pages).
    pub(crate) async fn list_tagged(
        &self,
        key: &str,
        value: &str,
    ) -> Result<Vec<Sandbox>, AdapterError> {
        let tag = format!("{key}:{value}");
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..1000 {
            let mut rb = self.api(Method::GET, "/v2/sandboxes").query(&[
                ("project", self.project.as_str()),
                ("tags", tag.as_str()),
                ("limit", "100"),
            ]);
            if let Some(c) = &cursor {
                rb = rb.query(&[("cursor", c.as_str())]);
            }
            let page: Value = self.http.json(rb, "list sandboxes").await?;
            let items: Vec<Sandbox> =
                serde_json::from_value(page["sandboxes"].clone()).unwrap_or_default();
            // Vercel filters by tag already; the adapter checks the tags again (`kit::tags`).
            out.extend(items);
            cursor = match &page["pagination"]["next"] {
                Value::String(s) if !s.is_empty() => Some(s.clone()),
                Value::Number(n) => Some(n.to_string()),
                _ => None,
            };
            if cursor.is_none() {
                return Ok(out);
            }
        }
        Err(AdapterError::transient(
            "list sandboxes: Vercel kept answering with more pages",
        ))
    }

    /// `GET /v2/sandboxes?limit=1`: the API answers and takes the token.
    pub(crate) async fn probe(&self) -> Result<(), AdapterError> {
        let rb = self
            .api(Method::GET, "/v2/sandboxes")
            .query(&[("project", self.project.as_str()), ("limit", "1")]);
        self.http.send_ok(rb, "list sandboxes").await.map(drop)
    }

    /// `DELETE /v2/sandboxes/{name}`; a missing one is success.
    pub(crate) async fn delete(&self, name: &str) -> Result<(), AdapterError> {
        let rb = self
            .api(Method::DELETE, &format!("/v2/sandboxes/{}", segment(name)))
            .query(&[("projectId", self.project.as_str())]);
        match self.http.send_ok(rb, "delete sandbox").await {
            Ok(_) | Err(AdapterError::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }

    pub(crate) async fn session(&self, id: &str) -> Result<Session, AdapterError> {
        let rb = self.api(
            Method::GET,
            &format!("/v2/sandboxes/sessions/{}", segment(id)),
        );
        let v: Value = self.http.json(rb, "get session").await?;
        serde_json::from_value(v["session"].clone())
            .map_err(|e| AdapterError::transient(format!("get session: unexpected answer: {e}")))
    }

    /// `POST …/sessions/{id}/stop` (a persistent sandbox is snapshotted first).
    pub(crate) async fn stop(&self, session: &str) -> Result<(), AdapterError> {
        let rb = self
            .api(
                Method::POST,
                &format!("/v2/sandboxes/sessions/{}/stop", segment(session)),
            )
            .json(&json!({}));
        self.http.send_ok(rb, "stop session").await.map(drop)
    }

    /// `POST …/sessions/{id}/extend-timeout {duration}` (milliseconds added).
    pub(crate) async fn extend(&self, session: &str, ms: u64) -> Result<(), AdapterError> {
        let rb = self
            .api(
                Method::POST,
                &format!("/v2/sandboxes/sessions/{}/extend-timeout", segment(session)),
            )
            .json(&json!({ "duration": ms }));
        self.http.send_ok(rb, "extend timeout").await.map(drop)
    }

    /// `POST …/fs/write`: a gzip tar, extracted at `/`.
    pub(crate) async fn write(&self, session: &str, tgz: Vec<u8>) -> Result<(), AdapterError> {
        let rb = self
            .api(
                Method::POST,
                &format!("/v2/sandboxes/sessions/{}/fs/write", segment(session)),
            )
            .header("content-type", "application/gzip")
            .header("x-cwd", "/")
            .body(tgz)
            .timeout(self.http.request_timeout().max(Duration::from_secs(300)));
        self.http.send_ok(rb, "upload").await.map(drop)
    }

    /// `POST …/fs/read {path}`: the bytes, streamed; a missing file is `PathNotFound`.
    pub(crate) async fn read(
        &self,
        session: &str,
        path: &str,
    ) -> Result<(Option<u64>, crate::ByteStream), AdapterError> {
        let rb = self
            .streaming(
                Method::POST,
                &format!("/v2/sandboxes/sessions/{}/fs/read", segment(session)),
            )
            .json(&json!({ "path": path }));
        let resp = self.http.send(rb, "download").await?;
        if resp.status() == StatusCode::NOT_FOUND {
            return Err(AdapterError::PathNotFound(path.to_owned()));
        }
        if !resp.status().is_success() {
            return Err(self.http.error_of("download", resp).await);
        }
        let len = resp.content_length();
        let body = resp
            .bytes_stream()
            .map(|r| r.map_err(|e| AdapterError::transient(format!("download: {e}"))));
        Ok((len, Box::pin(body)))
    }

    /// `POST …/cmd/{id}/kill {signal: 9}`, best effort.
    pub(crate) async fn kill(&self, session: &str, cmd: &str) {
        let rb = self
            .api(
                Method::POST,
                &format!(
                    "/v2/sandboxes/sessions/{}/cmd/{}/kill",
                    segment(session),
                    segment(cmd)
                ),
            )
            .json(&json!({ "signal": 9 }));
        if let Err(e) = self.http.send_ok(rb, "kill command").await {
            tracing::warn!(error = %e, "vercel: killing a command failed");
        }
    }

    /// Runs `argv` (`command` + `args`, no shell) with `wait`/`logs`, feeding `out`; 124
    /// past `deadline` (the command killed), 137 when `out` closed (killed too).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn run(
        &self,
        session: &str,
        argv: &[String],
        env: &BTreeMap<String, String>,
        cwd: Option<&str>,
        deadline: Duration,
        idle: Duration,
        out: &mpsc::Sender<ExecEvent>,
    ) -> Result<i32, RunError> {
        let started = Instant::now();
        let Some((program, args)) = argv.split_first() else {
            return Err(RunError::NotStarted(AdapterError::invalid_field(
                "command",
                "command is empty",
            )));
        };
        let mut body = json!({
            "command": program, "args": args, "env": env, "sudo": false,
            "wait": true, "logs": true,
        });
        if let Some(c) = cwd {
            body["cwd"] = json!(c);
        }
        let rb = self
            .streaming(
                Method::POST,
                &format!("/v2/sandboxes/sessions/{}/cmd", segment(session)),
            )
            .json(&body);
        let resp = match tokio::time::timeout(idle.min(deadline), self.http.send(rb, "exec")).await
        {
            Err(_) => {
                return Err(RunError::Started(AdapterError::transient(
                    "exec: Vercel did not answer the command",
                )))
            }
            Ok(Err(e)) => return Err(RunError::NotStarted(e)),
            Ok(Ok(r)) => r,
        };
        if !resp.status().is_success() {
            return Err(RunError::NotStarted(self.http.error_of("exec", resp).await));
        }
        let mut stream = resp.bytes_stream();
        let mut buf: Vec<u8> = Vec::new();
        let mut cmd_id: Option<String> = None;
        loop {
            let left = deadline.saturating_sub(started.elapsed());
            let next = tokio::select! {
                // A caller hanging up while the command is quiet: kill it by id (known from
                // the stream's first line), as closing our end alone may leave it running.
                () = out.closed(), if cmd_id.is_some() => {
                    if let Some(id) = &cmd_id {
                        self.kill(session, id).await;
                    }
                    return Ok(128 + 9);
                }
                next = tokio::time::timeout(left.min(idle), stream.next()) => next,
            };
            let chunk = match next {
                Err(_) => {
                    if let Some(id) = &cmd_id {
                        self.kill(session, id).await;
                    }
                    if left <= idle {
                        return Ok(124);
                    }
                    return Err(RunError::Started(AdapterError::transient(format!(
                        "exec: Vercel sent nothing for {} s",
                        idle.as_secs()
                    ))));
                }
                Ok(None) => {
                    let e = AdapterError::transient(
                        "exec: the output stream ended before the command did (truncated)",
                    );
                    return Err(if cmd_id.is_some() {
                        RunError::Started(e)
                    } else {
                        RunError::NotStarted(e)
                    });
                }
                Ok(Some(Err(e))) => {
                    return Err(RunError::Started(self.http.transport_error("exec", e)))
                }
                Ok(Some(Ok(c))) => c,
            };
            buf.extend_from_slice(&chunk);
            while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=nl).collect();
                let Ok(l) = serde_json::from_slice::<Line>(&line) else {
                    continue;
                };
                if let Some(c) = l.command {
                    if let Some(code) = c.exit_code {
                        return Ok(code);
                    }
                    cmd_id = Some(c.id);
                    continue;
                }
                let data = l.data.unwrap_or(Value::Null);
                let piece = match (l.stream.as_deref(), &data) {
                    (Some("stdout"), Value::String(s)) => {
                        ExecEvent::Stdout(Bytes::from(s.clone().into_bytes()))
                    }
                    (Some("stderr"), Value::String(s)) => {
                        ExecEvent::Stderr(Bytes::from(s.clone().into_bytes()))
                    }
                    (Some("error"), d) => {
                        let code = d["code"].as_str().unwrap_or_default();
                        let message = self.http.scrub(d["message"].as_str().unwrap_or_default());
                        let e = AdapterError::transient(format!("exec: {code}: {message}"));
                        if let Some(id) = &cmd_id {
                            self.kill(session, id).await;
                        }
                        return Err(RunError::Started(e));
                    }
                    _ => continue,
                };
                // A slow reader slows the command down, but not past its deadline.
                let left = deadline.saturating_sub(started.elapsed());
                let sent = tokio::time::timeout(left, out.send(piece)).await;
                if !matches!(sent, Ok(Ok(()))) {
                    if let Some(id) = &cmd_id {
                        self.kill(session, id).await;
                    }
                    return Ok(if sent.is_err() { 124 } else { 128 + 9 });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_by_status_and_code() {
        let e = map_status(
            "create sandbox",
            StatusCode::TOO_MANY_REQUESTS,
            br#"{"error":{"code":"rate_limited","message":"slow down"}}"#,
            None,
        );
        assert!(
            e.is_retryable() && e.to_string().contains("insufficient capacity"),
            "{e}"
        );
        assert!(matches!(e, AdapterError::Capacity(_)), "{e:?}");
        let e = map_status(
            "create sandbox",
            StatusCode::PAYMENT_REQUIRED,
            br#"{"error":{"code":"plan_limit","message":"upgrade"}}"#,
            Some(std::time::Duration::from_secs(4)),
        );
        assert_eq!(e.retry_after(), Some(std::time::Duration::from_secs(4)));
        let e = map_status(
            "x",
            StatusCode::GONE,
            br#"{"error":{"code":"sandbox_stopped","message":"stopped"}}"#,
            None,
        );
        assert!(e.is_retryable());
        let e = map_status(
            "x",
            StatusCode::GONE,
            br#"{"error":{"code":"snapshot_not_found","message":"gone"}}"#,
            None,
        );
        assert!(matches!(e, AdapterError::Permanent(_)));
        let e = map_status(
            "x",
            StatusCode::UNAUTHORIZED,
            br#"{"error":{"code":"forbidden","message":"token tok_123 invalid"}}"#,
            None,
        );
        assert!(!e.to_string().contains("tok_123"), "{e}");
        assert_eq!(
            map_status("x", StatusCode::NOT_FOUND, b"", None),
            AdapterError::NotFound
        );
    }
}
