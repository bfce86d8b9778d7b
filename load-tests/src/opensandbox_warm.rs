//! Issue #42's warm figure on a real OpenSandbox server: create → first OK exec of `true`
//! through Differently when the create is answered from a warm instance, against the same
//! thing straight to the same server, interleaved in one run (the machine is shared and
//! noisy, so only same-run comparisons mean anything):
//!
//! - **direct**: `POST /sandboxes` to the server (it answers once the container runs), the
//!   sandbox's execd endpoint, then `true` on execd (read until `execution_complete`),
//!   retried every 5 ms until it succeeds;
//! - **warm**: `POST /v1/sandboxes` matching the pool's warm class, the API's wait route
//!   when the answer is not `running` yet (an OpenSandbox claim renews the instance's
//!   expiry in a worker first), then `POST /v1/sandboxes/{id}/exec` of `true`, retried every
//!   5 ms until it answers 200 with exit code 0. Each is checked to have been a hit twice:
//!   Differently's `sandbox.activate` audit record says `cause: warm` for this class, and
//!   the server's instance tagged with the sandbox's id was created before the request;
//! - **cold** (reference): the same through Differently with resources no class matches,
//!   checked not to have been a hit.
//!
//! Before every timed sample the class is waited back to its full size (no refill create
//! runs during a sample's start), and each sandbox is deleted after its sample, untimed. At
//! the end the pool is deleted, which deletes its warm instances on the server.
//! Every address is on loopback (`opensandbox_client`).

use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Value};

use crate::cluster::ClusterOpts;
use crate::opensandbox::{create_direct, Ready};
use crate::opensandbox_client::{connect, ms, start_with_pool, Api, Server};
use crate::stats::{summarize_ms, Summary};
use crate::LoadError;

/// The warm class the bench declares on its pool (`osb`).
const CLASS: &str = "bench";
/// Exec of `true` through Differently.
const TRUE: &str = "true";
/// Longest any one sample may take before the run fails.
const SAMPLE_DEADLINE: Duration = Duration::from_secs(300);
/// The ≤ 0.1 × target of issue #42.
pub const TARGET_RATIO: f64 = 0.1;

/// What the run measures and against what.
#[derive(Debug, Clone)]
pub struct WarmOpts {
    /// The server's lifecycle API, ending in `/v1`; must be on loopback.
    pub url: String,
    /// The server's `api_key`.
    pub key: String,
    /// Extra pool settings (JSON object) merged over the bench's defaults.
    pub settings: Value,
    /// The image both paths create from (the pool's default, so the class's).
    pub image: String,
    /// Timed samples per path (interleaved), after one untimed round.
    pub rounds: usize,
    /// The class's `size`.
    pub size: u32,
    /// The class's `refillPerSecond`.
    pub refill: f64,
    /// The control plane's options.
    pub cluster: ClusterOpts,
}

/// Percentiles of one path and its samples in the order taken, in milliseconds.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Path {
    /// Count, mean, p50, p95, p99 (nearest rank: with fewer than 100 samples, the largest)
    /// and max.
    pub summary: Summary,
    /// In the order taken.
    pub samples_ms: Vec<f64>,
}

impl Path {
    fn of(samples: Vec<f64>) -> Path {
        let mut sorted = samples.clone();
        Path {
            summary: summarize_ms(&mut sorted),
            samples_ms: samples,
        }
    }
}

/// Where a create through Differently spent its time.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Split {
    /// Create sent → its 202.
    pub answered: Path,
    /// Create sent → `running` (the 202 itself, or the wait route's answer).
    pub running: Path,
    /// Exec calls sent before the first OK one (1 = the first succeeded).
    pub exec_attempts: Vec<u32>,
}

