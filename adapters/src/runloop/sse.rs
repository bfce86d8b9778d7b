//! Server-sent events as Runloop's output tails send them (the WHATWG `text/event-stream`
//! framing): `field: value` lines, a blank line ending an event, several `data` lines joined
//! by newlines, comments (`:`) and unknown fields ignored.

use bytes::{Bytes, BytesMut};

/// One event: its `event` field (empty when unnamed) and its `data`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Event {
    pub name: String,
    pub data: String,
}

/// Cuts events out of a byte stream fed piece by piece.
#[derive(Debug, Default)]
pub(crate) struct Decoder {
    buf: BytesMut,
    current: Event,
    has_data: bool,
}

impl Decoder {
    /// Adds `chunk` and answers the events it completed, in order.
    pub(crate) fn feed(&mut self, chunk: &Bytes) -> Vec<Event> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        while let Some(nl) = self.buf.iter().position(|b| *b == b'\n') {
            let line = self.buf.split_to(nl + 1);
            let line = &line[..nl];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if let Some(ev) = self.line(&String::from_utf8_lossy(line)) {
                out.push(ev);
            }
        }
        out
    }

    fn line(&mut self, line: &str) -> Option<Event> {
        if line.is_empty() {
            let ev = std::mem::take(&mut self.current);
            let had = std::mem::take(&mut self.has_data);
            return (had || !ev.name.is_empty()).then_some(ev);
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => self.current.name = value.to_owned(),
            "data" => {
                if self.has_data {
                    self.current.data.push('\n');
                }
                self.current.data.push_str(value);
                self.has_data = true;
            }
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_across_chunks_and_lines_join() {
        let mut d = Decoder::default();
        assert!(d
            .feed(&Bytes::from_static(b": hi\ndata: {\"output\":"))
            .is_empty());
        let evs = d.feed(&Bytes::from_static(
            b"\"a\"}\r\n\r\nevent: error\ndata: x\ndata: y\n\n",
        ));
        assert_eq!(
            evs,
            vec![
                Event {
                    name: String::new(),
                    data: "{\"output\":\"a\"}".into()
                },
                Event {
                    name: "error".into(),
                    data: "x\ny".into()
                },
            ]
        );
    }
}
