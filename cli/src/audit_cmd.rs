//! Audit and secrets keys at start-up, and `differently audit verify`: checks an export
//! (`GET /v1/admin/audit/export`) offline with the audit key, so a copy kept outside the
//! installation proves what the log said when it was exported.

use std::path::{Path, PathBuf};

use clap::Subcommand;
use differently_store::audit::{
    self, AuditEvent, AuditKey, AuditKeyring, Checkpoint, ExportLine, Verifier,
};
use differently_store::sealed::{self, SealKey};

use crate::client::output;
use crate::config::AuditSection;
use crate::roles::AnyError;

/// `differently audit …`
#[derive(Subcommand)]
pub enum AuditCommand {
    /// Verify an audit export (JSON lines) offline; exits 1 if any record fails.
    Verify {
        /// Environment variable holding the audit key (64 hex characters).
        #[arg(long, default_value = "DIFFERENTLY_AUDIT_KEY")]
        key_env: String,
        /// Environment variable holding retired audit keys (comma-separated), so records
        /// signed before a rotation verify too.
        #[arg(long, default_value = "DIFFERENTLY_AUDIT_PREVIOUS_KEYS")]
        previous_keys_env: String,
        /// The export file (`-` for standard input).
        file: PathBuf,
    },
}

/// Runs an `audit` subcommand.
pub fn run(cmd: AuditCommand) -> Result<(), AnyError> {
    match cmd {
        AuditCommand::Verify {
            key_env,
            previous_keys_env,
            file,
        } => {
            let key = key_from_env(&key_env)?.ok_or_else(|| {
                format!("environment variable {key_env} is not set (the audit key)")
            })?;
            let ring = AuditKeyring::new(key).with_previous(previous_from_env(&previous_keys_env)?);
            let report = verify_export(ring, &file)?;
            let failed = report.first_bad.as_ref().map(|p| {
                format!(
                    "audit export does not verify: chain {} record {}: {}",
                    p.chain, p.chain_seq, p.message
                )
            });
            // A reader that goes away (`| head`) must not turn a failed verification into
            // exit 0: the failure is said on stderr and the exit stays 1.
            if let Some(message) = &failed {
                output::failed_if_reader_goes(message.clone());
            }
            output::print_line(&serde_json::to_string_pretty(&report)?);
            match failed {
                None => Ok(()),
                Some(message) => Err(message.into()),
            }
        }
    }
}

/// A 32-byte key from environment variable `var`; `None` if unset or empty. The error
/// names the variable, never its value.
fn key_from_env(var: &str) -> Result<Option<AuditKey>, AnyError> {
    match std::env::var(var) {
        Err(_) => Ok(None),
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => AuditKey::from_hex(&v)
            .map(Some)
            .map_err(|e| format!("{var}: {e}").into()),
    }
}

/// Retired audit keys from `var` (comma- or whitespace-separated); none if unset. The error
/// names the variable and the position, never a value.
fn previous_from_env(var: &str) -> Result<Vec<AuditKey>, AnyError> {
    let Ok(text) = std::env::var(var) else {
        return Ok(vec![]);
    };
    text.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|k| !k.is_empty())
        .enumerate()
        .map(|(i, k)| {
            AuditKey::from_hex(k).map_err(|e| format!("{var}, key {}: {e}", i + 1).into())
        })
        .collect()
}

/// Why a server role cannot start without an audit key: each process would sign with its
/// own random key and no chain could be verified, by anyone, ever.
fn missing_audit_key(var: &str) -> String {
    format!(
        "no audit key: set {var} to 64 hex characters (`differently key generate --audit`), the \
         same for every api, scheduler and worker process; without it no audit chain could be \
         verified (docs/audit.md)"
    )
}

