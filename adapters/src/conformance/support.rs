//! What the checks share: the instance they run against, the programs of each dialect,
//! exec, stream and download helpers, and the expectation helpers that word a failure.

use std::collections::BTreeMap;

use differently_core::exec::ExecRequest;
use differently_core::ids::InstallationId;
use differently_core::{Resources, SandboxId};
use futures::StreamExt;
use tokio::sync::mpsc;

use super::Dialect;
use crate::{Adapter, AdapterError, ByteRange, CreateInstance, ExecFidelity, InstanceRef};

/// The instance every check after `create` runs against.
pub(super) struct Ctx<'a> {
    pub(super) a: &'a dyn Adapter,
    pub(super) installation: InstallationId,
    pub(super) id: SandboxId,
    pub(super) at: InstanceRef,
    /// What the adapter declares its exec carries, read once.
    pub(super) fidelity: ExecFidelity,
}

pub(super) fn cmd(args: &[&str]) -> ExecRequest {
    ExecRequest {
        command: args.iter().map(|s| (*s).to_owned()).collect(),
        timeout_seconds: Some(30),
        ..ExecRequest::default()
    }
}

pub(super) fn spec(sandbox_id: &SandboxId, installation: &InstallationId) -> CreateInstance {
    CreateInstance {
        sandbox_id: sandbox_id.clone(),
        installation_id: installation.clone(),
        template: None,
        resources: Resources::DEFAULT,
        env: BTreeMap::from([("DIFFERENTLY_CONFORMANCE".to_owned(), "1".to_owned())]),
        ttl_seconds: 600,
        from_snapshot: None,
    }
}

pub(super) fn kind(e: &AdapterError) -> &'static str {
    match e {
        AdapterError::Transient(_) => "transient",
        AdapterError::Permanent(_) => "permanent",
        AdapterError::NotFound => "not_found",
        AdapterError::PathNotFound(_) => "path_not_found",
        AdapterError::Unsupported(_) => "unsupported_operation",
        AdapterError::Unavailable(_) => "unavailable",
        AdapterError::Capacity(_) => "insufficient_capacity",
        AdapterError::BadPath(_) => "bad_path",
    }
}

/// The programs of a dialect.
pub(super) struct Programs {
    /// Writes `text` to stderr, nothing to stdout, exits 0.
    pub(super) stderr: fn(&str) -> Vec<String>,
    /// Exits with `code`.
    pub(super) exit: fn(i32) -> Vec<String>,
}

pub(super) const POSIX: Programs = Programs {
    stderr: |t| {
        vec![
            "sh".into(),
            "-c".into(),
            format!("printf '%s\\n' '{t}' >&2"),
        ]
    },
    exit: |c| vec!["sh".into(), "-c".into(), format!("exit {c}")],
};

pub(super) const FAKE: Programs = Programs {
    stderr: |t| vec!["fake-stderr".into(), t.into()],
    exit: |c| vec!["fake-exit".into(), c.to_string()],
};

pub(super) async fn exec(
    a: &dyn Adapter,
    at: &InstanceRef,
    command: Vec<String>,
) -> Result<differently_core::exec::ExecResult, String> {
    let req = ExecRequest {
        command,
        timeout_seconds: Some(30),
        ..ExecRequest::default()
    };
    a.exec(at, &req)
        .await
        .map_err(|e| format!("exec failed: {} ({e})", kind(&e)))
}

/// Finds the dialect: POSIX first, then the fake's. An adapter that says its buffered exec
/// answers stderr combined with stdout is probed for the stderr text in either.
pub(super) async fn dialect(a: &dyn Adapter, at: &InstanceRef) -> Option<Dialect> {
    let merged = !a.exec_fidelity().buffered_stderr;
    for (d, p) in [(Dialect::Posix, &POSIX), (Dialect::Fake, &FAKE)] {
        let Ok(r) = exec(a, at, (p.exit)(7)).await else {
            continue;
        };
        if r.exit_code != 7 {
            continue;
        }
        if let Ok(r) = exec(a, at, (p.stderr)("conformance-probe")).await {
            let seen = r.stderr.contains("conformance-probe")
                || (merged && r.stdout.contains("conformance-probe"));
            if r.exit_code == 0 && seen {
                return Some(d);
            }
        }
    }
    None
}

/// Streams `req`, returning (stdout, stderr, exit code).
pub(super) async fn stream(
    a: &dyn Adapter,
    at: &InstanceRef,
    req: &ExecRequest,
) -> Result<(Vec<u8>, Vec<u8>, i32), AdapterError> {
    let (tx, rx) = mpsc::channel(8);
    let (exit, (out, err)) =
        tokio::join!(a.exec_stream(at, req, tx), crate::exec_output::whole(rx));
    Ok((out, err, exit?.exit_code))
}

pub(super) async fn read_all(
    a: &dyn Adapter,
    at: &InstanceRef,
    path: &str,
    range: Option<ByteRange>,
) -> Result<(Option<u64>, Vec<u8>), AdapterError> {
    let d = a.download(at, path, range).await?;
    let mut body = d.body;
    let mut bytes = Vec::new();
    while let Some(chunk) = body.next().await {
        bytes.extend_from_slice(&chunk?);
    }
    Ok((d.total_size, bytes))
}

pub(super) fn expect_eq<T: PartialEq + std::fmt::Debug>(
    what: &str,
    want: T,
    got: T,
) -> Result<(), String> {
    if want == got {
        Ok(())
    } else {
        Err(format!("{what}: expected {want:?}, got {got:?}"))
    }
}

pub(super) fn expect_kind<T: std::fmt::Debug>(
    what: &str,
    want: &str,
    got: Result<T, AdapterError>,
) -> Result<String, String> {
    match got {
        Err(e) if kind(&e) == want => Ok(format!("{what}: {want}")),
        Err(e) => Err(format!("{what}: expected {want}, got {} ({e})", kind(&e))),
        Ok(v) => Err(format!("{what}: expected {want}, got success ({v:?})")),
    }
}

#[derive(Clone, Copy)]
pub(super) enum Verb {
    Pause,
    Resume,
    Stop,
    Start,
}

pub(super) async fn verb(a: &dyn Adapter, at: &InstanceRef, v: Verb) -> Result<(), AdapterError> {
    match v {
        Verb::Pause => a.pause(at).await,
        Verb::Resume => a.resume(at).await,
        Verb::Stop => a.stop(at).await,
        Verb::Start => a.start(at).await,
    }
}

pub(super) async fn cleanup(a: &dyn Adapter, ids: &[SandboxId]) {
    for id in ids {
        if let Err(e) = a.delete(id).await {
            tracing::warn!(sandbox = %id, error = %e, "conformance: cleanup delete failed");
        }
    }
}
