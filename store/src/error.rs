//! Store errors, mapped to HTTP codes once at the API edge.

use differently_core::SandboxStatus;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The row does not exist.
    #[error("not found")]
    NotFound,
    /// A compare-and-set lost: the row is now in `current`.
    #[error("sandbox is {current}, not in the expected status")]
    StatusConflict { current: SandboxStatus },
    /// The state machine forbids this change.
    #[error("illegal transition {from} -> {to}")]
    IllegalTransition {
        from: SandboxStatus,
        to: SandboxStatus,
    },
    /// An `Idempotency-Key` was reused with a different request body.
    #[error("idempotency key reused with a different request")]
    IdempotencyMismatch,
    /// A unique name is taken.
    #[error("already exists: {0}")]
    AlreadyExists(String),
    /// Deletion refused while dependents remain.
    #[error("still in use: {0}")]
    HasDependents(String),
    /// An admission limit (such as max queued) is reached.
    #[error("quota exceeded: {0}")]
    QuotaExceeded(String),
    /// An admission limit the sandbox could never fit, however much is free (it is bigger
    /// than one sandbox may be, or than the level's total), naming the request field.
    #[error("quota exceeded: {}", .0.message)]
    NeverFits(differently_core::FieldError),
    /// A value no store can keep (a NUL character), naming its field; both stores refuse
    /// it alike, behind the API's own check.
    #[error("invalid value: {0}")]
    InvalidValue(differently_core::FieldError),
    /// The database failed; the cause is kept for logs, never sent to clients.
    #[error("database: {0}")]
    Database(#[source] sqlx::Error),
    /// The store broke one of its own invariants (a value out of range, a lost group
    /// outcome, a missing sealing key); the message is for logs, never for clients.
    #[error("internal: {0}")]
    Internal(String),
}

impl StoreError {
    /// Whether the database could not be reached or dropped the connection (no connection
    /// within the pool's timeout, the pool closed, an I/O or TLS failure, Postgres shutting
    /// down or refusing connections), as opposed to a query that failed: worth a retry
    /// shortly, so served as 503 with `Retry-After` rather than 500.
    pub fn is_unavailable(&self) -> bool {
        let StoreError::Database(e) = self else {
            return false;
        };
        match e {
            sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::WorkerCrashed => true,
            // SQLSTATE class 08 (connection exception); 57P01-57P03 (the server is shutting
            // down, crashed, or cannot accept connections yet); 53300 (too many connections).
            sqlx::Error::Database(db) => db.code().is_some_and(|c| {
                c.starts_with("08") || matches!(c.as_ref(), "57P01" | "57P02" | "57P03" | "53300")
            }),
            _ => false,
        }
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        match e {
            sqlx::Error::RowNotFound => StoreError::NotFound,
            other => StoreError::Database(other),
        }
    }
}

impl From<differently_core::accounting::LimitExceeded> for StoreError {
    fn from(e: differently_core::accounting::LimitExceeded) -> Self {
        match e.field {
            Some(field) => {
                StoreError::NeverFits(differently_core::FieldError::new(field, e.message))
            }
            None => StoreError::QuotaExceeded(e.message),
        }
    }
}

impl From<differently_core::accounting::ChangeRefused> for StoreError {
    fn from(e: differently_core::accounting::ChangeRefused) -> Self {
        use differently_core::accounting::ChangeRefused;
        match e {
            ChangeRefused::StatusConflict { current } => StoreError::StatusConflict { current },
            ChangeRefused::IllegalTransition { from, to } => {
                StoreError::IllegalTransition { from, to }
            }
            ChangeRefused::TtlOutOfRange(_) => StoreError::Internal(e.to_string()),
            ChangeRefused::Unstorable(field) => StoreError::InvalidValue(field),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn a_lost_database_is_unavailable_and_a_failed_query_is_not() {
        let refused = || std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        for e in [
            sqlx::Error::PoolTimedOut,
            sqlx::Error::PoolClosed,
            sqlx::Error::WorkerCrashed,
            sqlx::Error::Io(refused()),
        ] {
            let shown = e.to_string();
            assert!(StoreError::from(e).is_unavailable(), "{shown}");
        }
        for e in [
            sqlx::Error::ColumnNotFound("x".into()),
            sqlx::Error::Protocol("odd".into()),
            sqlx::Error::RowNotFound,
        ] {
            let shown = e.to_string();
            assert!(!StoreError::from(e).is_unavailable(), "{shown}");
        }
        assert!(!StoreError::Internal("x".into()).is_unavailable());
        assert!(!StoreError::NotFound.is_unavailable());
    }

    #[test]
    fn a_database_error_keeps_its_cause() {
        let e = StoreError::from(sqlx::Error::PoolTimedOut);
        assert!(matches!(e, StoreError::Database(_)));
        let cause = e.source().map(|c| c.to_string());
        assert_eq!(cause, Some(sqlx::Error::PoolTimedOut.to_string()));
    }

    #[test]
    fn a_missing_row_is_not_found() {
        assert!(matches!(
            StoreError::from(sqlx::Error::RowNotFound),
            StoreError::NotFound
        ));
    }

    #[test]
    fn core_refusals_keep_their_meaning() {
        use differently_core::accounting::{ChangeRefused, LimitExceeded};
        let current = SandboxStatus::Running;
        assert!(matches!(
            StoreError::from(ChangeRefused::StatusConflict { current }),
            StoreError::StatusConflict {
                current: SandboxStatus::Running
            }
        ));
        assert!(matches!(
            StoreError::from(LimitExceeded::new("org cpu quota 8/8")),
            StoreError::QuotaExceeded(m) if m == "org cpu quota 8/8"
        ));
        assert!(matches!(
            StoreError::from(LimitExceeded {
                message: "resources.cpu 9 exceeds".into(),
                field: Some("resources.cpu".into()),
            }),
            StoreError::NeverFits(f) if f.field == "resources.cpu" && f.message == "resources.cpu 9 exceeds"
        ));
        assert!(matches!(
            StoreError::from(ChangeRefused::TtlOutOfRange(u64::MAX)),
            StoreError::Internal(_)
        ));
    }
}
