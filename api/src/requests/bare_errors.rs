//! The errors hyper answers itself, as the envelope. A request head hyper cannot parse (a
//! target over its 64 KiB limit: 414; a bad method, target, version or header: 400; a head
//! over its buffer: 431) is answered by hyper with a bare status line and no body, before
//! any route or middleware is asked, and the connection is closed. Those answers are the only
//! ones `middleware::guard` never sees, so the connection's writes are watched here: exactly
//! such a bare answer is replaced by the envelope with a stable code.
//!
//! Only a write that is a whole bare head hyper made (`HTTP/1.1 400|414|431 …`, with
//! `content-length: 0` and nothing after the blank line) is replaced; everything the router
//! answers carries a body (every error of ours is the envelope), so it passes untouched.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use differently_core::ErrorCode;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::requests::middleware::MAX_URI_BYTES;

/// The longest request target hyper reads (`hyper::proto::h1::role::MAX_URI_LEN`).
pub const HTTP_LAYER_MAX_URI_BYTES: usize = 65_534;

/// The envelope (whole response) for hyper's bare answer `head`, if it is one.
fn replacement(head: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(head).ok()?;
    let rest = text.strip_prefix("HTTP/1.1 ")?;
    let end = text.find("\r\n\r\n")?;
    if end + 4 != text.len()
        || !text[..end]
            .split("\r\n")
            .any(|l| l.eq_ignore_ascii_case("content-length: 0"))
    {
        return None;
    }
    let (status, code, message, details) = match rest.get(..3)? {
        "414" => (
            "414 URI Too Long",
            ErrorCode::UriTooLong,
            format!(
                "the request target is over {HTTP_LAYER_MAX_URI_BYTES} bytes; at most \
                 {MAX_URI_BYTES} are accepted"
            ),
            Some(json!({ "limitBytes": MAX_URI_BYTES })),
        ),
        "400" => (
            "400 Bad Request",
            ErrorCode::InvalidArgument,
            "the request line or a header is not valid HTTP/1.1".to_owned(),
            None,
        ),
        "431" => (
            "431 Request Header Fields Too Large",
            ErrorCode::InvalidArgument,
            "the request headers are too large".to_owned(),
            None,
        ),
        _ => return None,
    };
    let mut error = json!({ "code": code, "message": message });
    if let Some(d) = details {
        error["details"] = d;
    }
    let body = json!({ "error": error }).to_string();
    Some(
        format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
             connection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )
}

/// A connection whose bare hyper error answers are rewritten (see the module docs).
pub struct EnvelopeBareErrors<T> {
    inner: T,
    /// A replacement being written: its bytes, how many are out, and the length of the
    /// write it stands for (reported once all of it is out).
    pending: Option<(Vec<u8>, usize, usize)>,
}

impl<T> EnvelopeBareErrors<T> {
    /// Wraps `inner`.
    pub fn new(inner: T) -> Self {
        EnvelopeBareErrors {
            inner,
            pending: None,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for EnvelopeBareErrors<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for EnvelopeBareErrors<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.pending.is_none() {
            match replacement(buf) {
                Some(bytes) => this.pending = Some((bytes, 0, buf.len())),
                None => return Pin::new(&mut this.inner).poll_write(cx, buf),
            }
        }
        let Some((bytes, off, stands_for)) = this.pending.as_mut() else {
            return Poll::Ready(Ok(0));
        };
        while *off < bytes.len() {
            match Pin::new(&mut this.inner).poll_write(cx, &bytes[*off..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(k)) => *off += k,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        let n = *stands_for;
        this.pending = None;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    // Not vectored: hyper then flattens each head into one buffer, one `poll_write`, so a
    // bare head is always seen whole.
    fn is_write_vectored(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_bare_head_is_replaced() {
        let bare = b"HTTP/1.1 414 URI Too Long\r\nconnection: close\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        let r = String::from_utf8(replacement(bare).unwrap_or_default()).unwrap_or_default();
        assert!(r.starts_with("HTTP/1.1 414 URI Too Long\r\n"), "{r}");
        assert!(r.contains(r#""code":"uri_too_long""#), "{r}");
        // A head with a body after it, another status, or a body length: untouched.
        assert!(replacement(b"HTTP/1.1 414 URI Too Long\r\ncontent-length: 0\r\n\r\nx").is_none());
        assert!(replacement(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n").is_none());
        assert!(replacement(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 12\r\n\r\n").is_none());
    }
}
