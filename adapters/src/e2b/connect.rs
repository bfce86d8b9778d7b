//! The Connect protocol's streaming framing, as envd speaks it for `process.Process/Start`:
//! each message is an envelope of one flag byte, a 4-byte big-endian length and the message
//! (JSON here); the last envelope of a response has flag `0x02` and carries the end-of-stream
//! object (`{"error": {"code", "message"}}` or `{}`). Public for the fuzzers: it parses bytes
//! a backend sends, so it must never panic on any of them.

use bytes::{Buf, Bytes, BytesMut};

/// Flag of the end-of-stream envelope.
pub const END_STREAM: u8 = 0x02;
/// Flag of a compressed message (never asked for, so refused).
pub const COMPRESSED: u8 = 0x01;
/// Largest message accepted: envd sends output in small chunks; a bigger length is garbage.
pub const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// One envelope of a request body.
pub fn envelope(message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(0);
    out.extend_from_slice(
        &u32::try_from(message.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    out.extend_from_slice(message);
    out
}

/// A complete envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A message.
    Message(Bytes),
    /// The end-of-stream object.
    End(Bytes),
}

/// Why the byte stream is not Connect framing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("envelope of {0} bytes is larger than allowed")]
    TooLarge(usize),
    #[error("compressed envelope, though none was asked for")]
    Compressed,
    #[error("unknown envelope flag {0:#04x}")]
    Flag(u8),
}

/// Splits a byte stream into envelopes, whatever the chunking.
#[derive(Debug, Default)]
pub struct FrameParser {
    buf: BytesMut,
}

impl FrameParser {
    /// Adds received bytes.
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next complete envelope, if one has arrived.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let flag = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]);
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if len > MAX_MESSAGE {
            return Err(FrameError::TooLarge(len));
        }
        if flag & COMPRESSED != 0 {
            return Err(FrameError::Compressed);
        }
        if flag & !END_STREAM != 0 {
            return Err(FrameError::Flag(flag));
        }
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        self.buf.advance(5);
        let body = self.buf.split_to(len).freeze();
        Ok(Some(if flag & END_STREAM != 0 {
            Frame::End(body)
        } else {
            Frame::Message(body)
        }))
    }

    /// Bytes received that are not a whole envelope yet (a stream ending with some is
    /// truncated).
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

/// A Connect error (`{"code": "not_found", "message": "…"}`), as an end-of-stream object
/// holds it or a unary call answers it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
pub struct ConnectError {
    #[serde(default)]
    pub code: String,
    #[serde(default)]
    pub message: String,
}

/// The end-of-stream object.
#[derive(Debug, Default, serde::Deserialize)]
pub struct EndStream {
    #[serde(default)]
    pub error: Option<ConnectError>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_across_any_chunking() {
        let mut wire = envelope(br#"{"a":1}"#);
        wire.push(END_STREAM);
        wire.extend_from_slice(&2u32.to_be_bytes());
        wire.extend_from_slice(b"{}");
        for cut in 0..wire.len() {
            let mut p = FrameParser::default();
            p.push(&wire[..cut]);
            let mut frames = Vec::new();
            while let Some(f) = p.next_frame().unwrap() {
                frames.push(f);
            }
            p.push(&wire[cut..]);
            while let Some(f) = p.next_frame().unwrap() {
                frames.push(f);
            }
            assert_eq!(
                frames,
                [
                    Frame::Message(Bytes::from_static(br#"{"a":1}"#)),
                    Frame::End(Bytes::from_static(b"{}"))
                ]
            );
            assert_eq!(p.pending(), 0);
        }
    }

    #[test]
    fn random_bytes_never_panic() {
        // A small xorshift: deterministic, no dependency (the fuzz targets go further).
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..2000 {
            let mut p = FrameParser::default();
            for _ in 0..8 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let len = usize::try_from(x % 40).unwrap_or(0);
                let chunk: Vec<u8> = (0..len).map(|i| (x >> (i % 8 * 8)) as u8).collect();
                p.push(&chunk);
                while let Ok(Some(_)) = p.next_frame() {}
            }
        }
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let mut p = FrameParser::default();
        p.push(&[0x00, 0xff, 0xff, 0xff, 0xff]);
        assert!(matches!(p.next_frame(), Err(FrameError::TooLarge(_))));
        let mut p = FrameParser::default();
        p.push(&[0x01, 0, 0, 0, 0]);
        assert_eq!(p.next_frame(), Err(FrameError::Compressed));
        let mut p = FrameParser::default();
        p.push(&[0x80, 0, 0, 0, 0]);
        assert_eq!(p.next_frame(), Err(FrameError::Flag(0x80)));
    }
}
