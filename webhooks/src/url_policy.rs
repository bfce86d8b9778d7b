//! Where a webhook may point. A tenant names the URL, and the control plane makes the
//! request from inside the operator's network: without these checks a webhook could reach
//! the database, the NATS monitor or a cloud metadata endpoint. So `https` only (plain
//! `http` if the operator allows it), no userinfo, and no address in a loopback, private,
//! link-local, CGNAT, multicast, unspecified, documentation or other reserved range unless
//! the operator allows private targets (`[webhooks] allow_private`). `differently dev` allows
//! loopback targets alone (`allow_loopback`), over `http` too: a receiver on the developer's
//! machine, and nothing else of the network. The check runs when the URL is stored and again
//! on every delivery against the addresses the name resolves to then, and the request goes
//! to exactly the address that was checked (DNS rebinding).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use reqwest::Url;

/// Most characters of a webhook URL.
pub const MAX_URL_LEN: usize = 2048;

/// What the operator allows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UrlPolicy {
    /// Plain `http://` URLs.
    pub allow_http: bool,
    /// Loopback, private and other non-public addresses (for a receiver on the operator's
    /// own network, and tests).
    pub allow_private: bool,
    /// Loopback addresses only (127.0.0.0/8, ::1, `localhost`), by `http` as well as
    /// `https`: what `differently dev` allows, so a receiver on the same machine works with
    /// no switch, while private ranges stay refused.
    pub allow_loopback: bool,
}

/// Why a URL is refused. The message is for the caller (it names the rule, not secrets).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("not an absolute URL")]
    Malformed,
    #[error("longer than {MAX_URL_LEN} characters")]
    TooLong,
    #[error(
        "must use https (the operator allows http with DIFFERENTLY_WEBHOOKS_ALLOW_HTTP=true, \
         [webhooks] allow_http)"
    )]
    Scheme,
    #[error("must not carry a user name or password")]
    Userinfo,
    #[error("must name a host")]
    NoHost,
    #[error(
        "{0} is a {1} address, which webhooks may not reach (the operator allows such targets \
         with DIFFERENTLY_WEBHOOKS_ALLOW_PRIVATE=true, [webhooks] allow_private)"
    )]
    Forbidden(IpAddr, &'static str),
    #[error("the host does not resolve: {0}")]
    Unresolved(String),
}

impl UrlPolicy {
    /// Checks a URL's form and, when its host is an address, that address.
    pub fn check(&self, raw: &str) -> Result<Url, UrlError> {
        if raw.len() > MAX_URL_LEN {
            return Err(UrlError::TooLong);
        }
        let url = Url::parse(raw).map_err(|_| UrlError::Malformed)?;
        match url.scheme() {
            "https" => {}
            "http" if self.allow_http => {}
            "http" if self.allow_loopback && names_loopback(&url) => {}
            _ => return Err(UrlError::Scheme),
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(UrlError::Userinfo);
        }
        match url.host() {
            None => return Err(UrlError::NoHost),
            Some(url::Host::Ipv4(a)) => self.check_ip(IpAddr::V4(a))?,
            Some(url::Host::Ipv6(a)) => self.check_ip(IpAddr::V6(a))?,
            Some(url::Host::Domain(d)) => {
                // `localhost` and its subdomains are loopback by definition (RFC 6761).
                if !self.allow_private && !self.allow_loopback && is_localhost(d) {
                    return Err(UrlError::Forbidden(
                        IpAddr::V4(Ipv4Addr::LOCALHOST),
                        "loopback",
                    ));
                }
            }
        }
        Ok(url)
    }

    /// Refuses an address in a range webhooks may not reach.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), UrlError> {
        match (self.allow_private, forbidden_range(ip)) {
            (false, Some("loopback")) if self.allow_loopback => Ok(()),
            (false, Some(what)) => Err(UrlError::Forbidden(ip, what)),
            _ => Ok(()),
        }
    }

    /// Resolves the URL's host now and checks every address it gives; the request must go
    /// to one of these (a name that resolves to one allowed and one forbidden address is
    /// refused as a whole).
    pub async fn resolve(&self, url: &Url) -> Result<Vec<SocketAddr>, UrlError> {
        let port = url.port_or_known_default().ok_or(UrlError::Malformed)?;
        let addrs: Vec<SocketAddr> = match url.host() {
            None => return Err(UrlError::NoHost),
            Some(url::Host::Ipv4(a)) => vec![SocketAddr::new(IpAddr::V4(a), port)],
            Some(url::Host::Ipv6(a)) => vec![SocketAddr::new(IpAddr::V6(a), port)],
            Some(url::Host::Domain(d)) => tokio::net::lookup_host((d, port))
                .await
                .map_err(|e| UrlError::Unresolved(e.to_string()))?
                .collect(),
        };
        if addrs.is_empty() {
            return Err(UrlError::Unresolved("no addresses".into()));
        }
        for a in &addrs {
            let ip = canonical(a.ip());
            self.check_ip(ip)?;
            // Plain http that only loopback allows goes to loopback only, whatever the
            // name resolves to.
            if url.scheme() == "http" && !self.allow_http && forbidden_range(ip) != Some("loopback")
            {
                return Err(UrlError::Scheme);
            }
        }
        Ok(addrs)
    }
}

