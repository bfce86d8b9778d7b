//! Signatures as the Standard Webhooks specification defines them
//! (<https://www.standardwebhooks.com/>): a secret `whsec_<base64 of 24–64 random bytes>`,
//! and per delivery the headers `webhook-id`, `webhook-timestamp` (Unix seconds) and
//! `webhook-signature`: space-separated `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`,
//! one per secret that signs (two during a rotation's overlap), so receivers that know
//! either secret verify. Any Standard Webhooks library verifies these deliveries.

use std::fmt;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// The prefix of a secret's text form.
pub const SECRET_PREFIX: &str = "whsec_";

/// Random bytes in a generated secret (the specification allows 24 to 64).
const SECRET_BYTES: usize = 32;

/// A receiver refuses a timestamp further than this from its clock (the spec's advice).
pub const TOLERANCE_SECONDS: i64 = 5 * 60;

/// The header names.
pub const HEADER_ID: &str = "webhook-id";
pub const HEADER_TIMESTAMP: &str = "webhook-timestamp";
pub const HEADER_SIGNATURE: &str = "webhook-signature";

/// A signing secret. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Why a text is not a secret, or a delivery does not verify. Never contains a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SigningError {
    #[error("a webhook secret is `whsec_` followed by base64")]
    MalformedSecret,
    #[error("the system random source failed: {0}")]
    Random(String),
    #[error("missing or malformed {0} header")]
    Header(&'static str),
    #[error("timestamp outside the tolerance")]
    Stale,
    #[error("no signature matches")]
    Mismatch,
}

impl Secret {
    /// A fresh random secret.
    pub fn generate() -> Result<Secret, SigningError> {
        let mut b = vec![0u8; SECRET_BYTES];
        getrandom::fill(&mut b).map_err(|e| SigningError::Random(e.to_string()))?;
        Ok(Secret(b))
    }

    /// Parses `whsec_<base64>` (the prefix is optional, as the reference libraries allow).
    pub fn parse(text: &str) -> Result<Secret, SigningError> {
        let b64 = text.strip_prefix(SECRET_PREFIX).unwrap_or(text);
        let bytes = STANDARD
            .decode(b64)
            .map_err(|_| SigningError::MalformedSecret)?;
        if bytes.is_empty() {
            return Err(SigningError::MalformedSecret);
        }
        Ok(Secret(bytes))
    }

    /// The raw key bytes (what is sealed in the store).
    pub fn from_bytes(bytes: Vec<u8>) -> Secret {
        Secret(bytes)
    }

    /// The raw key bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// `whsec_<base64>`: the form shown once to the caller.
    pub fn reveal(&self) -> String {
        format!("{SECRET_PREFIX}{}", STANDARD.encode(&self.0))
    }

    /// `v1,<base64 signature>` of one delivery.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        format!("v1,{}", STANDARD.encode(self.mac(id, timestamp, body)))
    }

    fn mac(&self, id: &str, timestamp: i64, body: &[u8]) -> Vec<u8> {
        let mut m =
            <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes any key length");
        m.update(id.as_bytes());
        m.update(b".");
        m.update(timestamp.to_string().as_bytes());
        m.update(b".");
        m.update(body);
        m.finalize().into_bytes().to_vec()
    }
}

/// The `webhook-signature` value: one `v1,…` per secret, space-separated.
pub fn signature_header(secrets: &[Secret], id: &str, timestamp: i64, body: &[u8]) -> String {
    secrets
        .iter()
        .map(|s| s.sign(id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Verifies a delivery as a receiver does: the timestamp within [`TOLERANCE_SECONDS`] of
/// `now`, and some `v1` signature of the header matching `secret` (constant-time compare).
pub fn verify(
    secret: &Secret,
    id: &str,
    timestamp: &str,
    signature: &str,
    body: &[u8],
    now: i64,
) -> Result<(), SigningError> {
    let ts: i64 = timestamp
        .parse()
        .map_err(|_| SigningError::Header(HEADER_TIMESTAMP))?;
    if (now - ts).abs() > TOLERANCE_SECONDS {
        return Err(SigningError::Stale);
    }
    let want = secret.mac(id, ts, body);
    let mut any = false;
    for part in signature.split(' ') {
        let Some(b64) = part.strip_prefix("v1,") else {
            continue;
        };
        let Ok(got) = STANDARD.decode(b64) else {
            continue;
        };
        if bool::from(got.ct_eq(&want)) {
            any = true;
        }
    }
    if any {
        Ok(())
    } else {
        Err(SigningError::Mismatch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the specification's reference libraries (standard-webhooks,
    /// `libraries/*` tests): this secret, id, timestamp and body sign to this value.
    #[test]
    fn the_specifications_example_vector() {
        let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let id = "msg_p5jXN8AQM9LWM0D4loKWxJek";
        let ts = 1614265330;
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            secret.sign(id, ts, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
        let header = secret.sign(id, ts, body);
        assert_eq!(
            verify(&secret, id, "1614265330", &header, body, ts + 10),
            Ok(())
        );
        assert_eq!(
            verify(
                &secret,
                id,
                "1614265330",
                &header,
                body,
                ts + TOLERANCE_SECONDS + 1
            ),
            Err(SigningError::Stale)
        );
        assert_eq!(
            verify(&secret, id, "1614265330", &header, b"{}", ts),
            Err(SigningError::Mismatch)
        );
    }

    #[test]
    fn during_an_overlap_either_secret_verifies() {
        let (old, new) = (Secret::generate().unwrap(), Secret::generate().unwrap());
        let header = signature_header(&[new.clone(), old.clone()], "evt_1", 100, b"x");
        assert_eq!(header.split(' ').count(), 2);
        assert_eq!(verify(&old, "evt_1", "100", &header, b"x", 100), Ok(()));
        assert_eq!(verify(&new, "evt_1", "100", &header, b"x", 100), Ok(()));
        let other = Secret::generate().unwrap();
        assert_eq!(
            verify(&other, "evt_1", "100", &header, b"x", 100),
            Err(SigningError::Mismatch)
        );
    }

    #[test]
    fn secrets_round_trip_and_never_print() {
        let s = Secret::generate().unwrap();
        let text = s.reveal();
        assert!(text.starts_with("whsec_"));
        assert_eq!(Secret::parse(&text).unwrap(), s);
        assert!(!format!("{s:?}").contains(&text[6..]));
        assert!(Secret::parse("whsec_***").is_err());
        assert!(Secret::parse("whsec_").is_err());
    }
}
