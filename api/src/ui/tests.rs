//! The embedded list is the directory: a file added to `api/ui/` without an entry fails here.

use super::ASSETS;

fn files(dir: &std::path::Path, base: &std::path::Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).expect("ui dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            files(&path, base, out);
        } else {
            let rel = path.strip_prefix(base).expect("under ui/");
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
}

#[test]
fn every_file_of_the_ui_directory_is_embedded_and_nothing_else() {
    let base = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/ui"));
    let mut on_disk = Vec::new();
    files(base, base, &mut on_disk);
    on_disk.sort();
    let mut embedded: Vec<String> = ASSETS.iter().map(|a| a.path.to_owned()).collect();
    embedded.sort();
    assert_eq!(embedded, on_disk);
}

#[test]
fn no_asset_assigns_markup_or_runs_inline_script() {
    for a in ASSETS {
        let text = std::str::from_utf8(a.bytes).expect("text asset");
        for banned in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
        ] {
            assert!(!text.contains(banned), "{} uses {banned}", a.path);
        }
        if a.path.ends_with(".html") {
            // Scripts only by `src` (the CSP has no 'unsafe-inline'), no inline handlers.
            assert!(
                !text.contains("<script>"),
                "{} has an inline script",
                a.path
            );
            assert!(
                !text.contains(" onclick="),
                "{} has an inline handler",
                a.path
            );
            assert!(!text.contains(" style="), "{} has an inline style", a.path);
        }
        if a.path.ends_with(".js") {
            // The key must never reach a URL or the console.
            assert!(!text.contains("console.log"), "{} logs", a.path);
            assert!(
                !text.contains("localStorage"),
                "{} persists beyond the tab",
                a.path
            );
        }
    }
}
