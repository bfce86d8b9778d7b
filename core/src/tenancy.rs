//! Tenancy: organizations, projects, API key records, scopes, quotas and usage.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::{FieldError, KeyId, OrgId, ProjectId, Resources, SandboxStatus};

/// Whether an organization may change anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OrgStatus {
    Active,
    /// Its keys can only read.
    Suspended,
}

/// An organization: the unit of quota and fairness.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Org {
    pub id: OrgId,
    pub name: String,
    pub status: OrgStatus,
    pub created_at: DateTime<Utc>,
}

/// A project inside an organization.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Project {
    pub id: ProjectId,
    pub org_id: OrgId,
    pub name: String,
    pub created_at: DateTime<Utc>,
}

/// Checks an organization or project name.
pub fn validate_name(field: &str, name: &str) -> Result<(), FieldError> {
    let ok = !name.trim().is_empty()
        && name.chars().count() <= 100
        && !name.chars().any(|c| c.is_control());
    if ok {
        Ok(())
    } else {
        Err(FieldError::new(
            field,
            "must be 1-100 characters without control characters",
        ))
    }
}

/// What a key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    SandboxesRead,
    SandboxesWrite,
    SandboxesExec,
    FilesRead,
    FilesWrite,
    /// Operator routes under `/v1/admin` and tenancy management across organizations.
    Admin,
}

impl Scope {
    /// Every scope.
    pub const ALL: [Scope; 6] = [
        Scope::SandboxesRead,
        Scope::SandboxesWrite,
        Scope::SandboxesExec,
        Scope::FilesRead,
        Scope::FilesWrite,
        Scope::Admin,
    ];

    /// The wire form, e.g. `sandboxes:read`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::SandboxesRead => "sandboxes:read",
            Scope::SandboxesWrite => "sandboxes:write",
            Scope::SandboxesExec => "sandboxes:exec",
            Scope::FilesRead => "files:read",
            Scope::FilesWrite => "files:write",
            Scope::Admin => "admin",
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Scope {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Scope::ALL
            .into_iter()
            .find(|x| x.as_str() == s)
            .ok_or_else(|| {
                let all: Vec<_> = Scope::ALL.iter().map(|s| s.as_str()).collect();
                format!("unknown scope {s:?}; expected one of {}", all.join(", "))
            })
    }
}

impl Serialize for Scope {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// One of [`Scope::ALL`]'s names (its serde form is written by hand above).
impl utoipa::PartialSchema for Scope {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .enum_values(Some(Scope::ALL.map(Scope::as_str)))
            .into()
    }
}

impl utoipa::ToSchema for Scope {}

impl<'de> Deserialize<'de> for Scope {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A stored API key. Only the SHA-256 of the whole key is kept (`hash`, hex), and it is
/// never serialized to clients.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApiKeyRecord {
    pub id: KeyId,
    pub org_id: OrgId,
    /// Bound to one project, or `None` for the whole organization.
    #[schema(required)]
    pub project_id: Option<ProjectId>,
    pub name: String,
    pub scopes: Vec<Scope>,
    #[serde(skip_serializing, default)]
    pub hash: String,
    pub created_at: DateTime<Utc>,
    #[schema(required)]
    pub expires_at: Option<DateTime<Utc>>,
    #[schema(required)]
    pub revoked_at: Option<DateTime<Utc>>,
    #[schema(required)]
    pub last_used_at: Option<DateTime<Utc>>,
}

/// Largest single sandbox a tenant may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxLimit {
    pub cpu: u32,
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    #[serde(rename = "diskGiB")]
    pub disk_gib: u64,
}

/// Limits of an organization or a project; `None` means not limited at this level.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Quota {
    pub max_active: Option<u32>,
    pub max_cpu: Option<u64>,
    #[serde(rename = "maxMemoryMiB")]
    pub max_memory_mib: Option<u64>,
    #[serde(rename = "maxDiskGiB")]
    pub max_disk_gib: Option<u64>,
    pub max_queued: Option<u32>,
    pub max_queue_seconds: Option<u64>,
    pub max_sandbox: Option<SandboxLimit>,
}

/// Upper bounds that keep a quota sane (a typo of 10^12 CPUs is refused, not stored).
pub const MAX_QUOTA_COUNT: u64 = 1_000_000;

