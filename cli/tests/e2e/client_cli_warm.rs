//! `differently admin pools warm get|set` against a real `differently dev`: a pool's warm
//! classes put from a file (or stdin), read back in each output mode, refused naming the
//! field, and an unknown pool's 404.

use crate::client_cli_dev::Dev;

#[test]
fn warm_classes_are_set_from_a_file_and_read_in_every_output_mode() {
    let dev = Dev::start();
    // None yet.
    let empty = dev.json(&["admin", "pools", "warm", "get", "local"]);
    assert_eq!(empty, serde_json::json!({ "classes": [] }));

    let file = dev.dir.path().join("classes.json");
    std::fs::write(
        &file,
        r#"{"classes": [
            {"name": "default", "size": 0, "refillPerSecond": 1},
            {"name": "py", "size": 0, "maxSize": 2, "refillPerSecond": 0.5,
             "template": "python:3.12", "resources": {"cpu": 2, "memoryMiB": 2048, "diskGiB": 5}}
        ]}"#,
    )
    .unwrap();
    let set = dev.json(&[
        "admin",
        "pools",
        "warm",
        "set",
        "local",
        "--file",
        file.to_str().unwrap(),
    ]);
    let classes = set["classes"].as_array().unwrap();
    assert_eq!(classes.len(), 2, "{set}");
    assert_eq!(classes[0]["name"], "default");
    assert_eq!(classes[0]["maxAgeSeconds"], 3600);
    assert_eq!(
        (
            classes[0]["ready"].as_u64(),
            classes[0]["creating"].as_u64()
        ),
        (Some(0), Some(0))
    );
    assert_eq!(classes[1]["template"], "python:3.12");
    assert_eq!(dev.json(&["admin", "pools", "warm", "get", "local"]), set);

    // A table with a row per class; the names alone with -o id.
    let table = dev.ok(&["admin", "pools", "warm", "get", "local", "-o", "table"]);
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("NAME")
            && lines[0].contains("READY")
            && lines[0].contains("CLAIMS/MIN")
            && lines[0].contains("HIT RATIO")
            && lines[0].contains("SIZE"),
        "{table}"
    );
    assert!(lines[1].starts_with("default "), "{table}");
    assert!(
        lines[2].starts_with("py ") && lines[2].contains("python:3.12"),
        "{table}"
    );
    assert_eq!(
        dev.ok(&["admin", "pools", "warm", "get", "local", "-o", "id"]),
        "default\npy\n"
    );
    // `admin pools` alone still lists the pools.
    assert!(dev
        .ok(&["admin", "pools", "-o", "table"])
        .contains("devhost"));

    // The list alone is a document too; an invalid class is the API's 422 naming the field,
    // and nothing changes.
    std::fs::write(
        &file,
        r#"[{"name": "a", "size": 5000, "refillPerSecond": 1}]"#,
    )
    .unwrap();
    let (code, out, err) = dev.run(&[
        "admin",
        "pools",
        "warm",
        "set",
        "local",
        "--file",
        file.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{out}");
    assert!(
        err.contains("422") && err.contains("classes[0].size"),
        "{err}"
    );
    assert_eq!(dev.json(&["admin", "pools", "warm", "get", "local"]), set);

    // `[]` removes them all.
    std::fs::write(&file, "[]").unwrap();
    let cleared = dev.json(&[
        "admin",
        "pools",
        "warm",
        "set",
        "local",
        "--file",
        file.to_str().unwrap(),
    ]);
    assert_eq!(cleared, serde_json::json!({ "classes": [] }));

    // An unknown pool, and a document that is neither form.
    let (code, _, err) = dev.run(&["admin", "pools", "warm", "get", "nope"]);
    assert_eq!(code, 1);
    assert!(err.contains("404"), "{err}");
    std::fs::write(&file, r#"{"name": "a"}"#).unwrap();
    let (code, _, err) = dev.run(&[
        "admin",
        "pools",
        "warm",
        "set",
        "local",
        "--file",
        file.to_str().unwrap(),
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("classes"), "{err}");
}
