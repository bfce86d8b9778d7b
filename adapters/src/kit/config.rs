//! The parts of a pool's settings that many kinds take, declared once: the credential
//! reference with the CA bundle ([`pool_config!`]) and the `timeouts` table
//! ([`timeouts!`]). serde's `flatten` cannot be combined with `deny_unknown_fields`, so a
//! shared nested type would either change the documented flat keys or stop refusing unknown
//! ones; these macros write the shared keys into each kind's own struct instead, so the
//! wire format stays flat and a typo is still refused naming the key.

use std::time::Duration;

use crate::settings::{bad, ConfigError};

/// `request_seconds` -> `requestSeconds`: a field's key as written in settings.
fn camel(snake: &str) -> String {
    let mut out = String::with_capacity(snake.len());
    let mut upper = false;
    for c in snake.chars() {
        match c {
            '_' => upper = true,
            c if upper => {
                out.push(c.to_ascii_uppercase());
                upper = false;
            }
            c => out.push(c),
        }
    }
    out
}

/// The timeout `timeouts.<field>` as validated: `default` when unset, zero refused (a zero
/// timeout would fail every call).
pub(crate) fn timeout(
    value: Option<u64>,
    default: u64,
    unit: fn(u64) -> Duration,
    field: &str,
) -> Result<Duration, ConfigError> {
    match value.unwrap_or(default) {
        0 => bad(&format!("timeouts.{}", camel(field)), "must be at least 1"),
        n => Ok(unit(n)),
    }
}

/// Declares a kind's `TimeoutsConfig` (the `timeouts` table of its settings) from its fields,
/// each `field: from_secs(default)` or `field: from_millis(default)` after its doc comment.
/// Every value may be a number or its string form; unknown keys are refused. Each field gets
/// a method of the same name giving the validated [`Duration`].
macro_rules! timeouts {
    ($($(#[$doc:meta])* $field:ident: $unit:ident($default:literal)),+ $(,)?) => {
        /// Client timeouts (`timeouts`): every key optional, zero refused.
        #[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
        #[serde(rename_all = "camelCase", deny_unknown_fields, default)]
        pub struct TimeoutsConfig {
            $(
                $(#[$doc])*
                #[serde(deserialize_with = "crate::settings::opt_u64")]
                pub $field: Option<u64>,
            )+
        }

        impl TimeoutsConfig {
            $(
                #[doc = concat!("`", stringify!($field), "` as validated: ", stringify!($default), " when unset, zero refused.")]
                pub fn $field(
                    &self,
                ) -> Result<std::time::Duration, $crate::settings::ConfigError> {
                    $crate::kit::config::timeout(
                        self.$field,
                        $default,
                        std::time::Duration::$unit,
                        stringify!($field),
                    )
                }
            )+
        }
    };
}
pub(crate) use timeouts;

/// Declares a kind's settings struct (as written, `adapterSettings`) with its own fields plus
/// the credential reference every remote kind takes: `<prefix>Env`, `<prefix>File`,
/// `<prefix>Secret` (e.g. `apiKey…`, `token…`) and, where given, `caBundle`. Also derives what
/// every settings struct needs (camelCase keys, all defaulted, unknown keys refused) and a
/// `credential()` method that checks the reference (see
/// [`crate::settings::resolve_credential`]).
///
/// ```ignore
/// kit::pool_config! {
///     /// Settings of a `foo` pool.
///     pub struct FooConfig {
///         /// The API.
///         pub api_url: Option<String>,
///     }
///     credential("apiKey", "API key") { api_key_env, api_key_file, api_key_secret }
///     ca_bundle("PEM file of extra CA certificates.")
/// }
/// ```
macro_rules! pool_config {
    (
        $(#[$meta:meta])*
        pub struct $name:ident { $($fields:tt)* }
        credential($prefix:literal, $what:literal) { $env:ident, $file:ident, $secret:ident }
        $(ca_bundle($ca_doc:literal))?
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
        #[serde(rename_all = "camelCase", deny_unknown_fields, default)]
        pub struct $name {
            $($fields)*
            $(
                #[doc = $ca_doc]
                pub ca_bundle: Option<std::path::PathBuf>,
            )?
            #[doc = concat!("Credential by reference: the environment variable holding the ", $what, ".")]
            pub $env: Option<String>,
            #[doc = concat!("Credential by reference: a file holding the ", $what, " (re-read, so rotating the file works).")]
            pub $file: Option<std::path::PathBuf>,
            /// Credential by reference: the name of a secret stored sealed in Differently
            /// (`PUT /v1/admin/secrets/{name}`), replaceable at runtime.
            pub $secret: Option<String>,
        }

        impl $name {
            /// The credential reference, checked; env and file references are read now so a
            /// typo is refused at registration (the value is read again at call time).
            fn credential(
                &self,
            ) -> Result<
                ($crate::credentials::CredentialRef, Option<$crate::http::Secret>),
                $crate::settings::ConfigError,
            > {
                $crate::settings::resolve_credential(
                    $prefix,
                    $what,
                    self.$env.as_deref(),
                    self.$file.as_ref(),
                    self.$secret.as_deref(),
                )
            }
        }
    };
}
pub(crate) use pool_config;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_name_their_key_and_refuse_zero() {
        assert_eq!(camel("stream_idle_seconds"), "streamIdleSeconds");
        let e = timeout(Some(0), 30, Duration::from_secs, "request_seconds").unwrap_err();
        assert_eq!(e.field, "timeouts.requestSeconds");
        assert_eq!(
            timeout(None, 500, Duration::from_millis, "poll_millis").unwrap(),
            Duration::from_millis(500)
        );
        assert_eq!(
            timeout(Some(7), 30, Duration::from_secs, "ready_seconds").unwrap(),
            Duration::from_secs(7)
        );
    }
}