impl Quota {
    /// Each field of `self`, or of `fallback` where `self` has none.
    pub fn or(&self, fallback: &Quota) -> Quota {
        Quota {
            max_active: self.max_active.or(fallback.max_active),
            max_cpu: self.max_cpu.or(fallback.max_cpu),
            max_memory_mib: self.max_memory_mib.or(fallback.max_memory_mib),
            max_disk_gib: self.max_disk_gib.or(fallback.max_disk_gib),
            max_queued: self.max_queued.or(fallback.max_queued),
            max_queue_seconds: self.max_queue_seconds.or(fallback.max_queue_seconds),
            max_sandbox: self.max_sandbox.or(fallback.max_sandbox),
        }
    }

    /// Refuses absurd values, naming the field.
    pub fn validate(&self) -> Result<(), FieldError> {
        let counts = [
            ("maxActive", self.max_active.map(u64::from)),
            ("maxCpu", self.max_cpu),
            ("maxQueued", self.max_queued.map(u64::from)),
        ];
        for (field, v) in counts {
            if v.is_some_and(|v| v > MAX_QUOTA_COUNT) {
                return Err(FieldError::new(
                    field,
                    format!("must be at most {MAX_QUOTA_COUNT}"),
                ));
            }
        }
        if self.max_memory_mib.is_some_and(|v| v > 1024 * 1024 * 1024) {
            return Err(FieldError::new("maxMemoryMiB", "must be at most 1 PiB"));
        }
        if self.max_disk_gib.is_some_and(|v| v > 1024 * 1024 * 1024) {
            return Err(FieldError::new("maxDiskGiB", "must be at most 1 EiB"));
        }
        if self
            .max_queue_seconds
            .is_some_and(|v| v == 0 || v > 30 * 24 * 3600)
        {
            return Err(FieldError::new(
                "maxQueueSeconds",
                "must be between 1 and 2592000",
            ));
        }
        if let Some(m) = self.max_sandbox {
            let r = Resources {
                cpu: m.cpu,
                memory_mib: m.memory_mib,
                disk_gib: m.disk_gib,
            };
            r.validate("maxSandbox")?;
        }
        Ok(())
    }

    /// Why a sandbox of `r` could never run under this quota of `level` (`org`, `project`),
    /// however much of it is free: its own size is above a total limit, or the limit allows
    /// no active sandbox at all. Such a request is refused at admission rather than queued
    /// behind a wall that never moves.
    /// The error names the request field that cannot fit (none for `maxActive: 0`).
    pub fn never_fits(&self, r: &Resources, level: &str) -> Option<(Option<&'static str>, String)> {
        if self.max_active == Some(0) {
            return Some((
                None,
                format!("the {level} active quota (maxActive) is 0: no sandbox can run"),
            ));
        }
        let checks = [
            (
                "resources.cpu",
                u64::from(r.cpu),
                self.max_cpu,
                "cpu",
                "maxCpu",
                "",
            ),
            (
                "resources.memoryMiB",
                r.memory_mib,
                self.max_memory_mib,
                "memory",
                "maxMemoryMiB",
                " MiB",
            ),
            (
                "resources.diskGiB",
                r.disk_gib,
                self.max_disk_gib,
                "disk",
                "maxDiskGiB",
                " GiB",
            ),
        ];
        checks
            .into_iter()
            .find_map(|(field, asked, max, what, name, unit)| {
                let max = max?;
                (asked > max).then(|| {
                    (
                        Some(field),
                        format!(
                            "{field} {asked}{unit} exceeds the {level} {what} quota ({name}) of \
                         {max}{unit}: the sandbox could never run"
                        ),
                    )
                })
            })
    }

