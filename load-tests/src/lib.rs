//! Load harness for Differently: starts a real three-process control plane (api, scheduler,
//! worker) on a fresh Postgres database and a private nats-server, measures raw Postgres and
//! JetStream baselines in the same run, drives the HTTP API with a mix of creates, execs and
//! deletes, checks the invariants from Postgres and the fake backend's ledger, and reports
//! every figure as an absolute number and as a ratio to its baseline.
//!
//! The machine it runs on is shared and noisy, so ratios to same-run baselines are the
//! figures to compare across runs; absolute numbers say what this run saw.

pub mod baseline;
pub mod client;
pub mod cluster;
pub mod cpu;
pub mod dev;
pub mod diag;
pub mod error;
pub mod faults;
pub mod frames;
pub mod generator;
pub mod instructions;
pub mod invariants;
pub mod opensandbox;
pub mod opensandbox_client;
pub mod opensandbox_warm;
pub mod plan;
pub mod pull_bench;
pub mod report;
pub mod rss;
pub mod run;
pub mod sse;
pub mod stats;
pub mod structure;

pub use error::LoadError;
pub use plan::Plan;
pub use report::Report;
pub use run::run;
