//! The in-pod runtime the project's SDKs speak (`examples/python-runtime-sandbox`): `GET /`,
//! `POST /execute {"command"}`, multipart `POST /upload` and `GET /download/{path}`, reached
//! through the sandbox router (`X-Sandbox-ID`, `X-Sandbox-Namespace`, `X-Sandbox-Port`) or a
//! per-pod URL pattern. No credential goes there: the router strips `Authorization` and the
//! runtime has none.
//!
//! Its quirks, answered here: paths are relative to its base directory and percent-decoded
//! twice (so they are encoded twice); every failure to run a command is exit code 1 with
//! `Failed to execute command: …` on stderr; output is JSON text.

use bytes::Bytes;
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::Deserialize;

use super::config::{Addressing, Settings};
use super::kube::enc;
use crate::credentials::Credentials;
use crate::http::{HttpClient, HttpClientBuilder, HttpConfigError};
use crate::{AdapterError, PathProblem};

/// The runtime's answer to `/execute`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Executed {
    #[serde(default)]
    pub stdout: String,
    #[serde(default)]
    pub stderr: String,
    pub exit_code: i64,
}

/// The prefix of the runtime's own failures (`main.py`'s `except` branch).
pub(crate) const RUNTIME_FAILURE: &str = "Failed to execute command: ";

/// Why a runtime call did not get an answer from the pod.
#[derive(Debug)]
pub(crate) enum Call {
    /// The router could not dial the pod, or the pod's address did not answer: the
    /// sandbox may be gone (the adapter asks the API) or not up yet.
    Unreachable(String),
    Failed(AdapterError),
}

impl From<AdapterError> for Call {
    fn from(e: AdapterError) -> Call {
        Call::Failed(e)
    }
}

/// A client of the runtimes of one namespace.
#[derive(Debug, Clone)]
pub(crate) struct Runtime {
    http: HttpClient,
    addressing: Addressing,
    namespace: String,
    port: u16,
}

#[derive(Debug, Default, Deserialize)]
struct ErrorBody {
    detail: Option<serde_json::Value>,
    message: Option<String>,
}

impl Runtime {
    pub(crate) fn new(s: &Settings, credentials: &Credentials) -> Result<Runtime, HttpConfigError> {
        let base = match &s.addressing {
            Addressing::Router(u) | Addressing::Pattern(u) => u.clone(),
        };
        let http = HttpClientBuilder::new("agent-sandbox runtime", base)
            .request_timeout(s.request_timeout)
            .ca_bundle(s.ca_bundle.clone())
            .build(credentials)?;
        Ok(Runtime {
            http,
            addressing: s.addressing.clone(),
            namespace: s.namespace.clone(),
            port: s.runtime_port,
        })
    }

    /// A request for `path` (starting with `/`) of the runtime of Sandbox `name`.
    fn request(&self, method: Method, name: &str, path: &str) -> RequestBuilder {
        match &self.addressing {
            Addressing::Router(base) => self
                .http
                .to(method, &format!("{base}{path}"))
                .header("X-Sandbox-ID", name)
                .header("X-Sandbox-Namespace", &self.namespace)
                .header("X-Sandbox-Port", self.port.to_string()),
            Addressing::Pattern(p) => {
                let base = p
                    .replace("{name}", &enc(name))
                    .replace("{namespace}", &self.namespace);
                self.http.to(method, &format!("{base}{path}"))
            }
        }
    }

    async fn send(
        &self,
        rb: RequestBuilder,
        op: &str,
        timeout: std::time::Duration,
    ) -> Result<Response, Call> {
        match self.http.send(rb.timeout(timeout), op).await {
            Ok(r) if r.status() == StatusCode::BAD_GATEWAY => {
                let body = r.text().await.unwrap_or_default();
                Err(Call::Unreachable(format!(
                    "{op}: HTTP 502: {}",
                    snippet(&body)
                )))
            }
            Ok(r) => Ok(r),
            Err(AdapterError::Transient(m) | AdapterError::Unavailable(m))
                if m.message().contains("cannot connect") =>
            {
                Err(Call::Unreachable(m.message().to_owned()))
            }
            Err(e) => Err(Call::Failed(e)),
        }
    }

