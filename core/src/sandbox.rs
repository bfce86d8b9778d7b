//! The sandbox as clients see it, the create request, and the validated spec built from it.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::resources::ResourcesRequest;
use crate::{FieldError, OrgId, ProjectId, Resources, SandboxId, SandboxStatus};

/// Labels under this prefix are reserved for Differently itself.
pub const RESERVED_LABEL_PREFIX: &str = "differently.dev/";
/// Label Differently sets on a sandbox created from a snapshot (restore or fork); its value
/// is the snapshot id, which the worker turns into the backend's snapshot ref.
pub const FROM_SNAPSHOT_LABEL: &str = "differently.dev/from-snapshot";

/// Checks labels a caller sets (at create and in `PATCH`): the reserved prefix is the
/// system's, keys are 1-63 characters without `=`, values at most 255.
pub fn validate_labels(labels: &BTreeMap<String, String>) -> Result<(), FieldError> {
    for (k, v) in labels {
        if k.starts_with(RESERVED_LABEL_PREFIX) {
            return Err(FieldError::new(
                format!("labels.{k}"),
                format!("the prefix {RESERVED_LABEL_PREFIX} is reserved"),
            ));
        }
        if k.is_empty() || k.chars().count() > 63 || v.chars().count() > 255 || k.contains('=') {
            return Err(FieldError::new(
                format!("labels.{k}"),
                "label keys are 1-63 characters without '=', values at most 255",
            ));
        }
    }
    Ok(())
}

/// Checks environment variable names (a sandbox's `env`, an exec's): letters, digits and
/// `_`, not starting with a digit; so never empty and never holding `=` or NUL.
pub fn validate_env_names(env: &BTreeMap<String, String>) -> Result<(), FieldError> {
    for k in env.keys() {
        let valid = !k.is_empty()
            && !k.starts_with(|c: char| c.is_ascii_digit())
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(FieldError::new(
                format!("env.{k}"),
                "environment variable names are letters, digits and _, not starting with a digit",
            ));
        }
    }
    Ok(())
}

/// Default TTL when a request gives none (seeds: 3600 s).
pub const DEFAULT_TTL_SECONDS: u64 = 3600;
/// Upper bound on a TTL: 30 days.
pub const MAX_TTL_SECONDS: u64 = 30 * 24 * 3600;
/// Upper bound on an idle timeout: the TTL's (a sandbox idle longer than it can live is
/// never idle). Bounded so that stored values always fit time arithmetic in both stores.
pub const MAX_IDLE_TIMEOUT_SECONDS: u64 = MAX_TTL_SECONDS;

/// Checks an idle timeout a caller sets (at create and in `PATCH`): 1 to
/// [`MAX_IDLE_TIMEOUT_SECONDS`].
pub fn validate_idle_timeout(seconds: Option<u64>) -> Result<(), FieldError> {
    match seconds {
        Some(s) if s == 0 || s > MAX_IDLE_TIMEOUT_SECONDS => Err(FieldError::new(
            "idleTimeoutSeconds",
            format!("must be between 1 and {MAX_IDLE_TIMEOUT_SECONDS}"),
        )),
        _ => Ok(()),
    }
}

/// Body of `POST /v1/sandboxes`. Every field is optional; unknown fields are refused.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateSandboxRequest {
    pub project_id: Option<ProjectId>,
    pub template: Option<String>,
    pub resources: Option<ResourcesRequest>,
    pub profile: Option<String>,
    pub env: Option<BTreeMap<String, String>>,
    pub labels: Option<BTreeMap<String, String>>,
    pub ttl_seconds: Option<u64>,
    pub idle_timeout_seconds: Option<u64>,
    pub capabilities: Option<Vec<String>>,
    pub classification: Option<String>,
    pub region: Option<String>,
    pub strategy: Option<String>,
    pub external: Option<String>,
    pub priority: Option<i32>,
    pub from_snapshot: Option<String>,
}

/// Classifications a request may carry, least to most sensitive.
pub const CLASSIFICATIONS: [&str; 4] = ["public", "internal", "confidential", "restricted"];

/// Capability names the API knows. A request naming another is a 422.
pub const KNOWN_CAPABILITIES: [&str; 11] = [
    "exec",
    "files",
    "exec.stream",
    "exec.pty",
    "exec.stdin",
    "lifecycle.pause",
    "lifecycle.stop",
    "snapshots",
    "ports.expose",
    "network.egress-control",
    "gpu",
];

