//! One sandbox's envd as a request target: its address (from the pool's addressing, see
//! `addressing.rs`), the sandbox's own access token (`X-Access-Token`, from the create answer)
//! and the Linux user as `Authorization: Basic`, plus the envd version the answer gave.

use base64::Engine as _;
use reqwest::header::HeaderValue;
use reqwest::{Method, RequestBuilder};

use super::addressing::{Envd, Located};
use super::envd::ENVD_PORT;
use super::envd_version::Version;
use crate::http::{HttpClient, Secret};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Where one sandbox's envd is and what it takes.
#[derive(Clone)]
pub(crate) struct Target {
    pub at: Located,
    pub token: Option<Secret>,
    /// `Authorization: Basic base64("<user>:")`.
    pub user_auth: String,
    pub version: Version,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("at", &self.at)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

impl Target {
    /// The target of sandbox `id` on `domain` under `envd` addressing.
    pub(crate) fn new(
        envd: &Envd,
        id: &str,
        domain: &str,
        token: Option<Secret>,
        user: &str,
        version: Version,
    ) -> Target {
        Target {
            at: envd.locate(id, ENVD_PORT, domain),
            token,
            user_auth: format!("Basic {}", B64.encode(format!("{user}:"))),
            version,
        }
    }

    pub(crate) fn request(&self, http: &HttpClient, method: Method, path: &str) -> RequestBuilder {
        let mut rb = http
            .to(method, &format!("{}{path}", self.at.base))
            .header(reqwest::header::AUTHORIZATION, &self.user_auth);
        if let Some(host) = &self.at.host {
            rb = rb.header(reqwest::header::HOST, host);
        }
        if let Some(id) = &self.at.routed {
            rb = rb
                .header("E2b-Sandbox-Id", id)
                .header("E2b-Sandbox-Port", ENVD_PORT.to_string());
        }
        if let Some(t) = &self.token {
            if let Ok(mut v) = HeaderValue::from_str(t.expose()) {
                v.set_sensitive(true);
                rb = rb.header("X-Access-Token", v);
            }
        }
        rb
    }

    /// Replaces the access token in `text` (belt and braces for proxy messages).
    pub(crate) fn scrub(&self, http: &HttpClient, text: &str) -> String {
        let t = http.scrub(text);
        match &self.token {
            Some(k) => k.scrub(&t),
            None => t,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_per_sandbox_unless_routed() {
        let cloud = Envd::Pattern {
            pattern: super::super::addressing::DEFAULT_PATTERN.to_owned(),
            connect_to: None,
        };
        let v = Version(0, 6, 13);
        let t = Target::new(&cloud, "i1abc", "e2b.app", None, "user", v);
        assert_eq!(t.at.base, "https://49983-i1abc.e2b.app");
        assert_eq!(t.user_auth, "Basic dXNlcjo=");
        let edge = Envd::Routed("http://127.0.0.1:9".to_owned());
        let t = Target::new(&edge, "i1abc", "e2b.app", None, "root", v);
        assert_eq!(
            (t.at.base.as_str(), t.at.routed.as_deref()),
            ("http://127.0.0.1:9", Some("i1abc"))
        );
    }
}
