//! The sandbox state machine and the accounting rules per status (seeds' architecture §8).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Where a sandbox is in its life.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    PartialOrd,
    Ord,
    utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum SandboxStatus {
    Queued,
    Provisioning,
    Running,
    Paused,
    Stopped,
    Terminating,
    Terminated,
    Failed,
}

use SandboxStatus::*;

impl SandboxStatus {
    /// Every status, in lifecycle order.
    pub const ALL: [SandboxStatus; 8] = [
        Queued,
        Provisioning,
        Running,
        Paused,
        Stopped,
        Terminating,
        Terminated,
        Failed,
    ];

    /// The wire form.
    pub fn as_str(self) -> &'static str {
        match self {
            Queued => "queued",
            Provisioning => "provisioning",
            Running => "running",
            Paused => "paused",
            Stopped => "stopped",
            Terminating => "terminating",
            Terminated => "terminated",
            Failed => "failed",
        }
    }

    /// No transition leaves a final status.
    pub fn is_final(self) -> bool {
        matches!(self, Terminated | Failed)
    }

    /// Counts toward the active-sandbox quota.
    pub fn counts_active(self) -> bool {
        matches!(
            self,
            Provisioning | Running | Paused | Stopped | Terminating
        )
    }

    /// Reserves CPU and memory (a paused sandbox is accounted as resident).
    pub fn reserves_compute(self) -> bool {
        matches!(self, Provisioning | Running | Paused | Terminating)
    }

    /// Counts toward the disk quota.
    pub fn counts_disk(self) -> bool {
        self.counts_active()
    }

    /// Holds one of its pool's concurrency slots.
    pub fn holds_pool_slot(self) -> bool {
        self.counts_active()
    }
}

/// The one rule of which status changes are legal. Every write checks it.
pub fn can_transition(from: SandboxStatus, to: SandboxStatus) -> bool {
    matches!(
        (from, to),
        (Queued, Provisioning | Terminated | Failed)
            | (Provisioning, Running | Queued | Failed | Terminating)
            | (Running, Stopped | Paused | Terminating | Failed)
            | (Stopped, Running | Terminating | Failed)
            | (Paused, Running | Terminating | Failed)
            | (Terminating, Terminated | Failed)
    )
}

impl fmt::Display for SandboxStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SandboxStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| {
                let all: Vec<_> = Self::ALL.iter().map(|s| s.as_str()).collect();
                format!("unknown status {s:?}; expected one of {}", all.join(", "))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn final_statuses_have_no_exit() {
        for from in SandboxStatus::ALL.into_iter().filter(|s| s.is_final()) {
            for to in SandboxStatus::ALL {
                assert!(!can_transition(from, to), "{from} -> {to}");
            }
        }
    }

    #[test]
    fn documented_edges_are_legal_and_shortcuts_are_not() {
        assert!(can_transition(Queued, Provisioning));
        assert!(can_transition(Queued, Terminated));
        assert!(can_transition(Provisioning, Queued));
        assert!(can_transition(Running, Terminating));
        assert!(can_transition(Terminating, Terminated));
        assert!(!can_transition(Queued, Running));
        assert!(!can_transition(Running, Terminated));
        assert!(!can_transition(Running, Queued));
        assert!(!can_transition(Paused, Stopped));
        for s in SandboxStatus::ALL {
            assert!(!can_transition(s, s), "self loop {s}");
        }
    }

    #[test]
    fn every_non_final_status_can_reach_a_final_one() {
        for s in SandboxStatus::ALL.into_iter().filter(|s| !s.is_final()) {
            let mut seen = vec![s];
            let mut i = 0;
            while i < seen.len() {
                for t in SandboxStatus::ALL {
                    if can_transition(seen[i], t) && !seen.contains(&t) {
                        seen.push(t);
                    }
                }
                i += 1;
            }
            assert!(seen.iter().any(|x| x.is_final()), "{s} is a trap");
        }
    }

    #[test]
    fn accounting_table_matches_the_seeds() {
        let row = |s: SandboxStatus| {
            (
                s.counts_active(),
                s.reserves_compute(),
                s.counts_disk(),
                s.holds_pool_slot(),
            )
        };
        assert_eq!(row(Queued), (false, false, false, false));
        assert_eq!(row(Provisioning), (true, true, true, true));
        assert_eq!(row(Running), (true, true, true, true));
        assert_eq!(row(Paused), (true, true, true, true));
        assert_eq!(row(Stopped), (true, false, true, true));
        assert_eq!(row(Terminating), (true, true, true, true));
        assert_eq!(row(Terminated), (false, false, false, false));
        assert_eq!(row(Failed), (false, false, false, false));
    }

    #[test]
    fn parses_its_own_wire_form() {
        for s in SandboxStatus::ALL {
            assert_eq!(s.as_str().parse::<SandboxStatus>(), Ok(s));
        }
        assert!("Running".parse::<SandboxStatus>().is_err());
    }
}
