//! Webhooks: per-project endpoints that receive public events, signed with a secret that is
//! sealed (`sealed`) before it reaches the database, and the delivery log of every event
//! sent to each of them. Deliveries are rows, not bus messages: the back-off of up to a day
//! and the attempt count survive any process crash, and a delivery is claimed with a lease
//! so that a process killed mid-attempt leaves it to be retried by another.

use async_trait::async_trait;
use chrono::{DateTime, Duration, Utc};
use differently_core::{OrgId, ProjectId};
use serde::Serialize;
use serde_json::json;

use crate::sealed;
use crate::shared::rules;
use crate::{Actor, StoreError};

/// Most bytes of a receiver's response body kept in the delivery log.
pub const MAX_RESPONSE_BODY_BYTES: usize = 1024;

/// Most bytes of an error message kept in the delivery log.
const MAX_ERROR_BYTES: usize = 512;

/// A webhook as shown: never its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Webhook {
    /// `whk_<ulid>`.
    pub id: String,
    pub org_id: OrgId,
    pub project_id: ProjectId,
    pub url: String,
    /// Event types delivered; empty means every type.
    pub event_types: Vec<String>,
    #[schema(required)]
    pub description: Option<String>,
    /// False once disabled (by a caller, or automatically after persistent failure).
    pub enabled: bool,
    /// Why it is disabled (`null` while enabled).
    #[schema(required)]
    pub disabled_reason: Option<String>,
    /// Failed attempts in a row since the last success.
    pub consecutive_failures: u32,
    /// When the current run of failures began (`null` after a success).
    #[schema(required)]
    pub failing_since: Option<DateTime<Utc>>,
    /// Until when the secret replaced by the last rotation still signs deliveries.
    #[schema(required)]
    pub previous_secret_expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl Webhook {
    /// Whether an event of `event_type` goes to this webhook.
    pub fn wants(&self, event_type: &str) -> bool {
        self.enabled
            && (self.event_types.is_empty()
                || self
                    .event_types
                    .iter()
                    .any(|f| filter_matches(f, event_type)))
    }
}

/// Whether `event_type` matches `filter`: the exact type, `*` (every type) or a prefix
/// ending in `.*` (`sandbox.exec.*`), the same forms as the public events' `?types=`.
pub fn filter_matches(filter: &str, event_type: &str) -> bool {
    match filter.strip_suffix('*') {
        Some("") => true,
        Some(prefix) if prefix.ends_with('.') => event_type.starts_with(prefix),
        Some(_) => false,
        None => event_type == filter,
    }
}

/// Changes to a webhook; `None` leaves a field as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WebhookPatch {
    pub url: Option<String>,
    pub event_types: Option<Vec<String>>,
    /// `Some(None)` clears it.
    pub description: Option<Option<String>>,
    /// `Some(true)` re-enables it and forgets the failures that disabled it.
    pub enabled: Option<bool>,
}

/// Where a delivery is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryStatus {
    /// Waiting for its next attempt (`nextAttemptAt`).
    Pending,
    /// A receiver answered 2xx.
    Succeeded,
    /// Every attempt of its schedule failed, or its webhook was disabled.
    Failed,
}

impl DeliveryStatus {
    /// The stored form.
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryStatus::Pending => "pending",
            DeliveryStatus::Succeeded => "succeeded",
            DeliveryStatus::Failed => "failed",
        }
    }

    /// Parses the stored form.
    pub fn parse(s: &str) -> Option<DeliveryStatus> {
        match s {
            "pending" => Some(DeliveryStatus::Pending),
            "succeeded" => Some(DeliveryStatus::Succeeded),
            "failed" => Some(DeliveryStatus::Failed),
            _ => None,
        }
    }
}

