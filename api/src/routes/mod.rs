//! One module per `/v1` resource, each with its own `router()`; `crate::router` merges them.

pub mod audit;
pub mod events;
pub mod exec;
pub mod exec_frames;
pub mod files;
pub mod keys;
pub mod lifecycle;
pub mod orgs;
pub mod placement;
pub mod policies;
pub mod pools;
pub mod ports;
pub mod projects;
pub mod quotas;
pub mod sandboxes;
pub mod snapshots;
pub mod trust;
