//! One whole run: cluster, baselines, tenants, pre-population, bursts, fixed-rate mix,
//! exec comparison (plain and streamed), invariants, `differently dev` memory, report.

use std::time::{Duration, Instant};

use differently_core::SandboxId;
use sqlx::PgPool;

use crate::baseline;
use crate::client::{provision, Api, StreamFormat};
use crate::cluster::{Cluster, ClusterOpts};
use crate::diag;
use crate::generator::{
    activation_span, create_batch, delete_batch, fixed_rate, server_side_times, wait_all, Made,
};
use crate::invariants::{self, Expectations};
use crate::plan::Plan;
use crate::report::{self, Baselines, Burst, Environment, Phases, Report};
use crate::rss::{rss_kib, Sampler};
use crate::stats::StreamRate;
use crate::structure::{StructureMeter, PG_STATS_SETTLE};
use crate::LoadError;

fn progress(started: Instant, msg: &str) {
    eprintln!("[{:7.1}s] {msg}", started.elapsed().as_secs_f64());
}

fn rss_now(cluster: &Cluster) -> std::collections::BTreeMap<String, u64> {
    cluster
        .pids()
        .into_iter()
        .filter_map(|(n, pid)| rss_kib(pid).map(|k| (n, k)))
        .collect()
}

fn ids(made: &[Made]) -> Vec<String> {
    made.iter().map(|m| m.id.clone()).collect()
}

async fn show(pool: &PgPool, q: &str) -> String {
    sqlx::query_scalar::<_, String>(q)
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| format!("unknown ({e})"))
}

/// Creates a burst, waits until it runs, deletes it and waits until it is terminated.
/// With `pause_leader`, the scheduler is stopped while the burst is admitted, so the leader
/// then places a full backlog and its own rate shows.
#[allow(clippy::too_many_arguments)]
async fn burst(
    cluster: &mut Cluster,
    api: &Api,
    tenancy: &crate::client::Tenancy,
    plan: &Plan,
    pool: &PgPool,
    pause_leader: bool,
    accepted: &mut Vec<String>,
    deleted: &mut Vec<String>,
) -> Result<Burst, LoadError> {
    let deadline = Instant::now() + plan.phase_timeout();
    let label = if pause_leader { "backlog" } else { "sustained" };
    let mut recordings = Vec::new();
    if let Some(dir) = &plan.perf_dir {
        std::fs::create_dir_all(dir).map_err(|e| LoadError::io("creating --perf-dir", e))?;
        for (role, pid) in cluster.pids() {
            let data = dir.join(format!("{label}-{role}.perf.data"));
            recordings.push(diag::perf_start(pid, &data)?);
        }
    }
    let waits = diag::WaitSampler::start(pool.clone(), Duration::from_millis(50));
    let cpu = crate::cpu::CpuMeter::start(cluster.pids());
    if pause_leader {
        cluster.signal_pause("scheduler", true)?;
    }
    let batch = create_batch(api, tenancy, plan.burst, plan.concurrency, deadline).await;
    if pause_leader {
        cluster.signal_pause("scheduler", false)?;
    }
    cluster.check_alive()?;
    let made_ids = ids(&batch.accepted);
    accepted.extend(made_ids.iter().cloned());
    let running_after = wait_all(pool, &made_ids, "running", deadline).await?;
    let postgres_activity = waits.finish(12).await;
    let (cpu_cores, cpu_wall_seconds) = cpu.finish();
    let mut profiles = Vec::new();
    for r in recordings {
        profiles.push(r.finish().await?.display().to_string());
    }
    let activation = activation_span(pool, &made_ids).await?;
    let del = delete_batch(api, tenancy, &batch.accepted, plan.concurrency, deadline).await;
    deleted.extend(del.deleted.iter().cloned());
    let terminated_after = wait_all(pool, &del.deleted, "terminated", deadline).await?;
    Ok(Burst {
        admissions: batch.throughput,
        refused: batch.refused,
        refusal_examples: batch.refusal_examples,
        activation,
        running_after_seconds: running_after.as_secs_f64(),
        deletes: del.throughput,
        terminated_after_seconds: terminated_after.as_secs_f64(),
        postgres_activity,
        cpu_cores,
        cpu_wall_seconds,
        profiles,
    })
}

