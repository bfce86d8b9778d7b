//! The `/adapter/v1` plugin protocol on the wire: what the `remote` adapter sends and what a
//! plugin answers. Shared by the client (`remote`), the server (`plugin_server`) and the
//! conformance kit, so the three cannot drift apart; `docs/plugin-protocol.yaml` describes
//! the same routes and bodies for plugin authors in other languages.

use base64::Engine;
use serde::{Deserialize, Serialize};

use crate::error::{PathProblem, Reason};
use crate::AdapterError;

/// Path prefix of every route. The major version is in the path: a breaking change is a new
/// prefix (`/adapter/v2`) that a plugin may serve next to this one.
pub const BASE_PATH: &str = "/adapter/v1";

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u32 = 1;

/// Value of [`Info::protocol`].
pub const PROTOCOL_NAME: &str = "differently-adapter";

/// Header the client sends on every request with the version it speaks; a plugin that does
/// not speak it answers `unsupported_version`.
pub const VERSION_HEADER: &str = "Differently-Adapter-Protocol";

/// Header of a download answer: the whole file's size when the plugin knows it (the body may
/// be a range of it).
pub const TOTAL_SIZE_HEADER: &str = "Differently-Total-Size";

/// Content type of a streamed exec answer: one JSON [`ExecFrame`] per line.
pub const NDJSON: &str = "application/x-ndjson";

/// Capabilities the protocol can carry. `exec.pty` needs a bidirectional channel v1 does not
/// define, so a plugin never declares it and the `remote` adapter never advertises it.
/// `warm` (optional, added within v1): instances made ahead of time with no env, claimed
/// through `POST …/claim`; older plugins never declare it and keep working.
pub const PROTOCOL_CAPABILITIES: [&str; 10] = [
    "exec",
    "files",
    "exec.stream",
    "lifecycle.pause",
    "lifecycle.stop",
    "snapshots",
    "ports.expose",
    "network.egress-control",
    "gpu",
    "warm",
];

/// `GET /adapter/v1/info`: who the plugin is and what it can do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Info {
    /// Always [`PROTOCOL_NAME`].
    pub protocol: String,
    /// Every protocol version the plugin speaks; the client uses the highest it shares.
    pub versions: Vec<u32>,
    /// The plugin's name, for reports and logs.
    pub name: String,
    /// What the plugin implements (names from [`PROTOCOL_CAPABILITIES`]); anything else must
    /// answer `unsupported_operation`.
    pub capabilities: Vec<String>,
    /// How long a snapshot may take to become ready; absent: the contract's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_timeout_seconds: Option<u64>,
}

/// Error codes, one per `AdapterError` kind, plus the protocol's own two.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// Worth retrying (timeouts, overload).
    Transient,
    /// Will fail again the same way (bad template, bad field).
    Permanent,
    /// The instance does not exist.
    NotFound,
    /// A path inside the sandbox does not exist.
    PathNotFound,
    /// The plugin does not implement the operation.
    UnsupportedOperation,
    /// The backend behind the plugin cannot be reached.
    Unavailable,
    /// The backend is full (a plan limit, a 429): placement tries the next ranked pool.
    InsufficientCapacity,
    /// The bearer token is missing or wrong.
    Unauthenticated,
    /// The client speaks a version the plugin does not.
    UnsupportedVersion,
}

impl ErrorCode {
    /// The HTTP status a plugin answers this code with. Clients decide by the code, not the
    /// status; the status is for proxies and people reading logs.
    pub fn status(self) -> u16 {
        match self {
            ErrorCode::Transient | ErrorCode::Unavailable | ErrorCode::InsufficientCapacity => 503,
            ErrorCode::Permanent => 422,
            ErrorCode::NotFound | ErrorCode::PathNotFound => 404,
            ErrorCode::UnsupportedOperation => 501,
            ErrorCode::Unauthenticated => 401,
            ErrorCode::UnsupportedVersion => 400,
        }
    }

    /// Whether the same call may succeed later.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::Transient | ErrorCode::Unavailable | ErrorCode::InsufficientCapacity
        )
    }
}

