//! The runner: collects each check's outcome and bounds each check by a hang timeout.

use std::future::Future;
use std::time::Duration;

use super::{Check, Outcome, Report};
use crate::remote::wire::Info;

/// Longest any one check may take before it fails as hung.
const CHECK_TIMEOUT: Duration = Duration::from_secs(60);

/// Collects check results.
pub(super) struct Runner {
    checks: Vec<Check>,
}

impl Runner {
    pub(super) fn new() -> Self {
        Runner { checks: Vec::new() }
    }

    pub(super) fn record(&mut self, name: &str, result: Result<String, String>) {
        let (outcome, detail) = match result {
            Ok(d) => (Outcome::Pass, d),
            Err(d) => (Outcome::Fail, d),
        };
        self.checks.push(Check {
            name: name.to_owned(),
            outcome,
            detail,
        });
    }

    pub(super) fn pass(&mut self, name: &str, detail: impl Into<String>) {
        self.record(name, Ok(detail.into()));
    }

    pub(super) fn fail(&mut self, name: &str, detail: impl Into<String>) {
        self.record(name, Err(detail.into()));
    }

    pub(super) fn skip(&mut self, name: &str, detail: impl Into<String>) {
        self.checks.push(Check {
            name: name.to_owned(),
            outcome: Outcome::Skip,
            detail: detail.into(),
        });
    }

    /// Runs one check with the hang timeout.
    pub(super) async fn check<F>(&mut self, name: &str, f: F)
    where
        F: Future<Output = Result<String, String>>,
    {
        let r = match tokio::time::timeout(CHECK_TIMEOUT, f).await {
            Ok(r) => r,
            Err(_) => Err(format!("no answer within {} s", CHECK_TIMEOUT.as_secs())),
        };
        self.record(name, r);
    }

    pub(super) fn report(self, plugin: Option<Info>, declared: Vec<String>) -> Report {
        Report {
            plugin,
            declared,
            dialect: None,
            checks: self.checks,
            passed: 0,
            failed: 0,
            skipped: 0,
        }
        .finish()
    }
}
