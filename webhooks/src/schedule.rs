//! When a failed delivery is tried again: exponential back-off with jitter, for up to a
//! day after the event first went out.

use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::Rng;

/// The retry schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The wait after the first failure (before jitter).
    pub initial: Duration,
    /// No wait is longer than this.
    pub max: Duration,
    /// No attempt is made later than this after the delivery was created.
    pub retry_for: Duration,
}

impl Default for Backoff {
    /// 5 s, doubling up to 2 h, for 24 h: 20 to 35 attempts over a day (jitter decides).
    fn default() -> Self {
        Backoff {
            initial: Duration::from_secs(5),
            max: Duration::from_secs(2 * 3600),
            retry_for: Duration::from_secs(24 * 3600),
        }
    }
}

impl Backoff {
    /// The wait after `attempts` failed attempts (1 = the first), before jitter.
    pub fn base_delay(&self, attempts: u32) -> Duration {
        let exp = attempts.saturating_sub(1).min(31);
        self.initial
            .checked_mul(1u32 << exp)
            .unwrap_or(self.max)
            .min(self.max)
    }

    /// When to try again after `attempts` failures of a delivery created at `created`, or
    /// `None` when that would be past `retry_for` (the delivery fails). The wait is drawn
    /// uniformly from [½, 1] of the base delay, so receivers that failed together do not
    /// get their retries all at once.
    pub fn next_attempt(
        &self,
        attempts: u32,
        created: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        let base = self.base_delay(attempts);
        let ms = u64::try_from(base.as_millis()).unwrap_or(u64::MAX);
        let jittered = if ms < 2 {
            ms
        } else {
            rand::rng().random_range(ms / 2..=ms)
        };
        let at = now + chrono::Duration::milliseconds(i64::try_from(jittered).unwrap_or(i64::MAX));
        let deadline = created + chrono::Duration::from_std(self.retry_for).ok()?;
        (at <= deadline).then_some(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap() {
        let b = Backoff::default();
        assert_eq!(b.base_delay(1), Duration::from_secs(5));
        assert_eq!(b.base_delay(2), Duration::from_secs(10));
        assert_eq!(b.base_delay(5), Duration::from_secs(80));
        assert_eq!(b.base_delay(20), Duration::from_secs(7200));
        assert_eq!(b.base_delay(u32::MAX), Duration::from_secs(7200));
    }

    #[test]
    fn retries_are_jittered_and_stop_after_a_day() {
        let b = Backoff::default();
        let t0 = Utc::now();
        for attempts in 1..10 {
            let at = b.next_attempt(attempts, t0, t0).unwrap();
            let wait = (at - t0).to_std().unwrap();
            let base = b.base_delay(attempts);
            assert!(wait >= base / 2 && wait <= base, "{attempts}: {wait:?}");
        }
        let late = t0 + chrono::Duration::hours(23) + chrono::Duration::minutes(59);
        assert_eq!(b.next_attempt(20, t0, late), None);
        // The whole schedule: attempts until the day is over.
        let (mut now, mut n) = (t0, 0);
        while let Some(at) = b.next_attempt(n + 1, t0, now) {
            now = at;
            n += 1;
        }
        assert!((18..=40).contains(&n), "{n} retries in a day");
    }
}
