//! `differently events` (also spelled `events watch`) and `differently sandbox logs`:
//! events as they happen — sandbox status changes, or with `--public` the public event
//! contract of every type (`--types` narrows it). Without `-f` they print what the server
//! holds (from `--after`, default the start) and end once nothing new arrives for a moment;
//! with `-f` they follow, and resume after the last event if the connection drops. A status
//! change older than one already printed for its sandbox is not printed.
//! `events schemas` and `events credentials` are in [`super::public_events`].

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use clap::{Args, Subcommand};
use differently_client::events::{Event, EventFilter, PublicEventEntry, PublicEventFilter};
use differently_client::{Client, StatusEvent};

use super::output::{cell, print_line};
use super::public_events::{self, CredentialsCommand};
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
    /// Public events (docs/events.md: every type, the same JSON as NATS and webhooks)
    /// instead of status changes. `-o json` prints each event as it is, with its `seq`.
    #[arg(long)]
    pub public: bool,
    /// With --public: only these types, comma-separated, exact or prefixes
    /// (`sandbox.status.changed,sandbox.exec.*`).
    #[arg(long, value_delimiter = ',', requires = "public")]
    pub types: Vec<String>,
}

impl EventsArgs {
    /// Whether any watch flag was given (`--after 0`, the default, counts as not given).
    fn is_set(&self) -> bool {
        self.project.is_some()
            || self.sandbox.is_some()
            || self.after != 0
            || self.follow
            || self.public
            || !self.types.is_empty()
    }
}

/// `differently events …` subcommands (without one, `differently events` watches).
#[derive(Subcommand, Debug)]
pub enum EventsCommand {
    /// Watch events as they happen (the same as `differently events` with these flags).
    Watch(EventsArgs),
    /// The JSON Schema of every public event type (a table of types), or of one (JSON).
    Schemas {
        /// One type, e.g. `sandbox.status.changed`.
        event_type: Option<String>,
    },
    /// NATS credentials for reading the public events from NATS directly (needs a NATS
    /// server with Differently's auth callout; `differently dev` has none).
    Credentials {
        #[command(subcommand)]
        command: CredentialsCommand,
    },
}

/// Runs `differently events` (and `events watch`).
pub async fn events(c: &Client, p: Printer, a: EventsArgs) -> Result<(), CliError> {
    if a.public {
        let filter = PublicEventFilter {
            project_id: a.project,
            sandbox_id: a.sandbox,
            types: a.types,
            after: Some(a.after),
        };
        return tail_public(c, p, filter, a.follow).await;
    }
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
    let mut shown = Shown::default();
    while let Some(ev) = next_unless_caught_up(follow, stream.next()).await {
        let ev = ev?;
        if shown.is_newer(&ev.event) {
            show(p, &ev);
        }
    }
    Ok(())
}

/// The highest `statusVersion` shown of each sandbox. One sandbox's changes can reach the
/// stream in another order than they happened (two processes publish them, each after its
/// own commit; docs/events.md "Order"), and `/v1/events` sends a late one too, also after a
/// resume: printing it would show a sandbox going back to an older status.
#[derive(Default)]
struct Shown(HashMap<String, u64>);

impl Shown {
    /// Whether `e` is newer than every change of its sandbox shown so far; if so, it is
    /// the one to compare the next with.
    fn is_newer(&mut self, e: &StatusEvent) -> bool {
        match self.0.get_mut(&e.sandbox_id) {
            Some(v) if *v >= e.status_version => false,
            Some(v) => {
                *v = e.status_version;
                true
            }
            None => {
                self.0.insert(e.sandbox_id.clone(), e.status_version);
                true
            }
        }
    }
}

async fn tail_public(
    c: &Client,
    p: Printer,
    filter: PublicEventFilter,
    follow: bool,
) -> Result<(), CliError> {
    let mut stream = c.public_events(filter).await?;
    if p.output == Output::Table {
        print_line(&public_row(
            "SEQ", "TIME", "TYPE", "SANDBOX", "CAUSE", "DATA",
        ));
    }
    while let Some(ev) = next_unless_caught_up(follow, stream.next()).await {
        show_public(p, &ev?);
    }
    Ok(())
}

/// The stream's next item; `None` once it ends or, without `follow`, once it has been quiet
/// for [`CAUGHT_UP`].
async fn next_unless_caught_up<T>(
    follow: bool,
    next: impl Future<Output = Option<T>>,
) -> Option<T> {
    if follow {
        next.await
    } else {
        tokio::time::timeout(CAUGHT_UP, next).await.ok().flatten()
    }
}

fn public_row(seq: &str, time: &str, ty: &str, sandbox: &str, cause: &str, data: &str) -> String {
    format!("{seq:<6}  {time:<30}  {ty:<28}  {sandbox:<30}  {cause:<10}  {data}")
}

fn show_public(p: Printer, e: &PublicEventEntry) {
    match p.output {
        // The contract's JSON as it is; `seq` is an added field, which the contract tells
        // every consumer to ignore when it does not know it.
        Output::Json => {
            let mut v = serde_json::to_value(&e.event).unwrap_or_default();
            v["seq"] = serde_json::json!(e.id);
            print_line(&v.to_string());
        }
        Output::Id => print_line(&e.id.to_string()),
        Output::Table => {
            let ev = &e.event;
            print_line(&public_row(
                &e.id.to_string(),
                &ev.time,
                &ev.event_type,
                ev.sandbox_id.as_deref().unwrap_or("-"),
                &ev.cause,
                &cell(&ev.data),
            ));
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

/// Runs `differently events [SUBCOMMAND]` from the command line.
pub async fn run(
    target: &super::Target,
    command: Option<EventsCommand>,
    args: EventsArgs,
) -> std::process::ExitCode {
    let client = match target.client() {
        Ok(c) => c,
        Err(e) => return super::fail(&e),
    };
    let p = target.printer();
    if command.is_some() && args.is_set() {
        // Not clap's `args_conflicts_with_subcommands`: it would refuse the global `-o` and
        // `--url` before a subcommand too.
        return super::fail(&CliError::Usage(
            "the watch flags (--project, --sandbox, --after, -f, --public, --types) go after \
             `differently events` or `differently events watch`, not before another subcommand"
                .into(),
        ));
    }
    super::finish(match command {
        None => events(&client, p, args).await,
        Some(EventsCommand::Watch(args)) => events(&client, p, args).await,
        Some(EventsCommand::Schemas { event_type }) => {
            public_events::schemas(&client, p, event_type.as_deref()).await
        }
        Some(EventsCommand::Credentials { command }) => {
            public_events::credentials(&client, p, command).await
        }
    })
}
