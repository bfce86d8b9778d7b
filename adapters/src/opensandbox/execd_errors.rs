//! execd's error answers as what they mean to the caller: a path it refuses, a missing file,
//! a missing working directory, a refused token, an unreachable execd.

use super::client::Client;
use super::execd::TOKEN_REFUSED;
use crate::error::PathProblem;
use crate::AdapterError;

/// Maps an execd error answer.
pub(crate) async fn execd_error(c: &Client, op: &str, resp: reqwest::Response) -> AdapterError {
    execd_error_at(c, op, None, resp).await
}

/// Maps an execd error answer to a call about `path`: execd's `404 FILE_NOT_FOUND` (download,
/// list and info, on the real server) is `PathNotFound(path)`, which the API serves as 404
/// `path_not_found`; it is never `NotFound`, which means the sandbox itself is gone.
pub(crate) async fn execd_error_at(
    c: &Client,
    op: &str,
    path: Option<&str>,
    resp: reqwest::Response,
) -> AdapterError {
    let status = resp.status();
    let body = resp.bytes().await.unwrap_or_default();
    let err = super::client::parse_error(status, &body);
    if let (Some(p), 400 | 500) = (path, status.as_u16()) {
        if let Some(e) = path_refusal(p, &err.message) {
            return e;
        }
    }
    match (status.as_u16(), super::client::code_suffix(&err.code)) {
        (404, "FILE_NOT_FOUND") => match path {
            Some(p) => AdapterError::PathNotFound(p.to_owned()),
            None => AdapterError::permanent(format!("{op}: no such file")),
        },
        // Recorded (1.1.1): `400 INVALID_REQUEST_BODY "… working directory does not exist: …"`.
        (400, "INVALID_REQUEST_BODY")
            if err.message.contains("working directory does not exist") =>
        {
            AdapterError::invalid_field(
                "cwd",
                format!("{op}: the cwd does not exist in the sandbox"),
            )
        }
        (401, _) => AdapterError::permanent(format!("{op}: {TOKEN_REFUSED}")),
        (502, _) => AdapterError::transient(format!(
            "{op}: the server proxy cannot reach execd (paused or stopped sandbox?)"
        )),
        _ => c.map(op, status, &body),
    }
}

/// The caller's error an execd file error about `path` is, if its message says so: a path
/// refused as it stands ([`path_problem`]), or a name longer than the filesystem takes (Go's
/// wording of ENAMETOOLONG), which is invalid input naming the path, not a backend failure
/// to retry.
fn path_refusal(path: &str, message: &str) -> Option<AdapterError> {
    if let Some(problem) = path_problem(message) {
        return Some(AdapterError::bad_path(path, problem));
    }
    if message.to_ascii_lowercase().contains("file name too long") {
        return Some(AdapterError::invalid_field(
            "path",
            format!("{path}: file name too long"),
        ));
    }
    None
}

/// What an execd file error says about the path, read from the message: execd passes the
/// OS error's text on (`open /work/d: is a directory`, Go's wording of `EISDIR`, under a
/// `400`/`500`), and a path that cannot be used is the caller's to change, not a backend
/// failure to retry.
fn path_problem(message: &str) -> Option<PathProblem> {
    let m = message.to_ascii_lowercase();
    if m.contains("is a directory") {
        Some(PathProblem::IsADirectory)
    } else if m.contains("not a directory") {
        Some(PathProblem::NotADirectory)
    } else if m.contains("read-only file system") {
        Some(PathProblem::ReadOnly)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_too_long_is_invalid_and_names_the_path() {
        let long = format!("/tmp/{}", "n".repeat(300));
        // execd passes Go's error text on.
        let said = format!("error opening file: open {long}: file name too long");
        let e = path_refusal(&long, &said);
        assert!(
            matches!(&e, Some(AdapterError::Permanent(r)) if r.field() == Some("path")
                && r.message() == format!("{long}: file name too long")),
            "{e:?}"
        );
        assert!(matches!(
            path_refusal("/d", "open /d: is a directory"),
            Some(AdapterError::BadPath(_))
        ));
        assert!(path_refusal("/d", "disk I/O error").is_none());
    }
}