/// Names [`profile`] knows, smallest first.
pub const PROFILES: [&str; 4] = ["small", "medium", "large", "xlarge"];

/// Named resource profiles.
pub fn profile(name: &str) -> Option<Resources> {
    let (cpu, memory_mib, disk_gib) = match name {
        "small" => (1, 1024, 5),
        "medium" => (2, 4096, 10),
        "large" => (4, 8192, 20),
        "xlarge" => (8, 16384, 50),
        _ => return None,
    };
    Some(Resources {
        cpu,
        memory_mib,
        disk_gib,
    })
}

/// A create request after defaults and validation: everything the store and the backend need.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxSpec {
    pub template: Option<String>,
    pub resources: Resources,
    pub env: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
    pub ttl_seconds: u64,
    pub idle_timeout_seconds: Option<u64>,
    pub capabilities: Vec<String>,
    pub classification: String,
    pub region: Option<String>,
    pub priority: i32,
    /// Ranking strategy asked for (`None`: the policy's default).
    #[serde(default)]
    pub strategy: Option<crate::policy::Strategy>,
    /// What the request allows of external pools.
    #[serde(default)]
    pub external: crate::policy::ExternalMode,
    /// Set for a restore or fork: the pool that holds the snapshot, the only one that can.
    #[serde(default)]
    pub pinned_pool: Option<String>,
}

/// The field (`labels.k`, or `labels` for a key) of the first label holding a NUL.
pub fn labels_nul_field(labels: &BTreeMap<String, String>) -> Option<String> {
    labels.iter().find_map(|(k, v)| {
        if k.contains('\0') {
            Some("labels".to_owned())
        } else if v.contains('\0') {
            Some(format!("labels.{k}"))
        } else {
            None
        }
    })
}

impl SandboxSpec {
    /// The first field holding a NUL character, which Postgres cannot store: the stores
    /// refuse such a spec alike (the API refuses it before).
    pub fn nul_field(&self) -> Option<String> {
        let nul = |s: &str| s.contains('\0');
        if let Some(f) = labels_nul_field(&self.labels) {
            return Some(f);
        }
        if let Some((k, _)) = self.env.iter().find(|(k, v)| nul(k) || nul(v)) {
            return Some(if nul(k) {
                "env".to_owned()
            } else {
                format!("env.{k}")
            });
        }
        let single = [
            ("template", self.template.as_deref()),
            ("region", self.region.as_deref()),
            ("classification", Some(self.classification.as_str())),
            ("pinnedPool", self.pinned_pool.as_deref()),
        ];
        if let Some((f, _)) = single.iter().find(|(_, v)| v.is_some_and(nul)) {
            return Some((*f).to_owned());
        }
        self.capabilities
            .iter()
            .position(|c| nul(c))
            .map(|i| format!("capabilities[{i}]"))
    }

    /// Replaces the caller's labels with `labels` (already validated), keeping the reserved
    /// ones the system set (e.g. which snapshot it was restored from).
    pub fn replace_labels(&mut self, labels: BTreeMap<String, String>) {
        self.labels
            .retain(|k, _| k.starts_with(RESERVED_LABEL_PREFIX));
        self.labels.extend(labels);
    }

    /// Applies defaults and checks every field; the error names the first bad field.
    pub fn build(req: &CreateSandboxRequest) -> Result<SandboxSpec, FieldError> {
        let base = match &req.profile {
            Some(p) => profile(p).ok_or_else(|| {
                FieldError::new(
                    "profile",
                    "unknown profile; expected small, medium, large or xlarge",
                )
            })?,
            None => Resources::DEFAULT,
        };
        let resources = req.resources.unwrap_or_default().resolve(base);
        resources.validate("resources")?;

        let env = req.env.clone().unwrap_or_default();
        validate_env_names(&env)?;
        if let Some(r) = &req.region {
            if r.is_empty() || r.chars().count() > 63 {
                return Err(FieldError::new("region", "must be 1-63 characters"));
            }
        }
        let labels = req.labels.clone().unwrap_or_default();
        validate_labels(&labels)?;
        let ttl_seconds = req.ttl_seconds.unwrap_or(DEFAULT_TTL_SECONDS);
        if ttl_seconds == 0 || ttl_seconds > MAX_TTL_SECONDS {
            return Err(FieldError::new(
                "ttlSeconds",
                format!("must be between 1 and {MAX_TTL_SECONDS}"),
            ));
        }
        validate_idle_timeout(req.idle_timeout_seconds)?;
        let mut capabilities = req.capabilities.clone().unwrap_or_default();
        capabilities.sort();
        capabilities.dedup();
        let classification = req
            .classification
            .clone()
            .unwrap_or_else(|| "internal".to_owned());
        if !CLASSIFICATIONS.contains(&classification.as_str()) {
            return Err(FieldError::new(
                "classification",
                format!("expected one of {}", CLASSIFICATIONS.join(", ")),
            ));
        }
        if let Some(t) = &req.template {
            if t.is_empty() || t.chars().count() > 512 {
                return Err(FieldError::new("template", "must be 1-512 characters"));
            }
        }
        if let Some(p) = req.priority {
            if !(-100..=100).contains(&p) {
                return Err(FieldError::new("priority", "must be between -100 and 100"));
            }
        }
        let strategy = req.strategy.as_deref().map(str::parse).transpose()?;
        let external = req
            .external
            .as_deref()
            .map(str::parse)
            .transpose()?
            .unwrap_or_default();
        Ok(SandboxSpec {
            pinned_pool: None,
            strategy,
            external,
            template: req.template.clone(),
            resources,
            env,
            labels,
            ttl_seconds,
            idle_timeout_seconds: req.idle_timeout_seconds,
            capabilities,
            classification,
            region: req.region.clone(),
            priority: req.priority.unwrap_or(0),
        })
    }