/// Every error answer: `{code, message, retryable, field?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorBody {
    pub code: ErrorCode,
    pub message: String,
    pub retryable: bool,
    /// The request field the error is about (`cwd`), if one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// With `field: "path"`, why the sandbox's filesystem refuses the path as it stands
    /// (`is_a_directory`, `not_a_directory`, `read_only_path`, `exists_not_directory`): the
    /// caller's mistake, answered 409. A body without it stays a plain permanent error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl ErrorBody {
    /// A body for `code` with `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ErrorBody {
            code,
            message: message.into(),
            retryable: code.retryable(),
            field: None,
            reason: None,
        }
    }

    /// The wire form of an adapter error (1:1 on its kind).
    pub fn from_error(e: &AdapterError) -> Self {
        let (code, message, field) = match e {
            AdapterError::Transient(r) => (ErrorCode::Transient, r.message().to_owned(), r.field()),
            AdapterError::Permanent(r) => (ErrorCode::Permanent, r.message().to_owned(), r.field()),
            AdapterError::NotFound => (ErrorCode::NotFound, e.to_string(), None),
            AdapterError::PathNotFound(p) => (ErrorCode::PathNotFound, p.clone(), None),
            AdapterError::Unsupported(op) => (ErrorCode::UnsupportedOperation, op.clone(), None),
            AdapterError::Unavailable(r) => {
                (ErrorCode::Unavailable, r.message().to_owned(), r.field())
            }
            AdapterError::Capacity(r) => (
                ErrorCode::InsufficientCapacity,
                r.message().to_owned(),
                r.field(),
            ),
            // The protocol has no code of its own for it: a permanent error about `path`,
            // with the problem in `reason`.
            AdapterError::BadPath(_) => (ErrorCode::Permanent, e.to_string(), Some("path")),
        };
        let reason = match e {
            AdapterError::BadPath(p) => Some(p.problem.code().to_owned()),
            _ => None,
        };
        ErrorBody {
            code,
            message,
            retryable: code.retryable(),
            field: field.map(str::to_owned),
            reason,
        }
    }

    /// The adapter error this body stands for. `op` prefixes messages (which call failed);
    /// the plugin's own `retryable` never turns a permanent kind into a retried one: the
    /// code decides.
    pub fn into_error(self, op: &str) -> AdapterError {
        let problem = self.reason.as_deref().and_then(PathProblem::from_code);
        if let (ErrorCode::Permanent, Some("path"), Some(problem)) =
            (self.code, self.field.as_deref(), problem)
        {
            // The message is `<path>: <problem>`, as `PathError` shows itself.
            let path = self
                .message
                .strip_suffix(&format!(": {problem}"))
                .unwrap_or(&self.message);
            return AdapterError::bad_path(path, problem);
        }
        let text = format!("{op}: {}", self.message);
        let reason = || {
            let r = Reason::from(text.clone());
            match self.field.as_deref().and_then(known_field) {
                Some(f) => r.on_field(f),
                None => r,
            }
        };
        match self.code {
            ErrorCode::Transient => AdapterError::Transient(reason()),
            ErrorCode::Permanent => AdapterError::Permanent(reason()),
            ErrorCode::NotFound => AdapterError::NotFound,
            // The message is the path (or says which); kept as the plugin gave it.
            ErrorCode::PathNotFound => AdapterError::PathNotFound(self.message),
            ErrorCode::UnsupportedOperation => AdapterError::Unsupported(self.message),
            ErrorCode::Unavailable => AdapterError::Unavailable(reason()),
            ErrorCode::InsufficientCapacity => AdapterError::Capacity(reason()),
            ErrorCode::Unauthenticated => AdapterError::permanent(format!(
                "{op}: the plugin refused the token ({})",
                self.message
            )),
            ErrorCode::UnsupportedVersion => AdapterError::permanent(format!(
                "{op}: the plugin does not speak protocol version {PROTOCOL_VERSION}: {}",
                self.message
            )),
        }
    }
}

/// Field names a plugin may report, as the `'static` names `Reason::on_field` keeps; any
/// other name stays in the message only.
fn known_field(name: &str) -> Option<&'static str> {
    const FIELDS: [&str; 12] = [
        "cwd",
        "command",
        "env",
        "stdin",
        "stdinBase64",
        "timeoutSeconds",
        "path",
        "mode",
        "template",
        "resources",
        "fromSnapshot",
        "port",
    ];
    FIELDS.iter().copied().find(|f| *f == name)
}

/// One line of a streamed exec answer. Output is base64 so any byte gets through; the last
/// line is `exit` or `error`, and a stream that ends without one was cut.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum ExecFrame {
    Stdout {
        data: String,
    },
    Stderr {
        data: String,
    },
    #[serde(rename_all = "camelCase")]
    Exit {
        exit_code: i32,
        duration_ms: u64,
    },
    Error {
        error: ErrorBody,
    },
}

impl ExecFrame {
    /// A `stdout` or `stderr` frame of `bytes`.
    pub fn output(stderr: bool, bytes: &[u8]) -> Self {
        let data = base64::engine::general_purpose::STANDARD.encode(bytes);
        if stderr {
            ExecFrame::Stderr { data }
        } else {
            ExecFrame::Stdout { data }
        }
    }

    /// The frame as one NDJSON line (with its `\n`).
    pub fn line(&self) -> Vec<u8> {
        // A frame is strings and integers: serializing cannot fail.
        let mut v = serde_json::to_vec(self).unwrap_or_default();
        v.push(b'\n');
        v
    }
}

