//! Adapter errors: what a caller needs to decide between retry, give up and tell the user.

/// Why a backend call failed. Messages never contain credentials.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdapterError {
    /// Worth retrying: timeouts, 5xx, connection resets.
    #[error("backend transient error: {0}")]
    Transient(String),
    /// Will fail again the same way: bad template, rejected request.
    #[error("backend rejected the request: {0}")]
    Permanent(String),
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
    Unavailable(String),
}

impl AdapterError {
    /// Whether retrying the same call later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            AdapterError::Transient(_) | AdapterError::Unavailable(_)
        )
    }
}
