//! Settings of an `agent_sandbox` pool: what an operator writes ([`AgentSandboxConfig`],
//! every key optional so the registry can name a badly typed key) and what the adapter runs
//! on after validation ([`Settings`]; the bearer token's reference checked, the token itself
//! read at call time).

use std::time::Duration;

use serde::Deserialize;

use crate::credentials::CredentialRef;
use crate::http::Secret;
use crate::settings::{bad, base_url, ca_bundle, opt_u64, ConfigError};

/// The router Service the project's manifests deploy (`sandbox-router/deploy/service.yaml`).
pub const DEFAULT_ROUTER_URL: &str =
    "http://sandbox-router-svc.agent-sandbox-system.svc.cluster.local:8080";
/// The port the project's runtime images listen on (and the router's default).
pub const DEFAULT_RUNTIME_PORT: u16 = 8888;
/// The runtime's `SANDBOX_BASE_DIR` default.
pub const DEFAULT_BASE_DIR: &str = "/app";

/// How sandboxes are made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// A `SandboxClaim` on a `SandboxWarmPool` (the controller adopts a warm pod or
    /// cold-starts one from the pool's template).
    #[default]
    Claim,
    /// A `Sandbox` with the pool's own pod template.
    Sandbox,
}

/// Where the in-pod runtime is reached.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// The sandbox router (default the project's `sandbox-router-svc`); requests carry
    /// `X-Sandbox-ID`, `X-Sandbox-Namespace` and `X-Sandbox-Port`.
    #[serde(rename = "routerURL", alias = "routerUrl")]
    pub router_url: Option<String>,
    /// Instead of the router: each pod's own base URL, with `{name}` (the Sandbox's name)
    /// and optionally `{namespace}`, e.g. `http://{name}.{namespace}.svc.cluster.local:8888`.
    pub url_pattern: Option<String>,
    /// The runtime's port, sent to the router (default 8888).
    #[serde(deserialize_with = "opt_u64")]
    pub port: Option<u64>,
    /// The runtime's `SANDBOX_BASE_DIR` (default `/app`): file paths must lie under it.
    pub base_dir: Option<String>,
}

crate::kit::timeouts! {
    /// Ordinary API and runtime calls (default 30).
    request_seconds: from_secs(30),
    /// Waiting for Ready and the runtime after a create (default 180).
    ready_seconds: from_secs(180),
    /// Longest gap between status polls, in milliseconds (default 500).
    poll_millis: from_millis(500),
}

crate::kit::pool_config! {
    /// Settings of an `agent_sandbox` pool (`adapterSettings`), as written. See
    /// `docs/providers.md`.
    pub struct AgentSandboxConfig {
        /// The Kubernetes API server (`https://host:6443`); required.
        #[serde(rename = "apiServerURL", alias = "apiServerUrl")]
        pub api_server_url: Option<String>,
        /// Namespace of the sandboxes, claims and pools (default `default`).
        pub namespace: Option<String>,
        /// `claim` (default) or `sandbox`.
        pub mode: Option<Mode>,
        /// Claim mode: the `SandboxWarmPool` claims name when the sandbox names no template.
        pub warm_pool: Option<String>,
        /// Sandbox mode: the Sandbox's `spec.podTemplate` (a pod template with at least one
        /// container running the runtime).
        pub pod_template: Option<serde_json::Value>,
        /// Where the in-pod runtime is reached.
        pub runtime: RuntimeConfig,
        /// Client timeouts.
        pub timeouts: TimeoutsConfig,
    }
    credential("token", "bearer token") { token_env, token_file, token_secret }
    ca_bundle("PEM file of the cluster's CA (the API server's certificate is usually private).")
}

/// How the runtime is addressed, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Addressing {
    /// The router's base URL.
    Router(String),
    /// A per-pod URL pattern with `{name}` (and maybe `{namespace}`).
    Pattern(String),
}

