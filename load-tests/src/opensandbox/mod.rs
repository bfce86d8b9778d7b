//! P7 and exec overhead against a real OpenSandbox server, each as a ratio or difference to
//! the same server used directly, measured interleaved in one run (the machine is shared and
//! noisy, so only same-run comparisons mean anything):
//!
//! - **P7**: create → `running` through Differently (an `opensandbox` pool, the only one
//!   placement may use) against create → first OK execd `/ping` straight to the server, with
//!   a client that polls every 5 ms.
//! - **Exec**: `echo hi` through `POST /v1/sandboxes/{id}/exec` against the same command sent
//!   to that sandbox's execd directly (read until `execution_complete`), and, for reference,
//!   through the server's proxy. The streamed route (`…/exec/stream`, SSE read to its `exit`)
//!   is measured in the same rounds.
//!
//! Every address it sends to must be on loopback: the server's URL, each execd endpoint the
//! server hands back, and the control plane it starts. Anything else is refused before a
//! request is sent.

use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Value};

use differently_adapters::opensandbox::{OpenSandboxAdapter, OpenSandboxConfig};
use differently_adapters::{Adapter, CreateInstance, InstanceRef};
use differently_core::exec::ExecRequest;
use differently_core::ids::InstallationId;
use differently_core::SandboxId;

use crate::cluster::ClusterOpts;
pub use crate::opensandbox_client::require_loopback;
use crate::opensandbox_client::{connect, ms, start_with_pool, Api, Server, EXECD_PORT};
use crate::stats::percentile;
use crate::LoadError;

mod cpu;
mod paths;

use cpu::{context_switches, cpu_readings, per_exec_us};
use paths::*;
pub(crate) use paths::{create_direct, Ready};

/// What the run measures and against what.
#[derive(Debug, Clone)]
pub struct BenchOpts {
    /// The server's lifecycle API, ending in `/v1`; must be on loopback.
    pub url: String,
    /// The server's `api_key`.
    pub key: String,
    /// Extra pool settings (JSON object) merged over the bench's defaults.
    pub settings: Value,
    /// The image both paths create from.
    pub image: String,
    /// Creates per path (interleaved).
    pub creates: usize,
    /// `echo hi` samples per path (interleaved), after 5 warm-up rounds.
    pub execs: usize,
    /// The control plane's options.
    pub cluster: ClusterOpts,
}

/// Median, p90 and every sample of one path, in milliseconds.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Series {
    /// Median.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// In the order taken.
    pub samples_ms: Vec<f64>,
}

/// The median of the differences `a[i] - b[i]` of two series taken in the same rounds.
fn paired_p50(a: &[f64], b: &[f64]) -> f64 {
    let mut d: Vec<f64> = a.iter().zip(b).map(|(x, y)| x - y).collect();
    d.sort_by(f64::total_cmp);
    percentile(&d, 0.5)
}

impl Series {
    fn of(samples: Vec<f64>) -> Series {
        let mut sorted = samples.clone();
        sorted.sort_by(f64::total_cmp);
        Series {
            p50_ms: percentile(&sorted, 0.5),
            p90_ms: percentile(&sorted, 0.9),
            samples_ms: samples,
        }
    }
}

