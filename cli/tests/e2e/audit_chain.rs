//! A signed audit chain for the tests of `audit verify`: the binary's unit test
//! (`audit_cmd.rs`) and the e2e test of a pipeline (`cli_offline.rs`) check the same export.
//! The CLI is a binary crate, so its unit tests and its e2e tests share no library: both
//! include this file (`#[path]`), as the e2e tests include the adapters' fake servers.

use chrono::Utc;
use differently_store::audit::{
    AuditEvent, AuditKey, ExportLine, NewAuditEvent, INSTALLATION_CHAIN,
};
use serde_json::json;

/// Three records on the installation chain, each linked to the one before and signed with
/// `key`: `pool.register` of `p0`, `p1`, `p2`, sequences 1 to 3.
pub fn three_records(key: &AuditKey) -> Vec<AuditEvent> {
    let mut recs: Vec<AuditEvent> = vec![];
    for i in 0..3 {
        let prev = recs.last().map(|r| (r.chain_seq, r.hash.clone()));
        let mut r = AuditEvent::chained(
            key,
            INSTALLATION_CHAIN.into(),
            prev,
            NewAuditEvent {
                org_id: None,
                project_id: None,
                actor: "system:test".into(),
                action: "pool.register".into(),
                resource: format!("p{i}"),
                outcome: "ok".into(),
                detail: json!({}),
            },
            Utc::now(),
            None,
        );
        r.seq = i + 1;
        recs.push(r);
    }
    recs
}

/// `records` as the lines of an export (`ExportLine::Record`, one JSON object each).
pub fn export_lines(records: &[AuditEvent]) -> Vec<String> {
    records
        .iter()
        .map(|r| {
            serde_json::to_string(&ExportLine::Record(Box::new(r.clone()))).expect("export line")
        })
        .collect()
}
