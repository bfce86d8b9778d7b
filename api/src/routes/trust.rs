//! `GET /v1/admin/trust-report`: what an operator needs to answer "where did tenants' work
//! run, under which rules, and what does Differently itself not guarantee". Pools are shown
//! with their declared trust, isolation and endpoint, credentials only as references.

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use differently_core::pool::{PoolHealth, PoolRecord, Trust};
use differently_core::ErrorCode;
use differently_store::sealed::fingerprint;
use differently_store::secrets::SecretInfo;
use serde::Serialize;
use serde_json::Value;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::AppState;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new().route("/v1/admin/trust-report", get(report))
}

/// The whole report: the document's `TrustReport`.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrustReport {
    generated_at: DateTime<Utc>,
    installation_id: String,
    /// Differently sends nothing anywhere.
    telemetry: &'static str,
    pools: Vec<PoolEntry>,
    external_placements: Vec<ExternalPlacement>,
    not_enforced: Vec<&'static str>,
}

/// One pool as the operator declared it and as its workers last saw it.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct PoolEntry {
    name: String,
    kind: String,
    trust: Trust,
    #[schema(required)]
    region: Option<String>,
    /// Declared, not verified; `undeclared` when the operator said nothing. For devhost what
    /// its commands run under: `bwrap` or `none`.
    isolation: String,
    egress: String,
    #[schema(required)]
    endpoint: Option<String>,
    /// How each credential is referenced, with its fingerprint; never a value.
    credentials: Vec<CredentialEntry>,
    source: differently_core::pool::PoolSource,
    healthy: bool,
    #[schema(required)]
    health: Option<PoolHealth>,
    /// Warm capacity: instances created ahead of any tenant, per class, which use the
    /// backend (and, on a billed provider, cost) while they wait.
    warm: Vec<super::warm::ServedClass>,
    /// The backend version detected and how far its adapter is verified against it
    /// ([`super::pools::Backend`]'s fields, where the document has always listed them).
    #[schema(required)]
    backend_version: Option<String>,
    verified: differently_core::pool::VerifiedStatus,
    verified_basis: String,
}

/// One credential of a pool: the reference, which value is in place (fingerprint), and for
/// a stored secret who last changed it and when.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct CredentialEntry {
    /// `env`, `file`, `secret`, or `inline` (a value written into the settings).
    kind: &'static str,
    /// The adapter setting holding the reference (`apiKeySecret`).
    setting: String,
    /// `env:NAME`, `file:PATH`, `secret:NAME` or `inline:SETTING`.
    reference: String,
    /// The environment variable, file path or secret name.
    #[schema(required)]
    name: Option<String>,
    /// `sha256:<16 hex>` of the value in use, surrounding whitespace removed for env and file
    /// (as adapters read them). Env and file values are read by this API process: workers
    /// with a different environment or mount may differ.
    #[schema(required)]
    fingerprint: Option<String>,
    /// Stored secrets: who last set it (`key:<id>`).
    #[schema(required)]
    updated_by: Option<String>,
    /// Stored secrets: when it was last set; files: when the file last changed.
    #[schema(required)]
    updated_at: Option<DateTime<Utc>>,
    /// Why there is no fingerprint (unset, unreadable, not stored, inline).
    #[schema(required)]
    problem: Option<String>,
}

/// Sandboxes of one organization placed on one external pool.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct ExternalPlacement {
    org_id: String,
    #[schema(required)]
    org_name: Option<String>,
    pool: String,
    sandboxes: u64,
    first_at: DateTime<Utc>,
    last_at: DateTime<Utc>,
    /// The effective policy the latest of them was placed under (as its placement
    /// explanation stored it).
    #[schema(required, value_type = Option<differently_core::policy::EffectivePolicy>)]
    policy: Option<Value>,
}

/// What Differently does not enforce, stated plainly.
const NOT_ENFORCED: [&str; 6] = [
    "Differently does not isolate sandboxes: isolation comes from each pool's runtime; the isolation listed per pool is what the operator declared, not something Differently checked.",
    "Containers from the Docker and Kubernetes runtimes share the host kernel; only microVM runtimes (Fast Sandbox) give each sandbox its own kernel.",
    "Differently does not configure sandbox networking or egress; whatever the pool's runtime and the operator's network allow is allowed.",
    "devhost pools run commands as local processes, under bubblewrap (refused when it is not installed) or, with isolation = \"none\", with no isolation at all; they are for development only.",
    ENV_PLAINTEXT,
    "External pools run on third-party infrastructure; Differently only decides whether work may go there, by policy.",
];

