//! Binary framing of streamed exec output, the alternative to SSE that a client picks with
//! `Accept: application/vnd.differently.exec-stream`.
//!
//! Why it exists: SSE carries each output chunk as a JSON string, so the server escapes and
//! the client unescapes every byte (and `y\n`-like output escapes every other byte), and the
//! bytes must be text or base64. A length-prefixed frame moves the adapter's chunk as it is:
//! no encoding, binary-safe. The API writes each frame's header and payload into one body
//! chunk, together with the frames of any further output already queued ([`output`] appends
//! to a buffer): every body chunk is one HTTP chunk that each client handles on its own, and
//! that per-chunk work costs a client far more than the one `memcpy` costs the server.
//!
//! Layout, deliberately Docker's attach/logs multiplexing header so existing demultiplexers
//! (`stdcopy` and friends) split stdout from stderr unchanged: byte 0 is the frame type,
//! bytes 1–3 are zero, bytes 4–7 the payload length as a big-endian `u32`; the payload follows.
//! Types 3 (exit), 4 (error) and 0 (heartbeat) are ours; a Docker demultiplexer that only
//! knows 0–2 reads a heartbeat as an empty stdin frame.
//!
//! [`FrameDecoder`] is the reference reader: it takes the body in pieces split anywhere and
//! checks the stream's grammar (exactly one exit or error frame, last).

use axum::body::Bytes;
use bytes::BytesMut;

/// The media type that selects this format (request `Accept`, response `Content-Type`).
pub const MEDIA_TYPE: &str = "application/vnd.differently.exec-stream";
/// Bytes of a frame header.
pub const HEADER_LEN: usize = 8;
/// The largest payload one frame can carry (the length field is a `u32`).
pub const MAX_PAYLOAD: usize = u32::MAX as usize;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameType {
    /// `0`: empty, sent on a quiet stream so proxies keep it open.
    Heartbeat,
    /// `1`: raw stdout bytes.
    Stdout,
    /// `2`: raw stderr bytes.
    Stderr,
    /// `3`: the last frame of a finished command; payload is the JSON `{exitCode, durationMs}`.
    Exit,
    /// `4`: the last frame of a failed stream; payload is the JSON `{code, message}`.
    Error,
}

impl FrameType {
    /// The type byte on the wire.
    pub fn byte(self) -> u8 {
        match self {
            FrameType::Heartbeat => 0,
            FrameType::Stdout => 1,
            FrameType::Stderr => 2,
            FrameType::Exit => 3,
            FrameType::Error => 4,
        }
    }

    /// The type of a wire byte, `None` for a type this version does not know.
    pub fn from_byte(b: u8) -> Option<FrameType> {
        match b {
            0 => Some(FrameType::Heartbeat),
            1 => Some(FrameType::Stdout),
            2 => Some(FrameType::Stderr),
            3 => Some(FrameType::Exit),
            4 => Some(FrameType::Error),
            _ => None,
        }
    }

    /// Whether this frame ends the stream.
    pub fn is_end(self) -> bool {
        matches!(self, FrameType::Exit | FrameType::Error)
    }
}

/// The header of a frame of `kind` with a payload of `len` bytes.
pub fn header(kind: FrameType, len: u32) -> [u8; HEADER_LEN] {
    let l = len.to_be_bytes();
    [kind.byte(), 0, 0, 0, l[0], l[1], l[2], l[3]]
}

/// A heartbeat frame.
pub fn heartbeat() -> Bytes {
    Bytes::from_static(&[0; HEADER_LEN])
}

/// An exit or error frame (small JSON payload): header and payload in one buffer, since the
/// copy costs less than a second body chunk. Payloads over [`MAX_PAYLOAD`] cannot occur for
/// the JSON the API writes; one would be cut to the limit rather than mis-framed.
pub fn control(kind: FrameType, json: &[u8]) -> Bytes {
    let json = &json[..json.len().min(MAX_PAYLOAD)];
    let len = u32::try_from(json.len()).unwrap_or(u32::MAX);
    let mut v = Vec::with_capacity(HEADER_LEN + json.len());
    v.extend_from_slice(&header(kind, len));
    v.extend_from_slice(json);
    Bytes::from(v)
}