    /// Capability names this spec requires that the API does not know.
    pub fn unknown_capabilities(&self) -> Vec<&str> {
        crate::policy::capabilities::unknown(&self.capabilities)
    }

    /// What placement needs of this spec.
    pub fn placement_request(&self) -> crate::policy::PlacementRequest {
        crate::policy::PlacementRequest::from_spec(self, self.strategy, self.external)
    }
}

/// A sandbox as stored and as served. Env values are kept in `spec` but never serialized
/// to clients (`Sandbox::view` drops them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    pub id: SandboxId,
    pub org_id: OrgId,
    pub project_id: ProjectId,
    pub status: SandboxStatus,
    pub status_reason: Option<String>,
    /// Bumped by every status change; bus envelopes carry it so consumers can drop stale work.
    pub status_version: i64,
    pub pool: Option<String>,
    /// The backend's own id for the instance, once created.
    pub backend_ref: Option<String>,
    pub spec: SandboxSpec,
    pub attempts: u32,
    pub idempotency_key: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub expires_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
    /// The warm class whose instance this sandbox claimed. That instance was created before
    /// the sandbox, with no env, so every data-plane call on it carries the sandbox's env.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_class: Option<String>,
}

/// The client-facing JSON shape of a sandbox (API.md): env keys only, no backend internals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxView {
    pub id: SandboxId,
    pub org_id: OrgId,
    pub project_id: ProjectId,
    pub status: SandboxStatus,
    #[schema(required)]
    pub status_reason: Option<String>,
    #[schema(required)]
    pub pool: Option<String>,
    pub resources: Resources,
    pub capabilities: Vec<String>,
    pub classification: String,
    #[schema(required)]
    pub region: Option<String>,
    pub labels: BTreeMap<String, String>,
    #[schema(required)]
    pub template: Option<String>,
    pub env_keys: Vec<String>,
    pub ttl_seconds: u64,
    #[schema(required)]
    pub idle_timeout_seconds: Option<u64>,
    pub priority: i32,
    pub attempts: u32,
    pub created_at: DateTime<Utc>,
    #[schema(required)]
    pub started_at: Option<DateTime<Utc>>,
    #[schema(required)]
    pub expires_at: Option<DateTime<Utc>>,
    #[schema(required)]
    pub ended_at: Option<DateTime<Utc>>,
}

impl Sandbox {
    /// A new queued sandbox for an admitted spec.
    pub fn queued(
        org_id: OrgId,
        project_id: ProjectId,
        spec: SandboxSpec,
        idempotency_key: Option<String>,
        now: DateTime<Utc>,
    ) -> Sandbox {
        Sandbox {
            id: SandboxId::new(),
            org_id,
            project_id,
            status: SandboxStatus::Queued,
            status_reason: None,
            status_version: 1,
            pool: None,
            backend_ref: None,
            spec,
            attempts: 0,
            idempotency_key,
            created_at: now,
            updated_at: now,
            started_at: None,
            expires_at: None,
            ended_at: None,
            warm_class: None,
        }
    }

