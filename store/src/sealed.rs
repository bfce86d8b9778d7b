//! Sealed secrets: AES-256-GCM under a key that never enters the database.
//!
//! A blob is `version (1 byte) || nonce (12 bytes) || ciphertext || tag (16 bytes)`. The
//! secret's name is the associated data, so a blob copied into another row fails to open.
//! Nonces are 96 random bits from the operating system for every seal: the chance of a
//! repeat stays below 2⁻³² for the first 2³² seals under one key, far beyond how often
//! credentials change. The fingerprint is the first 8 bytes of SHA-256 of the value (hex),
//! shown instead of the value so operators can tell which credential is in place.

use std::fmt;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use sha2::{Digest, Sha256};

use crate::audit::{decode_hex32, hex, KeyError};

const VERSION: u8 = 1;
const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;
/// Domain separation of the associated data.
const AAD_PREFIX: &[u8] = b"differently secret v1\0";

/// Why a blob did not open or a secret could not be sealed. Never contains the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// Wrong key, tampered blob, or a blob of another secret: indistinguishable by design.
    #[error("the sealed secret {name:?} does not open under this key (wrong key, tampered, or another secret's blob)")]
    Open { name: String },
    /// Not a blob this version wrote.
    #[error("the sealed secret {name:?} is malformed")]
    Malformed { name: String },
    /// Encryption failed (the input is too large for AES-GCM).
    #[error("cannot seal {name:?}")]
    Seal { name: String },
    /// The system random source failed.
    #[error("the system random source failed: {0}")]
    Random(String),
}

/// The 32-byte sealing key. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct SealKey([u8; 32]);

impl fmt::Debug for SealKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SealKey(<redacted>)")
    }
}

impl SealKey {
    /// A key from raw bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> SealKey {
        SealKey(bytes)
    }

    /// Parses 64 hex characters.
    pub fn from_hex(text: &str) -> Result<SealKey, KeyError> {
        decode_hex32(text.trim()).map(SealKey)
    }

    /// A fresh random key.
    pub fn random() -> Result<SealKey, KeyError> {
        let mut b = [0u8; 32];
        getrandom::fill(&mut b).map_err(|e| KeyError::Random(e.to_string()))?;
        Ok(SealKey(b))
    }

    fn cipher(&self) -> Aes256Gcm {
        Aes256Gcm::new((&self.0).into())
    }
}

fn aad(name: &str) -> Vec<u8> {
    let mut a = Vec::with_capacity(AAD_PREFIX.len() + name.len());
    a.extend_from_slice(AAD_PREFIX);
    a.extend_from_slice(name.as_bytes());
    a
}

/// Encrypts `plaintext` as the secret `name` under `key` with a fresh random nonce.
pub fn seal(key: &SealKey, name: &str, plaintext: &[u8]) -> Result<Vec<u8>, SealError> {
    let mut nonce = [0u8; NONCE_LEN];
    getrandom::fill(&mut nonce).map_err(|e| SealError::Random(e.to_string()))?;
    let ct = key
        .cipher()
        .encrypt(
            Nonce::from_slice(&nonce),
            Payload {
                msg: plaintext,
                aad: &aad(name),
            },
        )
        .map_err(|_| SealError::Seal {
            name: name.to_owned(),
        })?;
    let mut blob = Vec::with_capacity(1 + NONCE_LEN + ct.len());
    blob.push(VERSION);
    blob.extend_from_slice(&nonce);
    blob.extend_from_slice(&ct);
    Ok(blob)
}

/// Decrypts the blob of secret `name`; fails on a wrong key, any changed byte, or a blob
/// sealed under another name.
pub fn open(key: &SealKey, name: &str, blob: &[u8]) -> Result<Vec<u8>, SealError> {
    if blob.len() < 1 + NONCE_LEN + TAG_LEN || blob[0] != VERSION {
        return Err(SealError::Malformed {
            name: name.to_owned(),
        });
    }
    let (nonce, ct) = blob[1..].split_at(NONCE_LEN);
    key.cipher()
        .decrypt(
            Nonce::from_slice(nonce),
            Payload {
                msg: ct,
                aad: &aad(name),
            },
        )
        .map_err(|_| SealError::Open {
            name: name.to_owned(),
        })
}

/// The nonce of a blob (for tests that nonces never repeat).
pub fn nonce_of(blob: &[u8]) -> Option<&[u8]> {
    blob.get(1..1 + NONCE_LEN)
}

/// `sha256:` and the first 8 bytes of SHA-256 of the value, in hex.
pub fn fingerprint(plaintext: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(plaintext)[..8]))
}

static PROCESS_KEY: std::sync::OnceLock<SealKey> = std::sync::OnceLock::new();

/// Installs the process's sealing key (from server configuration).
pub fn set_process_key(key: SealKey) -> Result<(), SealKey> {
    PROCESS_KEY.set(key)
}

/// The process's sealing key, if configured. Without one, stored secrets are refused.
pub fn process_key() -> Option<&'static SealKey> {
    PROCESS_KEY.get()
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn a_sealed_secret_opens_only_with_its_key_and_name() {
        let k = SealKey::from_bytes([7; 32]);
        let blob = seal(&k, "opensandbox", b"api-key-123").unwrap();
        assert_eq!(open(&k, "opensandbox", &blob).unwrap(), b"api-key-123");
        assert!(!blob.windows(11).any(|w| w == b"api-key-123"));
        // Wrong key.
        let other = SealKey::from_bytes([8; 32]);
        assert!(matches!(
            open(&other, "opensandbox", &blob),
            Err(SealError::Open { .. })
        ));
        // Swapped into another row.
        assert!(matches!(
            open(&k, "daytona", &blob),
            Err(SealError::Open { .. })
        ));
        // Any flipped byte.
        for i in 0..blob.len() {
            let mut t = blob.clone();
            t[i] ^= 0x01;
            assert!(open(&k, "opensandbox", &t).is_err(), "byte {i}");
        }
        // Truncated.
        assert!(matches!(
            open(&k, "opensandbox", &blob[..10]),
            Err(SealError::Malformed { .. })
        ));
    }

    #[test]
    fn nonces_never_repeat() {
        let k = SealKey::from_bytes([1; 32]);
        let mut seen = HashSet::new();
        for _ in 0..10_000 {
            let blob = seal(&k, "n", b"same value").unwrap();
            assert!(seen.insert(nonce_of(&blob).unwrap().to_vec()));
        }
    }

    #[test]
    fn keys_parse_from_hex_and_never_print() {
        let k = SealKey::from_hex(&"0f".repeat(32)).unwrap();
        assert_eq!(k, SealKey::from_bytes([0x0f; 32]));
        assert!(SealKey::from_hex("nope").is_err());
        assert!(!format!("{k:?}").contains("0f"));
    }

    #[test]
    fn fingerprints_are_stable_and_short() {
        assert_eq!(fingerprint(b"x"), fingerprint(b"x"));
        assert_ne!(fingerprint(b"x"), fingerprint(b"y"));
        assert_eq!(fingerprint(b"x").len(), "sha256:".len() + 16);
    }
}
