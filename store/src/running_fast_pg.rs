//! `mark_running` in two statements when this process is changing nothing else.
//!
//! The worker's `provisioning → running` is on every create's path. Through the status-change
//! lane (`transition_lane_pg`) it is a transaction of its own when it arrives alone: BEGIN,
//! lock the row, write it (with the audit head lock), insert the record, COMMIT — five round
//! trips. Alone, it needs two: one read of the row and its chain's head (unlocked), then one
//! autocommit statement that locks the row *only if it is still at the version read*,
//! advances the chain's head *only if it is still the head read*, and then writes the row and
//! inserts the record (each only if the head moved). If either moved, nothing is written and
//! the caller falls back to the lane, which decides under locks as before. A change that
//! moves no usage counter (this one) takes no counter lock; its lock order is the global one
//! (sandbox row, audit head).

use chrono::{DateTime, Utc};
use differently_core::{Sandbox, SandboxId};
use sqlx::Row;

use crate::audit::{self, AuditEvent};
use crate::audit_standalone_pg::has_fraction;
use crate::memory::rules;
use crate::postgres::{sandbox_event, sandbox_of, to_i32, to_i64, PgStore};
use crate::StoreError;

/// Marks `id` running on the fast path; `None`: not applied here (the row or the chain's head
/// moved, the rules refuse, or the record needs the checked path), so the caller uses the
/// lane, which decides and answers authoritatively.
pub(crate) async fn try_mark_running(
    store: &PgStore,
    id: &SandboxId,
    backend_ref: &str,
    now: DateTime<Utc>,
) -> Result<Option<Sandbox>, StoreError> {
    let shard = audit::shard_of(id.as_str());
    let Some(read) = sqlx::query(
        "SELECT s.doc, h.chain_seq, h.hash
         FROM sandboxes s LEFT JOIN audit_heads h ON h.chain = s.org_id || '/' || $2
         WHERE s.id = $1",
    )
    .bind(id.as_str())
    .bind(shard.to_string())
    .fetch_optional(store.pool())
    .await?
    else {
        return Ok(None);
    };
    let current = sandbox_of(&read)?;
    let head: Option<(i64, String)> = read
        .try_get::<Option<i64>, _>("chain_seq")?
        .zip(read.try_get::<Option<String>, _>("hash")?);
    // A chain's first record takes the locking path (it creates the head row).
    let Some(head) = head else {
        return Ok(None);
    };
    let mut next = current.clone();
    let Ok(entry) = rules::mark_running(&mut next, backend_ref, now) else {
        return Ok(None);
    };
    if has_fraction(&entry.detail) {
        return Ok(None);
    }
    let chain = audit::chain_of(Some(&next.org_id), next.id.as_str());
    let prev_seq = head.0;
    let rec = AuditEvent::chained(
        audit::process_key(),
        chain,
        Some(head),
        sandbox_event(&next, entry),
        now,
        audit::current_request_id(),
    );
    let started = std::time::Instant::now();
    let row = sqlx::query(
        "WITH s AS (
             SELECT 1 FROM sandboxes WHERE id = $1 AND status_version = $2 FOR UPDATE),
         h AS (
             UPDATE audit_heads SET chain_seq = $4, hash = $5
             WHERE chain = $3 AND chain_seq = $6 AND EXISTS (SELECT 1 FROM s)
             RETURNING 1),
         u AS (
             UPDATE sandboxes SET status = $7, status_version = $8, pool = $9,
                 backend_ref = $10, attempts = $11, priority = $12, cpu = $13,
                 memory_mib = $14, disk_gib = $15, expires_at = $16, updated_at = $17,
                 doc = $18
             WHERE id = $1 AND EXISTS (SELECT 1 FROM h)
             RETURNING 1),
         ins AS (
             INSERT INTO audit_events (chain, chain_seq, org_id, project_id, actor, action,
                 resource, outcome, request_id, at, detail, prev_hash, hash)
             SELECT $3, $4, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $5 FROM h
             RETURNING seq)
         SELECT (SELECT seq FROM ins) AS seq, (SELECT count(*) FROM u) AS updated",
    )
    .bind(next.id.as_str())
    .bind(current.status_version)
    .bind(&rec.chain)
    .bind(rec.chain_seq)
    .bind(&rec.hash)
    .bind(prev_seq)
    .bind(next.status.as_str())
    .bind(next.status_version)
    .bind(next.pool.as_deref())
    .bind(next.backend_ref.as_deref())
    .bind(to_i32(next.attempts)?)
    .bind(next.spec.priority)
    .bind(i64::from(next.spec.resources.cpu))
    .bind(to_i64(next.spec.resources.memory_mib, "memory")?)
    .bind(to_i64(next.spec.resources.disk_gib, "disk")?)
    .bind(next.expires_at)
    .bind(next.updated_at)
    .bind(serde_json::to_value(&next).map_err(|e| StoreError::Database(e.to_string()))?)
    .bind(&rec.org_id)
    .bind(&rec.project_id)
    .bind(&rec.actor)
    .bind(&rec.action)
    .bind(&rec.resource)
    .bind(&rec.outcome)
    .bind(&rec.request_id)
    .bind(rec.at)
    .bind(&rec.detail)
    .bind(&rec.prev_hash)
    .fetch_one(store.pool())
    .await?;
    let seq: Option<i64> = row.try_get("seq")?;
    let updated: i64 = row.try_get("updated")?;
    match (seq, updated) {
        (Some(_), 1) => {
            store
                .audit_heads()
                .set(&rec.chain, (rec.chain_seq, rec.hash.clone()));
            metrics::histogram!("differently_audit_append_seconds")
                .record(started.elapsed().as_secs_f64());
            Ok(Some(next))
        }
        (None, 0) => Ok(None),
        (seq, updated) => Err(StoreError::Database(format!(
            "mark_running fast path wrote record {seq:?} and {updated} rows"
        ))),
    }
}

