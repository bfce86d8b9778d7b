//! Adapter errors: what a caller needs to decide between retry, give up and tell the user.

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Why a backend call failed. Messages never contain credentials.
///
/// The variants stay plain tuples so callers match them cheaply (`Transient(_)`); the three
/// that can have an underlying failure (an I/O error, an HTTP transport error, a credential
/// that does not resolve) carry it in their [`Reason`], reachable through `source()`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdapterError {
    /// Worth retrying: timeouts, 5xx, connection resets.
    #[error("backend transient error: {0}")]
    Transient(#[source] Reason),
    /// Will fail again the same way: bad template, rejected request.
    #[error("backend rejected the request: {0}")]
    Permanent(#[source] Reason),
    /// The instance does not exist on the backend.
    #[error("backend instance not found")]
    NotFound,
    /// A file or directory inside the sandbox does not exist (the instance does).
    #[error("no such file or directory: {0}")]
    PathNotFound(String),
    /// This adapter does not implement the operation.
    #[error("operation not supported by this pool: {0}")]
    Unsupported(String),
    /// The backend cannot be reached at all.
    #[error("backend unavailable: {0}")]
    Unavailable(#[source] Reason),
    /// The backend is reachable but has no room now (a plan's concurrency limit, a 429, no
    /// node free): retryable later, and a create refused this way goes back to placement,
    /// which tries the next ranked pool. The reason may carry the provider's `Retry-After`
    /// ([`Reason::retry_after`]).
    #[error("insufficient capacity: {0}")]
    Capacity(#[source] Reason),
    /// A file operation the sandbox's filesystem refuses at this path as it stands: a
    /// directory where a file is to be written, a file where a directory is needed, a
    /// read-only path. The caller's mistake, not the backend's: never retried, and the API
    /// answers it 409 naming the path.
    #[error("{0}")]
    BadPath(PathError),
}

/// A path a file operation cannot use, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {problem}")]
pub struct PathError {
    /// The sandbox path as the caller gave it.
    pub path: String,
    pub problem: PathProblem,
}

/// Why a path cannot be used; [`PathProblem::code`] is the stable form clients see.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathProblem {
    /// The path is a directory and the operation needs a file (an upload onto it).
    #[error("is a directory")]
    IsADirectory,
    /// A component of the path is not a directory (a file where a parent must be).
    #[error("a parent of the path is not a directory")]
    NotADirectory,
    /// The path is read-only in the sandbox (a host system directory mounted into it).
    #[error("is read-only in this sandbox")]
    ReadOnly,
    /// Something other than a directory is at the path where a directory is to be made.
    #[error("exists and is not a directory")]
    NotADirectoryHere,
}

impl PathProblem {
    /// Every problem, for reading a [`PathProblem::code`] back.
    pub const ALL: [PathProblem; 4] = [
        PathProblem::IsADirectory,
        PathProblem::NotADirectory,
        PathProblem::ReadOnly,
        PathProblem::NotADirectoryHere,
    ];

    /// The problem whose [`PathProblem::code`] is `code`.
    pub fn from_code(code: &str) -> Option<PathProblem> {
        PathProblem::ALL.into_iter().find(|p| p.code() == code)
    }

    /// The stable name served in `details.reason`.
    pub fn code(self) -> &'static str {
        match self {
            PathProblem::IsADirectory => "is_a_directory",
            PathProblem::NotADirectory => "not_a_directory",
            PathProblem::ReadOnly => "read_only_path",
            PathProblem::NotADirectoryHere => "exists_not_directory",
        }
    }
}

impl AdapterError {
    /// Whether retrying the same call later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            AdapterError::Transient(_) | AdapterError::Unavailable(_) | AdapterError::Capacity(_)
        )
    }

    /// How long the backend asked us to wait before trying again (`Retry-After`), if it said.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            AdapterError::Transient(r)
            | AdapterError::Unavailable(r)
            | AdapterError::Capacity(r)
            | AdapterError::Permanent(r) => r.retry_after(),
            _ => None,
        }
    }

    /// A [`AdapterError::Capacity`] with `message` and the provider's `Retry-After`, if it
    /// sent one.
    pub fn capacity(message: impl Into<Reason>, retry_after: Option<Duration>) -> Self {
        let reason = message.into();
        AdapterError::Capacity(match retry_after {
            Some(d) => reason.with_retry_after(d),
            None => reason,
        })
    }

    /// A [`AdapterError::Transient`] with `message`.
    pub fn transient(message: impl Into<Reason>) -> Self {
        AdapterError::Transient(message.into())
    }

    /// A [`AdapterError::Permanent`] with `message`.
    pub fn permanent(message: impl Into<Reason>) -> Self {
        AdapterError::Permanent(message.into())
    }

    /// A [`AdapterError::Permanent`] about request field `field` (a `cwd` that does not
    /// exist): the API answers it with `details.field`.
    pub fn invalid_field(field: &'static str, message: impl Into<Reason>) -> Self {
        AdapterError::Permanent(message.into().on_field(field))
    }

    /// A [`AdapterError::BadPath`] about sandbox path `path`.
    pub fn bad_path(path: impl Into<String>, problem: PathProblem) -> Self {
        AdapterError::BadPath(PathError {
            path: path.into(),
            problem,
        })
    }

    /// A [`AdapterError::Unavailable`] with `message`.
    pub fn unavailable(message: impl Into<Reason>) -> Self {
        AdapterError::Unavailable(message.into())
    }
}

