//! The bridge's HTTP API as the adapter uses it: file routes (under `/workspace` only),
//! exec as a stream of events, destroy, tunnels and the OpenAPI document (the health probe,
//! since it needs the key). Errors are `{"error", "code"}` with the bridge's stable codes.

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use reqwest::Method;
use serde::Deserialize;
use serde_json::json;

use super::config::Settings;
use super::sse::{Event, Parser};
use crate::credentials::Credentials;
use crate::http::HttpClient;
use crate::kit::paths::segment;
use crate::kit::{ErrorAnswer, Statuses};
use crate::settings::ConfigError;
use crate::AdapterError;

const STATUSES: Statuses = Statuses {
    conflict_settles: false,
    rate_limit_is_capacity: false,
    ..Statuses::api_key("Cloudflare Sandbox bridge")
};

/// The bridge's codes first (`capacity_exceeded` is its warm pool out of instance slots),
/// then the common table. A 404 without a code is a route this bridge does not have.
fn map_error(op: &str, answer: &ErrorAnswer) -> AdapterError {
    let e = answer.error();
    let text = e.describe(op, STATUSES.provider);
    match (e.status, e.code.as_str()) {
        (503, "capacity_exceeded") => AdapterError::capacity(text, answer.retry_after),
        (404, "") => AdapterError::permanent(format!(
            "{op}: the bridge has no such route (is it older than this adapter?)"
        )),
        (413, _) => AdapterError::permanent(text),
        (502, _) => AdapterError::transient(text),
        _ => STATUSES.map(op, &e, answer.retry_after),
    }
}

/// A tunnel as the bridge answers it.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Tunnel {
    pub url: String,
}

#[derive(Deserialize)]
struct OpenApi {
    info: OpenApiInfo,
}

#[derive(Deserialize)]
struct OpenApiInfo {
    version: String,
}

/// A finished script's output.
#[derive(Debug, Default)]
pub(crate) struct Output {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub exit_code: i32,
}

impl Output {
    /// Stderr (or stdout) as text for a message, short.
    pub(crate) fn said(&self) -> String {
        let s = if self.stderr.is_empty() {
            &self.stdout
        } else {
            &self.stderr
        };
        String::from_utf8_lossy(&s[..s.len().min(300)])
            .trim()
            .to_owned()
    }
}

/// The bridge of one pool.
#[derive(Debug, Clone)]
pub(crate) struct Bridge {
    client: HttpClient,
}

/// A sandbox's workspace path in a file-route URL (`/workspace/<rel>`, each segment encoded).
fn file_url(id: &str, rel: &str) -> String {
    let encoded: Vec<String> = rel.split('/').map(segment).collect();
    format!("/v1/sandbox/{id}/file/workspace/{}", encoded.join("/"))
}

impl Bridge {
    pub(crate) fn new(s: &Settings, credentials: &Credentials) -> Result<Bridge, ConfigError> {
        let client = crate::kit::bearer_key_client!(
            s,
            credentials,
            STATUSES.provider,
            &s.bridge_url,
            map_error
        )
        .map_err(|e| e.renamed("apiURL", "bridgeURL"))?;
        Ok(Bridge { client })
    }

    /// The API version of the bridge's OpenAPI document; the key must be accepted.
    pub(crate) async fn api_version(&self) -> Result<String, AdapterError> {
        let doc: OpenApi = self
            .client
            .json(self.client.api(Method::GET, "/v1/openapi.json"), "health")
            .await?;
        Ok(doc.info.version)
    }

    /// Writes `body` at `/workspace/<rel>` of sandbox `id` (parents made by the bridge).
    pub(crate) async fn put_file(
        &self,
        id: &str,
        rel: &str,
        body: Vec<u8>,
    ) -> Result<(), AdapterError> {
        let rb = self
            .client
            .api(Method::PUT, &file_url(id, rel))
            .header("content-type", "application/octet-stream")
            .body(body);
        self.client.send_ok(rb, "write file").await.map(drop)
    }

