//! `multipart/form-data` upload bodies: text and metadata parts, then the file part, whose
//! bytes are streamed through as they come (or put in whole, for an API that wants a
//! length). One writer for the providers whose file API takes a form.

use bytes::Bytes;
use futures::StreamExt;

use crate::{AdapterError, ByteStream};

/// A form being written: the parts before the file.
#[derive(Debug, Clone)]
pub struct Multipart {
    boundary: String,
    head: String,
}

impl Default for Multipart {
    fn default() -> Self {
        Self::new()
    }
}

impl Multipart {
    /// An empty form with a fresh boundary.
    pub fn new() -> Self {
        Multipart {
            boundary: format!("differently-{}", super::paths::unique()),
            head: String::new(),
        }
    }

    /// A text field.
    pub fn field(mut self, name: &str, value: &str) -> Self {
        self.head.push_str(&format!(
            "--{}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n",
            self.boundary
        ));
        self
    }

    /// A part sent as a file of its own type (execd reads its JSON metadata only so).
    pub fn file_part(mut self, name: &str, filename: &str, content_type: &str, text: &str) -> Self {
        self.head.push_str(&format!(
            "--{}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{filename}\"\r\nContent-Type: {content_type}\r\n\r\n{text}\r\n",
            self.boundary
        ));
        self
    }

    /// The `Content-Type` header of the form.
    pub fn content_type(&self) -> String {
        format!("multipart/form-data; boundary={}", self.boundary)
    }

    /// Everything before the file's bytes: the parts so far and the file part's header.
    fn file_head(&self, name: &str, path: &str) -> String {
        format!(
            "{}--{}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{}\"\r\nContent-Type: application/octet-stream\r\n\r\n",
            self.head,
            self.boundary,
            file_name(path)
        )
    }

    fn tail(&self) -> String {
        format!("\r\n--{}--\r\n", self.boundary)
    }

    /// The form ending in file part `name` (its filename the last segment of `path`), whose
    /// bytes are `body`, passed through as they come.
    pub fn streamed(self, name: &str, path: &str, body: ByteStream) -> reqwest::Body {
        let head = Bytes::from(self.file_head(name, path));
        let tail = Bytes::from(self.tail());
        let stream = futures::stream::once(async move { Ok::<_, AdapterError>(head) })
            .chain(body)
            .chain(futures::stream::once(async move { Ok(tail) }));
        reqwest::Body::wrap_stream(stream)
    }

    /// The same form with the file's bytes in it, whole.
    pub fn whole(self, name: &str, path: &str, bytes: &[u8]) -> Vec<u8> {
        let head = self.file_head(name, path);
        let tail = self.tail();
        let mut out = Vec::with_capacity(head.len() + bytes.len() + tail.len());
        out.extend_from_slice(head.as_bytes());
        out.extend_from_slice(bytes);
        out.extend_from_slice(tail.as_bytes());
        out
    }
}

/// The last segment of `path` as a `filename`: quotes, backslashes and line breaks dropped
/// (they would end the header value).
fn file_name(path: &str) -> String {
    path.rsplit('/')
        .next()
        .unwrap_or("file")
        .chars()
        .filter(|ch| !matches!(ch, '"' | '\r' | '\n' | '\\'))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_form_has_its_fields_then_the_file() {
        let form = Multipart::new().field("path", "/w/a.txt");
        let b = form.boundary.clone();
        assert_eq!(
            form.content_type(),
            format!("multipart/form-data; boundary={b}")
        );
        let body = form.whole("file", "/w/a\"b\r\n.txt", b"hi");
        let text = String::from_utf8(body).unwrap();
        assert_eq!(
            text,
            format!(
                "--{b}\r\nContent-Disposition: form-data; name=\"path\"\r\n\r\n/w/a.txt\r\n\
                 --{b}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"ab.txt\"\r\n\
                 Content-Type: application/octet-stream\r\n\r\nhi\r\n--{b}--\r\n"
            )
        );
        let meta =
            Multipart::new().file_part("metadata", "metadata.json", "application/json", "{}");
        assert!(meta.head.contains(
            "filename=\"metadata.json\"\r\nContent-Type: application/json\r\n\r\n{}\r\n"
        ));
    }
}
