//! What the harness tests share: the `differently` binary of this workspace.

use std::path::PathBuf;
use std::process::Command;

/// `target/debug/differently` of this workspace (respecting `CARGO_TARGET_DIR`), built with
/// `cargo build -p differently` when it is missing.
pub fn differently_binary() -> PathBuf {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("load-tests sits inside the workspace")
        .to_owned();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|t| {
            if t.is_absolute() {
                t
            } else {
                workspace.join(t)
            }
        })
        .unwrap_or_else(|| workspace.join("target"));
    let binary = target.join("debug").join("differently");
    if !binary.is_file() {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", "differently"])
            .current_dir(&workspace)
            .status()
            .unwrap_or_else(|e| panic!("cannot run `cargo build -p differently`: {e}"));
        assert!(
            status.success() && binary.is_file(),
            "{} is missing and `cargo build -p differently` did not produce it ({status}); \
             build it first with `cargo build -p differently`",
            binary.display()
        );
    }
    binary
}
