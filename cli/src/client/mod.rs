//! Client commands over the public `/v1` API (`differently sandbox …`, `process`, `snapshot`,
//! `events`, `webhooks`, `org`, `project`, `key`, `quota`, `policy`, `admin …`, `login`): the calls an application
//! makes, through `differently-client`, for operators and scripts. Answers are printed as JSON,
//! a table or ids (`-o`); errors name their stable code on stderr, never the key.

pub mod admin;
pub mod events;
pub mod files;
pub mod output;
pub mod process;
pub mod profile;
pub mod public_events;
pub mod sandbox;
pub mod shell;
pub mod snapshot;
pub mod tenancy;
pub mod terminal;
pub mod webhooks;

use std::io::IsTerminal;
use std::process::ExitCode;

use differently_client::Client;

pub use output::{Output, Printer};

/// Where the API is and which key to use: flags, then `DIFFERENTLY_*`, then the profile.
#[derive(clap::Args, Debug, Clone)]
pub struct Target {
    /// Base URL of the API (default: the profile's, else http://127.0.0.1:7070).
    #[arg(long, env = "DIFFERENTLY_URL", global = true)]
    pub url: Option<String>,
    /// API key (`dly_…`); prefer the variable or `differently login`, which stay out of shell
    /// history and `ps`.
    #[arg(
        long,
        env = "DIFFERENTLY_API_KEY",
        hide_env_values = true,
        global = true
    )]
    pub key: Option<String>,
    /// The profile of the client config file to use (written by `differently login
    /// --config-profile NAME`; default `default`).
    #[arg(long, env = "DIFFERENTLY_PROFILE", global = true)]
    pub config_profile: Option<String>,
    /// What to print: `json` (the API's answer), `table`, or `id` (each item's id, a line
    /// each, for scripts: `ID=$(differently sandbox create -o id)`). Default: a table on a
    /// terminal, JSON otherwise.
    #[arg(short = 'o', long, value_enum, global = true)]
    pub output: Option<Output>,
}

impl Target {
    /// The printer for `-o` (or the default for where stdout goes).
    pub fn printer(&self) -> Printer {
        Printer::new(self.output.unwrap_or_else(|| {
            if std::io::stdout().is_terminal() {
                Output::Table
            } else {
                Output::Json
            }
        }))
    }

    /// A client for the resolved URL and key; the key is required.
    pub fn client(&self) -> Result<Client, CliError> {
        let resolved = profile::resolve(self)?;
        let key = resolved.key.ok_or_else(|| {
            CliError::Usage(
                "no API key: set DIFFERENTLY_API_KEY, pass --key, or run `differently login`"
                    .into(),
            )
        })?;
        Client::builder(resolved.url, key)
            .user_agent(format!("differently-cli/{}", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(CliError::Client)
    }
}

/// Why a client command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The API answered an error, or could not be reached.
    #[error("{}", client_message(.0))]
    Client(#[source] differently_client::Error),
    /// The command line asks for something that cannot be sent.
    #[error("{0}")]
    Usage(String),
    /// The API answered, but the outcome is not the one asked for (a `--wait` that ended
    /// with the sandbox failed, say).
    #[error("{0}")]
    Outcome(String),
    /// A wait ended without the status asked for; `code` is stable for scripts: `timeout`
    /// (the time ran out) or `ended` (the sandbox reached another final status).
    #[error("{code}: {message}")]
    Wait { code: &'static str, message: String },
    /// A local file or stream could not be read or written.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// The client error's text, with the CLI's own hint on a connection that failed.
fn client_message(e: &differently_client::Error) -> String {
    match e {
        differently_client::Error::Transport(t)
            if t.kind == differently_client::TransportKind::Connect =>
        {
            format!("{e} (--url, DIFFERENTLY_URL or the profile's url)")
        }
        _ => e.to_string(),
    }
}

impl From<differently_client::Error> for CliError {
    fn from(e: differently_client::Error) -> CliError {
        CliError::Client(e)
    }
}

impl CliError {
    pub fn io(what: impl Into<String>, source: std::io::Error) -> CliError {
        CliError::Io {
            what: what.into(),
            source,
        }
    }
}

/// The exit code of a client command that failed: the error on stderr, then 1 (2 for usage).
pub fn fail(e: &CliError) -> ExitCode {
    eprintln!("differently: {e}");
    match e {
        CliError::Usage(_) => ExitCode::from(2),
        _ => ExitCode::FAILURE,
    }
}

/// `KEY=VALUE` pairs from repeated flags; the flag is named in the error.
pub fn pairs(
    flag: &str,
    items: &[String],
) -> Result<std::collections::BTreeMap<String, String>, CliError> {
    let mut out = std::collections::BTreeMap::new();
    for item in items {
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| CliError::Usage(format!("--{flag} {item:?}: expected KEY=VALUE")))?;
        if k.is_empty() {
            return Err(CliError::Usage(format!(
                "--{flag} {item:?}: the key is empty"
            )));
        }
        out.insert(k.to_owned(), v.to_owned());
    }
    Ok(out)
}

/// Runs a client command body: prints its error and maps it to the exit code.
pub fn finish(result: Result<(), CliError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

/// A value as JSON, for printing (the typed answers serialize back to the API's form).
pub fn to_json<T: serde::Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}
