//! The noisy-neighbour test: one tenant floods (creates at its quota wall, hostile inputs,
//! failed logins) while a quiet tenant runs the same measured workload it ran alone a moment
//! before, in the same run: its create latency must stay within a bound of its quiet-run
//! latency, its sandboxes must reach running and its TTL sweep must keep working, and the
//! 429s must go to the flooding tenant only.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Value};

use crate::client::{provision, Api};
use crate::cluster::generate_key;
use crate::faults::rng::Rng;
use crate::faults::topology::{Topology, TopologyOpts};
use crate::stats::{summarize, Summary};
use crate::LoadError;

/// Knobs.
#[derive(Debug, Clone)]
pub struct NoisyOpts {
    /// The `differently` binary.
    pub binary: PathBuf,
    /// Seed of the flood's choices.
    pub seed: u64,
    /// Total length of each condition (quiet, flood), split into alternating windows.
    pub phase: Duration,
    /// Quiet/flood window pairs.
    pub windows: usize,
    /// Quiet tenant's creates per second.
    pub victim_rate: f64,
    /// Concurrent flooding tasks.
    pub flooders: usize,
    /// Their total request rate (requests/s; 0: as fast as they can). The flooder's key is
    /// limited to 30/s, so anything above is refused traffic; unbounded, a debug build on a
    /// shared 2-core machine measures CPU contention rather than tenant isolation.
    pub flood_rate: f64,
    /// Largest allowed ratio flood/quiet of the victim's create p95 and p99 (p50 is
    /// reported).
    pub max_ratio: f64,
    /// ... unless the two differ by less than this (ms): a 15 ms quiet p99 doubled is
    /// scheduler noise on a shared, busy 2-core machine, not a neighbour's doing; an unfair
    /// design costs the victim seconds (or 429s, checked apart).
    pub slack_ms: f64,
    /// The victim organization's `maxActive` (a window's creates stay running until the
    /// window's deletes, so it bounds `victim_rate` × window length).
    pub victim_max_active: u32,
}

impl NoisyOpts {
    /// The CI version: 24 s of each condition in 6 alternating window pairs, 16 creates/s
    /// (about 380 samples per condition, so the p99 is the fourth slowest create, not the
    /// single slowest), 6 flooders at 300 requests/s in all (10× the flooder key's limit),
    /// ratio 2.
    pub fn new(binary: PathBuf, seed: u64) -> NoisyOpts {
        NoisyOpts {
            binary,
            seed,
            phase: Duration::from_secs(24),
            windows: 6,
            victim_rate: 16.0,
            flooders: 6,
            flood_rate: 300.0,
            max_ratio: 2.0,
            slack_ms: 100.0,
            victim_max_active: 100,
        }
    }
}

/// What the victim saw in one phase.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VictimPhase {
    /// Create request latency (202s).
    pub create: Summary,
    /// Creates answered anything but 202.
    pub create_refused: u64,
    /// Of those, 429s.
    pub create_429: u64,
    /// Sandboxes that reached running (of those admitted).
    pub reached_running: usize,
    /// Admitted.
    pub admitted: usize,
    /// Seconds from a `ttlSeconds: 2` sandbox's expiry to `terminated` (the worst window).
    pub ttl_to_terminated_seconds: Option<f64>,
    /// Measurement windows merged into this phase.
    pub windows: usize,
    /// The raw create latencies, to merge windows.
    #[serde(skip)]
    pub samples: Vec<Duration>,
}

impl VictimPhase {
    /// Adds window `w` to this phase.
    fn merge(&mut self, w: VictimPhase) {
        self.samples.extend(w.samples);
        self.create = summarize(&self.samples);
        self.create_refused += w.create_refused;
        self.create_429 += w.create_429;
        self.reached_running += w.reached_running;
        self.admitted += w.admitted;
        self.windows += 1;
        self.ttl_to_terminated_seconds =
            match (self.ttl_to_terminated_seconds, w.ttl_to_terminated_seconds) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (None, b) if self.windows == 1 => b,
                _ => None,
            };
    }
}

