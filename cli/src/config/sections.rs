//! The plain sections of the file (`[audit]`, `[metrics]`, `[bus]`, `[scheduler]`,
//! `[worker]`, `[api]`, `[e2b]`): their fields and defaults. Their checks are in `validate`.

use serde::Deserialize;

/// `[audit]`: where the keys are. Values live only in the environment, never in this file
/// or the database.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditSection {
    /// Environment variable holding the audit chain HMAC key (64 hex characters).
    pub key_env: String,
    /// Environment variable holding retired audit keys (64 hex characters each, separated
    /// by commas or whitespace): records they signed still verify after a rotation.
    pub previous_keys_env: String,
    /// Environment variable holding the secrets sealing key (64 hex characters).
    pub secrets_key_env: String,
}

impl Default for AuditSection {
    fn default() -> Self {
        AuditSection {
            key_env: "DIFFERENTLY_AUDIT_KEY".into(),
            previous_keys_env: "DIFFERENTLY_AUDIT_PREVIOUS_KEYS".into(),
            secrets_key_env: "DIFFERENTLY_SECRETS_KEY".into(),
        }
    }
}

/// `[metrics]`: the Prometheus exporter's own listener (unauthenticated: bind it where only
/// the scraper reaches).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSection {
    /// `host:port` serving `/metrics` (`DIFFERENTLY_METRICS_LISTEN`); unset: no exporter.
    pub listen: Option<String>,
}

/// `[bus]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BusSection {
    /// Subject and stream prefix (`DIFFERENTLY_BUS_PREFIX`).
    pub prefix: String,
    /// Stream replicas: 1 on one server, 3 in a cluster.
    pub replicas: usize,
    /// Seconds before unacknowledged work is redelivered.
    pub ack_wait_seconds: u64,
    /// Milliseconds between the client's pings to its NATS server (50–60000); two unanswered
    /// pings and it moves to another cluster member.
    pub ping_interval_ms: u64,
    /// Milliseconds a (re)connection to one NATS server may take before the next member is
    /// tried (100–60000). A hung member accepts the TCP connection and never answers, so
    /// this is what reconnecting away from it can cost.
    pub connect_timeout_ms: u64,
    /// Environment variable holding a NATS token.
    pub token_env: Option<String>,
    /// NATS user (with `password_env`).
    pub user: Option<String>,
    /// Environment variable holding the NATS user's password.
    pub password_env: Option<String>,
    /// A NATS `.creds` file (user JWT and nkey seed).
    pub credentials_file: Option<std::path::PathBuf>,
    /// A file holding a NATS nkey seed (`SU…`), for a server that lists the user's public
    /// nkey.
    pub nkey_seed_file: Option<std::path::PathBuf>,
    /// PEM file of CA certificates for `tls://` servers; TLS is then required.
    pub ca_bundle: Option<std::path::PathBuf>,
    /// Environment variable holding the account nkey seed (`SA…`) that signs tenants' event
    /// credentials; the server's `auth_callout.issuer` is its public key. Unset: `POST
    /// /v1/events/credentials` answers 501.
    pub events_account_seed_env: Option<String>,
}

impl Default for BusSection {
    fn default() -> Self {
        BusSection {
            prefix: "dly".into(),
            replicas: 1,
            ack_wait_seconds: 30,
            ping_interval_ms: 500,
            connect_timeout_ms: 1000,
            token_env: None,
            user: None,
            password_env: None,
            credentials_file: None,
            nkey_seed_file: None,
            ca_bundle: None,
            events_account_seed_env: None,
        }
    }
}

/// Largest `scheduler.placement_group_size`: one transaction's locks and statement sizes stay
/// bounded.
pub(super) const MAX_PLACEMENT_GROUP: usize = 256;

/// `[scheduler]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulerSection {
    pub tick_ms: u64,
    pub provisioning_timeout_seconds: u64,
    pub terminating_retry_seconds: u64,
    pub repair_interval_ms: u64,
    /// Idle timeout of sandboxes that set none (`idleTimeoutSeconds`); unset: never idle.
    pub default_idle_timeout_seconds: Option<u64>,
    /// How often each pool's backend listing is reconciled against live rows.
    pub reconcile_interval_seconds: u64,
    /// Most queued sandboxes placed in one transaction (1–256).
    pub placement_group_size: usize,
}

impl Default for SchedulerSection {
    fn default() -> Self {
        SchedulerSection {
            tick_ms: 250,
            provisioning_timeout_seconds: 120,
            terminating_retry_seconds: 30,
            repair_interval_ms: 2000,
            default_idle_timeout_seconds: None,
            reconcile_interval_seconds: 5,
            placement_group_size: 32,
        }
    }
}

/// `[worker]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerSection {
    pub concurrency: usize,
    pub max_deliveries: u64,
    pub max_attempts: u32,
    /// How often each pool's workers look in the store for creates and deletes the bus did
    /// not deliver (while a stream elects a leader); 0 turns it off.
    pub scan_every_ms: u64,
    /// How long after its activation (or `terminating`) an unclaimed create (or delete)
    /// counts as not delivered.
    pub scan_after_ms: u64,
}

impl Default for WorkerSection {
    fn default() -> Self {
        WorkerSection {
            concurrency: 64,
            max_deliveries: 3,
            max_attempts: 3,
            scan_every_ms: 500,
            scan_after_ms: 1000,
        }
    }
}

/// Longest header or body read timeout `[api]` accepts (one hour).
pub(super) const MAX_READ_TIMEOUT_SECONDS: u64 = 3600;

/// `[api]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiSection {
    /// Sustained requests per second per API key (per API process).
    pub key_requests_per_second: f64,
    /// Burst per API key.
    pub key_burst: f64,
    /// Failed authentications per minute per presented key id (and, for missing or
    /// malformed keys, per client address) before that key id or address gets 429s.
    pub auth_failures_per_minute: f64,
    /// Proxies (addresses or CIDRs) whose `X-Forwarded-For` is believed: from one of these
    /// peers the client is the rightmost hop that is not itself listed. Empty: the TCP peer
    /// is the client and the header is ignored.
    pub trusted_proxies: Vec<String>,
    /// Place a create in its own admission transaction when nothing of its org waits and
    /// every eligible pool is uncapped (saves the leader's round); `false`: every create
    /// is placed by the leader.
    pub direct_placement: bool,
    /// Seconds a client may take to send a request's headers before its connection is
    /// closed (slow-header clients hold no connection for long).
    pub header_read_timeout_seconds: u64,
    /// Seconds a request body may take to arrive (a streamed upload: between two chunks);
    /// over it the request gets 408 `request_timeout` and its connection is closed.
    pub body_read_timeout_seconds: u64,
    /// Seconds a terminal (`GET /v1/sandboxes/{id}/pty`) keeps running after its WebSocket
    /// dropped, waiting for a reattach; then its program is hung up.
    pub pty_grace_seconds: u64,
}

impl Default for ApiSection {
    fn default() -> Self {
        ApiSection {
            key_requests_per_second: 100.0,
            key_burst: 200.0,
            auth_failures_per_minute: 30.0,
            trusted_proxies: Vec::new(),
            direct_placement: true,
            header_read_timeout_seconds: 10,
            body_read_timeout_seconds: 30,
            pty_grace_seconds: 30,
        }
    }
}

/// `[e2b]`: the E2B facade (docs/e2b-facade.md).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct E2bSection {
    /// DNS mode: the facade answers `api.<domain>` and `<port>-<id>.<domain>` by `Host`
    /// (`DIFFERENTLY_E2B_DOMAIN`). Unset: off, and only the path-addressed routes serve.
    pub domain: Option<String>,
}
