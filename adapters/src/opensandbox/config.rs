//! Settings of an `opensandbox` pool: what an operator writes (`OpenSandboxConfig`, every key
//! optional so the registry can name a badly typed key), and what the adapter runs on after
//! validation (`Settings`, with the API key's reference checked; the key itself is read at
//! call time).
//!
//! Pool config values are often strings (`"true"`, `"exec,files"`), so booleans, numbers and
//! lists also accept their string forms.

use std::time::Duration;

use differently_core::sandbox::KNOWN_CAPABILITIES;
use serde::{Deserialize, Deserializer};

use crate::settings::{bad, base_url, ca_bundle, opt_bool, opt_u64, seconds, ConfigError};
use crate::Capability;

/// Who operates the OpenSandbox server; Differently cannot tell, so it must be declared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Trust {
    Private,
    External,
}

/// The runtime behind the OpenSandbox server; it decides the capabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    Docker,
    Kubernetes,
    Fastsandbox,
}

/// Declared isolation (reported, not enforced).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    Container,
    Microvm,
}

/// Whether execd keeps line terminators in its output events (release-1.2.0) or strips them (1.1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LineEndings {
    #[default]
    Stripped,
    Kept,
}

/// How port URLs are made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Ports {
    /// No signed routes (Fast Sandbox still has route scopes when `ports.expose` is a feature).
    #[default]
    #[serde(alias = "")]
    None,
    /// Signed gateway routes (Kubernetes ingress gateway with Secure Access).
    Signed,
}

/// Scheme put in front of the scheme-less endpoints OpenSandbox returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PortScheme {
    Http,
    #[default]
    Https,
}

/// Outbound network policy sent with every sandbox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Egress {
    /// No policy: outbound traffic is whatever the runtime allows.
    #[default]
    #[serde(alias = "")]
    Public,
    /// Deny all outbound traffic.
    None,
    /// Deny all but `egressAllow`.
    Allowlist,
}

crate::kit::timeouts! {
    /// Ordinary API and execd calls (default 30).
    request_seconds: from_secs(30),
    /// The create call itself; the Docker runtime pulls the image inside it (default 600).
    create_seconds: from_secs(600),
    /// Waiting for `Running` and for execd to answer after create or resume (default 180).
    ready_seconds: from_secs(180),
    /// Longest silence on an exec stream; execd pings every 3 s (default 60).
    stream_idle_seconds: from_secs(60),
    /// Longest gap between state polls, in milliseconds (default 500); polls start 10 ms
    /// apart and double up to it (`crate::poll`).
    poll_millis: from_millis(500),
}

crate::kit::pool_config! {
    /// Settings of an `opensandbox` pool (`adapterSettings`), as written. See `docs/opensandbox.md`.
    pub struct OpenSandboxConfig {
        /// The lifecycle API, ending in `/v1` (required; `http://` or `https://`).
        #[serde(rename = "apiURL", alias = "apiUrl")]
        pub api_url: Option<String>,
        /// `private` or `external` (required).
        pub trust: Option<Trust>,
        /// Default image URI (default `ubuntu:24.04`); a sandbox template overrides it.
        pub image: Option<String>,
        /// `container` (default) or `microvm` (default and required for `fastsandbox`).
        pub isolation: Option<Isolation>,
        /// `docker` (default), `kubernetes` or `fastsandbox`.
        pub runtime: Option<Runtime>,
        /// Fast Sandbox template (required for, and only for, `runtime: fastsandbox`).
        pub template_id: Option<String>,
        /// Replaces the advertised capability list (list or comma string).
        #[serde(deserialize_with = "opt_list")]
        pub features: Option<Vec<String>>,
        /// Reach execd through the server's proxy (`true`) or its own endpoint (`false`);
        /// unset: by the server's version (proxy before 1.3, direct from 1.3), direct for
        /// `fastsandbox`.
        #[serde(deserialize_with = "opt_bool")]
        pub use_server_proxy: Option<bool>,
        /// `stripped` (default, execd 1.1) or `kept` (execd 1.2).
        pub line_endings: Option<LineEndings>,
        /// `none` (default) or `signed`.
        pub ports: Option<Ports>,
        /// Lifetime of a signed port URL (default 3600).
        #[serde(
            rename = "portURLSeconds",
            alias = "portUrlSeconds",
            deserialize_with = "opt_u64"
        )]
        pub port_url_seconds: Option<u64>,
        /// `https` (default) or `http`, put in front of port URLs.
        pub port_scheme: Option<PortScheme>,
        /// `public` (default), `none` or `allowlist`.
        pub egress: Option<Egress>,
        /// Hosts allowed with `egress: allowlist` (list or comma string).
        #[serde(deserialize_with = "opt_list")]
        pub egress_allow: Option<Vec<String>>,
        /// Client timeouts.
        pub timeouts: TimeoutsConfig,
        /// Fast Sandbox restore size: the SandboxPool's CPU (e.g. `2`).
        #[serde(rename = "poolCPU", alias = "poolCpu")]
        pub pool_cpu: Option<String>,
        /// Fast Sandbox restore size: the SandboxPool's memory (e.g. `4Gi`).
        pub pool_memory: Option<String>,
        /// How long pause and snapshot may take (default 900; Fast Sandbox writes full checkpoints).
        #[serde(deserialize_with = "opt_u64")]
        pub checkpoint_timeout_seconds: Option<u64>,
        /// OpenSandbox `timeout` for a sandbox without a TTL where one is required (default 86400).
        #[serde(deserialize_with = "opt_u64")]
        pub timeout_seconds: Option<u64>,
    }
    credential("apiKey", "API key") { api_key_env, api_key_file, api_key_secret }
    ca_bundle("PEM file of extra CA certificates to trust for an `https://` apiURL (a private CA); the OS's roots are trusted either way.")
}

