//! `differently plugin`: the reference plugin (`serve`: the `fake` adapter over the
//! `/adapter/v1` protocol) and the conformance kit (`conformance URL`: the adapter contract
//! run against any plugin). See `docs/plugins.md`.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Subcommand;
use differently_adapters::conformance::{self, Target};
use differently_adapters::credentials::CredentialRef;
use differently_adapters::fake::{FakeAdapter, FakeConfig};
use differently_adapters::http::Secret;
use differently_adapters::plugin_server::PluginServer;
use differently_adapters::remote::wire::PROTOCOL_CAPABILITIES;

use crate::roles::AnyError;

/// Environment variable holding the plugin token when no `--token-file` is given.
pub const TOKEN_ENV: &str = "DIFFERENTLY_PLUGIN_TOKEN";

/// The subcommands of `differently plugin`.
#[derive(Subcommand)]
pub enum PluginCommand {
    /// Serve the `fake` adapter over the plugin protocol: the reference plugin, for trying a
    /// `remote` pool and as the model a plugin in another language follows.
    Serve {
        /// Listen address (port 0: any free port; the address is printed).
        #[arg(long, default_value = "127.0.0.1:7081")]
        listen: String,
        /// A file holding the bearer token: read if it exists, else a new token is written
        /// there (mode 0600). Without it, DIFFERENTLY_PLUGIN_TOKEN, else a new token is printed.
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// Capabilities the fake declares and implements (comma-separated; default: every
        /// one the protocol carries that the fake has).
        #[arg(long, value_delimiter = ',')]
        capabilities: Vec<String>,
        /// The fake's JSON-lines ledger file (what the backend saw), shared across processes.
        #[arg(long)]
        ledger: Option<PathBuf>,
        /// The plugin's name in `/info`.
        #[arg(long, default_value = "differently-reference")]
        name: String,
    },
    /// Run the adapter contract against the plugin at URL and print a report; exit 1 if
    /// any check fails.
    Conformance {
        /// The plugin's base URL (`/adapter/v1` is added); plain http only to this machine.
        url: String,
        /// A file holding the plugin's bearer token (else DIFFERENTLY_PLUGIN_TOKEN).
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// Print the report as JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// Runs one `plugin` subcommand.
pub async fn run(command: PluginCommand) -> Result<ExitCode, AnyError> {
    match command {
        PluginCommand::Serve {
            listen,
            token_file,
            capabilities,
            ledger,
            name,
        } => {
            serve(&listen, token_file.as_deref(), capabilities, ledger, name).await?;
            Ok(ExitCode::SUCCESS)
        }
        PluginCommand::Conformance {
            url,
            token_file,
            json,
        } => conformance(url, token_file, json).await,
    }
}

/// What the fake implements of what the protocol carries.
const FAKE_CAPABILITIES: [&str; 7] = [
    "exec",
    "exec.stream",
    "files",
    "lifecycle.pause",
    "lifecycle.stop",
    "snapshots",
    "ports.expose",
];

async fn serve(
    listen: &str,
    token_file: Option<&Path>,
    capabilities: Vec<String>,
    ledger: Option<PathBuf>,
    name: String,
) -> Result<(), AnyError> {
    let addr: SocketAddr = listen
        .parse()
        .map_err(|e| format!("--listen {listen:?}: {e}"))?;
    let capabilities = if capabilities.is_empty() {
        FAKE_CAPABILITIES.iter().map(|c| (*c).to_owned()).collect()
    } else {
        for c in &capabilities {
            if !FAKE_CAPABILITIES.contains(&c.as_str()) {
                let why = if PROTOCOL_CAPABILITIES.contains(&c.as_str()) {
                    "the fake does not implement it"
                } else {
                    "the protocol does not carry it"
                };
                return Err(format!(
                    "--capabilities: `{c}`: {why} (use: {})",
                    FAKE_CAPABILITIES.join(", ")
                )
                .into());
            }
        }
        if !capabilities.iter().any(|c| c == "exec") {
            return Err("--capabilities: `exec` is required".into());
        }
        capabilities
    };
    let (token, generated) = token(token_file)?;
    let secret = Secret::parse(&token).map_err(|why| format!("the plugin token {why}"))?;
    let adapter = Arc::new(FakeAdapter::new(FakeConfig {
        capabilities,
        ledger,
        ..FakeConfig::default()
    }));
    let router = PluginServer::new(adapter, name, secret).router();
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e} (choose another with --listen)"))?;
    let local = listener.local_addr()?;
    {
        // A reader that takes the lines it needs and closes the pipe must not stop us.
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "plugin listening on http://{local}/adapter/v1");
        if generated {
            // Shown once: nothing else holds it.
            let _ = writeln!(out, "plugin token: {token}");
        }
        let _ = out.flush();
    }
    differently_api::server::serve(listener, router, Duration::from_secs(10), shutdown_signal())
        .await?;
    Ok(())
}

/// The token from `--token-file` (created when missing), the environment, or new; and
/// whether it is new and held nowhere (so it must be shown).
fn token(token_file: Option<&Path>) -> Result<(String, bool), AnyError> {
    if let Some(path) = token_file {
        return match std::fs::read_to_string(path) {
            Ok(text) => Ok((text.trim().to_owned(), false)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let t = differently_api::generate_key();
                write_private(path, &format!("{t}\n"))
                    .map_err(|e| format!("--token-file {}: cannot write: {e}", path.display()))?;
                Ok((t, false))
            }
            Err(e) => Err(format!("--token-file {}: cannot read: {e}", path.display()).into()),
        };
    }
    match std::env::var(TOKEN_ENV) {
        Ok(t) if !t.trim().is_empty() => Ok((t.trim().to_owned(), false)),
        _ => Ok((differently_api::generate_key(), true)),
    }
}

/// Creates `path` readable by its owner only (it holds a token).
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    opts.open(path)?.write_all(text.as_bytes())
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        else {
            let _ = ctrl_c.await;
            return;
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

async fn conformance(
    url: String,
    token_file: Option<PathBuf>,
    json: bool,
) -> Result<ExitCode, AnyError> {
    let token = match token_file {
        Some(f) => CredentialRef::File(f),
        None if std::env::var_os(TOKEN_ENV).is_some() => CredentialRef::Env(TOKEN_ENV.to_owned()),
        None => {
            return Err(
                format!("the plugin's token is needed: --token-file FILE or {TOKEN_ENV}").into(),
            )
        }
    };
    let report = conformance::run_plugin(&Target { url, token }).await;
    let text = if json {
        let mut t = serde_json::to_string_pretty(&report)?;
        t.push('\n');
        t
    } else {
        report.table()
    };
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
    Ok(if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
