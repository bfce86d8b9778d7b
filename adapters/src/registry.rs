//! Builds an adapter from a pool's `adapter` kind and `adapterSettings` JSON, so the API,
//! the workers and the CLI construct adapters the same way and reject bad settings the same way.

use std::sync::Arc;

use serde::de::DeserializeOwned;

use crate::credentials::Credentials;
use crate::devhost::{DevhostAdapter, DevhostConfig};
use crate::fake::{FakeAdapter, FakeConfig};
use crate::SharedAdapter;

/// Adapter kinds this build can construct.
pub const KNOWN_KINDS: &[&str] = &["fake", "devhost", "opensandbox"];

/// Why an adapter could not be built from its configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdapterConfigError {
    /// The pool names an adapter kind this build does not have.
    #[error("unknown adapter kind `{0}` (known: fake, devhost, opensandbox)")]
    UnknownKind(String),
    /// The settings do not fit the kind; `field` names the offending setting when known.
    #[error("invalid settings for adapter `{kind}`{}: {message}", field.as_ref().map(|f| format!(", field `{f}`")).unwrap_or_default())]
    InvalidSettings {
        kind: String,
        field: Option<String>,
        message: String,
    },
}

/// Constructs the adapter of `kind` from `settings` (`null` means all defaults), with no
/// stored-secret source: enough to validate settings; a `secret:` credential of an adapter
/// built this way fails at call time.
pub fn build(
    kind: &str,
    settings: &serde_json::Value,
) -> Result<SharedAdapter, AdapterConfigError> {
    build_with(kind, settings, &Credentials::default())
}

/// Constructs the adapter of `kind`, resolving credential references through `credentials`
/// at call time (so a replaced secret is used without rebuilding the adapter).
pub fn build_with(
    kind: &str,
    settings: &serde_json::Value,
    credentials: &Credentials,
) -> Result<SharedAdapter, AdapterConfigError> {
    match kind {
        "fake" => Ok(Arc::new(FakeAdapter::new(parse::<FakeConfig>(
            kind, settings,
        )?))),
        "devhost" => Ok(Arc::new(DevhostAdapter::new(parse::<DevhostConfig>(
            kind, settings,
        )?))),
        "opensandbox" => Ok(Arc::new(
            crate::opensandbox::OpenSandboxAdapter::with_credentials(
                parse(kind, settings)?,
                credentials,
            )?,
        )),
        other => Err(AdapterConfigError::UnknownKind(other.to_owned())),
    }
}

/// Deserializes settings; when serde's message does not say which field is wrong (type
/// errors do not), each key is tried alone to find it. Every config field is defaulted, so
/// a one-key object fails only if that key is bad.
fn parse<T: DeserializeOwned>(
    kind: &str,
    settings: &serde_json::Value,
) -> Result<T, AdapterConfigError> {
    let invalid = |field: Option<String>, message: String| AdapterConfigError::InvalidSettings {
        kind: kind.to_owned(),
        field,
        message,
    };
    let value = match settings {
        serde_json::Value::Null => serde_json::Value::Object(Default::default()),
        serde_json::Value::Object(_) => settings.clone(),
        _ => return Err(invalid(None, "settings must be a JSON object".to_owned())),
    };
    serde_json::from_value::<T>(value).map_err(|e| {
        let message = e.to_string();
        let field = settings.as_object().and_then(|obj| {
            obj.iter().find_map(|(k, v)| {
                let one = serde_json::json!({ k: v });
                serde_json::from_value::<T>(one).is_err().then(|| k.clone())
            })
        });
        invalid(field, message)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_known_kinds_with_defaults() {
        let a = build("fake", &serde_json::Value::Null).expect("fake");
        assert_eq!(a.kind(), "fake");
        let a = build("devhost", &serde_json::json!({"root": "/tmp/x"})).expect("devhost");
        assert_eq!(a.kind(), "devhost");
    }

    #[test]
    fn errors_name_the_kind_or_field() {
        let e = build("opensandboxx", &serde_json::Value::Null)
            .err()
            .map(|e| e.to_string());
        assert!(e.is_some_and(|m| m.contains("opensandboxx")));

        let e = build(
            "fake",
            &serde_json::json!({"latencyMs": "slow", "unavailable": true}),
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(e.contains("`latencyMs`"), "{e}");

        let e = build("devhost", &serde_json::json!({"rooot": "/tmp"}))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("rooot"), "{e}");

        assert!(build("fake", &serde_json::json!([1])).is_err());
    }
}
