//! The binary where no server is involved: a usage error names what is missing, not the
//! options that have a value (from a flag or a `DIFFERENTLY_*` variable).

use std::process::Command;

use crate::harness::binary;

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