/// The server's API key. Never printed: `Debug` shows `***` and there is no `Display`.
pub use crate::http::Secret as ApiKey;

pub use crate::credentials::CredentialRef;

/// How the adapter reaches execd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecdPath {
    /// Through the server's proxy (`useServerProxy: true`).
    ServerProxy,
    /// execd's own endpoint, with the headers (access token) the endpoint API gives.
    Direct,
    /// Not set: the proxy before server 1.3, direct from 1.3, where the proxy is in
    /// maintenance mode and the direct endpoint carries the sandbox's access token.
    ByVersion,
}

/// Validated settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Lifecycle API base without a trailing slash, e.g. `http://host:8080/v1`.
    pub api_url: String,
    /// Extra CA certificates trusted for the API (from `caBundle`, read at validation).
    pub ca_bundle: Vec<reqwest::Certificate>,
    pub trust: Trust,
    pub image: String,
    pub isolation: Isolation,
    pub runtime: Runtime,
    pub template_id: Option<String>,
    /// What `capabilities()` advertises (but `warm`, offered on every runtime), in order.
    pub capabilities: Vec<Capability>,
    /// How execd is reached.
    pub execd_path: ExecdPath,
    pub line_endings: LineEndings,
    pub ports: Ports,
    pub port_url_seconds: u64,
    pub port_scheme: PortScheme,
    pub egress: Egress,
    pub egress_allow: Vec<String>,
    pub request_timeout: Duration,
    pub create_timeout: Duration,
    pub ready_timeout: Duration,
    pub stream_idle: Duration,
    pub poll_interval: Duration,
    pub pool_cpu: Option<String>,
    pub pool_memory: Option<String>,
    pub checkpoint_timeout: Duration,
    pub default_timeout_seconds: u64,
    /// Where the API key is read from, at call time.
    pub credential: CredentialRef,
    /// The key as read at validation (env and file references), reused until it is re-read.
    pub initial_key: Option<ApiKey>,
}

/// Capabilities an adapter method backs on `runtime` (before `features` and `ports`).
fn backed(runtime: Runtime, ports: Ports) -> Vec<Capability> {
    let mut caps = vec![
        Capability::Exec,
        Capability::Files,
        Capability::ExecStream,
        Capability::Snapshots,
    ];
    match runtime {
        // Docker and Fast Sandbox keep memory on pause; Kubernetes commits the disk and frees
        // the pod, which is a stop, not a pause.
        Runtime::Docker | Runtime::Fastsandbox => caps.push(Capability::LifecyclePause),
        Runtime::Kubernetes => caps.push(Capability::LifecycleStop),
    }
    match (runtime, ports) {
        (Runtime::Kubernetes, Ports::Signed) | (Runtime::Fastsandbox, _) => {
            caps.push(Capability::PortsExpose)
        }
        _ => {}
    }
    caps
}

