//! The adapter contract and the adapters. One adapter instance serves one pool.
//!
//! Contract (design doc §10): `create` is idempotent on the sandbox id (look the id up among
//! the backend's instances before creating); `delete` of a missing instance succeeds; every
//! instance is tagged with the sandbox id and the installation id; an operation the adapter
//! does not implement answers `AdapterError::Unsupported`, never a silent degrade.

pub mod agent_sandbox;
pub mod azure_sessions;
pub mod cloudflare;
pub mod conformance;
pub mod contract;
pub mod credentials;
pub mod daytona;
pub mod devhost;
pub mod e2b;
pub mod error;
pub mod exec_output;
pub mod fake;
pub mod files;
pub mod freestyle;
pub mod go_ahead;
pub mod http;
pub mod kit;
pub mod local_fs;
pub mod local_pty;
pub mod metered;
pub mod opensandbox;
pub mod plugin_server;
pub mod poll;
pub mod pools;
pub mod process;
pub mod registry;
pub mod remote;
pub mod runloop;
pub mod settings;
pub mod vercel;

pub use contract::*;
pub use error::{AdapterError, PathError, PathProblem, Reason};
