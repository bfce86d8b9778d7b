//! Tenant NATS credentials for public events, through NATS auth callout (nats-server 2.10+).
//!
//! Differently's own processes connect as users listed in the server's `auth_users`; every
//! other connection is sent by the server to `$SYS.REQ.USER.AUTH`, answered here. A tenant
//! connects with the token `POST /v1/events/credentials` issued; the answer is a user JWT,
//! signed with the account nkey this installation holds, whose permissions are its org's
//! (or project's) public subjects and the JetStream API calls of a consumer filtered on them,
//! and nothing else. Why callout rather than operator-mode JWTs: the installation keeps its
//! simple config-file accounts, an issued token is checked on every connection (so a
//! revocation or an expiry is refused at once), and no user JWT outlives
//! [`EventAuth::connection_lifetime`], after which the server disconnects it and the
//! client's reconnect is checked again.
//!
//! Issued credentials live in a JetStream key-value bucket (`DLY_EVENT_CREDENTIALS`): an id,
//! the SHA-256 of the token's secret (never the secret), the org and project, the expiry.
//! Revoking deletes the entry.

use std::time::Duration;

use async_nats::jetstream::{self, kv};
use base64::Engine;
use chrono::{DateTime, Utc};
use differently_bus_schema::Naming;
use differently_core::{OrgId, ProjectId};
use futures::StreamExt;
use nkeys::KeyPair;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// Longest a credential may live.
pub const MAX_CREDENTIAL_TTL: Duration = Duration::from_secs(24 * 3600);

/// Prefix of a credential's id; the token is `<id>.<secret>`.
const ID_PREFIX: &str = "evc_";

/// Queue group of the responders, so one API replica answers each connection.
const RESPONDERS: &str = "differently-event-auth";

/// Why a credential could not be issued, revoked or checked.
#[derive(Debug, thiserror::Error)]
pub enum CalloutError {
    /// The account seed is not an account nkey seed (`SA…`).
    #[error("the events account seed is not an account nkey seed (SA…)")]
    BadSeed,
    /// The credential store (a JetStream key-value bucket) failed.
    #[error("event credential store: {0}")]
    Store(String),
    /// The requested lifetime is out of bounds.
    #[error("a credential lives between 1 second and {} seconds", MAX_CREDENTIAL_TTL.as_secs())]
    BadTtl,
}

/// A credential as stored (never the secret itself).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Stored {
    org_id: OrgId,
    project_id: Option<ProjectId>,
    key_id: String,
    expires_at: DateTime<Utc>,
    secret_sha256: String,
}

/// A newly issued credential: the token is shown once.
#[derive(Debug, Clone)]
pub struct Issued {
    pub id: String,
    pub token: String,
    pub expires_at: DateTime<Utc>,
    pub grant: Grant,
}

/// What a credential lets its holder do, as subjects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Grant {
    /// The public subjects it may subscribe to (`dly.pub.<org>.>`).
    pub subscribe: String,
    /// The inbox prefix its client must use (`_INBOX_<org>`): replies to it go there only.
    pub inbox_prefix: String,
    /// The stream to replay from.
    pub stream: String,
    /// The consumer-create subject pattern (`$JS.API.CONSUMER.CREATE.DLY_PUB.*.<filter>`):
    /// a consumer may be made only with a filter inside `subscribe`.
    pub consumer_create: String,
}

impl Grant {
    /// The grant of `org` (narrowed to `project`) under `naming`.
    pub fn of(naming: &Naming, org: &OrgId, project: Option<&ProjectId>) -> Grant {
        let subscribe = naming.public_filter(org, project, None);
        // The org filter with a project is `dly.pub.<org>.<project>.*.>`; a grant is on
        // every sandbox of it, written `dly.pub.<org>.<project>.>`.
        let subscribe = match project {
            Some(p) => format!("{}.pub.{org}.{p}.>", naming.prefix()),
            None => subscribe,
        };
        let stream = naming.public_stream().name;
        Grant {
            consumer_create: format!("$JS.API.CONSUMER.CREATE.{stream}.*.{subscribe}"),
            inbox_prefix: format!("_INBOX_{org}"),
            subscribe,
            stream,
        }
    }

