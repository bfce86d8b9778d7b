//! Polling a backend until something holds (a state reached, an agent answering). The first
//! check comes 10 ms after the first miss and the gap doubles up to a ceiling (an adapter's
//! configured poll interval): a state that settles in 50 ms is seen within a few ms of it
//! instead of a whole interval later, and a slow one costs no more requests than a fixed
//! interval would. Measured on a real OpenSandbox: the first execd `/ping` after Running often
//! gets a 502, and a fixed 500 ms interval made 2 creates in 10 take ~1.25 s instead of ~0.7 s.

use std::time::{Duration, Instant};

/// The gap after the first miss.
pub const FIRST_GAP: Duration = Duration::from_millis(10);

/// One wait: gaps from [`FIRST_GAP`] doubling to `ceiling`, never past the deadline.
#[derive(Debug, Clone)]
pub struct Poll {
    gap: Duration,
    ceiling: Duration,
    deadline: Instant,
}

impl Poll {
    /// A wait of at most `timeout` whose gaps grow to `ceiling`.
    pub fn new(ceiling: Duration, timeout: Duration) -> Poll {
        Poll {
            gap: FIRST_GAP.min(ceiling),
            ceiling,
            deadline: Instant::now() + timeout,
        }
    }

    /// Whether the wait's time is up.
    pub fn expired(&self) -> bool {
        Instant::now() >= self.deadline
    }

    /// The next gap, then the one after it doubled (up to the ceiling).
    fn next_gap(&mut self) -> Duration {
        let gap = self.gap;
        self.gap = (self.gap * 2).min(self.ceiling);
        gap
    }

    /// Sleeps until the next check (cut short at the deadline).
    pub async fn pause(&mut self) {
        let left = self.deadline.saturating_duration_since(Instant::now());
        tokio::time::sleep(self.next_gap().min(left)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_start_at_10_ms_and_double_to_the_ceiling() {
        let mut p = Poll::new(Duration::from_millis(500), Duration::from_secs(60));
        let gaps: Vec<u128> = (0..9).map(|_| p.next_gap().as_millis()).collect();
        assert_eq!(gaps, [10, 20, 40, 80, 160, 320, 500, 500, 500]);
        let mut tight = Poll::new(Duration::from_millis(3), Duration::from_secs(1));
        assert_eq!(
            tight.next_gap(),
            Duration::from_millis(3),
            "never above the ceiling"
        );
    }

    #[tokio::test]
    async fn a_pause_never_outlasts_the_deadline() {
        let mut p = Poll::new(Duration::from_secs(30), Duration::from_millis(30));
        for _ in 0..3 {
            p.next_gap();
        }
        let started = Instant::now();
        p.pause().await;
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        assert!(p.expired());
    }
}
