//! `differently`: the one binary. Server roles (`server --role api|scheduler|worker`), the
//! all-in-one `dev` mode, `migrate`, and the client commands over the API (`sandbox`, `admin`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::error::{ContextKind, ContextValue};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

mod audit_cmd;
mod client;
mod config;
mod mcp;
mod metrics;
mod plugin_cmd;
mod pools;
mod preflight;
mod roles;

#[derive(Parser)]
#[command(
    name = "differently",
    version,
    about = "One API for isolated sandboxes, placed by policy"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process: the size of the largest variant costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Every role in one process on the in-memory store and bus, with a local `devhost` pool.
    ///
    /// Keys left unset are made for the run: the audit key (printed) and the secrets key
    /// that seals webhook signing secrets (never shown). Webhooks may point at receivers on
    /// this machine (http://127.0.0.1:PORT/…, http://localhost:PORT/…), in dev only
    /// (DIFFERENTLY_WEBHOOKS_ALLOW_LOOPBACK=false refuses them); other private addresses
    /// need DIFFERENTLY_WEBHOOKS_ALLOW_PRIVATE=true, other plain http URLs
    /// DIFFERENTLY_WEBHOOKS_ALLOW_HTTP=true. DIFFERENTLY_SECRETS_KEY set empty: no key.
    Dev {
        /// API listen address.
        #[arg(long, default_value = "127.0.0.1:7070")]
        listen: String,
        /// Where devhost sandboxes keep their working directories.
        #[arg(long)]
        root: Option<PathBuf>,
        /// A file holding the admin API key: read if it exists, else a new key is written
        /// there (mode 0600), so a restart keeps the same key. Without it (and without
        /// DIFFERENTLY_BOOTSTRAP_KEY) every start makes a new key.
        #[arg(long)]
        key_file: Option<PathBuf>,
    },
    /// Run server roles against Postgres and NATS JetStream.
    Server {
        /// Roles to run in this process (comma-separated).
        #[arg(long, value_delimiter = ',', required = true)]
        role: Vec<Role>,
        /// Pools whose work this process executes (worker role; default: all configured).
        #[arg(long, value_delimiter = ',')]
        pools: Vec<String>,
        /// Configuration file (TOML); `DIFFERENTLY_*` variables override it.
        /// The TOML configuration file (docs/configuration.md).
        #[arg(long, env = "DIFFERENTLY_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Check, changing nothing, that this configuration can run a server: keys, Postgres
    /// and its schema, NATS JetStream, every configured pool's backend. Exit 1 on a failure.
    Preflight {
        /// The TOML configuration file (docs/configuration.md).
        #[arg(long, env = "DIFFERENTLY_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Apply database migrations and exit.
    Migrate {
        /// The TOML configuration file (docs/configuration.md).
        #[arg(long, env = "DIFFERENTLY_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Audit log tools (offline verification of an export).
    Audit {
        #[command(subcommand)]
        command: audit_cmd::AuditCommand,
    },
    /// API keys: create, list, read, revoke over the API; `generate` offline.
    Key {
        #[command(flatten)]
        target: client::Target,
        #[command(subcommand)]
        command: client::tenancy::KeyCommand,
    },
    /// A Model Context Protocol server on stdin/stdout for local agent hosts, acting through
    /// the API with the configured key (docs/mcp.md).
    Mcp {
        #[command(flatten)]
        target: client::Target,
    },
    /// Sandboxes through the API (`DIFFERENTLY_URL`, `DIFFERENTLY_API_KEY`, or a profile).
    Sandbox {
        #[command(flatten)]
        target: client::Target,
        #[command(subcommand)]
        command: client::sandbox::SandboxCommand,
    },
    /// Background processes in a sandbox: start, list, attach to, feed, signal, kill.
    Process {
        #[command(flatten)]
        target: client::Target,
        #[command(subcommand)]
        command: client::process::ProcessCommand,
    },
    /// Snapshots of sandboxes, and forks from them.
    Snapshot {
        #[command(flatten)]
        target: client::Target,
        #[command(subcommand)]
        command: client::snapshot::SnapshotCommand,
    },
    /// Events as they happen (`-f` to follow; `--public` for every public type), their
    /// schemas, and NATS credentials for them.
    Events {
        #[command(flatten)]
        target: client::Target,
        #[command(subcommand)]
        command: Option<client::events::EventsCommand>,
        #[command(flatten)]
        args: client::events::EventsArgs,
    },
    /// Webhooks: a project's public events as signed HTTPS POSTs (docs/webhooks.md).
    Webhooks {
        #[command(flatten)]
        target: client::Target,
        #[command(subcommand)]
        command: client::webhooks::WebhookCommand,
    },
    /// Organizations.
    Org {
        #[command(flatten)]
        target: client::Target,
        #[command(subcommand)]
        command: client::tenancy::OrgCommand,
    },
    /// Projects of an organization.
    Project {
        #[command(flatten)]
        target: client::Target,
        #[command(subcommand)]
        command: client::tenancy::ProjectCommand,
    },
    /// Quotas of organizations and projects.
    Quota {
        #[command(flatten)]
        target: client::Target,
        #[command(subcommand)]
        command: client::tenancy::QuotaCommand,
    },
    /// Placement policies: global, per organization, per project.
    Policy {
        #[command(flatten)]
        target: client::Target,
        #[command(subcommand)]
        command: client::tenancy::PolicyCommand,
    },
    /// Operator commands through the API, with an admin key.
    Admin {
        #[command(flatten)]
        target: client::Target,
        #[command(subcommand)]
        command: client::admin::AdminCommand,
    },
    /// Check a URL and key against the API and store them as a profile of the client config
    /// file (mode 0600). The key from --key, else a line on standard input, else
    /// DIFFERENTLY_API_KEY, else a prompt: the one given wins over the environment's.
    Login {
        #[command(flatten)]
        target: client::Target,
        /// Save the key without checking it against the API (for an API not reachable from
        /// here yet); a key the API refuses is otherwise never saved.
        #[arg(long)]
        no_verify: bool,
    },
    /// Plugins of the `/adapter/v1` protocol: serve the reference plugin, or run the
    /// conformance kit against one.
    Plugin {
        #[command(subcommand)]
        command: plugin_cmd::PluginCommand,
    },
    /// Print a shell completion script (e.g. `differently completions bash > /etc/bash_completion.d/differently`).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// A server role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Role {
    Api,
    Scheduler,
    Worker,
}

/// The command line, as `Cli::parse` reads it, except that an error's usage line is the one
/// `--help` shows (see [`with_help_usage`]).
fn parse_command_line() -> Cli {
    let mut cmd = Cli::command();
    let parsed = cmd
        .try_get_matches_from_mut(std::env::args_os())
        .and_then(|mut m| Cli::from_arg_matches_mut(&mut m).map_err(|e| e.format(&mut cmd)));
    match parsed {
        Ok(cli) => cli,
        Err(e) => with_help_usage(e, &mut cmd).exit(),
    }
}

/// clap's error usage line names every option that has a value, whether typed or taken from
/// a `DIFFERENTLY_*` variable (`Usage: differently sandbox get --url <URL> --key <KEY> <ID>`),
/// which reads as if they were required. It is replaced by the command's own usage, as
/// `--help` shows it: `[OPTIONS]`, then what is required (`… sandbox get [OPTIONS] <ID>`).
fn with_help_usage(mut e: clap::Error, cmd: &mut clap::Command) -> clap::Error {
    let Some(ContextValue::StyledStr(usage)) = e.get(ContextKind::Usage) else {
        return e;
    };
    let line = usage.to_string();
    let Some(line) = line.strip_prefix("Usage: ") else {
        return e;
    };
    cmd.build();
    if let Some(help) = help_usage(cmd, line) {
        e.insert(ContextKind::Usage, ContextValue::StyledStr(help));
    }
    e
}

/// The `--help` usage of the deepest command of `cmd`'s tree whose full name (`differently
/// sandbox get`) starts `line`; `None` if none does.
fn help_usage(cmd: &mut clap::Command, line: &str) -> Option<clap::builder::StyledStr> {
    let name = cmd.get_bin_name().unwrap_or(cmd.get_name()).to_owned();
    let rest = line.strip_prefix(name.as_str())?;
    if !(rest.is_empty() || rest.starts_with(' ')) {
        return None;
    }
    for sub in cmd.get_subcommands_mut() {
        if let Some(usage) = help_usage(sub, line) {
            return Some(usage);
        }
    }
    Some(cmd.render_usage())
}

fn main() -> ExitCode {
    let cli = parse_command_line();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("differently: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Mcp { target } => return Ok(mcp::run(&target).await),
            Command::Sandbox { target, command } => {
                return Ok(client::sandbox::run(&target, command).await)
            }
            Command::Process { target, command } => {
                return Ok(client::process::run(&target, command).await)
            }
            Command::Snapshot { target, command } => {
                return Ok(client::snapshot::run(&target, command).await)
            }
            Command::Events {
                target,
                command,
                args,
            } => return Ok(client::events::run(&target, command, args).await),
            Command::Webhooks { target, command } => {
                return Ok(client::webhooks::run(&target, command).await)
            }
            Command::Org { target, command } => {
                return Ok(client::tenancy::org(&target, command).await)
            }
            Command::Project { target, command } => {
                return Ok(client::tenancy::project(&target, command).await)
            }
            Command::Key { target, command } => {
                return Ok(client::tenancy::key(&target, command).await)
            }
            Command::Quota { target, command } => {
                return Ok(client::tenancy::quota(&target, command).await)
            }
            Command::Policy { target, command } => {
                return Ok(client::tenancy::policy(&target, command).await)
            }
            Command::Admin { target, command } => {
                return Ok(client::admin::run(&target, command).await)
            }
            Command::Login { target, no_verify } => {
                return Ok(client::finish(
                    client::profile::login(&target, no_verify).await,
                ))
            }
            Command::Completions { shell } => {
                let mut cmd = <Cli as clap::CommandFactory>::command();
                let mut out = Vec::new();
                clap_complete::generate(shell, &mut cmd, "differently", &mut out);
                client::output::write_raw(&mut std::io::stdout(), &out);
                Ok(())
            }
            Command::Dev {
                listen,
                root,
                key_file,
            } => {
                roles::init_logging(false);
                roles::dev(&listen, root, key_file).await
            }
            Command::Server {
                role,
                pools,
                config,
            } => {
                roles::init_logging(true);
                let config = config::Config::load(config.as_deref())?;
                roles::server(config, role, pools).await
            }
            Command::Preflight { config } => {
                let config = config::Config::load(config.as_deref())?;
                return Ok(if preflight::run(&config).await {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                });
            }
            Command::Migrate { config } => {
                roles::init_logging(true);
                let config = config::Config::load(config.as_deref())?;
                roles::migrate(&config).await
            }
            Command::Audit { command } => audit_cmd::run(command),
            Command::Plugin { command } => {
                roles::init_logging(false);
                return plugin_cmd::run(command).await;
            }
        }
        .map(|()| ExitCode::SUCCESS)
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("differently: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// Every flag and option of every command says what it is for (`--help` had empty lines
    /// for `--template`, `--cpu`, `--region`, …). Positional arguments are named well enough.
    #[test]
    fn every_option_has_help() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if arg.is_positional() || id == "help" || id == "version" {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} --{}", arg.get_long().unwrap_or(id)));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = vec![];
        walk(&Cli::command(), "differently", &mut missing);
        assert!(missing.is_empty(), "options without help: {missing:#?}");
    }
}
