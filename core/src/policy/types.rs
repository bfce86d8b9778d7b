//! Inputs of the engine: policy levels and their intersection, the request, the pool profile.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::capabilities;
use crate::pool::{validate_pool_name, PoolView, Trust};
use crate::sandbox::CLASSIFICATIONS;
use crate::{CreateSandboxRequest, FieldError, Resources, SandboxSpec};

/// Classifications that never go to an external pool, whatever any policy says.
pub const SENSITIVE_CLASSIFICATIONS: [&str; 2] = ["confidential", "restricted"];

/// Whether `classification` must stay on private pools. Names outside the configured set
/// count as sensitive: an unvalidated value fails closed.
pub fn is_sensitive(classification: &str) -> bool {
    SENSITIVE_CLASSIFICATIONS.contains(&classification)
        || !CLASSIFICATIONS.contains(&classification)
}

/// How eligible pools are ordered. Security and residency are filters, never ranked.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// Private pools before external ones; then cost, speed, locality, headroom.
    #[default]
    PrivateFirst,
    /// Lowest hourly cost for the requested CPUs first.
    Cheapest,
    /// Shortest typical create time first.
    Fastest,
    /// Most free concurrency slots (relative to the cap) first.
    LeastLoaded,
}

impl Strategy {
    /// Every strategy, in documentation order.
    pub const ALL: [Strategy; 4] = [
        Strategy::PrivateFirst,
        Strategy::Cheapest,
        Strategy::Fastest,
        Strategy::LeastLoaded,
    ];

    /// The wire name, e.g. `private-first`.
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::PrivateFirst => "private-first",
            Strategy::Cheapest => "cheapest",
            Strategy::Fastest => "fastest",
            Strategy::LeastLoaded => "least-loaded",
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Strategy {
    type Err = FieldError;

    /// Parses a wire name; the error names the `strategy` field and lists the valid names.
    fn from_str(s: &str) -> Result<Self, FieldError> {
        Strategy::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Strategy::ALL.iter().map(|v| v.as_str()).collect();
                FieldError::new(
                    "strategy",
                    format!(
                        "unknown strategy {s:?}; expected one of {}",
                        names.join(", ")
                    ),
                )
            })
    }
}

/// What the request says about external pools. It can only narrow what policy permits:
/// an external pool still needs every policy level to allow it and the pool to be named.
///
/// The default is `allowed` because the gate is the policy, which already requires an
/// explicit `allowExternal: true` at all three levels; `never` lets a caller opt out.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum ExternalMode {
    /// Private pools only.
    Never,
    /// External pools when policy permits (ranked by the strategy).
    #[default]
    Allowed,
    /// External pools only (still subject to policy).
    Required,
}

impl ExternalMode {
    /// Every mode, in documentation order.
    pub const ALL: [ExternalMode; 3] = [
        ExternalMode::Never,
        ExternalMode::Allowed,
        ExternalMode::Required,
    ];

    /// The wire name, e.g. `never`.
    pub fn as_str(self) -> &'static str {
        match self {
            ExternalMode::Never => "never",
            ExternalMode::Allowed => "allowed",
            ExternalMode::Required => "required",
        }
    }
}

impl fmt::Display for ExternalMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ExternalMode {
    type Err = FieldError;

    /// Parses a wire name; the error names the `external` field.
    fn from_str(s: &str) -> Result<Self, FieldError> {
        ExternalMode::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<_> = ExternalMode::ALL.iter().map(|v| v.as_str()).collect();
                FieldError::new(
                    "external",
                    format!(
                        "unknown external mode {s:?}; expected one of {}",
                        names.join(", ")
                    ),
                )
            })
    }
}

/// The level a policy is set at. Higher levels bound lower ones.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Global,
    Org,
    Project,
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Level::Global => "global",
            Level::Org => "org",
            Level::Project => "project",
        })
    }
}

/// One level of placement policy, as the admin API stores it. An absent field adds no
/// restriction at this level, except external placement, which fails closed: absent
/// `allowExternal` means not allowed, and an absent global `externalPools` names no pool.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Policy {
    /// Classifications allowed on any pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_classifications: Option<Vec<String>>,
    /// Per pool name: the classifications allowed on that pool. Unlisted pools are not
    /// restricted by this map.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pool_classifications: BTreeMap<String, Vec<String>>,
    /// Regions a pool must be in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_regions: Option<Vec<String>>,
    /// Whether this level allows external pools at all; absent means no.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_external: Option<bool>,
    /// External pools this level names. Absent at the global level names none; absent at a
    /// lower level keeps the higher levels' list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_pools: Option<Vec<String>>,
    /// Pools never used under this level.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub denied_pools: Vec<String>,
    /// Strategy for requests that name none; the most specific level that sets one wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_strategy: Option<Strategy>,
}

