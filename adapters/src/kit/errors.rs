//! Error answers of HTTP providers, mapped once. A provider's answer is read into an
//! [`ErrorAnswer`] (status, `Retry-After`, body), its body into a [`ProviderError`] (code and
//! message, whichever common shape it has), and [`Statuses::map`] turns it into an
//! [`AdapterError`] by the table every provider shares; what is a provider's own (a code
//! meaning "no room", a 410 meaning "stopped") it checks before falling back on the table.

use std::time::Duration;

use bytes::Bytes;
use reqwest::StatusCode;
use serde_json::Value;

use crate::AdapterError;

/// An error answer, read once.
#[derive(Debug, Clone)]
pub struct ErrorAnswer {
    pub status: StatusCode,
    /// The answer's `Retry-After`, capped ([`crate::http::retry_after`]).
    pub retry_after: Option<Duration>,
    pub body: Bytes,
}

impl ErrorAnswer {
    /// The body in the common shapes ([`ProviderError::parse`]).
    pub fn error(&self) -> ProviderError {
        ProviderError::parse(self.status, &self.body)
    }
}

/// What an error body says: a code (empty when the provider sends none) and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderError {
    pub status: u16,
    pub code: String,
    pub message: String,
}

/// The first string among `keys` of a JSON object.
fn first_str(obj: &serde_json::Map<String, Value>, keys: &[&str]) -> Option<String> {
    keys.iter()
        .find_map(|k| obj.get(*k).and_then(Value::as_str))
        .map(str::to_owned)
}

impl ProviderError {
    /// Reads the shapes providers use: `{"code"|"errorCode", "message"}`, NestJS's
    /// `{"error": "Bad Request", "message": [..]}` (a list is joined with `; `), and the
    /// nested `{"error": {"code", "message"}}`. A body that is none of them gives its first
    /// 200 bytes as the message (a proxy's error page says something too).
    pub fn parse(status: StatusCode, body: &[u8]) -> ProviderError {
        let parsed: Option<serde_json::Map<String, Value>> = serde_json::from_slice(body).ok();
        let obj = match parsed.as_ref() {
            Some(o) => match o.get("error") {
                Some(Value::Object(inner)) => inner,
                _ => o,
            },
            None => &serde_json::Map::new(),
        };
        let code = first_str(obj, &["code", "errorCode", "error_code"])
            .or_else(|| {
                // `error` is a code only where `message` carries the text beside it.
                obj.get("message")
                    .and_then(|_| first_str(obj, &["error"]))
                    .filter(|e| e.contains('_') || e.chars().all(|c| !c.is_lowercase()))
            })
            .unwrap_or_default();
        let message = match obj.get("message") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(items)) => items
                .iter()
                .map(|i| i.as_str().map_or_else(|| i.to_string(), str::to_owned))
                .collect::<Vec<_>>()
                .join("; "),
            Some(other) => other.to_string(),
            None => first_str(obj, &["error", "detail", "msg"]).unwrap_or_default(),
        };
        let message = if message.is_empty() && code.is_empty() {
            String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned()
        } else {
            message
        };
        ProviderError {
            status: status.as_u16(),
            code,
            message,
        }
    }

    /// `{op}: {provider} HTTP {status} [{code}]: {message}`, the text of every mapped error.
    pub fn describe(&self, op: &str, provider: &str) -> String {
        if self.code.is_empty() {
            format!("{op}: {provider} HTTP {}: {}", self.status, self.message)
        } else {
            format!(
                "{op}: {provider} HTTP {} {}: {}",
                self.status, self.code, self.message
            )
        }
    }
}

/// The status table an HTTP provider's errors go through, with the little that differs.
#[derive(Debug, Clone, Copy)]
pub struct Statuses {
    /// The provider's name in messages (`Daytona`).
    pub provider: &'static str,
    /// The credential's name (`API key`, `access token`).
    pub credential: &'static str,
    /// The settings that name it, for the refused-credential message
    /// (`apiKeyEnv, apiKeyFile or apiKeySecret`).
    pub credential_settings: &'static str,
    /// A 409 is "a change is under way, it settles" (transient) rather than a refusal.
    pub conflict_settles: bool,
    /// A 429 is the plan's concurrency limit ([`AdapterError::Capacity`]: placement tries the
    /// next pool) rather than a passing rate limit (transient). Either way its `Retry-After`
    /// is kept.
    pub rate_limit_is_capacity: bool,
}

impl Statuses {
    /// The table of a provider that takes an API key (`apiKeyEnv`, `apiKeyFile` or
    /// `apiKeySecret`) and answers the usual way: a 409 settles, a 429 is its plan's limit.
    pub const fn api_key(provider: &'static str) -> Statuses {
        Statuses {
            provider,
            credential: "API key",
            credential_settings: "apiKeyEnv, apiKeyFile or apiKeySecret",
            conflict_settles: true,
            rate_limit_is_capacity: true,
        }
    }

