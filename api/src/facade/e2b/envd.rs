//! What every envd call shares: who is calling (the `X-Access-Token` checked against the
//! sandbox in `E2b-Sandbox-Id`), as which E2B user (`Authorization: Basic <user>:` or the
//! `username` query; default `user`), that user's home and the paths resolved against it,
//! the errors, and one-shot commands run through `/v1` exec.
//!
//! A sandbox the token does not open, one that has ended, another tenant's, and one that is
//! not running all answer the same as E2B's edge does for a sandbox it cannot reach: 502
//! `{"code": 502, "message": "The sandbox … was not found"}`. So a token learns nothing about
//! sandboxes it was not derived for.

use std::sync::Arc;

use axum::body::Bytes;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use base64::Engine;
use serde_json::{json, Value};

use crate::facade::opensandbox::inner::{q, Caller};

use super::connect::ConnectError;
use super::{token, Facade, InnerError};

/// envd's own port; requests for other ports (the code interpreter's 49999) are forwarded
/// to the sandbox by [`super::port_proxy`] before they reach envd's routes.
pub const ENVD_PORT: &str = "49983";
/// E2B's default user when the SDK names none.
pub const DEFAULT_USER: &str = "user";

/// Why an envd call was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvdError {
    /// The sandbox cannot be reached by this caller (absent, ended, another tenant's, not
    /// running, or the token is not for it).
    SandboxGone(String),
    /// A Connect error.
    Rpc(ConnectError),
}

impl EnvdError {
    /// The mapping of a `/v1` error answer.
    pub fn from_v1(sandbox: &str, status: StatusCode, body: &[u8]) -> EnvdError {
        let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let code = v["error"]["code"].as_str().unwrap_or("");
        let message = v["error"]["message"].as_str().unwrap_or("request failed");
        let gone = (code == "not_found" && message == "sandbox not found")
            || (code == "conflict" && message.contains("needs a running sandbox"));
        if gone {
            return EnvdError::SandboxGone(sandbox.to_owned());
        }
        let code = if code.is_empty() {
            match status.as_u16() {
                401 => "unauthenticated",
                404 => "not_found",
                _ => "unknown",
            }
        } else {
            ConnectError::code_of_v1(code)
        };
        EnvdError::Rpc(ConnectError::new(code, message))
    }

    /// The mapping of an inner call's failure.
    pub fn from_inner(sandbox: &str, e: InnerError) -> EnvdError {
        match e {
            InnerError::Answer(status, body) => EnvdError::from_v1(sandbox, status, &body),
            InnerError::Facade(e) => EnvdError::Rpc(ConnectError::new("internal", e.message)),
        }
    }

    /// The answer of envd's plain HTTP routes (`/files`, `/health`): `{code: int, message}`.
    pub fn rest(self) -> Response {
        let (status, message) = match self {
            EnvdError::SandboxGone(id) => (StatusCode::BAD_GATEWAY, gone_message(&id)),
            EnvdError::Rpc(e) => (e.status(), e.message),
        };
        (
            status,
            Json(json!({ "code": status.as_u16(), "message": message })),
        )
            .into_response()
    }
}

fn gone_message(id: &str) -> String {
    format!("The sandbox {id} was not found")
}

impl IntoResponse for EnvdError {
    /// A unary RPC's answer: a Connect error, or E2B's 502 for a sandbox it cannot reach.
    fn into_response(self) -> Response {
        match self {
            EnvdError::Rpc(e) => e.into_response(),
            gone @ EnvdError::SandboxGone(_) => gone.rest(),
        }
    }
}

impl From<ConnectError> for EnvdError {
    fn from(e: ConnectError) -> EnvdError {
        EnvdError::Rpc(e)
    }
}

/// An envd call's caller, sandbox and user.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub caller: Caller,
    pub sandbox: String,
    pub user: String,
    pub home: String,
}

/// The context of an envd request; `username` is the `/files` query's user, which wins
/// over `Authorization`.
pub fn ctx(f: &Facade, h: &HeaderMap, username: Option<&str>) -> Result<Ctx, EnvdError> {
    let sandbox = named_sandbox(h)
        .ok_or_else(|| {
            ConnectError::field("E2b-Sandbox-Id", "required: the sandbox this call is for")
        })?
        .to_owned();
    check_port(h)?;
    let token = h
        .get(token::HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            ConnectError::new(
                "unauthenticated",
                "missing X-Access-Token: use the envdAccessToken of the create or connect answer",
            )
        })?;
    let key_id = f
        .tokens
        .open(token, &sandbox)
        .map_err(|_| EnvdError::SandboxGone(sandbox.clone()))?;
    f.seen.note(token, &sandbox, &key_id);
    ctx_of(h, username, sandbox, key_id)
}

/// Refuses a request for a port other than envd's (`E2b-Sandbox-Port`, or the host's) that
/// reached an envd route anyway: the port proxy takes those under `/e2b/envd`, so only the
/// signed-URL `/files` outside the prefix can get here with one.
pub fn check_port(h: &HeaderMap) -> Result<(), EnvdError> {
    if let Some(port) = h.get("e2b-sandbox-port").and_then(|v| v.to_str().ok()) {
        if port.trim() != ENVD_PORT {
            return Err(ConnectError::unimplemented(
                &format!("port {port}"),
                "only envd (port 49983) is served here; other ports are reached under /e2b/envd",
            )
            .into());
        }
    }
    Ok(())
}

