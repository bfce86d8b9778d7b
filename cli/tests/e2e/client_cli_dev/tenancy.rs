//! The operator's commands: orgs, projects and keys, quotas, policies at every level, the
//! placement dry run, audit list and export, pools and secrets.

use std::process::Stdio;

use super::{ids, json, output, Dev};

#[test]
fn tenancy_quotas_policies_dry_run_and_audit() {
    let dev = Dev::start();
    let org = dev.json(&["org", "create", "acme"]);
    let org_id = org["id"].as_str().unwrap().to_owned();
    assert!(ids(&dev.json(&["org", "list"])).contains(&org_id));
    assert_eq!(dev.json(&["org", "get", &org_id])["name"], "acme");
    assert_eq!(
        dev.json(&["org", "update", &org_id, "--status", "suspended"])["status"],
        "suspended"
    );
    dev.ok(&["org", "update", &org_id, "--status", "active"]);
    let project = dev.json(&["project", "create", "web", "--org", &org_id]);
    let pid = project["id"].as_str().unwrap().to_owned();
    assert_eq!(
        ids(&dev.json(&["project", "list", "--org", &org_id])),
        [pid.as_str()]
    );
    assert_eq!(
        dev.json(&["project", "rename", &pid, "site"])["name"],
        "site"
    );
    assert_eq!(dev.json(&["project", "get", &pid])["name"], "site");

    // A key: its secret with -o id, and it works for that project only.
    let secret = dev
        .ok(&[
            "key",
            "create",
            "ci",
            "--org",
            &org_id,
            "--project",
            &pid,
            "--scope",
            "sandboxes:read",
            "--scope",
            "sandboxes:write",
            "-o",
            "id",
        ])
        .trim()
        .to_owned();
    assert!(secret.starts_with("dly_"), "{secret}");
    let mut as_tenant = dev.cmd(&["sandbox", "list", "-o", "json"]);
    as_tenant.env("DIFFERENTLY_API_KEY", &secret);
    let (code, out, err) = output(as_tenant, None);
    assert_eq!(
        (code, json(&out)["items"].as_array().map(Vec::len)),
        (0, Some(0)),
        "{err}"
    );
    let keys = dev.json(&["key", "list", "--org", &org_id]);
    let key_id = keys["items"][0]["id"].as_str().unwrap().to_owned();
    assert!(
        !keys.to_string().contains(&secret),
        "a list shows the secret"
    );
    assert_eq!(dev.json(&["key", "get", &key_id])["name"], "ci");
    assert!(dev.json(&["key", "revoke", &key_id])["revokedAt"].is_string());

    // Quotas and policies.
    let q = dev.json(&["quota", "set", "--org", &org_id, "--max-active", "3"]);
    assert_eq!(q["quota"]["maxActive"], 3, "{q}");
    assert_eq!(
        dev.json(&["quota", "get", "--org", &org_id])["effective"]["maxActive"],
        3
    );
    let (code, _, err) = dev.run(&["quota", "get"]);
    assert_eq!(code, 2, "a quota needs --org or --project: {err}");
    let policy = dev.dir.path().join("policy.json");
    std::fs::write(&policy, r#"{"allowedClassifications":["internal"]}"#).unwrap();
    let set = dev.json(&[
        "policy",
        "set",
        "--org",
        &org_id,
        "--file",
        policy.to_str().unwrap(),
    ]);
    assert_eq!(
        set["allowedClassifications"],
        serde_json::json!(["internal"])
    );
    assert_eq!(
        dev.json(&["policy", "get", "--org", &org_id])["allowedClassifications"],
        serde_json::json!(["internal"])
    );
    std::fs::write(&policy, r#"{"allowedClasifications":["internal"]}"#).unwrap();
    let (code, _, err) = dev.run(&[
        "policy",
        "set",
        "--global",
        "--file",
        policy.to_str().unwrap(),
    ]);
    assert_eq!(code, 1);
    assert!(
        err.contains("allowedClasifications"),
        "the API names the unknown field: {err}"
    );
    let global = dev.dir.path().join("global.json");
    std::fs::write(&global, r#"{"deniedPools":["elsewhere"]}"#).unwrap();
    let set = dev.json(&[
        "policy",
        "set",
        "--global",
        "--file",
        global.to_str().unwrap(),
    ]);
    assert_eq!(set["deniedPools"], serde_json::json!(["elsewhere"]));
    assert_eq!(
        dev.json(&["policy", "get", "--global"])["deniedPools"],
        serde_json::json!(["elsewhere"])
    );
    let mut from_stdin = dev.cmd(&[
        "policy",
        "set",
        "--project",
        &pid,
        "--file",
        "-",
        "-o",
        "json",
    ]);
    from_stdin.stdin(Stdio::piped());
    let (code, out, err) = output(from_stdin, Some(br#"{"allowedRegions":["eu"]}"#));
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["allowedRegions"], serde_json::json!(["eu"]));
    assert_eq!(
        dev.json(&["policy", "get", "--project", &pid])["allowedRegions"],
        serde_json::json!(["eu"])
    );
    let q = dev.json(&[
        "quota",
        "set",
        "--project",
        &pid,
        "--max-active",
        "2",
        "--max-cpu",
        "4",
    ]);
    assert_eq!(
        (
            q["quota"]["maxActive"].as_u64(),
            q["quota"]["maxCpu"].as_u64()
        ),
        (Some(2), Some(4)),
        "{q}"
    );
    let q = dev.json(&["quota", "get", "--project", &pid]);
    assert_eq!(q["effective"]["maxActive"], 2, "{q}");
    dev.ok(&["project", "delete", &pid]);
    dev.ok(&["org", "delete", &org_id]);

    // Placement dry run: where it would go, nothing created.
    let dry = dev.json(&["sandbox", "create", "--dry-run", "--profile", "small"]);
    assert_eq!(
        (dry["decision"].as_str(), dry["pool"].as_str()),
        (Some("placed"), Some("local"))
    );
    assert_eq!(ids(&dev.json(&["sandbox", "list"])).len(), 0);

    // Audit: list with a filter, export as JSON lines that verify offline.
    let listed = dev.json(&[
        "admin",
        "audit-list",
        "--org",
        &org_id,
        "--action",
        "org.create",
    ]);
    assert_eq!(
        listed["items"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
    let table = dev.ok(&["admin", "audit-list", "--org", &org_id, "-o", "table"]);
    assert!(
        table.starts_with("SEQ") && table.contains("org.create"),
        "{table}"
    );
    let export = dev.dir.path().join("audit.jsonl");
    dev.ok(&["admin", "audit-export", "--file", export.to_str().unwrap()]);
    let text = std::fs::read_to_string(&export).unwrap();
    assert!(text.lines().count() >= 5, "{text}");
    let (code, out, _) = dev.run(&["admin", "audit-export"]);
    assert_eq!((code, out.lines().count()), (0, text.lines().count()));
    // A checkpoint now; a second one right after has nothing new to sign.
    let (code, out, err) = dev.run(&["admin", "audit-checkpoint", "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    assert!(json(&out).is_object(), "{out}");
    let (code, out, err) = dev.run(&["admin", "audit-checkpoint"]);
    assert_eq!((code, out.as_str()), (0, ""));
    assert!(err.contains("nothing changed"), "{err}");
    let pools = dev.ok(&["admin", "pools", "-o", "table"]);
    assert!(
        pools.starts_with("NAME") && pools.contains("devhost"),
        "{pools}"
    );
    // The trust report as a table: its sections as tables and lines, never a cell of JSON.
    let report = dev.ok(&["admin", "trust-report", "-o", "table"]);
    for heading in [
        "POOLS",
        "CREDENTIALS",
        "EXTERNAL PLACEMENTS",
        "NOT ENFORCED",
    ] {
        assert!(
            report.lines().any(|l| l == heading),
            "no {heading}: {report}"
        );
    }
    assert!(
        report
            .lines()
            .any(|l| l.starts_with("local ") && l.contains("devhost")),
        "{report}"
    );
    assert!(
        report
            .lines()
            .any(|l| l.starts_with("- Differently does not isolate sandboxes")),
        "{report}"
    );
    assert!(
        !report.contains("[\"") && !report.contains("{\""),
        "JSON in the table: {report}"
    );
    // Every signature verifies: a new segment is refused (409), exit 1.
    let (code, _, err) = dev.run(&["admin", "audit-segment", "--reason", "drill"]);
    assert_eq!(code, 1);
    assert!(err.contains("409"), "{err}");

    // Pools registered through the API: create, update, delete.
    let pool = dev.dir.path().join("pool.json");
    std::fs::write(&pool, r#"{"name":"extra","kind":"fake"}"#).unwrap();
    let made = dev.json(&["admin", "pool-create", "--file", pool.to_str().unwrap()]);
    assert_eq!(
        (made["name"].as_str(), made["source"].as_str()),
        (Some("extra"), Some("api"))
    );
    std::fs::write(&pool, r#"{"maxConcurrent":4}"#).unwrap();
    let changed = dev.json(&[
        "admin",
        "pool-update",
        "extra",
        "--file",
        pool.to_str().unwrap(),
    ]);
    assert_eq!(changed["maxConcurrent"], 4, "{changed}");
    dev.ok(&["admin", "pool-delete", "extra"]);
    let (code, _, err) = dev.run(&["admin", "pool", "extra"]);
    assert_eq!(code, 1);
    assert!(err.contains("404"), "{err}");

    // Secrets: the value from stdin, never printed back.
    let mut set = dev.cmd(&["admin", "secret-set", "backend-token", "-o", "json"]);
    set.stdin(Stdio::piped());
    let (code, out, err) = output(set, Some(b"s3cr3t-value\n"));
    assert_eq!(code, 0, "{err}");
    assert!(
        !out.contains("s3cr3t") && !err.contains("s3cr3t"),
        "{out}{err}"
    );
    let listed = dev.json(&["admin", "secrets"]);
    assert_eq!(listed["items"][0]["name"], "backend-token", "{listed}");
    assert!(!listed.to_string().contains("s3cr3t"));
    let (code, _, err) = dev.run(&["admin", "secret-set", "empty"]);
    assert_eq!(code, 2, "no value on stdin: {err}");
}
