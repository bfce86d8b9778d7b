//! Processes that outlive a connection (`/v1/sandboxes/{id}/processes`): started in the
//! background, identified by a pid of the control plane's, fed stdin at any time, attached to
//! and detached from, signalled, and asked for their exit code after they end. Exec answers
//! "run this and tell me how it went"; a process answers "run this and let me come back to it",
//! which is what E2B's `commands` and OpenSandbox's background commands need.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::exec::{validate_command, validate_timeout};
use crate::FieldError;

/// Longest tag accepted: a label for finding a process again, not a document.
pub const MAX_TAG_LEN: usize = 256;
/// Largest terminal side accepted (columns or rows), as for `/pty`.
pub const MAX_PTY_SIDE: u16 = 1000;

/// Body of `POST /v1/sandboxes/{id}/processes`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StartProcess {
    /// Program and arguments.
    pub command: Vec<String>,
    /// Added to the sandbox's environment (these win). Never echoed back.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Absolute working directory; the sandbox's default when absent.
    pub cwd: Option<String>,
    /// Killed (exit 124) after this many seconds; absent: runs until it exits or is killed.
    pub timeout_seconds: Option<u64>,
    /// Runs on a terminal of this size (the pool must offer `exec.pty`) instead of pipes;
    /// output is then one stream, as a terminal writes it.
    pub pty: Option<TerminalSize>,
    /// Keeps stdin open for `…/stdin` (the pool must offer `exec.stdin`, or `pty` be set).
    /// Without it the program reads an empty stdin.
    #[serde(default)]
    pub stdin: bool,
    /// A label of the caller's, shown in listings (E2B's `tag`).
    pub tag: Option<String>,
}

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TerminalSize {
    pub cols: u16,
    pub rows: u16,
}

impl TerminalSize {
    /// Checks both sides are 1–[`MAX_PTY_SIDE`]; the error names `field`.
    pub fn validate(&self, field: &str) -> Result<(), FieldError> {
        for (side, v) in [("cols", self.cols), ("rows", self.rows)] {
            if v == 0 || v > MAX_PTY_SIDE {
                return Err(FieldError::new(
                    format!("{field}.{side}"),
                    format!("must be between 1 and {MAX_PTY_SIDE}"),
                ));
            }
        }
        Ok(())
    }
}

impl StartProcess {
    /// Checks the request; the error names the field.
    pub fn validate(&self) -> Result<(), FieldError> {
        validate_command(&self.command, &self.env, self.cwd.as_deref())?;
        validate_timeout(self.timeout_seconds)?;
        if let Some(size) = &self.pty {
            size.validate("pty")?;
        }
        if let Some(tag) = &self.tag {
            if tag.len() > MAX_TAG_LEN || tag.contains('\0') {
                return Err(FieldError::new(
                    "tag",
                    format!("must be at most {MAX_TAG_LEN} bytes, without NUL"),
                ));
            }
        }
        Ok(())
    }

    /// The program name, which is all the audit log records of a process.
    pub fn program(&self) -> &str {
        self.command.first().map(String::as_str).unwrap_or("")
    }
}

/// Where a process is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProcessStatus {
    /// Started and not yet ended.
    Running,
    /// Ended; `exitCode` says how (128+n when signal n killed it, 124 on its timeout).
    Exited,
    /// The backend call failed or the backend lost it; `error` says what is known.
    Failed,
}

/// A process as `/v1` shows it. The command's environment is never shown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Process {
    /// The control plane's id of the process, unique among the live processes of all
    /// sandboxes (not the pid inside the sandbox, which backends do not all expose).
    pub pid: u32,
    pub sandbox_id: String,
    pub command: Vec<String>,
    pub cwd: Option<String>,
    pub tag: Option<String>,
    /// Runs on a terminal.
    pub pty: bool,
    /// Its stdin is open for `…/stdin`.
    pub stdin_open: bool,
    pub status: ProcessStatus,
    pub exit_code: Option<i32>,
    /// Why it failed, when `status` is `failed`.
    pub error: Option<String>,
    pub started_at: DateTime<Utc>,
    pub ended_at: Option<DateTime<Utc>>,
    /// Output bytes written so far (stdout and stderr together): the `from` just past the
    /// end of its output.
    pub output_bytes: u64,
    /// Output bytes no longer kept (the oldest are dropped beyond a cap): an attach from an
    /// earlier offset starts here.
    pub output_dropped: u64,
}

