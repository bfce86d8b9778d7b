//! Settings of a `remote` pool: where the plugin is, the token by reference, TLS and timeouts.

use std::path::PathBuf;
use std::time::Duration;

use differently_core::pool::valid_secret_name;
use serde::Deserialize;

use crate::credentials::CredentialRef;
use crate::settings::{bad, ca_bundle, ConfigError};

crate::kit::timeouts! {
    /// Connecting to the plugin (default 10).
    connect_seconds: from_secs(10),
    /// Ordinary calls (default 30).
    request_seconds: from_secs(30),
    /// `create`, which may start a machine (default 600).
    create_seconds: from_secs(600),
    /// Added to an exec's own timeout for the HTTP call around it (default 30).
    exec_grace_seconds: from_secs(30),
    /// Longest silence on an exec stream or a file body (default 300).
    stream_idle_seconds: from_secs(300),
}

/// Settings of a `remote` pool (`adapterSettings`), as written. See `docs/plugins.md`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RemoteConfig {
    /// The plugin's base URL (`https://plugin.internal:8443`); `/adapter/v1` is added.
    pub url: Option<String>,
    /// The bearer token, by reference: `env:NAME`, `file:PATH` or `secret:NAME`.
    pub token: Option<String>,
    /// Allows an `http://` URL (a plugin on the same host or a private network); without it
    /// only `https://` is accepted, so the token never crosses a network in clear by accident.
    pub allow_http: bool,
    /// PEM file of extra CA certificates to trust (a private CA); the OS's roots are trusted
    /// either way.
    pub ca_bundle: Option<PathBuf>,
    /// Client timeouts.
    pub timeouts: TimeoutsConfig,
}

/// Validated settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `scheme://host:port[/prefix]/adapter/v1`, no trailing slash.
    pub base_url: String,
    pub token: CredentialRef,
    pub ca_bundle: Vec<reqwest::Certificate>,
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    pub create_timeout: Duration,
    pub exec_grace: Duration,
    pub stream_idle: Duration,
}

/// Parses a credential reference written as `env:NAME`, `file:PATH` or `secret:NAME` (the
/// form `CredentialRef` displays as).
pub fn parse_reference(s: &str) -> Result<CredentialRef, String> {
    let (kind, rest) = s
        .split_once(':')
        .ok_or_else(|| "a reference: env:NAME, file:PATH or secret:NAME".to_owned())?;
    if rest.is_empty() {
        return Err(format!("`{kind}:` names nothing"));
    }
    match kind {
        "env" => Ok(CredentialRef::Env(rest.to_owned())),
        "file" => Ok(CredentialRef::File(PathBuf::from(rest))),
        "secret" if valid_secret_name(rest) => Ok(CredentialRef::Secret(rest.to_owned())),
        "secret" => Err("a stored secret's name: 1-63 characters of a-z, 0-9, '.', '_' or '-', starting with a letter or digit".to_owned()),
        // Never echo what was written: it may be the token itself, pasted by mistake.
        _ => Err("a reference: env:NAME, file:PATH or secret:NAME (never the token itself)".to_owned()),
    }
}

impl RemoteConfig {
    /// Checks every rule. The token is not read here: a stored secret may be stored after
    /// the pool is registered, and a file may be mounted later; a call reads it.
    pub fn validate(&self) -> Result<Settings, ConfigError> {
        let Some(url) = self.url.as_deref().map(str::trim).filter(|u| !u.is_empty()) else {
            return bad(
                "url",
                "required: the plugin's base URL, e.g. https://plugin.internal:8443",
            );
        };
        let rest = if let Some(rest) = url.strip_prefix("https://") {
            rest
        } else if let Some(rest) = url.strip_prefix("http://") {
            if !self.allow_http {
                return bad(
                    "url",
                    "is http://: the token would travel in clear; use https:// or set allowHttp: true",
                );
            }
            rest
        } else {
            return bad(
                "url",
                "must start with https:// (or http:// with allowHttp)",
            );
        };
        let authority = rest.split('/').next().unwrap_or("");
        if authority.is_empty() {
            return bad("url", "has no host");
        }
        if authority.contains('@') {
            return bad("url", "must not carry credentials; use token");
        }
        if url.contains('?') || url.contains('#') || url.chars().any(char::is_whitespace) {
            return bad("url", "must be a plain base URL without query or fragment");
        }
        let trimmed = url.trim_end_matches('/');
        let base_url = match trimmed.strip_suffix(super::wire::BASE_PATH) {
            Some(b) => format!("{b}{}", super::wire::BASE_PATH),
            None => format!("{trimmed}{}", super::wire::BASE_PATH),
        };
        let token = match self.token.as_deref().map(str::trim) {
            None | Some("") => {
                return bad(
                    "token",
                    "required: the plugin's bearer token by reference (env:NAME, file:PATH or secret:NAME)",
                )
            }
            Some(t) => parse_reference(t).map_err(|message| ConfigError {
                field: "token".to_owned(),
                message,
            })?,
        };
        let ca_bundle = ca_bundle(self.ca_bundle.as_ref())?;
        let t = &self.timeouts;
        Ok(Settings {
            base_url,
            token,
            ca_bundle,
            connect_timeout: t.connect_seconds()?,
            request_timeout: t.request_seconds()?,
            create_timeout: t.create_seconds()?,
            exec_grace: t.exec_grace_seconds()?,
            stream_idle: t.stream_idle_seconds()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(v: serde_json::Value) -> Result<Settings, ConfigError> {
        serde_json::from_value::<RemoteConfig>(v)
            .unwrap()
            .validate()
    }

    #[test]
    fn http_needs_allow_http_and_the_prefix_is_added_once() {
        let e =
            cfg(serde_json::json!({"url": "http://127.0.0.1:9", "token": "env:T"})).unwrap_err();
        assert_eq!(e.field, "url");
        let s = cfg(
            serde_json::json!({"url": "http://127.0.0.1:9/", "token": "env:T", "allowHttp": true}),
        )
        .unwrap();
        assert_eq!(s.base_url, "http://127.0.0.1:9/adapter/v1");
        let s = cfg(
            serde_json::json!({"url": "https://p.example/x/adapter/v1", "token": "secret:plug"}),
        )
        .unwrap();
        assert_eq!(s.base_url, "https://p.example/x/adapter/v1");
        assert_eq!(s.token, CredentialRef::Secret("plug".into()));
    }

    #[test]
    fn token_is_a_reference_and_never_echoed() {
        let e = cfg(serde_json::json!({"url": "https://p"})).unwrap_err();
        assert_eq!(e.field, "token");
        let e = cfg(serde_json::json!({"url": "https://p", "token": "s3cr3t-value"})).unwrap_err();
        assert_eq!(e.field, "token");
        assert!(!e.to_string().contains("s3cr3t"), "{e}");
        let e = cfg(serde_json::json!({"url": "https://p", "token": "bearer:s3cr3t"})).unwrap_err();
        assert!(!e.to_string().contains("s3cr3t"), "{e}");
        assert_eq!(
            parse_reference("file:/run/t").unwrap(),
            CredentialRef::File("/run/t".into())
        );
        let e = cfg(serde_json::json!({"url": "https://u:p@h", "token": "env:T"})).unwrap_err();
        assert_eq!(e.field, "url");
        let e = cfg(serde_json::json!({"url": "https://h", "token": "env:T", "timeouts": {"requestSeconds": 0}})).unwrap_err();
        assert_eq!(e.field, "timeouts.requestSeconds");
    }
}