/// Decodes a frame's base64 output.
pub fn decode_output(data: &str) -> Result<Vec<u8>, base64::DecodeError> {
    base64::engine::general_purpose::STANDARD.decode(data)
}

/// `GET /adapter/v1/instances`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceList {
    pub instances: Vec<crate::Instance>,
}

/// `GET /adapter/v1/instances/{sandboxId}/files/list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileList {
    pub entries: Vec<crate::FileEntry>,
}

/// Answer of `POST /adapter/v1/instances/{sandboxId}/files/directories?backendRef=&path=&mode=`:
/// whether the directory was made (`false`: one was already there).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MadeDir {
    pub created: bool,
}

/// Body of `POST /adapter/v1/instances/{sandboxId}/ports/{port}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExposeBody {
    /// How long the URL should work; absent: the plugin's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_seconds: Option<u64>,
}

/// Body of `POST /adapter/v1/instances/{sandboxId}/renew` and of `…/claim`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RenewBody {
    pub ttl_seconds: u64,
}

/// Query of every call on one instance: which backend instance it means.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct At {
    pub backend_ref: String,
}

/// Query of the file routes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileQuery {
    pub backend_ref: String,
    pub path: String,
    /// Upload and make directory: permission bits (decimal, e.g. 420 for 0o644).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    /// List: how many levels (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<u32>,
}

/// Query of `GET /adapter/v1/instances`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListQuery {
    pub installation_id: String,
}

/// Percent-encodes one path segment (ids and refs are plain, but a plugin's refs may not be).
pub use crate::kit::paths::segment;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_kind_survives_the_wire() {
        let kinds = [
            AdapterError::transient("slow"),
            AdapterError::permanent("bad"),
            AdapterError::invalid_field("cwd", "no such directory"),
            AdapterError::NotFound,
            AdapterError::PathNotFound("/nope".into()),
            AdapterError::Unsupported("snapshots".into()),
            AdapterError::unavailable("down"),
        ];
        for e in kinds {
            let body = ErrorBody::from_error(&e);
            assert_eq!(body.retryable, e.is_retryable());
            let json = serde_json::to_string(&body).unwrap();
            let back: ErrorBody = serde_json::from_str(&json).unwrap();
            let again = back.into_error("op");
            assert_eq!(
                std::mem::discriminant(&again),
                std::mem::discriminant(&e),
                "{e:?} -> {json} -> {again:?}"
            );
            if let (AdapterError::Permanent(a), AdapterError::Permanent(b)) = (&e, &again) {
                assert_eq!(a.field(), b.field());
            }
        }
        let body = ErrorBody::from_error(&AdapterError::Unsupported("files".into()));
        assert_eq!(
            serde_json::to_value(&body).unwrap(),
            serde_json::json!({"code": "unsupported_operation", "message": "files", "retryable": false})
        );
    }

    #[test]
    fn a_path_problem_survives_the_wire_and_an_older_body_stays_permanent() {
        for problem in PathProblem::ALL {
            let e = AdapterError::bad_path("/work/d", problem);
            let json = serde_json::to_value(ErrorBody::from_error(&e)).unwrap();
            assert_eq!(json["reason"], problem.code());
            let back: ErrorBody = serde_json::from_value(json).unwrap();
            assert_eq!(back.into_error("op"), e);
        }
        // A plugin that does not send `reason` (older, or another language's) is understood
        // as before: permanent, about `path`.
        let old: ErrorBody = serde_json::from_value(serde_json::json!({
            "code": "permanent", "message": "/d: is a directory", "retryable": false,
            "field": "path"
        }))
        .unwrap();
        assert!(
            matches!(old.into_error("op"), AdapterError::Permanent(r) if r.field() == Some("path"))
        );
    }

    #[test]
    fn frames_are_tagged_lines_and_binary_safe() {
        let f = ExecFrame::output(true, &[0, 255, b'\n']);
        let line = f.line();
        assert_eq!(line.last(), Some(&b'\n'));
        let back: ExecFrame = serde_json::from_slice(&line).unwrap();
        let ExecFrame::Stderr { data } = back else {
            panic!("{back:?}")
        };
        assert_eq!(decode_output(&data).unwrap(), vec![0, 255, b'\n']);
        let exit: ExecFrame =
            serde_json::from_str(r#"{"type":"exit","exitCode":124,"durationMs":3}"#).unwrap();
        assert_eq!(
            exit,
            ExecFrame::Exit {
                exit_code: 124,
                duration_ms: 3
            }
        );
    }

    #[test]
    fn segments_are_encoded() {
        assert_eq!(segment("sbx_01AB"), "sbx_01AB");
        assert_eq!(segment("a/b c"), "a%2Fb%20c");
    }
}
