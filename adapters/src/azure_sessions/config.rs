//! Settings of an `azure_sessions` pool: what an operator writes (`AzureSessionsConfig`, every
//! key optional so the registry can name a badly typed key) and what the adapter runs on after
//! validation (`Settings`; the access token's reference checked, the token read at call time).

use std::time::Duration;

use crate::credentials::CredentialRef;
use crate::http::Secret;
use crate::settings::{bad, base_url, ca_bundle, opt_u64, seconds, ConfigError};

/// The data-plane API version spoken: the first with both the session management routes
/// (`/session`, `/listSessions`) and shell executions (`shellCommand`, `stdin`).
pub const API_VERSION: &str = "2025-10-02-preview";

/// Where a session's files API keeps files.
pub const DEFAULT_DATA_DIR: &str = "/mnt/data";

/// The longest execution Azure documents (code interpreter: "a maximum runtime of 220 seconds").
pub const DEFAULT_MAX_EXEC_SECONDS: u64 = 220;

crate::kit::timeouts! {
    /// Ordinary calls (default 30); an execution gets its own timeout on top.
    request_seconds: from_secs(30),
}

crate::kit::pool_config! {
    /// Settings of an `azure_sessions` pool (`adapterSettings`), as written. See
    /// `docs/providers.md`.
    pub struct AzureSessionsConfig {
        /// The pool's `poolManagementEndpoint`
        /// (`https://<region>.dynamicsessions.io/subscriptions/…/sessionPools/<name>`).
        pub pool_management_endpoint: Option<String>,
        /// The data-plane API version; only [`API_VERSION`] is spoken.
        pub api_version: Option<String>,
        /// The pool's `containerType`; only `Shell` runs commands (see the module docs).
        pub container_type: Option<String>,
        /// Where the files API keeps files inside a session (default `/mnt/data`).
        pub data_dir: Option<String>,
        /// Longest exec timeout accepted (default 220); a longer one is refused naming
        /// `timeoutSeconds`.
        #[serde(deserialize_with = "opt_u64")]
        pub max_exec_seconds: Option<u64>,
        /// `outputStreamsMaxLength` sent with every execution (default 1 MiB; Azure's is 4096).
        #[serde(deserialize_with = "opt_u64")]
        pub output_max_length: Option<u64>,
        /// Client timeouts.
        pub timeouts: TimeoutsConfig,
    }
    credential("token", "access token") { token_env, token_file, token_secret }
    ca_bundle("PEM file of extra CA certificates.")
}

/// Validated settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub endpoint: String,
    pub api_version: String,
    pub data_dir: String,
    pub max_exec: Duration,
    pub output_max_length: u64,
    pub ca_bundle: Vec<reqwest::Certificate>,
    pub request_timeout: Duration,
    /// Where the token is read from, at call time.
    pub credential: CredentialRef,
    /// The token as read at validation (env and file references).
    pub initial_token: Option<Secret>,
}

/// Why a container type other than `Shell` is refused.
fn container_type(v: Option<&str>) -> Result<(), ConfigError> {
    match v.map(str::trim) {
        None | Some("") | Some("Shell") => Ok(()),
        Some(t @ ("PythonLTS" | "NodeLTS")) => bad(
            "containerType",
            format!(
                "a {t} pool runs code in an interpreter, not commands: Differently's exec runs an \
                 argument vector, which only a `Shell` pool (`shellCommand`) runs as such; use a \
                 Shell session pool"
            ),
        ),
        Some("CustomContainer") => bad(
            "containerType",
            "a CustomContainer pool answers whatever API its image serves; Differently cannot \
             know how to run a command in it",
        ),
        Some(other) => bad(
            "containerType",
            format!("unknown container type `{other}`; only `Shell` is supported"),
        ),
    }
}