/// Capabilities with no adapter method behind them: advertised only when declared.
const DECLARED_ONLY: [Capability; 2] = [Capability::NetworkEgressControl, Capability::Gpu];

impl OpenSandboxConfig {
    /// Checks every rule and resolves the API key reference.
    pub fn validate(&self) -> Result<Settings, ConfigError> {
        let api_url = validate_api_url(self.api_url.as_deref())?;
        let ca_bundle = ca_bundle(self.ca_bundle.as_ref())?;
        let Some(trust) = self.trust else {
            return bad(
                "trust",
                "required: `private` if you run the OpenSandbox server, `external` if someone else does",
            );
        };
        let runtime = self.runtime.unwrap_or(Runtime::Docker);
        let isolation = self.isolation.unwrap_or(match runtime {
            Runtime::Fastsandbox => Isolation::Microvm,
            _ => Isolation::Container,
        });
        let ports = self.ports.unwrap_or_default();
        let template_id = self.template_id.clone().filter(|t| !t.trim().is_empty());
        match runtime {
            Runtime::Fastsandbox => {
                if template_id.is_none() {
                    return bad("templateId", "required with runtime `fastsandbox`");
                }
                if isolation == Isolation::Container {
                    return bad(
                        "isolation",
                        "runtime `fastsandbox` runs microVMs; isolation must be `microvm`",
                    );
                }
                if ports == Ports::Signed {
                    return bad(
                        "ports",
                        "`signed` needs secure access, which Fast Sandbox templates reject; add `ports.expose` to features for route scopes",
                    );
                }
            }
            Runtime::Docker | Runtime::Kubernetes => {
                if template_id.is_some() {
                    return bad("templateId", "only for runtime `fastsandbox`");
                }
                if runtime == Runtime::Docker && ports == Ports::Signed {
                    return bad(
                        "ports",
                        "`signed` needs OpenSandbox's Kubernetes ingress gateway; the Docker runtime refuses signed routes",
                    );
                }
            }
        }
        let image = match self.image.as_deref().map(str::trim) {
            None | Some("") => "ubuntu:24.04".to_owned(),
            Some(i) if i.chars().any(char::is_whitespace) => {
                return bad("image", "an image URI has no whitespace")
            }
            Some(i) => i.to_owned(),
        };

        let egress = self.egress.unwrap_or_default();
        let egress_allow = self.egress_allow.clone().unwrap_or_default();
        match egress {
            Egress::Allowlist if egress_allow.is_empty() => {
                return bad("egressAllow", "required with egress `allowlist`")
            }
            Egress::Public | Egress::None if !egress_allow.is_empty() => {
                return bad("egressAllow", "only with egress `allowlist`")
            }
            _ => {}
        }
        for host in &egress_allow {
            let body = host.strip_prefix("*.").unwrap_or(host);
            let ok = !body.is_empty()
                && body.len() <= 253
                && body.split('.').all(|l| {
                    !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                });
            if !ok {
                return bad(
                    "egressAllow",
                    format!("`{host}` is not a host name or `*.` wildcard"),
                );
            }
        }

        let execd_path = match (self.use_server_proxy, runtime) {
            (Some(true), _) => ExecdPath::ServerProxy,
            (Some(false), _) | (None, Runtime::Fastsandbox) => ExecdPath::Direct,
            (None, _) => ExecdPath::ByVersion,
        };
        let mut backed = backed(runtime, ports);
        if execd_path == ExecdPath::Direct {
            // execd's PTY WebSocket, reached directly; through the server proxy it is not
            // verified, so not offered.
            backed.push(Capability::ExecPty);
        }
        let capabilities: Vec<Capability> = match &self.features {
            None => {
                let mut caps: Vec<Capability> = backed
                    .iter()
                    .copied()
                    // Fast Sandbox route scopes never expire: only when declared.
                    .filter(|c| !(runtime == Runtime::Fastsandbox && *c == Capability::PortsExpose))
                    .collect();
                if egress != Egress::Public {
                    caps.push(Capability::NetworkEgressControl);
                }
                order(caps)
            }
            Some(features) => {
                let mut names = Vec::with_capacity(features.len());
                for f in features {
                    // The seeds' spellings of two API names.
                    let name = match f.as_str() {
                        "lifecycle.pause-resume" => "lifecycle.pause",
                        "snapshots.disk" => "snapshots",
                        other => other,
                    };
                    let Some(cap) = Capability::parse(name).filter(|c| *c != Capability::Warm)
                    else {
                        let why = if differently_core::policy::capabilities::is_known(name) {
                            "is not advertised by adapters (isolation comes from `isolation`, restore from `snapshots`)"
                        } else {
                            "is not a capability"
                        };
                        return bad(
                            "features",
                            format!("`{f}` {why}; use: {}", KNOWN_CAPABILITIES.join(", ")),
                        );
                    };
                    names.push(cap);
                }
                // A feature with no working method on this runtime is dropped, never faked.
                let kept: Vec<Capability> = names
                    .into_iter()
                    .filter(|f| backed.contains(f) || DECLARED_ONLY.contains(f))
                    .collect();
                order(kept)
            }
        };

        let t = &self.timeouts;
        let request_timeout = t.request_seconds()?;
        let create_timeout = t.create_seconds()?;
        let ready_timeout = t.ready_seconds()?;
        let stream_idle = t.stream_idle_seconds()?;
        let poll_interval = t.poll_millis()?;
        let checkpoint_timeout = seconds(
            self.checkpoint_timeout_seconds,
            900,
            "checkpointTimeoutSeconds",
        )?;
        let default_timeout_seconds = match self.timeout_seconds.unwrap_or(86_400) {
            n if n < 60 => return bad("timeoutSeconds", "OpenSandbox's minimum is 60"),
            n => n,
        };
        let port_url_seconds = match self.port_url_seconds.unwrap_or(3600) {
            n if n < 60 => return bad("portURLSeconds", "must be at least 60"),
            n => n,
        };

        let pool_cpu = self.pool_cpu.clone().filter(|s| !s.is_empty());
        let pool_memory = self.pool_memory.clone().filter(|s| !s.is_empty());
        if let Some(cpu) = &pool_cpu {
            if !is_quantity(cpu, &["m"]) {
                return bad(
                    "poolCPU",
                    format!("`{cpu}` is not a CPU quantity like `2` or `500m`"),
                );
            }
        }
        if let Some(mem) = &pool_memory {
            if !is_quantity(mem, &["Ki", "Mi", "Gi", "Ti", "K", "M", "G", "T"]) {
                return bad(
                    "poolMemory",
                    format!("`{mem}` is not a memory quantity like `4Gi` or `512Mi`"),
                );
            }
        }
        if pool_cpu.is_some() != pool_memory.is_some() {
            let missing = if pool_cpu.is_none() {
                "poolCPU"
            } else {
                "poolMemory"
            };
            return bad(missing, "poolCPU and poolMemory are set together");
        }

        let (credential, initial_key) = self.credential()?;

        Ok(Settings {
            api_url,
            ca_bundle,
            trust,
            image,
            isolation,
            runtime,
            template_id,
            capabilities,
            execd_path,
            line_endings: self.line_endings.unwrap_or_default(),
            ports,
            port_url_seconds,
            port_scheme: self.port_scheme.unwrap_or_default(),
            egress,
            egress_allow,
            request_timeout,
            create_timeout,
            ready_timeout,
            stream_idle,
            poll_interval,
            pool_cpu,
            pool_memory,
            checkpoint_timeout,
            default_timeout_seconds,
            credential,
            initial_key,
        })
    }
}

/// Orders capabilities as pool documents list them, without duplicates.
fn order(mut caps: Vec<Capability>) -> Vec<Capability> {
    caps.sort_unstable();
    caps.dedup();
    caps
}

fn is_quantity(s: &str, suffixes: &[&str]) -> bool {
    let digits = suffixes
        .iter()
        .find_map(|suf| s.strip_suffix(suf))
        .unwrap_or(s);
    !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit() || c == '.')
}

fn validate_api_url(url: Option<&str>) -> Result<String, ConfigError> {
    let Some(url) = url.map(str::trim).filter(|u| !u.is_empty()) else {
        return bad(
            "apiURL",
            "required: the OpenSandbox lifecycle API, e.g. http://opensandbox-server/v1",
        );
    };
    base_url("apiURL", url)
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ListOrCsv {
    List(Vec<String>),
    Csv(String),
}

fn opt_list<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    Ok(Option::<ListOrCsv>::deserialize(d)?.map(|v| {
        let items = match v {
            ListOrCsv::List(l) => l,
            ListOrCsv::Csv(s) => s.split(',').map(str::to_owned).collect(),
        };
        items
            .into_iter()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect()
    }))
}
