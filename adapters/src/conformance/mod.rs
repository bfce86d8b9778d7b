//! The conformance kit: the adapter contract run against a backend, check by check, with a
//! report a person (table) or a pipeline (JSON) reads. `differently plugin conformance URL`
//! runs [`run_plugin`] against a plugin; [`run`] takes any adapter, so tests and new
//! in-repository adapters use the same checks.
//!
//! The checks need a few programs. A plugin that runs real commands has a POSIX `sh`; an
//! in-memory test plugin may instead speak the reference `fake` adapter's vocabulary
//! (`fake-stderr`, `fake-exit N`). Which one is found first is the report's `dialect`.
//! Both know `echo`, `true`, `false`, `cat` (stdin), `pwd`, `env` and `sleep`.

mod contract;
mod exec;
mod files;
mod honesty;
mod lifecycle;
mod optional;
mod process;
mod protocol;
mod runner;
mod stream;
mod support;

use std::fmt::Write as _;

use serde::Serialize;

use crate::credentials::{CredentialRef, Credentials};
use crate::remote::wire::{self, Info};
use crate::remote::{RemoteAdapter, RemoteConfig};
use crate::{Adapter, Capability};
use contract::contract_checks;
use protocol::protocol_checks;
use runner::Runner;

/// How a check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Pass,
    Fail,
    /// Not run: the capability it needs is not declared (its honesty check runs instead).
    Skip,
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Stable dotted name (`exec.timeout`), for scripts and bug reports.
    pub name: String,
    pub outcome: Outcome,
    /// What was seen (on failure: what was expected and what came instead).
    pub detail: String,
}

/// Which programs the checks use (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dialect {
    Posix,
    Fake,
}

/// Everything one run found.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// What the plugin's `/info` said (absent when it could not be read, or for [`run`]).
    pub plugin: Option<Info>,
    /// The capabilities the checks held the backend to.
    pub declared: Vec<String>,
    pub dialect: Option<Dialect>,
    pub checks: Vec<Check>,
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
}

impl Report {
    /// True when no check failed.
    pub fn ok(&self) -> bool {
        self.failed == 0 && self.passed > 0
    }

    /// The check named `name`, if it ran.
    pub fn check(&self, name: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }

    /// Names of the failed checks.
    pub fn failures(&self) -> Vec<&str> {
        self.checks
            .iter()
            .filter(|c| c.outcome == Outcome::Fail)
            .map(|c| c.name.as_str())
            .collect()
    }

    /// The human table: one line per check, then the totals.
    pub fn table(&self) -> String {
        let mut out = String::new();
        if let Some(i) = &self.plugin {
            let _ = writeln!(
                out,
                "plugin {} (protocol {} v{:?}), capabilities: {}",
                i.name,
                i.protocol,
                i.versions,
                i.capabilities.join(", ")
            );
        }
        if let Some(d) = self.dialect {
            let _ = writeln!(out, "programs: {d:?}");
        }
        let width = self.checks.iter().map(|c| c.name.len()).max().unwrap_or(5);
        let _ = writeln!(out, "{:<width$}  RESULT  DETAIL", "CHECK");
        for c in &self.checks {
            let result = match c.outcome {
                Outcome::Pass => "pass",
                Outcome::Fail => "FAIL",
                Outcome::Skip => "skip",
            };
            let _ = writeln!(out, "{:<width$}  {result:<6}  {}", c.name, c.detail);
        }
        let _ = writeln!(
            out,
            "{} passed, {} failed, {} skipped: {}",
            self.passed,
            self.failed,
            self.skipped,
            if self.ok() {
                "CONFORMS"
            } else {
                "DOES NOT CONFORM"
            }
        );
        out
    }

    fn finish(mut self) -> Report {
        self.passed = self.count(Outcome::Pass);
        self.failed = self.count(Outcome::Fail);
        self.skipped = self.count(Outcome::Skip);
        self
    }

    fn count(&self, o: Outcome) -> usize {
        self.checks.iter().filter(|c| c.outcome == o).count()
    }
}

/// Where the plugin is and how to authenticate to it.
#[derive(Debug, Clone)]
pub struct Target {
    /// The plugin's base URL (`/adapter/v1` is added).
    pub url: String,
    /// The bearer token, by reference.
    pub token: CredentialRef,
}

