//! Accounting rules both stores apply inside their transactions: which limit makes an
//! activation wait, which admission limits refuse a sandbox, which quota a status change
//! would break, and how each status change mutates a `Sandbox`. Pure functions, so the
//! Postgres and in-memory stores cannot drift apart and tests reach them directly.

use std::collections::BTreeMap;

use chrono::{DateTime, TimeDelta, Utc};

use crate::status::can_transition;
use crate::tenancy::{Quota, Usage};
use crate::{Sandbox, SandboxStatus};

/// The limit a waiting activation hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Wall {
    /// The organization's quota (no pool helps).
    Org,
    /// The project's quota (no pool helps).
    Project,
    /// The pool's `maxConcurrent` (another ranked pool may).
    Pool,
}

impl Wall {
    /// Every wall, for the API's document.
    pub const ALL: [Wall; 3] = [Wall::Org, Wall::Project, Wall::Pool];

    /// How explanations name the wall (`"wall": "org"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Wall::Org => "org",
            Wall::Project => "project",
            Wall::Pool => "pool",
        }
    }
}

/// A quota or admission limit refused the change; the message says which, for the caller,
/// and `field` names the request field that cannot fit when one does (a sandbox bigger than
/// a limit), so the API can point at it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct LimitExceeded {
    pub message: String,
    pub field: Option<String>,
}

impl LimitExceeded {
    /// A limit with no single request field to blame (a full queue, a used-up quota).
    pub fn new(message: impl Into<String>) -> LimitExceeded {
        LimitExceeded {
            message: message.into(),
            field: None,
        }
    }
}

/// Why a status change cannot be applied to a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChangeRefused {
    /// The sandbox is not in a status the change starts from (a compare-and-set lost).
    #[error("sandbox is {current}, not in the expected status")]
    StatusConflict { current: SandboxStatus },
    /// The state machine forbids this change.
    #[error("illegal transition {from} -> {to}")]
    IllegalTransition {
        from: SandboxStatus,
        to: SandboxStatus,
    },
    /// The sandbox's TTL does not fit a time span.
    #[error("ttl {0} out of range")]
    TtlOutOfRange(u64),
    /// A string holds a character no store can keep (NUL): refused the same way by both
    /// stores, behind the API's own check.
    #[error("{}: {}", .0.field, .0.message)]
    Unstorable(crate::FieldError),
}

/// A pool as an activation sees it: its name and its concurrency cap.
#[derive(Debug, Clone, Copy)]
pub struct PoolCap<'a> {
    pub name: &'a str,
    pub max_concurrent: Option<u32>,
}

/// Statuses the TTL sweep expires.
pub const EXPIRABLE: [SandboxStatus; 3] = [
    SandboxStatus::Running,
    SandboxStatus::Paused,
    SandboxStatus::Stopped,
];

/// Why `sbx` cannot be activated now, or `None` if quotas and pool cap leave room.
/// Checks the organization (`org` quota, already merged over the defaults), then the
/// project (its stored quota only), then the pool; the first block found is the reason.
/// `pool_used` is the number of rows holding a slot on the pool (only when capped).
pub fn waiting_reason(
    org: (&Usage, &Quota),
    project: (&Usage, &Quota),
    pool_used: u64,
    sbx: &Sandbox,
    pool: PoolCap<'_>,
) -> Option<(Wall, String)> {
    let r = sbx.spec.resources;
    if let Some(reason) = org.0.blocks(org.1, &r, "org") {
        return Some((Wall::Org, reason));
    }
    if let Some(reason) = project.0.blocks(project.1, &r, "project") {
        return Some((Wall::Project, reason));
    }
    if let Some(max) = pool.max_concurrent {
        if pool_used + 1 > u64::from(max) {
            return Some((
                Wall::Pool,
                crate::wait_reason::pool_full(pool.name, pool_used, max),
            ));
        }
    }
    None
}

