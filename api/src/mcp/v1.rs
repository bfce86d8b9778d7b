//! How the MCP server reaches `/v1`: one request at a time, with the caller's own key. Both
//! transports implement [`V1`] — `/mcp` by calling the API's router in process, `differently
//! mcp` over HTTP — so a tool call is exactly the `/v1` call it maps to: the same scopes,
//! validation, quotas, policy, tenancy and audit record, with no second path to the store.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, Method, Request, StatusCode};
use axum::Router;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use tower::ServiceExt;

/// One `/v1` request. `path` starts with `/v1/` and carries its query.
#[derive(Debug, Clone)]
pub struct V1Request {
    pub method: Method,
    pub path: String,
    pub headers: Vec<(header::HeaderName, HeaderValue)>,
    pub body: Bytes,
}

impl V1Request {
    /// A request without a body.
    pub fn new(method: Method, path: impl Into<String>) -> V1Request {
        V1Request {
            method,
            path: path.into(),
            headers: Vec::new(),
            body: Bytes::new(),
        }
    }

    /// A request with a JSON body.
    pub fn json(method: Method, path: impl Into<String>, body: &serde_json::Value) -> V1Request {
        V1Request {
            method,
            path: path.into(),
            headers: vec![(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body: Bytes::from(body.to_string()),
        }
    }

    /// Adds a header.
    pub fn header(mut self, name: header::HeaderName, value: HeaderValue) -> V1Request {
        self.headers.push((name, value));
        self
    }
}

/// The answer: status, headers, and the body as it arrives (a streamed exec's frames).
pub struct V1Response {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: BoxStream<'static, Result<Bytes, String>>,
}

impl V1Response {
    /// The whole body, refusing more than `cap` bytes.
    pub async fn bytes(mut self, cap: usize) -> Result<Bytes, ReadError> {
        let mut out = Vec::new();
        while let Some(chunk) = self.body.next().await {
            let chunk = chunk.map_err(ReadError::Transport)?;
            if out.len() + chunk.len() > cap {
                return Err(ReadError::TooLarge { cap });
            }
            out.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(out))
    }
}

/// Why an answer's body could not be read whole. The two are told apart because they mean
/// different things to a caller: the API went away (retry later), or the answer is larger
/// than this server reads (nothing is down; retrying gets the same).
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReadError {
    /// The body broke off.
    #[error("the API's answer broke off: {0}")]
    Transport(String),
    /// The body is longer than the reader's cap.
    #[error("the API's answer is longer than the {cap} bytes read of it")]
    TooLarge { cap: usize },
}

/// Sends `/v1` requests as one caller. The future is `'static` so a call can run in a task
/// of its own (and be cancelled by dropping it: a dropped streamed exec ends the command).
pub trait V1: Send + Sync + 'static {
    /// Sends `req`; `Err` is a transport failure (the API unreachable), never an API error.
    fn call(&self, req: V1Request) -> BoxFuture<'static, Result<V1Response, String>>;
}

/// `/v1` in process: the API's own router (below the outer layers, which the `/mcp` request
/// itself already passed), with the caller's `Authorization` header on every request.
#[derive(Clone)]
pub struct InProcess {
    router: Router,
    authorization: HeaderValue,
}

impl InProcess {
    /// Calls `router` as the caller who presented `authorization`.
    pub fn new(router: Router, authorization: HeaderValue) -> InProcess {
        InProcess {
            router,
            authorization,
        }
    }
}

impl V1 for InProcess {
    fn call(&self, req: V1Request) -> BoxFuture<'static, Result<V1Response, String>> {
        let router = self.router.clone();
        let auth = self.authorization.clone();
        Box::pin(async move {
            let mut http = Request::builder()
                .method(req.method)
                .uri(&req.path)
                .body(Body::from(req.body))
                .map_err(|e| format!("inner request: {e}"))?;
            http.headers_mut().insert(header::AUTHORIZATION, auth);
            for (k, v) in req.headers {
                http.headers_mut().insert(k, v);
            }
            let resp = router
                .oneshot(http)
                .await
                .map_err(|e: std::convert::Infallible| e.to_string())?;
            let (parts, body) = resp.into_parts();
            Ok(V1Response {
                status: parts.status,
                headers: parts.headers,
                body: body.into_data_stream().map_err(|e| e.to_string()).boxed(),
            })
        })
    }
}

impl<T: V1> V1 for Arc<T> {
    fn call(&self, req: V1Request) -> BoxFuture<'static, Result<V1Response, String>> {
        (**self).call(req)
    }
}
