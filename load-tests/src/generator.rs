//! The load itself: bounded concurrent create and delete batches, and the fixed-rate mix of
//! sessions (create → wait running → exec → delete). Progress that only Postgres knows
//! (everything running, everything terminated, when the leader activated) is read from it.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgPool, Row};

use crate::client::{Api, Created, Tenancy};
use crate::stats::{summarize, Summary, Throughput};
use crate::LoadError;

/// A sandbox the generator created, and as which tenant.
#[derive(Debug, Clone)]
pub struct Made {
    /// Index into `Tenancy::tenants`.
    pub tenant: usize,
    /// The sandbox id.
    pub id: String,
}

/// Runs `f(i)` for `i in 0..n` on `concurrency` workers; stops taking new items at
/// `deadline`. Results come back in completion order.
pub async fn for_each_bounded<T, F, Fut>(
    n: usize,
    concurrency: usize,
    deadline: Instant,
    f: F,
) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = T> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency.min(n).max(1) {
        let next = next.clone();
        let f = f.clone();
        tasks.spawn(async move {
            let mut out = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n || Instant::now() > deadline {
                    return out;
                }
                out.push(f(i).await);
            }
        });
    }
    let mut all = Vec::with_capacity(n);
    while let Some(r) = tasks.join_next().await {
        if let Ok(v) = r {
            all.extend(v);
        }
    }
    all
}

/// A batch of creates.
#[derive(Debug, Clone, Default)]
pub struct CreateBatch {
    /// 202s.
    pub accepted: Vec<Made>,
    /// Non-202 answers and transport errors (first few kept verbatim).
    pub refused: usize,
    /// Examples of refusals.
    pub refusal_examples: Vec<String>,
    /// Admission throughput (202s over the batch's wall time) and per-request latency.
    pub throughput: Throughput,
}

/// `n` creates round-robin over the tenants with `concurrency` in flight.
pub async fn create_batch(
    api: &Api,
    tenancy: &Tenancy,
    n: usize,
    concurrency: usize,
    deadline: Instant,
) -> CreateBatch {
    let keys: Arc<Vec<String>> = Arc::new(tenancy.tenants.iter().map(|t| t.key.clone()).collect());
    let api = api.clone();
    let started = Instant::now();
    let results = for_each_bounded(n, concurrency, deadline, move |i| {
        let api = api.clone();
        let keys = keys.clone();
        async move {
            let tenant = i % keys.len();
            let t = Instant::now();
            let r = api.create(&keys[tenant]).await;
            (tenant, r, t.elapsed())
        }
    })
    .await;
    let wall = started.elapsed();
    let mut batch = CreateBatch::default();
    let mut lat = Vec::with_capacity(results.len());
    for (tenant, r, d) in results {
        match r {
            Ok(Created::Accepted(id)) => {
                lat.push(d);
                batch.accepted.push(Made { tenant, id });
            }
            Ok(Created::Refused(status, body)) => {
                batch.refused += 1;
                if batch.refusal_examples.len() < 5 {
                    batch
                        .refusal_examples
                        .push(format!("HTTP {status}: {body}"));
                }
            }
            Err(e) => {
                batch.refused += 1;
                if batch.refusal_examples.len() < 5 {
                    batch.refusal_examples.push(e.to_string());
                }
            }
        }
    }
    batch.throughput = Throughput::new(batch.accepted.len() as u64, wall, &lat);
    batch
}

/// A batch of deletes.
#[derive(Debug, Clone, Default)]
pub struct DeleteBatch {
    /// Ids that got 202.
    pub deleted: Vec<String>,
    /// Other answers.
    pub failed: usize,
    /// Examples of failures.
    pub failure_examples: Vec<String>,
    /// Delete request throughput.
    pub throughput: Throughput,
}

