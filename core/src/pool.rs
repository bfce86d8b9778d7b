//! What placement needs to know about a pool.

use serde::{Deserialize, Serialize};

/// Whether a pool runs on infrastructure the operator controls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Trust {
    Private,
    External,
}

/// A pool as the placement decision sees it at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolView {
    pub name: String,
    pub kind: String,
    pub trust: Trust,
    pub region: Option<String>,
    pub capabilities: Vec<String>,
    /// Concurrency cap (slots), if any.
    pub max_concurrent: Option<u32>,
    pub healthy: bool,
}

impl PoolView {
    /// Whether the pool offers every capability in `required`.
    pub fn offers_all(&self, required: &[String]) -> bool {
        required.iter().all(|c| self.capabilities.contains(c))
    }
}

/// Bounds of a pool's numbers (NaN and infinities fall outside them): large enough for any
/// real pool, small enough that ranking arithmetic on them stays finite. The same for a pool
/// from the config file and one from the admin API ([`check_pool_bounds`]).
pub const MAX_POOL_CONCURRENT: u32 = 1_000_000;
/// Highest `cost_per_cpu_hour`.
pub const MAX_COST_PER_CPU_HOUR: f64 = 1_000_000.0;
/// Highest `typical_create_seconds` (a day).
pub const MAX_TYPICAL_CREATE_SECONDS: f64 = 86_400.0;
/// Longest region name, in characters.
pub const MAX_REGION_CHARS: usize = 63;

/// A bounded field of a pool, named as each source spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolField {
    Region,
    MaxConcurrent,
    CostPerCpuHour,
    TypicalCreateSeconds,
}

impl PoolField {
    /// The admin API's (JSON) name.
    pub fn api_name(self) -> &'static str {
        match self {
            PoolField::Region => "region",
            PoolField::MaxConcurrent => "maxConcurrent",
            PoolField::CostPerCpuHour => "costPerCpuHour",
            PoolField::TypicalCreateSeconds => "typicalCreateSeconds",
        }
    }

    /// The config file's (TOML) name.
    pub fn config_name(self) -> &'static str {
        match self {
            PoolField::Region => "region",
            PoolField::MaxConcurrent => "max_concurrent",
            PoolField::CostPerCpuHour => "cost_per_cpu_hour",
            PoolField::TypicalCreateSeconds => "typical_create_seconds",
        }
    }
}

/// The bounded fields of a pool, however it was defined.
#[derive(Debug, Clone, Copy, Default)]
pub struct PoolBounds<'a> {
    pub region: Option<&'a str>,
    pub max_concurrent: Option<u32>,
    pub cost_per_cpu_hour: Option<f64>,
    pub typical_create_seconds: Option<f64>,
}

/// The one bounds check of a pool's fields, for the config file and the admin API alike:
/// the first field out of bounds, with what its bound is.
pub fn check_pool_bounds(p: PoolBounds<'_>) -> Result<(), (PoolField, String)> {
    if let Some(g) = p.region {
        if g.is_empty() || g.chars().count() > MAX_REGION_CHARS || g.chars().any(char::is_control) {
            return Err((
                PoolField::Region,
                format!("must be 1-{MAX_REGION_CHARS} characters, none of them control characters"),
            ));
        }
    }
    if p.max_concurrent
        .is_some_and(|m| m == 0 || m > MAX_POOL_CONCURRENT)
    {
        return Err((
            PoolField::MaxConcurrent,
            format!("must be between 1 and {MAX_POOL_CONCURRENT}"),
        ));
    }
    if p.cost_per_cpu_hour
        .is_some_and(|c| !(0.0..=MAX_COST_PER_CPU_HOUR).contains(&c))
    {
        return Err((
            PoolField::CostPerCpuHour,
            format!("must be a number between 0 and {MAX_COST_PER_CPU_HOUR}"),
        ));
    }
    if p.typical_create_seconds
        .is_some_and(|t| !(0.0..=MAX_TYPICAL_CREATE_SECONDS).contains(&t))
    {
        return Err((
            PoolField::TypicalCreateSeconds,
            format!("must be a number between 0 and {MAX_TYPICAL_CREATE_SECONDS}"),
        ));
    }
    Ok(())
}

/// Pool names are used in bus subjects, so they are kept to a safe alphabet.
pub fn validate_pool_name(name: &str) -> Result<(), crate::FieldError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(crate::FieldError::new(
            "name",
            "pool names are 1-63 characters of a-z, 0-9 and -, not starting with -",
        ))
    }
}

/// Where a pool's definition comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum PoolSource {
    /// The server's configuration file (re-applied at every start).
    Config,
    /// The admin API (stored in the database).
    Api,
}