/// Admission limits: the sandbox must fit `maxSandbox` of both levels, must fit each level's
/// total limits on its own (one that could never run is refused, not queued forever), and
/// neither queue may be full. The `org` quota is already merged over the defaults; the
/// `project` quota is the project's stored quota only.
pub fn check_admission_limits(
    sbx: &Sandbox,
    org: (&Usage, &Quota),
    project: (&Usage, &Quota),
) -> Result<(), LimitExceeded> {
    let r = sbx.spec.resources;
    for (q, level) in [(org.1, "org"), (project.1, "project")] {
        if let Some(e) = q.too_large(&r, level) {
            return Err(LimitExceeded {
                message: e.message,
                field: Some(e.field),
            });
        }
    }
    for (q, level) in [(org.1, "org"), (project.1, "project")] {
        if let Some((field, message)) = q.never_fits(&r, level) {
            return Err(LimitExceeded {
                message,
                field: field.map(str::to_owned),
            });
        }
    }
    if let Some(max) = org.1.max_queued {
        if org.0.queued >= max {
            return Err(LimitExceeded::new(queue_full("org", org.0.queued, max)));
        }
    }
    if let Some(max) = project.1.max_queued {
        if project.0.queued >= max {
            return Err(LimitExceeded::new(queue_full(
                "project",
                project.0.queued,
                max,
            )));
        }
    }
    Ok(())
}

/// A full queue's refusal, naming the level, the quota and its limit as every quota refusal
/// does (`maxQueued` is no request field, so none is blamed).
fn queue_full(level: &str, queued: u32, max: u32) -> String {
    format!("the {level} queue quota (maxQueued) of {max} is full: {queued} queued")
}

/// Refuses a change to `to` whose additions exceed the org's (merged over the defaults) or
/// the project's quota.
pub fn check_change_limits(
    sbx: &Sandbox,
    to: SandboxStatus,
    org: (&Usage, &Quota),
    project: (&Usage, &Quota),
) -> Result<(), LimitExceeded> {
    let r = sbx.spec.resources;
    for ((used, quota), level) in [(org, "org"), (project, "project")] {
        if let Some(reason) = used.blocks_change(quota, &r, sbx.status, to, level) {
            return Err(LimitExceeded::new(reason));
        }
    }
    Ok(())
}

/// Admission takes only new queued rows.
pub fn check_admissible(sbx: &Sandbox) -> Result<(), ChangeRefused> {
    if sbx.status != SandboxStatus::Queued {
        return Err(ChangeRefused::StatusConflict {
            current: sbx.status,
        });
    }
    if let Some(field) = sbx.spec.nul_field() {
        return Err(ChangeRefused::Unstorable(nul_refusal(field)));
    }
    Ok(())
}

/// Labels a spec update may store: none holds a NUL (checked by both stores alike).
pub fn check_storable_labels(
    labels: Option<&BTreeMap<String, String>>,
) -> Result<(), ChangeRefused> {
    match labels.and_then(crate::sandbox::labels_nul_field) {
        Some(field) => Err(ChangeRefused::Unstorable(nul_refusal(field))),
        None => Ok(()),
    }
}

fn nul_refusal(field: String) -> crate::FieldError {
    crate::FieldError::new(field, "may not contain the NUL character")
}

/// A listing limit of 0 means "no limit".
pub fn effective_limit(limit: u32) -> usize {
    if limit == 0 {
        usize::MAX
    } else {
        limit as usize
    }
}

/// `queued → provisioning` on `pool`: one more attempt.
pub fn activate(sbx: &mut Sandbox, pool: &str, now: DateTime<Utc>) {
    sbx.status = SandboxStatus::Provisioning;
    sbx.status_reason = None;
    sbx.status_version += 1;
    sbx.pool = Some(pool.to_owned());
    sbx.attempts = sbx.attempts.saturating_add(1);
    sbx.updated_at = now;
}

/// Records why a queued sandbox waits (not a status change: the version stays).
pub fn wait(sbx: &mut Sandbox, reason: String, now: DateTime<Utc>) {
    sbx.status_reason = Some(reason);
    sbx.updated_at = now;
}