/// Deletes `sandboxes` with `concurrency` in flight.
pub async fn delete_batch(
    api: &Api,
    tenancy: &Tenancy,
    sandboxes: &[Made],
    concurrency: usize,
    deadline: Instant,
) -> DeleteBatch {
    let keys: Arc<Vec<String>> = Arc::new(tenancy.tenants.iter().map(|t| t.key.clone()).collect());
    let list: Arc<Vec<Made>> = Arc::new(sandboxes.to_vec());
    let api = api.clone();
    let started = Instant::now();
    let results = for_each_bounded(list.len(), concurrency, deadline, move |i| {
        let api = api.clone();
        let keys = keys.clone();
        let list = list.clone();
        async move {
            let m = &list[i];
            let t = Instant::now();
            let r = api.delete(&keys[m.tenant], &m.id).await;
            (m.id.clone(), r, t.elapsed())
        }
    })
    .await;
    let wall = started.elapsed();
    let mut batch = DeleteBatch::default();
    let mut lat = Vec::new();
    for (id, r, d) in results {
        match r {
            Ok(202) => {
                lat.push(d);
                batch.deleted.push(id);
            }
            other => {
                batch.failed += 1;
                if batch.failure_examples.len() < 5 {
                    batch.failure_examples.push(format!("{id}: {other:?}"));
                }
            }
        }
    }
    batch.throughput = Throughput::new(batch.deleted.len() as u64, wall, &lat);
    batch
}

