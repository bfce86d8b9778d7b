//! The bridge's exec answer, read as it comes: Server-Sent Events whose `data` lines are
//! joined with newlines, dispatched at each blank line. The bridge sends `stdout` and
//! `stderr` (a base64 chunk each), then one terminal `exit` (`{"exit_code": N}`) or `error`
//! (`{"error": "...", "code": "..."}`).

use base64::Engine;
use bytes::{Bytes, BytesMut};
use serde::Deserialize;

/// One event of an exec stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    Stdout(Bytes),
    Stderr(Bytes),
    Exit(i32),
    /// The bridge's terminal `error`: its message and code.
    Error {
        message: String,
        code: String,
    },
}

/// Why an event could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SseError {
    #[error("`{event}` event data is not base64")]
    Base64 { event: String },
    #[error("`{event}` event data is not the JSON the bridge sends: {data}")]
    Json { event: String, data: String },
}

#[derive(Deserialize)]
struct ExitData {
    exit_code: i32,
}

#[derive(Deserialize)]
struct ErrorData {
    #[serde(default)]
    error: String,
    #[serde(default)]
    code: String,
}

/// Splits a byte stream into events; feed chunks with [`Parser::push`].
#[derive(Default)]
pub(crate) struct Parser {
    buf: BytesMut,
    event: String,
    data: Vec<String>,
}

impl Parser {
    /// The events completed by `chunk`, in order. Events of other names are skipped (the
    /// stream may grow new ones).
    pub(crate) fn push(&mut self, chunk: &[u8]) -> Vec<Result<Event, SseError>> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        while let Some(nl) = self.buf.iter().position(|b| *b == b'\n') {
            let line = self.buf.split_to(nl + 1);
            let text = String::from_utf8_lossy(&line[..nl]);
            let line = text.strip_suffix('\r').unwrap_or(&text);
            if line.is_empty() {
                if let Some(ev) = self.dispatch() {
                    out.push(ev);
                }
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "event" => self.event = value.to_owned(),
                "data" => self.data.push(value.to_owned()),
                _ => {}
            }
        }
        out
    }

    fn dispatch(&mut self) -> Option<Result<Event, SseError>> {
        let event = std::mem::take(&mut self.event);
        let data = std::mem::take(&mut self.data).join("\n");
        let b64 = base64::engine::general_purpose::STANDARD;
        let json_err = |event: &str, data: &str| SseError::Json {
            event: event.to_owned(),
            data: data.chars().take(200).collect(),
        };
        Some(match event.as_str() {
            "stdout" | "stderr" => match b64.decode(data.trim()) {
                Ok(bytes) if event == "stdout" => Ok(Event::Stdout(bytes.into())),
                Ok(bytes) => Ok(Event::Stderr(bytes.into())),
                Err(_) => Err(SseError::Base64 { event }),
            },
            "exit" => serde_json::from_str::<ExitData>(&data)
                .map(|d| Event::Exit(d.exit_code))
                .map_err(|_| json_err(&event, &data)),
            "error" => serde_json::from_str::<ErrorData>(&data)
                .map(|d| Event::Error {
                    message: d.error,
                    code: d.code,
                })
                .map_err(|_| json_err(&event, &data)),
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_anywhere_read_whole() {
        let wire = "event: stdout\ndata: aGk=\n\n: note\nevent: stderr\r\ndata: ZQ==\r\n\r\nevent: exit\ndata: {\"exit_code\": 3}\n\n";
        let mut p = Parser::default();
        let mut got = Vec::new();
        for b in wire.as_bytes() {
            got.extend(p.push(std::slice::from_ref(b)));
        }
        assert_eq!(
            got,
            vec![
                Ok(Event::Stdout(Bytes::from_static(b"hi"))),
                Ok(Event::Stderr(Bytes::from_static(b"e"))),
                Ok(Event::Exit(3)),
            ]
        );
        let mut p = Parser::default();
        let got = p.push(b"event: error\ndata: {\"error\": \"exec failed: x\",\ndata: \"code\": \"exec_transport_error\"}\n\nevent: stdout\ndata: !!\n\n");
        assert_eq!(
            got[0],
            Ok(Event::Error {
                message: "exec failed: x".into(),
                code: "exec_transport_error".into()
            })
        );
        assert!(matches!(got[1], Err(SseError::Base64 { .. })));
    }
}
