//! The programs the fake "runs": what an exec request's program writes and exits with,
//! decided without running anything, and how that output is streamed.

use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use differently_core::exec::ExecRequest;
use tokio::sync::mpsc;

use crate::error::Reason;
use crate::{AdapterError, ExecEvent};

/// One piece of what a fake program writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Output {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    /// `n` bytes of `y\n`, on stderr if `stderr`.
    Generate {
        n: u64,
        stderr: bool,
    },
}

/// What the fake "runs" for an exec; see the module docs.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Plan {
    pub(super) output: Vec<Output>,
    pub(super) exit_code: i32,
    pub(super) sleep: Option<Duration>,
}

pub(super) fn plan(req: &ExecRequest, stdin: Vec<u8>) -> Plan {
    let program = req.program();
    let args = req.command.get(1..).unwrap_or(&[]);
    let done = |output: Vec<Output>, exit_code: i32| Plan {
        output,
        exit_code,
        sleep: None,
    };
    match program {
        "echo" => done(
            vec![Output::Stdout(format!("{}\n", args.join(" ")).into_bytes())],
            0,
        ),
        "true" => done(vec![], 0),
        "false" => done(vec![], 1),
        "cat" => done(vec![Output::Stdout(stdin)], 0),
        "pwd" => done(
            vec![Output::Stdout(
                format!("{}\n", req.cwd.as_deref().unwrap_or("/")).into_bytes(),
            )],
            0,
        ),
        "env" => done(
            vec![Output::Stdout(
                req.env
                    .iter()
                    .map(|(k, v)| format!("{k}={v}\n"))
                    .collect::<String>()
                    .into_bytes(),
            )],
            0,
        ),
        "fake-exit" => done(
            vec![],
            args.first().and_then(|a| a.parse().ok()).unwrap_or(1),
        ),
        "fake-stderr" => done(
            vec![Output::Stderr(format!("{}\n", args.join(" ")).into_bytes())],
            0,
        ),
        "sleep" => match args.first().and_then(|a| a.parse::<f64>().ok()) {
            Some(secs) if secs.is_finite() && secs >= 0.0 => Plan {
                output: vec![],
                exit_code: 0,
                sleep: Some(Duration::from_secs_f64(secs.min(86_400.0))),
            },
            _ => done(
                vec![Output::Stderr(b"sleep: invalid time interval\n".to_vec())],
                1,
            ),
        },
        "fake-output" => match args.first().and_then(|a| a.parse::<u64>().ok()) {
            Some(n) => done(
                vec![Output::Generate {
                    n,
                    stderr: args.get(1).is_some_and(|s| s == "stderr"),
                }],
                0,
            ),
            None => done(
                vec![Output::Stderr(
                    b"fake-output: expected a byte count\n".to_vec(),
                )],
                2,
            ),
        },
        other => done(
            vec![Output::Stderr(
                format!("fake: command not found: {other}\n").into_bytes(),
            )],
            127,
        ),
    }
}

/// `n` bytes of the `y\n` pattern starting at offset `at` of the generated output.
pub(super) fn yes_bytes(at: u64, n: usize) -> Bytes {
    let mut v = Vec::with_capacity(n);
    for i in 0..n as u64 {
        v.push(if (at + i) & 1 == 0 { b'y' } else { b'\n' });
    }
    Bytes::from(v)
}

/// Sends the plan's output to `out` in chunks of at most 64 KiB. `Err(())` when the reader
/// went away.
pub(super) async fn emit(plan: &Plan, out: &mpsc::Sender<ExecEvent>) -> Result<(), ()> {
    const CHUNK: usize = 64 * 1024;
    for o in &plan.output {
        match o {
            Output::Stdout(b) | Output::Stderr(b) => {
                let is_err = matches!(o, Output::Stderr(_));
                for c in b.chunks(CHUNK) {
                    let c = Bytes::copy_from_slice(c);
                    let ev = if is_err {
                        ExecEvent::Stderr(c)
                    } else {
                        ExecEvent::Stdout(c)
                    };
                    out.send(ev).await.map_err(|_| ())?;
                }
            }
            Output::Generate { n, stderr } => {
                let mut sent = 0u64;
                while sent < *n {
                    let len = usize::try_from((*n - sent).min(CHUNK as u64)).unwrap_or(CHUNK);
                    let c = yes_bytes(sent, len);
                    sent += len as u64;
                    let ev = if *stderr {
                        ExecEvent::Stderr(c)
                    } else {
                        ExecEvent::Stdout(c)
                    };
                    out.send(ev).await.map_err(|_| ())?;
                }
            }
        }
    }
    Ok(())
}

/// Decoded stdin of a request.
pub(super) fn stdin_of(req: &ExecRequest) -> Result<Vec<u8>, AdapterError> {
    match (&req.stdin, &req.stdin_base64) {
        (Some(s), _) => Ok(s.as_bytes().to_vec()),
        (None, Some(b)) => base64::engine::general_purpose::STANDARD
            .decode(b)
            .map_err(|e| {
                AdapterError::Permanent(Reason::caused_by(format!("stdinBase64: {e}"), e))
            }),
        (None, None) => Ok(Vec::new()),
    }
}