/// Validated settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub api_server_url: String,
    pub namespace: String,
    pub mode: Mode,
    pub warm_pool: Option<String>,
    pub pod_template: Option<serde_json::Value>,
    pub addressing: Addressing,
    pub runtime_port: u16,
    pub base_dir: String,
    pub ca_bundle: Vec<reqwest::Certificate>,
    pub request_timeout: Duration,
    pub ready_timeout: Duration,
    pub poll_interval: Duration,
    /// Where the token is read from, at call time.
    pub credential: CredentialRef,
    /// The token as read at validation (env and file references).
    pub initial_token: Option<Secret>,
}

/// A DNS-1123 label, as namespaces and the names here must be.
pub(crate) fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS-1123 subdomain, as object names must be.
pub(crate) fn dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(dns_label)
}

fn addressing(r: &RuntimeConfig) -> Result<Addressing, ConfigError> {
    match (&r.router_url, &r.url_pattern) {
        (Some(_), Some(_)) => bad(
            "runtime.urlPattern",
            "give runtime.routerURL or runtime.urlPattern, not both",
        ),
        (None, Some(p)) => {
            if !p.contains("{name}") {
                return bad("runtime.urlPattern", "must contain {name}");
            }
            let probe = p.replace("{name}", "n").replace("{namespace}", "ns");
            if probe.contains('{') || probe.contains('}') {
                return bad(
                    "runtime.urlPattern",
                    "only {name} and {namespace} may be substituted",
                );
            }
            base_url("runtime.urlPattern", &probe)?;
            Ok(Addressing::Pattern(
                p.trim().trim_end_matches('/').to_owned(),
            ))
        }
        (Some(u), None) => Ok(Addressing::Router(base_url("runtime.routerURL", u)?)),
        (None, None) => Ok(Addressing::Router(base_url(
            "runtime.routerURL",
            DEFAULT_ROUTER_URL,
        )?)),
    }
}

/// An absolute, normalised directory without a trailing slash (`/` stays `/`).
fn base_dir(v: Option<&str>) -> Result<String, ConfigError> {
    let d = v
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .unwrap_or(DEFAULT_BASE_DIR);
    if !d.starts_with('/') || d.contains('\0') || d.split('/').any(|c| c == ".." || c == ".") {
        return bad(
            "runtime.baseDir",
            "must be an absolute directory without . or .. components",
        );
    }
    let trimmed = d.trim_end_matches('/');
    Ok(if trimmed.is_empty() {
        "/".to_owned()
    } else {
        trimmed.to_owned()
    })
}