/// `localhost` and its subdomains, loopback by definition (RFC 6761).
fn is_localhost(name: &str) -> bool {
    let d = name.trim_end_matches('.').to_ascii_lowercase();
    d == "localhost" || d.ends_with(".localhost")
}

/// Whether the URL's host is a loopback address or a `localhost` name.
fn names_loopback(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(a)) => forbidden_range(IpAddr::V4(a)) == Some("loopback"),
        Some(url::Host::Ipv6(a)) => forbidden_range(IpAddr::V6(a)) == Some("loopback"),
        Some(url::Host::Domain(d)) => is_localhost(d),
        None => false,
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is (`::ffff:127.0.0.1` is loopback).
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

/// The name of the non-public range `ip` is in, if any.
pub fn forbidden_range(ip: IpAddr) -> Option<&'static str> {
    match canonical(ip) {
        IpAddr::V4(a) => v4_range(a),
        IpAddr::V6(a) => v6_range(a),
    }
}

fn v4_range(a: Ipv4Addr) -> Option<&'static str> {
    let [o0, o1, o2, _] = a.octets();
    Some(match () {
        _ if a.is_unspecified() || o0 == 0 => "unspecified",
        _ if a.is_loopback() => "loopback",
        _ if a.is_private() => "private",
        _ if a.is_link_local() => "link-local",
        // 100.64.0.0/10: carrier-grade NAT (RFC 6598).
        _ if o0 == 100 && (o1 & 0xc0) == 64 => "CGNAT",
        _ if a.is_multicast() => "multicast",
        _ if a.is_broadcast() => "broadcast",
        // 192.0.0.0/24 (IETF protocol assignments), 198.18.0.0/15 (benchmarking),
        // 240.0.0.0/4 (reserved), documentation ranges.
        _ if o0 == 192 && o1 == 0 && o2 == 0 => "reserved",
        _ if o0 == 198 && (o1 & 0xfe) == 18 => "reserved",
        _ if o0 >= 240 => "reserved",
        _ if a.is_documentation() => "documentation",
        _ => return None,
    })
}

