//! API keys (`dly_<keyid>_<secret>`) and the authenticated principal.
//!
//! Only a SHA-256 hash of a key is kept; comparison is constant-time. One bootstrap
//! admin key from configuration authenticates as an operator; every other key is a stored
//! record looked up by its public id.
//!
//! Beside it, who may do what: [`access`] (what a principal may see, 403 wording), [`cache`]
//! (key and organization records for a second), [`throttle`] (failed authentications) and
//! [`bootstrap`] (the installation's own tenant).

pub mod access;
pub mod bootstrap;
pub mod cache;
pub mod throttle;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use differently_core::tenancy::{OrgStatus, Scope};
use differently_core::{ErrorCode, KeyId, OrgId, ProjectId};
use rand::Rng;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::auth::throttle::FailureScope;
use crate::error::ApiError;
use crate::AppState;

const KEY_PREFIX: &str = "dly_";
/// The secret is 34 random characters and a 6-character checksum of them, so a mistyped or
/// truncated key is refused without a database lookup.
const SECRET_LEN: usize = 40;
const RANDOM_LEN: usize = 34;
const SECRET_ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// Base62 of the first 8 bytes of SHA-256 of the random part, 6 characters.
fn checksum(random: &str) -> String {
    let digest = Sha256::digest(random.as_bytes());
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    let mut n = u64::from_be_bytes(bytes);
    let base = SECRET_ALPHABET.len() as u64;
    (0..SECRET_LEN - RANDOM_LEN)
        .map(|_| {
            let c = SECRET_ALPHABET[(n % base) as usize] as char;
            n /= base;
            c
        })
        .collect()
}

/// A key split into its public id and its secret; never logged whole.
pub struct ParsedKey<'a> {
    pub key_id: &'a str,
    pub secret: &'a str,
}

/// The id part of what looks like a key (`dly_<id>_<secret>`), shape unchecked: enough to
/// tell one key from another before any digest is computed.
fn key_id_of(token: &str) -> Option<&str> {
    Some(token.strip_prefix(KEY_PREFIX)?.rsplit_once('_')?.0)
}

/// Checks the key's shape before any lookup, so garbage never reaches the database.
pub fn parse_key(token: &str) -> Option<ParsedKey<'_>> {
    let rest = token.strip_prefix(KEY_PREFIX)?;
    let (key_id, secret) = rest.rsplit_once('_')?;
    differently_core::KeyId::parse(key_id).ok()?;
    let shaped = secret.len() == SECRET_LEN && secret.bytes().all(|b| SECRET_ALPHABET.contains(&b));
    let ok = shaped && secret[RANDOM_LEN..] == checksum(&secret[..RANDOM_LEN]);
    ok.then_some(ParsedKey { key_id, secret })
}

/// A new random key. The caller shows it once and keeps only `hash_key` of it.
pub fn generate_key() -> String {
    let mut rng = rand::rng();
    let random: String = (0..RANDOM_LEN)
        .map(|_| SECRET_ALPHABET[rng.random_range(0..SECRET_ALPHABET.len())] as char)
        .collect();
    let check = checksum(&random);
    format!(
        "{KEY_PREFIX}{}_{random}{check}",
        differently_core::KeyId::new()
    )
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
            "bootstrap_key (DIFFERENTLY_BOOTSTRAP_KEY): expected dly_key_<ulid>_<34 random + 6 checksum characters> \
             (generate one with `differently key generate`)"
                .to_owned()
        })?;
        Ok(BootstrapKey {
            key_id: parsed.key_id.to_owned(),
            hash: hash_key(token),
        })
    }

    /// A 32-byte key for `purpose`, derived from the bootstrap key (HMAC-SHA256 of its hash):
    /// the same in every API process of an installation, and changed by rotating that key.
    pub fn derive(&self, purpose: &str) -> [u8; 32] {
        use hmac::Mac;
        let mut m = <hmac::Hmac<Sha256> as Mac>::new_from_slice(&self.hash)
            .expect("HMAC takes any key length");
        m.update(purpose.as_bytes());
        m.finalize().into_bytes().into()
    }

    fn matches(&self, token: &str) -> bool {
        // A key id is not a secret (it is in audit records and key listings), so a token of
        // another key is told apart by its id, without the two SHA-256 digests (checksum and
        // hash) every request would otherwise pay here before its own key's. The secret is
        // still compared in constant time.
        if key_id_of(token) != Some(self.key_id.as_str()) || parse_key(token).is_none() {
            return false;
        }
        hash_key(token).ct_eq(&self.hash).into()
    }
}