/// The run's figures.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WarmReport {
    /// The server's `/version` answer.
    pub server_version: String,
    /// The pool settings used (the key reference only, never the key).
    pub pool_settings: Value,
    /// The warm class declared on the pool.
    pub class: Value,
    /// Create → first OK execd `true`, straight to the server.
    pub direct: Path,
    /// Create → first OK `/v1` exec `true` through Differently, every create a warm hit.
    pub warm: Path,
    /// Where the warm creates spent their time.
    pub warm_split: Split,
    /// The same through Differently, cold (no class matches), for reference.
    pub cold: Path,
    /// Where the cold creates spent their time.
    pub cold_split: Split,
    /// `warm.p50 / direct.p50` (target ≤ [`TARGET_RATIO`]).
    pub ratio_p50: f64,
    /// `warm.p99 / direct.p99`.
    pub ratio_p99: f64,
    /// Both ratios within the target.
    pub target_met: bool,
    /// Timed warm creates checked to be hits (all of them, or the run fails).
    pub verified_hits: usize,
    /// Waits for the class to be back to size before a sample, in ms.
    pub refill_waits: Path,
    /// `/proc/loadavg` at the start and at the end of the timed rounds.
    pub load_average: [String; 2],
}

/// Starts the control plane with an `opensandbox` pool on `opts.url` and a warm class on
/// it, measures the three paths interleaved, and returns the figures.
pub async fn run(opts: WarmOpts) -> Result<WarmReport, LoadError> {
    if opts.rounds < 10 || opts.size == 0 {
        return Err(LoadError::Plan(
            "at least 10 rounds and a class of at least 1 instance".to_owned(),
        ));
    }
    let (server, version) = connect(&opts.url, &opts.key).await?;
    let (_cluster, api, mut settings) =
        start_with_pool(&server, opts.cluster.clone(), &opts.image, &opts.settings).await?;
    let class = json!({"name": CLASS, "size": opts.size, "refillPerSecond": opts.refill});
    api.expect(
        reqwest::Method::PUT,
        "/v1/admin/pools/osb/warm",
        Some(json!({"classes": [class]})),
        200,
        "declare the warm class",
    )
    .await?;
    let measured = measure(&server, &api, &opts).await;
    let removed = remove_pool(&api).await;
    let Rounds {
        d,
        w,
        c,
        w_split,
        c_split,
        refill_waits,
        load_start,
        load_end,
    } = measured?;
    removed?;

    let verified_hits = w.len();
    let (direct, warm, cold) = (Path::of(d), Path::of(w), Path::of(c));
    let split = |(a, r, n): (Vec<f64>, Vec<f64>, Vec<u32>)| Split {
        answered: Path::of(a),
        running: Path::of(r),
        exec_attempts: n,
    };
    let ratio_p50 = warm.summary.p50_ms / direct.summary.p50_ms;
    let ratio_p99 = warm.summary.p99_ms / direct.summary.p99_ms;
    if let Some(obj) = settings.as_object_mut() {
        obj.insert(
            "apiKeyFile".to_owned(),
            json!("<run directory>/opensandbox.key"),
        );
    }
    Ok(WarmReport {
        server_version: version["version"].as_str().unwrap_or_default().to_owned(),
        pool_settings: settings,
        class,
        direct,
        warm,
        warm_split: split(w_split),
        cold,
        cold_split: split(c_split),
        ratio_p50,
        ratio_p99,
        target_met: ratio_p50 <= TARGET_RATIO && ratio_p99 <= TARGET_RATIO,
        verified_hits,
        refill_waits: Path::of(refill_waits),
        load_average: [load_start, load_end],
    })
}

/// The timed samples of the three paths and what the machine was doing.
struct Rounds {
    d: Vec<f64>,
    w: Vec<f64>,
    c: Vec<f64>,
    w_split: (Vec<f64>, Vec<f64>, Vec<u32>),
    c_split: (Vec<f64>, Vec<f64>, Vec<u32>),
    refill_waits: Vec<f64>,
    load_start: String,
    load_end: String,
}

