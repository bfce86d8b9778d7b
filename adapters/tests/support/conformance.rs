//! The conformance kit (`differently_adapters::conformance::run`) held against a built-in
//! adapter over its fake: the same checks a plugin must pass, with the capabilities the
//! adapter declares, so a capability it claims but does not honour (or one it honours but
//! does not declare, where the kit can tell) fails here.

use differently_adapters::conformance;
use differently_adapters::Adapter;

/// Runs the kit against `adapter` with its own declared capabilities and fails the test
/// with the whole report on any failed check.
pub async fn passes(adapter: &dyn Adapter) -> conformance::Report {
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
