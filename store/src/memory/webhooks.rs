//! Webhooks and their deliveries in memory.

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use chrono::{DateTime, Duration, Utc};
use differently_core::{OrgId, ProjectId};

use crate::audit::stored_time;
use crate::memory::MemoryStore;
use crate::webhooks::*;
use crate::{Actor, StoreError};

/// A stored webhook with its sealed secrets.
#[derive(Debug, Clone)]
pub(crate) struct WebhookRow {
    hook: Webhook,
    secret: Vec<u8>,
    previous: Option<Vec<u8>>,
}

/// Webhooks and deliveries by id (ids are ULIDs, so id order is creation order).
#[derive(Debug, Default)]
pub(crate) struct WebhookState {
    hooks: BTreeMap<String, WebhookRow>,
    deliveries: BTreeMap<String, Delivery>,
    /// `WebhookStore::fan_out_cursor`.
    fan_out_cursor: Option<u64>,
}

impl WebhookState {
    /// Drops a deleted project's webhooks and their deliveries.
    pub(crate) fn forget_project(&mut self, project: &ProjectId) {
        self.hooks.retain(|_, r| &r.hook.project_id != project);
        self.deliveries.retain(|_, d| &d.project_id != project);
    }
}

#[async_trait]
impl WebhookStore for MemoryStore {
    async fn create_webhook(
        &self,
        w: &Webhook,
        secret: &[u8],
        actor: &Actor,
    ) -> Result<Webhook, StoreError> {
        let sealed = seal_secret(&w.id, "current", secret)?;
        let mut hook = w.clone();
        hook.created_at = stored_time(hook.created_at);
        hook.updated_at = hook.created_at;
        let mut st = self.lock();
        if st
            .projects
            .get(&hook.project_id)
            .is_none_or(|p| p.org_id != hook.org_id)
        {
            return Err(StoreError::NotFound);
        }
        if st.webhooks.hooks.contains_key(&hook.id) {
            return Err(StoreError::AlreadyExists(format!("webhook {}", hook.id)));
        }
        st.webhooks.hooks.insert(
            hook.id.clone(),
            WebhookRow {
                hook: hook.clone(),
                secret: sealed,
                previous: None,
            },
        );
        let e = audit_entry(actor, "webhook.create", &hook, Some(secret));
        st.audit(&hook.org_id.clone(), &hook.id.clone(), e, hook.created_at);
        Ok(hook)
    }

    async fn get_webhook(&self, id: &str) -> Result<Option<Webhook>, StoreError> {
        Ok(self.lock().webhooks.hooks.get(id).map(|r| r.hook.clone()))
    }

