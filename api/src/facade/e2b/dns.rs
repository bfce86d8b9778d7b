//! The facade's DNS mode: the E2B SDKs with `E2B_DOMAIN=<domain>` and no URL overrides call
//! `https://api.<domain>/…` for the control plane and `https://<port>-<sandboxId>.<domain>/…`
//! for envd (`sandbox.<domain>`, with the id and port in headers, for E2B's own domains and,
//! E2B says, for all of them later). With a domain configured, a request whose Host names one
//! of those is routed as if it had come under `/e2b` or `/e2b/envd`; any other Host is left
//! alone, so `/v1` and the path-prefixed facade are unchanged.
//!
//! Why a rewrite before routing rather than a second set of routes: the facade's handlers,
//! key and token checks are the same ones the URL-override mode uses, so the two cannot
//! drift. The sandbox id in a host name arrives lowercased (URL parsers lowercase host
//! names); it is given back its canonical spelling (`sbx_` + the upper-case ULID).

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Uri};
use axum::middleware::Next;
use axum::response::Response;

use super::{ENVD_PREFIX, PREFIX};

/// Where a Host sends a request.
#[derive(Debug, PartialEq, Eq)]
pub enum Target {
    /// `api.<domain>`: the control plane.
    Api,
    /// `sandbox.<domain>`: envd, the sandbox named by the request's headers.
    SharedEnvd,
    /// `<port>-<sandboxId>.<domain>`: envd (or a port) of that sandbox.
    Envd { port: u16, sandbox: String },
}

/// What `host` (a Host header, maybe with `:port`) names under `domain`, if anything.
pub fn target(domain: &str, host: &str) -> Option<Target> {
    let host = host.rsplit_once(':').map_or(host, |(h, p)| {
        if p.bytes().all(|b| b.is_ascii_digit()) {
            h
        } else {
            host
        }
    });
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let label = host.strip_suffix(domain)?.strip_suffix('.')?;
    match label {
        "api" => return Some(Target::Api),
        "sandbox" => return Some(Target::SharedEnvd),
        _ => {}
    }
    let (port, id) = label.split_once('-')?;
    let port: u16 = port.parse().ok()?;
    if id.is_empty() || id.contains('.') {
        return None;
    }
    Some(Target::Envd {
        port,
        sandbox: canonical_id(id),
    })
}

/// `sbx_` + the ULID in upper case when `id` is a sandbox id in any case; else as it is.
fn canonical_id(id: &str) -> String {
    let prefix = differently_core::SandboxId::PREFIX;
    match id
        .strip_prefix(prefix)
        .and_then(|r| r.strip_prefix('_'))
        .and_then(|u| ulid::Ulid::from_string(u).ok())
    {
        Some(u) => format!("{prefix}_{u}"),
        None => id.to_owned(),
    }
}

/// The configured domain, lower-case without a trailing dot (`None`: DNS mode is off).
#[derive(Debug, Clone, Default)]
pub struct Domain(pub Option<String>);

impl Domain {
    /// `domain` as configured (`[e2b] domain`); empty is off.
    pub fn new(domain: Option<&str>) -> Domain {
        Domain(
            domain
                .map(|d| d.trim().trim_end_matches('.').to_ascii_lowercase())
                .filter(|d| !d.is_empty()),
        )
    }
}

/// Middleware before routing: a request whose Host is one of the facade's DNS names gets
/// the path it would have under `/e2b` or `/e2b/envd`, and for `<port>-<id>.<domain>` the
/// `E2b-Sandbox-Id` and `E2b-Sandbox-Port` headers the host names (they win over sent ones,
/// as E2B's edge routes by the host).
pub async fn route_by_host(State(domain): State<Domain>, mut req: Request, next: Next) -> Response {
    let Some(domain) = domain.0.as_deref() else {
        return next.run(req).await;
    };
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .or_else(|| req.uri().host().map(str::to_owned));
    let Some(t) = host.and_then(|h| target(domain, &h)) else {
        return next.run(req).await;
    };
    let prefix = match &t {
        Target::Api => PREFIX,
        Target::SharedEnvd | Target::Envd { .. } => ENVD_PREFIX,
    };
    let path_and_query = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    if let Ok(uri) = format!("{prefix}{path_and_query}").parse::<Uri>() {
        *req.uri_mut() = uri;
    }
    if let Target::Envd { port, sandbox } = t {
        if let Ok(v) = HeaderValue::from_str(&sandbox) {
            req.headers_mut().insert("e2b-sandbox-id", v);
        }
        req.headers_mut()
            .insert("e2b-sandbox-port", HeaderValue::from(port));
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_under_the_domain_name_the_api_or_a_sandbox() {
        let d = "e2b.example.com";
        assert_eq!(target(d, "api.e2b.example.com"), Some(Target::Api));
        assert_eq!(target(d, "API.e2b.example.com:443"), Some(Target::Api));
        assert_eq!(
            target(d, "sandbox.e2b.example.com."),
            Some(Target::SharedEnvd)
        );
        let id = differently_core::SandboxId::new();
        let host = format!("49983-{}.e2b.example.com", id.as_str().to_ascii_lowercase());
        assert_eq!(
            target(d, &host),
            Some(Target::Envd {
                port: 49983,
                sandbox: id.as_str().to_owned()
            })
        );
        assert_eq!(target(d, "e2b.example.com"), None);
        assert_eq!(target(d, "api.other.com"), None);
        assert_eq!(target(d, "xapi.e2b.example.com"), None);
        assert_eq!(target(d, "a.b.e2b.example.com"), None);
        assert_eq!(target(d, "99999999-x.e2b.example.com"), None);
        assert_eq!(target(d, "127.0.0.1:8080"), None);
    }
}
