//! A reader of the binary frames of `POST …/exec/stream` with
//! `Accept: application/vnd.differently.exec-stream` (layout in docs/api.md: 8-byte header —
//! type, three zero bytes, big-endian `u32` length — then the payload).
//!
//! Written from the documented layout rather than shared with `differently-api` (this crate
//! does not depend on the API), so it doubles as a check that the docs suffice for a client.
//! It measures throughput, so output payloads are handed out as slices of the chunk they
//! arrived in — never copied or reassembled — and only the small exit/error JSON is kept.

/// The media type that selects frames.
pub const MEDIA_TYPE: &str = "application/vnd.differently.exec-stream";
const HEADER_LEN: usize = 8;

/// What the reader hands out, in stream order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece<'a> {
    /// Stdout bytes: a whole frame's payload or the part of it in this chunk.
    Stdout(&'a [u8]),
    /// Stderr bytes, likewise.
    Stderr(&'a [u8]),
    /// A heartbeat frame.
    Heartbeat,
    /// The exit frame's JSON payload (the last piece).
    Exit(Vec<u8>),
    /// The error frame's JSON payload (the last piece).
    Error(Vec<u8>),
}

/// Why the body is not a valid frame stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// A frame type this reader does not know.
    #[error("unknown frame type {0}")]
    UnknownType(u8),
    /// Header bytes 1–3 are not zero.
    #[error("frame header bytes 1-3 are not zero")]
    Reserved,
    /// A heartbeat with a payload.
    #[error("heartbeat frame with a payload")]
    HeartbeatPayload,
    /// Bytes after the exit or error frame.
    #[error("bytes after the exit or error frame")]
    AfterEnd,
    /// The body ended inside a frame.
    #[error("the body ended inside a frame")]
    Truncated,
    /// The body ended without an exit or error frame.
    #[error("the body ended without an exit or error frame")]
    Unterminated,
}

/// The frame being read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Stdout,
    Stderr,
    Exit,
    Error,
}

/// Incremental reader: [`push`](FrameReader::push) each body chunk, then
/// [`finish`](FrameReader::finish).
#[derive(Debug, Default)]
pub struct FrameReader {
    header: [u8; HEADER_LEN],
    have: usize,
    /// The frame whose payload is being read and the payload bytes still to come.
    current: Option<(Kind, usize)>,
    /// Exit/error payload gathered so far.
    control: Vec<u8>,
    ended: bool,
    /// Frames completed so far (headers read), heartbeats included.
    pub frames: u64,
}

impl FrameReader {
    /// Consumes one chunk, handing `each` the pieces it contains, in order.
    pub fn push<'a>(
        &mut self,
        mut bytes: &'a [u8],
        mut each: impl FnMut(Piece<'a>),
    ) -> Result<(), FrameError> {
        while !bytes.is_empty() {
            if self.ended {
                return Err(FrameError::AfterEnd);
            }
            let Some((kind, left)) = self.current else {
                let take = (HEADER_LEN - self.have).min(bytes.len());
                self.header[self.have..self.have + take].copy_from_slice(&bytes[..take]);
                self.have += take;
                bytes = &bytes[take..];
                if self.have == HEADER_LEN {
                    self.have = 0;
                    self.start(&mut each)?;
                }
                continue;
            };
            let take = left.min(bytes.len());
            let (now, rest) = bytes.split_at(take);
            bytes = rest;
            let left = left - take;
            self.current = (left > 0).then_some((kind, left));
            match kind {
                Kind::Stdout => each(Piece::Stdout(now)),
                Kind::Stderr => each(Piece::Stderr(now)),
                Kind::Exit | Kind::Error => {
                    self.control.extend_from_slice(now);
                    if left == 0 {
                        self.end(kind, &mut each);
                    }
                }
            }
        }
        Ok(())
    }

