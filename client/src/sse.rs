//! An incremental server-sent-events parser: feed body chunks, get complete events.

/// One event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SseEvent {
    /// `event:` (empty when absent).
    pub event: String,
    /// `id:`, when given.
    pub id: Option<String>,
    /// `data:` lines joined by `\n`.
    pub data: Vec<u8>,
}

/// Keeps the unfinished tail between chunks.
#[derive(Debug, Default)]
pub(crate) struct SseParser {
    buf: Vec<u8>,
}

impl SseParser {
    /// Appends `bytes`; the events they complete, in order.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        let mut start = 0;
        while let Some(end) = find_blank_line(&self.buf[start..]) {
            let block = &self.buf[start..start + end.0];
            if let Some(ev) = parse_block(block) {
                out.push(ev);
            }
            start += end.0 + end.1;
        }
        self.buf.drain(..start);
        out
    }
}

/// The offset of the first blank line in `b` and the length of the separator.
fn find_blank_line(b: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\n' {
            if b.get(i + 1) == Some(&b'\n') {
                return Some((i, 2));
            }
            if b.get(i + 1) == Some(&b'\r') && b.get(i + 2) == Some(&b'\n') {
                return Some((i, 3));
            }
        }
        i += 1;
    }
    None
}

fn parse_block(block: &[u8]) -> Option<SseEvent> {
    let mut ev = SseEvent::default();
    let (mut any, mut has_data) = (false, false);
    for line in block.split(|b| *b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() || line.starts_with(b":") {
            continue;
        }
        let (name, value) = match line.iter().position(|b| *b == b':') {
            Some(at) => {
                let v = &line[at + 1..];
                (&line[..at], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match name {
            b"event" => {
                ev.event = String::from_utf8_lossy(value).into_owned();
                any = true;
            }
            b"id" => {
                ev.id = Some(String::from_utf8_lossy(value).into_owned());
                any = true;
            }
            b"data" => {
                if has_data {
                    ev.data.push(b'\n');
                }
                ev.data.extend_from_slice(value);
                (any, has_data) = (true, true);
            }
            _ => {}
        }
    }
    any.then_some(ev)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_anywhere_come_out_whole_with_their_ids() {
        let text = b": ping\n\nid: 7\nevent: status\ndata: {\"a\":1}\n\nevent: exit\ndata: x\ndata: y\r\n\r\n";
        for cut in 0..text.len() {
            let mut p = SseParser::default();
            let mut got = p.push(&text[..cut]);
            got.extend(p.push(&text[cut..]));
            assert_eq!(got.len(), 2, "cut at {cut}: {got:?}");
            assert_eq!(got[0].id.as_deref(), Some("7"));
            assert_eq!(
                (got[0].event.as_str(), &got[0].data[..]),
                ("status", &b"{\"a\":1}"[..])
            );
            assert_eq!(
                (got[1].event.as_str(), &got[1].data[..]),
                ("exit", &b"x\ny"[..])
            );
        }
    }
}
