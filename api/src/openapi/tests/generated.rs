//! `docs/openapi.json` is the served document, committed so the SDKs' models are generated
//! from it (`scripts/gen-sdk-models`) and a change to the contract shows in review.

use super::*;

/// The committed document's path.
const COMMITTED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json");

/// `value` with every object's keys sorted, as the committed file has them.
fn sorted(value: &Value) -> Value {
    match value {
        Value::Object(o) => {
            let keys: BTreeSet<&String> = o.keys().collect();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), sorted(&o[k])))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

#[test]
fn the_committed_document_is_the_served_one() {
    let served = serde_json::to_string_pretty(&sorted(document())).expect("serializes") + "\n";
    if std::env::var_os("DIFFERENTLY_BLESS").is_some() {
        std::fs::write(COMMITTED, &served).expect("writes docs/openapi.json");
        return;
    }
    let committed = std::fs::read_to_string(COMMITTED).unwrap_or_default();
    if committed != served {
        let line = committed
            .lines()
            .zip(served.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| committed.lines().count().min(served.lines().count()));
        panic!(
            "docs/openapi.json is not the document this build serves (first difference at \
             line {}). Regenerate it with\n  DIFFERENTLY_BLESS=1 cargo test -p differently-api \
             --lib openapi::tests::generated\nthen `scripts/gen-sdk-models` for the SDKs' models.",
            line + 1
        );
    }
}

#[test]
fn every_fact_lands_on_a_field() {
    let (_, missed) = components::generated();
    assert!(
        missed.is_empty(),
        "facts about fields the types do not have (renamed or removed?): {missed:?}"
    );
}

/// The generated components follow the document's conventions: no Rust widths, prose only
/// where the facts put it.
#[test]
fn generated_components_carry_no_rust_details() {
    let (generated, _) = components::generated();
    let text = serde_json::to_string(&generated).expect("serializes");
    for width in ["\"int32\"", "\"int64\"", "\"double\"", "\"float\""] {
        assert!(!text.contains(width), "{width} in {text}");
    }
    assert!(
        !text.contains("\"oneOf\""),
        "utoipa's nullable form is left: {text}"
    );
}
