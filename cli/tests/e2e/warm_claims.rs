//! Warm pools end to end on `differently dev` (devhost pool `local`): instances are warmed
//! with no tenant data, a create that matches claims one and runs at once under its id, the
//! env given at create reaches the claimed instance's commands (it was created without it),
//! each instance serves one sandbox only, and a claimed instance is destroyed with its
//! sandbox, never returned.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::client_cli_dev::Dev;

/// The devhost instance directories under `dev`'s root (one per instance, named by id).
fn instance_dirs(dev: &Dev) -> BTreeSet<String> {
    let root = dev.dir.path().join("sandboxes");
    std::fs::read_dir(&root)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.path().join(".differently.json").exists())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Polls `admin pools warm get local` until the first class has `ready` instances.
fn wait_ready(dev: &Dev, ready: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let got = dev.json(&["admin", "pools", "warm", "get", "local"]);
        if got["classes"][0]["ready"].as_u64() == Some(ready) {
            return got;
        }
        assert!(
            Instant::now() < deadline,
            "the class never had {ready} ready: {got}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_claimed_instance_runs_at_once_with_the_creates_env_and_serves_one_sandbox() {
    let dev = Dev::start();
    let file = dev.dir.path().join("classes.json");
    std::fs::write(
        &file,
        r#"{"classes": [{"name": "default", "size": 2, "refillPerSecond": 20}]}"#,
    )
    .unwrap();
    dev.ok(&[
        "admin",
        "pools",
        "warm",
        "set",
        "local",
        "--file",
        file.to_str().unwrap(),
    ]);
    wait_ready(&dev, 2);
    let warmed = instance_dirs(&dev);
    assert_eq!(warmed.len(), 2, "{warmed:?}");
    // Warmed with no tenant data: the backend's metadata holds no env.
    for id in &warmed {
        let tag = std::fs::read_to_string(
            dev.dir
                .path()
                .join("sandboxes")
                .join(id)
                .join(".differently.json"),
        )
        .unwrap();
        let tag: Value = serde_json::from_str(&tag).unwrap();
        assert!(
            tag["env"].as_object().is_none_or(|e| e.is_empty()),
            "a warm instance holds env before any claim: {tag}"
        );
    }

    // A default create matches the class: it is claimed, running in the answer itself, under
    // a warm instance's id.
    let a = dev.json(&["sandbox", "create", "--env", "TOKEN=alpha"]);
    let a_id = a["id"].as_str().unwrap().to_owned();
    assert_eq!(a["status"], "running", "{a}");
    assert!(warmed.contains(&a_id), "{a_id} is not one of {warmed:?}");
    let b = dev.json(&["sandbox", "create", "--env", "TOKEN=beta"]);
    let b_id = b["id"].as_str().unwrap().to_owned();
    assert_eq!(b["status"], "running", "{b}");
    assert!(warmed.contains(&b_id) && b_id != a_id, "{b_id}, {a_id}");

    // The env given at create reaches the commands of each claimed instance, and only its own.
    for (id, want) in [(&a_id, "alpha"), (&b_id, "beta"), (&a_id, "alpha")] {
        let out = dev.ok(&["sandbox", "exec", id, "--", "sh", "-c", "echo $TOKEN"]);
        assert_eq!(out.trim(), want, "sandbox {id}");
    }
    // The call's own env wins over the sandbox's.
    let out = dev.ok(&[
        "sandbox",
        "exec",
        &a_id,
        "--env",
        "TOKEN=call",
        "--",
        "sh",
        "-c",
        "echo $TOKEN",
    ]);
    assert_eq!(out.trim(), "call");

    // Refill replaces what was claimed, with new instances; a claimed one is never offered
    // again.
    wait_ready(&dev, 2);
    let now = instance_dirs(&dev);
    assert_eq!(now.len(), 4, "{now:?}");
    let c = dev.json(&["sandbox", "create"]);
    let c_id = c["id"].as_str().unwrap().to_owned();
    assert!(
        c_id != a_id && c_id != b_id && !warmed.contains(&c_id),
        "{c_id} served a second sandbox"
    );

    // A claimed instance ends with its sandbox: destroyed, never returned to the class.
    dev.ok(&["sandbox", "delete", &a_id]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while instance_dirs(&dev).contains(&a_id) {
        assert!(Instant::now() < deadline, "{a_id}'s instance outlived it");
        std::thread::sleep(Duration::from_millis(100));
    }
    let got = dev.json(&["sandbox", "get", &a_id]);
    assert_eq!(got["status"], "terminated", "{got}");
}
