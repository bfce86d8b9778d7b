//! Signed file URLs (`download_url()`, `upload_url()`): `GET`/`POST /files?path=…
//! [&username=…]&signature=v1_<sig>[&signature_expiration=<unix s>]`, where `sig` is the
//! unpadded base64 of SHA-256 over `<path>:<read|write>:<username or empty>:<envd access
//! token>[:<expiration>]`, computed by the SDK. envd checks it against its one token; the
//! facade has a token per sandbox and key, and the URL names neither: with `E2B_SANDBOX_URL`
//! set the SDK sends no sandbox id at all (a browser sends no headers), and in DNS mode the
//! host names the sandbox but not the key.
//!
//! So the facade checks the signature against the tokens it has handed out or accepted
//! recently ([`SeenTokens`]: create, connect and get_info answers, and every envd call that
//! presented one), those of the named sandbox when the request names one. A match says which
//! sandbox and which key: the file call then runs as that key's `/v1` call, so the key's
//! revocation, scopes and tenancy apply as to the token itself. The comparison is constant
//! time per token. What this means for an operator is in docs/e2b-facade.md: a URL works on
//! an API process that has seen its token in the last [`SEEN_FOR`], for at most
//! [`MAX_SEEN`] tokens per process.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use base64::Engine;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::time::Instant;

/// How long a token stays known after it was last handed out or used.
pub const SEEN_FOR: Duration = Duration::from_secs(24 * 3600);
/// Most tokens a process keeps (the oldest are forgotten first).
pub const MAX_SEEN: usize = 4096;

/// Why a signed request was refused; the messages are envd's.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SignError {
    #[error("invalid signature")]
    Invalid,
    #[error("signature is already expired")]
    Expired,
    #[error("signature_expiration: not a unix time in seconds")]
    BadExpiration,
}

/// Which way a signature lets a file go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Read,
    Write,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Read => "read",
            Operation::Write => "write",
        }
    }
}

struct Seen {
    sandbox: String,
    key_id: String,
    at: Instant,
    /// When it was last seen, in the order of notes (instants can tie).
    seq: u64,
}

#[derive(Default)]
struct Inner {
    by_token: HashMap<String, Seen>,
    next: u64,
}

/// The envd tokens this process has handed out or accepted, with their sandbox and key.
#[derive(Default)]
pub struct SeenTokens {
    inner: Mutex<Inner>,
}

impl SeenTokens {
    /// Remembers (or refreshes) `token`, valid for `sandbox` and naming `key_id`.
    pub fn note(&self, token: &str, sandbox: &str, key_id: &str) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.next += 1;
        let seq = inner.next;
        let m = &mut inner.by_token;
        if let Some(s) = m.get_mut(token) {
            s.at = Instant::now();
            s.seq = seq;
            return;
        }
        if m.len() >= MAX_SEEN {
            m.retain(|_, s| s.at.elapsed() < SEEN_FOR);
        }
        if m.len() >= MAX_SEEN {
            let oldest = m.iter().min_by_key(|(_, s)| s.seq).map(|(t, _)| t.clone());
            if let Some(t) = oldest {
                m.remove(&t);
            }
        }
        m.insert(
            token.to_owned(),
            Seen {
                sandbox: sandbox.to_owned(),
                key_id: key_id.to_owned(),
                at: Instant::now(),
                seq,
            },
        );
    }

    /// `(token, sandbox, key id)` of every fresh token, of `sandbox` only when given.
    fn candidates(&self, sandbox: Option<&str>) -> Vec<(String, String, String)> {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner
            .by_token
            .iter()
            .filter(|(_, s)| s.at.elapsed() < SEEN_FOR)
            .filter(|(_, s)| sandbox.is_none_or(|id| id == s.sandbox))
            .map(|(t, s)| (t.clone(), s.sandbox.clone(), s.key_id.clone()))
            .collect()
    }
}

