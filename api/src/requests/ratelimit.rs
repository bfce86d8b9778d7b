//! Per-process token buckets: one per API key (requests), and for failed authentications
//! one per presented key id or client address (`auth::throttle`), so a leaked or guessed key
//! cannot flood the control plane.
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

/// Token buckets keyed by `K`, at most `max` of them: keys are caller-chosen (presented key
/// ids, addresses), so a flood of new ones must not grow memory without bound.
pub struct Buckets<K> {
    rate: Rate,
    max: usize,
    map: Mutex<HashMap<K, Bucket>>,
}

/// Most buckets kept by default.
pub const MAX_BUCKETS: usize = 100_000;

impl<K: Eq + Hash + Clone> Buckets<K> {
    /// Buckets that refill at `rate`, at most `MAX_BUCKETS` of them.
    pub fn new(rate: Rate) -> Self {
        Self::with_max(rate, MAX_BUCKETS)
    }

    /// Buckets that refill at `rate`, at most `max` (at least 1) of them.
    pub fn with_max(rate: Rate, max: usize) -> Self {
        Buckets {
            rate,
            max: max.max(1),
            map: Mutex::new(HashMap::new()),
        }
    }

    /// How many buckets are held now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no bucket is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, Bucket>> {
        match self.map.lock() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        }
    }

    /// Makes room for one more bucket: first drops the ones refilled to full (they hold no
    /// state a new bucket would not), then, if that is not enough, the least recently used
    /// tenth, so a flood of new keys costs one sort per `max / 10` of them.
    fn make_room(&self, map: &mut HashMap<K, Bucket>, now: Instant) {
        if map.len() < self.max {
            return;
        }
        let Rate { per_second, burst } = self.rate;
        map.retain(|_, b| {
            b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * per_second < burst
        });
        if map.len() < self.max {
            return;
        }
        let keep = self.max - (self.max / 10).max(1);
        let mut ages: Vec<(Instant, K)> = map.iter().map(|(k, b)| (b.at, k.clone())).collect();
        ages.sort_unstable_by_key(|(at, _)| *at);
        let drop = ages.len().saturating_sub(keep);
        for (_, k) in ages.into_iter().take(drop) {
            map.remove(&k);
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
        let mut map = self.lock();
        if !map.contains_key(key) {
            self.make_room(&mut map, now);
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
        self.wait(key).is_none()
    }

    /// `None` when a token is available now (without taking it), else how long until one is.
    pub fn wait(&self, key: &K) -> Option<Duration> {
        let now = Instant::now();
        let mut map = self.lock();
        let b = map.get_mut(key)?;
        self.refill(b, now);
        (b.tokens < 1.0)
            .then(|| Duration::from_secs_f64((1.0 - b.tokens) / self.rate.per_second.max(1e-9)))
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

    #[test]
    fn a_flood_of_new_keys_stays_within_the_bound() {
        let b = Buckets::with_max(
            Rate {
                per_second: 0.001,
                burst: 5.0,
            },
            100,
        );
        for i in 0..10_000u32 {
            let _ = b.take(&i);
            assert!(b.len() <= 100, "{} buckets after {i}", b.len());
        }
        // The newest keys are kept: the latest one is still counted.
        for _ in 0..4 {
            let _ = b.take(&9_999);
        }
        assert!(
            b.wait(&9_999).is_some(),
            "the newest bucket survives eviction"
        );
    }
}
