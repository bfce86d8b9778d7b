//! Webhooks and their deliveries in Postgres. Claims use `FOR UPDATE SKIP LOCKED`, so any
//! number of delivering processes share the due rows without handing one out twice.

use async_trait::async_trait;
use chrono::{DateTime, Duration, Utc};
use differently_core::{OrgId, ProjectId};
use sqlx::postgres::PgRow;
use sqlx::Row;

use crate::audit::stored_time;
use crate::pg::audit_records::insert_audit_for;
use crate::pg::PgStore;
use crate::webhooks::*;
use crate::{Actor, StoreError};

const HOOK_COLUMNS: &str = "id, org_id, project_id, url, event_types, description, enabled, \
     disabled_reason, consecutive_failures, failing_since, previous_secret_expires_at, \
     created_at, updated_at";

const DELIVERY_COLUMNS: &str = "id, webhook_id, org_id, project_id, event_id, event_type, body, \
     status, attempts, next_attempt_at, lease_until, response_code, latency_ms, last_error, \
     response_body, created_at, updated_at, delivered_at";

fn parse_org(raw: String) -> Result<OrgId, StoreError> {
    OrgId::parse(&raw).map_err(|e| StoreError::Internal(format!("stored org id: {e}")))
}

fn parse_project(raw: String) -> Result<ProjectId, StoreError> {
    ProjectId::parse(&raw).map_err(|e| StoreError::Internal(format!("stored project id: {e}")))
}

fn u32_of(v: i32) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

fn hook_of(r: &PgRow) -> Result<Webhook, StoreError> {
    let types: serde_json::Value = r.try_get("event_types")?;
    Ok(Webhook {
        id: r.try_get("id")?,
        org_id: parse_org(r.try_get("org_id")?)?,
        project_id: parse_project(r.try_get("project_id")?)?,
        url: r.try_get("url")?,
        event_types: serde_json::from_value(types)
            .map_err(|e| StoreError::Internal(format!("stored event types: {e}")))?,
        description: r.try_get("description")?,
        enabled: r.try_get("enabled")?,
        disabled_reason: r.try_get("disabled_reason")?,
        consecutive_failures: u32_of(r.try_get("consecutive_failures")?),
        failing_since: r.try_get("failing_since")?,
        previous_secret_expires_at: r.try_get("previous_secret_expires_at")?,
        created_at: r.try_get("created_at")?,
        updated_at: r.try_get("updated_at")?,
    })
}

fn delivery_of(r: &PgRow) -> Result<Delivery, StoreError> {
    let status: String = r.try_get("status")?;
    let code: Option<i32> = r.try_get("response_code")?;
    let latency: Option<i64> = r.try_get("latency_ms")?;
    Ok(Delivery {
        id: r.try_get("id")?,
        webhook_id: r.try_get("webhook_id")?,
        org_id: parse_org(r.try_get("org_id")?)?,
        project_id: parse_project(r.try_get("project_id")?)?,
        event_id: r.try_get("event_id")?,
        event_type: r.try_get("event_type")?,
        body: r.try_get("body")?,
        status: DeliveryStatus::parse(&status)
            .ok_or_else(|| StoreError::Internal(format!("stored delivery status {status:?}")))?,
        attempts: u32_of(r.try_get("attempts")?),
        next_attempt_at: r.try_get("next_attempt_at")?,
        lease_until: r.try_get("lease_until")?,
        response_code: code.and_then(|c| u16::try_from(c).ok()),
        latency_ms: latency.and_then(|l| u64::try_from(l).ok()),
        last_error: r.try_get("last_error")?,
        response_body: r.try_get("response_body")?,
        created_at: r.try_get("created_at")?,
        updated_at: r.try_get("updated_at")?,
        delivered_at: r.try_get("delivered_at")?,
    })
}

