//! The objects whose schemas are still written here rather than generated from a type, each
//! for a reason given where it is added: answers a handler assembles as JSON or from types of
//! crates that do not derive schemas (store records, adapter listings), and documents of their
//! own (the public event envelope, event schemas, this document). A composite (`Pool`)
//! starts from its generated component, so a field added to the type reaches it too.

use differently_core::accounting::Wall;
use differently_core::ErrorCode;
use serde_json::{json, Map, Value};

use super::components::reference;
use super::wire;

mod reports;

pub(super) fn typed(ty: &str) -> Value {
    json!({ "type": ty })
}

pub(super) fn nullable(ty: &str) -> Value {
    json!({ "type": [ty, "null"] })
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

/// A pool's backend as its adapter knows it (`api::routes::pools::Backend`), served by the
/// pools admin and the trust report.
pub(super) fn backend_fields() -> Vec<(&'static str, Value)> {
    use differently_adapters::VerifiedStatus as V;
    vec![
        (
            "backendVersion",
            json!({ "type": ["string", "null"], "description": "The backend version this \
                API process's adapter last detected; null before its first call or when the \
                backend does not say." }),
        ),
        (
            "verified",
            one_of_strings([V::Live, V::Replayed, V::FakeOnly, V::Unknown].map(wire)),
        ),
        ("verifiedBasis", typed("string")),
    ]
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

/// A page of `item`s.
pub(super) fn page_of(item: &str) -> Value {
    served(&[
        ("items", array_of(reference(item))),
        ("nextCursor", nullable("string")),
    ])
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
    // Documents of their own: a JSON Schema per event type, and the list of them.
    s.insert(
        "EventSchema".to_owned(),
        described("A JSON Schema (draft 2020-12) of one public event type."),
    );
    s.insert(
        "EventSchemaList".to_owned(),
        served(&[
            ("version", typed("integer")),
            ("envelope", reference("EventSchema")),
            (
                "items",
                json!({ "type": "array", "items": served(&[
                    ("type", typed("string")),
                    ("schema", reference("EventSchema")),
                ]) }),
            ),
        ]),
    );
    // `core::policy::explain`: the decision flattened with every pool's verdict, as JSON.
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
    s.insert(
        "DryRun".to_owned(),
        served_except(&decision_fields(), &["pool", "code", "reason"]),
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
    // A page of `Pool`s, which `routes::pools` assembles around a JSON record (below).
    s.insert("PoolList".to_owned(), page_of("Pool"));
    s.insert("OpenApi".to_owned(), described("This document."));
    composites(s);
    reports::add(s);
}

/// Generated components with what a handler adds to them.
fn composites(s: &mut Map<String, Value>) {
    // `routes::pools`: the record, flattened, with its backend and live state.
    let mut pool = s["PoolRecord"].clone();
    let mut live = vec![("capabilities", array_of(typed("string")))];
    live.extend(backend_fields());
    live.extend([
        ("healthy", typed("boolean")),
        (
            "health",
            json!({ "anyOf": [reference("PoolHealth"), { "type": "null" }] }),
        ),
        ("usedSlots", typed("integer")),
    ]);
    extend(&mut pool, live, true);
    s.insert("Pool".to_owned(), pool);
}

/// Adds `props` to an object schema, `required` with `all_required`.
fn extend(schema: &mut Value, props: Vec<(&str, Value)>, all_required: bool) {
    for (name, p) in props {
        schema["properties"][name] = p;
        if all_required {
            if let Some(required) = schema["required"].as_array_mut() {
                required.push(json!(name));
            }
        }
    }
}
