//! What the built-in adapter kinds share in checking their pool settings: the error naming
//! the offending key, the credential reference (`<prefix>Env`, `<prefix>File`,
//! `<prefix>Secret`), base URLs, CA bundles, timeouts (the `timeouts` table: `kit::config`)
//! and the string forms pool settings often carry. One copy, so every kind refuses the same
//! mistake with the same words.

use std::path::PathBuf;
use std::time::Duration;

use differently_core::pool::valid_secret_name;
use serde::{Deserialize, Deserializer};

use crate::credentials::CredentialRef;
use crate::http::Secret;

/// Why a pool's settings were refused; `field` is the offending key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ConfigError {
    pub field: String,
    pub message: String,
}

impl ConfigError {
    /// The same refusal, blamed on `to` where it blamed `from` (the kit's client builder
    /// names `apiURL`; a kind whose base URL has another key renames it).
    pub(crate) fn renamed(self, from: &str, to: &str) -> ConfigError {
        ConfigError {
            field: if self.field == from {
                to.to_owned()
            } else {
                self.field
            },
            message: self.message,
        }
    }
}

/// Refuses `field` with `message`.
pub(crate) fn bad<T>(field: &str, message: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError {
        field: field.to_owned(),
        message: message.into(),
    })
}

/// Checks the one credential reference (`<prefix>Env`, `<prefix>File`, `<prefix>Secret`,
/// e.g. `apiKey…` or Vercel's `token…`; `what` is the credential's name in messages) and, for
/// env and file references, that it resolves now to a usable value, so a typo is refused at
/// registration naming the key, never the value. A stored secret may be stored after the
/// pool is registered: only its name is checked.
pub(crate) fn resolve_credential(
    prefix: &str,
    what: &str,
    env: Option<&str>,
    file: Option<&PathBuf>,
    secret: Option<&str>,
) -> Result<(CredentialRef, Option<Secret>), ConfigError> {
    let (env_f, file_f, secret_f) = (
        format!("{prefix}Env"),
        format!("{prefix}File"),
        format!("{prefix}Secret"),
    );
    let env = env.filter(|e| !e.is_empty());
    let secret = secret.filter(|s| !s.is_empty());
    let given = [env.is_some(), file.is_some(), secret.is_some()];
    if given.iter().filter(|g| **g).count() > 1 {
        let field = if secret.is_some() { &secret_f } else { &file_f };
        return bad(
            field,
            format!("give one of {env_f}, {file_f} or {secret_f}, not several"),
        );
    }
    let (credential, field, raw) = match (env, file, secret) {
        (Some(var), _, _) => match std::env::var(var) {
            Ok(v) => (CredentialRef::Env(var.to_owned()), &env_f, v),
            Err(_) => return bad(&env_f, format!("environment variable `{var}` is not set")),
        },
        (_, Some(path), _) => match std::fs::read_to_string(path) {
            Ok(v) => (CredentialRef::File(path.clone()), &file_f, v),
            Err(e) => {
                return bad(
                    &file_f,
                    format!("cannot read {}: {}", path.display(), e.kind()),
                )
            }
        },
        (_, _, Some(name)) => {
            if !valid_secret_name(name) {
                return bad(
                    &secret_f,
                    "a stored secret's name: 1-63 characters of a-z, 0-9, '.', '_' or '-', starting with a letter or digit",
                );
            }
            return Ok((CredentialRef::Secret(name.to_owned()), None));
        }
        (None, None, None) => {
            return bad(
                &env_f,
                format!(
                    "the {what} is required, by reference: {env_f} (variable name), {file_f} (path) or {secret_f} (stored secret name)"
                ),
            )
        }
    };
    match Secret::parse(raw.trim()) {
        Ok(key) => Ok((credential, Some(key))),
        Err(why) => bad(field, format!("the referenced {what} {why}")),
    }
}

