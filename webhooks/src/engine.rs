//! Delivery: the fan-out from the public stream into delivery rows, and the dispatcher that
//! sends them.
//!
//! At least once, with a bound on duplicates: one process at a time reads the public stream
//! in order and saves how far it got only after the rows of every event up to there are
//! committed (a crash before that re-reads from the last save, and the unique (webhook,
//! event) pair makes the re-read a no-op); nothing on the bus is acked. A row is claimed under a lease longer than the request timeout, so
//! only a claimer that died mid-attempt (or whose result was not recorded) lets another
//! process send it again. Receivers drop those duplicates by `webhook-id`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use differently_bus::Announcer;
use differently_bus_schema::naming::WEBHOOK_CONSUMER;
use differently_bus_schema::public::{Cause, EventData, Origin, PublicEvent, WebhookDisabled};
use differently_core::{OrgId, ProjectId};
use differently_store::webhooks::{
    AttemptOutcome, Delivery, DisablePolicy, NewDelivery, Webhook, MAX_RESPONSE_BODY_BYTES,
};
use differently_store::{Lead, Leadership, Store};
use futures::StreamExt;
use reqwest::header::{HeaderMap, HeaderValue, CONTENT_TYPE, USER_AGENT};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::schedule::Backoff;
use crate::signing::{self, Secret};
use crate::url_policy::UrlPolicy;

/// How the delivering process behaves.
#[derive(Debug, Clone)]
pub struct DeliveryConfig {
    pub url_policy: UrlPolicy,
    /// Longest one request may take, connecting included.
    pub timeout: Duration,
    pub backoff: Backoff,
    pub disable: DisablePolicy,
    /// Requests in flight at once, per process.
    pub concurrency: usize,
    /// Deliveries of one webhook in flight at once, across every delivering process: a
    /// tenant's backlog takes no more than this of the slots, so other tenants' deliveries
    /// find one free (claims also take tenants in turns, `WebhookStore::claim_deliveries`).
    pub per_webhook: usize,
    /// How often the dispatcher looks for due deliveries when idle.
    pub poll: Duration,
    /// A claim's lease is the timeout plus this: room to record the outcome.
    pub lease_margin: Duration,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            url_policy: UrlPolicy::default(),
            timeout: Duration::from_secs(10),
            backoff: Backoff::default(),
            disable: DisablePolicy::default(),
            concurrency: 8,
            per_webhook: 4,
            poll: Duration::from_millis(500),
            lease_margin: Duration::from_secs(30),
        }
    }
}

impl DeliveryConfig {
    /// A claim's lease: the timeout plus a margin for recording the outcome, so a claimer
    /// that is merely slow is never overtaken; only a dead one is.
    pub fn lease(&self) -> Duration {
        self.timeout + self.lease_margin
    }
}

/// The fan-out and the dispatcher of one process.
#[derive(Clone)]
pub struct Deliverer {
    pub store: Arc<dyn Store>,
    /// Reads the public stream and announces `webhook.disabled`.
    pub announcer: Announcer,
    pub config: DeliveryConfig,
}

/// Public events fanned out together at most.
const FAN_BATCH: usize = 128;

/// How often a process that does not lead the fan-out tries its lock.
const FAN_OUT_STANDBY_POLL: Duration = Duration::from_secs(2);

/// How often the leading fan-out checks it still holds its lock (as the scheduler does).
const LEASE_PING: Duration = Duration::from_secs(1);

/// Every how many pings the leading fan-out checks the public stream was not made anew
/// under it (one stream-info request: every 5 s).
const STREAM_CHECK_EVERY_PINGS: u32 = 5;

/// How often the leading fan-out saves its cursor while it moves: a successor re-reads at
/// most about this much of the stream. One write a second, whatever the event rate.
const CURSOR_SAVE_EVERY: Duration = Duration::from_secs(1);

/// Gauge: public events the leading fan-out has not yet fanned out (the stream's last
/// sequence minus the cursor), set every [`STREAM_CHECK_EVERY_PINGS`] lease pings by the
/// leader and 0 elsewhere, so its sum over processes is the lag.
const FAN_OUT_LAG: &str = "differently_webhook_fan_out_lag_events";

/// The fan-out's position: fanned out through `through`, saved through `saved`.
struct Cursor {
    through: u64,
    saved: u64,
    saved_at: Instant,
}