/// Appends the frames carrying `payload` (stdout or stderr) to `out`, each as its header
/// followed by the bytes. An empty payload appends nothing (an empty output frame would carry
/// no information); a payload over [`MAX_PAYLOAD`] becomes several frames.
pub fn output(kind: FrameType, payload: &[u8], out: &mut BytesMut) {
    output_limited(kind, payload, MAX_PAYLOAD, out);
}

fn output_limited(kind: FrameType, payload: &[u8], limit: usize, out: &mut BytesMut) {
    for piece in payload.chunks(limit.max(1)) {
        let len = u32::try_from(piece.len()).unwrap_or(u32::MAX);
        out.reserve(HEADER_LEN + piece.len());
        out.extend_from_slice(&header(kind, len));
        out.extend_from_slice(piece);
    }
}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Its type.
    pub kind: FrameType,
    /// Its payload (empty for a heartbeat).
    pub payload: Bytes,
}

/// Why a byte stream is not a valid frame stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// A header names a type this version does not know.
    #[error("unknown frame type {0}")]
    UnknownType(u8),
    /// A header's bytes 1–3 are not zero.
    #[error("frame header bytes 1-3 are {0:?}, not zero")]
    Reserved([u8; 3]),
    /// A heartbeat frame with a payload.
    #[error("heartbeat frame with a {0}-byte payload")]
    HeartbeatPayload(u32),
    /// Bytes after the exit or error frame.
    #[error("bytes after the stream's {0:?} frame")]
    AfterEnd(FrameType),
    /// The body ended inside a frame.
    #[error("the stream ended inside a frame ({0} bytes of it arrived)")]
    Truncated(usize),
    /// The body ended without an exit or error frame.
    #[error("the stream ended without an exit or error frame")]
    Unterminated,
}

/// Incremental reader of a frame stream: feed the body in pieces split anywhere with
/// [`push`](FrameDecoder::push), then call [`finish`](FrameDecoder::finish) at its end. After
/// an error every later call returns that error again.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    header: [u8; HEADER_LEN],
    /// Header bytes gathered so far (`HEADER_LEN` once the payload is being read).
    have: usize,
    /// The frame whose payload is being read, and how long that payload is.
    current: Option<(FrameType, usize)>,
    payload: Vec<u8>,
    /// The exit or error frame, once seen.
    ended: Option<FrameType>,
    failed: Option<FrameError>,
}

