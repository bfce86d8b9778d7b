//! `differently admin …`: operators' routes over the API (an admin key): pools, stored
//! secrets, the audit log, the trust report.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use differently_client::{AuditFilter, Client};
use futures::TryStreamExt;

use super::output::{cell, print_line, print_rows, print_table, Column};
use super::{fail, finish, to_json, CliError, Output, Printer, Target};

const POOL_COLUMNS: &[Column] = &[
    ("NAME", "name"),
    ("KIND", "kind"),
    ("TRUST", "trust"),
    ("HEALTHY", "healthy"),
    ("REGION", "region"),
    ("SOURCE", "source"),
    ("VERSION", "backendVersion"),
    ("VERIFIED", "verified"),
    ("CAPABILITIES", "capabilities"),
];
const AUDIT_COLUMNS: &[Column] = &[
    ("SEQ", "seq"),
    ("AT", "at"),
    ("ACTOR", "actor"),
    ("ACTION", "action"),
    ("RESOURCE", "resource"),
    ("OUTCOME", "outcome"),
];

/// Operator commands.
#[derive(Subcommand, Debug)]
pub enum AdminCommand {
    /// Pools: health, capabilities, source; `pools warm …` for their warm classes.
    Pools {
        #[command(subcommand)]
        command: Option<PoolsCommand>,
    },
    /// One pool.
    Pool { name: String },
    /// Register a pool from a JSON document (`PoolRequest`: name, kind, trust, region,
    /// settings with credential references only; docs/configuration.md).
    PoolCreate {
        /// The JSON file (`-` for standard input).
        #[arg(long)]
        file: PathBuf,
    },
    /// Change a pool registered through the API, from a JSON document of the fields to change.
    PoolUpdate {
        name: String,
        /// The JSON file (`-` for standard input).
        #[arg(long)]
        file: PathBuf,
    },
    /// Remove a pool that runs nothing.
    PoolDelete { name: String },
    /// Where work may go and why, per pool and per organization.
    TrustReport,
    /// Stored backend secrets: names and fingerprints only.
    Secrets,
    /// Store or replace a backend secret; the value is read from standard input (never a
    /// flag, which `ps` and shell history would show).
    SecretSet { name: String },
    /// Audit records (the key's organization; any with `--org`).
    AuditList {
        /// The organization's chains (admin keys; default: the key's own).
        #[arg(long)]
        org: Option<String>,
        /// Only records of this project.
        #[arg(long)]
        project: Option<String>,
        /// Only this action, e.g. `sandbox.exec`.
        #[arg(long)]
        action: Option<String>,
        /// Only records of this actor.
        #[arg(long)]
        actor: Option<String>,
        /// Only records about this resource id.
        #[arg(long)]
        resource: Option<String>,
        /// RFC 3339: records at or after this time.
        #[arg(long)]
        since: Option<String>,
        /// RFC 3339: records before this time.
        #[arg(long)]
        until: Option<String>,
    },
    /// Every audit record as JSON lines, to stdout or `--file` (check it offline with
    /// `differently audit verify`).
    AuditExport {
        /// Write here instead of stdout.
        #[arg(long)]
        file: Option<PathBuf>,
    },
    /// Verify every audit chain on the server; exit 1 if one does not hold.
    AuditVerify,
    /// Sign every audit chain's head now (prints nothing when nothing changed).
    AuditCheckpoint,
    /// After a lost audit key: start a new audit segment (docs/audit.md). Rewrites nothing;
    /// records signed with the lost key stay, counted as unverifiable.
    AuditSegment {
        /// Why, recorded in the signed segment (e.g. the incident it follows).
        #[arg(long)]
        reason: String,
    },
}

/// `admin pools …`.
#[derive(Subcommand, Debug)]
pub enum PoolsCommand {
    /// A pool's warm classes: instances kept ready so a matching create skips the backend
    /// create (docs/configuration.md, docs/api.md).
    Warm {
        #[command(subcommand)]
        command: WarmCommand,
    },
}

/// `admin pools warm …`.
#[derive(Subcommand, Debug)]
pub enum WarmCommand {
    /// The pool's warm classes with their ready and creating instances, claims per minute
    /// and hit ratio over the last 10 minutes (`-o id`: the names).
    Get { pool: String },
    /// Replace the pool's warm classes from a JSON document: `{"classes": [...]}` or the
    /// list alone (`[]` removes them all); prints them as `get` does.
    Set {
        pool: String,
        /// The JSON file (`-` for standard input).
        #[arg(long)]
        file: PathBuf,
    },
}

