//! Test-only fault points: named places in the code where a process can be told to pause,
//! so a crash test can `kill -9` it at exactly that moment. Parsed from
//! `DIFFERENTLY_FAULT_PAUSE="point:millis,point:millis"`; empty in production.

use std::collections::HashMap;
use std::time::Duration;

/// After the worker's backend create returned and before the activation commit.
pub const WORKER_AFTER_CREATE: &str = "worker.after_create";
/// After the worker's backend delete returned and before the `terminated` commit.
pub const WORKER_AFTER_DELETE: &str = "worker.after_delete";
/// After the worker's start of a stopped sandbox reserved its room (the row is `running`) and
/// before the backend start.
pub const WORKER_AFTER_START_RESERVE: &str = "worker.after_start_reserve";
/// After a worker's claim call on a warm instance returned (`Adapter::claim`) and before the
/// sandbox is recorded `running`: a crash here leaves a call made and a row `provisioning`.
pub const WORKER_AFTER_CLAIM_CALL: &str = "worker.after_claim_call";
/// After the API committed an admission and before it published to the bus.
pub const API_AFTER_ADMIT_COMMIT: &str = "api.after_admit_commit";

/// Configured pauses by fault point.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    pauses: HashMap<String, Duration>,
}

impl Faults {
    /// Parses the environment variable's value; malformed entries are ignored.
    pub fn parse(spec: &str) -> Faults {
        let pauses = spec
            .split(',')
            .filter_map(|item| {
                let (point, ms) = item.trim().split_once(':')?;
                Some((point.to_owned(), Duration::from_millis(ms.parse().ok()?)))
            })
            .collect();
        Faults { pauses }
    }

    /// How long to pause at `point`, if at all.
    pub fn pause_at(&self, point: &str) -> Option<Duration> {
        self.pauses.get(point).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_points() {
        let f = Faults::parse("worker.after_create:500, x:bad");
        assert_eq!(
            f.pause_at(WORKER_AFTER_CREATE),
            Some(Duration::from_millis(500))
        );
        assert_eq!(f.pause_at("x"), None);
        assert_eq!(Faults::parse("").pause_at("y"), None);
    }
}