impl Cursor {
    fn new(start: u64) -> Cursor {
        Cursor {
            through: start,
            saved: start,
            saved_at: Instant::now(),
        }
    }
}

/// How long the fan-out gathers a batch after its first event (issue #47). A batch costs one
/// read of the webhooks of all its projects, so events read one by one cost a round trip
/// each; under load this gathers the events of tens of sessions into one. A delivery waits
/// this much longer, next to the dispatcher's poll (`DeliveryConfig::poll`, 500 ms).
const FAN_GATHER: Duration = Duration::from_millis(20);

/// A public event as the fan-out reads it (logged and counted when it cannot be).
fn decode(payload: &[u8]) -> Result<PublicEvent, String> {
    differently_bus::decode_public("webhooks", payload).map_err(|e| e.to_string())
}

/// A `whd_…` id.
fn delivery_id() -> String {
    format!("whd_{}", ulid::Ulid::new())
}

impl Deliverer {
    /// Runs the fan-out and the dispatcher until `stop` turns true.
    pub async fn run(self, stop: watch::Receiver<bool>) {
        let fan = self.clone();
        let stop2 = stop.clone();
        tokio::join!(fan.fan_out(stop2), self.dispatch(stop));
    }

    /// Fans public events out into deliveries while this process holds the fan-out's lock
    /// (`Lead::WebhookFanOut`), and tries the lock every [`FAN_OUT_STANDBY_POLL`] while
    /// another process holds it. The dispatcher runs on every process either way.
    pub async fn fan_out(self, mut stop: watch::Receiver<bool>) {
        let mut leading = false;
        loop {
            if *stop.borrow() {
                return;
            }
            match self.store.try_lead_as(Lead::WebhookFanOut).await {
                Ok(Some(lease)) => {
                    tracing::info!("webhooks: leading the fan-out");
                    leading = true;
                    self.lead_fan_out(lease, &mut stop).await;
                    // Only the leader's figure is the lag.
                    metrics::gauge!(FAN_OUT_LAG).set(0.0);
                }
                Ok(None) if leading => {
                    tracing::info!("webhooks: another process leads the fan-out now");
                    leading = false;
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "webhooks: cannot try the fan-out's lock; retrying")
                }
            }
            if wait_or_stop(&mut stop, FAN_OUT_STANDBY_POLL).await {
                return;
            }
        }
    }

    /// Where the fan-out starts reading: after the saved cursor. The first time, after what
    /// the durable consumer of earlier versions acked (it is removed once the cursor holds
    /// that), or from the stream's start when there is none: re-reading is harmless, and
    /// "from now" would lose what was published before this process first led. A cursor
    /// beyond the stream's end means the stream was made anew (a server that lost its
    /// store): its sequences started again, so reading starts again from its start.
    async fn fan_out_start(&self) -> Result<u64, String> {
        let stream = self.announcer.naming().public_stream().name;
        let bus = self.announcer.bus();
        let last = bus
            .last_sequence(&stream)
            .await
            .map_err(|e| e.to_string())?;
        let cursor = match self
            .store
            .fan_out_cursor()
            .await
            .map_err(|e| e.to_string())?
        {
            Some(c) => c,
            None => {
                let floor = bus
                    .consumer_ack_floor(&stream, WEBHOOK_CONSUMER)
                    .await
                    .map_err(|e| e.to_string())?;
                let c = floor.unwrap_or(0);
                self.store
                    .save_fan_out_cursor(c)
                    .await
                    .map_err(|e| e.to_string())?;
                if floor.is_some() {
                    tracing::info!(
                        through = c,
                        "webhooks: the fan-out takes over from the durable consumer of earlier versions"
                    );
                }
                c
            }
        };
        // Saved (or never there): the old consumer's unacked messages are read from here.
        if let Err(e) = bus.delete_consumer(&stream, WEBHOOK_CONSUMER).await {
            tracing::warn!(error = %e, "webhooks: cannot remove the durable consumer of earlier versions; trying again when next leading");
        }
        if cursor > last {
            tracing::warn!(
                cursor,
                last,
                "webhooks: the public stream ends before the fan-out's cursor (it was made anew); reading it from its start"
            );
            self.store
                .save_fan_out_cursor(0)
                .await
                .map_err(|e| e.to_string())?;
            metrics::gauge!(FAN_OUT_LAG).set(last as f64);
            return Ok(0);
        }
        // Served from the start of leading, not only from the first stream check a few
        // seconds in: a scrape right after a leader took over sees the figure.
        metrics::gauge!(FAN_OUT_LAG).set(last.saturating_sub(cursor) as f64);
        Ok(cursor)
    }

    /// The fan-out while `lease` holds: reads the public stream in order from the saved
    /// cursor, writes each batch's deliveries (trying a failed batch again, never skipping
    /// it), and saves the cursor at most every [`CURSOR_SAVE_EVERY`], so a successor re-reads
    /// at most that much. Returns when the lease is lost, the reader ends, or on `stop`.
    async fn lead_fan_out(&self, mut lease: Box<dyn Leadership>, stop: &mut watch::Receiver<bool>) {
        let start = match self.fan_out_start().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "webhooks: cannot find where the fan-out starts; trying again");
                return;
            }
        };
        let naming = self.announcer.naming();
        let stream = naming.public_stream().name;
        let filter = format!("{}.pub.>", naming.prefix());
        let mut events = match self
            .announcer
            .bus()
            .events(&stream, &filter, Some(start))
            .await
        {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(error = %e, "webhooks: cannot read the public stream; trying again");
                return;
            }
        };
        let mut cursor = Cursor::new(start);
        let mut pings: u32 = 0;
        let mut ping = tokio::time::interval(LEASE_PING);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let first = tokio::select! {
                e = events.next() => e,
                _ = ping.tick() => {
                    if !lease.still_held().await {
                        tracing::warn!("webhooks: lost the fan-out's lock");
                        return;
                    }
                    pings += 1;
                    if pings.is_multiple_of(STREAM_CHECK_EVERY_PINGS) && self.stream_made_anew(&stream, cursor.through).await {
                        // Saved through a sequence the new stream has not reached, so the
                        // next lead reads it from its start (`fan_out_start`).
                        self.save_cursor(&mut cursor, true).await;
                        return;
                    }
                    self.save_cursor(&mut cursor, false).await;
                    continue;
                }
                _ = stop.changed() => {
                    self.save_cursor(&mut cursor, true).await;
                    return;
                }
            };
            let first = match first {
                Some(Ok(e)) => e,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "webhooks: reading the public stream failed");
                    continue;
                }
                None => {
                    tracing::warn!("webhooks: the public stream's reader ended; leading again");
                    self.save_cursor(&mut cursor, true).await;
                    return;
                }
            };
            // What arrives within `FAN_GATHER` goes in the same batch: an exec's two events,
            // and under load the events of many sessions.
            let mut batch = vec![first];
            let until = tokio::time::Instant::now() + FAN_GATHER;
            while batch.len() < FAN_BATCH {
                match tokio::time::timeout_at(until, events.next()).await {
                    Ok(Some(Ok(e))) => batch.push(e),
                    Ok(Some(Err(e))) => {
                        tracing::warn!(error = %e, "webhooks: reading the public stream failed");
                        break;
                    }
                    Ok(None) | Err(_) => break,
                }
            }
            let through = batch.last().map_or(cursor.through, |e| e.seq);
            let refs: Vec<(&str, &[u8])> = batch
                .iter()
                .map(|e| (e.subject.as_str(), e.payload.as_ref()))
                .collect();
            // A batch whose deliveries cannot be written is tried again until they are: the
            // cursor never passes an event that was not fanned out.
            loop {
                match self.fan_batch(&refs).await {
                    Ok(each) => {
                        for (why, (subject, _)) in each.iter().zip(&refs) {
                            if let Err(why) = why {
                                tracing::warn!(%subject, error = %why, "webhooks: not a public event this build reads; passed over");
                            }
                        }
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "webhooks: cannot record deliveries; trying the batch again");
                        if wait_or_stop(stop, Duration::from_secs(1)).await
                            || !lease.still_held().await
                        {
                            self.save_cursor(&mut cursor, true).await;
                            return;
                        }
                    }
                }
            }
            cursor.through = through;
            self.save_cursor(&mut cursor, false).await;
        }
    }

    /// Whether the public stream now ends before `through`: it was made anew while this
    /// process read it (a NATS server that lost its store), and its reader waits for
    /// sequences that come only much later. A failed check is taken as no.
    /// The check also sets the fan-out's lag (events published and not yet fanned out).
    async fn stream_made_anew(&self, stream: &str, through: u64) -> bool {
        let last = self.announcer.bus().last_sequence(stream).await;
        if let Ok(last) = last {
            metrics::gauge!(FAN_OUT_LAG).set(last.saturating_sub(through) as f64);
        }
        match last {
            Ok(last) if last < through => {
                tracing::warn!(
                    last,
                    through,
                    "webhooks: the public stream ends before what the fan-out has read (it was made anew); reading it again from its start"
                );
                true
            }
            Ok(_) => false,
            Err(e) => {
                tracing::debug!(error = %e, "webhooks: cannot read where the public stream ends");
                false
            }
        }
    }

    /// Saves the cursor when it moved and either `now` or [`CURSOR_SAVE_EVERY`] passed since
    /// the last save. A failed save is logged: the next one covers it, and a successor would
    /// only re-read more.
    async fn save_cursor(&self, c: &mut Cursor, now: bool) {
        if c.through == c.saved || (!now && c.saved_at.elapsed() < CURSOR_SAVE_EVERY) {
            return;
        }
        match self.store.save_fan_out_cursor(c.through).await {
            Ok(()) => {
                c.saved = c.through;
                c.saved_at = Instant::now();
            }
            Err(e) => tracing::warn!(error = %e, "webhooks: cannot save the fan-out's cursor"),
        }
    }

    /// The deliveries of a batch of public events, each given as (subject, payload): for
    /// each event, one per enabled webhook of its project that wants its type and existed when
    /// it happened. The webhooks of all the batch's projects are read in one statement, and
    /// all its deliveries are written together. An event whose subject names a project with
    /// no enabled webhook is passed over without being decoded (most events, in most
    /// installations); the others are decoded and matched on what they say.
    /// `Err`: the store failed and nothing may be acked (every event is read again; the
    /// unique (webhook, event) pair makes the rows already written no-ops). `Ok` holds one
    /// answer per event, in order: `Err` with why for one that was decoded and is not a
    /// public event this build reads (acking it again would not help).
    pub async fn fan_batch(
        &self,
        batch: &[(&str, &[u8])],
    ) -> Result<Vec<Result<(), String>>, differently_store::StoreError> {
        let naming = self.announcer.naming();
        let scopes: Vec<Option<(OrgId, ProjectId)>> = batch
            .iter()
            .map(|(subject, _)| naming.public_subject_scope(subject))
            .collect();
        // Projects whose events cannot be placed by subject are learned by decoding them.
        let mut early: Vec<Option<Result<PublicEvent, String>>> = batch
            .iter()
            .zip(&scopes)
            .map(|((_, payload), scope)| scope.is_none().then(|| decode(payload)))
            .collect();
        let mut projects: Vec<ProjectId> = Vec::new();
        let named = scopes.iter().flatten().map(|(_, p)| p);
        let decoded = early.iter().flatten().flatten().map(|e| &e.project_id);
        for p in named.chain(decoded) {
            if !projects.contains(p) {
                projects.push(p.clone());
            }
        }
        let hooks: Vec<Webhook> = if projects.is_empty() {
            Vec::new()
        } else {
            self.store.enabled_webhooks_of(&projects).await?
        };
        let mut events: Vec<Result<(), String>> = Vec::with_capacity(batch.len());
        let mut items: Vec<NewDelivery> = Vec::new();
        for (((_, payload), scope), early) in batch.iter().zip(&scopes).zip(&mut early) {
            let wanted = scope
                .as_ref()
                .is_none_or(|(o, p)| hooks.iter().any(|h| &h.org_id == o && &h.project_id == p));
            if !wanted {
                events.push(Ok(()));
                continue;
            }
            let event = match early.take().unwrap_or_else(|| decode(payload)) {
                Ok(event) => event,
                Err(why) => {
                    events.push(Err(why));
                    continue;
                }
            };
            events.push(Ok(()));
            let ty = event.event_type();
            let mut wanting = hooks.iter().filter(|h| {
                h.project_id == event.project_id
                    && h.org_id == event.org_id
                    && h.created_at <= event.time
                    && h.wants(ty.as_str())
            });
            // Most events have no webhook: their body is not copied.
            let Some(first) = wanting.next() else {
                continue;
            };
            let body = String::from_utf8_lossy(payload).into_owned();
            items.extend(std::iter::once(first).chain(wanting).map(|h| NewDelivery {
                id: delivery_id(),
                webhook_id: h.id.clone(),
                event_id: event.id.clone(),
                event_type: ty.as_str().to_owned(),
                body: body.clone(),
            }));
        }
        if !items.is_empty() {
            let n = self.store.enqueue_deliveries(&items, Utc::now()).await?;
            metrics::counter!("differently_webhook_deliveries_created_total").increment(n as u64);
        }
        Ok(events)
    }

    /// Claims due deliveries and sends them, at most `concurrency` at once.
    pub async fn dispatch(self, mut stop: watch::Receiver<bool>) {
        let lease =
            chrono::Duration::from_std(self.config.lease()).unwrap_or(chrono::Duration::minutes(1));
        let mut running: JoinSet<()> = JoinSet::new();
        loop {
            if *stop.borrow() {
                // In-flight attempts finish (their leases would otherwise delay a retry).
                while running.join_next().await.is_some() {}
                return;
            }
            while running.try_join_next().is_some() {}
            let room = self.config.concurrency.max(1).saturating_sub(running.len());
            let claimed = if room == 0 {
                Vec::new()
            } else {
                let claim = self.store.claim_deliveries(
                    Utc::now(),
                    lease,
                    room,
                    self.config.per_webhook.max(1),
                );
                match claim.await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "webhooks: cannot claim deliveries");
                        Vec::new()
                    }
                }
            };
            let idle = claimed.is_empty();
            for d in claimed {
                let me = self.clone();
                running.spawn(async move { me.deliver(d).await });
            }
            if idle || room == 0 {
                tokio::select! {
                    _ = tokio::time::sleep(self.config.poll) => {}
                    Some(_) = running.join_next(), if !running.is_empty() => {}
                    _ = stop.changed() => {}
                }
            }
        }
    }

    /// One attempt of a claimed delivery, recorded.
    pub async fn deliver(&self, d: Delivery) {
        let outcome = match self.attempt(&d).await {
            Ok(o) => o,
            Err(Gone) => return,
        };
        metrics::counter!("differently_webhook_attempts_total",
            "outcome" => if outcome.succeeded { "succeeded" } else { "failed" })
        .increment(1);
        match self
            .store
            .record_attempt(&d.id, &outcome, &self.config.disable, Utc::now())
            .await
        {
            Ok(r) => {
                if let Some(hook) = r.disabled {
                    self.announce_disabled(&hook).await;
                }
            }
            // Its webhook was deleted meanwhile, and the delivery with it.
            Err(differently_store::StoreError::NotFound) => {
                tracing::debug!(delivery = %d.id, "webhooks: the delivery's webhook was deleted during the attempt")
            }
            // The lease runs out and the delivery is tried again: a duplicate, never a loss.
            Err(e) => {
                tracing::warn!(delivery = %d.id, error = %e, "webhooks: cannot record an attempt")
            }
        }
    }

    /// Sends `d` once and says what came of it. `Err(Gone)`: its webhook was deleted.
    async fn attempt(&self, d: &Delivery) -> Result<AttemptOutcome, Gone> {
        let now = Utc::now();
        let hook = match self.store.get_webhook(&d.webhook_id).await {
            Ok(Some(h)) => h,
            Ok(None) => return Err(Gone),
            Err(e) => return Ok(self.failed(d, None, 0, format!("store: {e}"), None)),
        };
        let secrets = match self.store.webhook_secrets(&d.webhook_id, now).await {
            Ok(Some(s)) => s.into_iter().map(Secret::from_bytes).collect::<Vec<_>>(),
            Ok(None) => return Err(Gone),
            // Never the secret: the store's errors name the webhook only.
            Err(e) => return Ok(self.failed(d, None, 0, format!("store: {e}"), None)),
        };
        Ok(self.send(d, &hook, &secrets).await)
    }

    async fn send(&self, d: &Delivery, hook: &Webhook, secrets: &[Secret]) -> AttemptOutcome {
        let started = Instant::now();
        let ms = |s: Instant| u64::try_from(s.elapsed().as_millis()).unwrap_or(u64::MAX);
        // Checked again now: the URL's rules, then the addresses its name resolves to at
        // this moment, and the request goes to exactly those (no second lookup).
        let url = match self.config.url_policy.check(&hook.url) {
            Ok(u) => u,
            Err(e) => return self.failed(d, None, 0, format!("url refused: {e}"), None),
        };
        let addrs = match self.config.url_policy.resolve(&url).await {
            Ok(a) => a,
            Err(e) => return self.failed(d, None, ms(started), format!("url refused: {e}"), None),
        };
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .timeout(self.config.timeout)
            .connect_timeout(self.config.timeout);
        if let Some(url::Host::Domain(name)) = url.host() {
            builder = builder.resolve_to_addrs(name, &addrs);
        }
        let client = match builder.build() {
            Ok(c) => c,
            Err(e) => return self.failed(d, None, 0, format!("http client: {e}"), None),
        };
        let ts = Utc::now().timestamp();
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(
            USER_AGENT,
            HeaderValue::from_static(concat!("Differently-Webhooks/", env!("CARGO_PKG_VERSION"))),
        );
        let sig = signing::signature_header(secrets, &d.event_id, ts, d.body.as_bytes());
        let (Ok(id), Ok(sig)) = (
            HeaderValue::from_str(&d.event_id),
            HeaderValue::from_str(&sig),
        ) else {
            return self.failed(d, None, 0, "event id is not a header value".into(), None);
        };
        headers.insert(signing::HEADER_ID, id);
        headers.insert(signing::HEADER_TIMESTAMP, HeaderValue::from(ts));
        headers.insert(signing::HEADER_SIGNATURE, sig);
        let sent = client
            .post(url)
            .headers(headers)
            .body(d.body.clone())
            .send()
            .await;
        let mut resp = match sent {
            Ok(r) => r,
            Err(e) => {
                let why = if e.is_timeout() {
                    format!("timed out after {} ms", self.config.timeout.as_millis())
                } else if e.is_connect() {
                    "connection failed".to_owned()
                } else {
                    "request failed".to_owned()
                };
                return self.failed(d, None, ms(started), why, None);
            }
        };
        let code = resp.status().as_u16();
        // The first bytes of the answer only: a receiver cannot make us hold more.
        let mut body = Vec::new();
        while body.len() < MAX_RESPONSE_BODY_BYTES {
            match tokio::time::timeout(self.config.timeout, resp.chunk()).await {
                Ok(Ok(Some(c))) => body.extend_from_slice(&c),
                _ => break,
            }
        }
        body.truncate(MAX_RESPONSE_BODY_BYTES);
        let body = (!body.is_empty()).then(|| String::from_utf8_lossy(&body).into_owned());
        let latency = ms(started);
        if resp.status().is_success() {
            AttemptOutcome {
                succeeded: true,
                response_code: Some(code),
                latency_ms: latency,
                error: None,
                response_body: body,
                retry_at: None,
            }
        } else {
            self.failed(
                d,
                Some(code),
                latency,
                format!("receiver answered {code}"),
                body,
            )
        }
    }

    fn failed(
        &self,
        d: &Delivery,
        code: Option<u16>,
        latency_ms: u64,
        error: String,
        body: Option<String>,
    ) -> AttemptOutcome {
        AttemptOutcome {
            succeeded: false,
            response_code: code,
            latency_ms,
            error: Some(error),
            response_body: body,
            retry_at: self
                .config
                .backoff
                .next_attempt(d.attempts + 1, d.created_at, Utc::now()),
        }
    }

    /// `webhook.disabled` on the public stream (so other webhooks, SSE and NATS subscribers
    /// of the project hear of it).
    async fn announce_disabled(&self, hook: &Webhook) {
        tracing::warn!(webhook = %hook.id, org = %hook.org_id, "webhooks: disabled after persistent failure");
        let since = hook
            .failing_since
            .map(|t| t.timestamp_millis().to_string())
            .unwrap_or_default();
        let event = PublicEvent::new(
            hook.org_id.clone(),
            hook.project_id.clone(),
            None,
            Origin::system(Cause::Reconciler),
            Utc::now(),
            &format!("{}-{since}", hook.id),
            EventData::WebhookDisabled(WebhookDisabled {
                webhook_id: hook.id.clone(),
                reason: hook.disabled_reason.clone().unwrap_or_default(),
            }),
        );
        if let Err(e) = self.announcer.public(&event).await {
            tracing::warn!(webhook = %hook.id, error = %e, "webhooks: webhook.disabled not published");
        }
    }
}

/// The delivery's webhook no longer exists (its rows go with it).
struct Gone;

/// Sleeps `d`; true if `stop` turned true meanwhile.
async fn wait_or_stop(stop: &mut watch::Receiver<bool>, d: Duration) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = stop.changed() => {}
    }
    *stop.borrow()
}