    /// The user JWT permissions of this grant: subscribe to its subjects and its inbox;
    /// publish only the JetStream API calls of its own filtered consumers (create, next
    /// message, info, acks); everything else is denied. Consumers Differently runs on the
    /// public stream itself (`internal`) are denied by name.
    pub fn permissions(&self, internal: &[String]) -> Value {
        let s = &self.stream;
        let mut deny_pub: Vec<String> = Vec::new();
        for c in internal {
            deny_pub.push(format!("$JS.API.CONSUMER.MSG.NEXT.{s}.{c}"));
            deny_pub.push(format!("$JS.API.CONSUMER.INFO.{s}.{c}"));
            deny_pub.push(format!("$JS.ACK.{s}.{c}.>"));
        }
        json!({
            "pub": {
                "allow": [
                    self.consumer_create,
                    format!("$JS.API.CONSUMER.MSG.NEXT.{s}.*"),
                    format!("$JS.API.CONSUMER.INFO.{s}.*"),
                    format!("$JS.ACK.{s}.>"),
                ],
                "deny": deny_pub,
            },
            "sub": {
                "allow": [self.subscribe, format!("{}.>", self.inbox_prefix)],
            },
        })
    }
}

/// Issues, revokes and checks tenant credentials, and answers the server's auth callout.
#[derive(Clone)]
pub struct EventAuth {
    account: std::sync::Arc<KeyPair>,
    kv: kv::Store,
    naming: Naming,
    /// The NATS account tenants are placed in (`$G` in a config-file server without
    /// accounts).
    target_account: String,
    connection_lifetime: Duration,
}

impl EventAuth {
    /// Opens (creating if needed) the credential bucket on `client`'s JetStream, signing with
    /// account seed `account_seed`.
    pub async fn new(
        client: async_nats::Client,
        account_seed: &str,
        naming: Naming,
    ) -> Result<EventAuth, CalloutError> {
        let account = KeyPair::from_seed(account_seed.trim()).map_err(|_| CalloutError::BadSeed)?;
        if !account.public_key().starts_with('A') {
            return Err(CalloutError::BadSeed);
        }
        let js = jetstream::new(client);
        let bucket = naming.event_credentials_bucket();
        let kv = match js.get_key_value(&bucket).await {
            Ok(kv) => kv,
            Err(_) => js
                .create_key_value(kv::Config {
                    bucket: bucket.clone(),
                    description: "Differently: issued event credentials (hashes only)".into(),
                    history: 1,
                    // An entry outlives the longest credential; expired ones go on their own.
                    max_age: MAX_CREDENTIAL_TTL + Duration::from_secs(3600),
                    ..Default::default()
                })
                .await
                .map_err(|e| CalloutError::Store(e.to_string()))?,
        };
        Ok(EventAuth {
            account: std::sync::Arc::new(account),
            kv,
            naming,
            target_account: "$G".into(),
            connection_lifetime: Duration::from_secs(300),
        })
    }

    /// This auth with tenants placed in NATS account `name` (a config-file account).
    pub fn in_account(mut self, name: &str) -> Self {
        self.target_account = name.to_owned();
        self
    }

    /// This auth with connections' user JWTs living at most `d`: how long a revoked
    /// credential's open connection can go on before the server drops it.
    pub fn with_connection_lifetime(mut self, d: Duration) -> Self {
        self.connection_lifetime = d;
        self
    }

    /// How long one connection's user JWT lives at most.
    pub fn connection_lifetime(&self) -> Duration {
        self.connection_lifetime
    }

    /// The account's public nkey: the server's `auth_callout.issuer`.
    pub fn issuer(&self) -> String {
        self.account.public_key()
    }

