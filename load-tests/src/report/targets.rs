//! The targets' verdicts, met or missed, from the same measurements as the figures.

use super::*;

pub(super) fn verdict(met: bool) -> String {
    if met { "met" } else { "missed" }.to_owned()
}

/// Target verdicts.
pub fn targets(plan: &Plan, b: &Baselines, p: &Phases) -> Vec<TargetResult> {
    let adm = p.burst_sustained.admissions.per_second;
    let pg8 = b.pg_insert_8.per_second;
    let adm_ratio = if pg8 > 0.0 { adm / pg8 } else { 0.0 };
    let act = p.burst_leader_backlog.activation.per_second;
    let c = &p.fixed_rate.to_running;
    let lat = plan.latency_ms as f64;
    let (o50, o99) = (c.p50_ms - lat, c.p99_ms - lat);
    let p3_rate_note = if plan.rate == 200 {
        String::new()
    } else {
        format!(
            " (measured at {}/s; the target is defined at 200/s)",
            plan.rate
        )
    };
    let exec_over = p.exec_via_api.p50_ms - b.direct_fake_exec.p50_ms;
    let dev_mb = p.dev.rss_kib as f64 * 1024.0 / 1e6;
    vec![
        TargetResult {
            id: "P1".into(),
            target: "admissions ≥ 1,000/s and ≥ 0.3× raw Postgres tx/s".into(),
            status: verdict(adm >= 1000.0 && adm_ratio >= 0.3),
            measured: format!("{adm:.0}/s = {adm_ratio:.2}× Postgres 8-conn {pg8:.0} tx/s"),
        },
        TargetResult {
            id: "P2".into(),
            target: "activations ≥ 1,000/s".into(),
            status: verdict(act >= 1000.0),
            measured: format!(
                "{act:.0}/s = {:.2}× Postgres 1-conn {:.0} tx/s",
                if b.pg_insert_1.per_second > 0.0 { act / b.pg_insert_1.per_second } else { 0.0 },
                b.pg_insert_1.per_second
            ),
        },
        TargetResult {
            id: "P3".into(),
            target: "create→running overhead p50 ≤ 5 ms, p99 ≤ 25 ms at 200 creates/s".into(),
            status: verdict(o50 <= 5.0 && o99 <= 25.0 && p.fixed_rate.failed == 0 && p.fixed_rate.shed == 0),
            measured: format!(
                "p50 {o50:.1} ms ({:.1}× 5 ms), p99 {o99:.1} ms ({:.1}× 25 ms), achieved {:.0}/s{p3_rate_note}",
                o50 / 5.0,
                o99 / 25.0,
                p.fixed_rate.achieved_rate
            ),
        },
        TargetResult {
            id: "P4".into(),
            target: "exec overhead p50 ≤ 1 ms over a direct backend call".into(),
            status: verdict(exec_over <= 1.0),
            measured: format!(
                "{exec_over:.2} ms ({:.2}× 1 ms): API {:.2} ms vs direct fake {:.3} ms; a bare HTTP hop is {:.2} ms",
                exec_over,
                p.exec_via_api.p50_ms,
                b.direct_fake_exec.p50_ms,
                b.trivial_http.p50_ms
            ),
        },
        p4s(p, b),
        TargetResult {
            id: "P6".into(),
            target: "`differently dev` idle RSS ≤ 30 MB".into(),
            status: verdict(dev_mb <= 30.0),
            measured: format!("{dev_mb:.1} MB ({:.2}× 30 MB)", dev_mb / 30.0),
        },
    ]
}

/// P4s: streamed output via the API ≥ 0.8× the in-process fake's own streaming rate, judged
/// on the faster of the two response formats (a client that wants throughput picks it), and
/// naming which. Not measurable when the route is not served (older binaries), so the table
/// still says why.
pub(super) fn p4s(p: &Phases, b: &Baselines) -> TargetResult {
    let target = "streamed exec output ≥ 0.8× direct throughput".to_owned();
    let formats = [
        ("SSE", &p.exec_stream_via_api),
        ("binary frames", &p.exec_stream_frames_via_api),
    ];
    let best = formats
        .iter()
        .filter_map(|(name, r)| r.as_ref().map(|r| (*name, r)))
        .max_by(|x, y| {
            x.1.median_bytes_per_second
                .total_cmp(&y.1.median_bytes_per_second)
        });
    let (Some((best_name, api)), Some(direct)) = (best, &b.direct_fake_exec_stream) else {
        return TargetResult {
            id: "P4s".into(),
            target,
            status: "not measurable yet".into(),
            measured: match p.exec_stream_status {
                Some(s) => {
                    format!("POST …/exec/stream answers HTTP {s}: streamed exec is not served yet")
                }
                None => "streamed exec is not served yet".into(),
            },
        };
    };
    let (a, d) = (api.median_mib_per_second(), direct.median_mib_per_second());
    let of_direct = |x: f64| if d > 0.0 { x / d } else { 0.0 };
    let r = of_direct(a);
    let others: String = formats
        .iter()
        .filter(|(name, _)| *name != best_name)
        .filter_map(|(name, rate)| rate.as_ref().map(|rate| (name, rate)))
        .map(|(name, rate)| {
            let m = rate.median_mib_per_second();
            format!("; {name}: {} MiB/s ({:.3}×)", num(Some(m)), of_direct(m))
        })
        .collect();
    let hop = match &b.trivial_http_stream {
        Some(h) => {
            let h = h.median_mib_per_second();
            format!(
                "; bare HTTP moves {} MiB/s ({:.3}× direct), the API via {best_name} {:.3}× that",
                num(Some(h)),
                of_direct(h),
                if h > 0.0 { a / h } else { 0.0 }
            )
        }
        None => String::new(),
    };
    TargetResult {
        id: "P4s".into(),
        target,
        status: verdict(r >= 0.8),
        measured: format!(
            "via {best_name}: {} MiB/s = {r:.3}× direct in-process fake {} MiB/s (median of {} × {:.1} MiB){others}{hop}",
            num(Some(a)),
            num(Some(d)),
            api.seconds.len(),
            api.bytes as f64 / (1024.0 * 1024.0)
        ),
    }
}