const WARM_COLUMNS: &[Column] = &[
    ("NAME", "name"),
    ("READY", "ready"),
    ("CREATING", "creating"),
    ("CLAIMS/MIN", "claimsPerMinute"),
    ("HIT RATIO", "hitRatio"),
    ("SIZE", "size"),
    ("MAX SIZE", "maxSize"),
    ("REFILL/S", "refillPerSecond"),
    ("MAX AGE", "maxAgeSeconds"),
    ("TEMPLATE", "template"),
    ("RESOURCES", "resources"),
];

/// Prints a pool's warm classes: the document (json), a row per class (table), the class
/// names (id: a class's name is its id within the pool).
fn print_warm(p: Printer, doc: &differently_client::WarmClasses) -> Result<(), CliError> {
    let classes: Vec<serde_json::Value> = doc.classes.iter().map(to_json).collect();
    match p.output {
        Output::Json => p.print(&to_json(doc), &[]),
        Output::Table => {
            print_table(&classes, WARM_COLUMNS);
            Ok(())
        }
        Output::Id => {
            doc.classes.iter().for_each(|c| print_line(&c.class.name));
            Ok(())
        }
    }
}

/// The classes of a `warm set` document: `{"classes": [...]}` or the list alone.
fn warm_classes_of(doc: serde_json::Value) -> Result<Vec<serde_json::Value>, CliError> {
    match doc {
        serde_json::Value::Array(list) => Ok(list),
        serde_json::Value::Object(mut o) if o.len() == 1 && o.contains_key("classes") => {
            match o.remove("classes") {
                Some(serde_json::Value::Array(list)) => Ok(list),
                _ => Err(CliError::Usage("--file: `classes` must be a list".into())),
            }
        }
        _ => Err(CliError::Usage(
            "--file: expected {\"classes\": [...]} or a list of classes".into(),
        )),
    }
}

