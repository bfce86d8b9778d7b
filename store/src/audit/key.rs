//! The HMAC key of the audit chains and the keyring a verifier checks with. Apart from the
//! records so that key handling (parsing, ids, rotation) reads in one place and the secret
//! bytes never leave this module except through the MAC.

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// Why a key or a hash could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// Not 64 hexadecimal characters.
    #[error("expected 64 hexadecimal characters (a 32-byte key)")]
    Format,
    /// The system random source failed.
    #[error("the system random source failed: {0}")]
    Random(String),
}

/// The 32-byte HMAC key of the audit chains. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct AuditKey([u8; 32]);

impl fmt::Debug for AuditKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AuditKey(<redacted>)")
    }
}

impl AuditKey {
    /// A key from raw bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> AuditKey {
        AuditKey(bytes)
    }

    /// Parses 64 hex characters (surrounding whitespace ignored, as in a file).
    pub fn from_hex(text: &str) -> Result<AuditKey, KeyError> {
        decode_hex32(text.trim()).map(AuditKey)
    }

    /// The key as 64 hex characters: only for handing a newly generated key to its owner
    /// (`differently key generate --audit`, `dev`), never for logs.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    /// A fresh random key from the operating system.
    pub fn random() -> Result<AuditKey, KeyError> {
        let mut b = [0u8; 32];
        getrandom::fill(&mut b).map_err(|e| KeyError::Random(e.to_string()))?;
        Ok(AuditKey(b))
    }

    /// `HMAC-SHA256(key, prev || body)`.
    pub(super) fn mac(&self, prev: &[u8; 32], body: &[u8]) -> [u8; 32] {
        // HMAC accepts keys of any length, so this cannot fail for a 32-byte key.
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
        m.update(prev);
        m.update(body);
        m.finalize().into_bytes().into()
    }

    /// A short public identifier of the key (truncated SHA-256 of a domain-separated hash),
    /// so operators can tell which key wrote an export without revealing it.
    pub fn key_id(&self) -> String {
        let d = Sha256::new()
            .chain_update(b"differently audit key id\0")
            .chain_update(self.0)
            .finalize();
        hex(&d[..6])
    }
}

/// The keys a verifier knows: the one that signs now and the ones that signed before it, so
/// chains written before a rotation still verify. Records name their key by id.
#[derive(Clone, Debug)]
pub struct AuditKeyring {
    current: AuditKey,
    previous: Vec<AuditKey>,
}

impl AuditKeyring {
    /// A ring of one key.
    pub fn new(current: AuditKey) -> AuditKeyring {
        AuditKeyring {
            current,
            previous: vec![],
        }
    }

    /// The same ring that also knows `previous` (retired keys, still trusted to verify).
    pub fn with_previous(mut self, previous: Vec<AuditKey>) -> AuditKeyring {
        self.previous = previous;
        self
    }

    /// The signing key.
    pub fn current(&self) -> &AuditKey {
        &self.current
    }

    /// The key with this id, if the ring has it.
    pub fn by_id(&self, id: &str) -> Option<&AuditKey> {
        self.keys().find(|k| k.key_id() == id)
    }

    /// Every key, the signing one first.
    pub fn keys(&self) -> impl Iterator<Item = &AuditKey> {
        std::iter::once(&self.current).chain(self.previous.iter())
    }
}

impl From<AuditKey> for AuditKeyring {
    fn from(k: AuditKey) -> AuditKeyring {
        AuditKeyring::new(k)
    }
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

/// Parses exactly 64 hex characters.
pub(crate) fn decode_hex32(text: &str) -> Result<[u8; 32], KeyError> {
    let bytes = text.as_bytes();
    if bytes.len() != 64 {
        return Err(KeyError::Format);
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        let hi = (pair[0] as char).to_digit(16).ok_or(KeyError::Format)?;
        let lo = (pair[1] as char).to_digit(16).ok_or(KeyError::Format)?;
        out[i] = u8::try_from(hi * 16 + lo).map_err(|_| KeyError::Format)?;
    }
    Ok(out)
}
