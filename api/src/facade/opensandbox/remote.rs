//! Commands of other API processes: a command lives in the process that runs it (`commands`),
//! and its id names that process, so a status, logs or interrupt call landing on another
//! process behind the load balancer is asked of the owner over the bus (core request/reply on
//! `dly.internal.facade.cmd.<instance>`, which no tenant credential can read). The caller has
//! already authorised the request for the sandbox; the owner still answers only for a command
//! of that sandbox.

use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::http::StatusCode;
use bytes::Bytes;
use differently_bus::BusError;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::commands;
use super::error::OsbError;
use super::Facade;

/// Longest a caller waits for the owner's answer: a live owner answers from memory in
/// milliseconds; beyond this the call answers 503 and the SDK may retry.
pub const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// One question about a command, as it crosses the bus.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Ask {
    Status {
        sandbox: String,
        command: String,
    },
    Logs {
        sandbox: String,
        command: String,
        cursor: usize,
    },
    Interrupt {
        sandbox: String,
        command: String,
    },
}

impl Ask {
    /// The command asked about.
    pub fn command(&self) -> &str {
        match self {
            Ask::Status { command, .. }
            | Ask::Logs { command, .. }
            | Ask::Interrupt { command, .. } => command,
        }
    }
}

/// The owner's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum Answer {
    /// No such command of that sandbox in the owner (never one, or forgotten).
    NotFound,
    /// execd's status body.
    Status { status: Value },
    /// One page of output and the cursor after it (`text` is base64 on the bus: output is
    /// bytes, and escaping as a JSON string could grow it sixfold).
    Logs {
        #[serde(with = "b64")]
        text: Vec<u8>,
        next: usize,
    },
    /// The interrupt was signalled.
    Interrupted,
    /// The owner could not read the question (another version's, say).
    Refused { message: String },
}

mod b64 {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)
    }
}

