//! Capability honesty: what is not declared must be refused as such.

use super::support::{cmd, expect_kind, read_all, stream, Ctx};
use crate::AdapterError;

/// The capabilities whose absence is checked.
pub(super) const OPTIONAL: [&str; 6] = [
    "exec.stream",
    "files",
    "lifecycle.pause",
    "lifecycle.stop",
    "snapshots",
    "ports.expose",
];

/// An undeclared capability `cap` is refused as `unsupported_operation`.
pub(super) async fn refused(cx: &Ctx<'_>, cap: &str) -> Result<String, String> {
    let a = cx.a;
    let at = &cx.at;
    let got: Result<(), AdapterError> = match cap {
        "exec.stream" => stream(a, at, &cmd(&["true"])).await.map(drop),
        "files" => read_all(a, at, "/etc/hostname", None).await.map(drop),
        "lifecycle.pause" => a.pause(at).await,
        "lifecycle.stop" => a.stop(at).await,
        "snapshots" => a.snapshot(at, "snp_conformancehonesty").await.map(drop),
        _ => a.expose_port(at, 8080, None).await.map(drop),
    };
    expect_kind(&format!("undeclared {cap}"), "unsupported_operation", got)
}