/// Runs the plan end to end and returns the report. Fails on any harness error; targets
/// that are missed and invariants that are violated are results, not errors.
pub async fn run(plan: Plan) -> Result<Report, LoadError> {
    plan.validate()?;
    let t0 = Instant::now();
    let mut notes = Vec::new();
    // Tenancy is known only once the API answers; the quota is configured before that, so
    // it is sized for the single-tenant fallback (the largest per-org need).
    let max_active = plan.max_active_per_org(1);
    progress(
        t0,
        "starting postgres database, nats-server, api, scheduler, worker",
    );
    let mut cluster = Cluster::start(ClusterOpts {
        binary: plan.binary.clone(),
        latency_ms: plan.latency_ms,
        max_active,
        database_max_connections: plan.database_max_connections,
        extra_capabilities: Vec::new(),
        pool_lines: String::new(),
        wrapper: Vec::new(),
        log_level: plan.log_level.clone(),
    })
    .await?;
    let pool = cluster.db.store().pool().clone();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut phases = Phases {
        rss_start_kib: rss_now(&cluster),
        ..Phases::default()
    };
    let environment = Environment {
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        postgres_version: show(&pool, "SHOW server_version").await,
        synchronous_commit: show(&pool, "SHOW synchronous_commit").await,
        nats_version: differently_bus::testing::server_version(cluster.nats.binary())
            .unwrap_or_else(|e| e),
        binary: plan.binary.display().to_string(),
        max_active_per_org: max_active,
    };

    progress(
        t0,
        "baselines: Postgres inserts (1, 8 connections), JetStream publishes (1, 8 in flight)",
    );
    let bl = Duration::from_millis(plan.baseline_millis);
    let db_url = cluster.db.url().to_owned();
    let nats_url = cluster.nats.url();
    let mut baselines = Baselines {
        pg_insert_1: baseline::pg_insert_tps(&db_url, 1, bl).await?,
        pg_insert_8: baseline::pg_insert_tps(&db_url, 8, bl).await?,
        js_publish_1: baseline::js_publish_rate(&nats_url, 1, bl).await?,
        js_publish_8: baseline::js_publish_rate(&nats_url, 8, bl).await?,
        ..Baselines::default()
    };

    let api = Api::new(cluster.url())?;
    progress(t0, "provisioning tenants");
    let tenancy = provision(&api, &cluster.key, plan.orgs).await?;
    if let Some(n) = &tenancy.note {
        progress(t0, &format!("FALLBACK: {n}"));
        notes.push(format!("tenancy fallback: {n}"));
    }

    let mut accepted: Vec<String> = Vec::new();
    let mut deleted: Vec<String> = Vec::new();
    let live_total = plan.orgs * plan.live_per_org;
    progress(t0, &format!("pre-populating {live_total} live sandboxes"));
    let deadline = Instant::now() + plan.phase_timeout();
    let pre = create_batch(&api, &tenancy, live_total, plan.concurrency, deadline).await;
    if pre.accepted.len() != live_total {
        return Err(LoadError::Process(format!(
            "pre-population: {} of {live_total} creates accepted; e.g. {:?}\n{}",
            pre.accepted.len(),
            pre.refusal_examples,
            cluster.logs()
        )));
    }
    let live_ids = ids(&pre.accepted);
    accepted.extend(live_ids.iter().cloned());
    let running_after = wait_all(&pool, &live_ids, "running", deadline).await?;
    phases.prepopulate = Burst {
        admissions: pre.throughput.clone(),
        activation: activation_span(&pool, &live_ids).await?,
        running_after_seconds: running_after.as_secs_f64(),
        ..Burst::default()
    };
    progress(
        t0,
        &format!(
            "pre-populated at {:.0} admissions/s; all running {:.1} s later",
            pre.throughput.per_second,
            running_after.as_secs_f64()
        ),
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    phases.rss_idle_kib = rss_now(&cluster);

    let sampler = Sampler::start(cluster.pids(), Duration::from_millis(200));
    progress(
        t0,
        &format!("burst of {} creates, everything running", plan.burst),
    );
    phases.burst_sustained = burst(
        &mut cluster,
        &api,
        &tenancy,
        &plan,
        &pool,
        false,
        &mut accepted,
        &mut deleted,
    )
    .await?;
    progress(
        t0,
        &format!(
            "burst of {} creates with the leader stopped, then placed",
            plan.burst
        ),
    );
    // Through the API that leaves placement to the leader (`cluster::LEADER_API`).
    let leader_api = Api::new(cluster.leader_url())?;
    phases.burst_leader_backlog = burst(
        &mut cluster,
        &leader_api,
        &tenancy,
        &plan,
        &pool,
        true,
        &mut accepted,
        &mut deleted,
    )
    .await?;
    // Opened after the earlier phases' counters have landed (`PG_STATS_SETTLE`).
    progress(
        t0,
        "structure: counters once the earlier phases' work has landed",
    );
    let structure = StructureMeter::start(
        pool.clone(),
        &format!("http://127.0.0.1:{}", cluster.nats_monitor_port),
        PG_STATS_SETTLE,
    )
    .await?;
    progress(
        t0,
        &format!(
            "fixed rate: {}/s for {} s (create → running → exec → delete)",
            plan.rate, plan.duration_seconds
        ),
    );
    let waits = diag::WaitSampler::start(pool.clone(), Duration::from_millis(50));
    let cpu = crate::cpu::CpuMeter::start(cluster.pids());
    let fr = fixed_rate(
        &api,
        &tenancy,
        plan.rate,
        Duration::from_secs(plan.duration_seconds),
        (plan.rate as usize * 10).max(50),
        Instant::now() + Duration::from_secs(plan.duration_seconds) + plan.phase_timeout(),
    )
    .await;
    phases.rss_load_kib = sampler.finish().await;
    let (activity, harness_transactions) = waits.finish_counted(12).await;
    phases.fixed_rate_postgres_activity = activity;
    (
        phases.fixed_rate_cpu_cores,
        phases.fixed_rate_cpu_wall_seconds,
    ) = cpu.finish();
    cluster.check_alive()?;
    let fr_ids = fr.record_into(&mut accepted, &mut deleted);
    phases.fixed_rate = fr.summary();
    let completed = phases
        .fixed_rate
        .started
        .saturating_sub(phases.fixed_rate.failed + phases.fixed_rate.unfinished);
    progress(
        t0,
        "structure: counters after the sessions' last work has landed",
    );
    phases.structure = structure
        .finish(completed as u64, harness_transactions, PG_STATS_SETTLE)
        .await?;
    (phases.server_side_to_running, phases.server_side_stages) =
        server_side_times(&pool, &fr_ids).await?;
    for &rate in &plan.sweep_rates {
        progress(
            t0,
            &format!(
                "sweep: {rate}/s for {} s (create → running → exec → delete)",
                plan.sweep_seconds
            ),
        );
        let cpu = crate::cpu::CpuMeter::start(cluster.pids());
        let fr = fixed_rate(
            &api,
            &tenancy,
            rate,
            Duration::from_secs(plan.sweep_seconds),
            (rate as usize * 10).max(50),
            Instant::now() + Duration::from_secs(plan.sweep_seconds) + plan.phase_timeout(),
        )
        .await;
        let (cpu_cores, cpu_wall_seconds) = cpu.finish();
        cluster.check_alive()?;
        let ids = fr.record_into(&mut accepted, &mut deleted);
        phases.rate_sweep.push(report::SweepPoint {
            rate,
            sessions: fr.summary(),
            server_side_to_running: server_side_times(&pool, &ids).await?.0,
            cpu_cores,
            cpu_wall_seconds,
        });
    }

    progress(
        t0,
        &format!(
            "exec: {} samples via the API, direct, and a bare HTTP hop",
            plan.exec_samples
        ),
    );
    let target = pre.accepted.first().ok_or_else(|| {
        LoadError::Plan("exec needs at least one live sandbox (--live-per-org ≥ 1)".into())
    })?;
    let key = tenancy.tenants[target.tenant].key.clone();
    let backend_ref: Option<String> =
        sqlx::query_scalar("SELECT backend_ref FROM sandboxes WHERE id = $1")
            .bind(&target.id)
            .fetch_one(&pool)
            .await
            .map_err(|e| LoadError::db("reading backend_ref", e))?;
    let backend_ref = backend_ref
        .ok_or_else(|| LoadError::Process(format!("{} has no backend_ref", target.id)))?;
    api.exec_echo(&key, &target.id).await?;
    let exec_waits = diag::WaitSampler::start_server_wide(pool.clone(), Duration::from_millis(50));
    let mut lat = Vec::with_capacity(plan.exec_samples);
    for _ in 0..plan.exec_samples {
        let t = Instant::now();
        api.exec_echo(&key, &target.id).await?;
        lat.push(t.elapsed());
    }
    phases.exec_postgres_activity = exec_waits.finish(12).await;
    phases.exec_via_api = crate::stats::summarize(&lat);
    let sbx = SandboxId::parse(&target.id)
        .map_err(|e| LoadError::Process(format!("sandbox id {}: {e}", target.id)))?;
    baselines.direct_fake_exec =
        baseline::direct_fake_exec(&cluster.ledger, &sbx, &backend_ref, plan.exec_samples).await?;
    baselines.trivial_http = baseline::trivial_http_rtt(api.http(), plan.exec_samples).await?;
    phases.exec_stream_status = api.exec_stream_status(&key, &target.id).await.ok();
    if phases.exec_stream_status == Some(200) {
        progress(
            t0,
            &format!(
                "streamed exec: {} × {} bytes via the API (SSE and frames), direct, and over bare HTTP",
                plan.stream_repetitions, plan.stream_bytes
            ),
        );
        let timeout = plan.phase_timeout();
        let formats = [StreamFormat::Sse, StreamFormat::Frames];
        for format in formats {
            api.stream_fake_output(
                &key,
                &target.id,
                baseline::STREAM_WARMUP_BYTES,
                timeout,
                format,
            )
            .await?;
        }
        // The two formats alternate, so drift of the shared machine hits both alike.
        let mut walls = [
            Vec::with_capacity(plan.stream_repetitions),
            Vec::with_capacity(plan.stream_repetitions),
        ];
        for _ in 0..plan.stream_repetitions {
            for (format, walls) in formats.iter().zip(walls.iter_mut()) {
                let t = Instant::now();
                api.stream_fake_output(&key, &target.id, plan.stream_bytes, timeout, *format)
                    .await?;
                walls.push(t.elapsed());
            }
        }
        let [sse_walls, frame_walls] = walls;
        phases.exec_stream_via_api = Some(StreamRate::new(plan.stream_bytes, &sse_walls));
        phases.exec_stream_frames_via_api = Some(StreamRate::new(plan.stream_bytes, &frame_walls));
        baselines.direct_fake_exec_stream = Some(
            baseline::direct_fake_exec_stream(
                &cluster.ledger,
                &sbx,
                &backend_ref,
                plan.stream_bytes,
                plan.stream_repetitions,
            )
            .await?,
        );
        baselines.trivial_http_stream = Some(
            baseline::trivial_http_stream(api.http(), plan.stream_bytes, plan.stream_repetitions)
                .await?,
        );
    }

    progress(t0, "settling, then checking invariants");
    let unsettled = invariants::settle(&pool, plan.phase_timeout()).await?;
    let inv = invariants::check(
        &pool,
        &cluster.ledger,
        &Expectations {
            accepted,
            deleted,
            max_active,
        },
        unsettled,
    )
    .await?;
    cluster.check_alive()?;
    progress(t0, "baselines again (machine drift)");
    baselines.end_of_run = vec![
        baseline::pg_insert_tps(&db_url, 1, bl).await?,
        baseline::pg_insert_tps(&db_url, 8, bl).await?,
        baseline::js_publish_rate(&nats_url, 1, bl).await?,
        baseline::js_publish_rate(&nats_url, 8, bl).await?,
    ];
    phases.explain = diag::explain_hot_queries(&pool).await?;
    phases.table_rows = diag::table_rows(&pool).await?;
    // The instruction count needs a cluster of its own under callgrind; this one's idle work
    // would only slow it.
    drop(pool);
    drop(cluster);
    if plan.instruction_sessions > 0 {
        progress(
            t0,
            &format!(
                "instructions: a cluster under callgrind, {} sessions at {}/s",
                plan.instruction_sessions, plan.instruction_rate
            ),
        );
        let counted = crate::instructions::measure(&plan).await?;
        phases.structure.set_instructions(Ok(&counted));
        phases.instructions = Some(counted);
    } else {
        phases
            .structure
            .set_instructions(Err("skipped (--instruction-sessions 0)".to_owned()));
    }

    progress(t0, "differently dev idle RSS");
    phases.dev =
        crate::dev::dev_idle_rss(&plan.binary, Duration::from_millis(plan.dev_idle_millis)).await?;

    if plan.smoke {
        notes.push("smoke mode: small numbers, figures are not meaningful".to_owned());
    }
    if plan.orgs * plan.live_per_org != 10_000 {
        notes.push(format!(
            "live sandboxes present: {} (the issue asks for 10 × 1,000)",
            plan.orgs * plan.live_per_org
        ));
    }
    notes.push(format!(
        "quota.max_active = {max_active} per org, sized before tenancy was known (for the single-tenant fallback)"
    ));
    let figures = report::figures(&plan, &baselines, &phases);
    let targets = report::targets(&plan, &baselines, &phases);
    progress(t0, "done");
    Ok(Report {
        finished_at: chrono::Utc::now().to_rfc3339(),
        wall_seconds: t0.elapsed().as_secs_f64(),
        plan,
        environment,
        tenancy,
        baselines,
        figures,
        targets,
        invariants: inv,
        phases,
        notes,
    })
}
