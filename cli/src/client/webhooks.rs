//! `differently webhooks …`: a project's webhooks over the API (`docs/webhooks.md`). Create
//! and rotate-secret print the signing secret this once — in a table after the webhook, with
//! `-o json` inside the API's whole answer — because the API never serves it again.

use std::process::ExitCode;

use clap::{ArgGroup, Subcommand};
use differently_client::{Client, CreateWebhook, UpdateWebhook, WebhookWithSecret};
use futures::TryStreamExt;

use super::output::{print_line, Column};
use super::{fail, finish, to_json, CliError, Output, Printer, Target};

const WEBHOOK_COLUMNS: &[Column] = &[
    ("ID", "id"),
    ("URL", "url"),
    ("TYPES", "eventTypes"),
    ("ENABLED", "enabled"),
    ("FAILURES", "consecutiveFailures"),
    ("PROJECT", "projectId"),
    ("DESCRIPTION", "description"),
];

const DELIVERY_COLUMNS: &[Column] = &[
    ("ID", "id"),
    ("TYPE", "eventType"),
    ("STATUS", "status"),
    ("ATTEMPTS", "attempts"),
    ("CODE", "responseCode"),
    ("NEXT ATTEMPT", "nextAttemptAt"),
    ("EVENT", "eventId"),
    ("LAST ERROR", "lastError"),
];

/// Webhook commands.
#[derive(Subcommand, Debug)]
pub enum WebhookCommand {
    /// List webhooks (a project-bound key sees its project's only).
    List {
        /// Only this project's.
        #[arg(long)]
        project: Option<String>,
    },
    /// Create a webhook; its signing secret is printed this once.
    Create {
        /// Where events are POSTed (`https://…`; `http` and private addresses only where the
        /// operator allows them).
        // Not named `url`: that id is the global `--url` of the API, which would take it.
        #[arg(value_name = "URL")]
        webhook_url: String,
        /// Its project (default: the key's).
        #[arg(long)]
        project: Option<String>,
        /// Event types delivered, comma-separated: exact (`sandbox.status.changed`),
        /// prefixes (`sandbox.exec.*`) or `*`. Default: every type.
        #[arg(long, value_delimiter = ',')]
        types: Vec<String>,
        /// What it is for.
        #[arg(long)]
        description: Option<String>,
        /// Sent as `Idempotency-Key`: a retry creates no second webhook; it is a 409 naming
        /// the first (whose secret is not shown again).
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// Read a webhook (never its secret).
    Get { id: String },
    /// Change a webhook's URL, types, description, or enable/disable it.
    #[command(group(ArgGroup::new("state").args(["enable", "disable"])))]
    #[command(group(ArgGroup::new("filter").args(["types", "all_types"])))]
    #[command(group(ArgGroup::new("about").args(["description", "no_description"])))]
    Update {
        id: String,
        /// A new URL to POST to (`--url` is the API's).
        #[arg(long)]
        webhook_url: Option<String>,
        /// New event types, comma-separated (replaces the old list).
        #[arg(long, value_delimiter = ',')]
        types: Option<Vec<String>>,
        /// Deliver every type.
        #[arg(long)]
        all_types: bool,
        /// A new description.
        #[arg(long)]
        description: Option<String>,
        /// Clear the description.
        #[arg(long)]
        no_description: bool,
        /// Re-enable it (forgets the failures that disabled it; pending deliveries resume).
        #[arg(long)]
        enable: bool,
        /// Stop deliveries (they wait until it is enabled again).
        #[arg(long)]
        disable: bool,
    },
    /// Delete a webhook and its delivery log.
    Delete { id: String },
    /// Make a new signing secret, printed this once; the old one keeps signing next to it
    /// until `previousSecretExpiresAt`.
    RotateSecret { id: String },
    /// A webhook's delivery log, newest first.
    Deliveries { id: String },
    /// Send a delivery again now (the receiver sees the same `webhook-id`).
    Redeliver {
        /// The webhook.
        id: String,
        /// The delivery (`whd_…`, from `deliveries`).
        delivery: String,
    },
}

/// Runs a webhook command.
pub async fn run(target: &Target, command: WebhookCommand) -> ExitCode {
    let client = match target.client() {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    finish(answer(&client, target.printer(), command).await)
}

async fn answer(c: &Client, p: Printer, command: WebhookCommand) -> Result<(), CliError> {
    match command {
        WebhookCommand::List { project } => {
            let items: Vec<_> = c.list_webhooks(project.as_deref()).try_collect().await?;
            p.print_list(items.iter().map(to_json).collect(), WEBHOOK_COLUMNS)
        }
        WebhookCommand::Create {
            webhook_url,
            project,
            types,
            description,
            idempotency_key,
        } => {
            let req = CreateWebhook {
                project_id: project,
                url: webhook_url,
                event_types: (!types.is_empty()).then_some(types),
                description,
            };
            let created = c.create_webhook(&req, idempotency_key.as_deref()).await?;
            print_with_secret(p, &created)
        }
        WebhookCommand::Get { id } => p.print(&to_json(&c.get_webhook(&id).await?), &[]),
        WebhookCommand::Update {
            id,
            webhook_url,
            types,
            all_types,
            description,
            no_description,
            enable,
            disable,
        } => {
            let update = UpdateWebhook {
                url: webhook_url,
                event_types: if all_types { Some(Vec::new()) } else { types },
                description: if no_description {
                    Some(None)
                } else {
                    description.map(Some)
                },
                enabled: (enable || disable).then_some(enable),
            };
            if update.is_empty() {
                return Err(CliError::Usage(
                    "nothing to change: give --webhook-url, --types, --all-types, --description, \
                     --no-description, --enable or --disable"
                        .into(),
                ));
            }
            p.print(&to_json(&c.update_webhook(&id, &update).await?), &[])
        }
        WebhookCommand::Delete { id } => {
            c.delete_webhook(&id).await?;
            Ok(())
        }
        WebhookCommand::RotateSecret { id } => {
            print_with_secret(p, &c.rotate_webhook_secret(&id).await?)
        }
        WebhookCommand::Deliveries { id } => {
            let items: Vec<_> = c.list_webhook_deliveries(&id).try_collect().await?;
            p.print_list(items.iter().map(to_json).collect(), DELIVERY_COLUMNS)
        }
        WebhookCommand::Redeliver { id, delivery } => p.print(
            &to_json(&c.redeliver_webhook_delivery(&id, &delivery).await?),
            &[],
        ),
    }
}

/// A webhook whose secret the API shows this once. `-o json`: the whole answer, secret
/// included. A table: the webhook, then the secret on its own, said to be shown once.
/// `-o id`: the id only, and on stderr that the secret was not printed (a script that wants
/// it reads `-o json`).
fn print_with_secret(p: Printer, created: &WebhookWithSecret) -> Result<(), CliError> {
    match p.output {
        Output::Json => p.print(&to_json(created), &[]),
        Output::Id => {
            print_line(&created.webhook.id);
            eprintln!(
                "differently: the signing secret was not printed (-o id); use -o json to \
                 capture it, or `differently webhooks rotate-secret {}` for a new one",
                created.webhook.id
            );
            Ok(())
        }
        Output::Table => {
            p.print(&to_json(&created.webhook), &[])?;
            print_line("");
            print_line(
                "Signing secret (shown only this once; store it where your receiver verifies signatures):",
            );
            print_line(&created.secret);
            Ok(())
        }
    }
}
