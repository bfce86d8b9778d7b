//! What one API process asks the supervisor of a pid, and its answers: the same questions
//! whether the supervisor is this process (answered in place) or another (over the bus, on
//! `dly.internal.proc.<slot>`). The caller has already authorised the request for the
//! sandbox; the supervisor still answers only for a pid of that sandbox.

use differently_core::process::{Process, ProcessSignal, TerminalSize};
use serde::{Deserialize, Serialize};

use super::entry::{Chunk, Ending, Stream};

/// One question about the processes of `sandbox`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Ask {
    /// Is anyone serving this slot? (Answered `Pong`; used to pick a free slot.)
    Ping,
    Get {
        sandbox: String,
        pid: u32,
    },
    /// The processes of `sandbox` this supervisor holds.
    List {
        sandbox: String,
    },
    /// Output from `from`, at most about `max` bytes; when there is none yet, waits up to
    /// `wait_ms` for some (or the end).
    Read {
        sandbox: String,
        pid: u32,
        from: u64,
        max: usize,
        wait_ms: u64,
    },
    Stdin {
        sandbox: String,
        pid: u32,
        #[serde(with = "b64")]
        bytes: Vec<u8>,
    },
    CloseStdin {
        sandbox: String,
        pid: u32,
    },
    Signal {
        sandbox: String,
        pid: u32,
        signal: ProcessSignal,
    },
    Resize {
        sandbox: String,
        pid: u32,
        size: TerminalSize,
    },
}

/// A piece of output as it crosses the bus (bytes as base64: output is bytes, and a JSON
/// string escape could grow it sixfold).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireChunk {
    pub at: u64,
    pub stream: Stream,
    #[serde(with = "b64")]
    pub bytes: Vec<u8>,
}

impl From<Chunk> for WireChunk {
    fn from(c: Chunk) -> WireChunk {
        WireChunk {
            at: c.at,
            stream: c.stream,
            bytes: c.bytes.to_vec(),
        }
    }
}

/// The supervisor's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum Answer {
    Pong,
    /// No such pid in that sandbox (never, ended and forgotten, or another sandbox's).
    NotFound,
    Process {
        process: Box<Process>,
    },
    Processes {
        items: Vec<Process>,
    },
    Output {
        chunks: Vec<WireChunk>,
        next: u64,
        ending: Option<Ending>,
    },
    /// Done (input handed over, signal sent).
    Done,
    /// The request cannot be done in the process's state (stdin closed, not a terminal,
    /// ended): a 409 saying why.
    Conflict {
        message: String,
    },
    /// The process does not take input fast enough to hand this over now: a 503 to retry.
    Busy {
        message: String,
    },
    /// The supervisor could not read the question (another version's, say).
    Refused {
        message: String,
    },
}

/// Output pages cross the bus as one NATS message (1 MiB by default), base64 and all.
pub const READ_PAGE_BYTES: usize = 512 << 10;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn questions_and_answers_round_trip_with_bytes_as_base64() {
        let q = Ask::Stdin {
            sandbox: "sbx".into(),
            pid: 9,
            bytes: vec![0, b'\n', 0xff],
        };
        let wire = serde_json::to_value(&q).expect("encodes");
        assert_eq!(
            wire,
            serde_json::json!({"op": "stdin", "sandbox": "sbx", "pid": 9, "bytes": "AAr/"})
        );
        assert_eq!(serde_json::from_value::<Ask>(wire).expect("decodes"), q);
        let a = Answer::Output {
            chunks: vec![WireChunk {
                at: 3,
                stream: Stream::Stderr,
                bytes: b"x".to_vec(),
            }],
            next: 4,
            ending: Some(Ending::Exit {
                exit_code: 1,
                duration_ms: 2,
            }),
        };
        let wire = serde_json::to_vec(&a).expect("encodes");
        assert_eq!(serde_json::from_slice::<Answer>(&wire).expect("decodes"), a);
    }

    #[test]
    fn a_page_of_output_fits_one_nats_message() {
        let a = Answer::Output {
            chunks: vec![WireChunk {
                at: 0,
                stream: Stream::Stdout,
                bytes: vec![0u8; READ_PAGE_BYTES + (64 << 10)],
            }],
            next: u64::MAX,
            ending: None,
        };
        let n = serde_json::to_vec(&a).expect("encodes").len();
        assert!(n < 1 << 20, "{n} bytes");
    }
}
