//! Every repository path the README and `docs/*.md` name in backticks exists, so a reader who
//! follows one finds the file (paths are recognised by their first segment: a top-level
//! directory of the repository; `../shared/…` and URL paths are not repository paths).
//!
//! The maps of the code (`docs/architecture.md` above all) name several files at once and
//! items in them: `api/src/{auth,error}.rs` is each file of the set, `store/src/pg/warm.rs::f`
//! is the file, a set member without an extension (`{naming,messages/}`) is that module's
//! `.rs` file or folder, and `<intent>` placeholders are not paths.

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
                    .all(|c| c.is_ascii_alphanumeric() || "_./-{},:".contains(c));
            if is_path {
                out.push((n + 1, piece));
            }
        }
    }
    out
}

/// The files a backticked path names: its `{a,b}` sets expanded (one level, as the docs write
/// them) and an item path (`::name`) dropped.
fn expand(path: &str) -> Vec<String> {
    let path = path.split("::").next().unwrap_or(path);
    match (path.find('{'), path.find('}')) {
        (Some(open), Some(close)) if open < close => {
            let (head, set, tail) = (&path[..open], &path[open + 1..close], &path[close + 1..]);
            set.split(',')
                .flat_map(|member| expand(&format!("{head}{member}{tail}")))
                .collect()
        }
        _ => vec![path.to_owned()],
    }
}

/// Whether `path` exists under `root`, or, named as a module (no extension), its `.rs` file.
fn names_something(root: &Path, path: &str) -> bool {
    let at = root.join(Path::new(path));
    at.exists() || (at.extension().is_none() && at.with_extension("rs").exists())
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
            for file in expand(path) {
                checked += 1;
                if !names_something(&root, &file) {
                    let name = doc.strip_prefix(&root).unwrap_or(doc).display().to_string();
                    missing.push(format!("{name}:{line}: `{path}` ({file})"));
                }
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

#[test]
fn sets_and_items_name_each_file() {
    assert_eq!(
        expand("api/src/{auth,error}.rs"),
        ["api/src/auth.rs", "api/src/error.rs"]
    );
    assert_eq!(
        expand("store/src/pg/warm.rs::capped_pools"),
        ["store/src/pg/warm.rs"]
    );
    assert_eq!(
        expand("bus-schema/src/{naming,messages/}"),
        ["bus-schema/src/naming", "bus-schema/src/messages/"]
    );
    let root = repo_root();
    assert!(names_something(&root, "bus-schema/src/naming"));
    assert!(!names_something(&root, "api/src/no_such_module"));
    assert!(!names_something(&root, "bus/src/jetstream.rs"));
    assert!(backticked_paths("`store/src/<intent>.rs`").is_empty());
}
