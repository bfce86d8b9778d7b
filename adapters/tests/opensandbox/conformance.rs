//! The conformance kit against the OpenSandbox adapter over the fake server, as each server
//! version behaves (1.1.1 through the server proxy; 1.3 on execd's direct endpoints with
//! per-sandbox tokens), and on the Fast Sandbox runtime.

use crate::fake_server::{FakeRuntime, Variant};
use crate::fake_versions::FakeVersion;
use crate::{setup, support};

async fn passes(version: FakeVersion, runtime: FakeRuntime) {
    let s = setup(Variant::Real, runtime, serde_json::json!({})).await;
    // Before the adapter's first call, which detects the version.
    s.fake.set_version(version);
    let report = support::conformance::passes(&s.adapter).await;
    eprintln!("{version:?} {runtime:?}\n{}", report.table());
}

#[tokio::test]
async fn the_conformance_kit_passes_on_1_1_1() {
    passes(FakeVersion::V1_1_1, FakeRuntime::Docker).await;
}

#[tokio::test]
async fn the_conformance_kit_passes_on_1_3() {
    passes(FakeVersion::V1_3, FakeRuntime::Docker).await;
}

#[tokio::test]
async fn the_conformance_kit_passes_on_fast_sandbox() {
    passes(FakeVersion::V1_3, FakeRuntime::Fastsandbox).await;
}