    /// The bytes of `/workspace/<rel>` of sandbox `id`; `None` when there is no such file.
    pub(crate) async fn get_file(
        &self,
        id: &str,
        rel: &str,
    ) -> Result<Option<Bytes>, AdapterError> {
        let op = "read file";
        let resp = self
            .client
            .send(self.client.api(Method::GET, &file_url(id, rel)), op)
            .await?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            let answer = resp.bytes().await.unwrap_or_default();
            let code =
                crate::kit::ProviderError::parse(reqwest::StatusCode::NOT_FOUND, &answer).code;
            if code == "workspace_read_not_found" {
                return Ok(None);
            }
            return Err(AdapterError::permanent(format!(
                "{op}: the bridge has no file route (is it older than this adapter?)"
            )));
        }
        let resp = self.client.check(op, resp).await?;
        resp.bytes()
            .await
            .map(Some)
            .map_err(|e| self.client.transport_error(op, e))
    }

    /// Destroys sandbox `id`'s container; an id without one is fine (204 either way).
    pub(crate) async fn destroy(&self, id: &str) -> Result<(), AdapterError> {
        let rb = self
            .client
            .api(Method::DELETE, &format!("/v1/sandbox/{id}"));
        self.client.send_ok(rb, "destroy").await.map(drop)
    }

    /// An ephemeral tunnel to `port` (the one the sandbox already has for it, if any).
    pub(crate) async fn tunnel(&self, id: &str, port: u16) -> Result<Tunnel, AdapterError> {
        let rb = self
            .client
            .api(Method::POST, &format!("/v1/sandbox/{id}/tunnel/{port}"));
        self.client.json(rb, "expose port").await
    }

    /// Starts `argv` in sandbox `id` (in `/workspace`) and answers its event stream, which
    /// must end within `timeout` plus the request timeout; `timeout_ms` is sent as the
    /// bridge documents it, though its streamed exec does not apply it.
    pub(crate) async fn exec(
        &self,
        id: &str,
        argv: &[String],
        timeout: Duration,
    ) -> Result<EventStream, AdapterError> {
        let body = json!({
            "argv": argv,
            "cwd": "/workspace",
            "timeout_ms": u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        });
        // The whole answer is the command's output: it may take the command's time, plus
        // the container's start.
        let rb = self
            .client
            .api(Method::POST, &format!("/v1/sandbox/{id}/exec"))
            .timeout(timeout + self.client.request_timeout())
            .json(&body);
        let resp = self.client.send_ok(rb, "exec").await?;
        Ok(EventStream {
            body: resp.bytes_stream().boxed(),
            parser: Parser::default(),
            pending: std::collections::VecDeque::new(),
            client: self.client.clone(),
        })
    }

    /// Runs a script to its end and keeps its output (scripts say little).
    pub(crate) async fn run(&self, id: &str, argv: &[String]) -> Result<Output, AdapterError> {
        let wait = self.client.request_timeout();
        let collect = async {
            let mut s = self.exec(id, argv, wait).await?;
            let mut out = Output::default();
            loop {
                match s.next().await? {
                    Event::Stdout(b) => out.stdout.extend_from_slice(&b),
                    Event::Stderr(b) => out.stderr.extend_from_slice(&b),
                    Event::Exit(code) => {
                        out.exit_code = code;
                        return Ok(out);
                    }
                    Event::Error { message, code } => return Err(exec_error(&message, &code)),
                }
            }
        };
        tokio::time::timeout(wait, collect)
            .await
            .unwrap_or_else(|_| {
                Err(AdapterError::transient(
                    "exec: the bridge did not finish a script in time",
                ))
            })
    }
}

/// The bridge's terminal `error` event: the SDK's exec failed after the stream opened.
pub(crate) fn exec_error(message: &str, code: &str) -> AdapterError {
    AdapterError::transient(format!("exec: the bridge reported {code}: {message}"))
}

/// An exec's events as they arrive.
pub(crate) struct EventStream {
    body: futures::stream::BoxStream<'static, reqwest::Result<Bytes>>,
    parser: Parser,
    pending: std::collections::VecDeque<Event>,
    client: HttpClient,
}

impl EventStream {
    /// The next event; a stream that ends before `exit` or `error` is transient.
    pub(crate) async fn next(&mut self) -> Result<Event, AdapterError> {
        loop {
            if let Some(ev) = self.pending.pop_front() {
                return Ok(ev);
            }
            match self.body.next().await {
                Some(Ok(chunk)) => {
                    for ev in self.parser.push(&chunk) {
                        let ev = ev.map_err(|e| AdapterError::transient(format!("exec: {e}")))?;
                        self.pending.push_back(ev);
                    }
                }
                Some(Err(e)) => return Err(self.client.transport_error("exec", e)),
                None => {
                    return Err(AdapterError::transient(
                        "exec: the bridge's stream was truncated before the command's end",
                    ))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, body: &str) -> ErrorAnswer {
        ErrorAnswer {
            status: reqwest::StatusCode::from_u16(status).unwrap(),
            retry_after: None,
            body: Bytes::from(body.to_owned()),
        }
    }

    #[test]
    fn the_bridge_codes_map() {
        let full = map_error(
            "create",
            &answer(
                503,
                r#"{"error":"Cannot start container: instance limit reached (3/3).","code":"capacity_exceeded"}"#,
            ),
        );
        assert!(matches!(full, AdapterError::Capacity(_)), "{full:?}");
        let refused = map_error(
            "x",
            &answer(401, r#"{"error":"Unauthorized","code":"unauthorized"}"#),
        );
        assert!(
            refused.to_string().contains("refused the API key"),
            "{refused}"
        );
        let bad = map_error(
            "x",
            &answer(
                400,
                r#"{"error":"argv must be a non-empty array","code":"invalid_request"}"#,
            ),
        );
        assert!(
            matches!(&bad, AdapterError::Permanent(_)) && bad.to_string().contains("argv"),
            "{bad}"
        );
        assert!(map_error(
            "x",
            &answer(502, r#"{"error":"pool error: x","code":"pool_error"}"#)
        )
        .is_retryable());
        assert!(matches!(
            map_error("x", &answer(404, "404 Not Found")),
            AdapterError::Permanent(_)
        ));
        assert_eq!(
            file_url("abc", "a b/c"),
            "/v1/sandbox/abc/file/workspace/a%20b/c"
        );
    }
}
