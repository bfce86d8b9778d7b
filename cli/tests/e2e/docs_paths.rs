//! Every repository path the README and `docs/*.md` name in backticks exists, so a reader who
//! follows one finds the file (paths are recognised by their first segment: a top-level
//! directory of the repository; `../shared/…` and URL paths are not repository paths).

use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The backticked tokens of `text` that look like paths (`a/b…`), with their line numbers.
fn backticked_paths(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        for (i, piece) in line.split('`').enumerate() {
            let is_path = i % 2 == 1
                && piece.contains('/')
                && !piece.is_empty()
                && piece
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_./-".contains(c));
            if is_path {
                out.push((n + 1, piece));
            }
        }
    }
    out
}

/// Paths that runs make (git ignores them): named in the docs as where to look afterwards.
const MADE_BY_RUNS: &[&str] = &["ui-tests/artifacts/"];

#[test]
fn every_repository_path_the_docs_name_exists() {
    let root = repo_root();
    let tops: Vec<String> = std::fs::read_dir(&root)
        .expect("read the repository root")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| !n.starts_with('.') && n != "target")
        .collect();
    let mut docs = vec![root.join("README.md")];
    for entry in std::fs::read_dir(root.join("docs")).expect("read docs/") {
        let path = entry.expect("docs entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            docs.push(path);
        }
    }
    assert!(docs.len() > 10, "found only {docs:?}");
    let mut missing = Vec::new();
    let mut checked = 0;
    for doc in &docs {
        let text = std::fs::read_to_string(doc).expect("read a doc");
        for (line, path) in backticked_paths(&text) {
            let first = path.split('/').next().unwrap_or("");
            if !tops.iter().any(|t| t == first) || MADE_BY_RUNS.iter().any(|m| path.starts_with(m))
            {
                continue;
            }
            checked += 1;
            if !root.join(Path::new(path)).exists() {
                let name = doc.strip_prefix(&root).unwrap_or(doc).display().to_string();
                missing.push(format!("{name}:{line}: `{path}`"));
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} paths recognised: is the parser right?"
    );
    assert!(
        missing.is_empty(),
        "the docs name paths that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_path_parser_finds_backticked_paths_only() {
    let text = "see `api/src/lib.rs` and `cargo test` or `a b/c`\n`docs/`";
    assert_eq!(
        backticked_paths(text),
        vec![(1, "api/src/lib.rs"), (2, "docs/")]
    );
}