/// The signature the SDKs compute (`v1_` + unpadded standard base64 of the SHA-256).
pub fn signature(
    path: &str,
    op: Operation,
    user: &str,
    token: &str,
    expiration: Option<i64>,
) -> String {
    let mut raw = format!("{path}:{}:{user}:{token}", op.as_str());
    if let Some(e) = expiration {
        raw.push_str(&format!(":{e}"));
    }
    let digest = Sha256::digest(raw.as_bytes());
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

/// What a signed request carries, as the query gave it.
#[derive(Debug)]
pub struct SignedRequest<'a> {
    /// The `path` query as sent (the SDK signs it unresolved), empty when absent.
    pub path: &'a str,
    /// The `username` query, empty when absent.
    pub user: &'a str,
    pub signature: &'a str,
    pub expiration: Option<&'a str>,
    pub op: Operation,
}

impl SeenTokens {
    /// The `(sandbox, key id)` whose token made `req`'s signature, if one did and it has not
    /// expired (`now` in unix seconds). `sandbox` narrows the search to that sandbox.
    pub fn verify(
        &self,
        req: &SignedRequest<'_>,
        sandbox: Option<&str>,
        now: i64,
    ) -> Result<(String, String), SignError> {
        let expiration = req
            .expiration
            .map(|e| e.trim().parse::<i64>())
            .transpose()
            .map_err(|_| SignError::BadExpiration)?;
        let sent = req.signature.as_bytes();
        let mut found = None;
        for (token, sbx, key) in self.candidates(sandbox) {
            let want = signature(req.path, req.op, req.user, &token, expiration);
            if bool::from(want.as_bytes().ct_eq(sent)) && found.is_none() {
                found = Some((sbx, key));
            }
        }
        let found = found.ok_or(SignError::Invalid)?;
        if expiration.is_some_and(|e| e < now) {
            return Err(SignError::Expired);
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_the_sdks() {
        // e2b 2.63.0 `get_signature("/home/user/a.txt", "read", None, "tok", None)` spelled out.
        let raw = "/home/user/a.txt:read::tok";
        let want = format!(
            "v1_{}",
            base64::engine::general_purpose::STANDARD_NO_PAD.encode(Sha256::digest(raw))
        );
        assert_eq!(
            signature("/home/user/a.txt", Operation::Read, "", "tok", None),
            want
        );
        assert!(!want.ends_with('='));
        assert_ne!(
            signature("/a", Operation::Read, "", "tok", Some(5)),
            signature("/a", Operation::Read, "", "tok", None)
        );
    }

    #[test]
    fn a_signature_opens_its_sandbox_only_and_only_until_it_expires() {
        let seen = SeenTokens::default();
        seen.note("tok_a", "sbx_a", "key_a");
        seen.note("tok_b", "sbx_b", "key_b");
        let sig = signature("a.txt", Operation::Write, "root", "tok_a", Some(100));
        let req = SignedRequest {
            path: "a.txt",
            user: "root",
            signature: &sig,
            expiration: Some("100"),
            op: Operation::Write,
        };
        let a = ("sbx_a".to_owned(), "key_a".to_owned());
        assert_eq!(seen.verify(&req, None, 99), Ok(a.clone()));
        assert_eq!(seen.verify(&req, Some("sbx_a"), 100), Ok(a));
        assert_eq!(
            seen.verify(&req, Some("sbx_b"), 99),
            Err(SignError::Invalid)
        );
        assert_eq!(seen.verify(&req, None, 101), Err(SignError::Expired));
        let read = SignedRequest {
            op: Operation::Read,
            ..req
        };
        assert_eq!(seen.verify(&read, None, 99), Err(SignError::Invalid));
        let later = SignedRequest {
            expiration: Some("200"),
            op: Operation::Write,
            ..read
        };
        assert_eq!(seen.verify(&later, None, 99), Err(SignError::Invalid));
        let bad = SignedRequest {
            expiration: Some("soon"),
            ..later
        };
        assert_eq!(seen.verify(&bad, None, 99), Err(SignError::BadExpiration));
    }

    #[test]
    fn the_oldest_token_is_forgotten_first() {
        let seen = SeenTokens::default();
        for i in 0..=MAX_SEEN {
            seen.note(&format!("t{i}"), "sbx", "key");
        }
        let c = seen.candidates(None);
        assert_eq!(c.len(), MAX_SEEN);
        assert!(!c.iter().any(|(t, _, _)| t == "t0"));
    }
}
