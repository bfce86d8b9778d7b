//! Where envd is for a sandbox: E2B-protocol backends differ only here. E2B's cloud, CubeSandbox
//! and OpenKruise's native protocol name a host per sandbox and port (`<port>-<id>.<domain>`,
//! behind wildcard DNS); E2B Embed and a self-hosted client-proxy also route one URL by the
//! `E2b-Sandbox-Id`/`E2b-Sandbox-Port` headers, as E2B's SDKs do with `E2B_SANDBOX_URL`.

use crate::settings::{bad, base_url, ConfigError};

/// The E2B cloud's envd address, and the default pattern.
pub const DEFAULT_PATTERN: &str = "https://{port}-{sandboxId}.{domain}";

/// The placeholders a pattern may hold.
const PLACEHOLDERS: [&str; 3] = ["port", "sandboxId", "domain"];

/// How envd is addressed (validated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Envd {
    /// A base URL per sandbox from a pattern (`envdHost`), optionally dialled at one fixed
    /// address with the pattern's host in the `Host` header (`envdConnectTo`).
    Pattern {
        pattern: String,
        connect_to: Option<String>,
    },
    /// One base URL for every sandbox (`envdURL`); the routing headers pick the sandbox.
    Routed(String),
}

/// One sandbox's envd, located.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    /// Without a trailing slash.
    pub base: String,
    /// `Some(id)` when `base` is shared and routes by header.
    pub routed: Option<String>,
    /// The `Host` header to send when `base` dials a fixed address instead of the name.
    pub host: Option<String>,
}

impl Envd {
    /// Checks `envdHost`, `envdURL` and `envdConnectTo` together. Neither envd key means the
    /// cloud's pattern. No envd address may share the API's origin: the API key goes there.
    pub fn validate(
        envd_host: Option<&str>,
        envd_url: Option<&str>,
        connect_to: Option<&str>,
        api_url: &str,
        domain: &str,
    ) -> Result<Envd, ConfigError> {
        let api_origin = crate::http::origin(api_url);
        match (blank(envd_host), blank(envd_url), blank(connect_to)) {
            (Some(_), Some(_), _) => bad(
                "envdURL",
                "set envdHost (an address per sandbox) or envdURL (one address, routed by headers), not both",
            ),
            (None, Some(_), Some(_)) => bad("envdConnectTo", "only with envdHost"),
            (None, Some(u), None) => {
                let u = base_url("envdURL", u)?;
                if crate::http::origin(&u) == api_origin {
                    return bad(
                        "envdURL",
                        "must not be the API's origin: the API key is sent there",
                    );
                }
                Ok(Envd::Routed(u))
            }
            (host, None, connect_to) => {
                let pattern = check_pattern(host.unwrap_or(DEFAULT_PATTERN))?;
                let sample = fill(&pattern, "i0sample", 49983, domain);
                if crate::http::origin(&sample) == api_origin {
                    return bad(
                        "envdHost",
                        "must not be the API's origin: the API key is sent there",
                    );
                }
                let connect_to = match connect_to {
                    None => None,
                    Some(_) if !pattern.starts_with("http://") => {
                        return bad(
                            "envdConnectTo",
                            "only with an http:// envdHost: TLS checks the name the pattern gives",
                        )
                    }
                    Some(c) => Some(check_authority(c)?),
                };
                Ok(Envd::Pattern {
                    pattern,
                    connect_to,
                })
            }
        }
    }

    /// Where sandbox `id`'s envd listens for `port`, on `domain` (the create answer's, or the
    /// pool's).
    pub fn locate(&self, id: &str, port: u16, domain: &str) -> Located {
        match self {
            Envd::Routed(u) => Located {
                base: u.clone(),
                routed: Some(id.to_owned()),
                host: None,
            },
            Envd::Pattern {
                pattern,
                connect_to: None,
            } => Located {
                base: fill(pattern, id, port, domain),
                routed: None,
                host: None,
            },
            Envd::Pattern {
                pattern,
                connect_to: Some(at),
            } => {
                let url = fill(pattern, id, port, domain);
                let rest = url.strip_prefix("http://").unwrap_or(&url);
                let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
                Located {
                    base: format!("http://{at}{path}"),
                    routed: None,
                    host: Some(authority.to_owned()),
                }
            }
        }
    }
}

fn fill(pattern: &str, id: &str, port: u16, domain: &str) -> String {
    pattern
        .replace("{port}", &port.to_string())
        .replace("{sandboxId}", id)
        .replace("{domain}", domain)
}

fn blank(v: Option<&str>) -> Option<&str> {
    v.map(str::trim).filter(|s| !s.is_empty())
}

