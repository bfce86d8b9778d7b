//! End-to-end tests: the real `differently` binary as separate OS processes (api, scheduler,
//! worker) on a real Postgres database and a real nats-server ≥ 2.10, with the `fake`
//! backend's cross-process ledger as the witness of every backend call.
#![allow(clippy::unwrap_used)] // test helpers may panic: that is how a test fails

mod harness;

mod audit;
mod bad_input;
mod client_cli;
mod crash;
mod dataplane;
mod dev;
mod idempotency;
mod lifecycle;
mod observability;
mod openapi;
mod placement;
mod quota;
mod schemathesis;
mod spine;
mod tenancy;
