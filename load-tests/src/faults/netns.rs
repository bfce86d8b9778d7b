//! A network namespace of the suite's own, linked to the host by a veth pair on a private
//! /30, for S14: a backend runs inside it, and the nemesis cuts the link with iptables `DROP`
//! rules *inside the namespace* (connects hang, established connections stall, as in a real
//! partition) and heals it by deleting them. Nothing here touches the host's own rules or
//! any namespace the suite did not make: every command names this namespace, and the only
//! addresses ever used are the two of its /30 in 10.213.0.0/16.

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

use crate::LoadError;

/// The /16 the suite takes its /30s from (RFC 1918, unlikely to be routed on a test host).
const PREFIX: [u8; 2] = [10, 213];

/// What S14 needs, for the error when it is missing.
const NEEDS: &str = "S14 needs root (or CAP_NET_ADMIN), iproute2's `ip netns` and iptables \
                     (apt-get install iproute2 iptables)";

/// A namespace with a veth link to the host.
pub struct Netns {
    /// `dly-<pid>-<n>`.
    pub name: String,
    /// The host side of the link.
    host_if: String,
    /// The host's address on the link.
    pub host_ip: Ipv4Addr,
    /// The namespace's address (the only one the suite sends to).
    pub ns_ip: Ipv4Addr,
    /// The DROP rules are in place.
    cut: bool,
}

fn run(args: &[&str]) -> Result<(), LoadError> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| LoadError::Preflight(format!("{NEEDS}: running {}: {e}", args[0])))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(LoadError::Preflight(format!(
            "{NEEDS}: `{}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

impl Netns {
    /// Makes namespace number `n` of this process: `ip netns add`, a veth pair, addresses
    /// 10.213.X.1 (host) and 10.213.X.2 (namespace), both ends and the namespace's
    /// loopback up. Fails, saying what is needed, when any step is refused.
    pub fn create(n: u8) -> Result<Netns, LoadError> {
        let pid = std::process::id();
        // A /30 per (process, n): X = a byte of the pid mixed with n, host .1, ns .2; the
        // four addresses of the /30 sit at 4 * (n % 64).
        let third = u8::try_from(pid % 251).unwrap_or(0);
        let base = (n % 64) * 4;
        let host_ip = Ipv4Addr::new(PREFIX[0], PREFIX[1], third, base + 1);
        let ns_ip = Ipv4Addr::new(PREFIX[0], PREFIX[1], third, base + 2);
        let tag = format!("{:x}{n:02x}", pid & 0xfffff);
        let ns = Netns {
            name: format!("dly-{tag}"),
            host_if: format!("dlyh{tag}"),
            host_ip,
            ns_ip,
            cut: false,
        };
        let ns_if = format!("dlyn{tag}");
        // A namespace left by a killed earlier run of this pid would make `add` fail.
        let _ = Command::new("ip")
            .args(["netns", "del", &ns.name])
            .stderr(Stdio::null())
            .status();
        run(&["ip", "netns", "add", &ns.name])?;
        // From here on, Drop removes the namespace (and with it the veth pair).
        run(&[
            "ip",
            "link",
            "add",
            &ns.host_if,
            "type",
            "veth",
            "peer",
            "name",
            &ns_if,
        ])?;
        run(&["ip", "link", "set", &ns_if, "netns", &ns.name])?;
        run(&[
            "ip",
            "addr",
            "add",
            &format!("{host_ip}/30"),
            "dev",
            &ns.host_if,
        ])?;
        run(&["ip", "link", "set", &ns.host_if, "up"])?;
        ns.exec_ok(&["ip", "addr", "add", &format!("{ns_ip}/30"), "dev", &ns_if])?;
        ns.exec_ok(&["ip", "link", "set", &ns_if, "up"])?;
        ns.exec_ok(&["ip", "link", "set", "lo", "up"])?;
        // iptables must work in there before the run depends on it.
        ns.exec_ok(&["iptables", "-w", "-L", "INPUT", "-n"])?;
        Ok(ns)
    }

    /// `ip netns exec NAME args…`, checked.
    fn exec_ok(&self, args: &[&str]) -> Result<(), LoadError> {
        let mut all = vec!["ip", "netns", "exec", &self.name];
        all.extend_from_slice(args);
        run(&all)
    }

    /// The program and arguments that run `program args…` inside the namespace
    /// (`ip netns exec` execs it, so its pid is the program's).
    pub fn wrap(&self, program: &str, args: Vec<String>) -> (String, Vec<String>) {
        let mut all = vec![
            "netns".to_owned(),
            "exec".to_owned(),
            self.name.clone(),
            program.to_owned(),
        ];
        all.extend(args);
        ("ip".to_owned(), all)
    }

    /// Cuts the link: DROP everything in and out of the namespace except its loopback.
    pub fn cut(&mut self) -> Result<(), LoadError> {
        if self.cut {
            return Ok(());
        }
        self.exec_ok(&[
            "iptables", "-w", "-I", "INPUT", "1", "!", "-i", "lo", "-j", "DROP",
        ])?;
        self.exec_ok(&[
            "iptables", "-w", "-I", "OUTPUT", "1", "!", "-o", "lo", "-j", "DROP",
        ])?;
        self.cut = true;
        Ok(())
    }

    /// Heals the link: deletes the two DROP rules.
    pub fn heal(&mut self) -> Result<(), LoadError> {
        if !self.cut {
            return Ok(());
        }
        self.exec_ok(&[
            "iptables", "-w", "-D", "INPUT", "!", "-i", "lo", "-j", "DROP",
        ])?;
        self.exec_ok(&[
            "iptables", "-w", "-D", "OUTPUT", "!", "-o", "lo", "-j", "DROP",
        ])?;
        self.cut = false;
        Ok(())
    }

    /// Whether the link is cut now.
    pub fn is_cut(&self) -> bool {
        self.cut
    }

    /// Refuses any URL whose host is not this namespace's address: the only non-loopback
    /// target the suite may send to.
    pub fn require_target(&self, url: &str) -> Result<(), LoadError> {
        let parsed = reqwest::Url::parse(url)
            .map_err(|e| LoadError::Plan(format!("{url:?} is not a URL: {e}")))?;
        match parsed.host_str().and_then(|h| h.parse::<Ipv4Addr>().ok()) {
            Some(ip) if ip == self.ns_ip => Ok(()),
            _ => Err(LoadError::Plan(format!(
                "the fault suite sends only to loopback or its own namespace ({}), not {url}",
                self.ns_ip
            ))),
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the namespace deletes the veth pair and every rule inside it.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .stderr(Stdio::null())
            .status();
    }
}
