//! An HTTP provider's client, built from its validated settings in one call: base URL, CA
//! bundle, request timeout, the credential by reference, how it is sent, and how the
//! provider's error answers map. A build failure names the setting at fault.

use std::time::Duration;

use crate::credentials::{CredentialRef, Credentials};
use crate::http::{ErrorMapper, HttpClient, HttpClientBuilder, HttpConfigError, Secret};
use crate::settings::ConfigError;

/// How the credential travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyHeader<'a> {
    /// `Authorization: Bearer <key>`.
    Bearer,
    /// The bare key in this header (`X-API-Key`).
    Plain(&'a str),
    /// `Bearer <key>` in this header.
    BearerIn(&'a str),
}

/// What a provider client is built from; every field comes from validated settings.
#[derive(Debug, Clone)]
pub struct ClientSettings<'a> {
    /// The backend's name in messages (`Daytona`).
    pub service: &'a str,
    /// Without a trailing slash ([`crate::settings::base_url`]).
    pub base_url: &'a str,
    pub ca_bundle: &'a [reqwest::Certificate],
    pub request_timeout: Duration,
    /// The credential's reference and, when already read at validation, its value.
    pub credential: &'a CredentialRef,
    pub initial: Option<&'a Secret>,
    /// The credential's name in messages (`API key`).
    pub what: &'a str,
    pub header: KeyHeader<'a>,
    /// How the provider's error answers become errors.
    pub errors: ErrorMapper,
    /// Retries of idempotent requests on connect failures and 502-504 (first delay 100 ms).
    pub retries: usize,
}

/// Builds the client; the credential resolves through `credentials` at send time.
pub fn build_client(
    s: &ClientSettings<'_>,
    credentials: &Credentials,
) -> Result<HttpClient, ConfigError> {
    let (header, bearer) = match s.header {
        KeyHeader::Bearer => ("Authorization", true),
        KeyHeader::Plain(h) => (h, false),
        KeyHeader::BearerIn(h) => (h, true),
    };
    let mut b = HttpClientBuilder::new(s.service, s.base_url).auth(
        header,
        s.what,
        s.credential.clone(),
        s.initial.cloned(),
    );
    if bearer {
        b = b.bearer();
    }
    b.request_timeout(s.request_timeout)
        .ca_bundle(s.ca_bundle.to_vec())
        .retries(s.retries, Duration::from_millis(100))
        .errors(s.errors)
        .build(credentials)
        .map_err(|e| config_error(e, "apiURL"))
}

/// Builds the client of a kind whose backend reads its API key as `Authorization: Bearer`,
/// from validated settings with the usual `ca_bundle`, `request_timeout`, `credential` and
/// `initial_key` fields (two retries):
/// `bearer_key_client!(settings, credentials, "Freestyle", &settings.api_url, map_answer)`.
macro_rules! bearer_key_client {
    ($settings:expr, $credentials:expr, $service:expr, $base_url:expr, $errors:expr) => {
        $crate::kit::build_client(
            &$crate::kit::ClientSettings {
                service: $service,
                base_url: $base_url,
                ca_bundle: &$settings.ca_bundle,
                request_timeout: $settings.request_timeout,
                credential: &$settings.credential,
                initial: $settings.initial_key.as_ref(),
                what: "API key",
                header: $crate::kit::KeyHeader::Bearer,
                errors: $errors,
                retries: 2,
            },
            $credentials,
        )
    };
}
pub(crate) use bearer_key_client;

/// The setting an [`HttpConfigError`] is about; `url_field` is the kind's base URL key,
/// which a client reqwest cannot build is blamed on.
pub fn config_error(e: HttpConfigError, url_field: &str) -> ConfigError {
    let field = match &e {
        HttpConfigError::HeaderName(_) => "authHeader",
        HttpConfigError::ReadCaBundle { .. }
        | HttpConfigError::EmptyCaBundle { .. }
        | HttpConfigError::BadCaBundle { .. } => "caBundle",
        HttpConfigError::Build(_) => url_field,
    };
    ConfigError {
        field: field.to_owned(),
        message: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_header_is_refused_naming_the_setting() {
        let credential = CredentialRef::Secret("k".into());
        let settings = ClientSettings {
            service: "Acme",
            base_url: "http://127.0.0.1:9",
            ca_bundle: &[],
            request_timeout: Duration::from_secs(1),
            credential: &credential,
            initial: None,
            what: "API key",
            header: KeyHeader::Plain("bad header"),
            errors: |op, a| crate::http::status_error(op, a.status, ""),
            retries: 0,
        };
        let e = build_client(&settings, &Credentials::default()).unwrap_err();
        assert_eq!(e.field, "authHeader", "{e}");
        let ok = ClientSettings {
            header: KeyHeader::Bearer,
            ..settings
        };
        let client = build_client(&ok, &Credentials::default()).expect("client");
        assert_eq!(
            client.auth_header().map(|h| h.as_str()),
            Some("authorization")
        );
    }
}