/// Installs the audit and secrets keys named by `[audit]` before the store writes. A server
/// refuses to start without an audit key; `dev` (one process, an in-memory store) makes a
/// random one when none is set and answers it, so it can be shown to the user.
pub fn install_keys(section: &AuditSection, dev: bool) -> Result<Option<AuditKey>, AnyError> {
    let generated = match key_from_env(&section.key_env)? {
        Some(k) => {
            tracing::info!(key_id = %k.key_id(), "audit key configured");
            let _ = audit::set_process_key(k);
            None
        }
        None if dev => {
            let k = AuditKey::random()?;
            tracing::info!(
                key_id = %k.key_id(),
                "dev: no {} set, audit chains use a new random key (printed once, on stdout)",
                section.key_env
            );
            let _ = audit::set_process_key(k.clone());
            Some(k)
        }
        None => return Err(missing_audit_key(&section.key_env).into()),
    };
    let previous = previous_from_env(&section.previous_keys_env)?;
    if !previous.is_empty() {
        let ids: Vec<String> = previous.iter().map(AuditKey::key_id).collect();
        tracing::info!(key_ids = ?ids, "retired audit keys configured (verify only)");
    }
    let _ = audit::set_process_previous_keys(previous);
    match secrets_key(section)? {
        Some(k) => {
            let _ = sealed::set_process_key(k);
            tracing::info!("secrets key configured: stored secrets enabled");
        }
        // `dev` makes one for the run itself, and says so.
        None if dev => {}
        None => tracing::info!(
            "no secrets key in {}: stored secrets are disabled (env and file references work)",
            section.secrets_key_env
        ),
    }
    Ok(generated)
}

/// The secrets sealing key named by `[audit]`; `None` if unset or empty. The error names the
/// variable, never its value.
fn secrets_key(section: &AuditSection) -> Result<Option<SealKey>, AnyError> {
    match std::env::var(&section.secrets_key_env) {
        Ok(v) if !v.trim().is_empty() => SealKey::from_hex(&v)
            .map(Some)
            .map_err(|e| format!("{}: {e}", section.secrets_key_env).into()),
        _ => Ok(None),
    }
}

/// What `preflight` says of the keys, without installing them: an error names what is wrong.
pub fn check_keys(section: &AuditSection) -> Result<String, AnyError> {
    let key = key_from_env(&section.key_env)?.ok_or_else(|| missing_audit_key(&section.key_env))?;
    let previous = previous_from_env(&section.previous_keys_env)?;
    let secrets = match secrets_key(section)? {
        Some(_) => "stored secrets enabled",
        None => "no secrets key: stored secrets disabled",
    };
    Ok(format!(
        "audit key {} ({} retired); {secrets}",
        key.key_id(),
        previous.len()
    ))
}

/// Reads an export and walks it: checkpoints in `seq` order, then records by chain and
/// position (the order of lines in the file does not matter).
pub fn verify_export(
    ring: impl Into<AuditKeyring>,
    path: &Path,
) -> Result<audit::VerifyReport, AnyError> {
    let text = if path == Path::new("-") {
        std::io::read_to_string(std::io::stdin())?
    } else {
        std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?
    };
    let mut checkpoints: Vec<Checkpoint> = vec![];
    let mut records: Vec<AuditEvent> = vec![];
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<ExportLine>(line) {
            Ok(ExportLine::Checkpoint(c)) => checkpoints.push(c),
            Ok(ExportLine::Record(r)) => records.push(*r),
            Err(e) => return Err(format!("line {}: not an audit export line ({e})", i + 1).into()),
        }
    }
    checkpoints.sort_by_key(|c| c.seq);
    records.sort_by(|a, b| (&a.chain, a.chain_seq, a.seq).cmp(&(&b.chain, b.chain_seq, b.seq)));
    let mut v = Verifier::new(ring);
    checkpoints.iter().for_each(|c| v.checkpoint(c));
    records.iter().for_each(|r| v.record(r));
    Ok(v.finish())
}

/// The signed chain the e2e tests verify too (one definition; the CLI has no library).
#[cfg(test)]
#[path = "../tests/e2e/audit_chain.rs"]
mod audit_chain;

#[cfg(test)]
mod tests {
    use super::audit_chain::{export_lines, three_records};
    use super::*;

    #[test]
    fn verifies_a_file_in_any_line_order_and_reports_an_edit() {
        let key = AuditKey::from_bytes([9; 32]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("export.jsonl");
        let mut lines = export_lines(&three_records(&key));
        lines.reverse();
        std::fs::write(&path, lines.join("\n")).unwrap();
        let report = verify_export(key.clone(), &path).unwrap();
        assert!(report.ok, "{report:?}");
        assert_eq!(report.records, 3);
        let wrong = verify_export(AuditKey::from_bytes([1; 32]), &path).unwrap();
        assert!(!wrong.ok);
        let edited = lines
            .join("\n")
            .replace("\"resource\":\"p1\"", "\"resource\":\"px\"");
        std::fs::write(&path, edited).unwrap();
        let bad = verify_export(key.clone(), &path)
            .unwrap()
            .first_bad
            .unwrap();
        assert_eq!(bad.chain_seq, 2);
        std::fs::write(&path, "not json\n").unwrap();
        assert!(verify_export(key.clone(), &path).is_err());
    }
}