/// Why asking a command's owner failed.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    /// The id names no process this facade could have issued it from.
    #[error("not a command id of this facade")]
    NotAnId,
    /// Nobody serves the owner's subject: its process is gone, and its commands with it.
    #[error("the API process that ran the command is gone")]
    OwnerGone(#[source] BusError),
    /// The owner did not answer in time, or the bus failed.
    #[error("the API process that runs the command did not answer")]
    Unavailable(#[source] BusError),
    /// The question could not be written, or the owner's answer read.
    #[error("unreadable command answer")]
    Codec(#[from] serde_json::Error),
    /// The owner could not read the question.
    #[error("the API process that runs the command refused the question: {0}")]
    Refused(String),
}

impl AskError {
    /// The facade's answer for a failure to ask about command `cmd`.
    pub fn into_osb(self, cmd: &str) -> OsbError {
        match self {
            AskError::NotAnId => command_not_found(cmd, "not a command id of this API"),
            AskError::OwnerGone(e) => {
                tracing::info!(command = cmd, error = %e, "opensandbox facade: command owner gone");
                command_not_found(cmd, "the API process that ran it is gone")
            }
            AskError::Unavailable(e) => {
                tracing::warn!(command = cmd, error = %e, "opensandbox facade: command owner did not answer");
                let mut e = OsbError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "DIFFERENTLY::COMMAND_OWNER_UNAVAILABLE",
                    format!(
                        "the API process that runs command {cmd} did not answer within {} s; retry",
                        ASK_TIMEOUT.as_secs()
                    ),
                );
                e.retry_after = Some("1".into());
                e
            }
            e @ (AskError::Codec(_) | AskError::Refused(_)) => OsbError::internal(e),
        }
    }
}

/// 404 for a command this API cannot find, saying why.
pub fn command_not_found(cmd: &str, why: &str) -> OsbError {
    OsbError::new(
        StatusCode::NOT_FOUND,
        "INVALID_REQUEST_BODY",
        format!("command {cmd} not found: {why}"),
    )
}

/// The answer to `ask`: from this process's own registry when it runs the command, else
/// from the owner over the bus.
pub async fn ask(f: &Facade, ask: Ask) -> Result<Answer, AskError> {
    let owner = commands::owner_of(ask.command()).ok_or(AskError::NotAnId)?;
    if owner == f.instance {
        return Ok(f.commands.answer(&ask));
    }
    let subject = f.naming.facade_command_subject(owner);
    let question = Bytes::from(serde_json::to_vec(&ask)?);
    let reply = f
        .bus
        .request(&subject, question, ASK_TIMEOUT)
        .await
        .map_err(|e| match e {
            BusError::NoResponders(_) => AskError::OwnerGone(e),
            e => AskError::Unavailable(e),
        })?;
    match serde_json::from_slice(&reply)? {
        Answer::Refused { message } => Err(AskError::Refused(message)),
        answer => Ok(answer),
    }
}

/// Aborts the serving task when the facade goes (its process's router is dropped), so the
/// subject has nobody serving it and callers learn the owner is gone.
pub struct Serving(tokio::task::AbortHandle);

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Serves `facade`'s subject, answering from its registry, for as long as the facade lives.
/// `None` outside a Tokio runtime (a router built only to be inspected serves nothing).
pub fn serve(facade: &Arc<Facade>) -> Option<Serving> {
    let runtime = tokio::runtime::Handle::try_current().ok()?;
    let weak = Arc::downgrade(facade);
    let bus = facade.bus.clone();
    let subject = facade.naming.facade_command_subject(&facade.instance);
    let task = runtime.spawn(async move {
        let mut delay = Duration::from_millis(100);
        loop {
            match bus.serve(&subject).await {
                Ok(mut requests) => {
                    delay = Duration::from_millis(100);
                    while let Some(r) = requests.next().await {
                        let Some(answer) = answer_one(&weak, &r.payload) else {
                            return;
                        };
                        if let Err(e) = r.reply(answer).await {
                            tracing::warn!(error = %e, "opensandbox facade: cannot answer a command question");
                        }
                    }
                    tracing::warn!(subject, "opensandbox facade: command subject closed; serving again");
                }
                Err(e) => {
                    tracing::warn!(subject, error = %e, "opensandbox facade: cannot serve the command subject yet");
                }
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(5));
        }
    });
    Some(Serving(task.abort_handle()))
}

/// The encoded answer to one question; `None` once the facade is gone.
fn answer_one(facade: &Weak<Facade>, question: &[u8]) -> Option<Bytes> {
    let f = facade.upgrade()?;
    let answer = match serde_json::from_slice::<Ask>(question) {
        Ok(ask) => f.commands.answer(&ask),
        Err(e) => Answer::Refused {
            message: e.to_string(),
        },
    };
    let bytes = serde_json::to_vec(&answer).unwrap_or_else(|e| {
        // An answer is plain data; if it ever fails to encode, say so rather than go silent.
        let refused = Answer::Refused {
            message: format!("encode: {e}"),
        };
        serde_json::to_vec(&refused).unwrap_or_default()
    });
    Some(Bytes::from(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_round_trip_with_bytes_as_base64() {
        let a = Answer::Logs {
            text: vec![0, b'\n', 0xff],
            next: 3,
        };
        let wire = serde_json::to_value(&a).unwrap();
        assert_eq!(
            wire,
            serde_json::json!({"answer": "logs", "text": "AAr/", "next": 3})
        );
        assert_eq!(serde_json::from_value::<Answer>(wire).unwrap(), a);
        let q = Ask::Logs {
            sandbox: "sbx".into(),
            command: "c".into(),
            cursor: 7,
        };
        let wire = serde_json::to_value(&q).unwrap();
        assert_eq!(
            wire,
            serde_json::json!({"op": "logs", "sandbox": "sbx", "command": "c", "cursor": 7})
        );
        assert_eq!(serde_json::from_value::<Ask>(wire).unwrap(), q);
    }

    #[test]
    fn a_page_of_logs_fits_one_nats_message() {
        let a = Answer::Logs {
            text: vec![0u8; commands::LOG_PAGE_BYTES],
            next: usize::MAX,
        };
        let n = serde_json::to_vec(&a).unwrap().len();
        assert!(n < 1 << 20, "{n} bytes");
    }
}