/// One event for one webhook, and what happened to it so far.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Delivery {
    /// `whd_<ulid>`.
    pub id: String,
    pub webhook_id: String,
    #[serde(skip)]
    pub org_id: OrgId,
    #[serde(skip)]
    pub project_id: ProjectId,
    /// The event's id: the `webhook-id` header, the same on every attempt, so receivers
    /// drop duplicates by it.
    pub event_id: String,
    pub event_type: String,
    /// The exact body sent (and signed).
    #[serde(skip)]
    pub body: String,
    pub status: DeliveryStatus,
    /// Attempts made so far.
    pub attempts: u32,
    #[schema(required)]
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// Status code of the last answer (`null`: none, e.g. a timeout).
    #[schema(required)]
    pub response_code: Option<u16>,
    /// Milliseconds the last attempt took.
    #[schema(required)]
    pub latency_ms: Option<u64>,
    /// Why the last attempt failed.
    #[schema(required)]
    pub last_error: Option<String>,
    /// The first bytes of the last answer's body (at most [`MAX_RESPONSE_BODY_BYTES`]).
    #[schema(required)]
    pub response_body: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    #[schema(required)]
    pub delivered_at: Option<DateTime<Utc>>,
    /// Until when the attempt in progress holds it (internal).
    #[serde(skip)]
    pub lease_until: Option<DateTime<Utc>>,
}

/// A delivery to create for one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewDelivery {
    pub id: String,
    pub webhook_id: String,
    pub event_id: String,
    pub event_type: String,
    pub body: String,
}

/// What an attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptOutcome {
    /// A 2xx answer.
    pub succeeded: bool,
    pub response_code: Option<u16>,
    pub latency_ms: u64,
    pub error: Option<String>,
    pub response_body: Option<String>,
    /// When to try again after a failure; `None`: the schedule is over (the delivery fails).
    pub retry_at: Option<DateTime<Utc>>,
}

/// When a failing webhook is disabled: after at least `min_failures` failed attempts in a
/// row that span at least `min_duration`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DisablePolicy {
    pub min_failures: u32,
    pub min_duration: Duration,
}

impl Default for DisablePolicy {
    fn default() -> Self {
        DisablePolicy {
            min_failures: 15,
            min_duration: Duration::hours(24),
        }
    }
}

impl DisablePolicy {
    /// Whether a run of `failures` failures since `since` disables the webhook at `now`.
    pub fn disables(&self, failures: u32, since: DateTime<Utc>, now: DateTime<Utc>) -> bool {
        failures >= self.min_failures && now - since >= self.min_duration
    }
}

/// What recording an attempt did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub delivery: Delivery,
    /// The webhook was disabled by this failure (it was the one that made it persistent).
    pub disabled: Option<Webhook>,
}

/// Checks a webhook id's shape (`whk_` and a ULID), so garbage never reaches a query.
pub fn valid_webhook_id(raw: &str) -> bool {
    valid_prefixed(raw, "whk_")
}

/// Checks a delivery id's shape (`whd_` and a ULID).
pub fn valid_delivery_id(raw: &str) -> bool {
    valid_prefixed(raw, "whd_")
}

fn valid_prefixed(raw: &str, prefix: &str) -> bool {
    raw.strip_prefix(prefix).is_some_and(|u| {
        u.len() == 26
            && u.bytes()
                .all(|b| b.is_ascii_digit() || b.is_ascii_uppercase())
    })
}

/// The associated data a webhook's secret is sealed under: its id and slot, so a blob
/// copied to another webhook (or from the previous slot to the current one) fails to open.
pub(crate) fn seal_name(webhook_id: &str, slot: &str) -> String {
    format!("webhook:{webhook_id}:{slot}")
}

pub(crate) fn seal_secret(
    webhook_id: &str,
    slot: &str,
    secret: &[u8],
) -> Result<Vec<u8>, StoreError> {
    crate::secrets::seal(&seal_name(webhook_id, slot), secret)
}

pub(crate) fn open_secret(
    webhook_id: &str,
    slot: &str,
    blob: &[u8],
) -> Result<Vec<u8>, StoreError> {
    crate::secrets::open(&seal_name(webhook_id, slot), blob)
}