/// Waits (polling Postgres) until every id in `ids` has `status`; fails early if one
/// reaches a final status that is not the one awaited.
pub async fn wait_all(
    pool: &PgPool,
    ids: &[String],
    status: &str,
    deadline: Instant,
) -> Result<Duration, LoadError> {
    let started = Instant::now();
    loop {
        let rows = sqlx::query(
            "SELECT status, count(*) AS n FROM sandboxes WHERE id = ANY($1) GROUP BY status",
        )
        .bind(ids)
        .fetch_all(pool)
        .await
        .map_err(|e| LoadError::db("waiting for sandboxes", e))?;
        let mut counts = Vec::new();
        let mut reached = 0i64;
        for r in &rows {
            let s: String = r
                .try_get("status")
                .map_err(|e| LoadError::db("status column", e))?;
            let n: i64 = r
                .try_get("n")
                .map_err(|e| LoadError::db("count column", e))?;
            if s == status {
                reached = n;
            }
            counts.push(format!("{s}={n}"));
        }
        if usize::try_from(reached).unwrap_or(0) >= ids.len() {
            return Ok(started.elapsed());
        }
        let bad_final = rows.iter().any(|r| {
            let s: String = r.try_get("status").unwrap_or_default();
            (s == "failed" || s == "terminated") && s != status
        });
        if bad_final || Instant::now() > deadline {
            return Err(LoadError::Timeout(format!(
                "waiting for {} sandboxes to be {status}: {}",
                ids.len(),
                counts.join(", ")
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// When the placement leader activated a set of sandboxes, from the audit log.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ActivationSpan {
    /// Activations recorded.
    pub count: u64,
    /// First activation.
    pub first: Option<DateTime<Utc>>,
    /// Last activation.
    pub last: Option<DateTime<Utc>>,
    /// `(count − 1) / (last − first)`: the leader's rate over the span it was busy.
    pub per_second: f64,
}

/// Reads the `sandbox.activate` audit records of `ids`.
pub async fn activation_span(pool: &PgPool, ids: &[String]) -> Result<ActivationSpan, LoadError> {
    let row = sqlx::query(
        "SELECT count(*) AS n, min(at) AS first, max(at) AS last FROM audit_events
         WHERE action = 'sandbox.activate' AND resource = ANY($1)",
    )
    .bind(ids)
    .fetch_one(pool)
    .await
    .map_err(|e| LoadError::db("reading activations", e))?;
    let count: i64 = row.try_get("n").map_err(|e| LoadError::db("n", e))?;
    let first: Option<DateTime<Utc>> = row
        .try_get("first")
        .map_err(|e| LoadError::db("first", e))?;
    let last: Option<DateTime<Utc>> = row.try_get("last").map_err(|e| LoadError::db("last", e))?;
    let span = match (first, last) {
        (Some(f), Some(l)) => (l - f).num_microseconds().unwrap_or(0) as f64 / 1e6,
        _ => 0.0,
    };
    Ok(ActivationSpan {
        count: u64::try_from(count).unwrap_or(0),
        first,
        last,
        per_second: if span > 0.0 && count > 1 {
            (count - 1) as f64 / span
        } else {
            0.0
        },
    })
}

/// Where the server-side create→running time of a set of sandboxes went, from Postgres:
/// `createdAt` (the API, before its admission commit) → the `sandbox.activate` audit record
/// (the placement leader, before its activation commit) → `startedAt` (the worker, after the
/// backend answered). Aims P3 work at a hop instead of at the whole path.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerStages {
    /// `createdAt` → activation: admission commit, admit publish, leader queue and decision.
    pub to_activated: Summary,
    /// Activation → `startedAt`: activation commit, work publish, worker pull, backend create.
    pub activated_to_running: Summary,
}

/// Server-side create→running latencies (`startedAt − createdAt`) of the sandboxes of `ids`
/// that reached running, and the same split at their activation (`ServerStages`; a sandbox
/// without an activation record counts only in the first), read in one query.
pub async fn server_side_times(
    pool: &PgPool,
    ids: &[String],
) -> Result<(Summary, ServerStages), LoadError> {
    let rows = sqlx::query(
        "WITH a AS (SELECT resource, min(at) AS at FROM audit_events
                    WHERE action = 'sandbox.activate' AND resource = ANY($1) GROUP BY resource)
         SELECT (s.doc->>'createdAt')::timestamptz AS c, a.at AS a,
                (s.doc->>'startedAt')::timestamptz AS r
         FROM sandboxes s LEFT JOIN a ON a.resource = s.id
         WHERE s.id = ANY($1) AND s.doc->>'startedAt' IS NOT NULL",
    )
    .bind(ids)
    .fetch_all(pool)
    .await
    .map_err(|e| LoadError::db("reading createdAt, activation and startedAt", e))?;
    let ms = |from: DateTime<Utc>, to: DateTime<Utc>| {
        (to - from).num_microseconds().unwrap_or(0) as f64 / 1e3
    };
    let mut whole = Vec::with_capacity(rows.len());
    let (mut first, mut second) = (
        Vec::with_capacity(rows.len()),
        Vec::with_capacity(rows.len()),
    );
    for r in rows {
        let c: DateTime<Utc> = r.try_get("c").map_err(|e| LoadError::db("createdAt", e))?;
        let a: Option<DateTime<Utc>> =
            r.try_get("a").map_err(|e| LoadError::db("activation", e))?;
        let s: DateTime<Utc> = r.try_get("r").map_err(|e| LoadError::db("startedAt", e))?;
        whole.push(ms(c, s));
        if let Some(a) = a {
            first.push(ms(c, a));
            second.push(ms(a, s));
        }
    }
    let stages = ServerStages {
        to_activated: crate::stats::summarize_ms(&mut first),
        activated_to_running: crate::stats::summarize_ms(&mut second),
    };
    Ok((crate::stats::summarize_ms(&mut whole), stages))
}

/// One fixed-rate session as the client saw it.
#[derive(Debug, Clone, Default)]
pub struct Session {
    /// The tenant index.
    pub tenant: usize,
    /// The sandbox id, if the create was accepted.
    pub id: Option<String>,
    /// Create request latency.
    pub admit: Option<Duration>,
    /// From sending the create to the wait answering `running`.
    pub to_running: Option<Duration>,
    /// Exec round trip.
    pub exec: Option<Duration>,
    /// Delete request latency (202).
    pub delete: Option<Duration>,
    /// What went wrong, if anything.
    pub error: Option<String>,
}

/// The fixed-rate phase.
#[derive(Debug, Clone, Default)]
pub struct FixedRate {
    /// Sessions the schedule called for.
    pub planned: usize,
    /// Sessions started.
    pub started: usize,
    /// Sessions skipped because too many were in flight (the system fell behind).
    pub shed: usize,
    /// Sessions still unfinished at the deadline (aborted).
    pub unfinished: usize,
    /// Seconds from first to last start.
    pub start_span_seconds: f64,
    /// Every finished session.
    pub sessions: Vec<Session>,
}

async fn session(api: Api, key: String, tenant: usize, wait_timeout: u64) -> Session {
    let mut s = Session {
        tenant,
        ..Session::default()
    };
    let t0 = Instant::now();
    let id = match api.create(&key).await {
        Ok(Created::Accepted(id)) => id,
        Ok(Created::Refused(status, body)) => {
            s.error = Some(format!("create: HTTP {status}: {body}"));
            return s;
        }
        Err(e) => {
            s.error = Some(e.to_string());
            return s;
        }
    };
    s.admit = Some(t0.elapsed());
    s.id = Some(id.clone());
    match api.wait(&key, &id, "running", wait_timeout).await {
        Ok(status) if status == "running" => s.to_running = Some(t0.elapsed()),
        Ok(status) => {
            s.error = Some(format!("wait: {id} is {status}"));
            return s;
        }
        Err(e) => {
            s.error = Some(e.to_string());
            return s;
        }
    }
    let t = Instant::now();
    match api.exec_echo(&key, &id).await {
        Ok(()) => s.exec = Some(t.elapsed()),
        Err(e) => s.error = Some(e.to_string()),
    }
    let t = Instant::now();
    match api.delete(&key, &id).await {
        Ok(202) => s.delete = Some(t.elapsed()),
        Ok(other) => s.error = Some(format!("delete {id}: HTTP {other}")),
        Err(e) => s.error = Some(e.to_string()),
    }
    s
}

/// Opens `rate` sessions per second for `duration` (open loop: the schedule does not wait
/// for answers), at most `max_in_flight` at once; waits for all to finish by `deadline`.
pub async fn fixed_rate(
    api: &Api,
    tenancy: &Tenancy,
    rate: u32,
    duration: Duration,
    max_in_flight: usize,
    deadline: Instant,
) -> FixedRate {
    let planned = (f64::from(rate) * duration.as_secs_f64()).round() as usize;
    let mut out = FixedRate {
        planned,
        ..FixedRate::default()
    };
    let in_flight = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let first = Instant::now();
    let mut last = first;
    for i in 0..planned {
        tick.tick().await;
        if in_flight.load(Ordering::Relaxed) >= max_in_flight {
            out.shed += 1;
            continue;
        }
        let tenant = i % tenancy.tenants.len();
        let key = tenancy.tenants[tenant].key.clone();
        let api = api.clone();
        let in_flight = in_flight.clone();
        in_flight.fetch_add(1, Ordering::Relaxed);
        tasks.spawn(async move {
            let s = session(api, key, tenant, 30).await;
            in_flight.fetch_sub(1, Ordering::Relaxed);
            s
        });
        out.started += 1;
        last = Instant::now();
    }
    out.start_span_seconds = (last - first).as_secs_f64();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, tasks.join_next()).await {
            Ok(Some(Ok(s))) => out.sessions.push(s),
            Ok(Some(Err(_))) => out.unfinished += 1,
            Ok(None) => break,
            Err(_) => {
                out.unfinished += tasks.len();
                tasks.abort_all();
                break;
            }
        }
    }
    out
}

/// Summaries of the fixed-rate sessions.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FixedRateSummary {
    /// Sessions planned / started / shed / unfinished / failed.
    pub planned: usize,
    /// Sessions started.
    pub started: usize,
    /// Sessions not started because the in-flight bound was hit.
    pub shed: usize,
    /// Sessions aborted at the deadline.
    pub unfinished: usize,
    /// Sessions with any error.
    pub failed: usize,
    /// First few errors.
    pub error_examples: Vec<String>,
    /// Starts per second actually achieved.
    pub achieved_rate: f64,
    /// Create request latency.
    pub admit: Summary,
    /// Create sent → wait answered running (client view).
    pub to_running: Summary,
    /// Exec round trip under load.
    pub exec: Summary,
    /// Delete request latency.
    pub delete: Summary,
}