/// `provisioning → running` with the backend's ref; starts the TTL clock.
pub fn mark_running(
    sbx: &mut Sandbox,
    backend_ref: &str,
    now: DateTime<Utc>,
) -> Result<(), ChangeRefused> {
    if sbx.status != SandboxStatus::Provisioning {
        return Err(ChangeRefused::StatusConflict {
            current: sbx.status,
        });
    }
    let ttl = i64::try_from(sbx.spec.ttl_seconds)
        .ok()
        .and_then(TimeDelta::try_seconds)
        .ok_or(ChangeRefused::TtlOutOfRange(sbx.spec.ttl_seconds))?;
    sbx.status = SandboxStatus::Running;
    sbx.status_reason = None;
    sbx.status_version += 1;
    sbx.backend_ref = Some(backend_ref.to_owned());
    sbx.started_at = Some(now);
    sbx.expires_at = now.checked_add_signed(ttl);
    sbx.updated_at = now;
    Ok(())
}

/// `provisioning → queued`, clearing the pool; answers the pool it left.
pub fn requeue(
    sbx: &mut Sandbox,
    reason: &str,
    now: DateTime<Utc>,
) -> Result<Option<String>, ChangeRefused> {
    if sbx.status != SandboxStatus::Provisioning {
        return Err(ChangeRefused::StatusConflict {
            current: sbx.status,
        });
    }
    let from_pool = sbx.pool.take();
    sbx.status = SandboxStatus::Queued;
    sbx.status_reason = Some(reason.to_owned());
    sbx.status_version += 1;
    sbx.updated_at = now;
    Ok(from_pool)
}

/// Any other legal change: compare-and-set on `from`, then the state machine. Answers the
/// status the sandbox left.
pub fn transition(
    sbx: &mut Sandbox,
    from: &[SandboxStatus],
    to: SandboxStatus,
    reason: Option<String>,
    now: DateTime<Utc>,
) -> Result<SandboxStatus, ChangeRefused> {
    let current = sbx.status;
    if !from.contains(&current) {
        return Err(ChangeRefused::StatusConflict { current });
    }
    if !can_transition(current, to) {
        return Err(ChangeRefused::IllegalTransition { from: current, to });
    }
    sbx.status = to;
    sbx.status_reason = reason;
    sbx.status_version += 1;
    sbx.updated_at = now;
    if to == SandboxStatus::Queued {
        sbx.pool = None;
    }
    if to.is_final() {
        sbx.ended_at = Some(now);
    }
    Ok(current)
}

/// A new TTL: a started, live sandbox expires `ttl_seconds` from `now` (never, as in
/// [`mark_running`], when that is past the representable time: checked, no panic).
pub fn apply_ttl(s: &mut Sandbox, ttl_seconds: u64, now: DateTime<Utc>) {
    s.spec.ttl_seconds = ttl_seconds;
    if s.started_at.is_some() && !s.status.is_final() {
        s.expires_at = i64::try_from(ttl_seconds)
            .ok()
            .and_then(TimeDelta::try_seconds)
            .and_then(|ttl| now.checked_add_signed(ttl));
    }
}