impl FrameDecoder {
    /// Consumes `bytes` and returns the frames they complete, in order.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<Frame>, FrameError> {
        let mut frames = Vec::new();
        self.push_with(bytes, |f| frames.push(f))?;
        Ok(frames)
    }

    /// [`push`](FrameDecoder::push) handing each completed frame to `each` instead of
    /// collecting them.
    pub fn push_with(&mut self, bytes: &[u8], each: impl FnMut(Frame)) -> Result<(), FrameError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let r = self.consume(bytes, each);
        if let Err(e) = &r {
            self.failed = Some(e.clone());
        }
        r
    }

    fn consume(&mut self, mut bytes: &[u8], mut each: impl FnMut(Frame)) -> Result<(), FrameError> {
        while !bytes.is_empty() {
            if let Some(end) = self.ended {
                return Err(FrameError::AfterEnd(end));
            }
            let Some((kind, len)) = self.current else {
                let take = (HEADER_LEN - self.have).min(bytes.len());
                self.header[self.have..self.have + take].copy_from_slice(&bytes[..take]);
                self.have += take;
                bytes = &bytes[take..];
                if self.have == HEADER_LEN {
                    self.start_frame(&mut each)?;
                }
                continue;
            };
            let need = len - self.payload.len();
            if self.payload.is_empty() && bytes.len() >= need {
                // The whole payload is in this piece: no reassembly buffer.
                self.current = None;
                self.complete(kind, Bytes::copy_from_slice(&bytes[..need]), &mut each);
                bytes = &bytes[need..];
                continue;
            }
            let take = need.min(bytes.len());
            self.payload.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.payload.len() == len {
                self.current = None;
                let payload = Bytes::from(std::mem::take(&mut self.payload));
                self.complete(kind, payload, &mut each);
            }
        }
        Ok(())
    }

    /// The header is complete: checks it, and completes a frame with an empty payload.
    fn start_frame(&mut self, each: &mut impl FnMut(Frame)) -> Result<(), FrameError> {
        let h = self.header;
        self.have = 0;
        let kind = FrameType::from_byte(h[0]).ok_or(FrameError::UnknownType(h[0]))?;
        if h[1..4] != [0, 0, 0] {
            return Err(FrameError::Reserved([h[1], h[2], h[3]]));
        }
        let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
        if kind == FrameType::Heartbeat && len != 0 {
            return Err(FrameError::HeartbeatPayload(len));
        }
        match usize::try_from(len).unwrap_or(usize::MAX) {
            0 => self.complete(kind, Bytes::new(), each),
            n => self.current = Some((kind, n)),
        }
        Ok(())
    }

    fn complete(&mut self, kind: FrameType, payload: Bytes, each: &mut impl FnMut(Frame)) {
        if kind.is_end() {
            self.ended = Some(kind);
        }
        each(Frame { kind, payload });
    }

    /// Checks that the stream ended where it may: after its exit or error frame.
    pub fn finish(&self) -> Result<(), FrameError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let partial = self.have + self.current.map_or(0, |_| HEADER_LEN + self.payload.len());
        if partial > 0 {
            return Err(FrameError::Truncated(partial));
        }
        match self.ended {
            Some(_) => Ok(()),
            None => Err(FrameError::Unterminated),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream of every frame type, as the API writes it.
    fn wire() -> Vec<u8> {
        let mut q = BytesMut::new();
        output(FrameType::Stdout, b"out\xff\x00", &mut q);
        q.extend_from_slice(&heartbeat());
        output(FrameType::Stderr, b"err", &mut q);
        output(FrameType::Stdout, b"", &mut q);
        q.extend_from_slice(&control(FrameType::Exit, br#"{"exitCode":7}"#));
        q.to_vec()
    }

    fn expected() -> Vec<Frame> {
        let f = |kind, p: &'static [u8]| Frame {
            kind,
            payload: Bytes::from_static(p),
        };
        vec![
            f(FrameType::Stdout, b"out\xff\x00"),
            f(FrameType::Heartbeat, b""),
            f(FrameType::Stderr, b"err"),
            f(FrameType::Exit, br#"{"exitCode":7}"#),
        ]
    }

    #[test]
    fn header_is_dockers_layout() {
        assert_eq!(header(FrameType::Stdout, 65536), [1, 0, 0, 0, 0, 1, 0, 0]);
        assert_eq!(
            header(FrameType::Stderr, 0x0102_0304),
            [2, 0, 0, 0, 1, 2, 3, 4]
        );
        assert_eq!(&heartbeat()[..], &[0u8; 8]);
        let exit = control(FrameType::Exit, b"{}");
        assert_eq!(&exit[..], &[3, 0, 0, 0, 0, 0, 0, 2, b'{', b'}']);
        let err = control(FrameType::Error, b"{\"code\":\"x\"}");
        assert_eq!(err[0], 4);
        assert_eq!(u32::from_be_bytes([err[4], err[5], err[6], err[7]]), 12);
        for t in 0..=255u8 {
            if let Some(k) = FrameType::from_byte(t) {
                assert_eq!(k.byte(), t);
            } else {
                assert!(t > 4);
            }
        }
    }

    #[test]
    fn output_is_header_then_the_same_bytes_and_empty_chunks_vanish() {
        let payload = vec![b'y'; 70_000];
        let mut q = BytesMut::from(&b"before"[..]);
        output(FrameType::Stdout, &payload, &mut q);
        assert_eq!(q.len(), 6 + HEADER_LEN + 70_000);
        assert_eq!(&q[..6], b"before");
        assert_eq!(&q[6..6 + HEADER_LEN], &header(FrameType::Stdout, 70_000));
        assert_eq!(&q[6 + HEADER_LEN..], &payload[..]);
        let mut q = BytesMut::new();
        output(FrameType::Stdout, b"", &mut q);
        output(FrameType::Stderr, b"", &mut q);
        assert!(q.is_empty());
    }

    #[test]
    fn oversized_payloads_become_several_frames() {
        let mut q = BytesMut::new();
        output_limited(FrameType::Stderr, b"abcdefg", 3, &mut q);
        let mut d = FrameDecoder::default();
        let frames = d.push(&q).unwrap();
        let got: Vec<&[u8]> = frames.iter().map(|f| &f.payload[..]).collect();
        assert_eq!(got, vec![&b"abc"[..], b"def", b"g"]);
        assert!(frames.iter().all(|f| f.kind == FrameType::Stderr));
    }

    #[test]
    fn frames_split_at_every_boundary_reassemble() {
        let wire = wire();
        for cut in 0..=wire.len() {
            let mut d = FrameDecoder::default();
            let mut frames = d.push(&wire[..cut]).unwrap();
            frames.extend(d.push(&wire[cut..]).unwrap());
            assert_eq!(frames, expected(), "cut at {cut}");
            d.finish().unwrap();
        }
        // And fed one byte at a time.
        let mut d = FrameDecoder::default();
        let mut frames = Vec::new();
        for b in &wire {
            frames.extend(d.push(std::slice::from_ref(b)).unwrap());
        }
        assert_eq!(frames, expected());
        d.finish().unwrap();
    }

    #[test]
    fn a_cut_stream_is_truncated_or_unterminated() {
        let wire = wire();
        for cut in 0..wire.len() {
            let mut d = FrameDecoder::default();
            d.push(&wire[..cut]).unwrap();
            let e = d.finish().unwrap_err();
            assert!(
                matches!(e, FrameError::Truncated(_) | FrameError::Unterminated),
                "cut at {cut}: {e}"
            );
        }
        let mut d = FrameDecoder::default();
        d.push(&wire[..5]).unwrap();
        assert_eq!(d.finish(), Err(FrameError::Truncated(5)));
        let mut d = FrameDecoder::default();
        d.push(&wire[..HEADER_LEN + 2]).unwrap();
        assert_eq!(d.finish(), Err(FrameError::Truncated(HEADER_LEN + 2)));
    }

    #[test]
    fn malformed_streams_are_refused() {
        let bad = |bytes: &[u8]| FrameDecoder::default().push(bytes).unwrap_err();
        assert_eq!(bad(&[9, 0, 0, 0, 0, 0, 0, 0]), FrameError::UnknownType(9));
        assert_eq!(
            bad(&[1, 0, 1, 0, 0, 0, 0, 0]),
            FrameError::Reserved([0, 1, 0])
        );
        assert_eq!(
            bad(&[0, 0, 0, 0, 0, 0, 0, 1]),
            FrameError::HeartbeatPayload(1)
        );
        let mut after = control(FrameType::Exit, b"{}").to_vec();
        after.extend_from_slice(&heartbeat());
        assert_eq!(bad(&after), FrameError::AfterEnd(FrameType::Exit));
        // An error sticks.
        let mut d = FrameDecoder::default();
        assert!(d.push(&[7; 8]).is_err());
        assert_eq!(d.push(&heartbeat()), Err(FrameError::UnknownType(7)));
        assert_eq!(d.finish(), Err(FrameError::UnknownType(7)));
    }

    #[test]
    fn an_error_frame_ends_the_stream() {
        let mut d = FrameDecoder::default();
        let f = d
            .push(&control(FrameType::Error, br#"{"code":"internal"}"#))
            .unwrap();
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].kind, FrameType::Error);
        d.finish().unwrap();
    }
}
