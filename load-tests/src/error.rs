//! The harness's one error type: every failure names what it was doing.

/// Why a load run could not complete.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A service the harness needs is missing; the message says what to start.
    #[error("preflight: {0}")]
    Preflight(String),
    /// A local file or process operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// An HTTP request to the API (or the baseline handler) failed at the transport level.
    #[error("{context}: {source}")]
    Http {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: reqwest::Error,
    },
    /// A call through `differently-client` (tenant provisioning) failed: the API's error
    /// with its status and code, or the transport's.
    #[error("{context}: {source}")]
    Client {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: differently_client::Error,
    },
    /// The API answered with a status the harness did not expect.
    #[error("{context}: HTTP {status}: {body}")]
    Api {
        /// What was being done.
        context: String,
        /// The HTTP status.
        status: u16,
        /// The answer body (truncated).
        body: String,
    },
    /// A direct Postgres query (baseline or invariant check) failed.
    #[error("{context}: {source}")]
    Db {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: sqlx::Error,
    },
    /// A store call failed.
    #[error("{context}: {source}")]
    Store {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: differently_store::StoreError,
    },
    /// NATS / JetStream baseline failure.
    #[error("nats: {0}")]
    Nats(String),
    /// Something did not happen within its bound.
    #[error("timed out: {0}")]
    Timeout(String),
    /// A control-plane process died or misbehaved; carries its log tail.
    #[error("process: {0}")]
    Process(String),
    /// A measurement's own check failed (a stream delivered another byte count than asked
    /// for, or ended without its exit event): its figure would be wrong, so there is none.
    #[error("check: {0}")]
    Check(String),
    /// The plan is not runnable as given.
    #[error("plan: {0}")]
    Plan(String),
}

impl LoadError {
    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> LoadError {
        LoadError::Io {
            context: context.into(),
            source,
        }
    }

    /// Wraps a transport error with what was being done.
    pub fn http(context: impl Into<String>, source: reqwest::Error) -> LoadError {
        LoadError::Http {
            context: context.into(),
            source,
        }
    }

    /// Wraps a client call's error with what was being done.
    pub fn client(context: impl Into<String>, source: differently_client::Error) -> LoadError {
        LoadError::Client {
            context: context.into(),
            source,
        }
    }

    /// Wraps a database error with what was being done.
    pub fn db(context: impl Into<String>, source: sqlx::Error) -> LoadError {
        LoadError::Db {
            context: context.into(),
            source,
        }
    }
}