    /// Why `r` is bigger than this quota of `level` (`org`, `project`) allows for one
    /// sandbox, if it is: the request field, what was asked and the limit.
    pub fn too_large(&self, r: &Resources, level: &str) -> Option<FieldError> {
        let m = self.max_sandbox?;
        let checks = [
            (
                "resources.cpu",
                u64::from(r.cpu),
                u64::from(m.cpu),
                "cpu",
                " CPU",
            ),
            (
                "resources.memoryMiB",
                r.memory_mib,
                m.memory_mib,
                "memoryMiB",
                " MiB",
            ),
            (
                "resources.diskGiB",
                r.disk_gib,
                m.disk_gib,
                "diskGiB",
                " GiB",
            ),
        ];
        checks
            .into_iter()
            .find_map(|(field, asked, max, name, unit)| {
                (asked > max).then(|| {
                    FieldError::new(
                        field,
                        format!(
                            "{field} {asked}{unit} exceeds the {level} max sandbox size \
                         (maxSandbox.{name}) of {max}{unit}"
                        ),
                    )
                })
            })
    }
}

/// What an organization or project uses now, derived from sandbox rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    pub active: u32,
    pub cpu: u64,
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    #[serde(rename = "diskGiB")]
    pub disk_gib: u64,
    pub queued: u32,
}

impl Usage {
    /// Adds one sandbox in `status` with `r` per the accounting table.
    pub fn add(&mut self, status: SandboxStatus, r: &Resources) {
        if status == SandboxStatus::Queued {
            self.queued += 1;
        }
        if status.counts_active() {
            self.active += 1;
        }
        if status.reserves_compute() {
            self.cpu += u64::from(r.cpu);
            self.memory_mib += r.memory_mib;
        }
        if status.counts_disk() {
            self.disk_gib += r.disk_gib;
        }
    }

    /// Why moving one sandbox of `r` from `from` to `to` (e.g. stopped → running, which
    /// reserves CPU and memory again) would exceed `q`, if it would. Only what the change
    /// increases is checked, so a tenant already over a lowered quota can still stop, pause
    /// or delete.
    pub fn blocks_change(
        &self,
        q: &Quota,
        r: &Resources,
        from: SandboxStatus,
        to: SandboxStatus,
        level: &str,
    ) -> Option<String> {
        let (mut before, mut after) = (Usage::default(), Usage::default());
        before.add(from, r);
        after.add(to, r);
        let grows = |b: u64, a: u64| a > b;
        let checks: [(bool, u64, Option<u64>, &str, &str); 4] = [
            (
                grows(u64::from(before.active), u64::from(after.active)),
                (u64::from(self.active) + u64::from(after.active))
                    .saturating_sub(u64::from(before.active)),
                q.max_active.map(u64::from),
                "active",
                "",
            ),
            (
                grows(before.cpu, after.cpu),
                (self.cpu + after.cpu).saturating_sub(before.cpu),
                q.max_cpu,
                "cpu",
                "",
            ),
            (
                grows(before.memory_mib, after.memory_mib),
                (self.memory_mib + after.memory_mib).saturating_sub(before.memory_mib),
                q.max_memory_mib,
                "memory",
                " MiB",
            ),
            (
                grows(before.disk_gib, after.disk_gib),
                (self.disk_gib + after.disk_gib).saturating_sub(before.disk_gib),
                q.max_disk_gib,
                "disk",
                " GiB",
            ),
        ];
        for (grows, would_be, max, what, unit) in checks {
            if let (true, Some(max)) = (grows, max) {
                if would_be > max {
                    return Some(format!(
                        "{level} {what} quota would be {would_be}/{max}{unit}"
                    ));
                }
            }
        }
        None
    }