    /// Issues a credential for `org` (narrowed to `project`) on behalf of key `key_id`,
    /// valid for `ttl`.
    pub async fn issue(
        &self,
        org: &OrgId,
        project: Option<&ProjectId>,
        key_id: &str,
        ttl: Duration,
    ) -> Result<Issued, CalloutError> {
        if ttl.is_zero() || ttl > MAX_CREDENTIAL_TTL {
            return Err(CalloutError::BadTtl);
        }
        let id = format!("{ID_PREFIX}{}", ulid::Ulid::new());
        let mut secret = [0u8; 32];
        rand::Rng::fill(&mut rand::rng(), &mut secret);
        let secret = b64(&secret);
        let expires_at =
            Utc::now() + chrono::Duration::from_std(ttl).map_err(|_| CalloutError::BadTtl)?;
        let stored = Stored {
            org_id: org.clone(),
            project_id: project.cloned(),
            key_id: key_id.to_owned(),
            expires_at,
            secret_sha256: sha256_hex(secret.as_bytes()),
        };
        let value = serde_json::to_vec(&stored).map_err(|e| CalloutError::Store(e.to_string()))?;
        self.kv
            .put(&id, value.into())
            .await
            .map_err(|e| CalloutError::Store(e.to_string()))?;
        Ok(Issued {
            token: format!("{id}.{secret}"),
            id,
            expires_at,
            grant: Grant::of(&self.naming, org, project),
        })
    }

