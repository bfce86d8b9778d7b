//! `differently admin …`: operator reads over the API (an admin key).

use std::process::ExitCode;

use clap::Subcommand;
use reqwest::Method;

use super::{fail, Client, Target};

/// Operator commands.
#[derive(Subcommand, Debug)]
pub enum AdminCommand {
    /// Pools: health, capabilities, source.
    Pools,
    /// Where work may go and why, per pool and per organization.
    TrustReport,
    /// Verify every audit chain on the server; exit 1 if one does not hold.
    AuditVerify,
    /// After a lost audit key: start a new audit segment (docs/audit.md). Rewrites nothing;
    /// records signed with the lost key stay, counted as unverifiable.
    AuditSegment {
        /// Why, recorded in the signed segment (e.g. the incident it follows).
        #[arg(long)]
        reason: String,
    },
}

/// Runs an admin command; the process's exit code.
pub async fn run(target: &Target, command: AdminCommand) -> ExitCode {
    let client = match Client::new(target) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    let verify = matches!(command, AdminCommand::AuditVerify);
    let (method, path, body) = match command {
        AdminCommand::Pools => (Method::GET, "/v1/admin/pools", None),
        AdminCommand::TrustReport => (Method::GET, "/v1/admin/trust-report", None),
        AdminCommand::AuditVerify => (Method::GET, "/v1/admin/audit/verify", None),
        AdminCommand::AuditSegment { reason } => (
            Method::POST,
            "/v1/admin/audit/segments",
            Some(serde_json::json!({ "reason": reason })),
        ),
    };
    match client.call(method, path, body.as_ref(), &[]).await {
        Ok(v) => {
            if let Err(e) = target.output.print(&v) {
                return fail(&e);
            }
            if verify && v["ok"] != true {
                eprintln!("differently: the audit log does not verify (see firstBad)");
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}