/// A spec update (`PATCH`): replaced labels and/or a new idle timeout.
pub fn apply_spec_update(
    s: &mut Sandbox,
    labels: Option<BTreeMap<String, String>>,
    idle_timeout_seconds: Option<Option<u64>>,
) {
    if let Some(labels) = labels {
        s.spec.replace_labels(labels);
    }
    if let Some(idle) = idle_timeout_seconds {
        s.spec.idle_timeout_seconds = idle;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::sandbox::CreateSandboxRequest;
    use crate::{OrgId, ProjectId, SandboxSpec};
    use proptest::prelude::*;

    fn sandbox() -> Sandbox {
        let req: CreateSandboxRequest = serde_json::from_str("{}").unwrap();
        let spec = SandboxSpec::build(&req).unwrap();
        Sandbox::queued(OrgId::new(), ProjectId::new(), spec, None, Utc::now())
    }

    fn uncapped() -> PoolCap<'static> {
        PoolCap {
            name: "p",
            max_concurrent: None,
        }
    }

    #[test]
    fn the_org_wall_comes_before_the_project_and_the_pool() {
        let sbx = sandbox();
        let full = Quota {
            max_active: Some(0),
            ..Quota::default()
        };
        let none = Quota::default();
        let used = Usage::default();
        let capped = PoolCap {
            name: "p",
            max_concurrent: Some(1),
        };
        let org = waiting_reason((&used, &full), (&used, &full), 1, &sbx, capped);
        assert_eq!(org.map(|w| w.0), Some(Wall::Org));
        let prj = waiting_reason((&used, &none), (&used, &full), 1, &sbx, capped);
        assert_eq!(prj.map(|w| w.0), Some(Wall::Project));
        let pool = waiting_reason((&used, &none), (&used, &none), 1, &sbx, capped);
        assert_eq!(
            pool,
            Some((Wall::Pool, "waiting: pool p full 1/1".to_owned()))
        );
        assert_eq!(
            waiting_reason((&used, &none), (&used, &none), 0, &sbx, capped),
            None
        );
        assert_eq!(
            waiting_reason((&used, &none), (&used, &none), 99, &sbx, uncapped()),
            None
        );
    }

    #[test]
    fn a_sandbox_larger_than_a_total_limit_is_refused_at_admission() {
        let sbx = sandbox();
        let used = Usage::default();
        let none = Quota::default();
        let small = Quota {
            max_cpu: Some(u64::from(sbx.spec.resources.cpu) - 1),
            ..Quota::default()
        };
        let err = check_admission_limits(&sbx, (&used, &small), (&used, &none)).unwrap_err();
        assert!(err.message.contains("org cpu quota (maxCpu)"), "{err}");
        assert_eq!(err.field.as_deref(), Some("resources.cpu"));
        let err = check_admission_limits(&sbx, (&used, &none), (&used, &small)).unwrap_err();
        assert!(err.message.contains("project cpu quota (maxCpu)"), "{err}");
        // Above one sandbox's maximum: the level, what was asked and the limit, and the field.
        let capped = Quota {
            max_sandbox: Some(crate::tenancy::SandboxLimit {
                cpu: sbx.spec.resources.cpu,
                memory_mib: sbx.spec.resources.memory_mib - 1,
                disk_gib: sbx.spec.resources.disk_gib,
            }),
            ..Quota::default()
        };
        let err = check_admission_limits(&sbx, (&used, &none), (&used, &capped)).unwrap_err();
        assert_eq!(err.field.as_deref(), Some("resources.memoryMiB"), "{err}");
        assert_eq!(
            err.message,
            format!(
                "resources.memoryMiB {} MiB exceeds the project max sandbox size \
                 (maxSandbox.memoryMiB) of {} MiB",
                sbx.spec.resources.memory_mib,
                sbx.spec.resources.memory_mib - 1
            )
        );
        let closed = Quota {
            max_active: Some(0),
            ..Quota::default()
        };
        let err = check_admission_limits(&sbx, (&used, &closed), (&used, &none)).unwrap_err();
        assert!(err.message.contains("maxActive"), "{err}");
        assert_eq!(err.field, None);
        // Exactly the limit fits (it waits for room, if any is used).
        let exact = Quota {
            max_cpu: Some(u64::from(sbx.spec.resources.cpu)),
            ..Quota::default()
        };
        assert_eq!(
            check_admission_limits(&sbx, (&used, &exact), (&used, &none)),
            Ok(())
        );
    }

    #[test]
    fn a_full_queue_refuses_admission() {
        let sbx = sandbox();
        let q = Quota {
            max_queued: Some(1),
            ..Quota::default()
        };
        let mut used = Usage::default();
        let none = Quota::default();
        assert_eq!(
            check_admission_limits(&sbx, (&used, &q), (&used, &none)),
            Ok(())
        );
        used.add(SandboxStatus::Queued, &sbx.spec.resources);
        assert_eq!(
            check_admission_limits(&sbx, (&used, &q), (&used, &none)),
            Err(LimitExceeded::new(
                "the org queue quota (maxQueued) of 1 is full: 1 queued"
            ))
        );
        assert_eq!(
            check_admission_limits(&sbx, (&used, &none), (&used, &q)),
            Err(LimitExceeded::new(
                "the project queue quota (maxQueued) of 1 is full: 1 queued"
            ))
        );
    }

    #[test]
    fn zero_means_no_limit() {
        assert_eq!(effective_limit(0), usize::MAX);
        assert_eq!(effective_limit(7), 7);
    }

    #[test]
    fn the_lifecycle_of_one_sandbox() {
        let mut sbx = sandbox();
        let now = Utc::now();
        assert_eq!(check_admissible(&sbx), Ok(()));
        activate(&mut sbx, "p", now);
        assert_eq!(
            (
                sbx.status,
                sbx.pool.as_deref(),
                sbx.attempts,
                sbx.status_version
            ),
            (SandboxStatus::Provisioning, Some("p"), 1, 2)
        );
        assert_eq!(
            check_admissible(&sbx),
            Err(ChangeRefused::StatusConflict {
                current: SandboxStatus::Provisioning
            })
        );
        assert_eq!(requeue(&mut sbx, "again", now), Ok(Some("p".to_owned())));
        assert_eq!(sbx.pool, None);
        activate(&mut sbx, "q", now);
        mark_running(&mut sbx, "ref-1", now).unwrap();
        assert_eq!(sbx.status, SandboxStatus::Running);
        assert_eq!(sbx.backend_ref.as_deref(), Some("ref-1"));
        assert!(sbx.expires_at.is_some_and(|e| e > now));
        assert_eq!(
            mark_running(&mut sbx, "ref-1", now),
            Err(ChangeRefused::StatusConflict {
                current: SandboxStatus::Running
            })
        );
        let left = transition(
            &mut sbx,
            &[SandboxStatus::Running],
            SandboxStatus::Terminating,
            None,
            now,
        );
        assert_eq!(left, Ok(SandboxStatus::Running));
        assert_eq!(
            transition(
                &mut sbx,
                &[SandboxStatus::Terminating],
                SandboxStatus::Running,
                None,
                now
            ),
            Err(ChangeRefused::IllegalTransition {
                from: SandboxStatus::Terminating,
                to: SandboxStatus::Running
            })
        );
        transition(
            &mut sbx,
            &[SandboxStatus::Terminating],
            SandboxStatus::Terminated,
            None,
            now,
        )
        .unwrap();
        assert_eq!(sbx.ended_at, Some(now));
    }

    #[test]
    fn a_waiting_sandbox_keeps_its_version() {
        let mut sbx = sandbox();
        wait(&mut sbx, "waiting: x".to_owned(), Utc::now());
        assert_eq!(sbx.status_version, 1);
        assert_eq!(sbx.status_reason.as_deref(), Some("waiting: x"));
    }

    proptest! {
        #[test]
        fn a_transition_happens_only_when_legal(
            from in 0usize..SandboxStatus::ALL.len(),
            to in 0usize..SandboxStatus::ALL.len(),
        ) {
            let (from, to) = (SandboxStatus::ALL[from], SandboxStatus::ALL[to]);
            let mut sbx = sandbox();
            sbx.status = from;
            let before = sbx.status_version;
            let out = transition(&mut sbx, &[from], to, None, Utc::now());
            prop_assert_eq!(out.is_ok(), can_transition(from, to));
            let want = if out.is_ok() { (to, before + 1) } else { (from, before) };
            prop_assert_eq!((sbx.status, sbx.status_version), want);
        }

        #[test]
        fn a_capped_pool_waits_exactly_when_full(used in 0u64..20, cap in 0u32..20) {
            let sbx = sandbox();
            let (u, q) = (Usage::default(), Quota::default());
            let pool = PoolCap { name: "p", max_concurrent: Some(cap) };
            let out = waiting_reason((&u, &q), (&u, &q), used, &sbx, pool);
            prop_assert_eq!(out.is_some(), used >= u64::from(cap));
        }
    }
}