    /// The common table: 401/403 the credential was refused (permanent, naming the
    /// settings, never the value), 404 not found, 408 transient, 409 see
    /// [`Statuses::conflict_settles`], 429 see [`Statuses::rate_limit_is_capacity`], 501
    /// unsupported, other 5xx transient, other 4xx permanent.
    pub fn map(
        &self,
        op: &str,
        err: &ProviderError,
        retry_after: Option<Duration>,
    ) -> AdapterError {
        let text = err.describe(op, self.provider);
        match err.status {
            401 | 403 => AdapterError::permanent(format!(
                "{op}: {} refused the {} (HTTP {}); check the pool's {}",
                self.provider, self.credential, err.status, self.credential_settings
            )),
            404 => AdapterError::NotFound,
            409 if self.conflict_settles => AdapterError::transient(text),
            429 if self.rate_limit_is_capacity => self.capacity(op, err, retry_after),
            408 | 429 => AdapterError::Transient(with_wait(text.into(), retry_after)),
            501 => AdapterError::Unsupported(text),
            500..=599 => AdapterError::Transient(with_wait(text.into(), retry_after)),
            _ => AdapterError::permanent(text),
        }
    }

    /// [`AdapterError::Capacity`] for an answer that means "no room now" (a plan limit, a
    /// capacity code): placement gives the sandbox to the next ranked pool.
    pub fn capacity(
        &self,
        op: &str,
        err: &ProviderError,
        retry_after: Option<Duration>,
    ) -> AdapterError {
        AdapterError::capacity(
            format!(
                "{op}: {} HTTP {}: {}",
                self.provider, err.status, err.message
            ),
            retry_after,
        )
    }
}

fn with_wait(reason: crate::error::Reason, wait: Option<Duration>) -> crate::error::Reason {
    match wait {
        Some(d) => reason.with_retry_after(d),
        None => reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: Statuses = Statuses::api_key("Acme");

    fn parse(status: u16, body: &str) -> ProviderError {
        ProviderError::parse(StatusCode::from_u16(status).unwrap(), body.as_bytes())
    }

    #[test]
    fn the_common_body_shapes_read() {
        let nest = parse(
            400,
            r#"{"statusCode":400,"error":"Bad Request","message":["cpu must be an integer","memory too"]}"#,
        );
        assert_eq!(
            (nest.code.as_str(), nest.message.as_str()),
            ("", "cpu must be an integer; memory too")
        );
        let coded = parse(400, r#"{"code":"VM_LIMIT","message":"too many"}"#);
        assert_eq!(
            (coded.code.as_str(), coded.message.as_str()),
            ("VM_LIMIT", "too many")
        );
        let screaming = parse(400, r#"{"error":"SNAPSHOT_NOT_FOUND","message":"no"}"#);
        assert_eq!(screaming.code, "SNAPSHOT_NOT_FOUND");
        let nested = parse(
            410,
            r#"{"error":{"code":"sandbox_stopped","message":"gone"}}"#,
        );
        assert_eq!(
            (nested.code.as_str(), nested.message.as_str()),
            ("sandbox_stopped", "gone")
        );
        let e2b = parse(429, r#"{"errorCode":"RATE","message":"slow down"}"#);
        assert_eq!(e2b.code, "RATE");
        let page = parse(502, "<html>bad gateway</html>");
        assert_eq!(page.message, "<html>bad gateway</html>");
        assert_eq!(
            page.describe("op", "Acme"),
            "op: Acme HTTP 502: <html>bad gateway</html>"
        );
    }

    #[test]
    fn the_table_maps_statuses_and_keeps_the_wait() {
        let wait = Some(Duration::from_secs(7));
        let m = |s: u16| TABLE.map("op", &parse(s, r#"{"message":"m"}"#), wait);
        let refused = m(401);
        assert!(
            matches!(&refused, AdapterError::Permanent(_)),
            "{refused:?}"
        );
        assert!(
            refused.to_string().contains("Acme refused the API key"),
            "{refused}"
        );
        assert!(refused.to_string().contains("apiKeySecret"), "{refused}");
        assert_eq!(m(404), AdapterError::NotFound);
        assert!(matches!(m(409), AdapterError::Transient(_)));
        let full = m(429);
        assert!(matches!(&full, AdapterError::Capacity(_)), "{full:?}");
        assert_eq!(full.retry_after(), wait);
        assert!(matches!(m(501), AdapterError::Unsupported(_)));
        let busy = m(503);
        assert!(
            busy.is_retryable() && busy.retry_after() == wait,
            "{busy:?}"
        );
        assert!(matches!(m(400), AdapterError::Permanent(_)));

        let strict = Statuses {
            conflict_settles: false,
            rate_limit_is_capacity: false,
            ..TABLE
        };
        let m = |s: u16| strict.map("op", &parse(s, "{}"), wait);
        assert!(matches!(m(409), AdapterError::Permanent(_)));
        let limited = m(429);
        assert!(
            matches!(&limited, AdapterError::Transient(_)),
            "{limited:?}"
        );
        assert_eq!(limited.retry_after(), wait);
    }
}