impl FixedRate {
    /// Adds the sandboxes its sessions created to `accepted` and those whose delete was
    /// accepted to `deleted` (what the invariant check expects); returns the created ids.
    pub fn record_into(
        &self,
        accepted: &mut Vec<String>,
        deleted: &mut Vec<String>,
    ) -> Vec<String> {
        let ids: Vec<String> = self.sessions.iter().filter_map(|s| s.id.clone()).collect();
        accepted.extend(ids.iter().cloned());
        deleted.extend(
            self.sessions
                .iter()
                .filter(|s| s.delete.is_some())
                .filter_map(|s| s.id.clone()),
        );
        ids
    }

    /// Percentiles of each step.
    pub fn summary(&self) -> FixedRateSummary {
        let pick = |f: fn(&Session) -> Option<Duration>| -> Summary {
            let v: Vec<Duration> = self.sessions.iter().filter_map(f).collect();
            summarize(&v)
        };
        let errors: Vec<&String> = self
            .sessions
            .iter()
            .filter_map(|s| s.error.as_ref())
            .collect();
        FixedRateSummary {
            planned: self.planned,
            started: self.started,
            shed: self.shed,
            unfinished: self.unfinished,
            failed: errors.len(),
            error_examples: errors.iter().take(5).map(|s| (*s).clone()).collect(),
            achieved_rate: if self.start_span_seconds > 0.0 {
                (self.started.saturating_sub(1)) as f64 / self.start_span_seconds
            } else {
                0.0
            },
            admit: pick(|s| s.admit),
            to_running: pick(|s| s.to_running),
            exec: pick(|s| s.exec),
            delete: pick(|s| s.delete),
        }
    }
}
