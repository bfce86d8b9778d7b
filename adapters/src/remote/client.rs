//! The HTTP client side of a `remote` pool: the plugin's `/info`, the bearer token read at
//! send time and scrubbed from every message, sending and error bodies, paths, and reading
//! a streamed body with an idle timeout. The contract mapping (one route per method) is in
//! `mod.rs`.

use std::time::{Duration, Instant};

use bytes::Bytes;
use differently_core::SandboxId;
use futures::StreamExt;
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::de::DeserializeOwned;

use super::wire::{self, segment, At, ErrorBody, Info};
use super::{Inner, MAX_ERROR_BODY};
use crate::error::Reason;
use crate::http::Secret;
use crate::{AdapterError, Instance, InstanceRef};

impl Inner {
    pub(super) fn info(&self) -> Option<Info> {
        self.info
            .read()
            .ok()
            .and_then(|i| i.as_ref().map(|(i, _)| i.clone()))
    }

    pub(super) fn info_age(&self) -> Option<Duration> {
        self.info
            .read()
            .ok()
            .and_then(|i| i.as_ref().map(|(_, at)| at.elapsed()))
    }

    pub(super) async fn refresh_info(&self) -> Result<Info, AdapterError> {
        let op = "plugin info";
        let info: Info = self.json(self.http.api(Method::GET, "/info"), op).await?;
        if info.protocol != wire::PROTOCOL_NAME {
            return Err(AdapterError::permanent(format!(
                "{op}: the plugin speaks `{}`, not `{}`",
                self.scrub(&info.protocol),
                wire::PROTOCOL_NAME
            )));
        }
        if !info.versions.contains(&wire::PROTOCOL_VERSION) {
            return Err(AdapterError::permanent(format!(
                "{op}: the plugin speaks protocol versions {:?}; this build speaks {}",
                info.versions,
                wire::PROTOCOL_VERSION
            )));
        }
        if let Ok(mut slot) = self.info.write() {
            *slot = Some((info.clone(), Instant::now()));
        }
        Ok(info)
    }

    /// The token now, through its reference; one that does not resolve makes the pool
    /// unusable until it does (`Unavailable`, naming the reference, never a value).
    pub(super) async fn bearer(&self) -> Result<Secret, AdapterError> {
        let reference = self.token.reference().to_string();
        let raw = self.token.get().await.map_err(|e| {
            AdapterError::Unavailable(Reason::caused_by(
                format!("plugin token ({reference}): {e}"),
                e,
            ))
        })?;
        let secret = Secret::parse(&raw).map_err(|why| {
            AdapterError::unavailable(format!("plugin token ({reference}): the token {why}"))
        })?;
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if !seen.contains(&secret) {
            seen.push(secret.clone());
            let len = seen.len();
            seen.drain(..len.saturating_sub(2));
        }
        Ok(secret)
    }

    pub(super) fn scrub(&self, text: &str) -> String {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.iter().fold(text.to_owned(), |t, k| k.scrub(&t))
    }

    pub(super) fn scrub_error(&self, e: AdapterError) -> AdapterError {
        match e {
            AdapterError::Transient(m) => AdapterError::Transient(m.map_message(|t| self.scrub(t))),
            AdapterError::Permanent(m) => AdapterError::Permanent(m.map_message(|t| self.scrub(t))),
            AdapterError::Unavailable(m) => {
                AdapterError::Unavailable(m.map_message(|t| self.scrub(t)))
            }
            AdapterError::Capacity(m) => AdapterError::Capacity(m.map_message(|t| self.scrub(t))),
            AdapterError::Unsupported(m) => AdapterError::Unsupported(self.scrub(&m)),
            AdapterError::PathNotFound(m) => AdapterError::PathNotFound(self.scrub(&m)),
            AdapterError::BadPath(mut p) => {
                p.path = self.scrub(&p.path);
                AdapterError::BadPath(p)
            }
            AdapterError::NotFound => AdapterError::NotFound,
        }
    }

    /// Sends with the version header and the token; transport errors mapped and scrubbed.
    pub(super) async fn send(
        &self,
        rb: RequestBuilder,
        op: &str,
    ) -> Result<Response, AdapterError> {
        let token = self.bearer().await?;
        let rb = rb
            .header(wire::VERSION_HEADER, wire::PROTOCOL_VERSION.to_string())
            .bearer_auth(token.expose());
        self.http
            .send(rb, op)
            .await
            .map_err(|e| self.scrub_error(e))
    }