/// The audit entry of a webhook change: ids, url and fingerprints, never a secret.
pub(crate) fn audit_entry(
    actor: &Actor,
    action: &str,
    w: &Webhook,
    secret: Option<&[u8]>,
) -> rules::AuditEntry {
    rules::tenancy_entry(
        actor,
        action,
        json!({
            "projectId": w.project_id,
            "url": w.url,
            "eventTypes": w.event_types,
            "enabled": w.enabled,
            "secretFingerprint": secret.map(sealed::fingerprint),
        }),
    )
}

/// Cuts `s` to at most `max` bytes on a character boundary.
pub fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// The outcome with its texts cut to what the log keeps.
pub(crate) fn bounded(o: &AttemptOutcome) -> AttemptOutcome {
    AttemptOutcome {
        error: o.error.clone().map(|e| truncate(e, MAX_ERROR_BYTES)),
        response_body: o
            .response_body
            .clone()
            .map(|b| truncate(b, MAX_RESPONSE_BODY_BYTES)),
        ..o.clone()
    }
}

/// A due delivery as a fair claim sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueDelivery<'a> {
    pub id: &'a str,
    pub webhook_id: &'a str,
    pub org_id: &'a str,
    pub due: DateTime<Utc>,
}

/// The ids a fair claim takes, in the order it takes them, from `due` (pending, due, not
/// leased, of enabled webhooks), given how many deliveries of each webhook and of each
/// organization are under a live lease (`hook_busy`, `org_busy`).
///
/// Each webhook offers its oldest deliveries, at most `per_webhook` less its busy ones.
/// An offer's webhook rank is its webhook's busy count plus its place among that webhook's
/// offers (1, 2, …); its organization rank is the organization's busy count plus its place
/// among the organization's offers ordered by (webhook rank, due, id). The claim takes
/// offers by (organization rank, webhook rank, due, id): the tenant with the fewest
/// deliveries in flight goes first, whatever the age of another tenant's backlog, so a
/// quiet tenant's delivery takes the next free slot even when one slot is all there is.
/// The memory store runs this; Postgres runs the same rule in SQL (`pg/webhooks.rs`).
pub fn fair_pick(
    mut due: Vec<DueDelivery<'_>>,
    hook_busy: impl Fn(&str) -> usize,
    org_busy: impl Fn(&str) -> usize,
    per_webhook: usize,
    limit: usize,
) -> Vec<String> {
    due.sort_by(|a, b| (a.webhook_id, a.due, a.id).cmp(&(b.webhook_id, b.due, b.id)));
    // (org, webhook rank, due, id) of every offer.
    let mut offers: Vec<(&str, usize, DateTime<Utc>, &str)> = Vec::new();
    let mut at = 0;
    while at < due.len() {
        let hook = due[at].webhook_id;
        let end = at
            + due[at..]
                .iter()
                .take_while(|d| d.webhook_id == hook)
                .count();
        let busy = hook_busy(hook);
        let room = per_webhook.saturating_sub(busy);
        for (turn, d) in due[at..end].iter().take(room).enumerate() {
            offers.push((d.org_id, busy + turn + 1, d.due, d.id));
        }
        at = end;
    }
    offers.sort();
    let mut ranked: Vec<(usize, usize, DateTime<Utc>, &str)> = Vec::with_capacity(offers.len());
    let mut turn = 0;
    for (i, o) in offers.iter().enumerate() {
        turn = if i > 0 && offers[i - 1].0 == o.0 {
            turn + 1
        } else {
            1
        };
        ranked.push((org_busy(o.0) + turn, o.1, o.2, o.3));
    }
    ranked.sort();
    ranked
        .into_iter()
        .take(limit)
        .map(|r| r.3.to_owned())
        .collect()
}

/// Applies a patch (both stores; Postgres writes the result back).
pub(crate) fn apply_patch(h: &mut Webhook, patch: &WebhookPatch, now: DateTime<Utc>) {
    if let Some(u) = &patch.url {
        h.url = u.clone();
    }
    if let Some(t) = &patch.event_types {
        h.event_types = t.clone();
    }
    if let Some(d) = &patch.description {
        h.description = d.clone();
    }
    if let Some(e) = patch.enabled {
        if e && !h.enabled {
            h.consecutive_failures = 0;
            h.failing_since = None;
        }
        h.enabled = e;
        h.disabled_reason = if e {
            None
        } else {
            Some("disabled by a caller".into())
        };
    }
    h.updated_at = now;
}

