//! The adapter kit: what every HTTP provider needs, written once, so a new provider is its
//! own folder plus one registry row and copies no other provider's code.
//!
//! - settings: [`parse`] (errors name the key), the checks in [`crate::settings`]
//!   (credential references, base URLs, CA bundles, timeouts), [`ConfigError`]; the shared
//!   keys declared by [`config`]'s `pool_config!` (credential, CA bundle) and `timeouts!`;
//! - construction: [`FromSettings`] and [`build`] (the registry row), [`build_client`];
//! - HTTP: [`crate::http::HttpClient`] with `send_ok`/`json`/`error_of`, whose error answers
//!   go through the provider's [`ErrorMapper`], usually [`Statuses::map`] after the
//!   provider's own cases;
//! - commands as one `sh -c` line, for providers whose exec takes a string: [`shell`];
//! - instances: [`tags`] (create tags, lookup by sandbox, listing by installation);
//! - files listed by a command in the sandbox: [`listing`] (`find -printf` records);
//!   uploads as a form: [`multipart`];
//! - exec: [`crate::Adapter::exec`] defaults to collecting `exec_stream`; helpers for stdin,
//!   commands and paths in [`crate::exec_output`] and [`paths`].
//!
//! `/work/notes/KIT-READY.md`'s skeleton and `docs/providers.md` show it in use.

pub mod answers;
pub mod build;
pub mod client;
pub mod config;
pub mod errors;
pub mod listing;
pub mod multipart;
pub mod paths;
pub mod shell;
pub mod tags;

pub(crate) use build::from_settings;
pub use build::{build, parse, AdapterConfigError, FromSettings};
pub(crate) use client::bearer_key_client;
pub use client::{build_client, ClientSettings, KeyHeader};
pub(crate) use config::{pool_config, timeouts};
pub use errors::{ErrorAnswer, ProviderError, Statuses};
pub use tags::{Tagged, INSTALLATION_TAG, SANDBOX_TAG};

pub use crate::credentials::{CredentialRef, Credentials};
pub use crate::exec_output::{check_command, exec_collected, millis, stdin_of, timed_exit};
pub use crate::http::{ErrorMapper, HttpClient, Secret};
pub use crate::settings::ConfigError;
