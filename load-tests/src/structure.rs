//! What one session is made of, counted by the servers themselves over the fixed-rate phase
//! (issue #47): Postgres transactions and, where `pg_stat_statements` is loaded, top-level
//! statements (round trips) and `COMMIT`s; messages through nats-server (`/varz`, `/connz`). Each
//! figure is the counter's delta over the window ÷ the sessions that completed in it, and names
//! its source. Instructions per session come from a phase of their own under callgrind
//! (`instructions`) and are added with [`Structure::set_instructions`].

use std::time::{Duration, Instant};

use serde::Serialize;
use sqlx::{PgPool, Row};

use crate::LoadError;

/// Postgres (since 15) flushes an idle backend's counters to `pg_stat_database` up to 10 s
/// late (`PGSTAT_IDLE_INTERVAL`); a window is opened and closed only after this long without
/// the previous work, so no transaction of it lands on the wrong side.
pub const PG_STATS_SETTLE: Duration = Duration::from_millis(11_000);

/// One per-session figure.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PerSession {
    /// Stable key (`structure.commits`, …).
    pub key: String,
    /// What it counts.
    pub name: String,
    /// Per completed session; `None` when not measured.
    pub value: Option<f64>,
    /// The counter's delta over the window, idle work included.
    pub total: Option<f64>,
    /// The counter's rate with no sessions running (idle work), taken out of `value`.
    pub idle_per_second: Option<f64>,
    /// Where it came from, or why it was not measured.
    pub source: String,
}

/// The structure figures of one window.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Structure {
    /// Sessions completed in the window (started − failed − unfinished).
    pub sessions: u64,
    /// The window, from the first snapshot to the last (settle time included).
    pub window_seconds: f64,
    /// The quiet window after it that measures the idle work.
    pub quiet_seconds: f64,
    /// Transactions the harness itself ran on the database in the window (activity samples),
    /// subtracted from the transaction counts.
    pub harness_transactions: u64,
    /// The figures.
    pub figures: Vec<PerSession>,
}

impl Structure {
    /// The figure with `key`.
    pub fn get(&self, key: &str) -> Option<&PerSession> {
        self.figures.iter().find(|f| f.key == key)
    }

    /// A Markdown table for the text report.
    pub fn render(&self) -> String {
        let mut out = format!(
            "\nStructure per session over the fixed-rate phase ({} sessions completed; window {:.1} s with {} s settling on each side, {} harness transactions left out; idle work measured over {:.1} s after it and taken out):\n\n| per session | value | window total | idle per second | source |\n|---|---:|---:|---:|---|\n",
            self.sessions,
            self.window_seconds,
            PG_STATS_SETTLE.as_secs(),
            self.harness_transactions,
            self.quiet_seconds,
        );
        let num =
            |v: Option<f64>, digits: usize| v.map_or("—".to_owned(), |v| format!("{v:.digits$}"));
        for f in &self.figures {
            let v = f
                .value
                .map_or("not measured".to_owned(), |v| format!("{v:.2}"));
            out.push_str(&format!(
                "| {} | {v} | {} | {} | {} |\n",
                f.name,
                num(f.total, 0),
                num(f.idle_per_second, 1),
                f.source
            ));
        }
        out
    }
}

/// Counter readings at one instant.
#[derive(Debug, Clone)]
struct Counters {
    xact_commit: i64,
    xact_rollback: i64,
    /// Top-level statements, `COMMIT`s and deferred-trigger statements of this database,
    /// when `pg_stat_statements` answers.
    statements: Result<(i64, i64, i64), String>,
    /// `/varz` in and out, then the same summed over `/connz`'s client connections.
    nats: Result<[u64; 4], String>,
}

