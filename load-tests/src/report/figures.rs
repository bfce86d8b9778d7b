//! Every figure of a run, from the measurements: absolute value, unit, and ratio to its
//! same-run baseline.

use super::*;

struct Fig<'a>(&'a mut Vec<Figure>);

impl Fig<'_> {
    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        key: &str,
        name: &str,
        value: Option<f64>,
        unit: &str,
        baseline: &str,
        baseline_value: Option<f64>,
        note: Option<String>,
    ) {
        self.0.push(Figure {
            key: key.to_owned(),
            name: name.to_owned(),
            value,
            unit: unit.to_owned(),
            baseline: baseline.to_owned(),
            baseline_value,
            ratio: ratio(value, baseline_value),
            note,
        });
    }
}

/// Builds every figure from the measurements.
pub fn figures(plan: &Plan, b: &Baselines, p: &Phases) -> Vec<Figure> {
    let mut v = Vec::new();
    let mut f = Fig(&mut v);
    let pg1 = Some(b.pg_insert_1.per_second);
    let pg8 = Some(b.pg_insert_8.per_second);
    f.add(
        "baseline.pgInsertTps1",
        "raw Postgres single-row insert tx/s, 1 conn",
        pg1,
        "tx/s",
        "itself",
        pg1,
        None,
    );
    f.add(
        "baseline.pgInsertTps8",
        "raw Postgres single-row insert tx/s, 8 conns",
        pg8,
        "tx/s",
        "itself",
        pg8,
        None,
    );
    let js1 = Some(b.js_publish_1.per_second);
    let js8 = Some(b.js_publish_8.per_second);
    f.add(
        "baseline.jsPublishPerSec1",
        "raw JetStream acked publish/s, 1 in flight",
        js1,
        "msg/s",
        "itself",
        js1,
        None,
    );
    f.add(
        "baseline.jsPublishPerSec8",
        "raw JetStream acked publish/s, 8 in flight",
        js8,
        "msg/s",
        "itself",
        js8,
        None,
    );
    let again = [
        (
            "baseline.end.pgInsertTps1",
            "raw Postgres tx/s, 1 conn, again at the end",
            pg1,
        ),
        (
            "baseline.end.pgInsertTps8",
            "raw Postgres tx/s, 8 conns, again at the end",
            pg8,
        ),
        (
            "baseline.end.jsPublishPerSec1",
            "raw JetStream publish/s, 1 in flight, again at the end",
            js1,
        ),
        (
            "baseline.end.jsPublishPerSec8",
            "raw JetStream publish/s, 8 in flight, again at the end",
            js8,
        ),
    ];
    for ((key, name, start), t) in again.iter().zip(&b.end_of_run) {
        f.add(
            key,
            name,
            Some(t.per_second),
            "/s",
            "same baseline at the start",
            *start,
            Some("machine drift".to_owned()),
        );
    }
    f.add(
        "admissionsPerSec",
        "admissions/s sustained (all processes running)",
        Some(p.burst_sustained.admissions.per_second),
        "/s",
        "Postgres tx/s, 8 conns",
        pg8,
        Some(format!(
            "{} creates, {} in flight",
            plan.burst, plan.concurrency
        )),
    );
    f.add(
        "activationsPerSec.leaderBacklog",
        "activations/s by the placement leader (backlog)",
        Some(p.burst_leader_backlog.activation.per_second),
        "/s",
        "Postgres tx/s, 1 conn",
        pg1,
        Some("burst admitted with the scheduler stopped, then placed".to_owned()),
    );
    f.add(
        "activationsPerSec.sustained",
        "activations/s during the sustained burst",
        Some(p.burst_sustained.activation.per_second),
        "/s",
        "Postgres tx/s, 1 conn",
        pg1,
        None,
    );
    let hop = Some(b.pg_insert_1.latency.p50_ms + b.js_publish_1.latency.p50_ms);
    let hop_name = "1 raw Postgres tx p50 + 1 JetStream publish p50";
    let c = &p.fixed_rate.to_running;
    let rate_note = Some(format!(
        "at {} creates/s, backend latency {} ms",
        plan.rate, plan.latency_ms
    ));
    f.add(
        "createToRunning.client.p50",
        "create→running p50 (client)",
        Some(c.p50_ms),
        "ms",
        hop_name,
        hop,
        rate_note.clone(),
    );
    f.add(
        "createToRunning.client.p95",
        "create→running p95 (client)",
        Some(c.p95_ms),
        "ms",
        hop_name,
        hop,
        rate_note.clone(),
    );
    f.add(
        "createToRunning.client.p99",
        "create→running p99 (client)",
        Some(c.p99_ms),
        "ms",
        hop_name,
        hop,
        rate_note,
    );
    let s = &p.server_side_to_running;
    f.add(
        "createToRunning.server.p50",
        "create→running p50 (Postgres createdAt→startedAt)",
        Some(s.p50_ms),
        "ms",
        hop_name,
        hop,
        None,
    );
    f.add(
        "createToRunning.server.p99",
        "create→running p99 (Postgres createdAt→startedAt)",
        Some(s.p99_ms),
        "ms",
        hop_name,
        hop,
        None,
    );
    let st = &p.server_side_stages;
    for (key, name, sum) in [
        (
            "createToRunning.server.toActivated",
            "createdAt→activated",
            &st.to_activated,
        ),
        (
            "createToRunning.server.activatedToRunning",
            "activated→startedAt",
            &st.activated_to_running,
        ),
    ] {
        f.add(
            &format!("{key}.p50"),
            &format!("{name} p50 (Postgres)"),
            Some(sum.p50_ms),
            "ms",
            hop_name,
            hop,
            Some(format!("p99 {:.1} ms", sum.p99_ms)),
        );
    }
    f.add(
        "fixedRate.achievedPerSec",
        "fixed-rate sessions started/s",
        Some(p.fixed_rate.achieved_rate),
        "/s",
        "requested rate",
        Some(f64::from(plan.rate)),
        Some(format!(
            "{} planned, {} shed, {} failed, {} unfinished",
            p.fixed_rate.planned, p.fixed_rate.shed, p.fixed_rate.failed, p.fixed_rate.unfinished
        )),
    );
    let direct = Some(b.direct_fake_exec.p50_ms);
    f.add(
        "exec.api.p50",
        "exec round trip via API p50 (quiet)",
        Some(p.exec_via_api.p50_ms),
        "ms",
        "direct in-process fake exec p50",
        direct,
        None,
    );
    f.add(
        "exec.direct.p50",
        "direct in-process fake exec p50",
        direct,
        "ms",
        "itself",
        direct,
        None,
    );
    let overhead = p.exec_via_api.p50_ms - b.direct_fake_exec.p50_ms;
    f.add(
        "exec.overhead.p50",
        "exec overhead p50 (via API − direct)",
        Some(overhead),
        "ms",
        "HTTP round trip to a trivial axum handler p50",
        Some(b.trivial_http.p50_ms),
        None,
    );
    f.add(
        "exec.underLoad.p50",
        "exec round trip via API p50 (under fixed-rate load)",
        Some(p.fixed_rate.exec.p50_ms),
        "ms",
        "direct in-process fake exec p50",
        direct,
        None,
    );
    let not_served = match p.exec_stream_status {
        Some(s) => format!("not measurable yet: POST …/exec/stream answers HTTP {s}"),
        None => "not measurable yet".to_owned(),
    };
    let mib = |r: &Option<StreamRate>| r.as_ref().map(StreamRate::median_mib_per_second);
    let (api_s, frames_s, direct_s, http_s) = (
        mib(&p.exec_stream_via_api),
        mib(&p.exec_stream_frames_via_api),
        mib(&b.direct_fake_exec_stream),
        mib(&b.trivial_http_stream),
    );
    let stream_note = |v: Option<f64>, how: &str| match v {
        Some(_) => Some(format!(
            "median of {} × {} bytes of fake-output{how}",
            plan.stream_repetitions, plan.stream_bytes
        )),
        None => Some(not_served.clone()),
    };
    let (sse_how, frames_how) = (
        "; the client JSON-decodes every event",
        "; the client counts frame payloads in place",
    );
    let direct_name = "direct in-process fake exec_stream throughput";
    let http_name = "raw bytes in one HTTP response from a trivial axum handler";
    f.add(
        "exec.stream.throughput",
        STREAM_SSE_ROW,
        api_s,
        "MiB/s",
        direct_name,
        direct_s,
        stream_note(api_s, sse_how),
    );
    f.add(
        "exec.stream.frames",
        STREAM_FRAMES_ROW,
        frames_s,
        "MiB/s",
        direct_name,
        direct_s,
        stream_note(frames_s, frames_how),
    );
    f.add(
        "exec.stream.direct",
        direct_name,
        direct_s,
        "MiB/s",
        "itself",
        direct_s,
        stream_note(direct_s, ""),
    );
    f.add(
        "exec.stream.httpRaw",
        http_name,
        http_s,
        "MiB/s",
        direct_name,
        direct_s,
        stream_note(http_s, ""),
    );
    f.add(
        "exec.stream.ofHttpRaw",
        &format!("{STREAM_SSE_ROW}, against bare HTTP"),
        api_s,
        "MiB/s",
        http_name,
        http_s,
        stream_note(api_s, sse_how),
    );
    f.add(
        "exec.stream.frames.ofHttpRaw",
        &format!("{STREAM_FRAMES_ROW}, against bare HTTP"),
        frames_s,
        "MiB/s",
        http_name,
        http_s,
        stream_note(frames_s, frames_how),
    );
    for role in ["api", "scheduler", "worker"] {
        let start = p.rss_start_kib.get(role).map(|k| *k as f64 / 1024.0);
        let idle = p.rss_idle_kib.get(role).map(|k| *k as f64 / 1024.0);
        let load = p.rss_load_kib.get(role).map(|k| *k as f64 / 1024.0);
        f.add(
            &format!("rss.{role}.idle"),
            &format!("RSS {role}, idle with live sandboxes"),
            idle,
            "MiB",
            "RSS right after start (empty)",
            start,
            None,
        );
        f.add(
            &format!("rss.{role}.load"),
            &format!("RSS {role}, peak under load"),
            load,
            "MiB",
            "RSS idle",
            idle,
            None,
        );
    }
    f.add(
        "rss.dev.idle",
        "RSS `differently dev`, idle",
        Some(p.dev.rss_kib as f64 / 1024.0),
        "MiB",
        "P6 limit (30 MB)",
        Some(DEV_RSS_TARGET_KIB / 1024.0),
        Some(format!("after {} ms idle", p.dev.idle_millis)),
    );
    let counted = p.instructions.as_ref();
    f.add(
        "instructions.perSession",
        "instructions per session, our processes (callgrind)",
        counted.map(|i| i.per_session),
        "instructions",
        "itself",
        counted.map(|i| i.per_session),
        Some(counted.map_or_else(
            || "not measured: skipped (--instruction-sessions 0)".to_owned(),
            |i| {
                format!(
                    "{} sessions at {}/s under callgrind, idle work taken out",
                    i.sessions, i.rate
                )
            },
        )),
    );
    v
}