    /// Why one more sandbox of `r` would exceed `q` (as a `waiting: …` reason), if it would.
    /// `level` is `org` or `project`.
    pub fn blocks(&self, q: &Quota, r: &Resources, level: &str) -> Option<String> {
        if let Some(max) = q.max_active {
            if self.active + 1 > max {
                return Some(format!(
                    "waiting: {level} active quota {}/{max}",
                    self.active
                ));
            }
        }
        if let Some(max) = q.max_cpu {
            if self.cpu + u64::from(r.cpu) > max {
                return Some(format!("waiting: {level} cpu quota {}/{max}", self.cpu));
            }
        }
        if let Some(max) = q.max_memory_mib {
            if self.memory_mib + r.memory_mib > max {
                return Some(format!(
                    "waiting: {level} memory quota {}/{max} MiB",
                    self.memory_mib
                ));
            }
        }
        if let Some(max) = q.max_disk_gib {
            if self.disk_gib + r.disk_gib > max {
                return Some(format!(
                    "waiting: {level} disk quota {}/{max} GiB",
                    self.disk_gib
                ));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_is_checked_only_for_what_it_adds() {
        let r = Resources {
            cpu: 2,
            memory_mib: 512,
            disk_gib: 1,
        };
        let q = Quota {
            max_active: Some(1),
            max_cpu: Some(3),
            ..Quota::default()
        };
        // One running (2 cpu) and this one stopped: both active, 2 cpu reserved.
        let mut used = Usage::default();
        used.add(SandboxStatus::Running, &r);
        used.add(SandboxStatus::Stopped, &r);
        assert_eq!(
            used.blocks_change(&q, &r, SandboxStatus::Stopped, SandboxStatus::Running, "org"),
            Some("org cpu quota would be 4/3".to_owned()),
            "starting reserves 2 more cpu; active does not grow, so maxActive 1 (already 2) is not the reason"
        );
        let roomy = Quota {
            max_cpu: Some(4),
            ..q
        };
        assert_eq!(
            used.blocks_change(
                &roomy,
                &r,
                SandboxStatus::Stopped,
                SandboxStatus::Running,
                "org"
            ),
            None
        );
        // Stopping only frees: never refused, even over quota, and never underflows on an
        // empty (or drifted) usage.
        assert_eq!(
            used.blocks_change(
                &q,
                &r,
                SandboxStatus::Running,
                SandboxStatus::Stopped,
                "org"
            ),
            None
        );
        assert_eq!(
            Usage::default().blocks_change(
                &q,
                &r,
                SandboxStatus::Running,
                SandboxStatus::Terminating,
                "org"
            ),
            None
        );
    }

    #[test]
    fn scopes_round_trip_and_unknown_ones_are_named() {
        for s in Scope::ALL {
            assert_eq!(s.as_str().parse::<Scope>(), Ok(s));
        }
        let e = "sandboxes:delete".parse::<Scope>().unwrap_err();
        assert!(e.contains("sandboxes:delete"));
    }

    #[test]
    fn quota_or_prefers_the_specific_level() {
        let org = Quota {
            max_active: Some(5),
            max_cpu: Some(8),
            ..Default::default()
        };
        let defaults = Quota {
            max_active: Some(50),
            max_queued: Some(100),
            ..Default::default()
        };
        let q = org.or(&defaults);
        assert_eq!(
            (q.max_active, q.max_cpu, q.max_queued),
            (Some(5), Some(8), Some(100))
        );
    }

    #[test]
    fn absurd_quotas_are_refused_with_the_field() {
        let q = Quota {
            max_cpu: Some(u64::MAX),
            ..Default::default()
        };
        assert_eq!(q.validate().unwrap_err().field, "maxCpu");
        let q = Quota {
            max_queue_seconds: Some(0),
            ..Default::default()
        };
        assert_eq!(q.validate().unwrap_err().field, "maxQueueSeconds");
        let q = Quota {
            max_sandbox: Some(SandboxLimit {
                cpu: 0,
                memory_mib: 1024,
                disk_gib: 1,
            }),
            ..Default::default()
        };
        assert_eq!(q.validate().unwrap_err().field, "maxSandbox.cpu");
    }

    #[test]
    fn usage_follows_the_accounting_table_and_explains_blocks() {
        let r = Resources {
            cpu: 4,
            memory_mib: 1024,
            disk_gib: 10,
        };
        let mut u = Usage::default();
        for s in [
            SandboxStatus::Queued,
            SandboxStatus::Running,
            SandboxStatus::Stopped,
            SandboxStatus::Failed,
        ] {
            u.add(s, &r);
        }
        assert_eq!(
            u,
            Usage {
                active: 2,
                cpu: 4,
                memory_mib: 1024,
                disk_gib: 20,
                queued: 1
            }
        );
        let q = Quota {
            max_cpu: Some(8),
            ..Default::default()
        };
        assert_eq!(u.blocks(&q, &r, "org"), None);
        u.add(SandboxStatus::Running, &r);
        assert_eq!(
            u.blocks(&q, &r, "org").as_deref(),
            Some("waiting: org cpu quota 8/8")
        );
    }
}
