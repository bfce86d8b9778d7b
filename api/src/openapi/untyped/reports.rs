//! The trust report (`routes::trust`), written here because its pools flatten the adapters'
//! verification status (`differently_adapters`, which derives no schemas) into nested objects.

use differently_core::pool::{PoolSource, Trust};
use serde_json::{json, Map, Value};

use super::{
    array_of, backend_fields, nullable, one_of_strings, reference, served, time, time_or_null,
    typed,
};
use crate::openapi::wire;

/// Adds the trust report's schema to `s`.
pub(super) fn add(s: &mut Map<String, Value>) {
    let count = || json!({ "type": "integer", "minimum": 0 });
    let credential = served(&[
        (
            "kind",
            one_of_strings(["env", "file", "secret", "inline"].map(|k| json!(k))),
        ),
        ("setting", typed("string")),
        ("reference", typed("string")),
        ("name", nullable("string")),
        ("fingerprint", nullable("string")),
        ("updatedBy", nullable("string")),
        ("updatedAt", time_or_null()),
        ("problem", nullable("string")),
    ]);
    let mut trust_pool = vec![
        ("name", typed("string")),
        ("kind", typed("string")),
        (
            "trust",
            one_of_strings([Trust::Private, Trust::External].map(wire)),
        ),
        ("region", nullable("string")),
        ("isolation", typed("string")),
        ("egress", typed("string")),
        ("endpoint", nullable("string")),
        ("credentials", array_of(credential)),
        (
            "source",
            one_of_strings([PoolSource::Config, PoolSource::Api].map(wire)),
        ),
        ("healthy", typed("boolean")),
        (
            "health",
            json!({ "anyOf": [reference("PoolHealth"), { "type": "null" }] }),
        ),
        ("warm", array_of(reference("WarmClassStatus"))),
    ];
    trust_pool.extend(backend_fields());
    let trust_pool = served(&trust_pool);
    let external = served(&[
        ("orgId", typed("string")),
        ("orgName", nullable("string")),
        ("pool", typed("string")),
        ("sandboxes", count()),
        ("firstAt", time()),
        ("lastAt", time()),
        (
            "policy",
            json!({ "anyOf": [reference("EffectivePolicy"), { "type": "null" }] }),
        ),
    ]);
    s.insert(
        "TrustReport".to_owned(),
        served(&[
            ("generatedAt", time()),
            ("installationId", typed("string")),
            ("telemetry", typed("string")),
            ("pools", array_of(trust_pool)),
            ("externalPlacements", array_of(external)),
            ("notEnforced", array_of(typed("string"))),
        ]),
    );
}