    async fn list_webhooks(
        &self,
        org: &OrgId,
        project: Option<&ProjectId>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Webhook>, StoreError> {
        let st = self.lock();
        Ok(st
            .webhooks
            .hooks
            .values()
            .map(|r| &r.hook)
            .filter(|h| &h.org_id == org && project.is_none_or(|p| &h.project_id == p))
            .filter(|h| after.is_none_or(|a| h.id.as_str() > a))
            .take(limit)
            .cloned()
            .collect())
    }

    async fn update_webhook(
        &self,
        id: &str,
        patch: &WebhookPatch,
        actor: &Actor,
    ) -> Result<Webhook, StoreError> {
        let now = stored_time(Utc::now());
        let mut st = self.lock();
        let row = st.webhooks.hooks.get_mut(id).ok_or(StoreError::NotFound)?;
        apply_patch(&mut row.hook, patch, now);
        let hook = row.hook.clone();
        let e = audit_entry(actor, "webhook.update", &hook, None);
        st.audit(&hook.org_id.clone(), id, e, now);
        Ok(hook)
    }

    async fn delete_webhook(&self, id: &str, actor: &Actor) -> Result<(), StoreError> {
        let now = stored_time(Utc::now());
        let mut st = self.lock();
        let row = st.webhooks.hooks.remove(id).ok_or(StoreError::NotFound)?;
        st.webhooks.deliveries.retain(|_, d| d.webhook_id != id);
        let e = audit_entry(actor, "webhook.delete", &row.hook, None);
        st.audit(&row.hook.org_id, id, e, now);
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
        let mut st = self.lock();
        let row = st.webhooks.hooks.get_mut(id).ok_or(StoreError::NotFound)?;
        let old = open_secret(id, "current", &row.secret)?;
        row.previous = Some(seal_secret(id, "previous", &old)?);
        row.secret = fresh;
        row.hook.previous_secret_expires_at = Some(stored_time(previous_until));
        row.hook.updated_at = now;
        let hook = row.hook.clone();
        let e = audit_entry(actor, "webhook.rotate_secret", &hook, Some(secret));
        st.audit(&hook.org_id.clone(), id, e, now);
        Ok(hook)
    }

    async fn webhook_secrets(
        &self,
        id: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<Vec<Vec<u8>>>, StoreError> {
        let row = self.lock().webhooks.hooks.get(id).cloned();
        let Some(row) = row else { return Ok(None) };
        let mut out = vec![open_secret(id, "current", &row.secret)?];
        if let (Some(p), Some(until)) = (&row.previous, row.hook.previous_secret_expires_at) {
            if now < until {
                out.push(open_secret(id, "previous", p)?);
            }
        }
        Ok(Some(out))
    }

    async fn enabled_webhooks(&self, project: &ProjectId) -> Result<Vec<Webhook>, StoreError> {
        // Keyed by id: already in id order.
        Ok(self
            .lock()
            .webhooks
            .hooks
            .values()
            .map(|r| &r.hook)
            .filter(|h| &h.project_id == project && h.enabled)
            .cloned()
            .collect())
    }

    async fn fan_out_cursor(&self) -> Result<Option<u64>, StoreError> {
        Ok(self.lock().webhooks.fan_out_cursor)
    }

    async fn save_fan_out_cursor(&self, through_seq: u64) -> Result<(), StoreError> {
        self.lock().webhooks.fan_out_cursor = Some(through_seq);
        Ok(())
    }

    async fn enqueue_deliveries(
        &self,
        items: &[NewDelivery],
        now: DateTime<Utc>,
    ) -> Result<usize, StoreError> {
        let now = stored_time(now);
        let mut st = self.lock();
        let mut created = 0;
        for n in items {
            let Some(hook) = st.webhooks.hooks.get(&n.webhook_id).map(|r| r.hook.clone()) else {
                continue;
            };
            let exists = st
                .webhooks
                .deliveries
                .values()
                .any(|d| d.webhook_id == n.webhook_id && d.event_id == n.event_id);
            if exists {
                continue;
            }
            st.webhooks
                .deliveries
                .insert(n.id.clone(), new_delivery(n, &hook, now));
            created += 1;
        }
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
        let until = stored_time(now + lease);
        let mut st = self.lock();
        let WebhookState {
            hooks, deliveries, ..
        } = &mut st.webhooks;
        let mut hook_busy: HashMap<&str, usize> = HashMap::new();
        let mut org_busy: HashMap<&str, usize> = HashMap::new();
        let mut due = Vec::new();
        for d in deliveries.values() {
            // A disabled webhook's pending deliveries wait: re-enabling it resumes them.
            if d.status != DeliveryStatus::Pending
                || !hooks.get(&d.webhook_id).is_some_and(|h| h.hook.enabled)
            {
                continue;
            }
            if d.lease_until.is_some_and(|l| l > now) {
                *hook_busy.entry(d.webhook_id.as_str()).or_default() += 1;
                *org_busy.entry(d.org_id.as_str()).or_default() += 1;
                continue;
            }
            if let Some(at) = d.next_attempt_at.filter(|t| *t <= now) {
                due.push(DueDelivery {
                    id: &d.id,
                    webhook_id: &d.webhook_id,
                    org_id: d.org_id.as_str(),
                    due: at,
                });
            }
        }
        let picked = fair_pick(
            due,
            |h| hook_busy.get(h).copied().unwrap_or(0),
            |o| org_busy.get(o).copied().unwrap_or(0),
            per_webhook,
            limit,
        );
        let mut out = Vec::with_capacity(picked.len());
        for id in &picked {
            if let Some(d) = deliveries.get_mut(id) {
                d.lease_until = Some(until);
                out.push(d.clone());
            }
        }
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
        let mut st = self.lock();
        let d = st
            .webhooks
            .deliveries
            .get_mut(delivery_id)
            .ok_or(StoreError::NotFound)?;
        apply_outcome(d, &o, now);
        let delivery = d.clone();
        let Some(row) = st.webhooks.hooks.get_mut(&delivery.webhook_id) else {
            return Ok(Recorded {
                delivery,
                disabled: None,
            });
        };
        let disabled = apply_run(&mut row.hook, o.succeeded, policy, now);
        let hook = row.hook.clone();
        if disabled {
            let e = audit_entry(&Actor::System("webhooks"), "webhook.disable", &hook, None);
            st.audit(&hook.org_id, &hook.id, e, now);
        }
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
        Ok(self
            .lock()
            .webhooks
            .deliveries
            .values()
            .rev()
            .filter(|d| d.webhook_id == webhook_id && after.is_none_or(|a| d.id.as_str() < a))
            .take(limit)
            .cloned()
            .collect())
    }

    async fn get_delivery(&self, id: &str) -> Result<Option<Delivery>, StoreError> {
        Ok(self.lock().webhooks.deliveries.get(id).cloned())
    }

    async fn redeliver(
        &self,
        id: &str,
        now: DateTime<Utc>,
        actor: &Actor,
    ) -> Result<Delivery, StoreError> {
        let now = stored_time(now);
        let mut st = self.lock();
        let d = st
            .webhooks
            .deliveries
            .get_mut(id)
            .ok_or(StoreError::NotFound)?;
        d.status = DeliveryStatus::Pending;
        d.next_attempt_at = Some(now);
        d.lease_until = None;
        d.updated_at = now;
        let d = d.clone();
        let e = crate::shared::rules::tenancy_entry(
            actor,
            "webhook.redeliver",
            serde_json::json!({ "projectId": d.project_id, "deliveryId": d.id, "eventId": d.event_id }),
        );
        st.audit(&d.org_id, &d.webhook_id, e, now);
        Ok(d)
    }
}

fn new_delivery(n: &NewDelivery, hook: &Webhook, now: DateTime<Utc>) -> Delivery {
    Delivery {
        id: n.id.clone(),
        webhook_id: n.webhook_id.clone(),
        org_id: hook.org_id.clone(),
        project_id: hook.project_id.clone(),
        event_id: n.event_id.clone(),
        event_type: n.event_type.clone(),
        body: n.body.clone(),
        status: DeliveryStatus::Pending,
        attempts: 0,
        next_attempt_at: Some(now),
        response_code: None,
        latency_ms: None,
        last_error: None,
        response_body: None,
        created_at: now,
        updated_at: now,
        delivered_at: None,
        lease_until: None,
    }
}

fn apply_outcome(d: &mut Delivery, o: &AttemptOutcome, now: DateTime<Utc>) {
    d.attempts += 1;
    d.response_code = o.response_code;
    d.latency_ms = Some(o.latency_ms);
    d.last_error = o.error.clone();
    d.response_body = o.response_body.clone();
    d.lease_until = None;
    d.updated_at = now;
    if o.succeeded {
        d.status = DeliveryStatus::Succeeded;
        d.next_attempt_at = None;
        d.delivered_at = Some(now);
    } else if let Some(at) = o.retry_at {
        d.next_attempt_at = Some(stored_time(at));
    } else {
        d.status = DeliveryStatus::Failed;
        d.next_attempt_at = None;
    }
}