impl Policy {
    /// Checks names for the admin API; the error names the first bad field.
    pub fn validate(&self) -> Result<(), FieldError> {
        let check_classes = |field: &str, list: &[String]| {
            for c in list {
                if !CLASSIFICATIONS.contains(&c.as_str()) {
                    return Err(FieldError::new(
                        field,
                        format!(
                            "unknown classification {c:?}; expected one of {}",
                            CLASSIFICATIONS.join(", ")
                        ),
                    ));
                }
            }
            Ok(())
        };
        let check_pool = |field: &str, name: &str| {
            validate_pool_name(name).map_err(|e| FieldError::new(field, e.message))
        };
        if let Some(list) = &self.allowed_classifications {
            check_classes("allowedClassifications", list)?;
        }
        for (pool, list) in &self.pool_classifications {
            let field = format!("poolClassifications.{pool}");
            check_pool(&field, pool)?;
            check_classes(&field, list)?;
        }
        for r in self.allowed_regions.iter().flatten() {
            if r.is_empty() || r.chars().count() > 63 {
                return Err(FieldError::new(
                    "allowedRegions",
                    "region names are 1-63 characters",
                ));
            }
        }
        for p in self.external_pools.iter().flatten() {
            check_pool("externalPools", p)?;
        }
        for p in &self.denied_pools {
            check_pool("deniedPools", p)?;
        }
        Ok(())
    }
}

/// The intersection of the global, org and project policies: what the engine applies.
/// Any level can forbid; no level can widen what a higher one forbids.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EffectivePolicy {
    /// Classifications allowed on any pool; `None` means every level left it open.
    #[schema(required)]
    pub allowed_classifications: Option<BTreeSet<String>>,
    /// Per pool: classifications allowed there (intersected across levels).
    pub pool_classifications: BTreeMap<String, BTreeSet<String>>,
    /// Regions allowed; `None` means every level left it open.
    #[schema(required)]
    pub allowed_regions: Option<BTreeSet<String>>,
    /// The first level that does not allow external placement, if any.
    #[schema(required)]
    pub external_forbidden_by: Option<Level>,
    /// External pools named by the global level and by every lower level that names any.
    pub external_pools: BTreeSet<String>,
    /// Pools denied by any level.
    pub denied_pools: BTreeSet<String>,
    /// Strategy for requests that name none.
    pub default_strategy: Strategy,
}

impl Default for EffectivePolicy {
    /// No policy anywhere: everything private is open, nothing external is.
    fn default() -> Self {
        let none = Policy::default();
        EffectivePolicy::intersect(&none, &none, &none)
    }
}

fn narrow(acc: Option<BTreeSet<String>>, list: Option<&Vec<String>>) -> Option<BTreeSet<String>> {
    match (acc, list) {
        (acc, None) => acc,
        (None, Some(l)) => Some(l.iter().cloned().collect()),
        (Some(a), Some(l)) => Some(a.into_iter().filter(|x| l.contains(x)).collect()),
    }
}

impl EffectivePolicy {
    /// Intersects the three levels (pass `Policy::default()` for a level with no policy).
    pub fn intersect(global: &Policy, org: &Policy, project: &Policy) -> EffectivePolicy {
        let levels = [
            (Level::Global, global),
            (Level::Org, org),
            (Level::Project, project),
        ];
        let mut classes = None;
        let mut regions = None;
        let mut pool_classes: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut denied = BTreeSet::new();
        let mut forbidden_by = None;
        let mut external: BTreeSet<String> =
            global.external_pools.iter().flatten().cloned().collect();
        for (level, p) in levels {
            classes = narrow(classes, p.allowed_classifications.as_ref());
            regions = narrow(regions, p.allowed_regions.as_ref());
            for (pool, list) in &p.pool_classifications {
                let prev = pool_classes.remove(pool);
                let next = narrow(prev, Some(list)).unwrap_or_default();
                pool_classes.insert(pool.clone(), next);
            }
            denied.extend(p.denied_pools.iter().cloned());
            if forbidden_by.is_none() && p.allow_external != Some(true) {
                forbidden_by = Some(level);
            }
            if level != Level::Global {
                if let Some(list) = &p.external_pools {
                    external.retain(|x| list.contains(x));
                }
            }
        }
        EffectivePolicy {
            allowed_classifications: classes,
            pool_classifications: pool_classes,
            allowed_regions: regions,
            external_forbidden_by: forbidden_by,
            external_pools: external,
            denied_pools: denied,
            default_strategy: project
                .default_strategy
                .or(org.default_strategy)
                .or(global.default_strategy)
                .unwrap_or_default(),
        }
    }

    /// Whether every level allows external placement.
    pub fn allows_external(&self) -> bool {
        self.external_forbidden_by.is_none()
    }

    /// Whether `classification` may run on the pool called `pool` (trust aside).
    pub fn allows_classification(&self, pool: &str, classification: &str) -> bool {
        self.allowed_classifications
            .as_ref()
            .is_none_or(|s| s.contains(classification))
            && self
                .pool_classifications
                .get(pool)
                .is_none_or(|s| s.contains(classification))
    }