/// Fills the class, runs one untimed round of each path, then `opts.rounds` timed rounds.
async fn measure(server: &Server, api: &Api, opts: &WarmOpts) -> Result<Rounds, LoadError> {
    let fill = Duration::from_secs_f64(f64::from(opts.size) / opts.refill.max(0.01) * 3.0 + 120.0);
    wait_full(api, opts.size, fill).await?;

    // One untimed round of each (page caches, connections).
    create_direct(
        server,
        &opts.image,
        "1024Mi",
        "warm-direct",
        Ready::ExecTrue,
        SAMPLE_DEADLINE,
    )
    .await?;
    let mut refill_waits = Vec::new();
    refill_waits.push(wait_full(api, opts.size, fill).await?);
    through(api, server, Kind::Warm).await?;
    refill_waits.push(wait_full(api, opts.size, fill).await?);
    through(api, server, Kind::Cold).await?;

    let load_start = load_average();
    let (mut d, mut w, mut c) = (Vec::new(), Vec::new(), Vec::new());
    let (mut w_split, mut c_split) = (
        (Vec::new(), Vec::new(), Vec::new()),
        (Vec::new(), Vec::new(), Vec::new()),
    );
    for i in 0..opts.rounds {
        // Rotate which path goes first, so none always follows another's delete.
        for k in 0..3 {
            refill_waits.push(wait_full(api, opts.size, fill).await?);
            match (i + k) % 3 {
                0 => d.push(
                    create_direct(
                        server,
                        &opts.image,
                        "1024Mi",
                        "warm-direct",
                        Ready::ExecTrue,
                        SAMPLE_DEADLINE,
                    )
                    .await?,
                ),
                1 => {
                    let s = through(api, server, Kind::Warm).await?;
                    w.push(s.exec_ok);
                    w_split.0.push(s.answered);
                    w_split.1.push(s.running);
                    w_split.2.push(s.attempts);
                }
                _ => {
                    let s = through(api, server, Kind::Cold).await?;
                    c.push(s.exec_ok);
                    c_split.0.push(s.answered);
                    c_split.1.push(s.running);
                    c_split.2.push(s.attempts);
                }
            }
        }
        eprintln!(
            "round {}/{}: direct {:.0} ms, warm {:.0} ms, cold {:.0} ms",
            i + 1,
            opts.rounds,
            d[i],
            w[i],
            c[i]
        );
    }
    let load_end = load_average();

    Ok(Rounds {
        d,
        w,
        c,
        w_split,
        c_split,
        refill_waits,
        load_start,
        load_end,
    })
}

