//! Bus errors: a kind callers branch on, and the cause kept for logs.

/// Why a bus operation failed.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// Could not reach the server, or it went away.
    #[error("bus connection: {0}")]
    Connection(String),
    /// The server is too old or lacks JetStream.
    #[error("bus server unsupported: {0}")]
    Unsupported(String),
    /// Stream or consumer setup failed.
    #[error("bus setup: {0}")]
    Setup(String),
    /// Publishing was not acknowledged by the stream.
    #[error("bus publish: {0}")]
    Publish(String),
    /// Fetching, acking or reading failed.
    #[error("bus consume: {0}")]
    Consume(String),
}
