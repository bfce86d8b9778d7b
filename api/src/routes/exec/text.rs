//! Output as text: UTF-8 decoded across chunk boundaries, or base64.

use base64::Engine;
use differently_core::exec::OutputEncoding;

/// Decodes UTF-8 across chunk boundaries: a character split between two chunks is held back
/// until its end arrives, so streamed text is never mangled at a boundary.
#[derive(Debug, Default)]
pub(super) struct Utf8Carry {
    pending: Vec<u8>,
}

impl Utf8Carry {
    pub(super) fn push(&mut self, chunk: &[u8]) -> String {
        self.pending.extend_from_slice(chunk);
        let valid_up_to = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.pending.len(),
        };
        let rest = self.pending.split_off(valid_up_to);
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending = rest;
        out
    }

    /// Bytes held back, waiting for the rest of their character.
    pub(super) fn held(&self) -> usize {
        self.pending.len()
    }

    pub(super) fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

pub(super) fn encode(enc: OutputEncoding, bytes: &[u8]) -> String {
    match enc {
        OutputEncoding::Base64 => base64::engine::general_purpose::STANDARD.encode(bytes),
        OutputEncoding::Utf8 => String::from_utf8_lossy(bytes).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_split_across_chunks_is_held_back() {
        let mut c = Utf8Carry::default();
        let snow = "☃".as_bytes(); // 3 bytes
        assert_eq!(c.push(&[b'a', snow[0]]), "a");
        assert_eq!(c.push(&snow[1..2]), "");
        assert_eq!(c.push(&[snow[2], b'b']), "☃b");
        // Invalid bytes are replaced, not held forever.
        assert_eq!(c.push(&[0xff, b'c']), "\u{fffd}c");
        assert_eq!(c.push(&[0xe2]), "");
        assert_eq!(c.finish(), "\u{fffd}");
    }
}