/// Deletes the pool, which first empties its warm classes and waits until the workers have
/// deleted their instances on the server, so a run leaves no warm instance behind (a failed
/// run too). The API answers 409 while any is left: asked again until 120 s have passed.
async fn remove_pool(api: &Api) -> Result<(), LoadError> {
    let t = Instant::now();
    loop {
        let (status, v) = api
            .call(
                reqwest::Method::DELETE,
                "/v1/admin/pools/osb",
                None,
                "delete the pool and its warm instances",
            )
            .await?;
        if status == 204 {
            return Ok(());
        }
        if status != 409 || t.elapsed() > Duration::from_secs(120) {
            return Err(LoadError::Api {
                context: "delete the pool and its warm instances".to_owned(),
                status,
                body: v.to_string().chars().take(300).collect(),
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `/proc/loadavg`'s first three fields, or why not.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|e| format!("unread: {e}"))
}

/// Waits until the class holds `size` ready instances (so none is being created); returns
/// how long that took, in ms.
async fn wait_full(api: &Api, size: u32, within: Duration) -> Result<f64, LoadError> {
    let t = Instant::now();
    loop {
        let v = api
            .expect(
                reqwest::Method::GET,
                "/v1/admin/pools/osb/warm",
                None,
                200,
                "the warm class",
            )
            .await?;
        let class = v["classes"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["name"] == CLASS))
            .cloned()
            .unwrap_or(Value::Null);
        if class["ready"]
            .as_u64()
            .is_some_and(|n| n >= u64::from(size))
        {
            return Ok(ms(t.elapsed()));
        }
        if t.elapsed() > within {
            return Err(LoadError::Timeout(format!(
                "warm class {CLASS} not back to {size} ready instances after {within:?}: {class}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Which create through Differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Matches the class (pool defaults: no template, no resources).
    Warm,
    /// Resources no class has.
    Cold,
}

/// One create through Differently, timed.
struct Sample {
    answered: f64,
    running: f64,
    exec_ok: f64,
    attempts: u32,
}

/// Create → first OK `/v1` exec of `true` through Differently, then checks whether it was
/// a warm hit as `kind` says it must be; deleted and waited out (untimed).
async fn through(api: &Api, server: &Server, kind: Kind) -> Result<Sample, LoadError> {
    let body = match kind {
        Kind::Warm => json!({"ttlSeconds": 600}),
        Kind::Cold => {
            json!({"ttlSeconds": 600, "resources": {"cpu": 1, "memoryMiB": 1024, "diskGiB": 4}})
        }
    };
    let sent_at = chrono::Utc::now();
    let t = Instant::now();
    let v = api
        .expect(
            reqwest::Method::POST,
            "/v1/sandboxes",
            Some(body),
            202,
            "create",
        )
        .await?;
    let answered = ms(t.elapsed());
    let id = v["id"]
        .as_str()
        .ok_or_else(|| LoadError::Check(format!("create answer without id: {v}")))?
        .to_owned();
    let result = async {
        if v["status"] != "running" {
            api.wait(&id, "running").await?;
        }
        let running = ms(t.elapsed());
        let mut attempts = 0;
        let mut last = Value::Null;
        while t.elapsed() < SAMPLE_DEADLINE {
            attempts += 1;
            let (status, out) = api
                .call(
                    reqwest::Method::POST,
                    &format!("/v1/sandboxes/{id}/exec"),
                    Some(json!({"command": [TRUE]})),
                    "exec",
                )
                .await?;
            if status == 200 && out["exitCode"] == 0 {
                let exec_ok = ms(t.elapsed());
                return Ok(Sample {
                    answered,
                    running,
                    exec_ok,
                    attempts,
                });
            }
            last = json!({"status": status, "body": out});
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Err(LoadError::Timeout(format!(
            "{id}: no OK exec of `true` within {SAMPLE_DEADLINE:?}; last answer {last}"
        )))
    }
    .await;
    let checked = match &result {
        Ok(_) => check_hit(api, server, &id, sent_at, kind).await,
        Err(_) => Ok(()),
    };
    api.expect(
        reqwest::Method::DELETE,
        &format!("/v1/sandboxes/{id}"),
        None,
        202,
        "delete",
    )
    .await?;
    api.wait(&id, "terminated").await?;
    checked?;
    result
}

/// Checks that sandbox `id` was answered from a warm instance of the class (`Kind::Warm`)
/// or not (`Kind::Cold`), by two witnesses: Differently's `sandbox.activate` audit record
/// (`cause: warm`, naming the class) and the server, whose instance tagged with the id was
/// created before the request was sent (warm) or after (cold).
async fn check_hit(
    api: &Api,
    server: &Server,
    id: &str,
    sent_at: chrono::DateTime<chrono::Utc>,
    kind: Kind,
) -> Result<(), LoadError> {
    let audit = api
        .expect(
            reqwest::Method::GET,
            &format!("/v1/audit?resource={id}&action=sandbox.activate"),
            None,
            200,
            "the sandbox's activation record",
        )
        .await?;
    let records = audit["items"].as_array().cloned().unwrap_or_default();
    let warm_record = records
        .iter()
        .any(|r| r["detail"]["cause"] == "warm" && r["detail"]["warmClass"] == CLASS);
    let instance = server.instance_of(id).await?;
    let info = server
        .json(
            server.req(reqwest::Method::GET, &format!("/sandboxes/{instance}")),
            "the sandbox's instance",
        )
        .await?;
    let created = info["createdAt"]
        .as_str()
        .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
        .ok_or_else(|| {
            LoadError::Check(format!("instance {instance} without createdAt: {info}"))
        })?;
    let made_before = created < sent_at;
    let want = kind == Kind::Warm;
    if records.is_empty() || warm_record != want || made_before != want {
        return Err(LoadError::Check(format!(
            "{id} should {}have been a warm hit: activation records {records:?}, instance \
             {instance} created {created} (create sent {sent_at})",
            if want { "" } else { "not " }
        )));
    }
    Ok(())
}