/// A request the server makes to itself for a key it has verified another way (the
/// OpenSandbox facade's execd token names one). Only in-process code can attach a request
/// extension, never a client; the key's record is still read and checked (revoked, expired,
/// suspended organization, rate limit) exactly as for a presented key.
#[derive(Debug, Clone)]
pub struct Delegated {
    pub key_id: String,
}

/// Who is calling: a key bound to an organization and maybe one project.
#[derive(Debug, Clone)]
pub struct Principal {
    pub key_id: String,
    pub org_id: OrgId,
    /// `None`: the key acts for the whole organization.
    pub project_id: Option<ProjectId>,
    pub scopes: Vec<Scope>,
}

impl Principal {
    /// Whether the key holds `scope` (`admin` implies every scope).
    pub fn has(&self, scope: Scope) -> bool {
        self.scopes.contains(&scope) || self.scopes.contains(&Scope::Admin)
    }

    /// 403 unless the key holds `scope`.
    pub fn require(&self, scope: Scope) -> Result<(), ApiError> {
        if self.has(scope) {
            Ok(())
        } else {
            Err(ApiError::new(
                ErrorCode::PermissionDenied,
                format!("this key lacks the {scope} scope"),
            ))
        }
    }

    /// Operator: may manage every organization.
    pub fn is_admin(&self) -> bool {
        self.scopes.contains(&Scope::Admin)
    }

    /// Whether the key may see things of organization `org`.
    pub fn sees_org(&self, org: &OrgId) -> bool {
        self.is_admin() || &self.org_id == org
    }

    /// Whether a sandbox (or snapshot) of `project` in `org` is this key's to read, change
    /// and call: its own organization, and its project when the key is bound to one. Admin
    /// keys are not exempt: `admin` grants the operator routes and tenancy management across
    /// organizations (API.md), not another organization's sandboxes.
    pub fn owns(&self, org: &OrgId, project: &ProjectId) -> bool {
        &self.org_id == org && self.project_id.as_ref().is_none_or(|p| p == project)
    }

    /// Whether the key may see things of project `project` in `org`.
    pub fn sees_project(&self, org: &OrgId, project: &ProjectId) -> bool {
        if self.is_admin() {
            return true;
        }
        &self.org_id == org && self.project_id.as_ref().is_none_or(|p| p == project)
    }

    /// Whether the key may manage its organization's projects and keys: an org-wide key
    /// with `sandboxes:write`, or an admin.
    pub fn manages_org(&self, org: &OrgId) -> bool {
        self.is_admin()
            || (&self.org_id == org
                && self.project_id.is_none()
                && self.scopes.contains(&Scope::SandboxesWrite))
    }

    /// The project a tenant list is narrowed to: `?projectId=` when given, else the key's own
    /// binding (`None`: the whole org). `Err(None)`-like cases are an empty list: a key bound
    /// to another project sees nothing, without learning whether the asked one exists.
    pub fn list_project(&self, raw: Option<&str>) -> Result<ListProject, ApiError> {
        let Some(raw) = raw else {
            return Ok(ListProject::Only(self.project_id.clone()));
        };
        let asked = ProjectId::parse(raw)
            .map_err(|_| crate::requests::page::bad_query("projectId", "not a project id"))?;
        if self.project_id.as_ref().is_some_and(|b| b != &asked) {
            return Ok(ListProject::Nothing);
        }
        Ok(ListProject::Only(Some(asked)))
    }

    /// Scopes of this key for the audit log (`key:<id>`).
    pub fn actor(&self) -> differently_store::Actor {
        differently_store::Actor::Key(self.key_id.clone())
    }

    /// Why a change this key makes happens, as public events say it: `user` with the key's
    /// id, or `admin` for an operator's admin key (whose id is not shown to tenants).
    pub fn origin(&self) -> differently_bus_schema::Origin {
        let mut o = differently_bus_schema::Origin::user(self.key_id.clone());
        if self.scopes.contains(&Scope::Admin) {
            o.cause = differently_bus_schema::Cause::Admin;
        }
        o
    }
}

/// What a tenant list may show.
pub enum ListProject {
    /// Rows of this project (`None`: every project of the key's org).
    Only(Option<ProjectId>),
    /// Nothing (the key is bound to another project).
    Nothing,
}

fn unauthenticated() -> ApiError {
    ApiError::new(ErrorCode::Unauthenticated, "missing or invalid API key")
}

/// Keys' last-use times are written at most this often.
const TOUCH_EVERY: chrono::TimeDelta = chrono::TimeDelta::seconds(60);

