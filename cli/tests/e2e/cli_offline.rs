//! The binary where no server is involved: a usage error names what is missing, not the
//! options that have a value (from a flag or a `DIFFERENTLY_*` variable); and `audit
//! verify` in a pipeline whose reader goes away ends without a panic, with its verdict as
//! its exit code.

use std::process::Command;

use differently_store::audit::AuditKey;

use crate::audit_chain::{export_lines, three_records};
use crate::harness::{binary, run_with_stdout_closed};

const KEY: &str = "5a5b5c5d5e5f606162636465666768696a6b6c6d6e6f70717273747576777879";

/// Runs `differently args…` with an API URL and key in the environment, as a user who set
/// them does; (exit code, stderr).
fn run(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(binary())
        .args(args)
        .env("DIFFERENTLY_URL", "http://127.0.0.1:9")
        .env("DIFFERENTLY_API_KEY", "dly_not_used")
        .env_remove("DIFFERENTLY_PROFILE")
        .output()
        .expect("run differently");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The `Usage:` line of an error.
fn usage_line(err: &str) -> &str {
    err.lines()
        .find(|l| l.starts_with("Usage: "))
        .unwrap_or_else(|| panic!("no usage line in:\n{err}"))
}

/// clap's own error usage listed every option with a value as if required (`Usage:
/// differently sandbox get --url <URL> --key <KEY> <ID>`); it is now `--help`'s line.
#[test]
fn a_missing_argument_is_named_without_options_that_have_values() {
    let (code, err) = run(&["sandbox", "get"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("required arguments were not provided") && err.contains("<ID>"),
        "{err}"
    );
    assert_eq!(
        usage_line(&err),
        "Usage: differently sandbox get [OPTIONS] <ID>"
    );

    // Options given on the command line are not shown as required either.
    let (code, err) = run(&["key", "create", "ci", "--org", "org_1", "-o", "json"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--scope <SCOPES>"), "{err}");
    let usage = usage_line(&err);
    assert_eq!(
        usage,
        "Usage: differently key create [OPTIONS] --scope <SCOPES> <NAME>"
    );
    for optional in ["--url <URL>", "--key <KEY>", "--output", "--org"] {
        assert!(!usage.contains(optional), "{optional} in {usage}");
    }

    // Other errors that carry a usage line get the same one.
    let (code, err) = run(&["sandbox", "get", "sbx_1", "--bogus"]);
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(
        usage_line(&err),
        "Usage: differently sandbox get [OPTIONS] <ID>"
    );
}

/// An export of three records on the installation chain, signed with [`KEY`], one line each.
fn export() -> Vec<String> {
    let key = AuditKey::from_hex(KEY).expect("test key");
    export_lines(&three_records(&key))
}

/// `differently audit verify - | head` when the reader is gone before the report: no
/// panic (it was exit 101); exit 0 when the export verifies, exit 1 with the failure on
/// stderr when it does not, so a failed verification never reads as success.
#[test]
fn audit_verify_whose_reader_goes_away_keeps_its_verdict() {
    let verify = |text: &str| {
        let mut cmd = Command::new(binary());
        cmd.args(["audit", "verify", "--key-env", "E2E_AUDIT_KEY", "-"])
            .env("E2E_AUDIT_KEY", KEY)
            .env_remove("DIFFERENTLY_AUDIT_PREVIOUS_KEYS");
        run_with_stdout_closed(cmd, text.as_bytes())
    };
    let lines = export();
    let (code, err) = verify(&lines.join("\n"));
    assert_eq!((code, err.as_str()), (Some(0), ""));

    let tampered = lines
        .join("\n")
        .replace("\"resource\":\"p1\"", "\"resource\":\"px\"");
    assert_ne!(tampered, lines.join("\n"), "nothing was changed");
    let (code, err) = verify(&tampered);
    assert_eq!(code, Some(1), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.contains("differently: audit export does not verify: chain installation record 2"),
        "{err}"
    );
}