#[cfg(all(test, feature = "test-support"))]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::audit::AuditStore;
    use crate::testing::TestDb;
    use crate::{Actor, Admission, Org, OrgStatus, PoolSlot, Project, Quota, Store};
    use differently_core::{CreateSandboxRequest, OrgId, ProjectId, SandboxSpec, SandboxStatus};

    async fn provisioning(s: &PgStore) -> Sandbox {
        let org = Org {
            id: OrgId::new(),
            name: "o".into(),
            status: OrgStatus::Active,
            created_at: Utc::now(),
        };
        let prj = Project {
            id: ProjectId::new(),
            org_id: org.id.clone(),
            name: "p".into(),
            created_at: Utc::now(),
        };
        s.ensure_tenant(&org, &prj).await.unwrap();
        let sbx = Sandbox::queued(
            org.id,
            prj.id,
            SandboxSpec::build(&CreateSandboxRequest::default()).unwrap(),
            None,
            Utc::now(),
        );
        s.admit(Admission {
            sandbox: sbx.clone(),
            request_hash: "h".into(),
            defaults: Quota::default(),
            actor: Actor::System("test"),
            request_id: None,
            direct: None,
        })
        .await
        .unwrap();
        let pool = PoolSlot {
            name: "p".into(),
            max_concurrent: None,
        };
        match s
            .activate(&sbx.id, &pool, &Quota::default(), Utc::now())
            .await
        {
            Ok(crate::Activation::Activated(a)) => a,
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_what_the_lane_would_and_refuses_what_moved() {
        let db = TestDb::new().await;
        let s = db.store();
        let active = provisioning(&s).await;
        let now = Utc::now();
        let done = try_mark_running(&s, &active.id, "ref-1", now)
            .await
            .unwrap()
            .expect("applied on the fast path");
        // The same change the rules make, stored as returned.
        let mut want = active.clone();
        rules::mark_running(&mut want, "ref-1", now).unwrap();
        assert_eq!(done, want);
        assert_eq!(s.get_sandbox(&active.id).await.unwrap(), Some(done.clone()));
        assert_eq!(done.status, SandboxStatus::Running);
        // Its record is the chain's newest and the chains verify.
        let recs = s
            .list_audit(&crate::audit::AuditFilter {
                resource: Some(active.id.to_string()),
                ..Default::default()
            })
            .await
            .unwrap();
        let actions: Vec<&str> = recs.iter().map(|r| r.action.as_str()).collect();
        assert_eq!(
            actions,
            ["sandbox.admit", "sandbox.activate", "sandbox.running"]
        );
        assert!(s.verify_audit().await.unwrap().ok);
        // Already running: the rules refuse here, and nothing is written.
        assert_eq!(
            try_mark_running(&s, &active.id, "ref-2", Utc::now())
                .await
                .unwrap(),
            None
        );
        assert_eq!(s.get_sandbox(&active.id).await.unwrap(), Some(done));
        assert_eq!(
            s.list_audit(&crate::audit::AuditFilter {
                resource: Some(active.id.to_string()),
                ..Default::default()
            })
            .await
            .unwrap()
            .len(),
            3
        );
        // A row that does not exist is the lane's to report.
        assert_eq!(
            try_mark_running(&s, &SandboxId::new(), "ref", Utc::now())
                .await
                .unwrap(),
            None
        );
    }
}
