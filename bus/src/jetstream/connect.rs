//! Connecting: the server list, credentials and TLS, the client's liveness settings, and the
//! version and JetStream checks a server must pass before the bus uses it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;

use super::pull::DEFAULT_FETCH_BATCH;
use super::version::check_server_version;
use super::JetStreamBus;
use crate::error::Detail;
use crate::BusError;

/// How long a consumer or stream set-up request waits before it is retried.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(2);

/// How the bus connects. `Default` is what production wants on one server or a cluster.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Stream replication factor (1 locally, 3 in a cluster).
    pub replicas: usize,
    /// How often the client pings its server; after two unanswered pings it reconnects to
    /// another member, so a hung (not dead) node is left within about three intervals.
    pub ping_interval: Duration,
    /// How long connecting to one server may take before the next is tried. A hung member
    /// accepts TCP and never sends its greeting, so the client's own default (5 s) is what
    /// leaving a hung node would cost whenever the reconnect picks it again.
    pub connect_timeout: Duration,
    /// How the client proves who it is.
    pub auth: NatsAuth,
    /// PEM file of CA certificates to trust for `tls://` servers (a private CA); TLS is
    /// required when it is set.
    pub ca_bundle: Option<std::path::PathBuf>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            replicas: 1,
            ping_interval: DEFAULT_PING_INTERVAL,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            auth: NatsAuth::None,
            ca_bundle: None,
        }
    }
}

/// NATS credentials, by reference: the values live in the environment or a file, are read
/// when connecting, and never appear in a log or an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NatsAuth {
    /// No credentials (or credentials in the URL).
    None,
    /// A token, from this environment variable.
    TokenEnv(String),
    /// A user, with the password from this environment variable.
    UserPassword { user: String, password_env: String },
    /// A `.creds` file (user JWT and nkey seed), as `nsc` writes them.
    CredentialsFile(std::path::PathBuf),
    /// A file holding an nkey seed (`SU…`), for a server whose user list names the user's
    /// public nkey (no JWT).
    NkeySeedFile(std::path::PathBuf),
}

/// The value of environment variable `var`, or an error naming it (never the value).
fn secret_env(var: &str) -> Result<String, BusError> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Ok(v),
        _ => Err(BusError::Connection(Detail::new(format!(
            "environment variable {var} (a NATS credential) is not set"
        )))),
    }
}

/// The nkey seed in `path`, or an error naming the file (never its content).
fn nkey_seed(path: &std::path::Path) -> Result<String, BusError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        BusError::Connection(Detail::caused(
            format!("NATS nkey seed file {}: {e}", path.display()),
            e,
        ))
    })?;
    let seed = text.trim();
    // A user seed: `S` (seed) then `U` (user). Anything else would only fail as a bare
    // "authorization violation" at the server.
    if !seed.starts_with("SU") || seed.len() < 58 {
        return Err(BusError::Connection(Detail::new(format!(
            "NATS nkey seed file {}: not a user nkey seed (one line starting with SU)",
            path.display()
        ))));
    }
    Ok(seed.to_owned())
}

/// Client options with `opts`' credentials and TLS applied.
async fn client_options(opts: &ConnectOptions) -> Result<async_nats::ConnectOptions, BusError> {
    let base = match &opts.auth {
        NatsAuth::None => async_nats::ConnectOptions::new(),
        NatsAuth::TokenEnv(var) => async_nats::ConnectOptions::new().token(secret_env(var)?),
        NatsAuth::UserPassword { user, password_env } => async_nats::ConnectOptions::new()
            .user_and_password(user.clone(), secret_env(password_env)?),
        NatsAuth::CredentialsFile(path) => async_nats::ConnectOptions::with_credentials_file(path)
            .await
            .map_err(|e| {
                BusError::Connection(Detail::caused(
                    format!("NATS credentials file {}: {e}", path.display()),
                    e,
                ))
            })?,
        NatsAuth::NkeySeedFile(path) => async_nats::ConnectOptions::new().nkey(nkey_seed(path)?),
    };
    Ok(match &opts.ca_bundle {
        Some(ca) => base.add_root_certificates(ca.clone()).require_tls(true),
        None => base,
    })
}

/// The client library's own default is 60 s, which leaves a hung node unnoticed for minutes.
pub const DEFAULT_PING_INTERVAL: Duration = Duration::from_millis(500);

/// See [`ConnectOptions::connect_timeout`]: room for a TLS handshake across a region, far
/// less than the client's 5 s.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Connects to `url` and refuses servers older than 2.10 or without JetStream.
/// `replicas` is the stream replication factor (1 locally, 3 in a cluster).
pub async fn connect(url: &str, replicas: usize) -> Result<JetStreamBus, BusError> {
    connect_with(
        url,
        ConnectOptions {
            replicas,
            ..ConnectOptions::default()
        },
    )
    .await
}

/// [`connect`] with every option.
pub async fn connect_with(url: &str, opts: ConnectOptions) -> Result<JetStreamBus, BusError> {
    let servers = server_list(url)?;
    // Named by host and port only: a URL may carry credentials.
    let named = servers
        .iter()
        .map(|a| format!("{}:{}", a.host(), a.port()))
        .collect::<Vec<_>>()
        .join(",");
    let (generation, reconnects) = tokio::sync::watch::channel(0u64);
    let generation = std::sync::Arc::new(generation);
    let client = client_options(&opts)
        .await?
        .ping_interval(opts.ping_interval)
        .connection_timeout(opts.connect_timeout)
        .event_callback(move |event| {
            let generation = generation.clone();
            async move {
                match event {
                    async_nats::Event::Connected => {
                        generation.send_modify(|g| *g += 1);
                        metrics::counter!("differently_bus_connection_events_total", "event" => "connected")
                            .increment(1);
                    }
                    async_nats::Event::Disconnected => {
                        tracing::warn!("bus: lost the NATS connection; reconnecting");
                        metrics::counter!("differently_bus_connection_events_total", "event" => "disconnected")
                            .increment(1);
                    }
                    _ => {}
                }
            }
        })
        .connect(servers)
        .await
        .map_err(|e| BusError::Connection(Detail::caused(format!("{named}: {e}"), e)))?;
    let info = client.server_info();
    check_server_version(&info.version)?;
    if !info.jetstream {
        return Err(BusError::Unsupported(
            format!(
                "nats-server {} at {named} has JetStream disabled: start it with -js",
                info.version
            )
            .into(),
        ));
    }
    let js = jetstream::new(client);
    let mut setup = js.clone();
    setup.set_timeout(SETUP_TIMEOUT);
    Ok(JetStreamBus {
        js,
        setup,
        reconnects,
        replicas: opts.replicas.max(1),
        fetch_batch: DEFAULT_FETCH_BATCH,
        known: Arc::new(Mutex::new(Vec::new())),
        epochs: Arc::default(),
    })
}

/// `nats_url` as a server list: one URL, or several separated by commas (the members of a
/// cluster, so a process can start while any one of them is down). An entry that does not
/// parse is an error naming its position, never its text (it may hold a password).
fn server_list(url: &str) -> Result<Vec<async_nats::ServerAddr>, BusError> {
    let servers = url
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .enumerate()
        .map(|(i, s)| {
            s.parse::<async_nats::ServerAddr>().map_err(|e| {
                BusError::Connection(Detail::caused(
                    format!("nats_url: server {} of the list does not parse: {e}", i + 1),
                    e,
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if servers.is_empty() {
        return Err(BusError::Connection(Detail::new("nats_url is empty")));
    }
    Ok(servers)
}
