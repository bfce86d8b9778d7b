//! One module per `/v1` resource, each with its own `router()`; `crate::router` merges them.

pub mod audit;
pub mod events;
pub mod exec;
pub mod exec_frames;
pub mod files;
pub mod lifecycle;
pub mod orgs;
pub mod placement;
pub mod ports;
pub mod sandboxes;
pub mod snapshots;
pub mod trust;
