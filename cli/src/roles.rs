//! Wiring of the roles: build the store, bus, pools and state, then run the loops.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use differently_adapters::pools::PoolSet;
use differently_api::control::event_hub::EventHub;
use differently_api::{AppState, BootstrapKey, Inner, Limits};
use differently_bus::{Announcer, Bus};
use differently_bus_schema::Naming;
use differently_core::faults::Faults;
use differently_core::pool::{PoolRecord, PoolSource, Trust};
use differently_scheduler::{Scheduler, SchedulerConfig};
use differently_store::Store;
use differently_workers::{AdapterSource, WorkerConfig, WorkerGroup};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::config::Config;
use crate::Role;

/// Any error that ends the process, shown to the operator as is.
pub type AnyError = Box<dyn std::error::Error + Send + Sync>;

/// JSON logs for servers, compact text for `dev`; level from `DIFFERENTLY_LOG` or `RUST_LOG`.
pub fn init_logging(json: bool) {
    let filter = std::env::var("DIFFERENTLY_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.compact().init();
    }
}

fn faults_from_env() -> Faults {
    Faults::parse(&std::env::var("DIFFERENTLY_FAULT_PAUSE").unwrap_or_default())
}

fn limits(config: &Config) -> Limits {
    Limits {
        quota_defaults: config.quota,
        key_rate: differently_api::requests::ratelimit::Rate {
            per_second: config.api.key_requests_per_second,
            burst: config.api.key_burst,
        },
        auth_failure_rate: differently_api::requests::ratelimit::Rate {
            per_second: config.api.auth_failures_per_minute / 60.0,
            burst: config.api.auth_failures_per_minute.max(1.0),
        },
        // Validated when the configuration was loaded.
        trusted_proxies: config
            .api
            .trusted_proxies
            .iter()
            .filter_map(|p| differently_api::auth::throttle::parse_proxy(p).ok())
            .collect(),
        direct_placement: config.api.direct_placement,
        header_read_timeout: Duration::from_secs(config.api.header_read_timeout_seconds),
        body_read_timeout: Duration::from_secs(config.api.body_read_timeout_seconds),
        pty_grace: Duration::from_secs(config.api.pty_grace_seconds),
        webhooks: config.webhooks.api_settings(),
        // `[e2b] domain`, or `DIFFERENTLY_E2B_DOMAIN` over it; checked at load.
        e2b_domain: config.e2b.domain.clone(),
    }
}

/// The E2B facade's DNS mode for `dev`, which has no configuration file
/// (`DIFFERENTLY_E2B_DOMAIN`, docs/e2b-facade.md); unset or empty: off.
fn e2b_domain() -> Option<String> {
    std::env::var("DIFFERENTLY_E2B_DOMAIN")
        .ok()
        .filter(|d| !d.trim().is_empty())
}

fn scheduler_config(config: &Config) -> SchedulerConfig {
    SchedulerConfig {
        tick: Duration::from_millis(config.scheduler.tick_ms),
        ack_wait: config.ack_wait(),
        provisioning_timeout: Duration::from_secs(config.scheduler.provisioning_timeout_seconds),
        terminating_retry: Duration::from_secs(config.scheduler.terminating_retry_seconds),
        repair_interval: Duration::from_millis(config.scheduler.repair_interval_ms),
        default_idle_timeout: config
            .scheduler
            .default_idle_timeout_seconds
            .map(Duration::from_secs),
        reconcile_interval: Duration::from_secs(config.scheduler.reconcile_interval_seconds),
        placement_group: config.scheduler.placement_group_size,
        quota: config.quota,
        ..SchedulerConfig::default()
    }
}

