//! The binary frames of `POST …/exec/stream` with `Accept:` [`MEDIA_TYPE`]: an 8-byte header
//! (type, three zero bytes, big-endian `u32` length) and the payload. Types: 1 stdout,
//! 2 stderr, 3 exit (JSON), 4 error (JSON), 0 heartbeat. Output payloads are handed out as
//! slices of the chunk they arrived in (no copy), so large streams cost what the network does.

use bytes::{Bytes, BytesMut};

/// The media type that selects frames.
pub const MEDIA_TYPE: &str = "application/vnd.differently.exec-stream";
const HEADER_LEN: usize = 8;

/// One piece of a frame stream, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Stdout bytes (a frame's payload, or the part of it in one chunk).
    Stdout(Bytes),
    /// Stderr bytes, likewise.
    Stderr(Bytes),
    /// The exit frame's JSON (last).
    Exit(Bytes),
    /// The error frame's JSON (last).
    Error(Bytes),
}

/// Why a body is not a frame stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("unknown frame type {0}")]
    UnknownType(u8),
    #[error("frame header bytes 1-3 are not zero")]
    Reserved,
    #[error("a heartbeat frame with a payload")]
    HeartbeatPayload,
    #[error("bytes after the exit or error frame")]
    AfterEnd,
    #[error("the body ended inside a frame")]
    Truncated,
    #[error("the body ended without an exit or error frame")]
    Unterminated,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Stdout,
    Stderr,
    Exit,
    Error,
}

/// Incremental decoder: [`push`](FrameDecoder::push) each chunk, then
/// [`finish`](FrameDecoder::finish).
#[derive(Debug, Default)]
pub struct FrameDecoder {
    header: [u8; HEADER_LEN],
    have: usize,
    current: Option<(Kind, usize)>,
    control: BytesMut,
    ended: bool,
}

impl FrameDecoder {
    /// Decodes `chunk`, appending its pieces to `out`.
    pub fn push(&mut self, mut chunk: Bytes, out: &mut Vec<Piece>) -> Result<(), FrameError> {
        while !chunk.is_empty() {
            if self.ended {
                return Err(FrameError::AfterEnd);
            }
            match self.current {
                None => {
                    let take = (HEADER_LEN - self.have).min(chunk.len());
                    self.header[self.have..self.have + take].copy_from_slice(&chunk[..take]);
                    self.have += take;
                    let _ = chunk.split_to(take);
                    if self.have == HEADER_LEN {
                        self.have = 0;
                        self.start_frame(out)?;
                    }
                }
                Some((kind, left)) => {
                    let take = left.min(chunk.len());
                    let part = chunk.split_to(take);
                    let left = left - take;
                    self.current = (left > 0).then_some((kind, left));
                    match kind {
                        Kind::Stdout => out.push(Piece::Stdout(part)),
                        Kind::Stderr => out.push(Piece::Stderr(part)),
                        Kind::Exit | Kind::Error => {
                            self.control.extend_from_slice(&part);
                            if left == 0 {
                                self.end_control(kind, out);
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn start_frame(&mut self, out: &mut Vec<Piece>) -> Result<(), FrameError> {
        let h = self.header;
        if h[1..4] != [0, 0, 0] {
            return Err(FrameError::Reserved);
        }
        let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
        let kind = match h[0] {
            0 if len == 0 => return Ok(()),
            0 => return Err(FrameError::HeartbeatPayload),
            1 => Kind::Stdout,
            2 => Kind::Stderr,
            3 => Kind::Exit,
            4 => Kind::Error,
            t => return Err(FrameError::UnknownType(t)),
        };
        if len == 0 {
            if matches!(kind, Kind::Exit | Kind::Error) {
                self.end_control(kind, out);
            }
            return Ok(());
        }
        self.current = Some((kind, len));
        Ok(())
    }

    fn end_control(&mut self, kind: Kind, out: &mut Vec<Piece>) {
        let payload = self.control.split().freeze();
        out.push(if kind == Kind::Exit {
            Piece::Exit(payload)
        } else {
            Piece::Error(payload)
        });
        self.ended = true;
    }

    /// At the body's end: an error unless the stream ended with exit or error.
    pub fn finish(&self) -> Result<(), FrameError> {
        if self.current.is_some() || self.have > 0 {
            return Err(FrameError::Truncated);
        }
        if !self.ended {
            return Err(FrameError::Unterminated);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(t: u8, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![t, 0, 0, 0];
        v.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn frames_split_anywhere_decode_to_the_same_bytes() {
        let mut body = frame(1, b"hello ");
        body.extend(frame(0, b""));
        body.extend(frame(2, b"oops"));
        body.extend(frame(1, b"world"));
        body.extend(frame(3, br#"{"exitCode":3,"durationMs":1}"#));
        for cut in 0..body.len() {
            let mut d = FrameDecoder::default();
            let mut out = vec![];
            d.push(Bytes::copy_from_slice(&body[..cut]), &mut out)
                .expect("first");
            d.push(Bytes::copy_from_slice(&body[cut..]), &mut out)
                .expect("second");
            d.finish().expect("finished");
            let (mut o, mut e, mut exit) = (vec![], vec![], None);
            for p in out {
                match p {
                    Piece::Stdout(b) => o.extend_from_slice(&b),
                    Piece::Stderr(b) => e.extend_from_slice(&b),
                    Piece::Exit(j) => exit = Some(j),
                    Piece::Error(_) => panic!("error piece"),
                }
            }
            assert_eq!(
                (&o[..], &e[..]),
                (&b"hello world"[..], &b"oops"[..]),
                "cut {cut}"
            );
            assert_eq!(
                exit.as_deref(),
                Some(&br#"{"exitCode":3,"durationMs":1}"#[..])
            );
        }
    }

    #[test]
    fn a_broken_stream_is_named() {
        let mut d = FrameDecoder::default();
        let mut out = vec![];
        assert_eq!(
            d.push(Bytes::from_static(&[9, 0, 0, 0, 0, 0, 0, 0]), &mut out),
            Err(FrameError::UnknownType(9))
        );
        let mut d = FrameDecoder::default();
        d.push(Bytes::from(frame(1, b"abc")[..6].to_vec()), &mut out)
            .expect("part");
        assert_eq!(d.finish(), Err(FrameError::Truncated));
        let mut d = FrameDecoder::default();
        d.push(Bytes::from(frame(1, b"abc")), &mut out)
            .expect("whole");
        assert_eq!(d.finish(), Err(FrameError::Unterminated));
        let mut d = FrameDecoder::default();
        let mut body = frame(3, b"{}");
        body.extend(frame(1, b"x"));
        assert_eq!(
            d.push(Bytes::from(body), &mut out),
            Err(FrameError::AfterEnd)
        );
    }
}
