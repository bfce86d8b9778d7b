//! Streamed exec: bytes through, stderr apart, exit codes, timeout.

use base64::Engine;
use differently_core::exec::ExecRequest;

use super::support::{cmd, expect_eq, kind, stream, Ctx, Programs};

/// Every byte (or, declared text-only, every UTF-8 length) goes through `cat` and back.
pub(super) async fn bytes(cx: &Ctx<'_>) -> Result<String, String> {
    let a = cx.a;
    let at = &cx.at;
    let fidelity = cx.fidelity;
    // Every byte value, or, where the adapter declares text-only output, text with
    // characters of every UTF-8 length.
    let all: Vec<u8> = if fidelity.binary_output {
        (0..=255u8).cycle().take(3 * 256 + 7).collect()
    } else {
        "plain ascii, é, €, 😀 and a newline\n"
            .repeat(20)
            .into_bytes()
    };
    let what = if fidelity.binary_output {
        "binary"
    } else {
        "UTF-8 text (declared text-only)"
    };
    let mut req = cmd(&["cat"]);
    req.stdin_base64 = Some(base64::engine::general_purpose::STANDARD.encode(&all));
    let (out, err, code) = stream(a, at, &req)
        .await
        .map_err(|e| format!("{} ({e})", kind(&e)))?;
    expect_eq("exit code", 0, code)?;
    if out != all {
        return Err(format!(
            "stdout is not the {} {what} bytes sent ({} bytes back)",
            all.len(),
            out.len()
        ));
    }
    expect_eq("stderr", 0, err.len())?;
    Ok(format!("{} {what} bytes through, exit 0", out.len()))
}

/// Streamed stderr stays apart and exit codes are kept.
pub(super) async fn stderr(cx: &Ctx<'_>, p: &Programs) -> Result<String, String> {
    let a = cx.a;
    let at = &cx.at;
    let req = ExecRequest {
        command: (p.stderr)("streamed"),
        timeout_seconds: Some(30),
        ..ExecRequest::default()
    };
    let (out, err, code) = stream(a, at, &req)
        .await
        .map_err(|e| format!("{} ({e})", kind(&e)))?;
    expect_eq("stderr", b"streamed\n".as_slice(), err.as_slice())?;
    expect_eq("stdout", 0, out.len())?;
    expect_eq("exit code", 0, code)?;
    let code = stream(
        a,
        at,
        &ExecRequest {
            command: (p.exit)(5),
            timeout_seconds: Some(30),
            ..ExecRequest::default()
        },
    )
    .await
    .map_err(|e| format!("{} ({e})", kind(&e)))?
    .2;
    expect_eq("streamed exit 5", 5, code)?;
    Ok("stderr apart, exit codes kept".to_owned())
}

/// A streamed command past its timeout ends with exit 124.
pub(super) async fn timeout(cx: &Ctx<'_>) -> Result<String, String> {
    let a = cx.a;
    let at = &cx.at;
    let mut req = cmd(&["sleep", "10"]);
    req.timeout_seconds = Some(1);
    let (_, _, code) = stream(a, at, &req)
        .await
        .map_err(|e| format!("{} ({e})", kind(&e)))?;
    expect_eq("exit code past the timeout", 124, code)?;
    Ok("exit 124".to_owned())
}
