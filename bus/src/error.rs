//! Bus errors: a kind callers branch on, and the cause kept for logs and for callers that
//! need to look deeper (a timeout, a connection reset) than the kind.

use std::fmt;

/// Why a bus operation failed.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// Could not reach the server, or it went away.
    #[error("bus connection: {0}")]
    Connection(Detail),
    /// The server is too old or lacks JetStream.
    #[error("bus server unsupported: {0}")]
    Unsupported(Detail),
    /// Stream or consumer setup failed.
    #[error("bus setup: {0}")]
    Setup(Detail),
    /// Publishing was not acknowledged by the stream.
    #[error("bus publish: {0}")]
    Publish(Detail),
    /// Fetching, acking or reading failed.
    #[error("bus consume: {0}")]
    Consume(Detail),
    /// A request found nobody serving its subject: the server said so at once, so the
    /// caller knows the responder is gone rather than slow.
    #[error("bus request: no responders: {0}")]
    NoResponders(Detail),
    /// A request reached a responder (or may have) but no answer came in time.
    #[error("bus request: timed out: {0}")]
    Timeout(Detail),
}

impl BusError {
    /// The underlying error (the NATS client's, a codec's), when there is one.
    pub fn cause(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        let (BusError::Connection(d)
        | BusError::Unsupported(d)
        | BusError::Setup(d)
        | BusError::Publish(d)
        | BusError::Consume(d)
        | BusError::NoResponders(d)
        | BusError::Timeout(d)) = self;
        d.source.as_deref()
    }
}

/// What went wrong, in words for the log, and the error that caused it. It reads as its
/// message (`Deref<Target = str>`), so callers that only look at the text keep working.
#[derive(Debug)]
pub struct Detail {
    message: String,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl Detail {
    /// A message with no underlying error.
    pub fn new(message: impl Into<String>) -> Detail {
        Detail {
            message: message.into(),
            source: None,
        }
    }

    /// A message and the error that caused it (kept as the `source()`).
    pub fn caused(
        message: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Detail {
        Detail {
            message: message.into(),
            source: Some(source.into()),
        }
    }
}

impl fmt::Display for Detail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Detail {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl std::ops::Deref for Detail {
    type Target = str;
    fn deref(&self) -> &str {
        &self.message
    }
}

impl From<String> for Detail {
    fn from(message: String) -> Detail {
        Detail::new(message)
    }
}

impl From<&str> for Detail {
    fn from(message: &str) -> Detail {
        Detail::new(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cause_is_kept_and_the_message_reads_as_before() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let e = BusError::Consume(Detail::caused(format!("pull: {io}"), io));
        assert_eq!(e.to_string(), "bus consume: pull: reset by peer");
        let cause = e.cause().expect("a cause");
        let io = cause
            .downcast_ref::<std::io::Error>()
            .expect("the io error itself");
        assert_eq!(io.kind(), std::io::ErrorKind::ConnectionReset);
        let plain = BusError::Setup("no stream X".into());
        assert!(plain.cause().is_none());
        assert!(matches!(&plain, BusError::Setup(m) if m.contains("stream X")));
    }
}