/// A plain `http(s)://host[:port][/path]` base URL without credentials, query or fragment,
/// returned without a trailing slash.
pub(crate) fn base_url(field: &str, url: &str) -> Result<String, ConfigError> {
    let url = url.trim();
    let Some(rest) = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
    else {
        return bad(field, "must start with http:// or https://");
    };
    let authority = rest.split('/').next().unwrap_or("");
    if authority.is_empty() {
        return bad(field, "has no host");
    }
    if authority.contains('@') {
        return bad(
            field,
            "must not carry credentials; use apiKeyEnv, apiKeyFile or apiKeySecret",
        );
    }
    if url.contains('?') || url.contains('#') || url.chars().any(char::is_whitespace) {
        return bad(field, "must be a plain base URL without query or fragment");
    }
    Ok(url.trim_end_matches('/').to_owned())
}

/// [`base_url`], with `default` when `value` is absent or blank.
pub(crate) fn base_url_or(
    field: &str,
    value: Option<&str>,
    default: &str,
) -> Result<String, ConfigError> {
    match value.map(str::trim) {
        None | Some("") => base_url(field, default),
        Some(u) => base_url(field, u),
    }
}

/// The extra CA certificates of `caBundle` (none when it is not set), read at validation so
/// a missing or broken file is refused at registration.
pub(crate) fn ca_bundle(path: Option<&PathBuf>) -> Result<Vec<reqwest::Certificate>, ConfigError> {
    match path {
        None => Ok(Vec::new()),
        Some(path) => match crate::http::read_ca_bundle(path) {
            Ok(certs) => Ok(certs),
            Err(e) => bad("caBundle", e.to_string()),
        },
    }
}

/// A timeout in whole seconds, `default` when unset; zero is refused.
pub(crate) fn seconds(v: Option<u64>, default: u64, field: &str) -> Result<Duration, ConfigError> {
    match v.unwrap_or(default) {
        0 => bad(field, "must be at least 1"),
        n => Ok(Duration::from_secs(n)),
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum BoolOrString {
    Bool(bool),
    Str(String),
}

/// A boolean, or its string form (`"true"`), as pool settings often carry.
pub(crate) fn opt_bool<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    match Option::<BoolOrString>::deserialize(d)? {
        None => Ok(None),
        Some(BoolOrString::Bool(b)) => Ok(Some(b)),
        Some(BoolOrString::Str(s)) => match s.trim() {
            "true" => Ok(Some(true)),
            "false" => Ok(Some(false)),
            other => Err(serde::de::Error::custom(format!(
                "expected true or false, got `{other}`"
            ))),
        },
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum NumOrString {
    Num(u64),
    Str(String),
}

/// A whole number, or its string form (`"30"`).
pub(crate) fn opt_u64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    match Option::<NumOrString>::deserialize(d)? {
        None => Ok(None),
        Some(NumOrString::Num(n)) => Ok(Some(n)),
        Some(NumOrString::Str(s)) => {
            s.trim().parse().map(Some).map_err(|_| {
                serde::de::Error::custom(format!("expected a whole number, got `{s}`"))
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kit::AdapterConfigError;

    #[test]
    fn errors_name_the_prefixed_field_and_the_kind() {
        let e = resolve_credential("token", "access token", None, None, None).unwrap_err();
        assert_eq!(e.field, "tokenEnv");
        assert!(e.message.contains("the access token is required"), "{e}");
        assert!(e.message.contains("tokenFile") && e.message.contains("tokenSecret"));
        let e = resolve_credential("apiKey", "API key", Some("X"), None, Some("k")).unwrap_err();
        assert_eq!(e.field, "apiKeySecret");
        let e =
            resolve_credential("apiKey", "API key", None, None, Some("Not A Name")).unwrap_err();
        assert_eq!(e.field, "apiKeySecret");
        let (r, key) = resolve_credential("apiKey", "API key", None, None, Some("k")).unwrap();
        assert_eq!(
            (r, key.is_none()),
            (CredentialRef::Secret("k".into()), true)
        );
        match e.for_kind("daytona") {
            AdapterConfigError::InvalidSettings { kind, field, .. } => {
                assert_eq!(
                    (kind.as_str(), field.as_deref()),
                    ("daytona", Some("apiKeySecret"))
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