impl AgentSandboxConfig {
    /// Checks every rule and resolves the token reference.
    pub fn validate(&self) -> Result<Settings, ConfigError> {
        let Some(api) = self
            .api_server_url
            .as_deref()
            .filter(|u| !u.trim().is_empty())
        else {
            return bad(
                "apiServerURL",
                "the Kubernetes API server's URL is required",
            );
        };
        let api_server_url = base_url("apiServerURL", api)?;
        let namespace = self
            .namespace
            .clone()
            .filter(|n| !n.trim().is_empty())
            .unwrap_or_else(|| "default".to_owned());
        if !dns_label(&namespace) {
            return bad("namespace", "must be a DNS-1123 label (a-z, 0-9, '-')");
        }
        let mode = self.mode.unwrap_or_default();
        let warm_pool = self.warm_pool.clone().filter(|p| !p.trim().is_empty());
        if warm_pool.as_deref().is_some_and(|p| !dns_subdomain(p)) {
            return bad("warmPool", "must be a Kubernetes object name");
        }
        let pod_template = self.pod_template.clone();
        match mode {
            Mode::Sandbox => {
                let containers = pod_template
                    .as_ref()
                    .and_then(|t| t.get("spec"))
                    .and_then(|s| s.get("containers"))
                    .and_then(|c| c.as_array());
                if containers.is_none_or(|c| c.is_empty()) {
                    return bad(
                        "podTemplate",
                        "sandbox mode needs a pod template with spec.containers (the runtime's container first)",
                    );
                }
            }
            Mode::Claim if pod_template.is_some() => {
                return bad(
                    "podTemplate",
                    "only sandbox mode takes a pod template; claims take theirs from the warm pool's SandboxTemplate",
                )
            }
            Mode::Claim => {}
        }
        let r = &self.runtime;
        let addressing = addressing(r)?;
        let runtime_port = match r.port.unwrap_or(u64::from(DEFAULT_RUNTIME_PORT)) {
            p @ 1..=65535 => u16::try_from(p).unwrap_or(DEFAULT_RUNTIME_PORT),
            _ => return bad("runtime.port", "must be 1-65535"),
        };
        let base_dir = base_dir(r.base_dir.as_deref())?;
        let t = &self.timeouts;
        let (credential, initial_token) = self.credential()?;
        Ok(Settings {
            api_server_url,
            namespace,
            mode,
            warm_pool,
            pod_template,
            addressing,
            runtime_port,
            base_dir,
            ca_bundle: ca_bundle(self.ca_bundle.as_ref())?,
            request_timeout: t.request_seconds()?,
            ready_timeout: t.ready_seconds()?,
            poll_interval: t.poll_millis()?,
            credential,
            initial_token,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(v: serde_json::Value) -> Result<Settings, ConfigError> {
        serde_json::from_value::<AgentSandboxConfig>(v)
            .map_err(|e| ConfigError {
                field: "?".into(),
                message: e.to_string(),
            })?
            .validate()
    }

    #[test]
    fn the_api_server_and_a_token_are_required_and_defaults_fill_the_rest() {
        assert_eq!(
            cfg(serde_json::json!({})).unwrap_err().field,
            "apiServerURL"
        );
        let e = cfg(serde_json::json!({"apiServerURL": "https://k:6443"})).unwrap_err();
        assert_eq!(e.field, "tokenEnv");
        let s = cfg(serde_json::json!({"apiServerURL": "https://k:6443/", "tokenSecret": "k8s"}))
            .unwrap();
        assert_eq!(s.api_server_url, "https://k:6443");
        assert_eq!(s.namespace, "default");
        assert_eq!(s.mode, Mode::Claim);
        assert_eq!(s.addressing, Addressing::Router(DEFAULT_ROUTER_URL.into()));
        assert_eq!((s.runtime_port, s.base_dir.as_str()), (8888, "/app"));
    }

    #[test]
    fn bad_values_name_their_field() {
        let base = |extra: serde_json::Value| {
            let mut v = serde_json::json!({"apiServerURL": "https://k", "tokenSecret": "t"});
            for (k, x) in extra.as_object().unwrap() {
                v[k] = x.clone();
            }
            cfg(v).unwrap_err().field
        };
        assert_eq!(
            base(serde_json::json!({"namespace": "Not_A_Label"})),
            "namespace"
        );
        assert_eq!(base(serde_json::json!({"mode": "sandbox"})), "podTemplate");
        assert_eq!(
            base(serde_json::json!({"podTemplate": {"spec": {"containers": [{}]}}})),
            "podTemplate"
        );
        assert_eq!(
            base(serde_json::json!({"runtime": {"urlPattern": "http://x:8888"}})),
            "runtime.urlPattern"
        );
        assert_eq!(
            base(
                serde_json::json!({"runtime": {"urlPattern": "http://{name}:1", "routerURL": "http://r"}})
            ),
            "runtime.urlPattern"
        );
        assert_eq!(
            base(serde_json::json!({"runtime": {"port": 70000}})),
            "runtime.port"
        );
        assert_eq!(
            base(serde_json::json!({"runtime": {"baseDir": "app"}})),
            "runtime.baseDir"
        );
        assert_eq!(
            base(serde_json::json!({"warmPool": "Bad Pool"})),
            "warmPool"
        );
    }

    #[test]
    fn base_dirs_normalise() {
        assert_eq!(base_dir(Some("/")).unwrap(), "/");
        assert_eq!(base_dir(Some("/work/")).unwrap(), "/work");
        assert!(base_dir(Some("/a/../b")).is_err());
    }
}