async fn read_counters(
    pool: &PgPool,
    http: &reqwest::Client,
    monitor: &str,
) -> Result<Counters, LoadError> {
    let row = sqlx::query(
        "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(pool)
    .await
    .map_err(|e| LoadError::db("reading pg_stat_database", e))?;
    // The harness's own statements (activity samples, these readings) are left out by text.
    let statements = sqlx::query(
        "SELECT coalesce(sum(calls) FILTER (WHERE NOT trigger), 0)::bigint AS calls,
                coalesce(sum(calls) FILTER (WHERE upper(query) IN ('COMMIT', 'END')), 0)::bigint AS commits,
                coalesce(sum(calls) FILTER (WHERE trigger), 0)::bigint AS triggered
         FROM (SELECT calls, query, (query LIKE 'SELECT usage_add(%'
                   OR query LIKE 'INSERT INTO usage_counters AS u %SELECT d.scope%') AS trigger FROM pg_stat_statements
         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND query NOT LIKE '%pg_stat_%') AS s",
    )
    .fetch_one(pool)
    .await
    .map_err(|e| format!("pg_stat_statements is not available ({e}); see docs/performance.md, Method, item 10"))
    .and_then(|r| {
        Ok((
            r.try_get::<i64, _>("calls").map_err(|e| e.to_string())?,
            r.try_get::<i64, _>("commits").map_err(|e| e.to_string())?,
            r.try_get::<i64, _>("triggered").map_err(|e| e.to_string())?,
        ))
    });
    let nats = nats_messages(http, monitor).await;
    Ok(Counters {
        xact_commit: row
            .try_get("xact_commit")
            .map_err(|e| LoadError::db("reading xact_commit", e))?,
        xact_rollback: row
            .try_get("xact_rollback")
            .map_err(|e| LoadError::db("reading xact_rollback", e))?,
        statements,
        nats,
    })
}

/// Key, name and source of each counter `Counters::values` reads, in its order.
const SOURCES: [(&str, &str, &str); 9] = [
    (
        "structure.transactions",
        "Postgres transactions committed (read-only ones included)",
        "pg_stat_database.xact_commit of the run's database, the harness's own left out",
    ),
    (
        "structure.rollbacks",
        "Postgres transactions rolled back",
        "pg_stat_database.xact_rollback of the run's database",
    ),
    (
        "structure.roundTrips",
        "Postgres round trips (top-level statements)",
        "pg_stat_statements calls in the run's database, less the harness's own and the trigger's",
    ),
    (
        "structure.commits",
        "Postgres COMMITs of explicit transactions",
        "pg_stat_statements calls of COMMIT in the run's database",
    ),
    (
        "structure.triggerStatements",
        "statements of the deferred usage-counter trigger, run at COMMIT (not round trips)",
        "pg_stat_statements calls of the trigger's counter statement (SELECT usage_add(…) before migrations/0017, its INSERT INTO usage_counters … SELECT d.scope after), which it counts as top-level",
    ),
    (
        "structure.natsIn",
        "messages received by nats-server",
        "nats-server /varz in_msgs",
    ),
    (
        "structure.natsOut",
        "messages delivered by nats-server",
        "nats-server /varz out_msgs",
    ),
    (
        "structure.natsClientIn",
        "messages our processes published (client connections)",
        "nats-server /connz in_msgs summed over open connections",
    ),
    (
        "structure.natsClientOut",
        "messages our processes received (client connections)",
        "nats-server /connz out_msgs summed over open connections",
    ),
];

const INSTRUCTIONS: &str =
    "instructions of our processes (api ×2, scheduler, worker; not Postgres, not nats-server)";

impl Structure {
    /// Adds the instruction figure: counted by callgrind in its own low-rate phase, or why
    /// not (`Err`, e.g. the phase was skipped).
    pub fn set_instructions(
        &mut self,
        counted: Result<&crate::instructions::Instructions, String>,
    ) {
        self.figures.retain(|f| f.key != "structure.instructions");
        self.figures.push(match counted {
            Ok(i) => PerSession {
                key: "structure.instructions".to_owned(),
                name: INSTRUCTIONS.to_owned(),
                value: Some(i.per_session),
                total: Some(i.processes.iter().map(|p| p.window as f64).sum()),
                idle_per_second: Some(i.processes.iter().map(|p| p.idle_per_second).sum()),
                source: format!(
                    "callgrind (valgrind), a cluster of its own: {} sessions at {}/s, not this window",
                    i.sessions, i.rate
                ),
            },
            Err(e) => PerSession::unmeasured("structure.instructions", INSTRUCTIONS, &e),
        });
    }
}

impl Counters {
    /// The readings in `SOURCES` order.
    fn values(&self) -> [Result<f64, String>; 9] {
        let st = self.statements.clone();
        let nats = self.nats.clone();
        [
            Ok(self.xact_commit as f64),
            Ok(self.xact_rollback as f64),
            st.clone().map(|s| s.0 as f64),
            st.clone().map(|s| s.1 as f64),
            st.map(|s| s.2 as f64),
            nats.clone().map(|m| m[0] as f64),
            nats.clone().map(|m| m[1] as f64),
            nats.clone().map(|m| m[2] as f64),
            nats.map(|m| m[3] as f64),
        ]
    }
}

/// `b − a` per counter, less `own` harness transactions from the committed count.
fn deltas(a: &Counters, b: &Counters, own: f64) -> Vec<Result<f64, String>> {
    a.values()
        .into_iter()
        .zip(b.values())
        .enumerate()
        .map(|(i, (a, b))| {
            let d = b? - a?;
            Ok(if i == 0 { d - own } else { d })
        })
        .collect()
}

impl PerSession {
    fn unmeasured(key: &str, name: &str, why: &str) -> PerSession {
        PerSession {
            key: key.to_owned(),
            name: name.to_owned(),
            source: format!("not measured: {why}"),
            ..PerSession::default()
        }
    }
}

/// GETs a JSON document from nats-server's monitoring endpoint.
async fn monitor_json(http: &reqwest::Client, url: &str) -> Result<serde_json::Value, String> {
    http.get(url)
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|e| format!("GET {url}: {e}"))?
        .json()
        .await
        .map_err(|e| format!("GET {url}: {e}"))
}