    /// Whether a pool in `region` may be used (`None`: the pool declares no region).
    pub fn allows_region(&self, region: Option<&str>) -> bool {
        match (&self.allowed_regions, region) {
            (None, _) => true,
            (Some(set), Some(r)) => set.contains(r),
            (Some(_), None) => false,
        }
    }
}

/// Declared isolation of a pool's runtime (reported, not checked, by Differently).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// Containers sharing the host kernel (Docker, Kubernetes runtimes).
    Container,
    /// One microVM per sandbox (Fast Sandbox).
    Microvm,
}

/// Create time assumed for a pool that declares none: pessimistic, so `fastest` prefers
/// pools that say how fast they are.
pub const UNKNOWN_CREATE_SECONDS: f64 = 60.0;

/// A pool as the engine sees it: the shared [`PoolView`] plus what ranking and capacity
/// need. Built by the pool manager from config and live state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolProfile {
    /// Name, trust, region, capabilities, concurrency cap, health.
    #[serde(flatten)]
    pub view: PoolView,
    /// Declared isolation; implies the matching `isolation.*` capability.
    #[serde(default)]
    pub isolation: Option<Isolation>,
    /// Cost model: currency units per CPU-hour; 0 when the operator declares none.
    #[serde(default)]
    pub cost_per_cpu_hour: f64,
    /// Speed hint: typical seconds from create to running.
    #[serde(default)]
    pub typical_create_seconds: Option<f64>,
    /// Concurrency slots in use now (compared with `view.max_concurrent`).
    #[serde(default)]
    pub used_slots: u32,
    /// Largest sandbox the pool can run, if limited.
    #[serde(default)]
    pub max_sandbox: Option<Resources>,
}

impl PoolProfile {
    /// A profile with no cost, speed, isolation or size declared and no slots used.
    pub fn new(view: PoolView) -> PoolProfile {
        PoolProfile {
            view,
            isolation: None,
            cost_per_cpu_hour: 0.0,
            typical_create_seconds: None,
            used_slots: 0,
            max_sandbox: None,
        }
    }

    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.view.name
    }

    /// Whether the pool runs on third-party infrastructure.
    pub fn is_external(&self) -> bool {
        self.view.trust == Trust::External
    }
}

/// What placement needs of one sandbox request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlacementRequest {
    /// CPU, memory and disk asked for.
    pub resources: Resources,
    /// Required capability names (see [`capabilities::CAPABILITIES`]).
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// Data classification, one of [`CLASSIFICATIONS`].
    pub classification: String,
    /// Hard residency constraint: only pools in this region.
    #[serde(default)]
    pub region: Option<String>,
    /// Ranking strategy; `None` uses the policy's default.
    #[serde(default)]
    pub strategy: Option<Strategy>,
    /// What the request allows of external pools.
    #[serde(default)]
    pub external: ExternalMode,
    /// Soft locality preference (e.g. the caller's region); only ranks.
    #[serde(default)]
    pub prefer_region: Option<String>,
    /// Only this pool may run it (a restore or fork, where the snapshot lives).
    #[serde(default)]
    pub pinned_pool: Option<String>,
}

impl PlacementRequest {
    /// The request for an already built spec, with strategy and external mode given apart
    /// (the spec does not carry them).
    pub fn from_spec(
        spec: &SandboxSpec,
        strategy: Option<Strategy>,
        external: ExternalMode,
    ) -> PlacementRequest {
        PlacementRequest {
            resources: spec.resources,
            capabilities: spec.capabilities.clone(),
            classification: spec.classification.clone(),
            region: spec.region.clone(),
            strategy,
            external,
            prefer_region: None,
            pinned_pool: spec.pinned_pool.clone(),
        }
    }

    /// Parses `strategy` and `external` from the create body, builds the request for `spec`
    /// and validates it; the error names the offending field.
    pub fn from_create(
        create: &CreateSandboxRequest,
        spec: &SandboxSpec,
    ) -> Result<PlacementRequest, FieldError> {
        let strategy = create.strategy.as_deref().map(str::parse).transpose()?;
        let external = create
            .external
            .as_deref()
            .map(str::parse)
            .transpose()?
            .unwrap_or_default();
        let req = PlacementRequest::from_spec(spec, strategy, external);
        req.validate()?;
        Ok(req)
    }

    /// Checks the request-level fields: capability names, classification, region.
    pub fn validate(&self) -> Result<(), FieldError> {
        let unknown = capabilities::unknown(&self.capabilities);
        if !unknown.is_empty() {
            return Err(FieldError::new(
                "capabilities",
                format!("unknown capabilities: {}", unknown.join(", ")),
            ));
        }
        if !CLASSIFICATIONS.contains(&self.classification.as_str()) {
            return Err(FieldError::new(
                "classification",
                format!("expected one of {}", CLASSIFICATIONS.join(", ")),
            ));
        }
        if let Some(r) = &self.region {
            if r.is_empty() || r.chars().count() > 63 {
                return Err(FieldError::new("region", "must be 1-63 characters"));
            }
        }
        Ok(())
    }
}
