//! The `/v1` router in process: built on the memory store, the memory bus and a fake pool,
//! called through `tower::ServiceExt::oneshot` (no listener, no other process). The
//! multi-process behaviour is the e2e suite's (`cli/tests/e2e`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

mod audit_outcomes;
mod auth;
mod bounds;
mod data_plane;
mod documented;
mod envelope;
mod errors;
mod event_causes;
mod events;
mod facade_duplicate_keys;
mod files;
mod http_limits;
mod keep_alive;
mod key_lineage;
mod lifecycle;
mod list_queries;
mod listener;
mod mcp_errors;
mod nul;
mod opensandbox_facade;
mod opensandbox_facade_commands;
mod opensandbox_facade_pty;
mod pool_backend;
mod processes_follow;
mod pty;
mod pty_browser;
mod queue;
mod refusal_dialects;
mod refusals;
mod sandboxes;
mod schemathesis_finds;
mod snapshot_pages;
mod snapshots;
mod ui;
mod wait;
mod warm;
mod webhooks;
