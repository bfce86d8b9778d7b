//! The objects whose schemas are still written here rather than generated from a type, each
//! for a reason given where it is added: an answer of a crate that derives no schemas (the
//! adapters' file listing), the placement explanation (a tagged enum flattened into one flat
//! object, stored as JSON), and documents of their own (the public event envelope, an event's
//! JSON Schema, this document).

use differently_core::accounting::Wall;
use differently_core::ErrorCode;
use serde_json::{json, Map, Value};

use super::components::reference;
pub(super) fn typed(ty: &str) -> Value {
    json!({ "type": ty })
}

pub(super) fn time() -> Value {
    json!({ "type": "string", "format": "date-time" })
}

pub(super) fn time_or_null() -> Value {
    json!({ "type": ["string", "null"], "format": "date-time" })
}

pub(super) fn array_of(items: Value) -> Value {
    json!({ "type": "array", "items": items })
}

pub(super) fn one_of_strings(values: impl IntoIterator<Item = Value>) -> Value {
    json!({ "type": "string", "enum": values.into_iter().collect::<Vec<_>>() })
}

/// An object whose listed properties are all present (as the API serves them).
pub(super) fn served(props: &[(&str, Value)]) -> Value {
    object(props, true)
}

/// An object the API serves whose properties are all present except `optional` (left out
/// when empty or not applicable).
pub(super) fn served_except(props: &[(&str, Value)], optional: &[&str]) -> Value {
    let mut o = object(props, false);
    o["required"] = json!(props
        .iter()
        .map(|(n, _)| *n)
        .filter(|n| !optional.contains(n))
        .collect::<Vec<_>>());
    o
}

fn object(props: &[(&str, Value)], all_required: bool) -> Value {
    let mut properties = Map::new();
    for (name, schema) in props {
        properties.insert((*name).to_owned(), schema.clone());
    }
    let mut o = json!({ "type": "object", "properties": properties });
    if all_required {
        o["required"] = json!(props.iter().map(|(n, _)| *n).collect::<Vec<_>>());
    }
    o
}

/// An object this document describes only in prose (see docs/api.md).
pub(super) fn described(description: &str) -> Value {
    json!({ "type": "object", "description": description })
}

/// Adds the hand-written schemas to `s`, which holds the generated ones.
pub(super) fn add(s: &mut Map<String, Value>) {
    // The adapters' listing entries (`differently_adapters`, which derives no schemas).
    s.insert(
        "FileList".to_owned(),
        served(&[(
            "items",
            array_of(served(&[
                ("path", typed("string")),
                ("type", typed("string")),
                ("size", typed("integer")),
                ("mode", typed("integer")),
                ("modifiedAt", time_or_null()),
            ])),
        )]),
    );
    // The public event contract, from the definitions the events are built from.
    s.insert(
        "PublicEvent".to_owned(),
        differently_bus_schema::public::envelope_schema(),
    );
    // A document of its own: a JSON Schema per event type (`EventSchemaList` refers to it).
    s.insert(
        "EventSchema".to_owned(),
        described("A JSON Schema (draft 2020-12) of one public event type."),
    );
    // `core::policy::explain`: the decision flattened with every pool's verdict. Not derived:
    // `Decision` is a tagged enum flattened into `Explained`, which utoipa would state as a
    // `oneOf` of three objects, not the one flat object the SDKs model; and `Placement` is
    // the explanation as stored (`Explained::record`, JSON with the policy and time added).
    let decision_fields = || {
        vec![
            (
                "decision",
                one_of_strings(["placed", "waiting", "rejected"].map(|d| json!(d))),
            ),
            ("pool", typed("string")),
            (
                "code",
                one_of_strings(ErrorCode::ALL.map(|c| json!(c.as_str()))),
            ),
            ("reason", typed("string")),
            ("pools", array_of(reference("PoolVerdict"))),
        ]
    };
    // A dry run a quota keeps waiting names its wall too (`placement_decision::dry_run`).
    let mut dry_run = decision_fields();
    dry_run.push(("wall", one_of_strings(Wall::ALL.map(|w| json!(w.as_str())))));
    s.insert(
        "DryRun".to_owned(),
        served_except(&dry_run, &["pool", "code", "reason", "wall"]),
    );
    let mut placement = decision_fields();
    placement.extend([
        ("policy", reference("EffectivePolicy")),
        ("decidedAt", time()),
        // A waiting explanation names the limit it waits behind (`scheduler::placement`).
        ("wall", one_of_strings(Wall::ALL.map(|w| json!(w.as_str())))),
    ]);
    s.insert(
        "Placement".to_owned(),
        served_except(&placement, &["pool", "code", "reason", "wall"]),
    );
    // `GET /v1/openapi.json`: this document itself.
    s.insert("OpenApi".to_owned(), described("This document."));
}
