//! Buffered exec: output, exit codes, stderr, env, cwd, stdin, timeout, a missing instance.

use std::time::{Duration, Instant};

use differently_core::SandboxId;

use super::support::{cmd, exec, expect_eq, expect_kind, kind, Ctx, Programs};
use crate::InstanceRef;

/// `echo` answers on stdout with exit 0 and nothing on stderr.
pub(super) async fn stdout(cx: &Ctx<'_>) -> Result<String, String> {
    let a = cx.a;
    let at = &cx.at;
    let res = exec(a, at, cmd(&["echo", "hello", "conformance"]).command).await?;
    expect_eq("exit code", 0, res.exit_code)?;
    expect_eq("stdout", "hello conformance\n", res.stdout.as_str())?;
    expect_eq("stderr", "", res.stderr.as_str())?;
    Ok("echo: stdout, exit 0".to_owned())
}

/// Exit codes come back as the command gave them.
pub(super) async fn exit_code(cx: &Ctx<'_>, p: &Programs) -> Result<String, String> {
    let a = cx.a;
    let at = &cx.at;
    expect_eq(
        "false",
        1,
        exec(a, at, cmd(&["false"]).command).await?.exit_code,
    )?;
    expect_eq("exit 3", 3, exec(a, at, (p.exit)(3)).await?.exit_code)?;
    expect_eq(
        "true",
        0,
        exec(a, at, cmd(&["true"]).command).await?.exit_code,
    )?;
    Ok("false 1, exit 3, true 0".to_owned())
}

/// Stderr comes back apart from stdout, or combined where the adapter declares so.
pub(super) async fn stderr(cx: &Ctx<'_>, p: &Programs) -> Result<String, String> {
    let a = cx.a;
    let at = &cx.at;
    let fidelity = cx.fidelity;
    let res = exec(a, at, (p.stderr)("to-stderr")).await?;
    if !fidelity.buffered_stderr {
        // Declared: the provider answers both streams as one, in stdout.
        expect_eq(
            "stdout (stderr combined, as declared)",
            "to-stderr\n",
            res.stdout.as_str(),
        )?;
        expect_eq("stderr", "", res.stderr.as_str())?;
        return Ok("stderr combined into stdout, as the adapter declares".to_owned());
    }
    expect_eq("stderr", "to-stderr\n", res.stderr.as_str())?;
    expect_eq("stdout", "", res.stdout.as_str())?;
    Ok("stderr apart from stdout".to_owned())
}

/// The request's environment reaches the command.
pub(super) async fn env(cx: &Ctx<'_>) -> Result<String, String> {
    let a = cx.a;
    let at = &cx.at;
    let mut req = cmd(&["env"]);
    req.env
        .insert("CONFORMANCE_VAR".into(), "some value=x".into());
    let res = a
        .exec(at, &req)
        .await
        .map_err(|e| format!("{} ({e})", kind(&e)))?;
    if !res
        .stdout
        .lines()
        .any(|l| l == "CONFORMANCE_VAR=some value=x")
    {
        return Err(format!(
            "`env` output lacks CONFORMANCE_VAR=some value=x: {:?}",
            res.stdout
        ));
    }
    Ok("the request's env reaches the command".to_owned())
}

/// The request's working directory is the command's.
pub(super) async fn cwd(cx: &Ctx<'_>) -> Result<String, String> {
    let a = cx.a;
    let at = &cx.at;
    let mut req = cmd(&["pwd"]);
    req.cwd = Some("/tmp".into());
    let res = a
        .exec(at, &req)
        .await
        .map_err(|e| format!("{} ({e})", kind(&e)))?;
    expect_eq("pwd in /tmp", "/tmp\n", res.stdout.as_str())?;
    Ok("cwd /tmp".to_owned())
}

/// The request's stdin reaches the command.
pub(super) async fn stdin(cx: &Ctx<'_>) -> Result<String, String> {
    let a = cx.a;
    let at = &cx.at;
    let fidelity = cx.fidelity;
    let mut req = cmd(&["cat"]);
    req.stdin = Some("line one\nline two".into());
    let res = a
        .exec(at, &req)
        .await
        .map_err(|e| format!("{} ({e})", kind(&e)))?;
    if !fidelity.exact_line_endings {
        // Declared: line-framed output, so the final line gains its newline.
        expect_eq(
            "cat of stdin (line-framed, as declared)",
            "line one\nline two\n",
            res.stdout.as_str(),
        )?;
        return Ok(
            "stdin reaches the command (final line gains a newline, as declared)".to_owned(),
        );
    }
    expect_eq("cat of stdin", "line one\nline two", res.stdout.as_str())?;
    Ok("stdin reaches the command".to_owned())
}

/// A command past its timeout ends with exit 124, promptly.
pub(super) async fn timeout(cx: &Ctx<'_>) -> Result<String, String> {
    let a = cx.a;
    let at = &cx.at;
    let mut req = cmd(&["sleep", "10"]);
    req.timeout_seconds = Some(1);
    let started = Instant::now();
    let res = a
        .exec(at, &req)
        .await
        .map_err(|e| format!("{} ({e})", kind(&e)))?;
    expect_eq(
        "exit code of a command past its timeout",
        124,
        res.exit_code,
    )?;
    let took = started.elapsed();
    if took > Duration::from_secs(6) {
        return Err(format!("a 1 s timeout took {} ms", took.as_millis()));
    }
    Ok(format!("exit 124 after {} ms", took.as_millis()))
}

/// Exec on an instance that does not exist is `not_found`.
pub(super) async fn not_found(cx: &Ctx<'_>) -> Result<String, String> {
    let a = cx.a;
    let nowhere = InstanceRef {
        sandbox_id: SandboxId::new(),
        backend_ref: "conformance-no-such-instance".into(),
    };
    expect_kind(
        "exec on an instance that does not exist",
        "not_found",
        a.exec(&nowhere, &cmd(&["true"])).await,
    )
}