/// Updates the failure run; true when this failure disables the webhook.
pub(crate) fn apply_run(
    h: &mut Webhook,
    succeeded: bool,
    policy: &DisablePolicy,
    now: DateTime<Utc>,
) -> bool {
    if succeeded {
        h.consecutive_failures = 0;
        h.failing_since = None;
        return false;
    }
    h.consecutive_failures = h.consecutive_failures.saturating_add(1);
    let since = *h.failing_since.get_or_insert(now);
    if h.enabled && policy.disables(h.consecutive_failures, since, now) {
        h.enabled = false;
        h.disabled_reason = Some(disabled_reason(h.consecutive_failures, since));
        h.updated_at = now;
        return true;
    }
    false
}

/// The reason recorded on an automatically disabled webhook.
pub(crate) fn disabled_reason(failures: u32, since: DateTime<Utc>) -> String {
    format!(
        "disabled automatically after {failures} failed attempts in a row since {}",
        since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    )
}

/// Webhooks and their deliveries.
#[async_trait]
pub trait WebhookStore: Send + Sync {
    /// Stores a new webhook with its signing secret (sealed), audited on its org's chain.
    async fn create_webhook(
        &self,
        w: &Webhook,
        secret: &[u8],
        actor: &Actor,
    ) -> Result<Webhook, StoreError>;

    /// One webhook, if it exists.
    async fn get_webhook(&self, id: &str) -> Result<Option<Webhook>, StoreError>;