fn limit_of(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

fn types_json(types: &[String]) -> serde_json::Value {
    serde_json::Value::from(types.to_vec())
}

#[async_trait]
impl WebhookStore for PgStore {
    async fn create_webhook(
        &self,
        w: &Webhook,
        secret: &[u8],
        actor: &Actor,
    ) -> Result<Webhook, StoreError> {
        let sealed = seal_secret(&w.id, "current", secret)?;
        let now = stored_time(w.created_at);
        let mut tx = self.begin().await?;
        let owner: Option<String> =
            sqlx::query_scalar("SELECT org_id FROM projects WHERE id = $1 FOR SHARE")
                .bind(w.project_id.as_str())
                .fetch_optional(&mut *tx)
                .await?;
        if owner.as_deref() != Some(w.org_id.as_str()) {
            return Err(StoreError::NotFound);
        }
        let row = sqlx::query(&format!(
            "INSERT INTO webhooks (id, org_id, project_id, url, event_types, description, enabled,
                 consecutive_failures, secret_sealed, created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, 0, $8, $9, $9)
             RETURNING {HOOK_COLUMNS}"
        ))
        .bind(&w.id)
        .bind(w.org_id.as_str())
        .bind(w.project_id.as_str())
        .bind(&w.url)
        .bind(types_json(&w.event_types))
        .bind(&w.description)
        .bind(w.enabled)
        .bind(&sealed)
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        let hook = hook_of(&row)?;
        let e = audit_entry(actor, "webhook.create", &hook, Some(secret));
        insert_audit_for(&mut tx, &hook.org_id, &hook.id, e, now).await?;
        tx.commit().await?;
        Ok(hook)
    }

    async fn get_webhook(&self, id: &str) -> Result<Option<Webhook>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {HOOK_COLUMNS} FROM webhooks WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(self.pool())
        .await?;
        row.as_ref().map(hook_of).transpose()
    }

    async fn list_webhooks(
        &self,
        org: &OrgId,
        project: Option<&ProjectId>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Webhook>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {HOOK_COLUMNS} FROM webhooks
             WHERE org_id = $1 AND ($2::text IS NULL OR project_id = $2)
               AND ($3::text IS NULL OR id > $3)
             ORDER BY id LIMIT $4"
        ))
        .bind(org.as_str())
        .bind(project.map(|p| p.as_str()))
        .bind(after)
        .bind(limit_of(limit))
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(hook_of).collect()
    }

    async fn update_webhook(
        &self,
        id: &str,
        patch: &WebhookPatch,
        actor: &Actor,
    ) -> Result<Webhook, StoreError> {
        let now = stored_time(Utc::now());
        let mut tx = self.begin().await?;
        let row = sqlx::query(&format!(
            "SELECT {HOOK_COLUMNS} FROM webhooks WHERE id = $1 FOR UPDATE"
        ))
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(StoreError::NotFound)?;
        let mut hook = hook_of(&row)?;
        apply_patch(&mut hook, patch, now);
        sqlx::query(
            "UPDATE webhooks SET url = $2, event_types = $3, description = $4, enabled = $5,
                 disabled_reason = $6, consecutive_failures = $7, failing_since = $8,
                 updated_at = $9
             WHERE id = $1",
        )
        .bind(id)
        .bind(&hook.url)
        .bind(types_json(&hook.event_types))
        .bind(&hook.description)
        .bind(hook.enabled)
        .bind(&hook.disabled_reason)
        .bind(i32::try_from(hook.consecutive_failures).unwrap_or(i32::MAX))
        .bind(hook.failing_since)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let e = audit_entry(actor, "webhook.update", &hook, None);
        insert_audit_for(&mut tx, &hook.org_id, id, e, now).await?;
        tx.commit().await?;
        Ok(hook)
    }

    async fn delete_webhook(&self, id: &str, actor: &Actor) -> Result<(), StoreError> {
        let now = stored_time(Utc::now());
        let mut tx = self.begin().await?;
        let row = sqlx::query(&format!(
            "DELETE FROM webhooks WHERE id = $1 RETURNING {HOOK_COLUMNS}"
        ))
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(StoreError::NotFound)?;
        let hook = hook_of(&row)?;
        let e = audit_entry(actor, "webhook.delete", &hook, None);
        insert_audit_for(&mut tx, &hook.org_id, id, e, now).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn rotate_webhook_secret(
        &self,
        id: &str,
        secret: &[u8],
        previous_until: DateTime<Utc>,
        actor: &Actor,
    ) -> Result<Webhook, StoreError> {
        let now = stored_time(Utc::now());
        let fresh = seal_secret(id, "current", secret)?;
        let mut tx = self.begin().await?;
        let old: Option<Vec<u8>> =
            sqlx::query_scalar("SELECT secret_sealed FROM webhooks WHERE id = $1 FOR UPDATE")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
        let old = old.ok_or(StoreError::NotFound)?;
        let previous = seal_secret(id, "previous", &open_secret(id, "current", &old)?)?;
        let row = sqlx::query(&format!(
            "UPDATE webhooks SET secret_sealed = $2, previous_secret_sealed = $3,
                 previous_secret_expires_at = $4, updated_at = $5
             WHERE id = $1 RETURNING {HOOK_COLUMNS}"
        ))
        .bind(id)
        .bind(&fresh)
        .bind(&previous)
        .bind(stored_time(previous_until))
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        let hook = hook_of(&row)?;
        let e = audit_entry(actor, "webhook.rotate_secret", &hook, Some(secret));
        insert_audit_for(&mut tx, &hook.org_id, id, e, now).await?;
        tx.commit().await?;
        Ok(hook)
    }

    async fn webhook_secrets(
        &self,
        id: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<Vec<Vec<u8>>>, StoreError> {
        let row = sqlx::query(
            "SELECT secret_sealed, previous_secret_sealed, previous_secret_expires_at
             FROM webhooks WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(self.pool())
        .await?;
        let Some(row) = row else { return Ok(None) };
        let current: Vec<u8> = row.try_get("secret_sealed")?;
        let previous: Option<Vec<u8>> = row.try_get("previous_secret_sealed")?;
        let until: Option<DateTime<Utc>> = row.try_get("previous_secret_expires_at")?;
        let mut out = vec![open_secret(id, "current", &current)?];
        if let (Some(p), Some(until)) = (previous, until) {
            if now < until {
                out.push(open_secret(id, "previous", &p)?);
            }
        }
        Ok(Some(out))
    }

    async fn enabled_webhooks(&self, project: &ProjectId) -> Result<Vec<Webhook>, StoreError> {
        // Filters have wildcards (`sandbox.*`): matched by the caller, on a project's few
        // webhooks.
        let rows = sqlx::query(&format!(
            "SELECT {HOOK_COLUMNS} FROM webhooks WHERE project_id = $1 AND enabled ORDER BY id"
        ))
        .bind(project.as_str())
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(hook_of).collect()
    }

    async fn enabled_webhooks_of(
        &self,
        projects: &[ProjectId],
    ) -> Result<Vec<Webhook>, StoreError> {
        if projects.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<&str> = projects.iter().map(ProjectId::as_str).collect();
        // `webhooks_project_idx` (partial, `WHERE enabled`) answers each project.
        let rows = sqlx::query(&format!(
            "SELECT {HOOK_COLUMNS} FROM webhooks WHERE project_id = ANY($1) AND enabled ORDER BY id"
        ))
        .bind(&ids)
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(hook_of).collect()
    }

    async fn fan_out_cursor(&self) -> Result<Option<u64>, StoreError> {
        let seq: Option<i64> =
            sqlx::query_scalar("SELECT through_seq FROM webhook_fan_out WHERE id")
                .fetch_optional(self.pool())
                .await?;
        // The column is checked non-negative.
        Ok(seq.map(|s| u64::try_from(s).unwrap_or(0)))
    }

    async fn save_fan_out_cursor(&self, through_seq: u64) -> Result<(), StoreError> {
        let seq = i64::try_from(through_seq).map_err(|_| {
            StoreError::Internal(format!("fan-out cursor {through_seq} is beyond a bigint"))
        })?;
        sqlx::query(
            "INSERT INTO webhook_fan_out (id, through_seq) VALUES (true, $1)
             ON CONFLICT (id) DO UPDATE SET through_seq = EXCLUDED.through_seq, updated_at = now()",
        )
        .bind(seq)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    async fn enqueue_deliveries(
        &self,
        items: &[NewDelivery],
        now: DateTime<Utc>,
    ) -> Result<usize, StoreError> {
        if items.is_empty() {
            return Ok(0);
        }
        let now = stored_time(now);
        let mut created = 0;
        // Each row reads its webhook under a key-share lock, webhook before delivery as every
        // writer here: a webhook being deleted is waited for and then seen gone (no row),
        // instead of failing the whole batch on the foreign key.
        let mut tx = self.begin().await?;
        for n in items {
            let done = sqlx::query(
                "INSERT INTO webhook_deliveries (id, webhook_id, org_id, project_id, event_id,
                     event_type, body, status, attempts, next_attempt_at, created_at, updated_at)
                 SELECT $1, w.id, w.org_id, w.project_id, $3, $4, $5, 'pending', 0, $6, $6, $6
                 FROM webhooks w WHERE w.id = $2 FOR KEY SHARE
                 ON CONFLICT (webhook_id, event_id) DO NOTHING",
            )
            .bind(&n.id)
            .bind(&n.webhook_id)
            .bind(&n.event_id)
            .bind(&n.event_type)
            .bind(&n.body)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            created += usize::try_from(done.rows_affected()).unwrap_or(0);
        }
        tx.commit().await?;
        Ok(created)
    }

    async fn claim_deliveries(
        &self,
        now: DateTime<Utc>,
        lease: Duration,
        limit: usize,
        per_webhook: usize,
    ) -> Result<Vec<Delivery>, StoreError> {
        let now = stored_time(now);
        // `fair_pick` in SQL. Each enabled webhook's in-flight count is an index probe on
        // `webhook_deliveries_in_flight_idx` (few rows: leased ones); its offers, its oldest
        // due rows up to its room, are a probe on `webhook_deliveries_webhook_due_idx` that
        // stops there, however long its backlog. The offers are ranked per webhook and per
        // organization, counting what each already has in flight, and the best `limit` are
        // taken. A disabled webhook's pending deliveries wait: re-enabling it resumes them.
        // The candidates are read without locks; the final pick re-checks each row and
        // skips the ones another claimer holds, so nothing is handed out twice and a row
        // not taken now is taken by a later claim.
        let rows = sqlx::query(&format!(
            "WITH hooks AS (
                 SELECT w.id, w.org_id, f.busy
                 FROM webhooks w
                 CROSS JOIN LATERAL (
                     SELECT count(*) AS busy FROM webhook_deliveries b
                     WHERE b.webhook_id = w.id AND b.status = 'pending'
                       AND b.lease_until IS NOT NULL AND b.lease_until > $1) f
                 WHERE w.enabled
             ), org_busy AS (
                 SELECT org_id, sum(busy) AS busy FROM hooks GROUP BY org_id
             ), offered AS (
                 SELECT h.org_id, p.id, p.next_attempt_at,
                        h.busy + row_number() OVER (PARTITION BY h.id
                                                    ORDER BY p.next_attempt_at, p.id)
                            AS hook_rank
                 FROM hooks h
                 CROSS JOIN LATERAL (
                     SELECT d.id, d.next_attempt_at FROM webhook_deliveries d
                     WHERE d.webhook_id = h.id AND d.status = 'pending'
                       AND d.next_attempt_at <= $1
                       AND (d.lease_until IS NULL OR d.lease_until <= $1)
                     ORDER BY d.next_attempt_at, d.id
                     LIMIT GREATEST($4 - h.busy, 0)) p
             ), ranked AS (
                 SELECT o.id, o.next_attempt_at, o.hook_rank,
                        ob.busy + row_number() OVER (PARTITION BY o.org_id
                            ORDER BY o.hook_rank, o.next_attempt_at, o.id) AS org_rank
                 FROM offered o JOIN org_busy ob ON ob.org_id = o.org_id
             ), chosen AS (
                 SELECT id FROM ranked
                 ORDER BY org_rank, hook_rank, next_attempt_at, id
                 LIMIT $3
             )
             UPDATE webhook_deliveries SET lease_until = $2
             WHERE id IN (
                 SELECT d.id FROM webhook_deliveries d
                 WHERE d.id IN (SELECT id FROM chosen)
                   AND d.status = 'pending' AND d.next_attempt_at <= $1
                   AND (d.lease_until IS NULL OR d.lease_until <= $1)
                 FOR UPDATE SKIP LOCKED)
             RETURNING {DELIVERY_COLUMNS}"
        ))
        .bind(now)
        .bind(stored_time(now + lease))
        .bind(limit_of(limit))
        .bind(limit_of(per_webhook))
        .fetch_all(self.pool())
        .await?;
        let mut out: Vec<Delivery> = rows.iter().map(delivery_of).collect::<Result<_, _>>()?;
        out.sort_by(|a, b| (a.next_attempt_at, &a.id).cmp(&(b.next_attempt_at, &b.id)));
        Ok(out)
    }

    async fn record_attempt(
        &self,
        delivery_id: &str,
        outcome: &AttemptOutcome,
        policy: &DisablePolicy,
        now: DateTime<Utc>,
    ) -> Result<Recorded, StoreError> {
        let now = stored_time(now);
        let o = bounded(outcome);
        let (status, next) = if o.succeeded {
            (DeliveryStatus::Succeeded, None)
        } else if let Some(at) = o.retry_at {
            (DeliveryStatus::Pending, Some(stored_time(at)))
        } else {
            (DeliveryStatus::Failed, None)
        };
        let mut tx = self.begin().await?;
        // The webhook first, then its delivery: the order every writer takes (deleting a
        // webhook locks it and then cascades to its deliveries). The other order deadlocked
        // with a delete, failing the delete and losing the attempt's record. A webhook
        // deleted meanwhile took the delivery with it: not found.
        let hook = sqlx::query(&format!(
            "SELECT {HOOK_COLUMNS} FROM webhooks
             WHERE id = (SELECT webhook_id FROM webhook_deliveries WHERE id = $1)
             FOR NO KEY UPDATE"
        ))
        .bind(delivery_id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(StoreError::NotFound)?;
        let mut hook = hook_of(&hook)?;
        let row = sqlx::query(&format!(
            "UPDATE webhook_deliveries SET attempts = attempts + 1, status = $2,
                 next_attempt_at = $3, lease_until = NULL, response_code = $4, latency_ms = $5,
                 last_error = $6, response_body = $7, updated_at = $8,
                 delivered_at = CASE WHEN $9 THEN $8 ELSE delivered_at END
             WHERE id = $1 AND webhook_id = $10 RETURNING {DELIVERY_COLUMNS}"
        ))
        .bind(delivery_id)
        .bind(status.as_str())
        .bind(next)
        .bind(o.response_code.map(i32::from))
        .bind(i64::try_from(o.latency_ms).unwrap_or(i64::MAX))
        .bind(&o.error)
        .bind(&o.response_body)
        .bind(now)
        .bind(o.succeeded)
        .bind(&hook.id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(StoreError::NotFound)?;
        let delivery = delivery_of(&row)?;
        let disabled = apply_run(&mut hook, o.succeeded, policy, now);
        sqlx::query(
            "UPDATE webhooks SET consecutive_failures = $2, failing_since = $3, enabled = $4,
                 disabled_reason = $5, updated_at = $6
             WHERE id = $1",
        )
        .bind(&hook.id)
        .bind(i32::try_from(hook.consecutive_failures).unwrap_or(i32::MAX))
        .bind(hook.failing_since)
        .bind(hook.enabled)
        .bind(&hook.disabled_reason)
        .bind(hook.updated_at)
        .execute(&mut *tx)
        .await?;
        if disabled {
            let e = audit_entry(&Actor::System("webhooks"), "webhook.disable", &hook, None);
            insert_audit_for(&mut tx, &hook.org_id, &hook.id, e, now).await?;
        }
        tx.commit().await?;
        Ok(Recorded {
            delivery,
            disabled: disabled.then_some(hook),
        })
    }

    async fn list_deliveries(
        &self,
        webhook_id: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Delivery>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries
             WHERE webhook_id = $1 AND ($2::text IS NULL OR id < $2)
             ORDER BY id DESC LIMIT $3"
        ))
        .bind(webhook_id)
        .bind(after)
        .bind(limit_of(limit))
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(delivery_of).collect()
    }

    async fn get_delivery(&self, id: &str) -> Result<Option<Delivery>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(self.pool())
        .await?;
        row.as_ref().map(delivery_of).transpose()
    }

    async fn redeliver(
        &self,
        id: &str,
        now: DateTime<Utc>,
        actor: &Actor,
    ) -> Result<Delivery, StoreError> {
        let now = stored_time(now);
        let mut tx = self.begin().await?;
        let row = sqlx::query(&format!(
            "UPDATE webhook_deliveries SET status = 'pending', next_attempt_at = $2,
                 lease_until = NULL, updated_at = $2
             WHERE id = $1 RETURNING {DELIVERY_COLUMNS}"
        ))
        .bind(id)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(StoreError::NotFound)?;
        let d = delivery_of(&row)?;
        let e = crate::shared::rules::tenancy_entry(
            actor,
            "webhook.redeliver",
            serde_json::json!({ "projectId": d.project_id, "deliveryId": d.id, "eventId": d.event_id }),
        );
        insert_audit_for(&mut tx, &d.org_id, &d.webhook_id, e, now).await?;
        tx.commit().await?;
        Ok(d)
    }
}
