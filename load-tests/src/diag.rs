//! Evidence for the figures: what Postgres backends of the control plane were doing while
//! under load (sampled `pg_stat_activity`: lock waits, round trips inside transactions), and
//! `EXPLAIN ANALYZE` of the hot per-request queries on the run's final data.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use sqlx::{PgPool, Row};
use tokio::sync::watch;

use crate::LoadError;

/// One kind of backend activity and how often it was seen.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WaitShare {
    /// `state | wait_event_type:wait_event | query prefix`.
    pub what: String,
    /// Samples that saw a backend doing this.
    pub samples: u64,
    /// Average number of backends doing this per sample.
    pub backends_per_sample: f64,
}

/// Samples `pg_stat_activity` of the run's database every `every` until finished.
pub struct WaitSampler {
    counts: Arc<Mutex<(u64, HashMap<String, u64>)>>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl WaitSampler {
    /// Starts sampling the run's database through `pool` (one connection of it).
    pub fn start(pool: PgPool, every: Duration) -> WaitSampler {
        Self::sample(pool, every, false)
    }

    /// Like `start`, but every busy backend of the server: other databases (the server is
    /// shared), autovacuum and checkpointer included, each labelled with its database and
    /// backend type. For phases meant to run on a quiet system, to see whether it was.
    pub fn start_server_wide(pool: PgPool, every: Duration) -> WaitSampler {
        Self::sample(pool, every, true)
    }

    fn sample(pool: PgPool, every: Duration, server_wide: bool) -> WaitSampler {
        let counts: Arc<Mutex<(u64, HashMap<String, u64>)>> = Arc::default();
        let (stop, mut rx) = watch::channel(false);
        let c = counts.clone();
        let task = tokio::spawn(async move {
            loop {
                let rows = sqlx::query(
                    "SELECT coalesce(state, backend_type) AS state,
                            coalesce(wait_event_type, 'CPU') || ':' || coalesce(wait_event, '-') AS w,
                            CASE WHEN $1 THEN coalesce(datname, '-') || ' · ' || backend_type || ' · '
                                 ELSE '' END
                              || left(regexp_replace(coalesce(query, ''), '\\s+', ' ', 'g'), 90) AS q
                     FROM pg_stat_activity
                     WHERE ($1 OR datname = current_database()) AND pid <> pg_backend_pid()
                       AND (state IN ('active', 'idle in transaction')
                            OR ($1 AND state IS NULL AND wait_event_type IS DISTINCT FROM 'Activity'))
                       AND coalesce(query, '') NOT LIKE '%pg_stat_activity%'",
                )
                .bind(server_wide)
                .fetch_all(&pool)
                .await;
                if let Ok(rows) = rows {
                    let mut m = c.lock().unwrap_or_else(|e| e.into_inner());
                    m.0 += 1;
                    for r in rows {
                        let state: String = r.try_get("state").unwrap_or_default();
                        let w: String = r.try_get("w").unwrap_or_default();
                        let q: String = r.try_get("q").unwrap_or_default();
                        *m.1.entry(format!("{state} | {w} | {q}")).or_default() += 1;
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = rx.changed() => return,
                }
            }
        });
        WaitSampler { counts, stop, task }
    }

    /// Stops and returns the `top` most frequent activities.
    pub async fn finish(self, top: usize) -> Vec<WaitShare> {
        self.finish_counted(top).await.0
    }

    /// Like `finish`, with the number of samples taken: each is one transaction of the run's
    /// database, which the structure figures subtract.
    pub async fn finish_counted(self, top: usize) -> (Vec<WaitShare>, u64) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        let m = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let samples = m.0.max(1);
        let mut v: Vec<WaitShare> =
            m.1.iter()
                .map(|(k, n)| WaitShare {
                    what: k.clone(),
                    samples: *n,
                    backends_per_sample: *n as f64 / samples as f64,
                })
                .collect();
        v.sort_by_key(|w| std::cmp::Reverse(w.samples));
        v.truncate(top);
        (v, m.0)
    }
}

/// One explained query.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explained {
    /// Which store call runs it.
    pub name: String,
    /// `EXPLAIN (ANALYZE, BUFFERS)` output.
    pub plan: Vec<String>,
}