/// The run's figures.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BenchReport {
    /// The server's `/version` answer.
    pub server_version: String,
    /// The pool settings used (the key reference only, never the key).
    pub pool_settings: Value,
    /// Create → first OK `/ping`, straight to the server.
    pub create_direct: Series,
    /// Create → ready (`Running` and execd answering) through the adapter in this process.
    pub create_adapter: Series,
    /// Create → `running` through Differently.
    pub create_differently: Series,
    /// `create_differently.p50 / create_direct.p50` (target ≤ 1.1).
    pub p7_ratio_p50: f64,
    /// The same at p90.
    pub p7_ratio_p90: f64,
    /// `echo hi` on execd directly.
    pub exec_direct: Series,
    /// `echo hi` on execd through the server's proxy (reference only).
    pub exec_server_proxy: Series,
    /// `echo hi` through the adapter called in this process (no API, no audit): splits
    /// Differently's overhead into the adapter's part and the API's.
    pub exec_adapter: Series,
    /// `echo hi` through Differently's exec route.
    pub exec_differently: Series,
    /// `echo hi` through Differently's streamed exec route (SSE, read to its `exit` event).
    pub exec_differently_stream: Series,
    /// An authenticated `GET /v1/sandboxes/{id}` (the API's floor: key check, one read).
    pub api_get: Series,
    /// One guarded record staged through the store (`stage_audit_if`, the exec route's
    /// compare-and-swap, on a transaction begun ahead as the API's are), timed to the staged
    /// answer only: the round trip the exec route's command waits for, from another process
    /// on the same machine. Its commit follows, untimed. Measured after the exec rounds.
    pub audit_stage: Series,
    /// `GET /healthz` through the API (no key, no store): the HTTP round trip to the API
    /// alone, so [`Self::api_get`] less this is the key check and one read. Measured after
    /// the exec rounds, alternating with [`Self::audit_stage`].
    pub api_hop: Series,
    /// One audit record appended and committed straight through the store to the run's
    /// database (a standalone append, its WAL flush included; the exec route stages its
    /// record instead and overlaps the commit with its call, see [`Self::audit_stage`]).
    pub audit_append: Series,
    /// Exec rounds dropped because execd ended a command with `signal: broken pipe`.
    pub exec_anomalies: Vec<String>,
    /// `exec_differently.p50 - exec_direct.p50` in ms (target ≤ 1).
    pub exec_overhead_p50_ms: f64,
    /// `exec_differently_stream.p50 - exec_direct.p50` in ms.
    pub exec_stream_overhead_p50_ms: f64,
    /// The median of each round's own `exec_differently - exec_direct`, in ms. Both samples
    /// of a round are taken within milliseconds of each other, so a spell of a slower
    /// machine moves both and drops out of the difference, which the difference of two
    /// medians ([`Self::exec_overhead_p50_ms`]) keeps: the figure to compare runs by.
    pub exec_overhead_paired_p50_ms: f64,
    /// The same for the streamed route.
    pub exec_stream_overhead_paired_p50_ms: f64,
    /// On-CPU time of the API process per exec through Differently, in µs, over
    /// [`CPU_EXECS`] execs run back to back after the timed rounds (`None` if `/proc` could
    /// not be read). On two cores the API's CPU is taken from execd and Postgres.
    pub api_cpu_per_exec_us: Option<f64>,
    /// The same for every `postgres` process together (the server is shared: another
    /// database's work in that time counts too).
    pub postgres_cpu_per_exec_us: Option<f64>,
    /// Context switches of the API process's threads per exec in the same phase (voluntary
    /// and not): how often an exec puts a thread to sleep or wakes one, which on two cores
    /// is most of what its CPU time is spent on.
    pub api_switches_per_exec: Option<f64>,
    /// On-CPU µs per exec of every process of the run in the same phase: each control-plane
    /// process by name (`api`, `scheduler`, `worker`), the run's `nats-server`, and
    /// `postgres` (all its processes). An exec's work does not end with its answer (the
    /// commit, the public events, their fan-out), and on two cores whatever runs after it
    /// is taken from the next command. A process whose `/proc` could not be read is absent.
    pub cpu_per_exec_us: std::collections::BTreeMap<String, f64>,
    /// The same processes' CPU over an idle spell as long as that phase, divided by the
    /// phase's execs: the part of [`Self::cpu_per_exec_us`] that timers and polls account
    /// for, not the execs.
    pub idle_cpu_per_exec_us: std::collections::BTreeMap<String, f64>,
}

/// Paths of each interleaved exec round: execd, the adapter, Differently's exec, the API's
/// GET, Differently's streamed exec, an audit append.
const PATHS: usize = 6;

/// How long a create straight to the server may take to answer its first `/ping`.
const DIRECT_DEADLINE: Duration = Duration::from_secs(300);

/// Execs of the CPU phase.
pub const CPU_EXECS: usize = 200;

