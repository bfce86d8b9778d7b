//! The harness's HTTP client for `/v1`, and tenant provisioning (orgs, projects, keys) with
//! the documented fallback to the bootstrap key while the tenancy routes are not served.
//!
//! Provisioning is setup, not measured: it goes through `differently-client` like any
//! application. The measured calls (create, wait, exec, delete, streamed exec) stay raw
//! `reqwest` on one shared pool, so what the generator times is the API and the HTTP stack,
//! not a client library's decoding (its SSE and frame readers count bytes in place).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::frames::{FrameReader, Piece, MEDIA_TYPE as FRAMES_MEDIA_TYPE};
use crate::sse::SseReader;
use crate::LoadError;

/// Scopes every load-test key gets.
pub const SCOPES: [&str; 3] = ["sandboxes:read", "sandboxes:write", "sandboxes:exec"];

/// A client of one API, all traffic to 127.0.0.1.
#[derive(Clone)]
pub struct Api {
    http: reqwest::Client,
    base: String,
}

/// One tenant the generator acts as.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Tenant {
    /// Display name.
    pub name: String,
    /// The organization id (from the API, or `None` for the bootstrap tenant).
    pub org_id: Option<String>,
    /// The project id (`None` for the bootstrap tenant).
    pub project_id: Option<String>,
    /// The key (never serialized into reports).
    #[serde(skip)]
    pub key: String,
}

/// How tenants were provisioned.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Tenancy {
    /// `multi-org` when `POST /v1/orgs` works, else `bootstrap-fallback`.
    pub mode: String,
    /// Why the fallback was taken, when it was.
    pub note: Option<String>,
    /// The tenants, in round-robin order.
    pub tenants: Vec<Tenant>,
}

/// The outcome of one create.
#[derive(Debug, Clone)]
pub enum Created {
    /// 202 with this id.
    Accepted(String),
    /// Any other answer.
    Refused(u16, String),
}

/// The response format of `POST …/exec/stream`, chosen with `Accept`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum StreamFormat {
    /// Server-sent events with JSON-string output (the default).
    Sse,
    /// Binary length-prefixed frames (`Accept: application/vnd.differently.exec-stream`).
    Frames,
}

/// The body of a `stdout`/`stderr` event of `POST …/exec/stream`.
#[derive(Deserialize)]
struct DataEvent {
    data: String,
}

fn truncate(s: &str) -> String {
    s.chars().take(400).collect()
}

