//! The conformance kit (`conformance::run`, the checks a plugin must pass) against the
//! in-process adapters: `fake` with every optional capability it has, and `devhost` as it
//! runs by default (under bubblewrap, which scripts/test installs), each held to the
//! capabilities it declares.

use differently_adapters::conformance;
use differently_adapters::devhost::{DevhostAdapter, DevhostConfig, IsolationMode};
use differently_adapters::fake::{FakeAdapter, FakeConfig};
use differently_adapters::Adapter;

async fn passes(adapter: &dyn Adapter) -> conformance::Report {
    let declared = adapter.capabilities();
    let report = conformance::run(adapter, &declared).await;
    assert!(
        report.ok(),
        "{} fails the conformance kit ({:?}):\n{}",
        adapter.kind(),
        report.failures(),
        report.table()
    );
    report
}

#[tokio::test]
async fn the_fake_adapter_passes_the_conformance_kit() {
    let files = tempfile::tempdir().expect("tempdir");
    let a = FakeAdapter::new(FakeConfig {
        capabilities: [
            "exec.stream",
            "exec.stdin",
            "exec.pty",
            "files",
            "lifecycle.pause",
            "lifecycle.stop",
            "snapshots",
            "ports.expose",
        ]
        .map(String::from)
        .to_vec(),
        files_root: Some(files.path().to_path_buf()),
        ..FakeConfig::default()
    });
    let report = passes(&a).await;
    eprintln!("{}", report.table());
}

#[tokio::test]
async fn the_devhost_adapter_passes_the_conformance_kit() {
    let root = tempfile::tempdir().expect("tempdir");
    let a = DevhostAdapter::new(DevhostConfig {
        root: root.path().to_path_buf(),
        isolation: IsolationMode::Bwrap,
    });
    let report = passes(&a).await;
    eprintln!("{}", report.table());
}