async fn authenticate(parts: &Parts, state: &AppState) -> Result<Principal, ApiError> {
    if let Some(d) = parts.extensions.get::<Delegated>() {
        return delegated(state, &d.key_id).await;
    }
    let token = bearer(parts).ok_or_else(unauthenticated)?;
    if state.bootstrap_key.matches(token) {
        return Ok(Principal {
            key_id: state.bootstrap_key.key_id.clone(),
            org_id: state.tenant.org.id.clone(),
            project_id: Some(state.tenant.project.id.clone()),
            scopes: Scope::ALL.to_vec(),
        });
    }
    // Shape check first: garbage never reaches the database.
    let parsed = parse_key(token).ok_or_else(unauthenticated)?;
    let key_id = KeyId::parse(parsed.key_id).map_err(|_| unauthenticated())?;
    let record = match state.auth_cache.key(&key_id) {
        Some(r) => r,
        None => {
            let r = state
                .store
                .get_key(&key_id)
                .await?
                .ok_or_else(unauthenticated)?;
            state.auth_cache.put_key(r.clone());
            r
        }
    };
    let presented = hex(&hash_key(token));
    if !bool::from(presented.as_bytes().ct_eq(record.hash.as_bytes())) {
        return Err(unauthenticated());
    }
    let now = chrono::Utc::now();
    if record.revoked_at.is_some() {
        return Err(ApiError::new(
            ErrorCode::Unauthenticated,
            "this API key was revoked",
        ));
    }
    if record.expires_at.is_some_and(|t| t <= now) {
        return Err(ApiError::new(
            ErrorCode::Unauthenticated,
            "this API key has expired",
        ));
    }
    if record.last_used_at.is_none_or(|t| now - t > TOUCH_EVERY) {
        // Claimed in the cache first, so the requests of a busy key do not all queue on its
        // row lock, and written off the request path: last use is informational, and a
        // request must not wait for it (it cost 2.3 ms on average under load).
        let mut touched = record.clone();
        touched.last_used_at = Some(now);
        state.auth_cache.put_key(touched);
        let store = state.store.clone();
        tokio::spawn(async move {
            if let Err(e) = store.touch_key(&key_id, now).await {
                tracing::warn!(key = %key_id, error = %e, "cannot record key use");
            }
        });
    }
    Ok(Principal {
        key_id: record.id.to_string(),
        org_id: record.org_id,
        project_id: record.project_id,
        scopes: record.scopes,
    })
}

/// The principal of a [`Delegated`] request: the key's current record, without a secret.
async fn delegated(state: &AppState, key_id: &str) -> Result<Principal, ApiError> {
    if key_id == state.bootstrap_key.key_id {
        return Ok(Principal {
            key_id: state.bootstrap_key.key_id.clone(),
            org_id: state.tenant.org.id.clone(),
            project_id: Some(state.tenant.project.id.clone()),
            scopes: Scope::ALL.to_vec(),
        });
    }
    let key_id = KeyId::parse(key_id).map_err(|_| unauthenticated())?;
    let record = match state.auth_cache.key(&key_id) {
        Some(r) => r,
        None => {
            let r = state
                .store
                .get_key(&key_id)
                .await?
                .ok_or_else(unauthenticated)?;
            state.auth_cache.put_key(r.clone());
            r
        }
    };
    if record.revoked_at.is_some() {
        return Err(ApiError::new(
            ErrorCode::Unauthenticated,
            "this API key was revoked",
        ));
    }
    if record.expires_at.is_some_and(|t| t <= chrono::Utc::now()) {
        return Err(ApiError::new(
            ErrorCode::Unauthenticated,
            "this API key has expired",
        ));
    }
    Ok(Principal {
        key_id: record.id.to_string(),
        org_id: record.org_id,
        project_id: record.project_id,
        scopes: record.scopes,
    })
}

/// Lower-case hex of `bytes` (the store's, so key hashes and audit hashes are spelled alike).
pub use differently_store::audit::hex;

/// The WebSocket subprotocol a browser offers with [`BEARER_SUBPROTOCOL_PREFIX`] and that
/// the terminal route selects in its answer (never the one carrying the key).
pub const PTY_SUBPROTOCOL: &str = "differently.pty.v1";

/// A WebSocket upgrade may carry its key as the offered subprotocol
/// `differently.bearer.<key>`, because a browser cannot set headers on a WebSocket and the
/// key must never be in a URL (proxies log URLs). Kubernetes' API server does the same. A key
/// is only letters, digits and `_`, all valid in a subprotocol token.
pub const BEARER_SUBPROTOCOL_PREFIX: &str = "differently.bearer.";

/// The bearer token of the request, if it has one: the `Authorization` header, or for a
/// WebSocket upgrade without one, the key offered as a subprotocol. Neither is ambient (no
/// cookie), so a cross-site page cannot make a request carry a key it does not hold.
fn bearer(parts: &Parts) -> Option<&str> {
    if let Some(h) = parts.headers.get(axum::http::header::AUTHORIZATION) {
        return h
            .to_str()
            .ok()
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim);
    }
    let upgrade = parts
        .headers
        .get(axum::http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if !upgrade {
        return None;
    }
    parts
        .headers
        .get_all(axum::http::header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|p| p.trim().strip_prefix(BEARER_SUBPROTOCOL_PREFIX))
}