/// A registered pool: what the operator declared. Settings hold credential *references*
/// (an env var name, a file path, a sealed secret's name), never credential values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolRecord {
    pub name: String,
    pub kind: String,
    pub trust: Trust,
    #[serde(default)]
    #[schema(required)]
    pub region: Option<String>,
    #[serde(default)]
    #[schema(required)]
    pub max_concurrent: Option<u32>,
    /// Declared isolation of the backend runtime (reported, not verified).
    #[serde(default)]
    #[schema(required)]
    pub isolation: Option<crate::policy::Isolation>,
    /// Cost model: currency units per CPU-hour.
    #[serde(default)]
    #[schema(required)]
    pub cost_per_cpu_hour: f64,
    /// Speed hint: typical seconds from create to running.
    #[serde(default)]
    #[schema(required)]
    pub typical_create_seconds: Option<f64>,
    /// Adapter-specific settings.
    #[serde(default)]
    #[schema(required)]
    pub settings: serde_json::Value,
    pub source: PoolSource,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

/// How a pool's trust is decided from its adapter kind (seeds' rules). Which kind follows
/// which rule is the adapter registry's knowledge, not core's: core only applies the rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrustRule {
    /// The backend always runs on third-party infrastructure (providers): `external`, and
    /// declaring `private` is an error.
    ForcedExternal,
    /// Trust depends on where the operator runs the backend: it must be declared.
    MustDeclare,
    /// `private` unless the operator declares otherwise.
    PrivateByDefault,
    /// `external` unless the operator declares `private`: a protocol spoken both by a
    /// provider's cloud and by servers an operator runs (e2b: E2B's cloud or self-hosted infra).
    ExternalByDefault,
}

/// The trust a pool of `kind` gets under `rule`, given what the operator declared. `kind`
/// only names the pool's kind in error messages.
pub fn resolve_trust(
    kind: &str,
    rule: TrustRule,
    declared: Option<Trust>,
) -> Result<Trust, crate::FieldError> {
    match rule {
        TrustRule::ForcedExternal => match declared {
            Some(Trust::Private) => Err(crate::FieldError::new(
                "trust",
                format!("{kind} runs on third-party infrastructure: its trust is always external"),
            )),
            _ => Ok(Trust::External),
        },
        TrustRule::MustDeclare => declared.ok_or_else(|| {
            crate::FieldError::new(
                "trust",
                format!("{kind} pools must declare trust (private if you run the server, external otherwise)"),
            )
        }),
        TrustRule::PrivateByDefault => Ok(declared.unwrap_or(Trust::Private)),
        TrustRule::ExternalByDefault => Ok(declared.unwrap_or(Trust::External)),
    }
}

/// How far an adapter's behaviour against its backend has been checked, as an operator
/// choosing among backends needs to know: run here against the real thing, checked against
/// recorded exchanges, or only against a fake written from the provider's spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum VerifiedStatus {
    /// Run against the real backend (or the backend runs in this process).
    Live,
    /// Checked against exchanges recorded from the real backend.
    Replayed,
    /// Checked only against a fake server written from the provider's published API.
    FakeOnly,
    /// Nothing this build knows of: a plugin, or a backend version never checked.
    Unknown,
}

/// What a prober's adapter found out about its backend: the version it detected and how far
/// this build has verified that backend. Stored with the pool's health so every API process
/// can show it, also one whose own adapter has not called the backend yet (in a split
/// deployment the workers probe, the API processes do not).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendSeen {
    pub version: Option<String>,
    pub verified: VerifiedStatus,
    pub verified_basis: String,
}

/// The live health of a pool as its workers last saw it: one fleet-wide view.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolHealth {
    pub name: String,
    pub healthy: bool,
    pub capabilities: Vec<String>,
    /// The probe's error when unhealthy (no credentials in it).
    #[schema(required)]
    pub error: Option<String>,
    pub checked_at: chrono::DateTime<chrono::Utc>,
    /// Which process probed (host:pid), for operators.
    pub checked_by: String,
    /// What the probe's adapter knew of the backend. Kept with the record, never served in
    /// it: the pool's own `backendVersion` and `verified` fields show it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(ignore)]
    pub backend: Option<BackendSeen>,
}

/// Whether `name` can name a stored secret (a pool credential may reference one):
/// 1–63 of `a-z 0-9 . _ -`, starting with a letter or digit. One rule for the store, which
/// keeps secrets, and the adapters, which reference them.
pub fn valid_secret_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trust_rules_follow_the_seeds() {
        use TrustRule::*;
        assert_eq!(
            resolve_trust("daytona", ForcedExternal, None),
            Ok(Trust::External)
        );
        assert!(resolve_trust("daytona", ForcedExternal, Some(Trust::Private)).is_err());
        assert_eq!(
            resolve_trust("opensandbox", MustDeclare, Some(Trust::Private)),
            Ok(Trust::Private)
        );
        assert_eq!(
            resolve_trust("opensandbox", MustDeclare, None)
                .unwrap_err()
                .field,
            "trust"
        );
        assert_eq!(
            resolve_trust("fake", PrivateByDefault, None),
            Ok(Trust::Private)
        );
        assert_eq!(
            resolve_trust("remote", PrivateByDefault, Some(Trust::External)),
            Ok(Trust::External)
        );
        assert_eq!(
            resolve_trust("e2b", ExternalByDefault, None),
            Ok(Trust::External)
        );
        assert_eq!(
            resolve_trust("e2b", ExternalByDefault, Some(Trust::Private)),
            Ok(Trust::Private)
        );
    }
}