impl Api {
    /// A client of `base` (`http://127.0.0.1:PORT`).
    pub fn new(base: String) -> Result<Api, LoadError> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(1024)
            .build()
            .map_err(|e| LoadError::http("building the HTTP client", e))?;
        Ok(Api { http, base })
    }

    /// The underlying client (shared connection pool).
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// POSTs JSON with `key`; returns the status and the body (JSON, or `null`).
    pub async fn post(
        &self,
        key: &str,
        path: &str,
        body: &Value,
    ) -> Result<(u16, Value), LoadError> {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(key)
            .json(body)
            .send()
            .await
            .map_err(|e| LoadError::http(format!("POST {path}"), e))?;
        let status = r.status().as_u16();
        let text = r
            .text()
            .await
            .map_err(|e| LoadError::http(format!("POST {path} body"), e))?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
    }

    /// `POST /v1/sandboxes {}`.
    pub async fn create(&self, key: &str) -> Result<Created, LoadError> {
        let (status, body) = self.post(key, "/v1/sandboxes", &json!({})).await?;
        match (status, body["id"].as_str()) {
            (202, Some(id)) => Ok(Created::Accepted(id.to_owned())),
            _ => Ok(Created::Refused(status, truncate(&body.to_string()))),
        }
    }

    /// `GET /v1/sandboxes/{id}/wait?status=…`; returns the status the sandbox has.
    pub async fn wait(
        &self,
        key: &str,
        id: &str,
        status: &str,
        timeout_seconds: u64,
    ) -> Result<String, LoadError> {
        let path =
            format!("/v1/sandboxes/{id}/wait?status={status}&timeoutSeconds={timeout_seconds}");
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(key)
            .send()
            .await
            .map_err(|e| LoadError::http(format!("GET {path}"), e))?;
        let code = r.status().as_u16();
        let body: Value = r
            .json()
            .await
            .map_err(|e| LoadError::http(format!("GET {path} body"), e))?;
        if code != 200 {
            return Err(LoadError::Api {
                context: format!("GET {path}"),
                status: code,
                body: truncate(&body.to_string()),
            });
        }
        Ok(body["status"].as_str().unwrap_or("").to_owned())
    }

    /// `POST /v1/sandboxes/{id}/exec` running `echo hi`; checks the answer.
    pub async fn exec_echo(&self, key: &str, id: &str) -> Result<(), LoadError> {
        let path = format!("/v1/sandboxes/{id}/exec");
        let (status, body) = self
            .post(key, &path, &json!({"command": ["echo", "hi"]}))
            .await?;
        if status != 200 || body["stdout"] != "hi\n" || body["exitCode"] != 0 {
            return Err(LoadError::Api {
                context: format!("POST {path}"),
                status,
                body: truncate(&body.to_string()),
            });
        }
        Ok(())
    }

    /// `DELETE /v1/sandboxes/{id}`; returns the HTTP status.
    pub async fn delete(&self, key: &str, id: &str) -> Result<u16, LoadError> {
        let path = format!("/v1/sandboxes/{id}");
        let r = self
            .http
            .delete(format!("{}{path}", self.base))
            .bearer_auth(key)
            .send()
            .await
            .map_err(|e| LoadError::http(format!("DELETE {path}"), e))?;
        let status = r.status().as_u16();
        let _ = r.bytes().await;
        Ok(status)
    }

    /// Streams `fake-output bytes` through `POST /v1/sandboxes/{id}/exec/stream` in `format`
    /// and returns the stdout bytes received, which must be exactly `bytes` (anything else is
    /// an error). SSE uses the default output encoding (UTF-8 text in JSON: exact for the
    /// fake's ASCII `y\n`, and what a client gets unless it asks for base64), and every event's
    /// JSON is decoded as a client would; frames are read with [`FrameReader`], which counts
    /// payload bytes in place. Either way the caller's clock measures the whole path.
    pub async fn stream_fake_output(
        &self,
        key: &str,
        id: &str,
        bytes: u64,
        timeout: Duration,
        format: StreamFormat,
    ) -> Result<u64, LoadError> {
        let path = format!("/v1/sandboxes/{id}/exec/stream");
        let check = |m: String| LoadError::Check(format!("POST {path} ({format:?}): {m}"));
        let mut req = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(key)
            .json(&json!({
                "command": ["fake-output", bytes.to_string()],
                "timeoutSeconds": timeout.as_secs().max(1),
            }))
            .timeout(timeout + Duration::from_secs(5));
        if format == StreamFormat::Frames {
            req = req.header("accept", FRAMES_MEDIA_TYPE);
        }
        let r = req
            .send()
            .await
            .map_err(|e| LoadError::http(format!("POST {path}"), e))?;
        let status = r.status().as_u16();
        if status != 200 {
            let body = r.text().await.unwrap_or_default();
            return Err(LoadError::Api {
                context: format!("POST {path}"),
                status,
                body: truncate(&body),
            });
        }
        let content_type = r
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let wanted = match format {
            StreamFormat::Sse => "text/event-stream",
            StreamFormat::Frames => FRAMES_MEDIA_TYPE,
        };
        if !content_type.starts_with(wanted) {
            return Err(check(format!(
                "answered Content-Type {content_type:?}, not {wanted}"
            )));
        }
        let got = match format {
            StreamFormat::Sse => read_sse_output(r, &path).await?,
            StreamFormat::Frames => read_frame_output(r, &path).await?,
        };
        let StreamOutput {
            stdout,
            stderr,
            exit,
        } = got;
        let exit: Value = serde_json::from_slice(&exit)
            .map_err(|e| check(format!("the exit payload is not JSON: {e}")))?;
        if exit["exitCode"] != 0 || !stderr.is_empty() {
            return Err(check(format!(
                "fake-output {bytes} exited with {} and stderr {:?}",
                exit["exitCode"],
                truncate(&String::from_utf8_lossy(&stderr))
            )));
        }
        if stdout != bytes {
            return Err(check(format!(
                "asked for {bytes} bytes of fake-output, {stdout} arrived"
            )));
        }
        Ok(stdout)
    }

    /// Status of a POST to `/v1/sandboxes/{id}/exec/stream`, to tell whether streamed exec
    /// is served at all.
    pub async fn exec_stream_status(&self, key: &str, id: &str) -> Result<u16, LoadError> {
        let path = format!("/v1/sandboxes/{id}/exec/stream");
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(key)
            .json(&json!({"command": ["echo", "hi"]}))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .map_err(|e| LoadError::http(format!("POST {path}"), e))?;
        Ok(r.status().as_u16())
    }
}

/// What a streamed exec delivered: stdout bytes counted, stderr kept, the exit JSON.
struct StreamOutput {
    stdout: u64,
    stderr: Vec<u8>,
    exit: Vec<u8>,
}