    /// An organization's webhooks (of one project when given) in id order, after `after`.
    async fn list_webhooks(
        &self,
        org: &OrgId,
        project: Option<&ProjectId>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Webhook>, StoreError>;

    /// Applies `patch`; audited. Re-enabling clears the failure run and the reason.
    async fn update_webhook(
        &self,
        id: &str,
        patch: &WebhookPatch,
        actor: &Actor,
    ) -> Result<Webhook, StoreError>;

    /// Removes a webhook and its delivery log; audited.
    async fn delete_webhook(&self, id: &str, actor: &Actor) -> Result<(), StoreError>;

    /// Replaces the signing secret; the old one keeps signing until `previous_until`.
    async fn rotate_webhook_secret(
        &self,
        id: &str,
        secret: &[u8],
        previous_until: DateTime<Utc>,
        actor: &Actor,
    ) -> Result<Webhook, StoreError>;

    /// The secrets that sign a delivery at `now`: the current one first, then the previous
    /// one while its overlap lasts. `None` if the webhook is gone.
    async fn webhook_secrets(
        &self,
        id: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<Vec<Vec<u8>>>, StoreError>;

    /// The enabled webhooks of `project`, in id order. The fan-out reads them once for
    /// all the events of a project it holds and matches each event's type itself
    /// ([`Webhook::wants`]).
    async fn enabled_webhooks(&self, project: &ProjectId) -> Result<Vec<Webhook>, StoreError>;

    /// The enabled webhooks of every project in `projects`, in id order: the fan-out reads
    /// them in one round trip for a whole batch of events, whatever projects they come from
    /// (issue #47: a read per project and batch was 2.8 statements per sandbox). The default
    /// asks [`WebhookStore::enabled_webhooks`] per project.
    async fn enabled_webhooks_of(
        &self,
        projects: &[ProjectId],
    ) -> Result<Vec<Webhook>, StoreError> {
        let mut all = Vec::new();
        for p in projects {
            all.extend(self.enabled_webhooks(p).await?);
        }
        all.sort_by(|a, b| a.id.cmp(&b.id));
        all.dedup_by(|a, b| a.id == b.id);
        Ok(all)
    }

    /// The public-stream sequence the webhook fan-out has fanned out through, as last saved
    /// ([`WebhookStore::save_fan_out_cursor`]); `None` before the first save.
    async fn fan_out_cursor(&self) -> Result<Option<u64>, StoreError>;

    /// Saves the fan-out's position: every event up to `through_seq` has its deliveries
    /// committed. Only the fan-out's leader writes it. It may move back (the stream was made
    /// anew, and its sequences start again).
    async fn save_fan_out_cursor(&self, through_seq: u64) -> Result<(), StoreError>;

    /// Creates deliveries due now, skipping any whose (webhook, event) pair already exists,
    /// so an event handed over twice is still delivered once per webhook. Returns how many
    /// were created.
    async fn enqueue_deliveries(
        &self,
        items: &[NewDelivery],
        now: DateTime<Utc>,
    ) -> Result<usize, StoreError>;

    /// Claims up to `limit` pending deliveries due at `now` whose lease (if any) ran out,
    /// holding each until `now + lease`; concurrent claimers never get the same one.
    ///
    /// Fair, not first in first out: one tenant's backlog must not hold another tenant's
    /// deliveries behind it. A webhook never has more than `per_webhook` deliveries under a
    /// live lease (the ones already in flight count), and the due deliveries are taken by
    /// turns, the tenant with the fewest in flight first, then within a tenant the webhook
    /// with the fewest in flight ([`fair_pick`] is the rule, written out).
    async fn claim_deliveries(
        &self,
        now: DateTime<Utc>,
        lease: Duration,
        limit: usize,
        per_webhook: usize,
    ) -> Result<Vec<Delivery>, StoreError>;

    /// Records one attempt of a claimed delivery and the webhook's failure run; disables the
    /// webhook (and audits it) when `policy` says the failures are persistent.
    async fn record_attempt(
        &self,
        delivery_id: &str,
        outcome: &AttemptOutcome,
        policy: &DisablePolicy,
        now: DateTime<Utc>,
    ) -> Result<Recorded, StoreError>;

    /// A webhook's deliveries, newest first, after (older than) `after`.
    async fn list_deliveries(
        &self,
        webhook_id: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Delivery>, StoreError>;

    /// One delivery, if it exists.
    async fn get_delivery(&self, id: &str) -> Result<Option<Delivery>, StoreError>;

    /// Makes a delivery pending again, due now, whatever it came to; audited.
    async fn redeliver(
        &self,
        id: &str,
        now: DateTime<Utc>,
        actor: &Actor,
    ) -> Result<Delivery, StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked() {
        assert!(valid_webhook_id("whk_01ARZ3NDEKTSV4RRFFQ69G5FAV"));
        assert!(!valid_webhook_id("whd_01ARZ3NDEKTSV4RRFFQ69G5FAV"));
        assert!(!valid_webhook_id("whk_01arz3ndektsv4rrffq69g5fav"));
        assert!(!valid_webhook_id("whk_' OR 1=1"));
        assert!(valid_delivery_id("whd_01ARZ3NDEKTSV4RRFFQ69G5FAV"));
    }

    #[test]
    fn truncation_keeps_characters_whole() {
        assert_eq!(truncate("héllo".into(), 2), "h");
        assert_eq!(truncate("abc".into(), 10), "abc");
    }

    #[test]
    fn filters_take_exact_types_prefixes_and_everything() {
        assert!(filter_matches("*", "sandbox.exec.started"));
        assert!(filter_matches("sandbox.exec.*", "sandbox.exec.started"));
        assert!(filter_matches(
            "sandbox.exec.started",
            "sandbox.exec.started"
        ));
        assert!(!filter_matches("sandbox.ex*", "sandbox.exec.started"));
        assert!(!filter_matches("snapshot.*", "sandbox.exec.started"));
    }

    #[test]
    fn persistence_needs_both_count_and_duration() {
        let p = DisablePolicy {
            min_failures: 3,
            min_duration: Duration::hours(1),
        };
        let t = Utc::now();
        assert!(!p.disables(2, t - Duration::hours(2), t));
        assert!(!p.disables(5, t - Duration::minutes(2), t));
        assert!(p.disables(3, t - Duration::hours(1), t));
    }
}
