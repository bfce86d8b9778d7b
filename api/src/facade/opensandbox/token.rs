//! The per-sandbox execd token the facade hands out in an endpoint's `headers`.
//!
//! Why a token and not the tenant's key: the OpenSandbox SDK attaches endpoint headers to every
//! execd request and sends the API key only in server-proxy mode, so the endpoint answer is the
//! one place to put a credential, and that answer is cached and logged by clients. The token
//! names one sandbox, the key that asked for it and an expiry, and is sealed with HMAC-SHA256
//! under a key derived from the installation's bootstrap key: stateless (any API process of
//! the installation verifies it), short-lived, revoked by revoking the key it names (checked
//! on every use) or all at once by rotating the bootstrap key.

use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The header the token travels in.
pub const HEADER: &str = "x-differently-execd-token";
/// How long a token is valid: longer than the SDK's 10-minute endpoint cache.
pub const LIFETIME_SECONDS: i64 = 3600;
const VERSION: &str = "t1";

/// What a valid token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    pub sandbox_id: String,
    pub key_id: String,
    pub expires_unix: i64,
}

/// Why a token was refused (never says more than this to the client).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("malformed execd token")]
    Malformed,
    #[error("execd token does not verify")]
    BadSignature,
    #[error("execd token has expired")]
    Expired,
    #[error("execd token is for another sandbox")]
    OtherSandbox,
}

/// Seals and opens tokens with one key.
#[derive(Clone)]
pub struct Sealer {
    key: [u8; 32],
}

fn mac(key: &[u8; 32], payload: &str) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    m.update(payload.as_bytes());
    m
}

impl Sealer {
    /// A sealer over `key` (derived from the bootstrap key by the caller).
    pub fn new(key: [u8; 32]) -> Sealer {
        Sealer { key }
    }

    /// A token for `claims`.
    pub fn seal(&self, c: &Claims) -> String {
        let payload = format!("{VERSION}.{}.{}.{}", c.sandbox_id, c.key_id, c.expires_unix);
        let tag = mac(&self.key, &payload).finalize().into_bytes();
        let tag = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(tag);
        format!("{payload}.{tag}")
    }

    /// The claims of `token` if it verifies, is unexpired at `now_unix` and names `sandbox_id`.
    pub fn open(&self, token: &str, sandbox_id: &str, now_unix: i64) -> Result<Claims, TokenError> {
        let (payload, tag) = token.rsplit_once('.').ok_or(TokenError::Malformed)?;
        let tag = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(tag)
            .map_err(|_| TokenError::Malformed)?;
        mac(&self.key, payload)
            .verify_slice(&tag)
            .map_err(|_| TokenError::BadSignature)?;
        let mut parts = payload.split('.');
        let (Some(VERSION), Some(sbx), Some(key), Some(exp), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(TokenError::Malformed);
        };
        let expires_unix: i64 = exp.parse().map_err(|_| TokenError::Malformed)?;
        if expires_unix <= now_unix {
            return Err(TokenError::Expired);
        }
        if sbx != sandbox_id {
            return Err(TokenError::OtherSandbox);
        }
        Ok(Claims {
            sandbox_id: sbx.to_owned(),
            key_id: key.to_owned(),
            expires_unix,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims() -> Claims {
        Claims {
            sandbox_id: "sbx_01".into(),
            key_id: "key_01".into(),
            expires_unix: 1000,
        }
    }

    #[test]
    fn a_sealed_token_opens_for_its_sandbox_until_it_expires() {
        let s = Sealer::new([7; 32]);
        let t = s.seal(&claims());
        assert_eq!(s.open(&t, "sbx_01", 999), Ok(claims()));
        assert_eq!(s.open(&t, "sbx_01", 1000), Err(TokenError::Expired));
        assert_eq!(s.open(&t, "sbx_02", 999), Err(TokenError::OtherSandbox));
    }

    #[test]
    fn tampered_or_foreign_tokens_are_refused() {
        let s = Sealer::new([7; 32]);
        let t = s.seal(&claims());
        let longer = t.replace(".1000.", ".9999.");
        assert_eq!(s.open(&longer, "sbx_01", 0), Err(TokenError::BadSignature));
        let other = Sealer::new([8; 32]);
        assert_eq!(other.open(&t, "sbx_01", 0), Err(TokenError::BadSignature));
        assert_eq!(s.open("garbage", "sbx_01", 0), Err(TokenError::Malformed));
    }
}