/// `in_msgs` and `out_msgs` from nats-server's `/varz` (every message the server handled,
/// JetStream's internal ones included), then summed over `/connz`'s open client connections
/// (what our processes sent and received; the method of issue #47's table).
async fn nats_messages(http: &reqwest::Client, monitor: &str) -> Result<[u64; 4], String> {
    let varz = monitor_json(http, &format!("{monitor}/varz")).await?;
    let connz = monitor_json(http, &format!("{monitor}/connz?limit=100000")).await?;
    let field = |v: &serde_json::Value, k: &str| {
        v[k].as_u64()
            .ok_or_else(|| format!("nats-server monitoring: no numeric {k}"))
    };
    let conns = connz["connections"]
        .as_array()
        .ok_or_else(|| "nats-server /connz has no connections".to_owned())?;
    let (mut cin, mut cout) = (0, 0);
    for c in conns {
        cin += field(c, "in_msgs")?;
        cout += field(c, "out_msgs")?;
    }
    Ok([
        field(&varz, "in_msgs")?,
        field(&varz, "out_msgs")?,
        cin,
        cout,
    ])
}

/// A running structure measurement.
pub struct StructureMeter {
    pool: PgPool,
    http: reqwest::Client,
    monitor: String,
    start: Counters,
    at: Instant,
}

impl StructureMeter {
    /// Waits `settle` for earlier work's counters to land, then reads every counter.
    /// `nats_monitor` is nats-server's monitoring address `http://127.0.0.1:PORT`.
    pub async fn start(
        pool: PgPool,
        nats_monitor: &str,
        settle: Duration,
    ) -> Result<StructureMeter, LoadError> {
        // The view exists only in a database with the extension; it answers only on a server
        // that preloads the library (not the shared one: the figure then says so).
        let _ = sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .execute(&pool)
            .await;
        tokio::time::sleep(settle).await;
        let http = reqwest::Client::new();
        let monitor = nats_monitor.to_owned();
        let start = read_counters(&pool, &http, &monitor).await?;
        Ok(StructureMeter {
            pool,
            http,
            monitor,
            start,
            at: Instant::now(),
        })
    }

    /// Waits `settle` for the window's last work (and its counters) to land, reads every
    /// counter again and divides the deltas by `sessions`. `harness_transactions` are the
    /// transactions the harness ran on the database itself inside the window.
    pub async fn finish(
        self,
        sessions: u64,
        harness_transactions: u64,
        settle: Duration,
    ) -> Result<Structure, LoadError> {
        tokio::time::sleep(settle).await;
        let end = read_counters(&self.pool, &self.http, &self.monitor).await?;
        let window_seconds = self.at.elapsed().as_secs_f64() + settle.as_secs_f64();
        // The control plane's idle work (leader passes, reconcilers, heartbeats) runs in the
        // window too; it is measured over as long again with no sessions, and taken out.
        let quiet = Instant::now();
        tokio::time::sleep(settle).await;
        let after = read_counters(&self.pool, &self.http, &self.monitor).await?;
        let quiet_seconds = quiet.elapsed().as_secs_f64();
        // Each reading is a transaction of its own, landing in the window after it.
        let window = deltas(&self.start, &end, harness_transactions as f64 + 1.0);
        let idle = deltas(&end, &after, 1.0);
        let n = sessions.max(1) as f64;
        let mut figures = Vec::new();
        for (((key, name, source), total), idle) in SOURCES.iter().zip(window).zip(idle) {
            figures.push(match (total, idle) {
                (Ok(total), Ok(idle)) => {
                    let rate = idle / quiet_seconds.max(1e-9);
                    PerSession {
                        key: (*key).to_owned(),
                        name: (*name).to_owned(),
                        value: Some((total - rate * window_seconds) / n),
                        total: Some(total),
                        idle_per_second: Some(rate),
                        source: (*source).to_owned(),
                    }
                }
                (Err(e), _) | (_, Err(e)) => PerSession::unmeasured(key, name, &e),
            });
        }
        Ok(Structure {
            sessions,
            window_seconds,
            quiet_seconds,
            harness_transactions,
            figures,
        })
    }
}
