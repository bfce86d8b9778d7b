//! Capability honesty: what is not declared must be refused as such.

use super::support::{cmd, expect_kind, read_all, stream, Ctx};
use crate::{AdapterError, Capability};

/// The capabilities whose absence is checked.
pub(super) const OPTIONAL: [Capability; 6] = [
    Capability::ExecStream,
    Capability::Files,
    Capability::LifecyclePause,
    Capability::LifecycleStop,
    Capability::Snapshots,
    Capability::PortsExpose,
];

/// An undeclared capability `cap` is refused as `unsupported_operation`.
pub(super) async fn refused(cx: &Ctx<'_>, cap: Capability) -> Result<String, String> {
    let a = cx.a;
    let at = &cx.at;
    let got: Result<(), AdapterError> = match cap {
        Capability::ExecStream => stream(a, at, &cmd(&["true"])).await.map(drop),
        Capability::Files => read_all(a, at, "/etc/hostname", None).await.map(drop),
        Capability::LifecyclePause => a.pause(at).await,
        Capability::LifecycleStop => a.stop(at).await,
        Capability::Snapshots => a.snapshot(at, "snp_conformancehonesty").await.map(drop),
        _ => a.expose_port(at, 8080, None).await.map(drop),
    };
    expect_kind(&format!("undeclared {cap}"), "unsupported_operation", got)
}