fn v6_range(a: Ipv6Addr) -> Option<&'static str> {
    let s = a.segments();
    Some(match () {
        _ if a.is_unspecified() => "unspecified",
        _ if a.is_loopback() => "loopback",
        _ if a.is_multicast() => "multicast",
        // fe80::/10 link-local, fc00::/7 unique local (private).
        _ if (s[0] & 0xffc0) == 0xfe80 => "link-local",
        _ if (s[0] & 0xfe00) == 0xfc00 => "private",
        // 2001:db8::/32 documentation; 64:ff9b::/96 NAT64 can reach IPv4 private space.
        _ if s[0] == 0x2001 && s[1] == 0x0db8 => "documentation",
        _ if s[0] == 0x0064 && s[1] == 0xff9b => "NAT64",
        // ::/96 IPv4-compatible (deprecated) addresses.
        _ if s[..6].iter().all(|x| *x == 0) => "reserved",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strict() -> UrlPolicy {
        UrlPolicy::default()
    }

    #[test]
    fn https_to_public_addresses_only_by_default() {
        assert!(strict().check("https://hooks.example.com/in?x=1").is_ok());
        assert!(strict().check("https://93.184.215.14/in").is_ok());
        assert_eq!(
            strict().check("http://hooks.example.com/"),
            Err(UrlError::Scheme)
        );
        assert_eq!(
            strict().check("ftp://hooks.example.com/"),
            Err(UrlError::Scheme)
        );
        assert_eq!(strict().check("not a url"), Err(UrlError::Malformed));
        assert_eq!(
            strict().check("https://u:p@hooks.example.com/"),
            Err(UrlError::Userinfo)
        );
        assert_eq!(
            strict().check(&format!("https://e.com/{}", "a".repeat(MAX_URL_LEN))),
            Err(UrlError::TooLong)
        );
    }

    #[test]
    fn every_non_public_range_is_refused() {
        for (url, what) in [
            ("https://127.0.0.1/", "loopback"),
            ("https://127.8.9.10:8443/", "loopback"),
            ("https://localhost/", "loopback"),
            ("https://api.localhost./", "loopback"),
            ("https://[::1]/", "loopback"),
            ("https://[::ffff:127.0.0.1]/", "loopback"),
            ("https://10.1.2.3/", "private"),
            ("https://172.16.0.1/", "private"),
            ("https://192.168.1.1/", "private"),
            ("https://[fd00::1]/", "private"),
            ("https://169.254.169.254/latest/meta-data", "link-local"),
            ("https://[fe80::1]/", "link-local"),
            ("https://100.64.0.1/", "CGNAT"),
            ("https://100.127.255.255/", "CGNAT"),
            ("https://224.0.0.1/", "multicast"),
            ("https://[ff02::1]/", "multicast"),
            ("https://0.0.0.0/", "unspecified"),
            ("https://[::]/", "unspecified"),
            ("https://255.255.255.255/", "broadcast"),
            ("https://240.0.0.1/", "reserved"),
            ("https://[64:ff9b::a00:1]/", "NAT64"),
            // Decimal and hex forms are parsed as the address they are.
            ("https://2130706433/", "loopback"),
            ("https://0x7f.1/", "loopback"),
        ] {
            match strict().check(url) {
                Err(UrlError::Forbidden(_, w)) => assert_eq!(w, what, "{url}"),
                other => panic!("{url}: {other:?}"),
            }
        }
        // 100.128.0.0 is past the CGNAT block.
        assert!(strict().check("https://100.128.0.1/").is_ok());
    }

    #[test]
    fn the_operator_may_allow_http_and_private_targets() {
        let open = UrlPolicy {
            allow_http: true,
            allow_private: true,
            ..UrlPolicy::default()
        };
        assert!(open.check("http://127.0.0.1:8080/hook").is_ok());
        assert!(open.check("https://10.0.0.1/").is_ok());
        let http_only = UrlPolicy {
            allow_http: true,
            allow_private: false,
            ..UrlPolicy::default()
        };
        assert!(matches!(
            http_only.check("http://127.0.0.1:8080/"),
            Err(UrlError::Forbidden(..))
        ));
    }

    #[test]
    fn dev_allows_loopback_receivers_and_nothing_else_of_the_network() {
        let dev = UrlPolicy {
            allow_loopback: true,
            ..UrlPolicy::default()
        };
        for url in [
            "http://127.0.0.1:8080/hook",
            "http://127.9.9.9/",
            "http://[::1]:9000/",
            "http://localhost:3000/in",
            "https://localhost/",
            "https://127.0.0.1/",
        ] {
            assert!(dev.check(url).is_ok(), "{url}");
        }
        // Private ranges stay refused, and so does plain http anywhere but loopback.
        for (url, what) in [
            ("https://10.1.2.3/", "private"),
            ("https://192.168.1.1/", "private"),
            ("https://169.254.169.254/", "link-local"),
        ] {
            match dev.check(url) {
                Err(UrlError::Forbidden(_, w)) => assert_eq!(w, what, "{url}"),
                other => panic!("{url}: {other:?}"),
            }
        }
        assert_eq!(dev.check("http://10.1.2.3/"), Err(UrlError::Scheme));
        assert_eq!(
            dev.check("http://hooks.example.com/"),
            Err(UrlError::Scheme)
        );
        assert!(dev.check("https://hooks.example.com/").is_ok());
    }

    #[test]
    fn refusals_name_the_switch_that_allows_them() {
        let scheme = strict().check("http://hooks.example.com/").unwrap_err();
        assert!(
            scheme
                .to_string()
                .contains("DIFFERENTLY_WEBHOOKS_ALLOW_HTTP"),
            "{scheme}"
        );
        let range = strict().check("https://10.0.0.1/").unwrap_err();
        assert!(
            range
                .to_string()
                .contains("DIFFERENTLY_WEBHOOKS_ALLOW_PRIVATE"),
            "{range}"
        );
    }

    #[tokio::test]
    async fn a_name_is_checked_against_what_it_resolves_to() {
        // `localhost` is refused by name; a name that resolves to loopback is refused at
        // resolution, which is what a delivery re-checks (DNS rebinding).
        let url = Url::parse("https://localhost:9/").unwrap();
        let e = strict().resolve(&url).await.unwrap_err();
        assert!(matches!(e, UrlError::Forbidden(_, "loopback")), "{e:?}");
        let open = UrlPolicy {
            allow_http: true,
            allow_private: true,
            ..UrlPolicy::default()
        };
        let addrs = open
            .resolve(&Url::parse("http://127.0.0.1:9/").unwrap())
            .await
            .unwrap();
        assert_eq!(addrs, vec!["127.0.0.1:9".parse().unwrap()]);
    }
}