/// What a failure of this request counts against: the presented key id when the key is
/// well formed, else the client's address (`auth::throttle`).
fn failure_scope(parts: &Parts, state: &AppState) -> FailureScope {
    if let Some(parsed) = bearer(parts).and_then(parse_key) {
        return FailureScope::KeyId(parsed.key_id.to_owned());
    }
    let peer = parts
        .extensions
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip())
        .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
    FailureScope::Addr(crate::auth::throttle::client_addr(
        peer,
        &parts.headers,
        &state.limits.trusted_proxies,
    ))
}

fn too_many(wait: std::time::Duration, code: ErrorCode, message: &str) -> ApiError {
    let mut e = ApiError::new(code, message);
    e.retry_after = Some(wait.as_secs_f64().ceil().max(1.0) as u64);
    e
}

impl FromRequestParts<AppState> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        // What keeps failing authentication is slowed down: malformed keys from that address
        // before any lookup; a key id with no failure left gets 429 instead of 401 for a
        // wrong secret, but its right secret is still accepted: a key id is not a secret (it
        // is in audit records and key listings), so refusing the valid key would let anyone
        // who saw the id lock its owner out. Checking costs what a fresh key id costs any
        // caller (one lookup, cached for the auth cache's TTL). The bootstrap key is matched
        // in memory first and never throttled, so the operator cannot be locked out.
        let scope = failure_scope(parts, state);
        let bootstrap = bearer(parts).is_some_and(|t| state.bootstrap_key.matches(t))
            || parts.extensions.get::<Delegated>().is_some();
        let throttled = state.auth_failures.throttled(&scope).filter(|_| !bootstrap);
        let refuse = |wait, scope: &FailureScope| {
            let message = match scope {
                FailureScope::KeyId(_) => {
                    "too many failed authentications with this key id; retry later"
                }
                FailureScope::Addr(_) => {
                    "too many malformed or missing API keys from this address; retry later"
                }
            };
            too_many(wait, ErrorCode::RateLimited, message)
                .with_details(serde_json::json!({ "scope": scope.name() }))
        };
        if let (Some(wait), FailureScope::Addr(_)) = (throttled, &scope) {
            return Err(refuse(wait, &scope));
        }
        let principal = match authenticate(parts, state).await {
            Ok(p) => p,
            Err(e) => {
                if e.code == ErrorCode::Unauthenticated {
                    state.auth_failures.failed(&scope);
                    if let Some(wait) = throttled {
                        return Err(refuse(wait, &scope));
                    }
                }
                return Err(e);
            }
        };
        if let Err(wait) = state.key_requests.take(&principal.key_id) {
            return Err(too_many(
                wait,
                ErrorCode::RateLimited,
                "rate limit exceeded for this API key",
            ));
        }
        if parts.method != axum::http::Method::GET && !principal.is_admin() {
            let org = match state.auth_cache.org(&principal.org_id) {
                Some(org) => org,
                None => {
                    let org = state.store.get_org(&principal.org_id).await?;
                    state
                        .auth_cache
                        .put_org(principal.org_id.clone(), org.clone());
                    org
                }
            };
            match org {
                Some(o) if o.status == OrgStatus::Suspended => {
                    return Err(ApiError::new(
                        ErrorCode::PermissionDenied,
                        "the organization is suspended: its keys can only read",
                    ))
                }
                Some(_) => {}
                None => return Err(unauthenticated()),
            }
        }
        Ok(principal)
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
        // The bootstrap key's id with another well-formed secret: the id alone is not enough.
        let other_secret = parse_key(&other).unwrap().secret.to_owned();
        let same_id = format!(
            "{KEY_PREFIX}{}_{other_secret}",
            parse_key(&k).unwrap().key_id
        );
        assert!(parse_key(&same_id).is_some());
        assert!(!b.matches(&same_id));
        assert_eq!(key_id_of(&k), Some(parse_key(&k).unwrap().key_id));
    }

    #[test]
    fn a_single_changed_character_fails_the_checksum() {
        let k = generate_key();
        assert!(parse_key(&k).is_some());
        let (head, secret) = k.rsplit_once('_').unwrap();
        for i in [0, 10, 33, 34, 39] {
            let mut chars: Vec<char> = secret.chars().collect();
            chars[i] = if chars[i] == 'a' { 'b' } else { 'a' };
            let typo = format!("{head}_{}", chars.into_iter().collect::<String>());
            assert!(parse_key(&typo).is_none(), "position {i}");
        }
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