/// Runs an admin command; the process's exit code.
pub async fn run(target: &Target, command: AdminCommand) -> ExitCode {
    let client = match target.client() {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    finish(answer(&client, target.printer(), command).await)
}

async fn answer(c: &Client, p: Printer, command: AdminCommand) -> Result<(), CliError> {
    match command {
        AdminCommand::Pools { command: None } => {
            let items: Vec<_> = c.list_pools().try_collect().await?;
            p.print_list(items.iter().map(to_json).collect(), POOL_COLUMNS)
        }
        AdminCommand::Pools {
            command: Some(PoolsCommand::Warm { command }),
        } => match command {
            WarmCommand::Get { pool } => print_warm(p, &c.warm_classes(&pool).await?),
            WarmCommand::Set { pool, file } => {
                let classes = warm_classes_of(read_json(&file)?)?;
                print_warm(p, &c.put_warm_classes(&pool, &classes).await?)
            }
        },
        AdminCommand::Pool { name } => p.print(&to_json(&c.get_pool(&name).await?), &[]),
        AdminCommand::PoolCreate { file } => {
            let req = read_json(&file)?;
            p.print(&c.create_pool(&req).await?, &[])
        }
        AdminCommand::PoolUpdate { name, file } => {
            let req = read_json(&file)?;
            p.print(&c.update_pool(&name, &req).await?, &[])
        }
        AdminCommand::PoolDelete { name } => Ok(c.delete_pool(&name).await?),
        AdminCommand::TrustReport => {
            let report = c.trust_report().await?;
            if p.output == Output::Table {
                print_trust_report(&report);
                Ok(())
            } else {
                p.print(&report, &[])
            }
        }
        AdminCommand::Secrets => {
            let items: Vec<_> = c.list_secrets().try_collect().await?;
            p.print_list(items, &[("NAME", "name"), ("FINGERPRINT", "fingerprint")])
        }
        AdminCommand::SecretSet { name } => {
            let stdin = std::io::stdin();
            if stdin.is_terminal() {
                eprint!("value of {name}: ");
                let _ = std::io::stderr().flush();
            }
            let mut value = String::new();
            stdin
                .lock()
                .read_to_string(&mut value)
                .map_err(|e| CliError::io("reading the secret from standard input", e))?;
            let value = value.strip_suffix('\n').unwrap_or(&value);
            if value.is_empty() {
                return Err(CliError::Usage(
                    "no secret on standard input (e.g. `printf %s \"$TOKEN\" | differently admin secret-set NAME`)"
                        .into(),
                ));
            }
            p.print(&c.put_secret(&name, value).await?, &[])
        }
        AdminCommand::AuditList {
            org,
            project,
            action,
            actor,
            resource,
            since,
            until,
        } => {
            let filter = AuditFilter {
                org_id: org,
                project_id: project,
                action,
                actor,
                resource,
                since,
                until,
                limit: None,
            };
            let items: Vec<_> = c.list_audit(&filter).try_collect().await?;
            p.print_list(items, AUDIT_COLUMNS)
        }
        AdminCommand::AuditExport { file } => {
            match file {
                Some(path) => {
                    let mut f = std::fs::File::create(&path)
                        .map_err(|e| CliError::io(path.display().to_string(), e))?;
                    c.export_audit(&mut f).await?;
                }
                None => {
                    let mut out = StdoutOrExit;
                    c.export_audit(&mut out).await?;
                }
            }
            Ok(())
        }
        AdminCommand::AuditVerify => {
            let v = c.verify_audit().await?;
            p.print(&v, &[])?;
            if v["ok"] != true {
                return Err(CliError::Outcome(
                    "the audit log does not verify (see firstBad)".into(),
                ));
            }
            Ok(())
        }
        AdminCommand::AuditCheckpoint => match c.checkpoint_audit().await? {
            Some(v) => p.print(&v, &[]),
            None => {
                eprintln!("differently: nothing changed since the last checkpoint");
                Ok(())
            }
        },
        AdminCommand::AuditSegment { reason } => p.print(&c.segment_audit(&reason).await?, &[]),
    }
}

/// Stdout for a streamed export: a reader that went away ends the process quietly.
struct StdoutOrExit;

impl Write for StdoutOrExit {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        super::output::write_raw(&mut std::io::stdout(), buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A JSON document from a file or stdin, sent as it is: the API judges its fields and names
/// the one it refuses.
fn read_json(file: &std::path::Path) -> Result<serde_json::Value, CliError> {
    let text = if file.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| CliError::io("reading standard input", e))?;
        s
    } else {
        std::fs::read_to_string(file).map_err(|e| CliError::io(file.display().to_string(), e))?
    };
    serde_json::from_str(&text)
        .map_err(|e| CliError::Usage(format!("--file {}: not JSON: {e}", file.display())))
}

const TRUST_POOL_COLUMNS: &[Column] = &[
    ("NAME", "name"),
    ("KIND", "kind"),
    ("TRUST", "trust"),
    ("REGION", "region"),
    ("ISOLATION", "isolation"),
    ("EGRESS", "egress"),
    ("ENDPOINT", "endpoint"),
    ("HEALTHY", "healthy"),
    ("SOURCE", "source"),
    ("VERSION", "backendVersion"),
    ("VERIFIED", "verified"),
];
const TRUST_PLACEMENT_COLUMNS: &[Column] = &[
    ("ORG", "orgId"),
    ("ORG NAME", "orgName"),
    ("POOL", "pool"),
    ("SANDBOXES", "sandboxes"),
    ("FIRST", "firstAt"),
    ("LAST", "lastAt"),
];

/// The trust report as a reader takes it in: its own fields, then each section under a
/// heading, lists as tables and sentences as lines (a table cell of nested JSON is
/// unreadable). What has no column here (a placement's policy, a pool's health detail) is
/// in `-o json`.
fn print_trust_report(v: &serde_json::Value) {
    use serde_json::Value;
    let scalars: Vec<Vec<String>> = v
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, x)| !x.is_array() && !x.is_object())
        .map(|(k, x)| vec![k.clone(), cell(x)])
        .collect();
    print_rows(&["FIELD".to_owned(), "VALUE".to_owned()], &scalars);
    let list = |k: &str| v[k].as_array().cloned().unwrap_or_default();
    let heading = |title: &str| {
        print_line("");
        print_line(title);
    };
    let pools = list("pools");
    heading("POOLS");
    section_table(&pools, TRUST_POOL_COLUMNS);
    // One row per credential, named by its pool: the references and fingerprints only.
    let credentials: Vec<Value> = pools
        .iter()
        .flat_map(|p| {
            p["credentials"]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |c| {
                    let mut row = c.clone();
                    row["pool"] = p["name"].clone();
                    row
                })
        })
        .collect();
    heading("CREDENTIALS");
    section_table(
        &credentials,
        &[
            ("POOL", "pool"),
            ("REFERENCE", "reference"),
            ("FINGERPRINT", "fingerprint"),
            ("UPDATED BY", "updatedBy"),
            ("UPDATED AT", "updatedAt"),
            ("PROBLEM", "problem"),
        ],
    );
    heading("EXTERNAL PLACEMENTS");
    section_table(&list("externalPlacements"), TRUST_PLACEMENT_COLUMNS);
    heading("NOT ENFORCED");
    for line in list("notEnforced") {
        print_line(&format!("- {}", cell(&line)));
    }
}

/// A section's rows, or `(none)`.
fn section_table(items: &[serde_json::Value], columns: &[Column]) {
    if items.is_empty() {
        print_line("(none)");
    } else {
        print_table(items, columns);
    }
}
