//! Latency summaries (nearest-rank percentiles) and throughput figures.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Percentiles of a set of latency samples, in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// Number of samples.
    pub count: usize,
    /// Arithmetic mean.
    pub mean_ms: f64,
    /// Median.
    pub p50_ms: f64,
    /// 95th percentile.
    pub p95_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Largest sample.
    pub max_ms: f64,
}

/// Summarizes `samples` (any order). An empty set gives all zeros with `count: 0`.
pub fn summarize(samples: &[Duration]) -> Summary {
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    summarize_ms(&mut ms)
}

/// Summarizes samples given in milliseconds (sorted in place).
pub fn summarize_ms(ms: &mut [f64]) -> Summary {
    if ms.is_empty() {
        return Summary::default();
    }
    ms.sort_by(f64::total_cmp);
    let sum: f64 = ms.iter().sum();
    Summary {
        count: ms.len(),
        mean_ms: sum / ms.len() as f64,
        p50_ms: percentile(ms, 0.50),
        p95_ms: percentile(ms, 0.95),
        p99_ms: percentile(ms, 0.99),
        max_ms: ms[ms.len() - 1],
    }
}

/// Nearest-rank percentile of sorted, non-empty `sorted`; `q` in `[0, 1]`.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Operations completed over a measured wall time.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Throughput {
    /// Operations completed.
    pub ops: u64,
    /// Wall time they took, in seconds.
    pub seconds: f64,
    /// `ops / seconds`.
    pub per_second: f64,
    /// Per-operation latency.
    pub latency: Summary,
}

impl Throughput {
    /// Builds the figure from a count, the wall time and per-operation latencies.
    pub fn new(ops: u64, wall: Duration, latencies: &[Duration]) -> Throughput {
        let seconds = wall.as_secs_f64();
        Throughput {
            ops,
            seconds,
            per_second: if seconds > 0.0 {
                ops as f64 / seconds
            } else {
                0.0
            },
            latency: summarize(latencies),
        }
    }
}

/// The same byte count transferred several times: every repetition's rate and their median.
/// The median, not the mean, because one repetition slowed by a neighbour on the shared
/// machine should not move the figure.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamRate {
    /// Payload bytes of each repetition (each one was counted and matched this).
    pub bytes: u64,
    /// Wall time of each repetition, in seconds, in run order.
    pub seconds: Vec<f64>,
    /// Payload bytes per second of each repetition, in run order.
    pub bytes_per_second: Vec<f64>,
    /// Median of `bytes_per_second` (mean of the two middle ones for an even count).
    pub median_bytes_per_second: f64,
}

impl StreamRate {
    /// Builds the figure from the byte count and the wall time of each repetition.
    pub fn new(bytes: u64, walls: &[Duration]) -> StreamRate {
        let seconds: Vec<f64> = walls.iter().map(Duration::as_secs_f64).collect();
        let bytes_per_second: Vec<f64> = seconds
            .iter()
            .map(|s| if *s > 0.0 { bytes as f64 / s } else { 0.0 })
            .collect();
        let mut sorted = bytes_per_second.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median_bytes_per_second = match n {
            0 => 0.0,
            _ if n % 2 == 1 => sorted[n / 2],
            _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
        };
        StreamRate {
            bytes,
            seconds,
            bytes_per_second,
            median_bytes_per_second,
        }
    }

    /// The median in MiB/s, the unit the report prints.
    pub fn median_mib_per_second(&self) -> f64 {
        self.median_bytes_per_second / (1024.0 * 1024.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = summarize_ms(&mut v);
        assert_eq!(
            (s.p50_ms, s.p95_ms, s.p99_ms, s.max_ms),
            (50.0, 95.0, 99.0, 100.0)
        );
        assert_eq!(s.count, 100);
        assert!((s.mean_ms - 50.5).abs() < 1e-9);
        assert_eq!(percentile(&[7.0], 0.99), 7.0);
        assert_eq!(summarize(&[]).count, 0);
    }

    #[test]
    fn throughput_handles_zero_time() {
        assert_eq!(Throughput::new(5, Duration::ZERO, &[]).per_second, 0.0);
        let t = Throughput::new(10, Duration::from_secs(2), &[Duration::from_millis(3)]);
        assert_eq!(t.per_second, 5.0);
        assert_eq!(t.latency.p50_ms, 3.0);
    }

    #[test]
    fn stream_rate_takes_the_median() {
        let ms = Duration::from_millis;
        let r = StreamRate::new(1000, &[ms(1000), ms(100), ms(500)]);
        assert_eq!(r.bytes_per_second, vec![1000.0, 10_000.0, 2000.0]);
        assert_eq!(r.median_bytes_per_second, 2000.0);
        let even = StreamRate::new(1000, &[ms(1000), ms(500)]);
        assert_eq!(even.median_bytes_per_second, 1500.0);
        assert_eq!(StreamRate::new(1, &[]).median_bytes_per_second, 0.0);
    }
}