    /// Revokes credential `id` of `org`; `false` when it is not one of the org's.
    pub async fn revoke(&self, org: &OrgId, id: &str) -> Result<bool, CalloutError> {
        if !valid_id(id) {
            return Ok(false);
        }
        match self.load(id).await? {
            Some(s) if &s.org_id == org => {
                self.kv
                    .purge(id)
                    .await
                    .map_err(|e| CalloutError::Store(e.to_string()))?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn load(&self, id: &str) -> Result<Option<Stored>, CalloutError> {
        let raw = self
            .kv
            .get(id)
            .await
            .map_err(|e| CalloutError::Store(e.to_string()))?;
        Ok(raw.and_then(|b| serde_json::from_slice(&b).ok()))
    }

    /// The grant of a presented token, if it is a live credential; why not otherwise (for
    /// the server's log, never with the token).
    async fn check(&self, token: &str) -> Result<(Stored, Grant), &'static str> {
        let (id, secret) = token.split_once('.').ok_or("not an event credential")?;
        if !valid_id(id) {
            return Err("not an event credential");
        }
        let stored = self
            .load(id)
            .await
            .map_err(|_| "credential store unavailable")?
            .ok_or("unknown or revoked credential")?;
        let want = stored.secret_sha256.as_bytes();
        let got = sha256_hex(secret.as_bytes());
        if !constant_time_eq(want, got.as_bytes()) {
            return Err("unknown or revoked credential");
        }
        if stored.expires_at <= Utc::now() {
            return Err("expired credential");
        }
        let grant = Grant::of(&self.naming, &stored.org_id, stored.project_id.as_ref());
        Ok((stored, grant))
    }

    /// Answers the server's authorization requests on `client` until the subscription ends.
    pub async fn respond(&self, client: async_nats::Client) -> Result<(), CalloutError> {
        let mut sub = client
            .queue_subscribe("$SYS.REQ.USER.AUTH", RESPONDERS.to_owned())
            .await
            .map_err(|e| CalloutError::Store(format!("subscribe $SYS.REQ.USER.AUTH: {e}")))?;
        while let Some(msg) = sub.next().await {
            let Some(reply) = msg.reply.clone() else {
                continue;
            };
            let answer = self.answer(&msg.payload).await;
            match answer {
                Ok(jwt) => {
                    if let Err(e) = client.publish(reply, jwt.into()).await {
                        tracing::warn!(error = %e, "event auth: cannot answer the server");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "event auth: unreadable request"),
            }
        }
        Ok(())
    }

    /// The signed authorization response to one request (a refusal carries `error`).
    async fn answer(&self, request: &[u8]) -> Result<String, String> {
        let claims = jwt_claims(request)?;
        let nats = &claims["nats"];
        let user_nkey = nats["user_nkey"].as_str().ok_or("no user_nkey")?.to_owned();
        let server_id = nats["server_id"]["id"]
            .as_str()
            .ok_or("no server id")?
            .to_owned();
        let token = nats["connect_opts"]["auth_token"].as_str().unwrap_or("");
        let now = Utc::now();
        let mut response = json!({
            "jti": ulid::Ulid::new().to_string(),
            "iat": now.timestamp(),
            "iss": self.issuer(),
            "sub": user_nkey,
            "aud": server_id,
            "nats": { "type": "authorization_response", "version": 2 },
        });
        match self.check(token).await {
            Ok((stored, grant)) => {
                let lifetime = chrono::Duration::from_std(self.connection_lifetime)
                    .unwrap_or_else(|_| chrono::Duration::seconds(300));
                let exp = stored.expires_at.min(now + lifetime);
                let user = json!({
                    "jti": ulid::Ulid::new().to_string(),
                    "iat": now.timestamp(),
                    "exp": exp.timestamp(),
                    "iss": self.issuer(),
                    "sub": user_nkey,
                    "aud": self.target_account,
                    "name": format!("events:{}", stored.org_id),
                    "nats": {
                        "type": "user", "version": 2,
                        "subs": -1, "data": -1, "payload": -1,
                        "pub": grant.permissions(&self.naming.public_internal_consumers())["pub"],
                        "sub": grant.permissions(&[])["sub"],
                    },
                });
                response["nats"]["jwt"] = json!(self.sign(&user)?);
            }
            Err(why) => {
                tracing::info!(why, "event auth: connection refused");
                response["nats"]["error"] = json!(why);
            }
        }
        self.sign(&response)
    }

    fn sign(&self, claims: &Value) -> Result<String, String> {
        let header = b64(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
        let body = b64(&serde_json::to_vec(claims).map_err(|e| e.to_string())?);
        let signing = format!("{header}.{body}");
        let sig = self
            .account
            .sign(signing.as_bytes())
            .map_err(|e| e.to_string())?;
        Ok(format!("{signing}.{}", b64(&sig)))
    }
}

fn valid_id(id: &str) -> bool {
    id.strip_prefix(ID_PREFIX)
        .is_some_and(|u| u.len() == 26 && u.chars().all(|c| c.is_ascii_alphanumeric()))
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The claims of a JWT (its signature is the server's, on a subject only servers publish).
fn jwt_claims(jwt: &[u8]) -> Result<Value, String> {
    let text = std::str::from_utf8(jwt).map_err(|_| "not UTF-8")?;
    let body = text.split('.').nth(1).ok_or("not a JWT")?;
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(body.trim_end_matches('='))
        .map_err(|e| format!("JWT body: {e}"))?;
    serde_json::from_slice(&raw).map_err(|e| format!("JWT claims: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_is_the_orgs_public_subjects_and_its_consumers_only() {
        let n = Naming::default();
        let org = OrgId::new();
        let g = Grant::of(&n, &org, None);
        assert_eq!(g.subscribe, format!("dly.pub.{org}.>"));
        assert_eq!(g.inbox_prefix, format!("_INBOX_{org}"));
        assert_eq!(
            g.consumer_create,
            format!("$JS.API.CONSUMER.CREATE.DLY_PUB.*.dly.pub.{org}.>")
        );
        let p = ProjectId::new();
        assert_eq!(
            Grant::of(&n, &org, Some(&p)).subscribe,
            format!("dly.pub.{org}.{p}.>")
        );
        let perms = g.permissions(&["webhooks".into()]).to_string();
        assert!(
            !perms.contains("dly.work")
                && !perms.contains("dly.evt")
                && !perms.contains("dly.internal"),
            "{perms}"
        );
        // Nothing a tenant may subscribe to or publish reaches the process supervisors'
        // subjects, whose answers carry process output.
        let internal = n.process_subject(1);
        let p = g.permissions(&[]);
        for side in ["pub", "sub"] {
            for allowed in p[side]["allow"].as_array().expect("allow list") {
                let allowed = allowed.as_str().expect("a subject");
                assert!(
                    !crate::memory::subject_matches(allowed, &internal)
                        && !crate::memory::subject_matches(allowed, "dly.internal.x"),
                    "{side} {allowed} covers {internal}"
                );
            }
        }
        assert!(
            perms.contains("$JS.API.CONSUMER.MSG.NEXT.DLY_PUB.webhooks"),
            "{perms}"
        );
    }

    #[test]
    fn ids_are_checked_before_any_lookup() {
        assert!(valid_id(&format!("evc_{}", ulid::Ulid::new())));
        for bad in [
            "",
            "evc_",
            "evc_../x",
            "key_01JD0000000000000000000005",
            "evc_a.b",
        ] {
            assert!(!valid_id(bad), "{bad}");
        }
    }
}
