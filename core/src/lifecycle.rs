//! The lifecycle transition table: for each status-changing lifecycle operation, the status it
//! may start from and the status it leads to. The API (to answer at once) and the workers (to
//! execute) both read it here, so the two can never disagree about what `pause` means.

use crate::status::can_transition;
use crate::SandboxStatus;

/// A lifecycle operation that moves a sandbox between two statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LifecycleOp {
    /// `running → paused` (memory kept).
    Pause,
    /// `paused → running`.
    Resume,
    /// `running → stopped` (disk kept).
    Stop,
    /// `stopped → running`.
    Start,
}

/// What a lifecycle operation means for a sandbox in a given status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LifecycleStep {
    /// The sandbox is already in the target status: the change is done, with no backend call.
    AlreadyDone,
    /// The sandbox is in the starting status: the change goes ahead.
    Proceed,
    /// The sandbox is elsewhere: the change conflicts.
    Refused,
}

impl LifecycleOp {
    /// Every lifecycle operation, in table order.
    pub const ALL: [LifecycleOp; 4] = [
        LifecycleOp::Pause,
        LifecycleOp::Resume,
        LifecycleOp::Stop,
        LifecycleOp::Start,
    ];

    /// The status the operation may start from.
    pub const fn from(self) -> SandboxStatus {
        match self {
            LifecycleOp::Pause | LifecycleOp::Stop => SandboxStatus::Running,
            LifecycleOp::Resume => SandboxStatus::Paused,
            LifecycleOp::Start => SandboxStatus::Stopped,
        }
    }

    /// The status the operation leads to.
    pub const fn to(self) -> SandboxStatus {
        match self {
            LifecycleOp::Pause => SandboxStatus::Paused,
            LifecycleOp::Resume | LifecycleOp::Start => SandboxStatus::Running,
            LifecycleOp::Stop => SandboxStatus::Stopped,
        }
    }

    /// What the operation means for a sandbox now in `current`: repeating a transition into
    /// the current status is done already; anything but the starting status is refused.
    pub fn step(self, current: SandboxStatus) -> LifecycleStep {
        if current == self.to() {
            LifecycleStep::AlreadyDone
        } else if current == self.from() && can_transition(self.from(), self.to()) {
            LifecycleStep::Proceed
        } else {
            LifecycleStep::Refused
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use SandboxStatus::*;

    #[test]
    fn the_table_is_pinned() {
        let table: Vec<_> = LifecycleOp::ALL
            .into_iter()
            .map(|op| (op, op.from(), op.to()))
            .collect();
        assert_eq!(
            table,
            vec![
                (LifecycleOp::Pause, Running, Paused),
                (LifecycleOp::Resume, Paused, Running),
                (LifecycleOp::Stop, Running, Stopped),
                (LifecycleOp::Start, Stopped, Running),
            ]
        );
    }

    #[test]
    fn every_entry_is_a_legal_transition() {
        for op in LifecycleOp::ALL {
            assert!(can_transition(op.from(), op.to()), "{op:?}");
        }
    }

    #[test]
    fn steps_follow_the_current_status() {
        for op in LifecycleOp::ALL {
            for s in SandboxStatus::ALL {
                let want = if s == op.to() {
                    LifecycleStep::AlreadyDone
                } else if s == op.from() {
                    LifecycleStep::Proceed
                } else {
                    LifecycleStep::Refused
                };
                assert_eq!(op.step(s), want, "{op:?} from {s}");
            }
        }
    }
}