/// What went wrong, for a person, and the failure underneath it if there was one. Two
/// reasons are equal when their messages are: the cause is for diagnosis, not for matching.
/// Reads as its message (`Deref<Target = str>`), so `m.contains(…)` works on it.
#[derive(Clone)]
pub struct Reason {
    message: String,
    cause: Option<Arc<dyn Error + Send + Sync>>,
    /// The request field the failure is about (`cwd`), for the API's `details.field`.
    field: Option<&'static str>,
    /// How long the backend asked to be left alone (`Retry-After`).
    retry_after: Option<Duration>,
}

impl Reason {
    /// `message`, caused by `cause` (kept, reachable through `source()`).
    pub fn caused_by(
        message: impl Into<String>,
        cause: impl Error + Send + Sync + 'static,
    ) -> Self {
        Reason {
            message: message.into(),
            cause: Some(Arc::new(cause)),
            field: None,
            retry_after: None,
        }
    }

    /// The same reason, with the backend's `Retry-After`.
    pub fn with_retry_after(mut self, wait: Duration) -> Self {
        self.retry_after = Some(wait);
        self
    }

    /// The backend's `Retry-After`, if it sent one.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The same reason, about request field `field` (the API names it in `details.field`).
    pub fn on_field(mut self, field: &'static str) -> Self {
        self.field = Some(field);
        self
    }

    /// The request field this is about, if one.
    pub fn field(&self) -> Option<&'static str> {
        self.field
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The same cause with another message (e.g. scrubbed of a credential).
    pub fn map_message(self, f: impl FnOnce(&str) -> String) -> Self {
        Reason {
            message: f(&self.message),
            cause: self.cause,
            field: self.field,
            retry_after: self.retry_after,
        }
    }
}

impl fmt::Debug for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.message, f)
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl Error for Reason {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.cause.as_deref().map(|c| c as &(dyn Error + 'static))
    }
}

impl PartialEq for Reason {
    fn eq(&self, other: &Self) -> bool {
        self.message == other.message
    }
}

impl Eq for Reason {}

impl std::ops::Deref for Reason {
    type Target = str;
    fn deref(&self) -> &str {
        &self.message
    }
}

impl From<String> for Reason {
    fn from(message: String) -> Self {
        Reason {
            message,
            cause: None,
            field: None,
            retry_after: None,
        }
    }
}

impl From<&str> for Reason {
    fn from(message: &str) -> Self {
        Reason::from(message.to_owned())
    }
}

impl From<Reason> for String {
    fn from(r: Reason) -> String {
        r.message
    }
}

impl From<&Reason> for String {
    fn from(r: &Reason) -> String {
        r.message.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_is_kept_but_not_compared() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied");
        let e = AdapterError::Transient(Reason::caused_by("read tag", io));
        assert_eq!(e.to_string(), "backend transient error: read tag");
        let cause = e.source().and_then(|r| r.source()).map(|c| c.to_string());
        assert_eq!(cause.as_deref(), Some("denied"));
        assert_eq!(e, AdapterError::transient("read tag"));
        assert!(matches!(&e, AdapterError::Transient(m) if m.contains("tag")));
        assert!(AdapterError::permanent("x")
            .source()
            .is_some_and(|r| r.source().is_none()));
    }

    #[test]
    fn capacity_is_retryable_and_keeps_the_providers_wait() {
        let e = AdapterError::capacity("plan limit", Some(Duration::from_secs(7)));
        assert!(e.is_retryable());
        assert_eq!(e.retry_after(), Some(Duration::from_secs(7)));
        assert_eq!(e.to_string(), "insufficient capacity: plan limit");
        let scrubbed = match e {
            AdapterError::Capacity(r) => r.map_message(|m| m.replace("plan", "***")),
            other => panic!("{other:?}"),
        };
        assert_eq!(scrubbed.retry_after(), Some(Duration::from_secs(7)));
        assert_eq!(AdapterError::capacity("x", None).retry_after(), None);
        assert_eq!(AdapterError::NotFound.retry_after(), None);
    }
}
