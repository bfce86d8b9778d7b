//! A minimal server-sent-events reader for `POST …/exec/stream`: the harness counts payload
//! bytes of large streams, so it parses bytes as they arrive (no per-event string copies of
//! the whole buffer) and keeps only the unfinished tail.

/// One complete event: its `event:` name and its `data:` lines joined by `\n`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field (empty when absent).
    pub event: String,
    /// The `data:` field(s).
    pub data: Vec<u8>,
}

/// Incremental parser: feed response chunks, get the events they complete.
#[derive(Debug, Default)]
pub struct SseReader {
    buf: Vec<u8>,
    /// Bytes of `buf` already searched for a blank line (minus one, for a split `\n\n`).
    scanned: usize,
    /// `:` comment lines seen (the server's keep-alive pings).
    pub comments: usize,
}

impl SseReader {
    /// Appends `bytes` and returns the events completed by them, in order.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        let mut start = 0;
        let mut from = self.scanned;
        while let Some(end) = blank_line(&self.buf, from) {
            if let Some(ev) = self.parse_block(start, end) {
                out.push(ev);
            }
            start = end + 2;
            from = start;
        }
        self.buf.drain(..start);
        self.scanned = self.buf.len().saturating_sub(1);
        out
    }

    fn parse_block(&mut self, start: usize, end: usize) -> Option<SseEvent> {
        let mut ev = SseEvent::default();
        let (mut any, mut has_data) = (false, false);
        for line in self.buf[start..end].split(|b| *b == b'\n') {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.starts_with(b":") {
                self.comments += 1;
            } else if let Some(v) = line.strip_prefix(b"event:") {
                ev.event = String::from_utf8_lossy(v.strip_prefix(b" ").unwrap_or(v)).into_owned();
                any = true;
            } else if let Some(v) = line.strip_prefix(b"data:") {
                if has_data {
                    ev.data.push(b'\n');
                }
                ev.data.extend_from_slice(v.strip_prefix(b" ").unwrap_or(v));
                (any, has_data) = (true, true);
            }
        }
        any.then_some(ev)
    }
}

/// Index of the first `\n\n` at or after `from`. Jumps from newline to newline: event data
/// is JSON, whose strings escape newlines, so raw newlines are only line ends and the scan
/// costs little next to the bytes it skips.
fn blank_line(buf: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    while let Some(i) = buf.get(at..)?.iter().position(|b| *b == b'\n') {
        let nl = at + i;
        if buf.get(nl + 1) == Some(&b'\n') {
            return Some(nl);
        }
        at = nl + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_anywhere_are_reassembled() {
        let wire = b": ping\n\nevent: stdout\ndata: {\"data\":\"eQ==\"}\n\nevent: exit\ndata: {\"exitCode\":0}\n\n";
        for cut in 0..wire.len() {
            let mut r = SseReader::default();
            let mut evs = r.push(&wire[..cut]);
            evs.extend(r.push(&wire[cut..]));
            assert_eq!(evs.len(), 2, "cut at {cut}");
            assert_eq!(evs[0].event, "stdout");
            assert_eq!(evs[0].data, b"{\"data\":\"eQ==\"}");
            assert_eq!(evs[1].event, "exit");
            assert_eq!(r.comments, 1);
        }
    }

    #[test]
    fn multi_line_data_is_joined() {
        let mut r = SseReader::default();
        let evs = r.push(b"data: a\ndata: b\n\n");
        assert_eq!(
            evs,
            vec![SseEvent {
                event: String::new(),
                data: b"a\nb".to_vec()
            }]
        );
    }
}