fn worker_config(config: &Config) -> WorkerConfig {
    WorkerConfig {
        ack_wait: config.ack_wait(),
        max_deliveries: config.worker.max_deliveries,
        max_attempts: config.worker.max_attempts,
        concurrency: config.worker.concurrency,
        quota: config.quota,
        scan_every: Duration::from_millis(config.worker.scan_every_ms),
        scan_after: Duration::from_millis(config.worker.scan_after_ms),
    }
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
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

struct Parts {
    store: Arc<dyn Store>,
    announcer: Announcer,
    pools: PoolSet,
    /// Tenant event credentials (auth callout), when the bus is NATS and configured for it.
    event_auth: Option<differently_bus::callout::EventAuth>,
}

#[allow(clippy::too_many_arguments)]
fn spawn_roles(
    tasks: &mut JoinSet<Result<(), AnyError>>,
    parts: &Parts,
    roles: &[Role],
    worker_pools: &[String],
    listener: Option<tokio::net::TcpListener>,
    bootstrap_key: Option<BootstrapKey>,
    tenant: Option<differently_api::Tenant>,
    sched: SchedulerConfig,
    workers: WorkerConfig,
    limits: Limits,
    deliveries: differently_webhooks::DeliveryConfig,
    installation: differently_core::ids::InstallationId,
    shutdown: watch::Receiver<bool>,
) -> Result<(), AnyError> {
    let faults = faults_from_env();
    if roles.contains(&Role::Api) {
        let (Some(listener), Some(key), Some(tenant)) = (listener, bootstrap_key, tenant) else {
            return Err("api role needs a listener, a bootstrap key and a tenant".into());
        };
        let events = EventHub::start(
            parts.announcer.bus().clone(),
            parts.announcer.naming().clone(),
            parts.store.clone(),
        );
        let state = AppState::new(Inner {
            store: parts.store.clone(),
            announcer: parts.announcer.clone(),
            pools: parts.pools.clone(),
            bootstrap_key: key,
            tenant,
            faults: faults.clone(),
            events,
            key_requests: differently_api::requests::ratelimit::Buckets::new(limits.key_rate),
            auth_cache: differently_api::auth::cache::AuthCache::default(),
            activity: differently_api::data_plane::activity::ActivityBuffer::default(),
            policies: differently_api::caches::policy::PolicyCache::default(),
            warm: differently_api::caches::warm::WarmCache::default(),
            ptys: differently_api::data_plane::pty_sessions::PtySessions::default(),
            processes: Default::default(),
            event_auth: parts.event_auth.clone(),
            auth_failures: differently_api::auth::throttle::AuthFailures::new(
                limits.auth_failure_rate,
            ),
            limits,
        });
        let (activity, store) = (state.activity.clone(), parts.store.clone());
        let header_read_timeout = state.limits.header_read_timeout;
        let app = differently_api::router(state);
        let mut stop = shutdown.clone();
        tasks.spawn(async move {
            differently_api::server::serve(listener, app, header_read_timeout, async move {
                let _ = stop.changed().await;
            })
            .await?;
            // Activity buffered by the last calls is written before the process exits.
            activity.flush(store.as_ref()).await;
            Ok(())
        });
    }
    if roles.contains(&Role::Scheduler) {
        let scheduler = Scheduler {
            store: parts.store.clone(),
            announcer: parts.announcer.clone(),
            pools: parts.pools.clone(),
            config: sched,
        };
        let stop = shutdown.clone();
        tasks.spawn(async move {
            scheduler.run(stop).await;
            Ok(())
        });
    }
    if roles.contains(&Role::Worker) {
        // Every worker process also delivers webhooks: one at a time (a lock) fans the public
        // stream out into delivery rows, and all claim those rows without overlap
        // (docs/webhooks.md).
        let deliverer = differently_webhooks::Deliverer {
            store: parts.store.clone(),
            announcer: parts.announcer.clone(),
            config: deliveries,
        };
        let stop = shutdown.clone();
        tasks.spawn(async move {
            deliverer.run(stop).await;
            Ok(())
        });
        let make_group = |name: String| -> Result<WorkerGroup, AnyError> {
            let pool = parts
                .pools
                .get(&name)
                .ok_or_else(|| format!("--pools: no registered pool named {name:?}"))?;
            Ok(WorkerGroup {
                pool: name,
                adapter: AdapterSource::live(parts.pools.clone(), pool.adapter.clone()),
                store: parts.store.clone(),
                announcer: parts.announcer.clone(),
                installation: installation.clone(),
                config: workers.clone(),
                faults: faults.clone(),
            })
        };
        if worker_pools.is_empty() {
            // Serve every registered pool, including pools registered later through the API.
            let pools = parts.pools.clone();
            let (store, announcer) = (parts.store.clone(), parts.announcer.clone());
            let (installation, workers, faults) =
                (installation.clone(), workers.clone(), faults.clone());
            let stop = shutdown.clone();
            tasks.spawn(async move {
                let mut started = std::collections::HashSet::new();
                let mut running = JoinSet::new();
                loop {
                    for name in pools.names() {
                        if started.contains(&name) {
                            continue;
                        }
                        if let Some(pool) = pools.get(&name) {
                            let group = WorkerGroup {
                                pool: name.clone(),
                                adapter: AdapterSource::live(pools.clone(), pool.adapter.clone()),
                                store: store.clone(),
                                announcer: announcer.clone(),
                                installation: installation.clone(),
                                config: workers.clone(),
                                faults: faults.clone(),
                            };
                            running.spawn(group.run(stop.clone()));
                            started.insert(name);
                        }
                    }
                    if *stop.borrow() {
                        while running.join_next().await.is_some() {}
                        return Ok(());
                    }
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            });
        } else {
            for name in worker_pools {
                let group = make_group(name.clone())?;
                let stop = shutdown.clone();
                tasks.spawn(async move {
                    group.run(stop).await;
                    Ok(())
                });
            }
        }
    }
    Ok(())
}

async fn run_until_shutdown(
    mut tasks: JoinSet<Result<(), AnyError>>,
    shutdown_tx: watch::Sender<bool>,
) -> Result<(), AnyError> {
    let outcome = tokio::select! {
        _ = shutdown_signal() => Ok(()),
        Some(res) = tasks.join_next() => match res {
            Ok(Ok(())) => Err("a role stopped unexpectedly".into()),
            Ok(Err(e)) => Err(e),
            Err(e) => Err(e.into()),
        },
    };
    let _ = shutdown_tx.send(true);
    let drain = async { while tasks.join_next().await.is_some() {} };
    let _ = tokio::time::timeout(Duration::from_secs(10), drain).await;
    outcome
}

/// `differently dev`.
/// The admin key `dev` serves: `DIFFERENTLY_BOOTSTRAP_KEY`, else the key in `key_file`
/// (written there, mode 0600, on the first start), else a new one. A malformed key is an
/// error naming where it came from.
fn dev_admin_key(key_file: Option<&std::path::Path>) -> Result<String, AnyError> {
    if let Ok(k) = std::env::var("DIFFERENTLY_BOOTSTRAP_KEY") {
        BootstrapKey::from_key(&k)?;
        return Ok(k);
    }
    let Some(path) = key_file else {
        return Ok(differently_api::generate_key());
    };
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let k = text.trim().to_owned();
            BootstrapKey::from_key(&k)
                .map_err(|e| format!("--key-file {}: {e}", path.display()))?;
            Ok(k)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let k = differently_api::generate_key();
            write_private(path, &format!("{k}\n"))
                .map_err(|e| format!("--key-file {}: cannot write: {e}", path.display()))?;
            Ok(k)
        }
        Err(e) => Err(format!("--key-file {}: cannot read: {e}", path.display()).into()),
    }
}

