//! `differently events` and `differently sandbox logs`: sandbox status changes as they
//! happen. Without `-f` they print what the server holds (from `--after`, default the
//! start) and end once nothing new arrives for a moment; with `-f` they follow, and resume
//! after the last event if the connection drops.

use std::time::Duration;

use clap::Args;
use differently_client::events::{Event, EventFilter};
use differently_client::Client;

use super::output::print_line;
use super::{CliError, Output, Printer};

/// Without `-f`: the stream is caught up once it is quiet this long.
const CAUGHT_UP: Duration = Duration::from_millis(1000);

/// `differently events`.
#[derive(Args, Debug)]
pub struct EventsArgs {
    /// Only this project's sandboxes.
    #[arg(long)]
    pub project: Option<String>,
    /// Only this sandbox.
    #[arg(long)]
    pub sandbox: Option<String>,
    /// Start after this sequence (each event's `id`); default: from the start.
    #[arg(long, default_value_t = 0)]
    pub after: u64,
    /// Keep printing new events until interrupted.
    #[arg(short = 'f', long)]
    pub follow: bool,
}

/// Runs `differently events`.
pub async fn events(c: &Client, p: Printer, a: EventsArgs) -> Result<(), CliError> {
    let filter = EventFilter {
        project_id: a.project,
        sandbox_id: a.sandbox,
        after: Some(a.after),
    };
    tail(c, p, filter, a.follow).await
}

/// Runs `differently sandbox logs`.
pub async fn sandbox_logs(c: &Client, p: Printer, id: &str, follow: bool) -> Result<(), CliError> {
    let filter = EventFilter {
        sandbox_id: Some(id.to_owned()),
        after: Some(0),
        ..EventFilter::default()
    };
    tail(c, p, filter, follow).await
}

async fn tail(c: &Client, p: Printer, filter: EventFilter, follow: bool) -> Result<(), CliError> {
    let mut stream = c.events(filter).await?;
    if p.output == Output::Table {
        print_line(&row("SEQ", "AT", "SANDBOX", "STATUS", "POOL", "REASON"));
    }
    loop {
        let next = if follow {
            stream.next().await
        } else {
            match tokio::time::timeout(CAUGHT_UP, stream.next()).await {
                Ok(n) => n,
                Err(_) => return Ok(()),
            }
        };
        match next {
            None => return Ok(()),
            Some(ev) => show(p, &ev?),
        }
    }
}

fn row(seq: &str, at: &str, sandbox: &str, status: &str, pool: &str, reason: &str) -> String {
    format!("{seq:<6}  {at:<30}  {sandbox:<30}  {status:<12}  {pool:<10}  {reason}")
}

fn show(p: Printer, e: &Event) {
    match p.output {
        Output::Json => {
            let mut v = serde_json::to_value(&e.event).unwrap_or_default();
            v["id"] = serde_json::json!(e.id);
            print_line(&v.to_string());
        }
        Output::Id => print_line(&e.id.to_string()),
        Output::Table => {
            let ev = &e.event;
            print_line(&row(
                &e.id.to_string(),
                &ev.at,
                &ev.sandbox_id,
                &ev.status,
                ev.pool.as_deref().unwrap_or("-"),
                ev.status_reason.as_deref().unwrap_or(""),
            ));
        }
    }
}

/// Runs `differently events` from the command line.
pub async fn run(target: &super::Target, args: EventsArgs) -> std::process::ExitCode {
    let client = match target.client() {
        Ok(c) => c,
        Err(e) => return super::fail(&e),
    };
    super::finish(events(&client, target.printer(), args).await)
}
