//! The `envdAccessToken` the facade hands out in create and connect answers, and checks on
//! every envd call.
//!
//! Why derived and not stored: the E2B SDK keeps the token for the life of its `Sandbox`
//! object (hours) and gets a new one only from connect, so the token must stay valid as long
//! as the sandbox lives, and any API process of the installation must verify it. It is
//! `ea1.<key id>.<tag>`, the tag being HMAC-SHA256 over the sandbox id and the key id under a
//! key derived from the installation's bootstrap key. It names the key, never carries it; the
//! named key is checked on every use (the envd call runs as a `/v1` call of that key), so
//! revoking the key revokes its tokens, and rotating the bootstrap key revokes them all.

use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The header the SDK sends the token in.
pub const HEADER: &str = "x-access-token";
const VERSION: &str = "ea1";

/// Why a token was refused (never says more than this to the client).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("malformed envd access token")]
    Malformed,
    #[error("the envd access token is not for this sandbox")]
    NotThisSandbox,
}

/// Derives and checks tokens with one key.
#[derive(Clone)]
pub struct Deriver {
    key: [u8; 32],
}

impl Deriver {
    /// A deriver over `key` (derived from the bootstrap key by the caller).
    pub fn new(key: [u8; 32]) -> Deriver {
        Deriver { key }
    }

    fn tag(&self, sandbox_id: &str, key_id: &str) -> Hmac<Sha256> {
        let mut m =
            <Hmac<Sha256> as Mac>::new_from_slice(&self.key).expect("HMAC takes any key length");
        m.update(format!("{VERSION}|{sandbox_id}|{key_id}").as_bytes());
        m
    }

    /// The token of `key_id` for `sandbox_id`: the same every time it is asked for.
    pub fn token(&self, sandbox_id: &str, key_id: &str) -> String {
        let tag = self.tag(sandbox_id, key_id).finalize().into_bytes();
        let tag = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(tag);
        format!("{VERSION}.{key_id}.{tag}")
    }

    /// The key id `token` names if it was derived for `sandbox_id`.
    pub fn open(&self, token: &str, sandbox_id: &str) -> Result<String, TokenError> {
        let mut parts = token.split('.');
        let (Some(VERSION), Some(key_id), Some(tag), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed);
        };
        let tag = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(tag)
            .map_err(|_| TokenError::Malformed)?;
        self.tag(sandbox_id, key_id)
            .verify_slice(&tag)
            .map_err(|_| TokenError::NotThisSandbox)?;
        Ok(key_id.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_stable_and_opens_only_for_its_sandbox() {
        let d = Deriver::new([3; 32]);
        let t = d.token("sbx_a", "key_1");
        assert_eq!(t, d.token("sbx_a", "key_1"));
        assert_eq!(d.open(&t, "sbx_a"), Ok("key_1".to_owned()));
        assert_eq!(d.open(&t, "sbx_b"), Err(TokenError::NotThisSandbox));
        let other_key = t.replace("key_1", "key_2");
        assert_eq!(d.open(&other_key, "sbx_a"), Err(TokenError::NotThisSandbox));
        assert_eq!(
            Deriver::new([4; 32]).open(&t, "sbx_a"),
            Err(TokenError::NotThisSandbox)
        );
        assert_eq!(d.open("dly_key_x_y", "sbx_a"), Err(TokenError::Malformed));
    }
}