/// Creates `path` readable by its owner only (it holds a key).
fn write_private(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    opts.open(path)?.write_all(text.as_bytes())
}

/// `dev` only: `false` refuses loopback webhook receivers as a server's defaults do.
const DEV_ALLOW_LOOPBACK: &str = "DIFFERENTLY_WEBHOOKS_ALLOW_LOOPBACK";

/// `dev` seals webhook signing secrets (and any stored secret) like a server, so without
/// `DIFFERENTLY_SECRETS_KEY` it makes a random key for the run, as it does an audit key.
/// Unlike the audit key it is never shown: nothing outside this process needs it, and the
/// data it seals lives in memory and ends with the process.
///
/// Set but empty, the variable asks for no key at all (to try what a server without one
/// answers).
fn dev_secrets_key(var: &str) -> Result<(), AnyError> {
    if differently_store::sealed::process_key().is_some() {
        return Ok(());
    }
    if std::env::var_os(var).is_some() {
        tracing::info!(
            "dev: {var} is set empty; no secrets key, webhooks and stored secrets are refused"
        );
        return Ok(());
    }
    let key = differently_store::sealed::SealKey::random()
        .map_err(|e| format!("dev: cannot make a secrets key: {e}"))?;
    let _ = differently_store::sealed::set_process_key(key);
    tracing::info!(
        "dev: no {var} set; webhooks and stored secrets use a random key for this run (not shown)"
    );
    Ok(())
}