/// Reads an SSE exec stream to its end, JSON-decoding every output event.
async fn read_sse_output(mut r: reqwest::Response, path: &str) -> Result<StreamOutput, LoadError> {
    let check = |m: String| LoadError::Check(format!("POST {path} (Sse): {m}"));
    let mut sse = SseReader::default();
    let (mut stdout, mut stderr) = (0u64, Vec::new());
    let mut exit = None;
    while let Some(chunk) = r
        .chunk()
        .await
        .map_err(|e| LoadError::http(format!("POST {path} body"), e))?
    {
        for ev in sse.push(&chunk) {
            match ev.event.as_str() {
                "stdout" | "stderr" => {
                    let d: DataEvent = serde_json::from_slice(&ev.data).map_err(|e| {
                        check(format!("{} event is not {{\"data\": …}}: {e}", ev.event))
                    })?;
                    if ev.event == "stdout" {
                        stdout += d.data.len() as u64;
                    } else {
                        stderr.extend_from_slice(d.data.as_bytes());
                    }
                }
                "exit" => exit = Some(ev.data),
                "error" => {
                    return Err(LoadError::Api {
                        context: format!("POST {path} (error event)"),
                        status: 200,
                        body: truncate(&String::from_utf8_lossy(&ev.data)),
                    })
                }
                other => return Err(check(format!("unexpected event {other:?}"))),
            }
        }
    }
    let exit = exit.ok_or_else(|| check("the stream ended without an exit event".into()))?;
    Ok(StreamOutput {
        stdout,
        stderr,
        exit,
    })
}

/// Reads a binary frame stream to its end, counting stdout bytes in place.
async fn read_frame_output(
    mut r: reqwest::Response,
    path: &str,
) -> Result<StreamOutput, LoadError> {
    let check = |m: String| LoadError::Check(format!("POST {path} (Frames): {m}"));
    let mut reader = FrameReader::default();
    let (mut stdout, mut stderr) = (0u64, Vec::new());
    let (mut exit, mut error) = (None, None);
    while let Some(chunk) = r
        .chunk()
        .await
        .map_err(|e| LoadError::http(format!("POST {path} body"), e))?
    {
        reader
            .push(&chunk, |p| match p {
                Piece::Stdout(b) => stdout += b.len() as u64,
                Piece::Stderr(b) => stderr.extend_from_slice(b),
                Piece::Heartbeat => {}
                Piece::Exit(j) => exit = Some(j),
                Piece::Error(j) => error = Some(j),
            })
            .map_err(|e| check(e.to_string()))?;
    }
    reader.finish().map_err(|e| check(e.to_string()))?;
    if let Some(e) = error {
        return Err(LoadError::Api {
            context: format!("POST {path} (error frame)"),
            status: 200,
            body: truncate(&String::from_utf8_lossy(&e)),
        });
    }
    let exit = exit.ok_or_else(|| check("the stream ended without an exit frame".into()))?;
    Ok(StreamOutput {
        stdout,
        stderr,
        exit,
    })
}

/// Provisions `orgs` organizations, each with one project and one key scoped to it, per
/// the API contract. When `POST /v1/orgs` answers 404 (tenancy not served yet), falls back
/// to one tenant acting with the bootstrap key, and says so in `Tenancy::note`.
pub async fn provision(api: &Api, bootstrap_key: &str, orgs: usize) -> Result<Tenancy, LoadError> {
    let admin = differently_client::Client::builder(api.base.clone(), bootstrap_key)
        .http_client(api.http.clone())
        .build()
        .map_err(|e| LoadError::client("building the API client", e))?;
    let mut tenants = Vec::with_capacity(orgs);
    for i in 0..orgs {
        let name = format!("load-org-{i}");
        let org = match admin.create_org(&name, None).await {
            Ok(org) => org,
            Err(e) if e.status() == Some(404) && i == 0 => {
                let message = e.api().map(|a| a.message.clone()).unwrap_or_default();
                return Ok(Tenancy {
                    mode: "bootstrap-fallback".to_owned(),
                    note: Some(format!(
                        "POST /v1/orgs answered 404 ({}): tenancy routes are not served yet, so \
                         every sandbox is created with the bootstrap key in its single org/project; \
                         per-org figures collapse into one org",
                        truncate(&message)
                    )),
                    tenants: vec![Tenant {
                        name: "bootstrap".to_owned(),
                        org_id: None,
                        project_id: None,
                        key: bootstrap_key.to_owned(),
                    }],
                });
            }
            Err(e) => return Err(LoadError::client("POST /v1/orgs", e)),
        };
        let project = admin
            .create_project(Some(&org.id), &format!("{name}-project"), None)
            .await
            .map_err(|e| LoadError::client("POST /v1/projects", e))?;
        let key = admin
            .create_key(
                &differently_client::CreateKey {
                    org_id: Some(org.id.clone()),
                    project_id: Some(project.id.clone()),
                    name: format!("{name}-key"),
                    scopes: SCOPES.iter().map(|s| (*s).to_owned()).collect(),
                    expires_at: None,
                },
                None,
            )
            .await
            .map_err(|e| LoadError::client("POST /v1/keys", e))?;
        tenants.push(Tenant {
            name,
            org_id: Some(org.id),
            project_id: Some(project.id),
            key: key.key,
        });
    }
    Ok(Tenancy {
        mode: "multi-org".to_owned(),
        note: None,
        tenants,
    })
}
