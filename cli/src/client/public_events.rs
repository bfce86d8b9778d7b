//! `differently events schemas [TYPE]` and `differently events credentials create|revoke`:
//! the public event contract's JSON Schemas, and NATS credentials for reading it from NATS
//! directly. The credentials' token is printed this once, like a new key's secret.

use clap::Subcommand;
use differently_client::{Client, EventCredentialsRequest};
use serde_json::{json, Value};

use super::output::{print_line, Column};
use super::{to_json, CliError, Output, Printer};

const SCHEMA_COLUMNS: &[Column] = &[
    ("TYPE", "type"),
    ("DATA FIELDS", "dataFields"),
    ("SCHEMA", "schemaId"),
];

const CREDENTIAL_COLUMNS: &[Column] = &[];

/// `differently events credentials …`.
#[derive(Subcommand, Debug)]
pub enum CredentialsCommand {
    /// NATS credentials for the organization's (or a project's) public subjects; the token
    /// is printed this once.
    Create {
        /// How long they work, in seconds (60 … 86400; default 3600).
        #[arg(long)]
        ttl_seconds: Option<u64>,
        /// Only this project's subjects.
        #[arg(long)]
        project: Option<String>,
    },
    /// Revoke credentials: new connections are refused at once, open ones end within
    /// five minutes.
    Revoke {
        /// The credentials' id (`evc_…`).
        id: String,
    },
}

/// `differently events schemas [TYPE]`. A list is a table of types (`-o json`: the API's
/// whole answer, envelope included); one type's schema is a document, so it is printed as
/// JSON whatever `-o` says, except `-o id`, which prints its type.
pub async fn schemas(c: &Client, p: Printer, event_type: Option<&str>) -> Result<(), CliError> {
    let Some(t) = event_type else {
        let list = c.event_schemas().await?;
        if p.output == Output::Json {
            return p.print(&to_json(&list), &[]);
        }
        if p.output == Output::Id {
            list.items.iter().for_each(|i| print_line(&i.event_type));
            return Ok(());
        }
        let rows = list
            .items
            .iter()
            .map(|i| {
                json!({
                    "type": i.event_type,
                    "dataFields": i.schema["properties"]["data"]["required"],
                    "schemaId": i.schema["$id"],
                })
            })
            .collect();
        return p.print_list(rows, SCHEMA_COLUMNS);
    };
    let schema: Value = c.event_schema(t).await?;
    if p.output == Output::Id {
        print_line(t);
        return Ok(());
    }
    print_line(&serde_json::to_string_pretty(&schema).unwrap_or_else(|_| schema.to_string()));
    Ok(())
}

/// `differently events credentials create|revoke`.
pub async fn credentials(
    c: &Client,
    p: Printer,
    command: CredentialsCommand,
) -> Result<(), CliError> {
    match command {
        CredentialsCommand::Create {
            ttl_seconds,
            project,
        } => {
            let cred = c
                .create_event_credentials(&EventCredentialsRequest {
                    ttl_seconds,
                    project_id: project,
                })
                .await?;
            match p.output {
                Output::Json | Output::Id => p.print(&to_json(&cred), CREDENTIAL_COLUMNS),
                Output::Table => {
                    let mut v = to_json(&cred);
                    if let Some(m) = v.as_object_mut() {
                        m.remove("token");
                    }
                    p.print(&v, CREDENTIAL_COLUMNS)?;
                    print_line("");
                    print_line("NATS token (shown only this once; connect with it and the inbox prefix above):");
                    print_line(&cred.token);
                    Ok(())
                }
            }
        }
        CredentialsCommand::Revoke { id } => {
            c.revoke_event_credentials(&id).await?;
            Ok(())
        }
    }
}
