//! The Grafana dashboard (`deploy/grafana/differently.json`) and the Prometheus alert rules
//! (`deploy/prometheus/alerts.yml`) ask only for metrics the binary really serves: a cluster
//! of api, scheduler and worker processes on real Postgres and NATS does the work that makes
//! each metric exist, the three `/metrics` listeners are scraped, and every `differently_*`
//! name either file mentions must be a sample one of them served. The dashboard must also
//! show every family served, so a new metric cannot be left off it unnoticed.
//!
//! A cluster rather than `differently dev`: dev runs on the in-memory store and bus, which
//! serve none of the Postgres metrics (audit appends, group sizes) a production dashboard needs.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use differently_bus::Bus;
use differently_bus_schema::{Naming, WorkOp};
use differently_core::{OrgId, SandboxStatus};
use reqwest::Method;
use serde_json::json;

use crate::harness::{free_port, Cluster, Opts};
use crate::observability::scrape;

const DASHBOARD: &str = include_str!("../../../deploy/grafana/differently.json");
const ALERTS: &str = include_str!("../../../deploy/prometheus/alerts.yml");

/// Every `differently_…` metric name in `text` (a name ends at the first character that
/// cannot be part of one).
fn referenced(text: &str) -> BTreeSet<String> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("differently_") {
        let before = rest[..at].chars().next_back();
        let tail = &rest[at..];
        let end = tail.find(|c: char| !is_name(c)).unwrap_or(tail.len());
        if !before.is_some_and(is_name) {
            names.insert(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    names
}

/// What one scrape served: sample names, and each family's type from its `# TYPE` line.
#[derive(Default)]
struct Served {
    samples: BTreeSet<String>,
    families: BTreeMap<String, String>,
}

impl Served {
    fn add(&mut self, text: &str) {
        for line in text.lines() {
            if let Some(t) = line.strip_prefix("# TYPE ") {
                let mut parts = t.split_whitespace();
                if let (Some(name), Some(kind)) = (parts.next(), parts.next()) {
                    self.families.insert(name.to_owned(), kind.to_owned());
                }
            } else if !line.starts_with('#') && !line.trim().is_empty() {
                let end = line.find(['{', ' ']).unwrap_or(line.len());
                self.samples.insert(line[..end].to_owned());
            }
        }
    }

    /// Whether `text` asks for family `family` under any of its sample names.
    fn family_shown(family: &str, kind: &str, names: &BTreeSet<String>) -> bool {
        let suffixes: &[&str] = match kind {
            "histogram" => &["_bucket", "_sum", "_count"],
            "summary" => &["", "_sum", "_count"],
            _ => &[""],
        };
        suffixes
            .iter()
            .any(|s| names.contains(&format!("{family}{s}")))
    }
}

/// A `fake` pool offering warm instances, with one class a create asking for nothing matches.
const WARM_POOL: &str = r#"
[[pools]]
name = "warm"
kind = "fake"
warm = [{ name = "default", size = 1, refill_per_second = 10 }]

[pools.settings]
ledger = "{ledger}"
capabilities = ["exec", "warm"]
"#;

/// Waits for the leader to report the `warm` pool's instance ready (scraping the scheduler
/// at `scheduler_metrics`), then creates through the direct-placing API at `direct_port`:
/// the create must be answered from the instance (`running` at once), which counts
/// `differently_warm_claims_total{result="hit"}`.
async fn claim_warm(c: &Cluster, scheduler_metrics: u16, direct_port: u16) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    // `differently_warm_ready{pool="warm",class="default"} 1`, in either label order.
    let is_ready = |l: &str| {
        l.starts_with("differently_warm_ready{")
            && l.contains(r#"pool="warm""#)
            && l.contains(r#"class="default""#)
            && l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) >= Some(1.0)
    };
    while !scrape(scheduler_metrics).await.lines().any(is_ready) {
        assert!(
            std::time::Instant::now() < deadline,
            "the warm class never had a ready instance\n{}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{direct_port}");
    while http
        .get(format!("{base}/readyz"))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .ok()
        != Some(200)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "api-direct never ready\n{}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Ready is not yet placing: a process just started learns its pools' health on its first
    // probe, and until then its admission queues instead of claiming. Wait for it to place.
    loop {
        let dry: serde_json::Value = http
            .post(format!("{base}/v1/placement/dry-run"))
            .bearer_auth(&c.key)
            .json(&json!({}))
            .send()
            .await
            .expect("dry run through api-direct")
            .json()
            .await
            .expect("dry-run answer");
        if dry["decision"] == "placed" && dry["pool"] == "warm" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "api-direct never placed on the warm pool: {dry}\n{}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let r = http
        .post(format!("{base}/v1/sandboxes"))
        .bearer_auth(&c.key)
        .json(&json!({}))
        .send()
        .await
        .expect("create through api-direct");
    let status = r.status().as_u16();
    let body: serde_json::Value = r.json().await.expect("create answer");
    assert_eq!(status, 202, "{body}");
    assert_eq!(
        body["status"],
        "running",
        "not a warm claim: {body}\n{}",
        c.logs()
    );
    assert_eq!(body["pool"], "warm", "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_and_alerts_use_only_served_metrics() {
    // Through the leader, so placement metrics exist too.
    // A second pool with one warm class, so the warm pools' gauges, refill histogram and
    // claims counter exist (they are served once a class is declared and used).
    let mut c = Cluster::new(Opts {
        extra_toml: crate::crash::LEADER_PLACES_ALL.into(),
        more_pools: WARM_POOL.into(),
        ..Opts::default()
    })
    .await;
    let ports = [free_port(), free_port(), free_port(), free_port()];
    for (name, port) in ["api", "scheduler", "worker"].iter().zip(ports) {
        let listen = format!("127.0.0.1:{port}");
        c.spawn(name, name, &[("DIFFERENTLY_METRICS_LISTEN", &listen)]);
    }
    // Warm claims happen in direct placement only, which the leader-placing config turns
    // off: a second API with it on makes the claim.
    let direct_port = free_port();
    c.spawn(
        "api-direct",
        "api",
        &[
            (
                "DIFFERENTLY_METRICS_LISTEN",
                &format!("127.0.0.1:{}", ports[3]),
            ),
            ("DIFFERENTLY_LISTEN", &format!("127.0.0.1:{direct_port}")),
            ("DIFFERENTLY_DIRECT_PLACEMENT", "true"),
        ],
    );
    c.wait_ready().await;
    claim_warm(&c, ports[1], direct_port).await;

    // create, exec, delete: admissions, activations, placement, adapter calls, bus, audit.
    let id = c.create_ok().await;
    c.wait_status(&id, SandboxStatus::Running, Duration::from_secs(30))
        .await;
    let (status, out) = c
        .call(
            &c.key.clone(),
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"command": ["echo", "hi"], "timeoutSeconds": 30})),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    let (status, out) = c.delete(&id).await;
    assert!((200..300).contains(&status), "{status} {out}");
    c.wait_status(&id, SandboxStatus::Terminated, Duration::from_secs(30))
        .await;

    // A TTL that runs out: the leader's sweep acts (differently_reconcile_actions_total).
    let (status, body) = c.create(json!({"ttlSeconds": 1})).await;
    assert_eq!(status, 202, "{body}");
    let short = differently_core::SandboxId::parse(body["id"].as_str().expect("id")).unwrap();
    c.wait_status(&short, SandboxStatus::Terminated, Duration::from_secs(30))
        .await;

    // Messages no consumer can decode, on the subjects the scheduler and the worker read
    // (differently_bus_undecodable_total). Sent to this test's own nats-server.
    let bus = differently_bus::jetstream::connect(&c._nats.url(), 1)
        .await
        .expect("connect to the test's nats-server");
    let naming = Naming::default();
    for (subject, msg_id) in [
        (
            naming.work_subject("fake", WorkOp::Create),
            "deploy-metrics-work",
        ),
        (naming.admit_subject(&OrgId::new()), "deploy-metrics-admit"),
    ] {
        bus.publish(&subject, msg_id, "not an envelope".into())
            .await
            .expect("publish");
    }

    // Scrape until every family the work above makes has appeared (counters appear on first
    // use), then compare.
    let want_eventually = [
        "differently_bus_undecodable_total",
        "differently_reconcile_actions_total",
        "differently_warm_refill_seconds_bucket",
        // Set when a worker's fan-out starts leading, which may come after the sandboxes.
        "differently_webhook_fan_out_lag_events",
    ];
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let served = loop {
        let mut served = Served::default();
        for port in ports {
            served.add(&scrape(port).await);
        }
        if want_eventually.iter().all(|n| served.samples.contains(*n))
            || std::time::Instant::now() > deadline
        {
            break served;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    let dashboard = referenced(DASHBOARD);
    let alerts = referenced(ALERTS);
    // A file that mentions no metric would pass vacuously.
    assert!(dashboard.len() >= 10, "dashboard references {dashboard:?}");
    assert!(alerts.len() >= 8, "alert rules reference {alerts:?}");

    let mut problems = vec![];
    for (file, names) in [
        ("deploy/grafana/differently.json", &dashboard),
        ("deploy/prometheus/alerts.yml", &alerts),
    ] {
        for name in names {
            if !served.samples.contains(name) {
                problems.push(format!("{file} uses {name}, which no process served"));
            }
        }
    }
    for (family, kind) in &served.families {
        if family.starts_with("differently_") && !Served::family_shown(family, kind, &dashboard) {
            problems.push(format!(
                "{family} ({kind}) is served but not on deploy/grafana/differently.json"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{}\nserved samples: {:?}\n{}",
        problems.join("\n"),
        served.samples,
        c.logs()
    );
}

#[test]
fn names_are_extracted_whole_and_only_as_names() {
    let got = referenced(
        r#"rate(differently_adapter_calls_total{outcome!="ok"}[5m]) / x_differently_not
           histogram_quantile(0.9, differently_bus_publish_seconds_bucket) "differently_usage_drift_total""#,
    );
    let want: BTreeSet<String> = [
        "differently_adapter_calls_total",
        "differently_bus_publish_seconds_bucket",
        "differently_usage_drift_total",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(got, want);
}