/// Explains the queries the placement leader runs over many rows on every pass, on the
/// run's final data.
pub async fn explain_hot_queries(pool: &PgPool) -> Result<Vec<Explained>, LoadError> {
    // What the leader runs over many rows on every pass (the per-sandbox paths are one-row
    // reads and writes by key; their cost is in the activity samples, not in a plan).
    let queries = vec![
        (
            "store runnable_queued — placement repair pass".to_owned(),
            "SELECT doc FROM sandboxes WHERE status = 'queued' AND next_attempt_at <= now() ORDER BY id LIMIT 10000".to_owned(),
        ),
        (
            "store live_not_listed — reconciler, every pass per pool, with every running id listed".to_owned(),
            "SELECT s.doc FROM sandboxes s
             WHERE s.pool = (SELECT pool FROM sandboxes WHERE pool IS NOT NULL
                             GROUP BY pool ORDER BY count(*) DESC LIMIT 1)
               AND s.status = ANY('{running,paused,stopped}') AND s.updated_at < now()
               AND s.id NOT IN (SELECT l.id FROM unnest((SELECT array_agg(id) FROM sandboxes
                                                          WHERE status = 'running')) AS l(id))
             ORDER BY s.id LIMIT 100".to_owned(),
        ),
        (
            "store idle_candidates — idle sweep, every pass, under a one-hour default".to_owned(),
            "SELECT id FROM (
                 SELECT s.id, s.updated_at FROM sandboxes s
                 LEFT JOIN sandbox_activity a ON a.sandbox_id = s.id
                 WHERE s.status = 'running'
                   AND (s.doc -> 'spec' ->> 'idleTimeoutSeconds') IS NOT NULL
                   AND (s.doc -> 'spec' ->> 'idleTimeoutSeconds')::numeric
                       < EXTRACT(EPOCH FROM (now() - GREATEST(s.updated_at,
                             COALESCE(a.last_activity_at, s.updated_at))))
                 UNION ALL
                 SELECT s.id, s.updated_at FROM sandboxes s
                 LEFT JOIN sandbox_activity a ON a.sandbox_id = s.id
                 WHERE s.status = 'running' AND s.updated_at < now() - interval '1 hour'
                   AND (s.doc -> 'spec' ->> 'idleTimeoutSeconds') IS NULL
                   AND (a.last_activity_at IS NULL
                        OR a.last_activity_at < now() - interval '1 hour')
             ) idle
             ORDER BY updated_at LIMIT 100".to_owned(),
        ),
    ];
    let mut out = Vec::new();
    for (name, q) in queries {
        let rows = sqlx::query(&format!("EXPLAIN (ANALYZE, BUFFERS) {q}"))
            .fetch_all(pool)
            .await
            .map_err(|e| LoadError::db(format!("explaining {name}"), e))?;
        let plan = rows
            .iter()
            .filter_map(|r| r.try_get::<String, _>(0).ok())
            .collect();
        out.push(Explained { name, plan });
    }
    Ok(out)
}

/// Row counts of the big tables at the end of the run.
pub async fn table_rows(pool: &PgPool) -> Result<Vec<(String, i64)>, LoadError> {
    let mut out = Vec::new();
    for t in ["sandboxes", "audit_events"] {
        let n: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {t}"))
            .fetch_one(pool)
            .await
            .map_err(|e| LoadError::db(format!("counting {t}"), e))?;
        out.push((t.to_owned(), n));
    }
    Ok(out)
}

/// A `perf record` attached to one process.
pub struct PerfRecording {
    child: std::process::Child,
    data: std::path::PathBuf,
}

/// Starts `perf record -g` (499 Hz) on `pid`, writing `data`.
pub fn perf_start(pid: u32, data: &std::path::Path) -> Result<PerfRecording, LoadError> {
    let child = std::process::Command::new("perf")
        .args(["record", "-F", "499", "-g", "-o"])
        .arg(data)
        .args(["-p", &pid.to_string()])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| LoadError::io("spawning perf record (is perf installed?)", e))?;
    Ok(PerfRecording {
        child,
        data: data.to_owned(),
    })
}

impl PerfRecording {
    /// Stops the recording (SIGINT, bounded wait) and writes `perf report --stdio` next to
    /// the data as `.txt`; returns that path.
    pub async fn finish(mut self) -> Result<std::path::PathBuf, LoadError> {
        let pid = self.child.id().to_string();
        let _ = std::process::Command::new("kill")
            .args(["-INT", &pid])
            .status();
        for _ in 0..100 {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let txt = self.data.with_extension("txt");
        let out = std::process::Command::new("perf")
            .args([
                "report",
                "--stdio",
                "--no-children",
                "--percent-limit",
                "1",
                "-g",
                "none",
                "-i",
            ])
            .arg(&self.data)
            .output()
            .map_err(|e| LoadError::io("running perf report", e))?;
        std::fs::write(&txt, &out.stdout)
            .map_err(|e| LoadError::io("writing the perf report", e))?;
        Ok(txt)
    }
}
