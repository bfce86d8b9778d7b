//! Every adapter method against the fake, in both variants where they differ, by concern:
//! `settings`, `lifecycle`, `exec`, `process`, `files` and `pause_snapshots_ports`.

use crate::fake_server::Variant;

mod exec;
mod files;
mod lifecycle;
mod pause_snapshots_ports;
mod process;
mod settings;

/// The two behaviours of the fake (the real server's and the spec's) that most cases run against.
const BOTH: [Variant; 2] = [Variant::Real, Variant::Spec];