    /// What a client may see of this sandbox.
    pub fn view(&self) -> SandboxView {
        SandboxView {
            id: self.id.clone(),
            org_id: self.org_id.clone(),
            project_id: self.project_id.clone(),
            status: self.status,
            status_reason: self.status_reason.clone(),
            pool: self.pool.clone(),
            resources: self.spec.resources,
            capabilities: self.spec.capabilities.clone(),
            classification: self.spec.classification.clone(),
            region: self.spec.region.clone(),
            labels: self.spec.labels.clone(),
            template: self.spec.template.clone(),
            env_keys: self.spec.env.keys().cloned().collect(),
            ttl_seconds: self.spec.ttl_seconds,
            idle_timeout_seconds: self.spec.idle_timeout_seconds,
            priority: self.spec.priority,
            attempts: self.attempts,
            created_at: self.created_at,
            started_at: self.started_at,
            expires_at: self.expires_at,
            ended_at: self.ended_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(json: &str) -> Result<CreateSandboxRequest, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn every_listed_profile_resolves_and_they_grow() {
        let sizes: Vec<Resources> = PROFILES
            .iter()
            .map(|p| profile(p).unwrap_or_else(|| panic!("profile {p} does not resolve")))
            .collect();
        assert!(sizes.windows(2).all(|w| w[0].cpu < w[1].cpu), "{sizes:?}");
        assert_eq!(profile("huge"), None);
    }

    #[test]
    fn empty_request_gets_defaults() {
        let spec = SandboxSpec::build(&req("{}").unwrap()).unwrap();
        assert_eq!(spec.resources, Resources::DEFAULT);
        assert_eq!(spec.ttl_seconds, DEFAULT_TTL_SECONDS);
        assert_eq!(spec.classification, "internal");
    }

    #[test]
    fn unknown_fields_and_wrong_types_are_refused() {
        assert!(req(r#"{"bogus": 1}"#).is_err());
        assert!(req(r#"{"resources": {"cpu": "two"}}"#).is_err());
        assert!(req(r#"{"resources": {"cpu": -1}}"#).is_err());
    }

    #[test]
    fn bad_values_name_their_field() {
        let cases = [
            (r#"{"resources": {"cpu": 1000}}"#, "resources.cpu"),
            (r#"{"ttlSeconds": 0}"#, "ttlSeconds"),
            (
                r#"{"labels": {"differently.dev/x": "y"}}"#,
                "labels.differently.dev/x",
            ),
            (r#"{"env": {"1BAD": "y"}}"#, "env.1BAD"),
            (r#"{"classification": "secret"}"#, "classification"),
            (r#"{"profile": "huge"}"#, "profile"),
            (r#"{"priority": 1000}"#, "priority"),
            (r#"{"idleTimeoutSeconds": 0}"#, "idleTimeoutSeconds"),
            (
                r#"{"idleTimeoutSeconds": 18446744073709551615}"#,
                "idleTimeoutSeconds",
            ),
            (r#"{"idleTimeoutSeconds": 2592001}"#, "idleTimeoutSeconds"),
            (r#"{"region": ""}"#, "region"),
            (r#"{"env": {"A=B": "y"}}"#, "env.A=B"),
            (r#"{"env": {"": "y"}}"#, "env."),
        ];
        for (json, field) in cases {
            let e = SandboxSpec::build(&req(json).unwrap()).unwrap_err();
            assert_eq!(e.field, field, "{json}");
        }
    }

    #[test]
    fn lengths_count_characters_not_bytes() {
        let key = "é".repeat(63);
        let value = "é".repeat(255);
        let labels = [(key, value)].into_iter().collect();
        assert_eq!(validate_labels(&labels), Ok(()));
        let template = format!(
            r#"{{"template": "{}", "region": "{}"}}"#,
            "é".repeat(512),
            "é".repeat(63)
        );
        assert!(SandboxSpec::build(&req(&template).unwrap()).is_ok());
        let long = format!(r#"{{"template": "{}"}}"#, "é".repeat(513));
        assert_eq!(
            SandboxSpec::build(&req(&long).unwrap()).unwrap_err().field,
            "template"
        );
    }

    #[test]
    fn view_shows_env_keys_never_values() {
        let spec = SandboxSpec::build(&req(r#"{"env": {"TOKEN": "s3cret"}}"#).unwrap()).unwrap();
        let sbx = Sandbox::queued(OrgId::new(), ProjectId::new(), spec, None, Utc::now());
        let json = serde_json::to_string(&sbx.view()).unwrap();
        assert!(json.contains("TOKEN"));
        assert!(!json.contains("s3cret"));
        assert!(json.contains("\"memoryMiB\""));
    }
}
