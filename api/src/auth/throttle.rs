//! Throttling failed authentications without locking out anyone else.
//!
//! A failure is counted against what was presented: a well-formed key
//! (`dly_<keyid>_<secret>`, checksum right) against its key id, whether the id is unknown or
//! the secret wrong; anything else (no key, garbage, a typo the checksum catches) against the
//! client's address. Only that same key id, or malformed presentations from that same
//! address, are refused with 429 once their bucket is empty: a valid key is never blocked by
//! another key's failures, nor by garbage sent from its address (behind a load balancer every
//! tenant shares one). The client's address is the TCP peer, or, when the peer is one of the
//! configured proxies (`api.trusted_proxies`), the rightmost `X-Forwarded-For` hop that is not
//! itself a trusted proxy, so a client cannot choose its own address by prepending hops.

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::time::Duration;

use axum::http::HeaderMap;
pub use ipnet::IpNet;

use crate::requests::ratelimit::{Buckets, Rate};

/// Most `X-Forwarded-For` hops looked at, from the right.
const MAX_HOPS: usize = 32;

/// What a failed authentication is counted against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailureScope {
    /// A well-formed key's public id.
    KeyId(String),
    /// The client's address, for a missing or malformed key.
    Addr(IpAddr),
}

impl FailureScope {
    /// How the scope is named in a 429's `details.scope`.
    pub fn name(&self) -> &'static str {
        match self {
            FailureScope::KeyId(_) => "key",
            FailureScope::Addr(_) => "address",
        }
    }
}

/// Buckets of failed authentications: per presented key id and per address, each bounded.
pub struct AuthFailures {
    by_key: Buckets<String>,
    by_addr: Buckets<IpAddr>,
}

impl AuthFailures {
    /// Failures allowed at `rate` per key id and per address.
    pub fn new(rate: Rate) -> Self {
        AuthFailures {
            by_key: Buckets::new(rate),
            by_addr: Buckets::new(rate),
        }
    }

    /// `Some(wait)` while `scope` has no failure left.
    pub fn throttled(&self, scope: &FailureScope) -> Option<Duration> {
        match scope {
            FailureScope::KeyId(k) => self.by_key.wait(k),
            FailureScope::Addr(a) => self.by_addr.wait(a),
        }
    }

    /// Counts one failure against `scope`.
    pub fn failed(&self, scope: &FailureScope) {
        let _ = match scope {
            FailureScope::KeyId(k) => self.by_key.take(k),
            FailureScope::Addr(a) => self.by_addr.take(a),
        };
    }
}

/// One `api.trusted_proxies` entry: a CIDR (`10.0.0.0/8`) or a single address.
pub fn parse_proxy(raw: &str) -> Result<IpNet, String> {
    let raw = raw.trim();
    IpNet::from_str(raw)
        .or_else(|_| IpAddr::from_str(raw).map(IpNet::from))
        .map_err(|_| format!("{raw:?} is neither an address nor a CIDR (10.0.0.0/8, ::1)"))
}

fn trusted(proxies: &[IpNet], addr: &IpAddr) -> bool {
    proxies.iter().any(|n| n.contains(addr))
}

/// One `X-Forwarded-For` hop: an address, maybe with a port (`1.2.3.4:80`, `[::1]:80`).
fn parse_hop(hop: &str) -> Option<IpAddr> {
    let hop = hop.trim();
    IpAddr::from_str(hop)
        .ok()
        .or_else(|| SocketAddr::from_str(hop).ok().map(|s| s.ip()))
}

/// The client's address: `peer`, unless `peer` is a trusted proxy; then the rightmost
/// `X-Forwarded-For` hop that is not a trusted proxy (an unreadable hop stops the walk at the
/// last trusted one: what is left of it was written by the client).
pub fn client_addr(peer: IpAddr, headers: &HeaderMap, proxies: &[IpNet]) -> IpAddr {
    if !trusted(proxies, &peer) {
        return peer;
    }
    let values: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    let mut client = peer;
    for hop in values
        .iter()
        .rev()
        .flat_map(|v| v.rsplit(','))
        .take(MAX_HOPS)
    {
        let Some(addr) = parse_hop(hop) else {
            break;
        };
        client = addr;
        if !trusted(proxies, &addr) {
            break;
        }
    }
    client
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xff(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", v.parse().expect("header"));
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn the_forwarded_address_counts_only_from_a_trusted_proxy() {
        let proxies = vec![
            parse_proxy("10.0.0.0/8").unwrap(),
            parse_proxy("::1").unwrap(),
        ];
        let h = xff("198.51.100.1, 203.0.113.7, 10.0.0.5");
        assert_eq!(client_addr(ip("192.0.2.1"), &h, &proxies), ip("192.0.2.1"));
        assert_eq!(client_addr(ip("10.0.0.9"), &h, &proxies), ip("203.0.113.7"));
        assert_eq!(
            client_addr(ip("::1"), &xff("[2001:db8::1]:443"), &proxies),
            ip("2001:db8::1")
        );
        assert_eq!(
            client_addr(ip("10.0.0.9"), &HeaderMap::new(), &proxies),
            ip("10.0.0.9")
        );
        assert_eq!(
            client_addr(ip("10.0.0.9"), &xff("junk, 10.0.0.3"), &proxies),
            ip("10.0.0.3")
        );
        assert_eq!(client_addr(ip("10.0.0.9"), &h, &[]), ip("10.0.0.9"));
    }

    #[test]
    fn proxies_are_addresses_or_cidrs() {
        assert!(parse_proxy("10.0.0.0/8").is_ok());
        assert!(parse_proxy("192.0.2.4").is_ok());
        assert!(parse_proxy("fd00::/8").is_ok());
        assert!(parse_proxy("10.0.0.0/33").is_err());
        assert!(parse_proxy("proxy.local").is_err());
    }
}
