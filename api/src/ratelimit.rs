//! Per-process token buckets: one per API key (requests) and one per client address
//! (failed authentications), so a leaked or guessed key cannot flood the control plane.
//! Limits are per replica, as in the seeds.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Rate and burst of one family of buckets.
#[derive(Debug, Clone, Copy)]
pub struct Rate {
    pub per_second: f64,
    pub burst: f64,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Token buckets keyed by `K`.
pub struct Buckets<K> {
    rate: Rate,
    map: Mutex<HashMap<K, Bucket>>,
}

/// Most buckets kept before idle ones are dropped.
const MAX_BUCKETS: usize = 100_000;

impl<K: Eq + Hash + Clone> Buckets<K> {
    /// Buckets that refill at `rate`.
    pub fn new(rate: Rate) -> Self {
        Buckets {
            rate,
            map: Mutex::new(HashMap::new()),
        }
    }

    fn refill(&self, b: &mut Bucket, now: Instant) {
        let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + elapsed * self.rate.per_second).min(self.rate.burst);
        b.at = now;
    }

    /// Takes one token; `Err(wait)` when empty, with how long until the next one.
    pub fn take(&self, key: &K) -> Result<(), Duration> {
        let now = Instant::now();
        let mut map = match self.map.lock() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        if map.len() >= MAX_BUCKETS {
            let burst = self.rate.burst;
            let per_second = self.rate.per_second;
            map.retain(|_, b| {
                b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * per_second < burst
            });
        }
        let b = map.entry(key.clone()).or_insert(Bucket {
            tokens: self.rate.burst,
            at: now,
        });
        self.refill(b, now);
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            let missing = 1.0 - b.tokens;
            Err(Duration::from_secs_f64(
                missing / self.rate.per_second.max(1e-9),
            ))
        }
    }

    /// Whether a token is available now, without taking it.
    pub fn has_token(&self, key: &K) -> bool {
        let now = Instant::now();
        let mut map = match self.map.lock() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        match map.get_mut(key) {
            None => true,
            Some(b) => {
                self.refill(b, now);
                b.tokens >= 1.0
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_refuse_then_refill() {
        let b = Buckets::new(Rate {
            per_second: 100.0,
            burst: 3.0,
        });
        for _ in 0..3 {
            assert!(b.take(&"k").is_ok());
        }
        let wait = b.take(&"k").unwrap_err();
        assert!(wait <= Duration::from_millis(11), "{wait:?}");
        assert!(b.take(&"other").is_ok(), "buckets are independent");
        std::thread::sleep(Duration::from_millis(15));
        assert!(b.take(&"k").is_ok());
    }
}