    fn start<'a>(&mut self, each: &mut impl FnMut(Piece<'a>)) -> Result<(), FrameError> {
        let h = self.header;
        if h[1..4] != [0, 0, 0] {
            return Err(FrameError::Reserved);
        }
        let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        let kind = match h[0] {
            0 if len == 0 => {
                self.frames += 1;
                each(Piece::Heartbeat);
                return Ok(());
            }
            0 => return Err(FrameError::HeartbeatPayload),
            1 => Kind::Stdout,
            2 => Kind::Stderr,
            3 => Kind::Exit,
            4 => Kind::Error,
            t => return Err(FrameError::UnknownType(t)),
        };
        self.frames += 1;
        if len > 0 {
            self.current = Some((kind, len));
        } else if matches!(kind, Kind::Exit | Kind::Error) {
            self.end(kind, each);
        }
        Ok(())
    }

    fn end<'a>(&mut self, kind: Kind, each: &mut impl FnMut(Piece<'a>)) {
        self.ended = true;
        let json = std::mem::take(&mut self.control);
        each(match kind {
            Kind::Error => Piece::Error(json),
            _ => Piece::Exit(json),
        });
    }

    /// Checks that the body ended right after its exit or error frame.
    pub fn finish(&self) -> Result<(), FrameError> {
        if self.have > 0 || self.current.is_some() {
            Err(FrameError::Truncated)
        } else if !self.ended {
            Err(FrameError::Unterminated)
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(t: u8, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![t, 0, 0, 0];
        v.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
        v.extend_from_slice(payload);
        v
    }

    /// Reads `chunks`; returns (stdout, stderr, heartbeats, exit, error).
    #[allow(clippy::type_complexity)]
    fn read(
        r: &mut FrameReader,
        chunks: &[&[u8]],
    ) -> Result<(Vec<u8>, Vec<u8>, usize, Option<Vec<u8>>, Option<Vec<u8>>), FrameError> {
        let (mut out, mut err, mut beats, mut exit, mut error) =
            (Vec::new(), Vec::new(), 0, None, None);
        for c in chunks {
            r.push(c, |p| match p {
                Piece::Stdout(b) => out.extend_from_slice(b),
                Piece::Stderr(b) => err.extend_from_slice(b),
                Piece::Heartbeat => beats += 1,
                Piece::Exit(j) => exit = Some(j),
                Piece::Error(j) => error = Some(j),
            })?;
        }
        Ok((out, err, beats, exit, error))
    }

    fn wire() -> Vec<u8> {
        [
            frame(1, b"y\ny\n\xff"),
            frame(0, b""),
            frame(2, b"oops"),
            frame(1, b"\x00z"),
            frame(3, br#"{"exitCode":0,"durationMs":1}"#),
        ]
        .concat()
    }

    #[test]
    fn a_body_split_anywhere_reads_the_same() {
        let wire = wire();
        for cut in 0..=wire.len() {
            let mut r = FrameReader::default();
            let got = read(&mut r, &[&wire[..cut], &wire[cut..]]).unwrap();
            assert_eq!(got.0, b"y\ny\n\xff\x00z", "cut at {cut}");
            assert_eq!(got.1, b"oops");
            assert_eq!(got.2, 1);
            assert_eq!(
                got.3.as_deref(),
                Some(&br#"{"exitCode":0,"durationMs":1}"#[..])
            );
            assert_eq!(got.4, None);
            assert_eq!(r.frames, 5);
            r.finish().unwrap();
        }
    }

    #[test]
    fn output_is_handed_out_in_place() {
        let wire = frame(1, b"abc");
        let mut r = FrameReader::default();
        let mut at = None;
        r.push(&wire, |p| {
            if let Piece::Stdout(b) = p {
                at = Some(b.as_ptr());
            }
        })
        .unwrap();
        assert_eq!(at, Some(wire[HEADER_LEN..].as_ptr()));
    }

    #[test]
    fn error_frames_end_the_stream() {
        let wire = [frame(1, b"a"), frame(4, br#"{"code":"internal"}"#)].concat();
        let mut r = FrameReader::default();
        let got = read(&mut r, &[&wire]).unwrap();
        assert_eq!(got.4.as_deref(), Some(&br#"{"code":"internal"}"#[..]));
        r.finish().unwrap();
    }

    #[test]
    fn bad_bodies_are_refused() {
        let wire = wire();
        for cut in 0..wire.len() {
            let mut r = FrameReader::default();
            read(&mut r, &[&wire[..cut]]).unwrap();
            assert!(r.finish().is_err(), "cut at {cut}");
        }
        let mut r = FrameReader::default();
        read(&mut r, &[&wire[..3]]).unwrap();
        assert_eq!(r.finish(), Err(FrameError::Truncated));
        let bad = |b: &[u8]| read(&mut FrameReader::default(), &[b]).unwrap_err();
        assert_eq!(bad(&frame(5, b"")), FrameError::UnknownType(5));
        assert_eq!(bad(&[1, 1, 0, 0, 0, 0, 0, 0]), FrameError::Reserved);
        assert_eq!(bad(&frame(0, b"x")), FrameError::HeartbeatPayload);
        assert_eq!(
            bad(&[frame(3, b"{}"), frame(1, b"late")].concat()),
            FrameError::AfterEnd
        );
    }
}