/// How long a starting server role keeps retrying stream set-up that timed out.
const STREAM_SETUP_PATIENCE: Duration = Duration::from_secs(45);

/// Ensures the bus's streams, retrying set-up requests that time out for up to
/// [`STREAM_SETUP_PATIENCE`]: a cluster that loses or hangs a node while a process starts
/// answers nothing until it has elected new leaders (seconds), and exiting then left a
/// scheduler dead in CI (`bus setup: stream DLY_ADMIT: jetstream request timed out`) with no
/// supervisor to restart it. Any other failure (a refused configuration) is reported at once.
async fn ensure_streams_through_elections(
    bus: &dyn Bus,
    naming: &Naming,
) -> Result<(), differently_bus::BusError> {
    let give_up = std::time::Instant::now() + STREAM_SETUP_PATIENCE;
    let mut wait = Duration::from_millis(250);
    loop {
        match bus.ensure_streams(naming).await {
            Ok(()) => return Ok(()),
            // The client names a request that got no answer "timed out" (async-nats keeps the
            // kind private behind each request's own error type).
            Err(e)
                if e.to_string().contains("timed out") && std::time::Instant::now() < give_up =>
            {
                tracing::warn!(error = %e, retry_in_ms = wait.as_millis() as u64,
                    "bus: stream set-up got no answer (a cluster electing leaders?); retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(4));
            }
            Err(e) => return Err(e),
        }
    }
}

/// `differently dev`.
pub async fn dev(
    listen: &str,
    root: Option<PathBuf>,
    key_file: Option<PathBuf>,
) -> Result<(), AnyError> {
    let audit = crate::config::AuditSection::default();
    let generated_audit_key = crate::audit_cmd::install_keys(&audit, true)?;
    dev_secrets_key(&audit.secrets_key_env)?;
    let key = dev_admin_key(key_file.as_deref())?;
    // `dev` has no configuration file: webhooks take the defaults and the two switches
    // from the environment, and loopback receivers (http included) are allowed besides, so
    // a receiver on this machine works with no switch while private ranges stay refused.
    let mut webhooks = crate::config::WebhooksSection::default();
    webhooks.apply_env(|k| std::env::var(k).ok())?;
    let loopback = match std::env::var(DEV_ALLOW_LOOPBACK) {
        Ok(v) => v
            .parse::<bool>()
            .map_err(|_| format!("{DEV_ALLOW_LOOPBACK} is {v:?}, expected true or false"))?,
        Err(_) => true,
    };
    let mut webhook_api = webhooks.api_settings();
    webhook_api.url_policy.allow_loopback = loopback;
    let mut webhook_delivery = webhooks.delivery();
    webhook_delivery.url_policy.allow_loopback = loopback;
    let addr: SocketAddr = listen
        .parse()
        .map_err(|e| format!("--listen {listen:?}: {e}"))?;
    let store: Arc<dyn Store> = Arc::new(differently_store::memory::MemoryStore::new());
    let bus: Arc<dyn Bus> = Arc::new(differently_bus::memory::MemoryBus::new());
    let naming = Naming::default();
    bus.ensure_streams(&naming).await?;
    let mut settings = serde_json::json!({});
    if let Some(root) = root {
        settings["root"] = serde_json::Value::String(root.display().to_string());
    }
    let isolation =
        differently_adapters::devhost::DevhostAdapter::isolation_of(&settings).unwrap_or("unknown");
    let now = chrono::Utc::now();
    let local = PoolRecord {
        name: "local".into(),
        kind: "devhost".into(),
        trust: Trust::Private,
        region: None,
        max_concurrent: None,
        isolation: None,
        cost_per_cpu_hour: 0.0,
        typical_create_seconds: Some(0.1),
        settings,
        source: PoolSource::Config,
        created_at: now,
        updated_at: now,
    };
    crate::pools::register(store.as_ref(), std::slice::from_ref(&local)).await?;
    let pools = crate::pools::load(store.clone()).await?;
    crate::pools::spawn_sync(store.clone(), pools.clone());
    crate::pools::start_probes(store.clone(), pools.clone(), vec![]).await;
    let tenant = differently_api::ensure_bootstrap_tenant(store.as_ref()).await?;
    let installation = store.installation_id().await?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e} (choose another with --listen)"))?;
    let local = listener.local_addr()?;
    let parts = Parts {
        store,
        announcer: Announcer::new(bus, naming),
        pools,
        // The embedded bus has no NATS server to authorise tenants on.
        event_auth: None,
    };
    let (tx, rx) = watch::channel(false);
    // The listener is off in dev unless asked for through the environment; the metrics
    // are always kept, for the dashboard's charts (`/v1/admin/metrics/summary`).
    if let Ok(m) = std::env::var("DIFFERENTLY_METRICS_LISTEN") {
        let addr: SocketAddr = m
            .parse()
            .map_err(|e| format!("DIFFERENTLY_METRICS_LISTEN {m:?}: {e}"))?;
        crate::metrics::start(addr, rx.clone()).await?;
    } else {
        crate::metrics::install()?;
    }
    let mut tasks = JoinSet::new();
    let sched = SchedulerConfig {
        tick: Duration::from_millis(100),
        ..SchedulerConfig::default()
    };
    spawn_roles(
        &mut tasks,
        &parts,
        &[Role::Api, Role::Scheduler, Role::Worker],
        &[],
        Some(listener),
        Some(BootstrapKey::from_key(&key)?),
        Some(tenant),
        sched,
        WorkerConfig::default(),
        Limits {
            webhooks: webhook_api,
            e2b_domain: e2b_domain(),
            ..Limits::default()
        },
        webhook_delivery,
        installation,
        rx,
    )?;
    {
        // A reader that takes only the lines it needs and closes the pipe must not take
        // the server down with it: write errors are ignored.
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "export DIFFERENTLY_URL=http://{local}");
        let _ = writeln!(out, "export DIFFERENTLY_API_KEY={key}");
        // So `differently audit verify` can check an export of this run's chains.
        if let Some(k) = generated_audit_key {
            let _ = writeln!(out, "export DIFFERENTLY_AUDIT_KEY={}", k.to_hex());
        }
        let _ = out.flush();
    }
    eprintln!(
        "differently dev: paste the lines above into your shell, then try\n  \
         differently sandbox create --wait\n\
         (the data lives in memory: a restart starts empty{}){}",
        if key_file.is_some() {
            "; the admin key is kept in the key file"
        } else {
            "; --key-file keeps the admin key across restarts"
        },
        if loopback {
            "\nwebhooks may point at receivers on this machine (http://127.0.0.1:PORT/…, \
             http://localhost:PORT/…): dev only, a server refuses them by default"
        } else {
            ""
        }
    );
    tracing::info!(%local, isolation, "differently dev is up: in-memory store and bus, devhost pool \"local\" (isolation: {isolation})");
    run_until_shutdown(tasks, tx).await
}

