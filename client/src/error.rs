//! Why a call failed: the API's own error (status, stable code, field, request id), a request
//! that got no answer (with what to check), or an answer that is not the API's.

use serde_json::Value;

/// A failed call.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API answered with its error envelope.
    #[error(transparent)]
    Api(Box<ApiError>),
    /// No answer: nothing listens there, a timeout, a broken connection.
    #[error(transparent)]
    Transport(Box<TransportError>),
    /// The answer is not what the API serves (not JSON, a broken stream, a missing field).
    #[error("{context}: {message}")]
    Protocol {
        /// The request, `METHOD path`.
        context: String,
        /// What was wrong with the answer.
        message: String,
    },
    /// The terminal's WebSocket failed after the upgrade (a reset, a frame that breaks the
    /// protocol).
    #[error("{context}: the terminal's connection failed: {source}")]
    Socket {
        /// The request, `METHOD path`.
        context: String,
        /// The WebSocket layer's error.
        #[source]
        source: Box<tokio_tungstenite::tungstenite::Error>,
    },
    /// The call cannot be sent as asked (checked here, before any traffic).
    #[error("{field}: {message}")]
    Invalid {
        /// The argument at fault.
        field: String,
        /// Why.
        message: String,
    },
}

impl From<ApiError> for Error {
    fn from(e: ApiError) -> Error {
        Error::Api(Box::new(e))
    }
}

impl From<TransportError> for Error {
    fn from(e: TransportError) -> Error {
        Error::Transport(Box::new(e))
    }
}

impl Error {
    /// The API's error, when the API answered one.
    pub fn api(&self) -> Option<&ApiError> {
        match self {
            Error::Api(e) => Some(e),
            _ => None,
        }
    }

    /// The HTTP status the API answered, when it answered an error.
    pub fn status(&self) -> Option<u16> {
        self.api().map(|e| e.status)
    }

    /// The API's stable error code (`not_found`, `validation_failed`, …).
    pub fn code(&self) -> Option<&str> {
        self.api().map(|e| e.code.as_str())
    }

    pub(crate) fn protocol(context: impl Into<String>, message: impl Into<String>) -> Error {
        Error::Protocol {
            context: context.into(),
            message: message.into(),
        }
    }

    pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> Error {
        Error::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// The API's error envelope, `{"error": {code, message, details, requestId}}`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{status} {code}: {message}{}", self.suffix())]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// Stable machine code (docs/api.md lists them).
    pub code: String,
    /// Human message; it names the field for bad input.
    pub message: String,
    /// `details.field`: the JSON path of the input at fault, when there is one.
    pub field: Option<String>,
    /// Every detail the API gave (`field`, `status`, `operation`, …).
    pub details: Value,
    /// The request's id (`X-Request-Id`), to find it in the server's logs and audit.
    pub request_id: Option<String>,
}

impl ApiError {
    /// Reads the envelope of an error answer; a body that is not one still gives an error
    /// with the status, so nothing is lost.
    pub(crate) fn from_body(status: u16, body: &[u8], header_request_id: Option<String>) -> Self {
        let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let e = &v["error"];
        let details = e.get("details").cloned().unwrap_or(Value::Null);
        let text = |v: &Value| v.as_str().map(str::to_owned);
        ApiError {
            status,
            code: text(&e["code"]).unwrap_or_else(|| "unknown".to_owned()),
            message: text(&e["message"]).unwrap_or_else(|| {
                if body.is_empty() {
                    "the API answered an error without a body".to_owned()
                } else {
                    format!(
                        "the answer is not the API's error envelope: {}",
                        String::from_utf8_lossy(&body[..body.len().min(200)])
                    )
                }
            }),
            field: text(&details["field"]),
            request_id: text(&e["requestId"]).or(header_request_id),
            details,
        }
    }

    fn suffix(&self) -> String {
        let mut out = String::new();
        if let Some(obj) = self.details.as_object() {
            let rest: serde_json::Map<String, Value> = obj
                .iter()
                .filter(|(k, _)| k.as_str() != "field")
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if let Some(f) = &self.field {
                out.push_str(&format!(" (field {f})"));
            }
            if !rest.is_empty() {
                out.push_str(&format!(" (details: {})", Value::Object(rest)));
            }
        }
        if let Some(id) = &self.request_id {
            out.push_str(&format!(" [request {id}]"));
        }
        out
    }
}

/// What kind of transport failure: decides the hint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    /// Nothing accepted the connection.
    Connect,
    /// No answer in time.
    Timeout,
    /// Anything else (a reset, a broken body).
    Other,
}

/// A request that got no (whole) answer. Its text carries the causes — reqwest's own is
/// only "error sending request" — and, when nothing listens, what to check.
#[derive(Debug, thiserror::Error)]
#[error("{method} {url}: {causes}{}", self.hint())]
pub struct TransportError {
    /// The request's method.
    pub method: String,
    /// The URL asked (never holds the key: it travels in a header).
    pub url: String,
    /// The API's base URL.
    pub base: String,
    /// Connect, timeout or other.
    pub kind: TransportKind,
    causes: String,
    #[source]
    source: reqwest::Error,
}

impl TransportError {
    pub(crate) fn new(method: &str, url: &str, base: &str, e: reqwest::Error) -> Self {
        let kind = if e.is_connect() {
            TransportKind::Connect
        } else if e.is_timeout() {
            TransportKind::Timeout
        } else {
            TransportKind::Other
        };
        let e = e.without_url();
        let mut causes = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            let c = cause.to_string();
            if !causes.contains(&c) {
                causes.push_str(": ");
                causes.push_str(&c);
            }
            source = cause.source();
        }
        TransportError {
            method: method.to_owned(),
            url: url.to_owned(),
            base: base.to_owned(),
            kind,
            causes,
            source: e,
        }
    }

    fn hint(&self) -> String {
        match self.kind {
            TransportKind::Connect => format!(
                " — cannot reach the API at {}: is `differently dev` (or the API server) running there?",
                self.base
            ),
            TransportKind::Timeout => " — the API did not answer in time".to_owned(),
            TransportKind::Other => String::new(),
        }
    }
}

/// A call's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