impl Process {
    /// A process just started from `req`: running, no output yet, its stdin open when it asked
    /// for stdin or a terminal.
    pub fn running(pid: u32, sandbox_id: &str, req: &StartProcess, at: DateTime<Utc>) -> Process {
        Process {
            pid,
            sandbox_id: sandbox_id.to_owned(),
            command: req.command.clone(),
            cwd: req.cwd.clone(),
            tag: req.tag.clone(),
            pty: req.pty.is_some(),
            stdin_open: req.stdin || req.pty.is_some(),
            status: ProcessStatus::Running,
            exit_code: None,
            error: None,
            started_at: at,
            ended_at: None,
            output_bytes: 0,
            output_dropped: 0,
        }
    }
}

/// Body of `POST …/processes/{pid}/signal`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalProcess {
    pub signal: ProcessSignal,
}

/// A signal a client may send to a process (to its process group, or to the terminal's
/// foreground group for a terminal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum ProcessSignal {
    Int,
    Term,
    Kill,
    Hup,
}

impl ProcessSignal {
    /// Parses `INT`, `TERM`, `KILL`, `HUP`, with or without `SIG`.
    pub fn parse(name: &str) -> Option<ProcessSignal> {
        match name.strip_prefix("SIG").unwrap_or(name) {
            "INT" => Some(ProcessSignal::Int),
            "TERM" => Some(ProcessSignal::Term),
            "KILL" => Some(ProcessSignal::Kill),
            "HUP" => Some(ProcessSignal::Hup),
            _ => None,
        }
    }

    /// The POSIX name without `SIG`.
    pub fn name(self) -> &'static str {
        match self {
            ProcessSignal::Int => "INT",
            ProcessSignal::Term => "TERM",
            ProcessSignal::Kill => "KILL",
            ProcessSignal::Hup => "HUP",
        }
    }

    /// The Linux signal number: a process it kills exits 128+n.
    pub fn number(self) -> i32 {
        match self {
            ProcessSignal::Int => 2,
            ProcessSignal::Term => 15,
            ProcessSignal::Kill => 9,
            ProcessSignal::Hup => 1,
        }
    }
}

/// Body of `POST …/processes/{pid}/resize` (terminal processes only).
pub type ResizeProcess = TerminalSize;

#[cfg(test)]
mod tests {
    use super::*;

    fn start(command: &[&str]) -> StartProcess {
        StartProcess {
            command: command.iter().map(|s| s.to_string()).collect(),
            ..StartProcess::default()
        }
    }

    #[test]
    fn bad_fields_are_named() {
        let cases: Vec<(StartProcess, &str)> = vec![
            (start(&[]), "command"),
            (start(&[""]), "command[0]"),
            (start(&["a\0"]), "command"),
            (
                StartProcess {
                    cwd: Some("rel".into()),
                    ..start(&["ls"])
                },
                "cwd",
            ),
            (
                StartProcess {
                    timeout_seconds: Some(0),
                    ..start(&["ls"])
                },
                "timeoutSeconds",
            ),
            (
                StartProcess {
                    pty: Some(TerminalSize { cols: 0, rows: 24 }),
                    ..start(&["sh"])
                },
                "pty.cols",
            ),
            (
                StartProcess {
                    pty: Some(TerminalSize {
                        cols: 80,
                        rows: 1001,
                    }),
                    ..start(&["sh"])
                },
                "pty.rows",
            ),
            (
                StartProcess {
                    tag: Some("x".repeat(MAX_TAG_LEN + 1)),
                    ..start(&["ls"])
                },
                "tag",
            ),
        ];
        for (req, field) in cases {
            let err = req.validate().expect_err(field);
            assert_eq!(err.field, field, "{req:?}");
        }
        start(&["sleep", "1"])
            .validate()
            .expect("a plain command is fine");
    }

    #[test]
    fn the_wire_shape_is_camel_case_and_strict() {
        let req: StartProcess = serde_json::from_value(serde_json::json!({
            "command": ["cat"], "stdin": true, "pty": {"cols": 80, "rows": 24},
            "timeoutSeconds": 5, "tag": "t"
        }))
        .expect("decodes");
        assert!(req.stdin);
        assert_eq!(req.pty, Some(TerminalSize { cols: 80, rows: 24 }));
        let unknown = serde_json::from_value::<StartProcess>(
            serde_json::json!({"command": ["cat"], "stdn": true}),
        );
        assert!(unknown.is_err(), "a misspelt field is refused");
        for (name, sig) in [
            ("SIGKILL", ProcessSignal::Kill),
            ("TERM", ProcessSignal::Term),
        ] {
            assert_eq!(ProcessSignal::parse(name), Some(sig));
        }
        assert_eq!(ProcessSignal::parse("USR1"), None);
    }
}