async fn connect_store(
    config: &Config,
) -> Result<Arc<differently_store::postgres::PgStore>, AnyError> {
    let url = config.require_database_url()?;
    let store =
        differently_store::postgres::PgStore::connect(url, config.database_max_connections).await?;
    store.migrate().await?;
    Ok(Arc::new(store))
}

/// `differently migrate`.
pub async fn migrate(config: &Config) -> Result<(), AnyError> {
    connect_store(config).await?;
    tracing::info!("migrations applied");
    Ok(())
}

/// `differently server --role …`.
pub async fn server(
    config: Config,
    roles: Vec<Role>,
    worker_pools: Vec<String>,
) -> Result<(), AnyError> {
    crate::audit_cmd::install_keys(&config.audit, false)?;
    let bootstrap_key = if roles.contains(&Role::Api) {
        Some(BootstrapKey::from_key(config.require_bootstrap_key()?)?)
    } else {
        None
    };
    let listener = if roles.contains(&Role::Api) {
        let addr: SocketAddr = config.listen.parse()?;
        Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| format!("cannot listen on {addr}: {e}"))?,
        )
    } else {
        None
    };
    let records = crate::pools::config_records(&config)?;
    let store = connect_store(&config).await?;
    let store: Arc<dyn Store> = store;
    crate::pools::register(store.as_ref(), &records).await?;
    crate::pools::register_warm(store.as_ref(), &config).await?;
    let pools = crate::pools::load(store.clone()).await?;
    crate::pools::spawn_sync(store.clone(), pools.clone());
    if roles.contains(&Role::Worker) {
        crate::pools::start_probes(store.clone(), pools.clone(), worker_pools.clone()).await;
    }
    let nats_url = config.require_nats_url()?;
    let js =
        differently_bus::jetstream::connect_with(&nats_url, config.bus_connect_options()).await?;
    let nats = js.context().client();
    let bus: Arc<dyn Bus> = Arc::new(js);
    let naming = Naming::new(&config.bus.prefix)?;
    ensure_streams_through_elections(bus.as_ref(), &naming).await?;
    let event_auth = match (
        &config.bus.events_account_seed_env,
        roles.contains(&Role::Api),
    ) {
        (Some(var), true) => {
            let seed = std::env::var(var).map_err(|_| {
                format!("bus.events_account_seed_env: environment variable {var} is not set")
            })?;
            let auth =
                differently_bus::callout::EventAuth::new(nats.clone(), &seed, naming.clone())
                    .await?;
            tracing::info!(issuer = %auth.issuer(), "event credentials: answering the NATS auth callout");
            let responder = auth.clone();
            tokio::spawn(async move {
                if let Err(e) = responder.respond(nats).await {
                    tracing::error!(error = %e, "event credentials: the auth callout responder stopped");
                }
            });
            Some(auth)
        }
        _ => None,
    };
    let tenant = if roles.contains(&Role::Api) {
        Some(differently_api::ensure_bootstrap_tenant(store.as_ref()).await?)
    } else {
        None
    };
    let installation = store.installation_id().await?;
    let parts = Parts {
        store,
        announcer: Announcer::new(bus, naming),
        pools,
        event_auth,
    };
    let (tx, rx) = watch::channel(false);
    if let Some(m) = &config.metrics.listen {
        let addr: SocketAddr = m.parse()?;
        crate::metrics::start(addr, rx.clone()).await?;
    }
    let mut tasks = JoinSet::new();
    spawn_roles(
        &mut tasks,
        &parts,
        &roles,
        &worker_pools,
        listener,
        bootstrap_key,
        tenant,
        scheduler_config(&config),
        worker_config(&config),
        limits(&config),
        config.webhooks.delivery(),
        installation,
        rx,
    )?;
    if let Some(l) = config
        .listen
        .parse::<SocketAddr>()
        .ok()
        .filter(|_| roles.contains(&Role::Api))
    {
        tracing::info!(listen = %l, "api listening");
    }
    tracing::info!(?roles, "differently server started");
    run_until_shutdown(tasks, tx).await
}