/// Where env values rest without a secrets key; replaced by [`ENV_SEALED`] with one.
const ENV_PLAINTEXT: &str = "Sandbox environment variable values are stored in the database in plaintext, because no secrets key (DIFFERENTLY_SECRETS_KEY) is configured; they are never served back, and are cleared when the sandbox ends.";
const ENV_SEALED: &str = "Sandbox environment variable values are sealed in Postgres under the secrets key (AES-256-GCM) and cleared when the sandbox ends (the in-memory store of `differently dev` keeps nothing at rest), but workers open them to create the instance, and the backend holds them for the sandbox's life.";

/// `NOT_ENFORCED` as it holds for this process's secrets key.
fn not_enforced() -> Vec<&'static str> {
    let sealed = differently_store::sealed::process_key().is_some();
    NOT_ENFORCED
        .iter()
        .map(|l| {
            if sealed && *l == ENV_PLAINTEXT {
                ENV_SEALED
            } else {
                *l
            }
        })
        .collect()
}

/// Keys of adapter settings that name an endpoint.
fn endpoint(settings: &Value) -> Option<String> {
    let obj = settings.as_object()?;
    ["apiURL", "apiUrl", "url", "endpoint", "baseUrl"]
        .iter()
        .find_map(|k| obj.get(*k).and_then(Value::as_str).map(str::to_owned))
}

/// Credential references in adapter settings: `*Env` → `env`, `*File` → `file`, `*Secret`
/// → `secret`; any other credential-looking string is flagged `inline`. Only references are
/// read from the settings; fingerprints are added by [`fingerprint_all`].
fn credentials(settings: &Value) -> Vec<CredentialEntry> {
    let Some(obj) = settings.as_object() else {
        return vec![];
    };
    let mut out = Vec::new();
    for (k, v) in obj {
        let Some(v) = v.as_str() else { continue };
        let lower = k.to_ascii_lowercase();
        let looks_secret = ["key", "token", "secret", "password", "credential"]
            .iter()
            .any(|w| lower.contains(w));
        if !looks_secret {
            continue;
        }
        let kind = if k.ends_with("Env") {
            "env"
        } else if k.ends_with("File") {
            "file"
        } else if k.ends_with("Secret") || k.ends_with("SecretName") {
            "secret"
        } else {
            "inline"
        };
        let inline = kind == "inline";
        out.push(CredentialEntry {
            kind,
            setting: k.clone(),
            reference: if inline {
                format!("inline:{k}")
            } else {
                format!("{kind}:{v}")
            },
            name: (!inline).then(|| v.to_owned()),
            fingerprint: None,
            updated_by: None,
            updated_at: None,
            problem: inline.then(|| "a value in the config; move it to a reference".to_owned()),
        });
    }
    out.sort_by(|a, b| a.reference.cmp(&b.reference));
    out
}

/// Adds what is known about each credential's value: fingerprints, and who changed stored
/// secrets when. Never reads a value it would show.
async fn fingerprint_all(entries: &mut [CredentialEntry], secrets: &[SecretInfo]) {
    for e in entries.iter_mut() {
        let Some(name) = e.name.clone() else { continue };
        match e.kind {
            "env" => match std::env::var(&name) {
                Ok(v) if !v.trim().is_empty() => {
                    e.fingerprint = Some(fingerprint(v.trim().as_bytes()))
                }
                _ => e.problem = Some("not set in the API process".to_owned()),
            },
            "file" => match tokio::fs::read(&name).await {
                Ok(bytes) => {
                    let text = String::from_utf8_lossy(&bytes);
                    e.fingerprint = Some(fingerprint(text.trim().as_bytes()));
                    e.updated_at = tokio::fs::metadata(&name)
                        .await
                        .and_then(|m| m.modified())
                        .ok()
                        .map(DateTime::<Utc>::from);
                }
                Err(err) => {
                    e.problem = Some(format!("unreadable by the API process: {}", err.kind()))
                }
            },
            "secret" => match secrets.iter().find(|s| s.name == name) {
                Some(s) => {
                    e.fingerprint = Some(s.fingerprint.clone());
                    e.updated_by = Some(s.updated_by.clone());
                    e.updated_at = Some(s.updated_at);
                }
                None => e.problem = Some("no stored secret of this name".to_owned()),
            },
            _ => {}
        }
    }
}

fn isolation(r: &PoolRecord) -> String {
    if differently_adapters::registry::is_dev_only(&r.kind) {
        return differently_adapters::devhost::DevhostAdapter::isolation_of(&r.settings)
            .unwrap_or("invalid settings")
            .to_owned();
    }
    match (
        r.isolation,
        r.settings.get("isolation").and_then(Value::as_str),
    ) {
        (Some(i), _) => serde_json::to_value(i)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default(),
        (None, Some(s)) => s.to_owned(),
        (None, None) => "undeclared".to_owned(),
    }
}

fn egress(r: &PoolRecord) -> String {
    match r.settings.get("egress") {
        Some(Value::String(s)) => s.clone(),
        Some(v) if !v.is_null() => v.to_string(),
        _ => "not configured by Differently (the runtime's default)".to_owned(),
    }
}

