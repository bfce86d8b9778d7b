//! `GET /v1/admin/trust-report`: what an operator needs to answer "where did tenants' work
//! run, under which rules, and what does Differently itself not guarantee". Pools are shown
//! with their declared trust, isolation and endpoint, credentials only as references.

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use differently_core::pool::{PoolHealth, PoolRecord, Trust};
use differently_core::ErrorCode;
use serde::Serialize;
use serde_json::Value;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::AppState;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new().route("/v1/admin/trust-report", get(report))
}

/// The whole report.
#[derive(Serialize)]
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
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PoolEntry {
    name: String,
    kind: String,
    trust: Trust,
    region: Option<String>,
    /// Declared, not verified; `none` for devhost, `undeclared` when the operator said nothing.
    isolation: String,
    egress: String,
    endpoint: Option<String>,
    /// How the credential is referenced (`env:NAME`, `file:PATH`, `secret:NAME`); never a value.
    credentials: Vec<String>,
    source: differently_core::pool::PoolSource,
    healthy: bool,
    health: Option<PoolHealth>,
    /// Backend versions, when the adapter reports them (none does yet).
    versions: Option<Value>,
}

/// Sandboxes of one organization placed on one external pool.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ExternalPlacement {
    org_id: String,
    org_name: Option<String>,
    pool: String,
    sandboxes: u64,
    first_at: DateTime<Utc>,
    last_at: DateTime<Utc>,
    /// The effective policy the latest of them was placed under.
    policy: Option<Value>,
}

/// What Differently does not enforce, stated plainly.
const NOT_ENFORCED: [&str; 6] = [
    "Differently does not isolate sandboxes: isolation comes from each pool's runtime; the isolation listed per pool is what the operator declared, not something Differently checked.",
    "Containers from the Docker and Kubernetes runtimes share the host kernel; only microVM runtimes (Fast Sandbox) give each sandbox its own kernel.",
    "Differently does not configure sandbox networking or egress; whatever the pool's runtime and the operator's network allow is allowed.",
    "devhost pools run commands as local processes (under bubblewrap when installed, otherwise with no isolation at all); they are for development only.",
    "Sandbox environment variable values are stored in the database in plaintext (they are never served back).",
    "External pools run on third-party infrastructure; Differently only decides whether work may go there, by policy.",
];

/// Keys of adapter settings that name an endpoint.
fn endpoint(settings: &Value) -> Option<String> {
    let obj = settings.as_object()?;
    ["apiURL", "apiUrl", "url", "endpoint", "baseUrl"]
        .iter()
        .find_map(|k| obj.get(*k).and_then(Value::as_str).map(str::to_owned))
}

/// Credential references in adapter settings: `*Env` → `env:`, `*File` → `file:`,
/// `*Secret` → `secret:`. Values of any other key are never read.
fn credentials(settings: &Value) -> Vec<String> {
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
        if k.ends_with("Env") {
            out.push(format!("env:{v}"));
        } else if k.ends_with("File") {
            out.push(format!("file:{v}"));
        } else if k.ends_with("Secret") || k.ends_with("SecretName") {
            out.push(format!("secret:{v}"));
        } else {
            out.push(format!(
                "inline:{k} (a value in the config; move it to a reference)"
            ));
        }
    }
    out.sort();
    out
}

fn isolation(r: &PoolRecord) -> String {
    if r.kind == "devhost" {
        return r
            .settings
            .get("isolation")
            .and_then(Value::as_str)
            .unwrap_or("auto")
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
    let pools: Vec<PoolEntry> = records
        .iter()
        .map(|r| PoolEntry {
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
            health: health.iter().find(|h| h.name == r.name).cloned(),
            versions: None,
        })
        .collect();
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
        not_enforced: NOT_ENFORCED.to_vec(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_references_never_values() {
        let s = serde_json::json!({
            "apiURL": "http://os:8090", "apiKeyEnv": "OS_KEY", "tokenFile": "/run/tok",
            "apiKey": "s3cr3t", "image": "python:3.12"
        });
        let c = credentials(&s);
        assert_eq!(
            c,
            vec![
                "env:OS_KEY",
                "file:/run/tok",
                "inline:apiKey (a value in the config; move it to a reference)"
            ]
        );
        assert!(!c.iter().any(|x| x.contains("s3cr3t")));
        assert_eq!(endpoint(&s).as_deref(), Some("http://os:8090"));
    }
}