/// The sandbox named by `E2b-Sandbox-Id` (or, in DNS mode, the host), if any.
pub fn named_sandbox(h: &HeaderMap) -> Option<&str> {
    h.get("e2b-sandbox-id")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// The context of a call already known to be `key_id`'s on `sandbox` (a checked token or a
/// signed URL): its user and home.
pub fn ctx_of(
    h: &HeaderMap,
    username: Option<&str>,
    sandbox: String,
    key_id: String,
) -> Result<Ctx, EnvdError> {
    let user = match username.filter(|u| !u.is_empty()) {
        Some(u) => u.to_owned(),
        None => basic_user(h)?.unwrap_or_else(|| DEFAULT_USER.to_owned()),
    };
    let valid = user.bytes().enumerate().all(|(i, b)| {
        b.is_ascii_lowercase() || b == b'_' || (i > 0 && (b.is_ascii_digit() || b == b'-'))
    });
    if user.is_empty() || user.len() > 32 || !valid {
        return Err(ConnectError::field("user", "not a Linux user name").into());
    }
    let home = if user == "root" {
        "/root".to_owned()
    } else {
        format!("/home/{user}")
    };
    Ok(Ctx {
        caller: Caller::Delegated(key_id),
        sandbox,
        user,
        home,
    })
}

/// The user of `Authorization: Basic base64("<user>:")`.
fn basic_user(h: &HeaderMap) -> Result<Option<String>, EnvdError> {
    let Some(v) = h.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) else {
        return Ok(None);
    };
    let Some(b64) = v.strip_prefix("Basic ") else {
        return Ok(None);
    };
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_err(|_| ConnectError::field("Authorization", "not base64"))?;
    let s =
        String::from_utf8(raw).map_err(|_| ConnectError::field("Authorization", "not UTF-8"))?;
    Ok(Some(s.split(':').next().unwrap_or_default().to_owned()))
}

impl Ctx {
    /// `path` as envd resolves it: `~` and relative paths against the user's home, `.` and
    /// `..` folded (never above `/`).
    pub fn resolve(&self, path: &str) -> String {
        let joined = if path.is_empty() || path == "~" {
            self.home.clone()
        } else if let Some(rest) = path.strip_prefix("~/") {
            format!("{}/{rest}", self.home)
        } else if path.starts_with('/') {
            path.to_owned()
        } else {
            format!("{}/{path}", self.home)
        };
        let mut parts: Vec<&str> = Vec::new();
        for p in joined.split('/') {
            match p {
                "" | "." => {}
                ".." => {
                    parts.pop();
                }
                p => parts.push(p),
            }
        }
        format!("/{}", parts.join("/"))
    }

    /// A JSON `/v1` call about this sandbox.
    pub async fn json(
        &self,
        f: &Facade,
        method: Method,
        uri: &str,
        body: Option<&Value>,
    ) -> Result<Value, EnvdError> {
        f.json(&self.caller, method, uri, body, &[])
            .await
            .map(|(_, v)| v)
            .map_err(|e| EnvdError::from_inner(&self.sandbox, e))
    }

    /// `argv` run to its end in the sandbox: exit code, stdout, stderr.
    pub async fn exec(
        &self,
        f: &Facade,
        argv: &[&str],
    ) -> Result<(i64, String, String), EnvdError> {
        let uri = format!("/v1/sandboxes/{}/exec", q(&self.sandbox));
        let v = self
            .json(f, Method::POST, &uri, Some(&json!({ "command": argv })))
            .await?;
        Ok((
            v["exitCode"].as_i64().unwrap_or(-1),
            v["stdout"].as_str().unwrap_or_default().to_owned(),
            v["stderr"].as_str().unwrap_or_default().to_owned(),
        ))
    }
}

/// `GET /health`: 204 while the caller's sandbox runs, E2B's 502 otherwise (the SDK's
/// `is_running()`).
pub async fn health(Extension(f): Extension<Arc<Facade>>, headers: HeaderMap) -> Response {
    let c = match ctx(&f, &headers, None) {
        Ok(c) => c,
        Err(e) => return e.rest(),
    };
    let uri = format!("/v1/sandboxes/{}", q(&c.sandbox));
    match c.json(&f, Method::GET, &uri, None).await {
        Ok(sbx) if sbx["status"] == "running" => StatusCode::NO_CONTENT.into_response(),
        Ok(_) => EnvdError::SandboxGone(c.sandbox).rest(),
        Err(e) => e.rest(),
    }
}

/// Any other envd route.
pub async fn not_served(method: Method, uri: axum::http::Uri, _body: Bytes) -> Response {
    ConnectError::unimplemented(
        &format!("{method} {}", uri.path()),
        "this envd route is not served",
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_against_the_users_home() {
        let c = Ctx {
            caller: Caller::Anonymous,
            sandbox: "sbx".into(),
            user: "user".into(),
            home: "/home/user".into(),
        };
        assert_eq!(c.resolve("a.txt"), "/home/user/a.txt");
        assert_eq!(c.resolve("~/d/../b"), "/home/user/b");
        assert_eq!(c.resolve("/tmp/./x/"), "/tmp/x");
        assert_eq!(c.resolve("/../../etc"), "/etc");
        assert_eq!(c.resolve(""), "/home/user");
    }

    #[test]
    fn unreachable_sandboxes_all_answer_the_same() {
        let nf = br#"{"error":{"code":"not_found","message":"sandbox not found"}}"#;
        assert_eq!(
            EnvdError::from_v1("s", StatusCode::NOT_FOUND, nf),
            EnvdError::SandboxGone("s".into())
        );
        let file = br#"{"error":{"code":"not_found","message":"/x: no such file or directory"}}"#;
        assert!(matches!(
            EnvdError::from_v1("s", StatusCode::NOT_FOUND, file),
            EnvdError::Rpc(ConnectError {
                code: "not_found",
                ..
            })
        ));
    }
}
