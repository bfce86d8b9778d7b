//! `differently snapshot …`: snapshots of sandboxes, and new sandboxes from them (fork or
//! restore).

use std::process::ExitCode;

use clap::Subcommand;
use differently_client::{Client, SnapshotDeletion};
use futures::TryStreamExt;

use super::output::Column;
use super::sandbox::{wait_for, CreateArgs, SANDBOX_COLUMNS};
use super::{fail, finish, to_json, CliError, Printer, Target};

const SNAPSHOT_COLUMNS: &[Column] = &[
    ("ID", "id"),
    ("STATUS", "status"),
    ("NAME", "name"),
    ("SANDBOX", "sandboxId"),
    ("POOL", "pool"),
    ("CREATED", "createdAt"),
];

/// Snapshot commands.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum SnapshotCommand {
    /// Snapshot a sandbox (waits up to 10 s for it to be ready).
    Create {
        /// The sandbox.
        sandbox: String,
        /// A name for it.
        #[arg(long)]
        name: Option<String>,
        /// Sent as `Idempotency-Key`: a retry answers the same snapshot.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// List snapshots: one sandbox's, or every one the key can see.
    List {
        /// Only this sandbox's.
        #[arg(long)]
        sandbox: Option<String>,
        /// Only this project's.
        #[arg(long, conflicts_with = "sandbox")]
        project: Option<String>,
    },
    /// Read a snapshot.
    Get { id: String },
    /// Delete a snapshot.
    Delete { id: String },
    /// A new sandbox from a ready snapshot (fork, or restore).
    Fork {
        /// The snapshot.
        id: String,
        #[command(flatten)]
        spec: CreateArgs,
        /// Sent as `Idempotency-Key`.
        #[arg(long)]
        idempotency_key: Option<String>,
        /// Wait until it runs and print it then; exit 1 unless it runs.
        #[arg(long)]
        wait: bool,
        /// How long `--wait` waits, in seconds.
        #[arg(long, default_value_t = 120)]
        wait_seconds: u64,
    },
}

/// Runs a snapshot command.
pub async fn run(target: &Target, command: SnapshotCommand) -> ExitCode {
    let client = match target.client() {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    finish(answer(&client, target.printer(), command).await)
}

async fn answer(c: &Client, p: Printer, command: SnapshotCommand) -> Result<(), CliError> {
    match command {
        SnapshotCommand::Create {
            sandbox,
            name,
            idempotency_key,
        } => {
            let s = c
                .create_snapshot(&sandbox, name.as_deref(), idempotency_key.as_deref())
                .await?;
            p.print(&to_json(&s), SNAPSHOT_COLUMNS)
        }
        SnapshotCommand::List { sandbox, project } => {
            let items: Vec<_> = match sandbox {
                Some(s) => c.list_sandbox_snapshots(&s).try_collect().await?,
                None => c.list_snapshots(project.as_deref()).try_collect().await?,
            };
            p.print_list(items.iter().map(to_json).collect(), SNAPSHOT_COLUMNS)
        }
        SnapshotCommand::Get { id } => {
            p.print(&to_json(&c.get_snapshot(&id).await?), SNAPSHOT_COLUMNS)
        }
        SnapshotCommand::Delete { id } => match c.delete_snapshot(&id).await? {
            SnapshotDeletion::Deleted => Ok(()),
            SnapshotDeletion::Pending(s) => p.print(&to_json(&s), SNAPSHOT_COLUMNS),
        },
        SnapshotCommand::Fork {
            id,
            spec,
            idempotency_key,
            wait,
            wait_seconds,
        } => {
            let s = c
                .fork(&id, spec.request()?, idempotency_key.as_deref())
                .await?;
            if wait {
                wait_for(c, p, &s.id, "running", wait_seconds, "--wait-seconds").await
            } else {
                p.print(&to_json(&s), SANDBOX_COLUMNS)
            }
        }
    }
}