    /// `GET /`: the runtime answers.
    pub(crate) async fn health(&self, name: &str) -> Result<(), Call> {
        let rb = self.request(Method::GET, name, "/");
        let resp = self
            .send(rb, "runtime health", self.http.request_timeout())
            .await?;
        check(resp, "runtime health", "/").await.map(|_| ())
    }

    /// `POST /execute` of one command line, waiting up to `timeout` for the answer.
    pub(crate) async fn execute(
        &self,
        name: &str,
        line: &str,
        timeout: std::time::Duration,
    ) -> Result<Executed, Call> {
        let op = "exec";
        let rb = self
            .request(Method::POST, name, "/execute")
            .json(&serde_json::json!({ "command": line }));
        let resp = check(self.send(rb, op, timeout).await?, op, "").await?;
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| Call::Failed(self.http.transport_error(op, e)))?;
        Ok(crate::http::decode_answer(
            &bytes,
            op,
            "the agent-sandbox runtime",
        )?)
    }

    /// `POST /upload` of `bytes` to `rel` (relative to the base directory); `shown` is the
    /// sandbox path for messages.
    pub(crate) async fn upload(
        &self,
        name: &str,
        rel: &str,
        shown: &str,
        bytes: Bytes,
    ) -> Result<(), Call> {
        let op = "upload";
        let boundary = format!("differently-{:016x}", rand_u64());
        let mut body = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{rel}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        )
        .into_bytes();
        body.extend_from_slice(&bytes);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let rb = self
            .request(Method::POST, name, "/upload")
            .header(
                "Content-Type",
                format!("multipart/form-data; boundary={boundary}"),
            )
            .body(body);
        let timeout = self.http.request_timeout() * 4;
        check(self.send(rb, op, timeout).await?, op, shown)
            .await
            .map(|_| ())
    }

    /// `GET /download/{path}`, the path encoded twice (the runtime decodes it twice).
    pub(crate) async fn download(
        &self,
        name: &str,
        rel: &str,
        shown: &str,
    ) -> Result<Response, Call> {
        let op = "download";
        let path = format!("/download/{}", enc(&enc(rel)));
        let rb = self.request(Method::GET, name, &path);
        let timeout = self.http.request_timeout() * 4;
        check(self.send(rb, op, timeout).await?, op, shown).await
    }

    pub(crate) fn transport_error(&self, op: &str, e: reqwest::Error) -> AdapterError {
        self.http.transport_error(op, e)
    }
}

/// A random-enough number for multipart boundaries and temporary names.
pub(crate) fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

fn snippet(s: &str) -> String {
    s.chars().take(200).collect()
}

/// `resp` if 2xx; else the error it means for sandbox path `shown`.
async fn check(resp: Response, op: &str, shown: &str) -> Result<Response, Call> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let body = resp.bytes().await.unwrap_or_default();
    let parsed: ErrorBody = serde_json::from_slice(&body).unwrap_or_default();
    let text = parsed
        .message
        .or_else(|| parsed.detail.map(|d| d.to_string()))
        .unwrap_or_else(|| snippet(&String::from_utf8_lossy(&body)));
    let msg = format!("{op}: runtime HTTP {}: {text}", status.as_u16());
    Err(Call::Failed(match status.as_u16() {
        404 if !shown.is_empty() => AdapterError::PathNotFound(shown.to_owned()),
        403 => AdapterError::invalid_field(
            "path",
            format!("{op}: the runtime refuses {shown}: it is outside its base directory"),
        ),
        500 if text.contains("Is a directory") => {
            AdapterError::bad_path(shown, PathProblem::IsADirectory)
        }
        500 if text.contains("Not a directory") => {
            AdapterError::bad_path(shown, PathProblem::NotADirectory)
        }
        500 if text.contains("Read-only file system") => {
            AdapterError::bad_path(shown, PathProblem::ReadOnly)
        }
        408 | 429 | 500..=599 => AdapterError::transient(msg),
        _ => AdapterError::permanent(msg),
    }))
}
