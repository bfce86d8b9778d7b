//! How pool settings become an adapter: the error a refused configuration gives, the one
//! settings parser (naming the offending key), and [`FromSettings`], which lets a registry
//! row build any kind with [`build`]. Shared by every kind and the registry, importing
//! neither, so dependencies run one way: registry -> kinds -> kit.

use std::sync::Arc;

use serde::de::DeserializeOwned;

use crate::credentials::Credentials;
use crate::settings::ConfigError;
use crate::{Adapter, SharedAdapter};

/// Why an adapter could not be built from its configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdapterConfigError {
    /// The pool names an adapter kind this build does not have; `known` lists those it has.
    #[error("unknown adapter kind `{kind}` (known: {known})")]
    UnknownKind { kind: String, known: String },
    /// The settings do not fit the kind; `field` names the offending setting when known.
    #[error("invalid settings for adapter `{kind}`{}: {message}", field.as_ref().map(|f| format!(", field `{f}`")).unwrap_or_default())]
    InvalidSettings {
        kind: String,
        field: Option<String>,
        message: String,
    },
}

impl ConfigError {
    /// The error as the registry reports it: the type is shared by every kind, so the kind
    /// is named by the caller, not by a `From` impl.
    pub fn for_kind(self, kind: &str) -> AdapterConfigError {
        AdapterConfigError::InvalidSettings {
            kind: kind.to_owned(),
            field: Some(self.field),
            message: self.message,
        }
    }
}

/// An adapter built from its kind's settings document and the credential source; what a
/// registry row needs to construct it with [`build`].
pub trait FromSettings: Adapter + Sized {
    /// The `adapter` name pools use.
    const KIND: &'static str;
    /// The settings as written (`adapterSettings`); every key defaulted so [`parse`] can
    /// name a bad one.
    type Config: DeserializeOwned;

    /// Validates `config` and builds the adapter; credentials resolve through `credentials`
    /// at call time, so a replaced secret is used without a rebuild.
    fn from_config(config: Self::Config, credentials: &Credentials) -> Result<Self, ConfigError>;
}

/// Declares an HTTP provider's adapter a kind built from settings: its [`FromSettings`]
/// impl (through the adapter's own `with_credentials(config, credentials)`) and `new(config)`,
/// the same build with no stored-secret source. One line per provider instead of the same
/// two constructors written out in each.
///
/// With `Config => Settings, |settings, credentials| { … }` it also writes
/// `with_credentials` (validate, then the block builds `Self` from the validated settings),
/// the `settings()` accessor and a `Debug` showing only the settings (whose credential
/// prints as `***`), for an adapter that keeps them in a `settings` field.
/// With `Config, infallible` the adapter's own `new(config) -> Self` builds it (local kinds
/// with no credential).
macro_rules! from_settings {
    ($adapter:ty, $kind:expr, $config:ty => $settings_ty:ty, |$settings:ident, $credentials:ident| $build:block) => {
        $crate::kit::from_settings!($adapter, $kind, $config);

        impl $adapter {
            /// Validates `config` and builds the adapter; the credential is read through
            /// `credentials` when calls are made, so a replaced secret or rotated file is used
            /// without a rebuild.
            pub fn with_credentials(
                config: $config,
                $credentials: &$crate::credentials::Credentials,
            ) -> Result<Self, $crate::settings::ConfigError> {
                let $settings = config.validate()?;
                $build
            }

            /// The validated settings (a credential inside prints as `***`).
            pub fn settings(&self) -> &$settings_ty {
                &self.settings
            }
        }

        impl std::fmt::Debug for $adapter {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($adapter))
                    .field("settings", &self.settings)
                    .finish_non_exhaustive()
            }
        }
    };
    ($adapter:ty, $kind:expr, $config:ty, infallible) => {
        impl $crate::kit::FromSettings for $adapter {
            const KIND: &'static str = $kind;
            type Config = $config;

            fn from_config(
                config: $config,
                _credentials: &$crate::credentials::Credentials,
            ) -> Result<Self, $crate::settings::ConfigError> {
                Ok(Self::new(config))
            }
        }
    };
    ($adapter:ty, $kind:expr, $config:ty) => {
        impl $crate::kit::FromSettings for $adapter {
            const KIND: &'static str = $kind;
            type Config = $config;

            fn from_config(
                config: $config,
                credentials: &$crate::credentials::Credentials,
            ) -> Result<Self, $crate::settings::ConfigError> {
                Self::with_credentials(config, credentials)
            }
        }

        impl $adapter {
            /// Validates `config` and builds the adapter with no stored-secret source (enough
            /// for checking settings, and for env and file credentials).
            pub fn new(config: $config) -> Result<Self, $crate::settings::ConfigError> {
                Self::with_credentials(config, &$crate::credentials::Credentials::default())
            }
        }
    };
}
pub(crate) use from_settings;

/// Parses `settings` as `A`'s configuration and builds `A`: the registry row of every kind
/// that implements [`FromSettings`].
pub fn build<A: FromSettings>(
    settings: &serde_json::Value,
    credentials: &Credentials,
) -> Result<SharedAdapter, AdapterConfigError> {
    let config = parse::<A::Config>(A::KIND, settings)?;
    let adapter = A::from_config(config, credentials).map_err(|e| e.for_kind(A::KIND))?;
    Ok(Arc::new(adapter))
}

/// Deserializes settings (`null` means all defaults); when serde's message does not say
/// which field is wrong (type errors do not), each key is tried alone to find it. Every
/// config field is defaulted, so a one-key object fails only if that key is bad.
pub fn parse<T: DeserializeOwned>(
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

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields, default, rename_all = "camelCase")]
    #[derive(Default)]
    struct Cfg {
        #[allow(dead_code)]
        latency_ms: Option<u64>,
        #[allow(dead_code)]
        on: Option<bool>,
    }

    #[test]
    fn parse_names_the_bad_key_and_refuses_non_objects() {
        match parse::<Cfg>("k", &serde_json::json!({"latencyMs": "slow", "on": true})) {
            Err(AdapterConfigError::InvalidSettings { kind, field, .. }) => {
                assert_eq!((kind.as_str(), field.as_deref()), ("k", Some("latencyMs")));
            }
            other => panic!("{other:?}"),
        }
        assert!(parse::<Cfg>("k", &serde_json::Value::Null).is_ok());
        let e = parse::<Cfg>("k", &serde_json::json!([1])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid settings for adapter `k`: settings must be a JSON object"
        );
    }

    #[test]
    fn a_config_error_names_its_kind_and_field() {
        let e = ConfigError {
            field: "apiKeySecret".into(),
            message: "no".into(),
        };
        assert_eq!(
            e.for_kind("daytona").to_string(),
            "invalid settings for adapter `daytona`, field `apiKeySecret`: no"
        );
    }
}
