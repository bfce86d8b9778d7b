//! Domain types of Differently: ids, wire types, error codes, the sandbox state machine,
//! resources, accounting, first-fit placement and fair order.
//!
//! Pure on purpose: no I/O and no async runtime, so every rule here is a plain function that
//! the API, the scheduler, the workers and the stores share and that tests exercise directly.
//! The one exception is [`request_id`], a task-local the API sets and the store reads.

pub mod accounting;
pub mod capability;
pub mod capped;
pub mod error;
pub mod exec;
pub mod fair;
pub mod faults;
pub mod ids;
pub mod lifecycle;
pub mod policy;
pub mod pool;
pub mod process;
pub mod request_id;
pub mod resources;
pub mod sandbox;
pub mod status;
pub mod tenancy;
pub mod wait_reason;
pub mod warm;

pub use error::{ErrorCode, FieldError};
pub use ids::{KeyId, OrgId, ProjectId, SandboxId};
pub use resources::Resources;
pub use sandbox::{CreateSandboxRequest, Sandbox, SandboxSpec};
pub use status::SandboxStatus;