impl AzureSessionsConfig {
    /// Checks every rule and resolves the token reference.
    pub fn validate(&self) -> Result<Settings, ConfigError> {
        let Some(endpoint) = self
            .pool_management_endpoint
            .as_deref()
            .filter(|e| !e.trim().is_empty())
        else {
            return bad(
                "poolManagementEndpoint",
                "required: the session pool's management endpoint (az containerapp sessionpool show --query properties.poolManagementEndpoint)",
            );
        };
        let endpoint = base_url("poolManagementEndpoint", endpoint)?;
        let api_version = match self.api_version.as_deref().map(str::trim) {
            None | Some("") => API_VERSION.to_owned(),
            Some(API_VERSION) => API_VERSION.to_owned(),
            Some(other) => {
                return bad(
                    "apiVersion",
                    format!("`{other}` is not spoken; only {API_VERSION} (the first with session management and shell executions)"),
                )
            }
        };
        container_type(self.container_type.as_deref())?;
        let data_dir = match self.data_dir.as_deref().map(str::trim) {
            None | Some("") => DEFAULT_DATA_DIR.to_owned(),
            Some(d) if d.starts_with('/') && !d.contains('\'') && !d.contains('\0') => {
                d.trim_end_matches('/').to_owned()
            }
            Some(_) => return bad("dataDir", "must be an absolute path without quotes"),
        };
        let max_exec = seconds(
            self.max_exec_seconds,
            DEFAULT_MAX_EXEC_SECONDS,
            "maxExecSeconds",
        )?;
        let output_max_length = match self
            .output_max_length
            .unwrap_or(differently_core::exec::OUTPUT_CAP_BYTES as u64)
        {
            n if n < 4096 => return bad("outputMaxLength", "must be at least 4096"),
            n if n > i32::MAX as u64 => return bad("outputMaxLength", "must fit an int32"),
            n => n,
        };
        let request_timeout = self.timeouts.request_seconds()?;
        let ca_bundle = ca_bundle(self.ca_bundle.as_ref())?;
        let (credential, initial_token) = self.credential()?;
        Ok(Settings {
            endpoint,
            api_version,
            data_dir,
            max_exec,
            output_max_length,
            ca_bundle,
            request_timeout,
            credential,
            initial_token,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(f: impl FnOnce(&mut AzureSessionsConfig)) -> Result<Settings, ConfigError> {
        let mut c = AzureSessionsConfig {
            pool_management_endpoint: Some(
                "https://eastus.dynamicsessions.io/subscriptions/s/resourceGroups/g/sessionPools/p/"
                    .into(),
            ),
            token_secret: Some("azure-token".into()),
            ..Default::default()
        };
        f(&mut c);
        c.validate()
    }

    #[test]
    fn defaults_and_required_fields() {
        let s = with(|_| {}).unwrap();
        assert_eq!(
            s.endpoint,
            "https://eastus.dynamicsessions.io/subscriptions/s/resourceGroups/g/sessionPools/p"
        );
        assert_eq!(s.api_version, API_VERSION);
        assert_eq!(s.data_dir, "/mnt/data");
        assert_eq!(s.max_exec, Duration::from_secs(220));
        let e = with(|c| c.pool_management_endpoint = None).unwrap_err();
        assert_eq!(e.field, "poolManagementEndpoint");
        let e = with(|c| c.token_secret = None).unwrap_err();
        assert_eq!(e.field, "tokenEnv");
    }

    #[test]
    fn only_shell_pools_and_the_one_version_are_accepted() {
        for t in ["PythonLTS", "NodeLTS", "CustomContainer", "Bash"] {
            let e = with(|c| c.container_type = Some(t.into())).unwrap_err();
            assert_eq!(e.field, "containerType", "{t}");
        }
        assert!(with(|c| c.container_type = Some("Shell".into())).is_ok());
        let e = with(|c| c.api_version = Some("2024-02-02-preview".into())).unwrap_err();
        assert_eq!(e.field, "apiVersion");
        let e = with(|c| c.data_dir = Some("data".into())).unwrap_err();
        assert_eq!(e.field, "dataDir");
        let e = with(|c| c.output_max_length = Some(10)).unwrap_err();
        assert_eq!(e.field, "outputMaxLength");
    }
}
