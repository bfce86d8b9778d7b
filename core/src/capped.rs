//! Keeping the head of an unbounded byte stream: collected exec output is capped so one noisy
//! command cannot exhaust a server's memory, and the caller is told that bytes were cut.

/// Cap on captured stdout and on captured stderr, each, for an exec whose output is collected
/// (not streamed). The one number every adapter and the API use.
pub const OUTPUT_CAP_BYTES: usize = 1024 * 1024;

/// The first `cap` bytes of a stream of chunks, and whether anything after them was dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CappedOutput {
    bytes: Vec<u8>,
    cap: usize,
    truncated: bool,
}

impl Default for CappedOutput {
    /// Capped at [`OUTPUT_CAP_BYTES`].
    fn default() -> Self {
        CappedOutput::new(OUTPUT_CAP_BYTES)
    }
}

impl CappedOutput {
    /// An empty buffer keeping at most `cap` bytes.
    pub fn new(cap: usize) -> Self {
        CappedOutput {
            bytes: Vec::new(),
            cap,
            truncated: false,
        }
    }

    /// Appends what still fits of `chunk`; marks the output truncated if some did not.
    pub fn push(&mut self, chunk: &[u8]) {
        let room = self.room();
        let keep = chunk.len().min(room);
        self.bytes.extend_from_slice(&chunk[..keep]);
        if keep < chunk.len() {
            self.truncated = true;
        }
    }

    /// How many more bytes would be kept.
    pub fn room(&self) -> usize {
        self.cap.saturating_sub(self.bytes.len())
    }

    /// The bytes kept so far.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Whether any byte was dropped.
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// The kept bytes as text (invalid UTF-8 replaced), for the JSON `exec` answer.
    pub fn to_text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }

    /// The kept bytes and the truncation flag.
    pub fn into_parts(self) -> (Vec<u8>, bool) {
        (self.bytes, self.truncated)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_head_and_records_the_cut() {
        let mut c = CappedOutput::new(5);
        c.push(b"abc");
        assert!(!c.truncated());
        c.push(b"");
        c.push(b"de");
        assert_eq!(c.bytes(), b"abcde");
        assert!(!c.truncated(), "exactly full is not truncated");
        c.push(b"");
        assert!(!c.truncated(), "an empty chunk cuts nothing");
        c.push(b"f");
        assert!(c.truncated());
        assert_eq!(c.room(), 0);
        assert_eq!(c.into_parts(), (b"abcde".to_vec(), true));
    }

    #[test]
    fn a_chunk_straddling_the_cap_is_split() {
        let mut c = CappedOutput::new(4);
        c.push(b"ab");
        c.push(b"cdef");
        assert_eq!(c.bytes(), b"abcd");
        assert!(c.truncated());
        assert_eq!(CappedOutput::default().room(), OUTPUT_CAP_BYTES);
    }

    #[test]
    fn text_is_lossy_utf8() {
        let mut c = CappedOutput::new(10);
        c.push(&[b'a', 0xff]);
        assert_eq!(c.to_text(), "a\u{fffd}");
    }
}