/// The whole test.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NoisyReport {
    /// The seed.
    pub seed: u64,
    /// Everything held.
    pub ok: bool,
    /// Victim alone.
    pub quiet: VictimPhase,
    /// Victim while the neighbour floods.
    pub flood: VictimPhase,
    /// flood p50 / quiet p50 of the victim's create latency.
    pub p50_ratio: f64,
    /// flood p95 / quiet p95 (judged).
    pub p95_ratio: f64,
    /// flood p99 / quiet p99 (judged).
    pub p99_ratio: f64,
    /// Requests the flooder sent, and how they were answered.
    pub flooder_requests: u64,
    /// Flooder 429s (quota wall, rate limit, auth throttle).
    pub flooder_429: u64,
    /// Flooder 5xx (must be 0: hostile input is a 4xx).
    pub flooder_5xx: u64,
    /// Flooder requests without an answer (connection closed under a reused connection).
    pub flooder_no_answer: u64,
    /// Examples of flooder 5xx answers.
    pub flooder_5xx_examples: Vec<String>,
    /// The victim's valid key after the neighbour sent wrong secrets under its key id:
    /// the HTTP status it then got (200 expected: a valid key is never blocked by
    /// another's failures).
    pub victim_after_forged_failures: u16,
    /// Why the test failed, one line per reason.
    pub failures: Vec<String>,
}

impl NoisyReport {
    /// Terminal rendering.
    pub fn render(&self) -> String {
        format!(
            "noisy neighbour seed={} {}\n  victim create p50 {:.1} ms -> {:.1} ms (x{:.2}), p95 {:.1} ms -> {:.1} ms (x{:.2}), p99 {:.1} ms -> {:.1} ms (x{:.2})\n  victim running {}/{} quiet, {}/{} flood; victim 429s {} / {}; ttl->terminated {:?} s quiet, {:?} s flood\n  flooder {} requests, {} x 429, {} x 5xx, {} unanswered; victim key after forged failures: HTTP {}\n{}",
            self.seed,
            if self.ok { "OK" } else { "FAILED" },
            self.quiet.create.p50_ms,
            self.flood.create.p50_ms,
            self.p50_ratio,
            self.quiet.create.p95_ms,
            self.flood.create.p95_ms,
            self.p95_ratio,
            self.quiet.create.p99_ms,
            self.flood.create.p99_ms,
            self.p99_ratio,
            self.quiet.reached_running,
            self.quiet.admitted,
            self.flood.reached_running,
            self.flood.admitted,
            self.quiet.create_429,
            self.flood.create_429,
            self.quiet.ttl_to_terminated_seconds,
            self.flood.ttl_to_terminated_seconds,
            self.flooder_requests,
            self.flooder_429,
            self.flooder_5xx,
            self.flooder_no_answer,
            self.victim_after_forged_failures,
            self.failures
                .iter()
                .map(|f| format!("  FAIL {f}\n"))
                .collect::<String>()
        )
    }
}

/// The status and JSON body, or status 0 and the transport error's text.
async fn status_of(r: reqwest::Result<reqwest::Response>) -> (u16, Value) {
    match r {
        Ok(r) => {
            let s = r.status().as_u16();
            (s, r.json().await.unwrap_or(Value::Null))
        }
        Err(e) => (
            0,
            Value::String(format!("{e:?}").chars().take(300).collect()),
        ),
    }
}