/// Starts the control plane with an `opensandbox` pool on `opts.url` (the fake pool denied by
/// policy), measures, and returns the figures.
pub async fn run(opts: BenchOpts) -> Result<BenchReport, LoadError> {
    require_loopback(&opts.url)?;
    if opts.creates < 10 || opts.execs < 50 {
        return Err(LoadError::Plan(
            "at least 10 creates and 50 execs per path".to_owned(),
        ));
    }
    let (server, version) = connect(&opts.url, &opts.key).await?;
    let (cluster, api, mut settings) =
        start_with_pool(&server, opts.cluster.clone(), &opts.image, &opts.settings).await?;

    // The adapter in this process, with the pool's settings: splits P7 and the exec overhead
    // into the adapter's part and the control plane's.
    let adapter = OpenSandboxAdapter::new(
        serde_json::from_value::<OpenSandboxConfig>(settings.clone())
            .map_err(|e| LoadError::Plan(format!("pool settings: {e}")))?,
    )
    .map_err(|e| LoadError::Plan(format!("adapter: {e}")))?;
    let installation = InstallationId::new();

    // P7, interleaved, after one untimed round of each (image and page caches).
    create_direct(
        &server,
        &opts.image,
        "512Mi",
        "direct",
        Ready::Ping,
        DIRECT_DEADLINE,
    )
    .await?;
    create_differently(&api).await?;
    create_adapter(&adapter, &installation).await?;
    let (mut direct, mut through, mut in_process) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..opts.creates {
        // Rotate which goes first, so none always follows another's delete.
        for k in 0..3 {
            match (i + k) % 3 {
                0 => direct.push(
                    create_direct(
                        &server,
                        &opts.image,
                        "512Mi",
                        "direct",
                        Ready::Ping,
                        DIRECT_DEADLINE,
                    )
                    .await?,
                ),
                1 => through.push(create_differently(&api).await?),
                _ => in_process.push(create_adapter(&adapter, &installation).await?),
            }
        }
        eprintln!(
            "create {}/{}: direct {:.0} ms, adapter {:.0} ms, differently {:.0} ms",
            i + 1,
            opts.creates,
            direct[i],
            in_process[i],
            through[i]
        );
    }

    // Exec overhead on one sandbox made through Differently.
    let v = api
        .expect(
            reqwest::Method::POST,
            "/v1/sandboxes",
            Some(
                json!({"resources": {"cpu": 1, "memoryMiB": 512, "diskGiB": 1}, "ttlSeconds": 900}),
            ),
            202,
            "create the exec sandbox",
        )
        .await?;
    let id = v["id"]
        .as_str()
        .ok_or_else(|| LoadError::Check(format!("create answer without id: {v}")))?
        .to_owned();
    api.wait(&id, "running").await?;
    let measured = async {
        let instance = server.instance_of(&id).await?;
        let direct_base = server.execd_base(&instance).await?;
        let proxy_base = format!("{}/sandboxes/{instance}/proxy/{EXECD_PORT}", server.api);
        let at = InstanceRef {
            sandbox_id: SandboxId::parse(&id)
                .map_err(|e| LoadError::Check(format!("sandbox id {id:?}: {e}")))?,
            backend_ref: instance.clone(),
        };
        let store = cluster.db.store();
        let mut series: [Vec<f64>; PATHS] = Default::default();
        let mut anomalies = Vec::new();
        let mut round = 0;
        while series[0].len() < opts.execs {
            // Rotate which path goes first: execd still holds each finished stream ~1 s, so
            // a path always run right after another exec would pay for that one's close.
            let took: Result<[f64; PATHS], LoadError> = async {
                let mut t = [0.0; PATHS];
                for k in 0..PATHS {
                    let which = (round + k) % PATHS;
                    t[which] = match which {
                        0 => exec_execd(&server, &direct_base, false).await?,
                        1 => exec_adapter(&adapter, &at).await?,
                        2 => exec_differently(&api, &id).await?,
                        3 => api_get(&api, &id).await?,
                        4 => exec_differently_stream(&api, &id).await?,
                        _ => audit_append(&store, &id).await?,
                    };
                }
                Ok(t)
            }
            .await;
            round += 1;
            match took {
                Ok(took) if round > PATHS => {
                    for (s, t) in series.iter_mut().zip(took) {
                        s.push(t);
                    }
                }
                Ok(_) => {}
                // Real execd now and then ends an `echo hi` with `signal: broken pipe`: the
                // round is dropped (all its paths, so the comparison stays interleaved) and
                // counted; more than a few such rounds fail the run.
                Err(LoadError::Check(m)) if m.contains("broken pipe") => {
                    eprintln!("exec round {round}: {m}");
                    anomalies.push(m);
                    if anomalies.len() * 20 > opts.execs {
                        return Err(LoadError::Check(format!(
                            "{} of {round} exec rounds hit execd's broken pipe",
                            anomalies.len()
                        )));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        // CPU per exec, in a phase of its own so the API serves nothing else meanwhile.
        let api_pid = cluster.pid("api");
        let mut procs = cluster.pids();
        procs.extend(cluster.nats.pid().map(|p| ("nats-server".to_owned(), p)));
        eprintln!("cpu phase: {CPU_EXECS} execs begin");
        let phase_began = Instant::now();
        let switches_before = api_pid.and_then(context_switches);
        let before = cpu_readings(&procs);
        let mut done = 0;
        while done < CPU_EXECS {
            match exec_differently(&api, &id).await {
                Ok(_) => done += 1,
                Err(LoadError::Check(m)) if m.contains("broken pipe") => {
                    anomalies.push(format!("cpu phase: {m}"));
                }
                Err(e) => return Err(e),
            }
        }
        let by_process = per_exec_us(&before, &cpu_readings(&procs));
        let phase = phase_began.elapsed();
        eprintln!("cpu phase: end");
        // The same processes idle for as long: what they spend on timers and polls, which
        // the phase's figures include.
        let idle_before = cpu_readings(&procs);
        tokio::time::sleep(phase).await;
        let idle = per_exec_us(&idle_before, &cpu_readings(&procs));
        let switches = api_pid
            .and_then(context_switches)
            .zip(switches_before)
            .and_then(|(a, b)| a.checked_sub(b))
            .map(|d| d as f64 / CPU_EXECS as f64);
        let cpu = (
            by_process.get("api").copied(),
            by_process.get("postgres").copied(),
            switches,
            by_process,
            idle,
        );
        // The server's proxy, for reference, in a phase of its own: closing a proxied stream
        // right after `execution_complete` is what the broken pipes followed, so it does not
        // share rounds with the comparison.
        let mut proxied = Vec::new();
        while proxied.len() < opts.execs {
            match exec_execd(&server, &proxy_base, true).await {
                Ok(t) => proxied.push(t),
                Err(LoadError::Check(m)) if m.contains("broken pipe") => {
                    eprintln!("proxy exec: {m}");
                    anomalies.push(format!("server proxy phase: {m}"));
                    if anomalies.len() * 10 > opts.execs {
                        return Err(LoadError::Check(format!(
                            "{} broken pipes from execd",
                            anomalies.len()
                        )));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        // The API's bare hop and the guarded swap from this process, in a phase of their own
        // as well: interleaved with the exec rounds, they made Differently's exec in those
        // rounds 0.3-0.8 ms slower (docs/opensandbox.md, seventh pass).
        let mut floors = (Vec::new(), Vec::new());
        while floors.0.len() < opts.execs {
            floors.0.push(api_hop(&api).await?);
            floors.1.push(audit_stage(&store, &at.sandbox_id).await?);
        }
        Ok::<_, LoadError>((series, proxied, floors, anomalies, cpu))
    }
    .await;
    api.call(
        reqwest::Method::DELETE,
        &format!("/v1/sandboxes/{id}"),
        None,
        "delete the exec sandbox",
    )
    .await?;
    let (
        [d, ad, t, g, st, au],
        p,
        (hop, stg),
        exec_anomalies,
        (api_cpu, postgres_cpu, api_switches, cpu_per_exec_us, idle_cpu_per_exec_us),
    ) = measured?;
    api.wait(&id, "terminated").await?;

    let create_direct = Series::of(direct);
    let create_differently = Series::of(through);
    let create_adapter = Series::of(in_process);
    let exec_overhead_paired_p50_ms = paired_p50(&t, &d);
    let exec_stream_overhead_paired_p50_ms = paired_p50(&st, &d);
    let exec_direct = Series::of(d);
    let exec_server_proxy = Series::of(p);
    let exec_adapter = Series::of(ad);
    let exec_differently = Series::of(t);
    let exec_differently_stream = Series::of(st);
    let api_get = Series::of(g);
    let audit_append = Series::of(au);
    let api_hop = Series::of(hop);
    let audit_stage = Series::of(stg);
    if let Some(obj) = settings.as_object_mut() {
        obj.remove("apiKeyFile");
        obj.insert(
            "apiKeyFile".to_owned(),
            json!("<run directory>/opensandbox.key"),
        );
    }
    Ok(BenchReport {
        server_version: version["version"].as_str().unwrap_or_default().to_owned(),
        pool_settings: settings,
        p7_ratio_p50: create_differently.p50_ms / create_direct.p50_ms,
        p7_ratio_p90: create_differently.p90_ms / create_direct.p90_ms,
        exec_overhead_p50_ms: exec_differently.p50_ms - exec_direct.p50_ms,
        exec_stream_overhead_p50_ms: exec_differently_stream.p50_ms - exec_direct.p50_ms,
        exec_overhead_paired_p50_ms,
        exec_stream_overhead_paired_p50_ms,
        create_direct,
        create_adapter,
        create_differently,
        exec_direct,
        exec_server_proxy,
        exec_adapter,
        exec_differently,
        exec_differently_stream,
        api_get,
        api_hop,
        audit_append,
        audit_stage,
        exec_anomalies,
        api_cpu_per_exec_us: api_cpu,
        postgres_cpu_per_exec_us: postgres_cpu,
        api_switches_per_exec: api_switches,
        cpu_per_exec_us,
        idle_cpu_per_exec_us,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_paired_median_is_of_each_rounds_difference() {
        // A slow spell in rounds 3-5 moves both paths: the medians' difference shows it
        // (3.0 - 1.0 = 2.0), the rounds' own differences do not (all 0.5).
        let direct = [1.0, 1.0, 9.0, 9.0, 9.0];
        let through = [1.5, 1.5, 9.5, 9.5, 9.5];
        assert_eq!(paired_p50(&through, &direct), 0.5);
        let (a, b) = ([3.0, 1.0, 2.0], [1.0, 1.5, 0.0]);
        assert_eq!(paired_p50(&a, &b), 2.0, "differences 2.0, -0.5, 2.0");
    }
}