async fn report(State(state): State<AppState>, p: Principal) -> ApiResult<Json<TrustReport>> {
    if !p.is_admin() {
        return Err(ApiError::new(
            ErrorCode::PermissionDenied,
            "the trust report needs the admin scope",
        ));
    }
    let records = state.store.list_pools().await?;
    let health = state.store.pool_health().await?;
    let secrets = state.store.list_secrets().await?;
    let mut pools: Vec<PoolEntry> = records
        .iter()
        .map(|r| {
            let backend =
                super::pools::Backend::of(&state, r, health.iter().find(|h| h.name == r.name));
            PoolEntry {
                name: r.name.clone(),
                kind: r.kind.clone(),
                trust: r.trust,
                region: r.region.clone(),
                isolation: isolation(r),
                egress: egress(r),
                endpoint: endpoint(&r.settings),
                credentials: credentials(&r.settings),
                source: r.source,
                healthy: state.pools.get(&r.name).is_some_and(|p| p.healthy()),
                health: super::pools::served_health(&health, &r.name),
                warm: Vec::new(),
                backend_version: backend.backend_version,
                verified: backend.verified,
                verified_basis: backend.verified_basis,
            }
        })
        .collect();
    for p in &mut pools {
        fingerprint_all(&mut p.credentials, &secrets).await;
        p.warm = super::warm::document(&state, &p.name).await?.classes;
    }
    let external: Vec<String> = records
        .iter()
        .filter(|r| r.trust == Trust::External)
        .map(|r| r.name.clone())
        .collect();
    let mut external_placements = Vec::new();
    for s in state.store.placements_on(&external).await? {
        let org_name = state.store.get_org(&s.org_id).await?.map(|o| o.name);
        external_placements.push(ExternalPlacement {
            org_id: s.org_id.to_string(),
            org_name,
            pool: s.pool,
            sandboxes: s.sandboxes,
            first_at: s.first_at,
            last_at: s.last_at,
            policy: s.latest_explanation.and_then(|e| e.get("policy").cloned()),
        });
    }
    Ok(Json(TrustReport {
        generated_at: Utc::now(),
        installation_id: state.store.installation_id().await?.to_string(),
        telemetry: "none",
        pools,
        external_placements,
        not_enforced: not_enforced(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn credentials_are_references_with_fingerprints_never_values() {
        let file = std::env::temp_dir().join(format!("trust-{}", ulid::Ulid::new()));
        std::fs::write(&file, b"file-value-123\n").unwrap();
        let path = file.display().to_string();
        let s = serde_json::json!({
            "apiURL": "http://os:8090", "apiKeyEnv": "DIFFERENTLY_TEST_SURELY_UNSET_VAR",
            "tokenFile": path, "apiKeySecret": "os-key", "otherSecret": "gone",
            "apiKey": "s3cr3t", "image": "python:3.12"
        });
        let mut c = credentials(&s);
        let refs: Vec<(&str, &str)> = c.iter().map(|e| (e.kind, e.reference.as_str())).collect();
        let file_ref = format!("file:{path}");
        assert_eq!(
            refs,
            vec![
                ("env", "env:DIFFERENTLY_TEST_SURELY_UNSET_VAR"),
                ("file", file_ref.as_str()),
                ("inline", "inline:apiKey"),
                ("secret", "secret:gone"),
                ("secret", "secret:os-key"),
            ]
        );
        let at = Utc::now();
        let stored = SecretInfo {
            name: "os-key".into(),
            fingerprint: fingerprint(b"stored-value"),
            updated_by: "key:01ABC".into(),
            updated_at: at,
            created_at: at,
        };
        fingerprint_all(&mut c, &[stored]).await;
        let by = |r: &str| c.iter().find(|e| e.reference == r).unwrap().clone();
        assert!(by("env:DIFFERENTLY_TEST_SURELY_UNSET_VAR")
            .problem
            .is_some());
        let f = by(&file_ref);
        assert_eq!(f.fingerprint, Some(fingerprint(b"file-value-123")));
        assert!(f.updated_at.is_some());
        let sec = by("secret:os-key");
        assert_eq!(sec.fingerprint, Some(fingerprint(b"stored-value")));
        assert_eq!(sec.updated_by.as_deref(), Some("key:01ABC"));
        assert_eq!(sec.updated_at, Some(at));
        assert!(by("secret:gone").problem.is_some());
        let text = serde_json::to_string(&c).unwrap();
        for value in ["s3cr3t", "file-value-123", "stored-value"] {
            assert!(!text.contains(value), "{value} in {text}");
        }
        assert_eq!(endpoint(&s).as_deref(), Some("http://os:8090"));
        let _ = std::fs::remove_file(&file);
    }
}