/// Whether `url`'s host is this machine (plain http is accepted only there).
fn is_loopback_url(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let authority = rest.split('/').next().unwrap_or("");
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Runs every check against the plugin at `target`: the protocol's own (info, auth,
/// versioning, error shape), then the contract's through a `remote` adapter that passes
/// every call on, declared or not.
pub async fn run_plugin(target: &Target) -> Report {
    let mut r = Runner::new();
    let url = target.url.trim().to_owned();
    let allow_http = is_loopback_url(&url);
    if url.starts_with("http://") && !allow_http {
        r.fail(
            "target",
            "plain http:// only to this machine (127.0.0.1, ::1, localhost); use https://",
        );
        return r.report(None, Vec::new());
    }
    let config = RemoteConfig {
        url: Some(url.clone()),
        token: Some(target.token.to_string()),
        allow_http,
        ..RemoteConfig::default()
    };
    let adapter = match RemoteAdapter::new(&config, &Credentials::default()) {
        Ok(a) => a.ungated(),
        Err(e) => {
            r.fail("target", e.to_string());
            return r.report(None, Vec::new());
        }
    };
    let info = match adapter.refresh_info().await {
        Ok(i) => i,
        Err(e) => {
            r.fail("info", format!("GET /adapter/v1/info: {e}"));
            return r.report(None, Vec::new());
        }
    };
    let unknown: Vec<&String> = info
        .capabilities
        .iter()
        .filter(|c| !wire::PROTOCOL_CAPABILITIES.contains(&c.as_str()))
        .collect();
    if !unknown.is_empty() {
        r.fail(
            "info",
            format!("declares capabilities the protocol does not carry: {unknown:?}"),
        );
    } else if !info.capabilities.iter().any(|c| c == "exec") {
        r.fail(
            "info",
            "does not declare `exec`, which every backend must have",
        );
    } else {
        r.pass(
            "info",
            format!("{} speaks versions {:?}", info.name, info.versions),
        );
    }
    let token = Credentials::default()
        .resolver(target.token.clone())
        .get()
        .await;
    match token {
        Ok(token) => protocol_checks(&mut r, &adapter_base(&url), &token).await,
        Err(e) => r.fail("auth.required", format!("the token cannot be read: {e}")),
    }
    let declared: Vec<Capability> = info
        .capabilities
        .iter()
        .filter_map(|c| Capability::parse(c))
        .collect();
    let dialect = contract_checks(&mut r, &adapter, &declared).await;
    Report {
        dialect,
        ..r.report(Some(info), in_order(&declared))
    }
    .finish()
}

/// Runs the contract's checks against `adapter`, holding it to `declared`.
pub async fn run(adapter: &dyn Adapter, declared: &[Capability]) -> Report {
    let mut r = Runner::new();
    let dialect = contract_checks(&mut r, adapter, declared).await;
    Report {
        dialect,
        ..r.report(None, in_order(declared))
    }
    .finish()
}

/// The wire names of `caps`, in the order declared (as the report shows them).
fn in_order(caps: &[Capability]) -> Vec<String> {
    caps.iter().map(|c| c.name().to_owned()).collect()
}

fn adapter_base(url: &str) -> String {
    let trimmed = url.trim_end_matches('/');
    let base = trimmed.strip_suffix(wire::BASE_PATH).unwrap_or(trimmed);
    format!("{base}{}", wire::BASE_PATH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_only_to_this_machine() {
        assert!(is_loopback_url("http://127.0.0.1:9/"));
        assert!(is_loopback_url("http://[::1]:9"));
        assert!(is_loopback_url("http://localhost:9"));
        assert!(!is_loopback_url("http://10.0.0.1:9"));
        assert!(!is_loopback_url("https://127.0.0.1:9"));
        assert_eq!(
            adapter_base("http://h:1/adapter/v1/"),
            "http://h:1/adapter/v1"
        );
    }

    #[tokio::test]
    async fn the_fake_adapter_conforms_in_process() {
        let caps = [
            Capability::Exec,
            Capability::ExecStream,
            Capability::ExecStdin,
            Capability::ExecPty,
            Capability::Files,
            Capability::LifecyclePause,
            Capability::LifecycleStop,
            Capability::Snapshots,
            Capability::PortsExpose,
        ];
        let fake = crate::fake::FakeAdapter::new(crate::fake::FakeConfig {
            capabilities: differently_core::capability::names(&caps),
            ..crate::fake::FakeConfig::default()
        });
        let report = run(&fake, &caps).await;
        assert!(report.ok(), "{}", report.table());
        assert_eq!(report.dialect, Some(Dialect::Fake));
    }
}
