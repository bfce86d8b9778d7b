//! The nemesis: injects one scenario's faults at seeded times on the processes the topology
//! started (kills, stops, nats-server restarts, backend partitions), and logs each.

use super::*;

/// The nemesis' log and clock.
pub(super) struct Nemesis {
    pub(super) rng: Rng,
    pub(super) started: Instant,
    pub(super) log: Vec<String>,
}

impl Nemesis {
    pub(super) fn note(&mut self, what: impl Into<String>) {
        let ms = self.started.elapsed().as_millis();
        self.log.push(format!("t={ms}ms {}", what.into()));
    }

    async fn sleep_ms(&mut self, lo: u64, hi: u64) {
        let ms = self.rng.between(lo, hi);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

/// Waits until `name`'s log contains `needle` at least `n` times (bounded).
pub(super) async fn wait_log(
    t: &Topology,
    name: &str,
    needle: &str,
    n: usize,
    within: Duration,
) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if t.log(name).matches(needle).count() >= n {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Kills the current leader (or the first scheduler) with SIGKILL; returns its name.
pub(super) fn kill_leader(t: &mut Topology) -> Result<String, LoadError> {
    let name = t.leader().unwrap_or_else(|| "scheduler-0".to_owned());
    t.proc(&name)?.kill9();
    Ok(name)
}

/// Runs scenario `sc`'s faults until `until`.
pub(super) async fn nemesis(
    sc: Scenario,
    t: &mut Topology,
    n: &mut Nemesis,
    until: Instant,
    long: bool,
) -> Result<(), LoadError> {
    let left = |u: Instant| u.saturating_duration_since(Instant::now());
    match sc {
        Scenario::S1 | Scenario::S2 => {
            let needle = if sc == Scenario::S1 {
                "fault point: pausing after create"
            } else {
                "fault point: pausing after delete"
            };
            let hit = wait_log(t, "worker-0", needle, 2, left(until)).await;
            // Let the paused work's ack wait run out, so some of it is redelivered to
            // worker-1 while worker-0 still sits at the point, and kill it after that.
            n.sleep_ms(3500, 5000).await;
            n.note(format!("worker-0 at fault point ({needle}): {hit}"));
            t.proc("worker-0")?.kill9();
            n.note("kill -9 worker-0");
            n.sleep_ms(500, 2000).await;
            t.restart("worker-0")?;
            n.note("restart worker-0 (no fault point)");
        }
        Scenario::S3 => {
            let hit = wait_log(t, "api", "sandbox admitted", 3, left(until)).await;
            n.note(format!(
                "api at api.after_admit_commit with admissions committed: {hit}"
            ));
            t.proc("api")?.kill9();
            n.note("kill -9 api");
            n.sleep_ms(500, 1500).await;
            t.restart("api")?;
            t.wait_ready(Duration::from_secs(30)).await?;
            n.note("restart api (no fault point), ready");
        }
        Scenario::S4 => {
            while Instant::now() + Duration::from_secs(4) < until {
                n.sleep_ms(1500, 3000).await;
                let who = kill_leader(t)?;
                n.note(format!("kill -9 leader {who}"));
                n.sleep_ms(500, 2000).await;
                t.restart(&who)?;
                n.note(format!("restart {who}"));
            }
        }
        Scenario::S5 => {
            n.sleep_ms(1500, 3000).await;
            let who = t.leader().unwrap_or_else(|| "scheduler-0".to_owned());
            t.proc(&who)?.pause()?;
            n.note(format!("SIGSTOP leader {who}"));
            // A stopped process keeps its Postgres session open; the store bounds the lock
            // session's idle time, so a standby must lead on the stop alone.
            let bound = differently_store::postgres::LEADER_IDLE_TIMEOUT_SECONDS + 5;
            let alone = wait_for_new_leader(t, &who, Duration::from_secs(bound)).await;
            n.note(format!("standby leading on the SIGSTOP alone: {alone:?}"));
            if alone.is_none() {
                let ended = t.terminate_leader_lease().await?;
                n.note(format!("terminated {who}'s lock session ({ended} session)"));
                let other = wait_for_new_leader(t, &who, Duration::from_secs(10)).await;
                n.note(format!("standby leading after that: {other:?}"));
            }
            n.sleep_ms(2000, 4000).await;
            t.proc(&who)?.resume()?;
            n.note(format!("SIGCONT {who} (zombie)"));
        }
        Scenario::S6 => {
            while Instant::now() + Duration::from_secs(4) < until {
                n.sleep_ms(1500, 3500).await;
                t.nats()?.proc.kill9();
                n.note("kill -9 nats-server");
                n.sleep_ms(300, 2000).await;
                t.nats()?.restart()?;
                n.note("restart nats-server (same store)");
            }
        }
        Scenario::S7 => {
            n.sleep_ms(2000, 4000).await;
            t.nats()?.wipe_and_restart()?;
            n.note("nats-server killed, store wiped, restarted empty");
        }
        Scenario::S8 => {
            n.sleep_ms(1500, 3000).await;
            t.nats()?.proc.pause()?;
            n.note("SIGSTOP nats-server");
            tokio::time::sleep(Duration::from_secs(if long { 30 } else { 8 })).await;
            t.nats()?.proc.resume()?;
            n.note("SIGCONT nats-server");
        }
        Scenario::S9 => {
            for _ in 0..if long { 3 } else { 1 } {
                n.sleep_ms(1500, 3000).await;
                kill_cluster_node(t, n).await?;
            }
        }
        Scenario::S10 => {
            while Instant::now() + Duration::from_secs(3) < until {
                n.sleep_ms(1500, 3000).await;
                let k = t.terminate_db_sessions().await?;
                n.note(format!("pg_terminate_backend: {k} sessions"));
            }
        }
        Scenario::S11 => {
            n.sleep_ms(2000, 4000).await;
            let pg =
                t.db.private()
                    .ok_or_else(|| LoadError::Plan("S11 runs on a private cluster".into()))?;
            pg.stop_immediate()?;
            n.note("pg_ctl -m immediate stop (private cluster)");
            n.sleep_ms(1000, if long { 10_000 } else { 3000 }).await;
            pg.ctl_start()?;
            let recovered = pg.log().contains("not properly shut down");
            n.note(format!("pg_ctl start; crash recovery ran: {recovered}"));
        }
        Scenario::S12 | Scenario::S13 => {
            n.note("backend fault knobs active for the whole run");
        }
        Scenario::S14 => partition_backend(t, n, long).await?,
        Scenario::S15 => {
            n.sleep_ms(1500, 3000).await;
            t.proc("worker-1")?.pause()?;
            n.note("SIGSTOP worker-1");
            n.sleep_ms(6000, 9000).await;
            t.proc("worker-1")?.resume()?;
            n.note("SIGCONT worker-1 (its held work was redelivered meanwhile)");
        }
        Scenario::S16 => chaos(t, n, until).await?,
    }
    Ok(())
}

/// S9: kill -9 a seeded member of the cluster; measure how long until a sandbox reaches
/// `running` again (the stall); keep it down 3-5 s under load (or until then, if later);
/// restart it and wait until the cluster is healthy.
pub(super) async fn kill_cluster_node(t: &mut Topology, n: &mut Nemesis) -> Result<(), LoadError> {
    let pool = t.db.pool();
    let i = usize::try_from(n.rng.below(3)).unwrap_or(0);
    let c = t
        .nats_cluster
        .as_mut()
        .ok_or_else(|| LoadError::Plan("S9 runs on a NATS cluster".into()))?;
    let at: Option<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&pool)
        .await
        .ok();
    c.nodes[i].stop();
    let killed = Instant::now();
    n.note(format!("kill -9 nats node n{i}"));
    // The stall: until a sandbox's `running` is recorded after the kill (bounded 30 s).
    let mut first = None;
    while killed.elapsed() < Duration::from_secs(30) {
        let k: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM audit_events WHERE action = 'sandbox.running' AND at > $1",
        )
        .bind(at)
        .fetch_one(&pool)
        .await
        .unwrap_or(0);
        if k > 0 {
            first = Some(killed.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    n.note(format!(
        "first sandbox running after the kill: {}",
        first.map_or("none in 30 s".to_owned(), |d| format!(
            "{} ms",
            d.as_millis()
        ))
    ));
    let down = n.rng.between(3000, 5000);
    tokio::time::sleep(Duration::from_millis(down).saturating_sub(killed.elapsed())).await;
    let back: Option<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&pool)
        .await
        .ok();
    let c = t
        .nats_cluster
        .as_mut()
        .ok_or_else(|| LoadError::Plan("S9 runs on a NATS cluster".into()))?;
    topology::restart_node(&mut c.nodes[i])?;
    topology::cluster_healthy(c, Duration::from_secs(30))?;
    n.note(format!(
        "restart nats node n{i}; cluster healthy {} ms after the kill",
        killed.elapsed().as_millis()
    ));
    // The stall, two ways: the longest gap between consecutive `running` records from a
    // second before the kill to 5 s after the node is back (the workload makes several a
    // second), and admission → running of the sandboxes admitted while the node was down
    // that ran (the workload deletes many before they run).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let gap: Option<f64> = sqlx::query_scalar(
        "SELECT (extract(epoch FROM max(gap)) * 1000)::float8 FROM (
           SELECT at - lag(at) OVER (ORDER BY at) AS gap FROM audit_events
           WHERE action = 'sandbox.running'
             AND at > $1 - interval '1 second' AND at < $2 + interval '5 seconds') g",
    )
    .bind(at)
    .bind(back)
    .fetch_one(&pool)
    .await
    .map_err(|e| LoadError::db("measuring the gap in running records", e))?;
    let (admitted, ran, slowest): (i64, i64, Option<f64>) = sqlx::query_as(
        "SELECT count(*), count(r.first),
                (extract(epoch FROM max(r.first - a.at)) * 1000)::float8
         FROM audit_events a
         LEFT JOIN (SELECT resource, min(at) AS first FROM audit_events
                    WHERE action = 'sandbox.running' GROUP BY resource) r
           ON r.resource = a.resource
         WHERE a.action = 'sandbox.admit' AND a.at > $1 AND a.at < $2",
    )
    .bind(at)
    .bind(back)
    .fetch_one(&pool)
    .await
    .map_err(|e| LoadError::db("measuring admission → running across the kill", e))?;
    // How long any sandbox activated around the kill waited for a worker: activation →
    // its first `running`, or → its client's delete for one that never ran. The gap above
    // also counts spells in which the workload itself deleted every activated sandbox before
    // it ran, which is no stall (CI seed 1796140738611196889: gap 3,002 ms, while no
    // activated sandbox waited more than 1,507 ms).
    let waited: Option<f64> = sqlx::query_scalar(
        "SELECT (extract(epoch FROM max(coalesce(r.first, d.first, now()) - a.at)) * 1000)::float8
         FROM audit_events a
         LEFT JOIN (SELECT resource, min(at) AS first FROM audit_events
                    WHERE action = 'sandbox.running' GROUP BY resource) r
           ON r.resource = a.resource
         LEFT JOIN (SELECT resource, min(at) AS first FROM audit_events
                    WHERE action = 'sandbox.terminating' GROUP BY resource) d
           ON d.resource = a.resource
         WHERE a.action = 'sandbox.activate'
           AND a.at > $1 - interval '1 second' AND a.at < $2",
    )
    .bind(at)
    .bind(back)
    .fetch_one(&pool)
    .await
    .map_err(|e| LoadError::db("measuring the wait of activated sandboxes", e))?;
    let ms = |x: Option<f64>| x.map_or(-1, |v| v.round() as i64);
    n.note(format!(
        "while n{i} was down: longest gap between running records: {} ms; longest wait of an activated sandbox for its worker: {} ms; admitted: {admitted}, ran: {ran}, slowest admission → running: {} ms",
        ms(gap),
        ms(waited),
        ms(slowest)
    ));
    Ok(())
}

/// Pool `name`'s health as the fleet view has it now: `Some(healthy)`, `None` if never probed.
pub(super) async fn pool_healthy(t: &Topology, name: &str) -> Option<bool> {
    sqlx::query_scalar::<_, bool>(
        "SELECT coalesce((doc->>'healthy')::boolean, false) FROM pool_health WHERE name = $1",
    )
    .bind(name)
    .fetch_optional(&t.db.pool())
    .await
    .ok()
    .flatten()
}

/// Waits (bounded) until pool `name`'s recorded health is `healthy`; the database's clock then.
pub(super) async fn wait_pool_health(
    t: &Topology,
    name: &str,
    healthy: bool,
    within: Duration,
) -> Option<chrono::DateTime<chrono::Utc>> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if pool_healthy(t, name).await == Some(healthy) {
            return sqlx::query_scalar("SELECT now()")
                .fetch_one(&t.db.pool())
                .await
                .ok();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// S14: once sandboxes run on `os`, cut its link; measure how fast the pool is unhealthy,
/// count where activations went while it was, heal, and wait for it to be healthy again.
pub(super) async fn partition_backend(
    t: &mut Topology,
    n: &mut Nemesis,
    long: bool,
) -> Result<(), LoadError> {
    let pool = backend::POOL;
    let warm = Instant::now() + Duration::from_secs(10);
    let mut on_os = 0i64;
    while Instant::now() < warm && on_os < 3 {
        on_os = sqlx::query_scalar(
            "SELECT count(*) FROM sandboxes WHERE pool = $1 AND status = 'running'",
        )
        .bind(pool)
        .fetch_one(&t.db.pool())
        .await
        .unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    n.note(format!(
        "sandboxes running on {pool} before the cut: {on_os}"
    ));
    n.sleep_ms(200, 1500).await;
    let b = t
        .backend
        .as_mut()
        .ok_or_else(|| LoadError::Plan("S14 runs with the OpenSandbox backend".into()))?;
    b.net.cut()?;
    let cut = Instant::now();
    n.note(format!(
        "iptables DROP in namespace {}: link cut",
        b.net.name
    ));
    let unhealthy = wait_pool_health(t, pool, false, Duration::from_secs(20)).await;
    n.note(format!(
        "{pool} unhealthy after the cut: {} ({} ms)",
        unhealthy.is_some(),
        cut.elapsed().as_millis()
    ));
    // Held this long once the pool is unhealthy, so placements have time to avoid it.
    tokio::time::sleep(Duration::from_secs(if long { 60 } else { 8 })).await;
    let healed_at: Option<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&t.db.pool())
        .await
        .ok();
    if let Some(b) = t.backend.as_mut() {
        b.net.heal()?;
    }
    let heal = Instant::now();
    n.note(format!(
        "link healed after {} ms cut",
        cut.elapsed().as_millis()
    ));
    // Every process takes up a health flip within one registry sync (2 s): activations
    // from then until the heal must all have avoided the pool.
    if let (Some(from), Some(to)) = (unhealthy, healed_at) {
        let from = from + chrono::Duration::milliseconds(2500);
        let rows: Vec<(Option<String>, i64)> = sqlx::query_as(
            "SELECT detail->>'pool', count(*) FROM audit_events
             WHERE action = 'sandbox.activate' AND at > $1 AND at < $2 GROUP BY 1",
        )
        .bind(from)
        .bind(to)
        .fetch_all(&t.db.pool())
        .await
        .map_err(|e| LoadError::db("counting activations during the partition", e))?;
        let count = |p: &str| {
            rows.iter()
                .filter(|(x, _)| x.as_deref() == Some(p))
                .map(|r| r.1)
                .sum::<i64>()
        };
        n.note(format!(
            "activations while {pool} was unhealthy: on {pool} {}, on fake {}",
            count(pool),
            count("fake")
        ));
    }
    let healthy = wait_pool_health(t, pool, true, Duration::from_secs(20)).await;
    n.note(format!(
        "{pool} healthy again after the heal: {} ({} ms)",
        healthy.is_some(),
        heal.elapsed().as_millis()
    ));
    Ok(())
}

pub(super) async fn wait_for_new_leader(
    t: &Topology,
    old: &str,
    within: Duration,
) -> Option<String> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        for name in t
            .procs
            .keys()
            .filter(|k| k.starts_with("scheduler") && *k != old)
        {
            if t.log(name).contains("scheduler: leading") {
                return Some(name.clone());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// S16: until `until`, every 2–5 s one fault chosen by the seed, healed after 1–3 s.
pub(super) async fn chaos(
    t: &mut Topology,
    n: &mut Nemesis,
    until: Instant,
) -> Result<(), LoadError> {
    while Instant::now() + Duration::from_secs(5) < until {
        n.sleep_ms(2000, 5000).await;
        match n.rng.below(8) {
            0 => {
                let w = format!("worker-{}", n.rng.below(2));
                t.proc(&w)?.kill9();
                n.note(format!("kill -9 {w}"));
                n.sleep_ms(500, 2500).await;
                t.restart(&w)?;
                n.note(format!("restart {w}"));
            }
            1 => {
                let who = kill_leader(t)?;
                n.note(format!("kill -9 leader {who}"));
                n.sleep_ms(500, 2500).await;
                t.restart(&who)?;
                n.note(format!("restart {who}"));
            }
            2 => {
                t.proc("api")?.kill9();
                n.note("kill -9 api");
                n.sleep_ms(300, 1500).await;
                t.restart("api")?;
                t.wait_ready(Duration::from_secs(30)).await?;
                n.note("restart api");
            }
            3 => {
                t.nats()?.proc.kill9();
                n.note("kill -9 nats-server");
                n.sleep_ms(300, 2000).await;
                t.nats()?.restart()?;
                n.note("restart nats-server");
            }
            4 => {
                t.nats()?.proc.pause()?;
                n.note("SIGSTOP nats-server");
                n.sleep_ms(1000, 4000).await;
                t.nats()?.proc.resume()?;
                n.note("SIGCONT nats-server");
            }
            5 => {
                let k = t.terminate_db_sessions().await?;
                n.note(format!("pg_terminate_backend: {k} sessions"));
            }
            6 => {
                let w = format!("worker-{}", n.rng.below(2));
                t.proc(&w)?.pause()?;
                n.note(format!("SIGSTOP {w}"));
                n.sleep_ms(1000, 5000).await;
                t.proc(&w)?.resume()?;
                n.note(format!("SIGCONT {w}"));
            }
            _ => {
                let who = t.leader().unwrap_or_else(|| "scheduler-0".to_owned());
                t.proc(&who)?.pause()?;
                let k = t.terminate_leader_lease().await?;
                n.note(format!(
                    "SIGSTOP leader {who}, ended its lock session ({k})"
                ));
                n.sleep_ms(1000, 4000).await;
                t.proc(&who)?.resume()?;
                n.note(format!("SIGCONT {who} (zombie)"));
            }
        }
    }
    Ok(())
}
