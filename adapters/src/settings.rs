//! What the built-in adapter kinds share in checking their pool settings: the error naming
//! the offending key and the credential reference (`<prefix>Env`, `<prefix>File`,
//! `<prefix>Secret`). One copy, so every kind refuses the same mistake with the same words.

use std::path::PathBuf;

use differently_core::pool::valid_secret_name;

use crate::credentials::CredentialRef;
use crate::http::Secret;
use crate::registry::AdapterConfigError;

/// Why a pool's settings were refused; `field` is the offending key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ConfigError {
    pub field: String,
    pub message: String,
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

/// The `apiKeyEnv`/`apiKeyFile`/`apiKeySecret` reference most kinds take.
pub(crate) fn resolve_api_key(
    env: Option<&str>,
    file: Option<&PathBuf>,
    secret: Option<&str>,
) -> Result<(CredentialRef, Option<Secret>), ConfigError> {
    resolve_credential("apiKey", "API key", env, file, secret)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_prefixed_field_and_the_kind() {
        let e = resolve_credential("token", "access token", None, None, None).unwrap_err();
        assert_eq!(e.field, "tokenEnv");
        assert!(e.message.contains("the access token is required"), "{e}");
        assert!(e.message.contains("tokenFile") && e.message.contains("tokenSecret"));
        let e = resolve_api_key(Some("X"), None, Some("k")).unwrap_err();
        assert_eq!(e.field, "apiKeySecret");
        let e = resolve_api_key(None, None, Some("Not A Name")).unwrap_err();
        assert_eq!(e.field, "apiKeySecret");
        let (r, key) = resolve_api_key(None, None, Some("k")).unwrap();
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
