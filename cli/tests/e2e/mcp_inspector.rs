//! The official MCP Inspector's CLI (npm `@modelcontextprotocol/inspector`, pinned by
//! scripts/test into a cache dir named by `DIFFERENTLY_MCP_INSPECTOR`) against `differently
//! mcp` over stdio: it lists the tools, and creates a sandbox, runs a command in it and deletes
//! it, each call a separate Inspector process as a developer would run them by hand.
//!
//! Only stdio: the Inspector CLI that runs on Node.js 20 (0.15.0; later releases need Node.js
//! 22) has no option to send a header, so it cannot present a key to `/mcp` over HTTP
//! (docs/mcp.md says so). The HTTP transport is driven by the official Python SDK in mcp.rs.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use crate::client_cli_dev::Dev;
use crate::harness::binary;

/// The Inspector's `cli` entry point (`node_modules/@modelcontextprotocol/inspector/cli/build/cli.js`).
fn inspector() -> PathBuf {
    let dir = std::env::var("DIFFERENTLY_MCP_INSPECTOR").unwrap_or_default();
    let entry =
        PathBuf::from(&dir).join("node_modules/@modelcontextprotocol/inspector/cli/build/cli.js");
    assert!(
        !dir.is_empty() && entry.is_file(),
        "the MCP Inspector is not installed: run scripts/test (it installs \
         @modelcontextprotocol/inspector@0.15.0 into a cache dir) or set \
         DIFFERENTLY_MCP_INSPECTOR to a dir where `npm install @modelcontextprotocol/inspector` ran \
         (looked for {})",
        entry.display()
    );
    entry
}

/// `mcp-inspector --cli differently mcp <args…>` with the dev server's URL and key; its JSON.
fn run(dev: &Dev, args: &[&str]) -> Value {
    let out = Command::new("node")
        .arg(inspector())
        .args(["--cli", binary(), "mcp"])
        .args(args)
        .env("DIFFERENTLY_URL", &dev.url)
        .env("DIFFERENTLY_API_KEY", &dev.key)
        .env("DIFFERENTLY_CLIENT_CONFIG", "/nonexistent")
        .output()
        .expect("run node (the MCP Inspector needs Node.js >= 20)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "mcp-inspector {args:?} failed:\n{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

#[test]
fn mcp_inspector_cli_over_stdio() {
    let dev = Dev::start();
    let tools = run(&dev, &["--method", "tools/list"]);
    let mut names: Vec<&str> = tools["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "files_list",
            "files_mkdir",
            "files_read",
            "files_write",
            "port_url",
            "process_list",
            "process_output",
            "process_signal",
            "process_start",
            "process_stdin",
            "sandbox_create",
            "sandbox_delete",
            "sandbox_exec",
            "sandbox_extend",
            "sandbox_fork",
            "sandbox_get",
            "sandbox_list",
            "snapshot_create",
        ]
    );

    let created = run(
        &dev,
        &[
            "--method",
            "tools/call",
            "--tool-name",
            "sandbox_create",
            "--tool-arg",
            "ttlSeconds=600",
            "--tool-arg",
            r#"labels={"via":"inspector"}"#,
        ],
    );
    assert_ne!(created["isError"], true, "{created}");
    let sandbox = &created["structuredContent"];
    assert_eq!(sandbox["status"], "running", "{created}");
    assert_eq!(sandbox["labels"]["via"], "inspector", "{created}");
    let id = sandbox["id"].as_str().expect("sandbox id");

    let ran = run(
        &dev,
        &[
            "--method",
            "tools/call",
            "--tool-name",
            "sandbox_exec",
            "--tool-arg",
            &format!("sandboxId={id}"),
            "--tool-arg",
            r#"command=["sh","-c","echo hi; exit 4"]"#,
        ],
    );
    assert_eq!(ran["structuredContent"]["stdout"], "hi\n", "{ran}");
    assert_eq!(ran["structuredContent"]["exitCode"], 4, "{ran}");

    // A malformed argument is the tool's error with the field named, not a protocol error.
    let bad = run(
        &dev,
        &[
            "--method",
            "tools/call",
            "--tool-name",
            "sandbox_exec",
            "--tool-arg",
            &format!("sandboxId={id}"),
            "--tool-arg",
            "command=ls",
        ],
    );
    assert_eq!(bad["isError"], true, "{bad}");
    assert!(bad.to_string().contains("command"), "{bad}");

    let deleted = run(
        &dev,
        &[
            "--method",
            "tools/call",
            "--tool-name",
            "sandbox_delete",
            "--tool-arg",
            &format!("sandboxId={id}"),
        ],
    );
    assert_eq!(
        deleted["structuredContent"]["status"], "terminating",
        "{deleted}"
    );
}
