//! Calls into the `/v1` router in process. The facade never reads the store or calls an
//! adapter itself: every operation is a `/v1` request answered by the `/v1` handler, so
//! authentication, scopes, tenancy, quotas, the fair queue, placement and audit are the same
//! code a `/v1` client gets. The request id and trace of the outer request are task-locals,
//! so the audit records of the inner call carry the id the OpenSandbox client saw.

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, Method, Request, StatusCode};
use axum::response::Response;
use axum::Router;
use serde_json::Value;
use tower::ServiceExt;

use crate::auth::Delegated;

use super::error::OsbError;

/// Who an inner call acts for.
#[derive(Debug, Clone)]
pub enum Caller {
    /// A Differently key presented as `OPEN-SANDBOX-API-KEY` (verified by `/v1` as a bearer).
    Key(String),
    /// A key named by a verified execd token ([`Delegated`]).
    Delegated(String),
    /// No credential: `/v1` answers 401, which the facade maps.
    Anonymous,
}

impl Caller {
    /// Puts this caller's credential on an in-process `/v1` request: a key as its bearer
    /// header, a delegated key as the [`Delegated`] extension, nothing for no credential.
    pub fn attach_to<B>(&self, req: &mut Request<B>) -> Result<(), OsbError> {
        match self {
            Caller::Key(k) => {
                let v = HeaderValue::from_str(&format!("Bearer {k}"))
                    .map_err(|_| OsbError::invalid_key())?;
                req.headers_mut().insert(header::AUTHORIZATION, v);
            }
            Caller::Delegated(key_id) => {
                req.extensions_mut().insert(Delegated {
                    key_id: key_id.clone(),
                });
            }
            Caller::Anonymous => {}
        }
        Ok(())
    }

    /// The caller of a lifecycle request: its `OPEN-SANDBOX-API-KEY`, or
    /// `Authorization: Bearer` for clients that send Differently's own header.
    pub fn from_headers(h: &HeaderMap) -> Caller {
        let key = h
            .get("open-sandbox-api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .or_else(|| {
                h.get(header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "))
                    .map(str::trim)
            });
        match key {
            Some(k) => Caller::Key(k.to_owned()),
            None => Caller::Anonymous,
        }
    }
}

/// The `/v1` router (without the outer layers: the facade request already passed them).
#[derive(Clone)]
pub struct V1 {
    router: Router,
}

impl V1 {
    /// Wraps the stateful `/v1` router.
    pub fn new(router: Router) -> V1 {
        V1 { router }
    }

    /// One `/v1` request; `extra` headers are copied (e.g. `Range`, `Accept`).
    pub async fn call(
        &self,
        caller: &Caller,
        method: Method,
        uri: &str,
        extra: &[(header::HeaderName, HeaderValue)],
        body: Body,
    ) -> Result<Response, OsbError> {
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .body(body)
            .map_err(|e| OsbError::internal(format!("inner request {uri}: {e}")))?;
        caller.attach_to(&mut req)?;
        for (k, v) in extra {
            req.headers_mut().insert(k.clone(), v.clone());
        }
        let resp = self
            .router
            .clone()
            .oneshot(req)
            .await
            .map_err(|e: std::convert::Infallible| OsbError::internal(e.to_string()))?;
        Ok(resp)
    }

    /// A JSON `/v1` call: the parsed answer on 2xx, the mapped error otherwise.
    pub async fn json(
        &self,
        caller: &Caller,
        method: Method,
        uri: &str,
        body: Option<&Value>,
    ) -> Result<(StatusCode, Value), OsbError> {
        let (extra, body) = match body {
            Some(v) => (
                vec![(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                )],
                Body::from(v.to_string()),
            ),
            None => (vec![], Body::empty()),
        };
        let resp = self.call(caller, method, uri, &extra, body).await?;
        let status = resp.status();
        if !status.is_success() {
            let headers = resp.headers().clone();
            let bytes = read_all(resp).await?;
            return Err(OsbError::from_v1_answer(status, &headers, &bytes, caller));
        }
        let bytes = read_all(resp).await?;
        if bytes.is_empty() {
            return Ok((status, Value::Null));
        }
        let v = serde_json::from_slice(&bytes)
            .map_err(|e| OsbError::internal(format!("inner answer of {uri}: {e}")))?;
        Ok((status, v))
    }
}

/// The whole body of an inner answer (inner JSON answers are small).
pub async fn read_all(resp: Response) -> Result<Bytes, OsbError> {
    axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .map_err(|e| OsbError::internal(format!("inner body: {e}")))
}

/// `s` escaped for a query value.
pub fn q(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use axum::response::IntoResponse;
    use axum::routing::post;

    use super::*;

    #[tokio::test]
    async fn a_refused_inner_call_keeps_its_retry_after() {
        // A `/v1` 503 as the process start answers it when no supervisor slot is free.
        let busy = || async {
            let body =
                r#"{"error":{"code":"provider_unavailable","message":"no free slot; retry"}}"#;
            (
                StatusCode::SERVICE_UNAVAILABLE,
                [(header::RETRY_AFTER, "1")],
                body,
            )
                .into_response()
        };
        let v1 = V1::new(Router::new().route("/v1/sandboxes/{id}/processes", post(busy)));
        let e = v1
            .json(
                &Caller::Anonymous,
                Method::POST,
                "/v1/sandboxes/sbx_1/processes",
                Some(&serde_json::json!({"command": ["true"]})),
            )
            .await
            .expect_err("a 503 is an error");
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.code, "DIFFERENTLY::PROVIDER_UNAVAILABLE");
        assert_eq!(e.retry_after.as_deref(), Some("1"));
        let served = e.into_response();
        assert_eq!(served.headers()[header::RETRY_AFTER], "1");
    }
}
