//! `differently admin …`: operator reads over the API (an admin key).

use std::process::ExitCode;

use clap::Subcommand;
use reqwest::Method;

use super::{fail, print_json, Client, Target};

/// Operator commands.
#[derive(Subcommand, Debug)]
pub enum AdminCommand {
    /// Pools: health, capabilities, source.
    Pools,
    /// Where work may go and why, per pool and per organization.
    TrustReport,
    /// Verify every audit chain on the server; exit 1 if one does not hold.
    AuditVerify,
}

/// Runs an admin command; the process's exit code.
pub async fn run(target: &Target, command: AdminCommand) -> ExitCode {
    let client = match Client::new(target) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    let verify = matches!(command, AdminCommand::AuditVerify);
    let path = match command {
        AdminCommand::Pools => "/v1/admin/pools",
        AdminCommand::TrustReport => "/v1/admin/trust-report",
        AdminCommand::AuditVerify => "/v1/admin/audit/verify",
    };
    match client.call(Method::GET, path, None, &[]).await {
        Ok(v) => {
            print_json(&v);
            if verify && v["ok"] != true {
                eprintln!("differently: the audit log does not verify (see firstBad)");
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}
