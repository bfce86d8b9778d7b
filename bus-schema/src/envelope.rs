//! The envelope every bus message travels in, and the one way to read one: [`decode`], which
//! checks the schema version before it trusts the body.

use chrono::{DateTime, Utc};
use differently_core::SandboxId;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::TraceContext;

/// Major version of the envelope layout and of every message body. A change that an older
/// consumer could misread (a field removed, renamed or re-typed) bumps it; added optional
/// fields do not. Consumers refuse envelopes of a newer major ([`decode`]).
pub const SCHEMA_VERSION: u32 = 1;

/// A message body with a name, for logs and metrics, and a place on the bus.
pub trait Message: Serialize + DeserializeOwned + Send + 'static {
    /// Short stable name (`admitted`, `work`, `status`).
    const KIND: &'static str;
}

/// Every bus message: schema version, the sandbox it is about, the status version it was
/// derived from (consumers drop work whose version is stale), a trace context, and a body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Envelope<T> {
    pub v: u32,
    pub sandbox_id: SandboxId,
    pub status_version: i64,
    #[serde(default)]
    pub trace: TraceContext,
    /// When the envelope was built; consumers measure bus lag from it. Absent in messages
    /// from before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published_at: Option<DateTime<Utc>>,
    pub body: T,
}

impl<T> Envelope<T> {
    /// Wraps `body` at the current schema version.
    pub fn new(sandbox_id: SandboxId, status_version: i64, body: T) -> Self {
        Envelope {
            v: SCHEMA_VERSION,
            sandbox_id,
            status_version,
            trace: TraceContext::default(),
            published_at: Some(Utc::now()),
            body,
        }
    }
}

impl<T: Serialize> Envelope<T> {
    /// The bytes published on the bus.
    pub fn encode(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(self)
    }
}

/// Why a payload is not a message this consumer can act on.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// Not JSON, or no `v` field: nothing of ours.
    #[error("not an envelope: {0}")]
    NotAnEnvelope(#[source] serde_json::Error),
    /// Written by a newer major version than this build reads: left for a newer consumer.
    #[error("envelope version {found} is newer than {supported}, the newest this build reads")]
    NewerVersion { found: u32, supported: u32 },
    /// An envelope of a version we read whose body does not fit the message.
    #[error("malformed {kind} message: {source}")]
    Malformed {
        kind: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

/// Reads an envelope of message `T`. A newer major is refused with
/// [`DecodeError::NewerVersion`], whether or not it happens to fit today's types: it is never
/// handed out read as them.
pub fn decode<T: Message>(payload: &[u8]) -> Result<Envelope<T>, DecodeError> {
    // One parse on the path every message takes: the whole envelope, then its version. Only a
    // payload that does not fit today's types is parsed again, for its version alone, to tell
    // a newer major (left for a newer consumer) from a malformed message. A newer major that
    // happens to fit is refused all the same.
    match serde_json::from_slice::<Envelope<T>>(payload) {
        Ok(env) if env.v > SCHEMA_VERSION => Err(DecodeError::NewerVersion {
            found: env.v,
            supported: SCHEMA_VERSION,
        }),
        Ok(env) => Ok(env),
        Err(source) => {
            #[derive(Deserialize)]
            struct VersionOnly {
                v: u32,
            }
            let version: VersionOnly =
                serde_json::from_slice(payload).map_err(DecodeError::NotAnEnvelope)?;
            if version.v > SCHEMA_VERSION {
                return Err(DecodeError::NewerVersion {
                    found: version.v,
                    supported: SCHEMA_VERSION,
                });
            }
            Err(DecodeError::Malformed {
                kind: T::KIND,
                source,
            })
        }
    }
}

/// The JetStream message id used for de-duplication: the same sandbox, operation and status
/// version always produce the same id, so a republish by the repair loop is dropped.
pub fn msg_id(sandbox: &SandboxId, what: &str, status_version: i64) -> String {
    format!("{sandbox}:{what}:{status_version}")
}