/// The victim's measured phase: creates at `rate` for `len`, each deleted once running,
/// plus one `ttlSeconds: 2` sandbox whose expiry is timed.
async fn victim_phase(
    pool: &sqlx::PgPool,
    http: &reqwest::Client,
    base: &str,
    key: &str,
    rate: f64,
    len: Duration,
) -> VictimPhase {
    let mut out = VictimPhase::default();
    let ttl = {
        let (s, v) = status_of(
            http.post(format!("{base}/v1/sandboxes"))
                .bearer_auth(key)
                .json(&json!({"ttlSeconds": 2}))
                .send()
                .await,
        )
        .await;
        (s == 202).then(|| v["id"].as_str().unwrap_or_default().to_owned())
    };
    // Its expiry is timed from Postgres (`updated_at` of the terminated row − `expires_at`),
    // polled alongside the phase so the phase's length does not count.
    let ttl_task = ttl.map(|id| {
        let pool = pool.clone();
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline {
                let row: Option<(String, Option<f64>)> = sqlx::query_as(
                    "SELECT status, extract(epoch FROM updated_at - expires_at)::float8
                     FROM sandboxes WHERE id = $1",
                )
                .bind(&id)
                .fetch_optional(&pool)
                .await
                .unwrap_or(None);
                if let Some((st, late)) = row {
                    if st == "terminated" {
                        return late;
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            None
        })
    });
    let mut lat = Vec::new();
    let mut ids = Vec::new();
    let start = Instant::now();
    let gap = Duration::from_secs_f64(1.0 / rate);
    let mut next = start;
    while start.elapsed() < len {
        tokio::time::sleep_until(next.into()).await;
        next += gap;
        let t = Instant::now();
        let (s, v) = status_of(
            http.post(format!("{base}/v1/sandboxes"))
                .bearer_auth(key)
                .json(&json!({}))
                .send()
                .await,
        )
        .await;
        if s == 202 {
            lat.push(t.elapsed());
            if let Some(id) = v["id"].as_str() {
                ids.push(id.to_owned());
            }
        } else {
            out.create_refused += 1;
            out.create_429 += u64::from(s == 429);
        }
    }
    out.admitted = ids.len();
    out.create = summarize(&lat);
    out.samples = lat;
    // Running is read from Postgres, so the check spends none of the victim's rate limit;
    // the deletes are paced below it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM sandboxes WHERE id = ANY($1) AND status = 'running'",
        )
        .bind(&ids)
        .fetch_one(pool)
        .await
        .unwrap_or(0);
        out.reached_running = usize::try_from(n).unwrap_or(0);
        if out.reached_running >= ids.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for id in &ids {
        let _ = http
            .delete(format!("{base}/v1/sandboxes/{id}"))
            .bearer_auth(key)
            .send()
            .await;
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    if let Some(task) = ttl_task {
        out.ttl_to_terminated_seconds = task.await.unwrap_or(None);
    }
    out
}

/// Hostile request bodies: each must be refused with a 4xx.
fn hostile(rng: &mut Rng) -> (String, &'static str) {
    match rng.below(7) {
        0 => (
            r#"{"idleTimeoutSeconds":18446744073709551615}"#.to_owned(),
            "application/json",
        ),
        1 => (
            r#"{"idleTimeoutSeconds":1e16}"#.to_owned(),
            "application/json",
        ),
        2 => (
            r#"{"labels":{"a\u0000":"b"}}"#.to_owned(),
            "application/json",
        ),
        3 => (r#"{"ttlSeconds":60} junk"#.to_owned(), "application/json"),
        4 => ("{".repeat(5000), "application/json"),
        5 => (
            format!(r#"{{"template":"{}"}}"#, "x".repeat(2 << 20)),
            "application/json",
        ),
        _ => ("not json at all".to_owned(), "text/plain"),
    }
}

/// Runs the test.
pub async fn run_noisy(o: NoisyOpts) -> Result<NoisyReport, LoadError> {
    let mut topts = TopologyOpts::new(o.binary.clone());
    topts.key_rate = (30.0, 30.0);
    topts.max_active = o.victim_max_active;
    topts.log_level = "warn".to_owned();
    let t = Topology::start(topts).await?;
    let api = Api::new(t.url())?;
    let tenancy = provision(&api, &t.key, 2).await?;
    let victim = tenancy.tenants[0].key.clone();
    let flooder = tenancy.tenants[1].key.clone();
    // The flooder's organization is small: 3 active, 2 queued, so its creates hit the wall.
    if let Some(org) = &tenancy.tenants[1].org_id {
        let r = api
            .http()
            .put(format!("{}/v1/orgs/{org}/quota", t.url()))
            .bearer_auth(&t.key)
            .json(&json!({"maxActive": 3, "maxQueued": 2}))
            .send()
            .await
            .map_err(|e| LoadError::http("PUT quota", e))?;
        if !r.status().is_success() {
            return Err(LoadError::Api {
                context: "PUT /v1/orgs/{id}/quota".into(),
                status: r.status().as_u16(),
                body: r.text().await.unwrap_or_default(),
            });
        }
    }
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| LoadError::http("client", e))?;
    let base = t.url();
    let pool = t.db.pool();
    // Hostile bodies (some oversized) on connections of their own: the server may close a
    // connection it answered early, and a pooled one reused after that is the client's race,
    // not an answer.
    let raw = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(0)
        .build()
        .map_err(|e| LoadError::http("client", e))?;

    // Warm-up.
    let _ = victim_phase(
        &pool,
        &http,
        &base,
        &victim,
        o.victim_rate,
        Duration::from_secs(2),
    )
    .await;

    // The flooders run throughout but idle while `hush` is set; quiet and flood windows
    // alternate, so the shared machine's background load changes both alike.
    let stop = Arc::new(AtomicBool::new(false));
    let hush = Arc::new(AtomicBool::new(true));
    let (sent, n429, n5xx, ntransport) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let examples = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let stranger = generate_key(&o.binary)?;
    let mut tasks = tokio::task::JoinSet::new();
    for f in 0..o.flooders {
        let (stop, hush, sent, n429, n5xx, ntransport, examples) = (
            stop.clone(),
            hush.clone(),
            sent.clone(),
            n429.clone(),
            n5xx.clone(),
            ntransport.clone(),
            examples.clone(),
        );
        let (http, raw, base, key, stranger) = (
            http.clone(),
            raw.clone(),
            base.clone(),
            flooder.clone(),
            stranger.clone(),
        );
        let mut rng = Rng::fork(o.seed, 500 + f as u64);
        let gap =
            (o.flood_rate > 0.0).then(|| Duration::from_secs_f64(o.flooders as f64 / o.flood_rate));
        tasks.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if hush.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                let (what, req) = match rng.below(10) {
                    // Creates at the quota wall.
                    0..=4 => (
                        "create",
                        http.post(format!("{base}/v1/sandboxes"))
                            .bearer_auth(&key)
                            .json(&json!({})),
                    ),
                    // Hostile bodies.
                    5..=7 => {
                        let (body, ct) = hostile(&mut rng);
                        (
                            "hostile",
                            raw.post(format!("{base}/v1/sandboxes"))
                                .bearer_auth(&key)
                                .header("content-type", ct)
                                .body(body),
                        )
                    }
                    // Failed logins: an unknown well-formed key, and garbage.
                    8 => (
                        "bad-key",
                        http.get(format!("{base}/v1/sandboxes"))
                            .bearer_auth(&stranger),
                    ),
                    _ => (
                        "garbage-key",
                        http.get(format!("{base}/v1/sandboxes"))
                            .bearer_auth(format!("dly_key_garbage{}", rng.below(1000))),
                    ),
                };
                let t = Instant::now();
                let (s, v) = status_of(req.send().await).await;
                sent.fetch_add(1, Ordering::Relaxed);
                if let Some(gap) = gap {
                    tokio::time::sleep(gap.saturating_sub(t.elapsed())).await;
                }
                if s == 429 {
                    n429.fetch_add(1, Ordering::Relaxed);
                }
                if s == 0 {
                    ntransport.fetch_add(1, Ordering::Relaxed);
                }
                if s >= 500 || s == 0 {
                    n5xx.fetch_add(u64::from(s >= 500), Ordering::Relaxed);
                    let mut e = examples.lock().unwrap_or_else(|p| p.into_inner());
                    if e.len() < 5 {
                        e.push(format!(
                            "{what}: HTTP {s} {}",
                            v.to_string().chars().take(200).collect::<String>()
                        ));
                    }
                }
            }
        });
    }
    let (mut quiet, mut flood) = (VictimPhase::default(), VictimPhase::default());
    let window = o.phase / u32::try_from(o.windows.max(1)).unwrap_or(1);
    for _ in 0..o.windows.max(1) {
        hush.store(true, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(300)).await;
        quiet.merge(victim_phase(&pool, &http, &base, &victim, o.victim_rate, window).await);
        hush.store(false, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(300)).await;
        flood.merge(victim_phase(&pool, &http, &base, &victim, o.victim_rate, window).await);
    }
    stop.store(true, Ordering::Relaxed);
    while tasks.join_next().await.is_some() {}

    // Forged failures under the victim's key id (the id is not a secret: it is in audit
    // records and key listings), then the victim's real key.
    let victim_id = victim
        .rsplit_once('_')
        .map(|(id, _)| id.to_owned())
        .unwrap_or_default();
    let stranger_secret = stranger
        .rsplit_once('_')
        .map(|(_, s)| s.to_owned())
        .unwrap_or_default();
    let forged = format!("{victim_id}_{stranger_secret}");
    for _ in 0..60 {
        let _ = http
            .get(format!("{base}/v1/sandboxes"))
            .bearer_auth(&forged)
            .send()
            .await;
    }
    let (victim_after, _) = status_of(
        http.get(format!("{base}/v1/sandboxes"))
            .bearer_auth(&victim)
            .send()
            .await,
    )
    .await;

    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::INFINITY };
    let p50_ratio = ratio(flood.create.p50_ms, quiet.create.p50_ms);
    let p99_ratio = ratio(flood.create.p99_ms, quiet.create.p99_ms);
    let p95_ratio = ratio(flood.create.p95_ms, quiet.create.p95_ms);
    let mut failures = Vec::new();
    for (name, r, q, f) in [
        ("p95", p95_ratio, quiet.create.p95_ms, flood.create.p95_ms),
        ("p99", p99_ratio, quiet.create.p99_ms, flood.create.p99_ms),
    ] {
        if r > o.max_ratio && f - q > o.slack_ms {
            failures.push(format!(
                "victim create {name} x{r:.2} > x{} and {:.1} ms > {} ms above quiet",
                o.max_ratio,
                f - q,
                o.slack_ms
            ));
        }
    }
    for (name, p) in [("quiet", &quiet), ("flood", &flood)] {
        if p.admitted == 0 || p.reached_running != p.admitted {
            failures.push(format!(
                "{name}: {}/{} victim sandboxes reached running",
                p.reached_running, p.admitted
            ));
        }
        if p.create_429 > 0 {
            failures.push(format!("{name}: the victim got {} x 429", p.create_429));
        }
    }
    match (
        quiet.ttl_to_terminated_seconds,
        flood.ttl_to_terminated_seconds,
    ) {
        (Some(q), Some(f)) if f <= (2.0 * q).max(q + 2.0) => {}
        other => failures.push(format!(
            "victim TTL expiry -> terminated (quiet, flood) = {other:?} s"
        )),
    }
    let (sent, n429, n5xx, ntransport) = (
        sent.load(Ordering::Relaxed),
        n429.load(Ordering::Relaxed),
        n5xx.load(Ordering::Relaxed),
        ntransport.load(Ordering::Relaxed),
    );
    if n429 == 0 {
        failures.push("the flooder never got a 429".to_owned());
    }
    if n5xx > 0 {
        failures.push(format!("the flooder got {n5xx} server errors"));
    }
    if victim_after != 200 {
        failures.push(format!(
            "the victim's valid key got HTTP {victim_after} after another client's failures under its key id"
        ));
    }
    let flooder_5xx_examples = examples.lock().unwrap_or_else(|p| p.into_inner()).clone();
    Ok(NoisyReport {
        seed: o.seed,
        ok: failures.is_empty(),
        quiet,
        flood,
        p50_ratio,
        p95_ratio,
        p99_ratio,
        flooder_requests: sent,
        flooder_429: n429,
        flooder_5xx: n5xx,
        flooder_no_answer: ntransport,
        flooder_5xx_examples,
        victim_after_forged_failures: victim_after,
        failures,
    })
}
