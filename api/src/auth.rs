//! API keys (`dly_<keyid>_<secret>`) and the authenticated principal.
//!
//! Only a SHA-256 hash of a key is kept; comparison is constant-time. Today one bootstrap
//! admin key from configuration authenticates (full tenancy with stored keys comes later).

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use differently_core::{ErrorCode, OrgId, ProjectId};
use rand::Rng;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::ApiError;
use crate::AppState;

const KEY_PREFIX: &str = "dly_";
const SECRET_LEN: usize = 40;
const SECRET_ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// A key split into its public id and its secret; never logged whole.
pub struct ParsedKey<'a> {
    pub key_id: &'a str,
    pub secret: &'a str,
}

/// Checks the key's shape before any lookup, so garbage never reaches the database.
pub fn parse_key(token: &str) -> Option<ParsedKey<'_>> {
    let rest = token.strip_prefix(KEY_PREFIX)?;
    let (key_id, secret) = rest.rsplit_once('_')?;
    differently_core::KeyId::parse(key_id).ok()?;
    let ok = secret.len() == SECRET_LEN && secret.bytes().all(|b| SECRET_ALPHABET.contains(&b));
    ok.then_some(ParsedKey { key_id, secret })
}

/// A new random key. The caller shows it once and keeps only `hash_key` of it.
pub fn generate_key() -> String {
    let mut rng = rand::rng();
    let secret: String = (0..SECRET_LEN)
        .map(|_| SECRET_ALPHABET[rng.random_range(0..SECRET_ALPHABET.len())] as char)
        .collect();
    format!("{KEY_PREFIX}{}_{secret}", differently_core::KeyId::new())
}

/// SHA-256 of the whole key.
pub fn hash_key(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// The configured bootstrap admin key, held as its id and hash only.
#[derive(Clone)]
pub struct BootstrapKey {
    key_id: String,
    hash: [u8; 32],
}

impl BootstrapKey {
    /// Validates the configured key's format.
    pub fn from_key(token: &str) -> Result<BootstrapKey, String> {
        let parsed = parse_key(token).ok_or_else(|| {
            "bootstrapKey: expected dly_key_<ulid>_<40 alphanumeric characters> \
             (generate one with `differently key generate`)"
                .to_owned()
        })?;
        Ok(BootstrapKey {
            key_id: parsed.key_id.to_owned(),
            hash: hash_key(token),
        })
    }

    fn matches(&self, token: &str) -> bool {
        let Some(parsed) = parse_key(token) else {
            return false;
        };
        let same_id = parsed.key_id.as_bytes().ct_eq(self.key_id.as_bytes());
        let same_hash = hash_key(token).ct_eq(&self.hash);
        (same_id & same_hash).into()
    }
}

/// Who is calling: a key bound to an organization and a project.
#[derive(Debug, Clone)]
pub struct Principal {
    pub key_id: String,
    pub org_id: OrgId,
    pub project_id: ProjectId,
    pub admin: bool,
}

impl FromRequestParts<AppState> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let unauthenticated =
            || ApiError::new(ErrorCode::Unauthenticated, "missing or invalid API key");
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(unauthenticated)?;
        let token = header
            .strip_prefix("Bearer ")
            .ok_or_else(unauthenticated)?
            .trim();
        if !state.bootstrap_key.matches(token) {
            return Err(unauthenticated());
        }
        Ok(Principal {
            key_id: state.bootstrap_key.key_id.clone(),
            org_id: state.tenant.org.id.clone(),
            project_id: state.tenant.project.id.clone(),
            admin: true,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_parse_and_match_only_themselves() {
        let k = generate_key();
        assert!(parse_key(&k).is_some());
        let b = BootstrapKey::from_key(&k).unwrap();
        assert!(b.matches(&k));
        let other = generate_key();
        assert!(!b.matches(&other));
        let mut tampered = k.clone();
        tampered.pop();
        tampered.push(if k.ends_with('A') { 'B' } else { 'A' });
        assert!(!b.matches(&tampered));
    }

    #[test]
    fn malformed_keys_are_refused_before_lookup() {
        for bad in [
            "",
            "dly_",
            "dly_key_x_y",
            "abc",
            "dly_key_01J0000000000000000000000_short",
        ] {
            assert!(parse_key(bad).is_none(), "{bad}");
        }
        assert!(BootstrapKey::from_key("nope").is_err());
    }
}
