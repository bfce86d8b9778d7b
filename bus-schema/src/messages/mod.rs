//! The bodies of bus messages. Each is written out field by field here rather than embedding
//! core's types, so a change to core cannot silently change the wire; golden fixtures
//! (`tests/golden`) pin every one. None carries secret material: sandbox env values,
//! credentials and idempotency keys stay in the store.

mod admit;
mod status;
mod work;

use serde::{Deserialize, Serialize};

pub use admit::{Admitted, QueuedSandbox, QueuedSpec};
pub use status::{AuditHead, SandboxState, StatusChanged, StatusOnly};
pub use work::{Terminating, WarmWork, Work, WorkOp};

/// CPU, memory and disk, as the bus carries them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireResources {
    pub cpu: u32,
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    #[serde(rename = "diskGiB")]
    pub disk_gib: u64,
}

impl From<differently_core::Resources> for WireResources {
    fn from(r: differently_core::Resources) -> Self {
        WireResources {
            cpu: r.cpu,
            memory_mib: r.memory_mib,
            disk_gib: r.disk_gib,
        }
    }
}

impl From<WireResources> for differently_core::Resources {
    fn from(r: WireResources) -> Self {
        differently_core::Resources {
            cpu: r.cpu,
            memory_mib: r.memory_mib,
            disk_gib: r.disk_gib,
        }
    }
}