    /// Sends and requires a 2xx answer; an error answer becomes its `AdapterError`.
    pub(super) async fn send_ok(
        &self,
        rb: RequestBuilder,
        op: &str,
    ) -> Result<Response, AdapterError> {
        let resp = self.send(rb, op).await?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        Err(self.error_of(op, resp).await)
    }

    /// Maps an error answer by its `code` (the status only when the body is not ours).
    pub(super) async fn error_of(&self, op: &str, resp: Response) -> AdapterError {
        let status = resp.status();
        let mut body = Vec::new();
        let mut chunks = resp.bytes_stream();
        while let Some(Ok(c)) = chunks.next().await {
            body.extend_from_slice(&c);
            if body.len() > MAX_ERROR_BODY {
                break;
            }
        }
        self.error_of_body(op, status, &body)
    }

    /// [`Inner::error_of`] for an answer whose body is already read.
    pub(super) fn error_of_body(&self, op: &str, status: StatusCode, body: &[u8]) -> AdapterError {
        if status == StatusCode::UNAUTHORIZED {
            // A token replaced after the plugin stopped accepting the old one is read again.
            self.token.forget();
        }
        let e = match serde_json::from_slice::<ErrorBody>(body) {
            Ok(b) => b.into_error(op),
            // Not a plugin's answer: a proxy, or a URL that is not a plugin at all. A 404
            // there must not read as "no such instance".
            Err(_) if status == StatusCode::NOT_FOUND => AdapterError::permanent(format!(
                "{op}: HTTP 404 without a protocol error body (is the url a plugin?)"
            )),
            Err(_) => {
                let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
                crate::http::status_error(op, status, &text)
            }
        };
        self.scrub_error(e)
    }

    /// Sends, requires 2xx and decodes a JSON body.
    pub(super) async fn json<T: DeserializeOwned>(
        &self,
        rb: RequestBuilder,
        op: &str,
    ) -> Result<T, AdapterError> {
        let resp = self.send_ok(rb, op).await?;
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| self.scrub_error(self.http.transport_error(op, e)))?;
        crate::http::decode_answer(&bytes, op, "the plugin")
    }

    /// Sends and requires 2xx, ignoring the body.
    pub(super) async fn empty(&self, rb: RequestBuilder, op: &str) -> Result<(), AdapterError> {
        self.send_ok(rb, op).await.map(drop)
    }

    pub(super) fn instance_path(id: &SandboxId) -> String {
        format!("/instances/{}", segment(id.as_str()))
    }

    pub(super) fn at_path(at: &InstanceRef, tail: &str) -> String {
        format!("{}{tail}", Self::instance_path(&at.sandbox_id))
    }

    pub(super) fn at_query(at: &InstanceRef) -> At {
        At {
            backend_ref: at.backend_ref.clone(),
        }
    }

    pub(super) fn checked(
        &self,
        op: &str,
        want: &SandboxId,
        got: Instance,
    ) -> Result<Instance, AdapterError> {
        if &got.sandbox_id == want {
            Ok(got)
        } else {
            Err(AdapterError::permanent(format!(
                "{op}: the plugin answered with an instance of {} for {want}",
                got.sandbox_id
            )))
        }
    }

    /// The next chunk of a response body, or `Transient` after the idle timeout.
    pub(super) async fn next_chunk(
        &self,
        body: &mut (impl futures::Stream<Item = reqwest::Result<Bytes>> + Unpin),
        op: &str,
    ) -> Result<Option<Bytes>, AdapterError> {
        match tokio::time::timeout(self.settings.stream_idle, body.next()).await {
            Err(_) => Err(AdapterError::transient(format!(
                "{op}: the plugin sent nothing for {} s",
                self.settings.stream_idle.as_secs()
            ))),
            Ok(None) => Ok(None),
            Ok(Some(Ok(b))) => Ok(Some(b)),
            Ok(Some(Err(e))) => Err(self.scrub_error(self.http.transport_error(op, e))),
        }
    }
}