/// A pattern: a base URL holding `{sandboxId}` and only known placeholders.
fn check_pattern(raw: &str) -> Result<String, ConfigError> {
    let raw = raw.trim();
    let mut rest = raw;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else {
            return bad("envdHost", "has a `{` without its `}`");
        };
        let name = &after[..close];
        if !PLACEHOLDERS.contains(&name) {
            return bad(
                "envdHost",
                format!(
                    "unknown placeholder `{{{name}}}`: use {{port}}, {{sandboxId}} and {{domain}}"
                ),
            );
        }
        rest = &after[close + 1..];
    }
    if rest.contains('}') {
        return bad("envdHost", "has a `}` without its `{`");
    }
    if !raw.contains("{sandboxId}") {
        return bad(
            "envdHost",
            "must hold {sandboxId}; for one address for every sandbox use envdURL",
        );
    }
    base_url("envdHost", &fill(raw, "i0sample", 49983, "example.com"))?;
    Ok(raw.trim_end_matches('/').to_owned())
}

/// `host:port`, nothing else.
fn check_authority(raw: &str) -> Result<String, ConfigError> {
    let raw = raw.trim();
    let ok = raw.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '[' | ']' | ':'))
            && port.parse::<u16>().is_ok_and(|p| p > 0)
    });
    if ok {
        Ok(raw.to_owned())
    } else {
        bad(
            "envdConnectTo",
            format!("`{raw}` is not host:port (no scheme, no path)"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const API: &str = "https://api.e2b.app";

    fn field(r: Result<Envd, ConfigError>) -> String {
        r.err().map(|e| e.field).unwrap_or_default()
    }

    #[test]
    fn the_cloud_pattern_is_the_default() {
        let e =
            Envd::validate(None, None, None, API, "e2b.app").unwrap_or(Envd::Routed(String::new()));
        assert_eq!(
            e.locate("i1abc", 49983, "e2b.app"),
            Located {
                base: "https://49983-i1abc.e2b.app".to_owned(),
                routed: None,
                host: None
            }
        );
    }

    #[test]
    fn patterns_may_route_by_path_and_dial_a_fixed_address() {
        let e = Envd::validate(
            Some("http://{port}-{sandboxId}.{domain}/"),
            None,
            Some("10.0.0.5:80"),
            API,
            "cube.app",
        )
        .unwrap_or(Envd::Routed(String::new()));
        let l = e.locate("abc", 49983, "cube.app");
        assert_eq!(l.base, "http://10.0.0.5:80");
        assert_eq!(l.host.as_deref(), Some("49983-abc.cube.app"));
        let e = Envd::validate(
            Some("https://gw.example.com/kruise/{sandboxId}/{port}"),
            None,
            None,
            API,
            "x",
        )
        .unwrap_or(Envd::Routed(String::new()));
        assert_eq!(
            e.locate("s1", 49983, "x").base,
            "https://gw.example.com/kruise/s1/49983"
        );
    }

    #[test]
    fn bad_addressing_names_the_key() {
        assert_eq!(
            field(Envd::validate(
                Some("https://{port}.{domain}"),
                None,
                None,
                API,
                "d"
            )),
            "envdHost"
        );
        assert_eq!(
            field(Envd::validate(
                Some("https://{id}.{domain}"),
                None,
                None,
                API,
                "d"
            )),
            "envdHost"
        );
        assert_eq!(
            field(Envd::validate(
                Some("ftp://{sandboxId}.x"),
                None,
                None,
                API,
                "d"
            )),
            "envdHost"
        );
        assert_eq!(
            field(Envd::validate(
                Some("https://{sandboxId}.x"),
                Some("http://a:1"),
                None,
                API,
                "d"
            )),
            "envdURL"
        );
        assert_eq!(
            field(Envd::validate(
                None,
                Some("https://api.e2b.app/envd"),
                None,
                API,
                "d"
            )),
            "envdURL"
        );
        assert_eq!(
            field(Envd::validate(
                None,
                Some("http://a:1"),
                Some("b:2"),
                API,
                "d"
            )),
            "envdConnectTo"
        );
        assert_eq!(
            field(Envd::validate(None, None, Some("10.0.0.1:80"), API, "d")),
            "envdConnectTo"
        );
        assert_eq!(
            field(Envd::validate(
                Some("http://{sandboxId}.d"),
                None,
                Some("http://10.0.0.1/x"),
                API,
                "d"
            )),
            "envdConnectTo"
        );
        assert_eq!(
            field(Envd::validate(
                Some("https://api.e2b.app/{sandboxId}"),
                None,
                None,
                API,
                "d"
            )),
            "envdHost"
        );
    }
}
