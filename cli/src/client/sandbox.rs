//! `differently sandbox …`: create, read, update, wait for, run commands in, copy files to and
//! from, and end sandboxes.

use std::io::{IsTerminal, Read};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use differently_client::exec::{ExecEvent, StreamFormat};
use differently_client::sandboxes::Lifecycle;
use differently_client::{
    Client, CreateSandbox, ExecRequest, PortExposure, Resources, SandboxFilter, UpdateSandbox,
};
use futures::TryStreamExt;

use super::output::{print_line, write_raw, Column, Spinner};
use super::{fail, finish, pairs, to_json, CliError, Printer, Target};

/// Table columns of a sandbox.
pub const SANDBOX_COLUMNS: &[Column] = &[
    ("ID", "id"),
    ("STATUS", "status"),
    ("POOL", "pool"),
    ("LABELS", "labels"),
    ("CREATED", "createdAt"),
    ("EXPIRES", "expiresAt"),
];

/// What a new sandbox should be: the fields of `POST /v1/sandboxes` (all optional).
#[derive(Args, Debug, Clone, Default)]
pub struct CreateArgs {
    /// Project (required for an organization-wide key).
    #[arg(long)]
    pub project: Option<String>,
    /// Resource profile: small, medium, large, xlarge.
    #[arg(long)]
    pub profile: Option<String>,
    /// Template (image) to start from; the pool's default when omitted.
    #[arg(long)]
    pub template: Option<String>,
    /// vCPUs (overrides the profile's).
    #[arg(long)]
    pub cpu: Option<u32>,
    /// Memory in MiB (overrides the profile's).
    #[arg(long)]
    pub memory_mib: Option<u64>,
    /// Disk in GiB (overrides the profile's).
    #[arg(long)]
    pub disk_gib: Option<u64>,
    /// `KEY=VALUE`, repeatable.
    #[arg(long = "label")]
    pub labels: Vec<String>,
    /// `KEY=VALUE`, repeatable (values never appear in answers).
    #[arg(long = "env")]
    pub env: Vec<String>,
    /// Capability the pool must have, repeatable (e.g. `exec.stream`).
    #[arg(long = "capability")]
    pub capabilities: Vec<String>,
    /// Data classification the placement policy reads (e.g. `confidential`).
    #[arg(long)]
    pub classification: Option<String>,
    /// Region the sandbox must run in (only pools of that region are eligible).
    #[arg(long)]
    pub region: Option<String>,
    /// Placement strategy (e.g. `cheapest`, `fastest`; docs/placement.md).
    #[arg(long)]
    pub strategy: Option<String>,
    /// Seconds until it is deleted, whatever it is doing.
    #[arg(long)]
    pub ttl_seconds: Option<u64>,
    /// Seconds without activity before it is paused (or stopped); 1–2592000.
    #[arg(long)]
    pub idle_timeout_seconds: Option<u64>,
}

impl CreateArgs {
    /// The request body; a malformed `KEY=VALUE` is a usage error naming its flag.
    pub fn request(&self) -> Result<CreateSandbox, CliError> {
        let resources = Resources {
            cpu: self.cpu,
            memory_mib: self.memory_mib,
            disk_gib: self.disk_gib,
        };
        Ok(CreateSandbox {
            project_id: self.project.clone(),
            template: self.template.clone(),
            resources: (resources != Resources::default()).then_some(resources),
            profile: self.profile.clone(),
            env: pairs("env", &self.env)?,
            labels: pairs("label", &self.labels)?,
            ttl_seconds: self.ttl_seconds,
            idle_timeout_seconds: self.idle_timeout_seconds,
            capabilities: self.capabilities.clone(),
            classification: self.classification.clone(),
            region: self.region.clone(),
            strategy: self.strategy.clone(),
            ..CreateSandbox::default()
        })
    }
}

/// Sandbox commands.
// Parsed once per process: the size of the largest variant costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum SandboxCommand {
    /// Create a sandbox (every flag is optional: `{}` gets the defaults).
    Create {
        #[command(flatten)]
        spec: CreateArgs,
        /// Create from a ready snapshot (restore or fork).
        #[arg(long)]
        from_snapshot: Option<String>,
        /// Sent as `Idempotency-Key`: a retry with the same key creates nothing new.
        #[arg(long)]
        idempotency_key: Option<String>,
        /// Only show where it would be placed and why (`POST /v1/placement/dry-run`);
        /// nothing is created.
        #[arg(long, conflicts_with_all = ["wait", "idempotency_key"])]
        dry_run: bool,
        /// Wait until it runs (or ends) and print it then; exit 1 unless it runs (`timeout`
        /// on stderr when the time ran out).
        #[arg(long)]
        wait: bool,
        /// How long `--wait` waits, in seconds.
        #[arg(long, default_value_t = 120)]
        wait_seconds: u64,
    },
    /// List sandboxes the key can see (every page, unless `--limit` or `--cursor` asks for one).
    List {
        /// Only this status (`queued`, `provisioning`, `running`, `paused`, `stopped`, …).
        #[arg(long)]
        status: Option<String>,
        /// Only sandboxes with this label, `KEY=VALUE`.
        #[arg(long)]
        label: Option<String>,
        /// Only this project's.
        #[arg(long)]
        project: Option<String>,
        /// One page of at most this many items (printed with its `nextCursor`).
        #[arg(long)]
        limit: Option<u32>,
        /// The page after this `nextCursor`.
        #[arg(long)]
        cursor: Option<String>,
    },
    /// Read one sandbox.
    Get { id: String },
    /// Wait until a sandbox has a status (default `running`) or a final one, and print it;
    /// exit 1 unless it has the status asked for (`timeout` or `ended` on stderr).
    Wait {
        id: String,
        /// The status to wait for.
        #[arg(long, default_value = "running")]
        status: String,
        /// Give up after this many seconds (exit 1, `timeout`).
        #[arg(long, default_value_t = 120)]
        timeout_seconds: u64,
    },
    /// Change a sandbox: renew its TTL, replace its labels, set its idle timeout.
    Update {
        id: String,
        /// A new TTL in seconds, counted from now.
        #[arg(long)]
        ttl_seconds: Option<u64>,
        /// `KEY=VALUE`, repeatable: the new labels, replacing all of them.
        #[arg(long = "label")]
        labels: Vec<String>,
        /// Remove every label.
        #[arg(long, conflicts_with = "labels")]
        clear_labels: bool,
        /// Seconds without activity before it is paused (or stopped).
        #[arg(long)]
        idle_timeout_seconds: Option<u64>,
    },
    /// Count as activity now (resets the idle clock).
    Keepalive { id: String },
    /// Run a command: its output streamed to ours, our stdin (when not a terminal) as its
    /// stdin, its exit code as ours. `-it`: on a terminal in the sandbox, ours in raw mode
    /// forwarding every key (the default command is a login shell).
    Exec {
        id: String,
        /// Keep stdin: send it even when it is a terminal (read to its end, ^D); with `-t`,
        /// forward each key as typed.
        #[arg(short = 'i', long, conflicts_with = "no_stdin")]
        interactive: bool,
        /// Run the command on a terminal inside the sandbox (`GET …/pty`): stdout and stderr
        /// are one stream, the size follows ours. Without `-i` no input is sent.
        #[arg(short = 't', long, conflicts_with_all = ["buffered", "timeout_seconds"])]
        tty: bool,
        /// Working directory (absolute).
        #[arg(long)]
        cwd: Option<String>,
        /// `KEY=VALUE`, repeatable.
        #[arg(long = "env")]
        env: Vec<String>,
        /// Kill the command after this many seconds (exit 124).
        #[arg(long)]
        timeout_seconds: Option<u64>,
        /// Send no stdin, even when ours is a pipe or a file.
        #[arg(short = 'n', long)]
        no_stdin: bool,
        /// Use the buffered route (`POST …/exec`): output arrives at the end, each stream cut
        /// at 1 MiB.
        #[arg(long)]
        buffered: bool,
        /// The command and its arguments, after `--` (optional with `-t`: `sh -l`).
        #[arg(last = true, required_unless_present = "tty")]
        command: Vec<String>,
    },
    /// Why the sandbox runs where it runs.
    Placement { id: String },
    /// Pause a running sandbox.
    Pause { id: String },
    /// Resume a paused sandbox.
    Resume { id: String },
    /// Stop a sandbox (frees its CPU and memory quota).
    Stop { id: String },
    /// Start a stopped sandbox.
    Start { id: String },
    /// Delete a sandbox.
    Delete { id: String },
    /// Expose a port of the sandbox at a URL.
    Expose {
        id: String,
        /// The port inside the sandbox.
        port: u16,
        /// How long the URL stays valid, in seconds.
        #[arg(long)]
        expires_seconds: Option<u64>,
    },
    /// Copy files or directories: `cp ./dir SANDBOX:/path` up, `cp SANDBOX:/path ./dir`
    /// down (`-` is stdin or stdout, for one file). A relative sandbox path is from its root
    /// `/` (where `exec` runs without `--cwd`): `SANDBOX:work/a` is `/work/a`.
    Cp {
        /// The source: a local path, or `SANDBOX:PATH`.
        src: String,
        /// The destination: a local path, or `SANDBOX:PATH`.
        dst: String,
    },
    /// List a directory in the sandbox.
    Ls {
        id: String,
        /// The directory (a relative one is from the root `/`).
        #[arg(default_value = "/")]
        path: String,
        /// Levels to descend.
        #[arg(long, default_value_t = 1)]
        depth: u32,
    },
    /// Delete a file in the sandbox.
    Rm {
        id: String,
        /// The file (a relative path is from the root `/`).
        path: String,
    },
    /// Make a directory in the sandbox, with its missing parents (`mkdir -p`, parents 755);
    /// one already there is left as it is, and the command still succeeds.
    Mkdir {
        id: String,
        /// The directory (a relative path is from the root `/`).
        path: String,
        /// Its octal permission bits when made, e.g. `750` (default 755).
        #[arg(long, value_parser = super::files::octal_mode)]
        mode: Option<u32>,
    },
    /// The sandbox's status changes from its start; `-f` keeps following.
    Logs {
        id: String,
        /// Keep printing new events until interrupted.
        #[arg(short = 'f', long)]
        follow: bool,
    },
}

/// Runs a sandbox command; the process's exit code.
pub async fn run(target: &Target, command: SandboxCommand) -> ExitCode {
    let client = match target.client() {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    let p = target.printer();
    match command {
        SandboxCommand::Exec {
            id,
            interactive,
            tty: true,
            cwd,
            env,
            command,
            ..
        } => {
            let run = async {
                let exec = super::shell::TtyExec {
                    command,
                    env: pairs("env", &env)?,
                    cwd,
                    interactive,
                };
                super::shell::run(&client, &id, exec).await
            };
            match run.await {
                Ok(code) => code,
                Err(e) => fail(&e),
            }
        }
        SandboxCommand::Exec {
            id,
            interactive,
            tty: false,
            cwd,
            env,
            timeout_seconds,
            no_stdin,
            buffered,
            command,
        } => {
            let stdin = StdinUse {
                none: no_stdin,
                even_a_terminal: interactive,
            };
            let req = match exec_request(cwd, &env, timeout_seconds, stdin, command) {
                Ok(r) => r,
                Err(e) => return fail(&e),
            };
            let result = if buffered {
                exec_buffered(&client, &id, &req).await
            } else {
                exec_streamed(&client, &id, &req).await
            };
            match result {
                Ok(code) => code,
                Err(e) => fail(&e),
            }
        }
        SandboxCommand::Cp { src, dst } => finish(super::files::cp(&client, &src, &dst).await),
        SandboxCommand::Ls { id, path, depth } => {
            finish(super::files::ls(&client, p, &id, &path, depth).await)
        }
        SandboxCommand::Rm { id, path } => finish(
            client
                .delete_file(&id, &super::files::sandbox_path(&path))
                .await
                .map_err(CliError::from),
        ),
        SandboxCommand::Mkdir { id, path, mode } => {
            finish(super::files::mkdir(&client, p, &id, &path, mode).await)
        }
        SandboxCommand::Logs { id, follow } => {
            finish(super::events::sandbox_logs(&client, p, &id, follow).await)
        }
        other => finish(answer(&client, p, other).await),
    }
}

async fn answer(c: &Client, p: Printer, command: SandboxCommand) -> Result<(), CliError> {
    let one = |v: serde_json::Value| p.print(&v, SANDBOX_COLUMNS);
    match command {
        SandboxCommand::Create {
            spec,
            from_snapshot,
            idempotency_key,
            dry_run,
            wait,
            wait_seconds,
        } => {
            let mut req = spec.request()?;
            req.from_snapshot = from_snapshot;
            if dry_run {
                let v = c.placement_dry_run(&req).await?;
                return p.print(&v, &[]);
            }
            let created = c.create_sandbox(&req, idempotency_key.as_deref()).await?;
            if !wait {
                return one(to_json(&created));
            }
            wait_for(c, p, &created.id, "running", wait_seconds, "--wait-seconds").await
        }
        SandboxCommand::List {
            status,
            label,
            project,
            limit,
            cursor,
        } => {
            let filter = SandboxFilter {
                status,
                label,
                project_id: project,
                limit,
            };
            if limit.is_some() || cursor.is_some() {
                let page = c.list_sandboxes_page(&filter, cursor.as_deref()).await?;
                return p.print(&to_json(&page), SANDBOX_COLUMNS);
            }
            let items: Vec<_> = c.list_sandboxes(&filter).try_collect().await?;
            p.print_list(items.iter().map(to_json).collect(), SANDBOX_COLUMNS)
        }
        SandboxCommand::Get { id } => one(to_json(&c.get_sandbox(&id).await?)),
        SandboxCommand::Wait {
            id,
            status,
            timeout_seconds,
        } => wait_for(c, p, &id, &status, timeout_seconds, "--timeout-seconds").await,
        SandboxCommand::Update {
            id,
            ttl_seconds,
            labels,
            clear_labels,
            idle_timeout_seconds,
        } => {
            let labels = if clear_labels {
                Some(Default::default())
            } else if labels.is_empty() {
                None
            } else {
                Some(pairs("label", &labels)?)
            };
            let update = UpdateSandbox {
                ttl_seconds,
                labels,
                idle_timeout_seconds,
            };
            if update == UpdateSandbox::default() {
                return Err(CliError::Usage(
                    "nothing to change: give --ttl-seconds, --label, --clear-labels or --idle-timeout-seconds"
                        .into(),
                ));
            }
            one(to_json(&c.update_sandbox(&id, &update).await?))
        }
        SandboxCommand::Keepalive { id } => {
            c.keepalive(&id).await?;
            Ok(())
        }
        SandboxCommand::Placement { id } => p.print(&c.placement(&id).await?, &[]),
        SandboxCommand::Pause { id } => one(to_json(&c.lifecycle(&id, Lifecycle::Pause).await?)),
        SandboxCommand::Resume { id } => one(to_json(&c.lifecycle(&id, Lifecycle::Resume).await?)),
        SandboxCommand::Stop { id } => one(to_json(&c.lifecycle(&id, Lifecycle::Stop).await?)),
        SandboxCommand::Start { id } => one(to_json(&c.lifecycle(&id, Lifecycle::Start).await?)),
        SandboxCommand::Delete { id } => one(to_json(&c.delete_sandbox(&id).await?)),
        SandboxCommand::Expose {
            id,
            port,
            expires_seconds,
        } => match c.expose_port(&id, port, expires_seconds).await? {
            PortExposure::Ready(a) => {
                if p.output == super::Output::Id {
                    print_line(&a.url);
                    Ok(())
                } else {
                    p.print(&to_json(&a), &[])
                }
            }
            PortExposure::Pending(op) => {
                p.print(&to_json(&op), &[])?;
                Err(CliError::Outcome(format!(
                    "port {port} is still being exposed ({}): ask again",
                    op.status
                )))
            }
        },
        SandboxCommand::Exec { .. }
        | SandboxCommand::Cp { .. }
        | SandboxCommand::Ls { .. }
        | SandboxCommand::Rm { .. }
        | SandboxCommand::Mkdir { .. }
        | SandboxCommand::Logs { .. } => Err(CliError::Usage("run on its own".into())),
    }
}

/// Waits until `id` has `status` (or a final one), saying so on stderr (a spinner on a
/// terminal, one line otherwise); prints the sandbox as last seen. An error unless it has
/// `status`: `timeout` when `seconds` ran out (`flag` sets them), `ended` when it reached
/// another final status. Scripts under `set -e` stop there instead of going on with a
/// sandbox that is not what they waited for.
pub async fn wait_for(
    c: &Client,
    p: Printer,
    id: &str,
    status: &str,
    seconds: u64,
    flag: &str,
) -> Result<(), CliError> {
    let waiting = Spinner::waiting(id, status, seconds);
    let done = c
        .wait_sandbox(id, status, Duration::from_secs(seconds))
        .await;
    drop(waiting);
    let done = done?;
    let failed = if done.status == status {
        None
    } else if done.is_final() {
        Some(CliError::Wait {
            code: "ended",
            message: format!("sandbox {id} is {} and will not be {status}", done.status),
        })
    } else {
        Some(CliError::Wait {
            code: "timeout",
            message: format!(
                "sandbox {id} is still {} after {seconds}s, not {status} (wait longer with {flag})",
                done.status
            ),
        })
    };
    // A reader that goes away (`| head`) must not turn a wait that failed into exit 0.
    if let Some(e) = &failed {
        super::output::failed_if_reader_goes(e.to_string());
    }
    p.print(&to_json(&done), SANDBOX_COLUMNS)?;
    failed.map_or(Ok(()), Err)
}

/// Whether `exec` (without `-t`) sends our stdin: `-n` never, `-i` even from a terminal,
/// else when it is a pipe or a file.
struct StdinUse {
    none: bool,
    even_a_terminal: bool,
}

fn exec_request(
    cwd: Option<String>,
    env: &[String],
    timeout_seconds: Option<u64>,
    stdin_use: StdinUse,
    command: Vec<String>,
) -> Result<ExecRequest, CliError> {
    let mut req = ExecRequest::new(command);
    req.env = pairs("env", env)?;
    req.cwd = cwd;
    req.timeout_seconds = timeout_seconds;
    let stdin = std::io::stdin();
    if !stdin_use.none && (stdin_use.even_a_terminal || !stdin.is_terminal()) {
        let mut input = Vec::new();
        // A closed or unreadable stdin is no input, not a failure.
        if stdin.lock().read_to_end(&mut input).is_ok() && !input.is_empty() {
            req = req.stdin_bytes(&input);
        }
    }
    Ok(req)
}

/// A remote exit code as ours (clamped to 0–255).
pub(super) fn exit_code(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code.clamp(0, 255)).unwrap_or(1))
}

async fn exec_streamed(c: &Client, id: &str, req: &ExecRequest) -> Result<ExitCode, CliError> {
    let mut stream = match c.exec_stream(id, req, StreamFormat::Frames).await {
        Ok(s) => s,
        // A pool that cannot stream still runs commands: the buffered route, same output.
        Err(e) if streaming_unsupported(&e) => return exec_buffered(c, id, req).await,
        Err(e) => return Err(e.into()),
    };
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    while let Some(ev) = stream.next().await {
        match ev? {
            ExecEvent::Stdout(b) => write_raw(&mut out, &b),
            ExecEvent::Stderr(b) => write_raw(&mut err, &b),
            ExecEvent::Exit(x) => return Ok(exit_code(x.exit_code)),
            ExecEvent::Error(e) => {
                return Err(CliError::Outcome(format!(
                    "the command's stream failed: {}: {}",
                    e.code, e.message
                )))
            }
        }
    }
    Err(CliError::Outcome(
        "the stream ended without the command's exit".into(),
    ))
}

/// The API's 501 for a pool without `exec.stream`.
fn streaming_unsupported(e: &differently_client::Error) -> bool {
    e.api().is_some_and(|a| {
        a.status == 501
            && a.code == "unsupported_operation"
            && a.details["capability"] == "exec.stream"
    })
}

async fn exec_buffered(c: &Client, id: &str, req: &ExecRequest) -> Result<ExitCode, CliError> {
    let r = c.exec(id, req).await?;
    write_raw(&mut std::io::stdout(), r.stdout.as_bytes());
    write_raw(&mut std::io::stderr(), r.stderr.as_bytes());
    for (cut, stream) in [
        (r.stdout_truncated, "stdout"),
        (r.stderr_truncated, "stderr"),
    ] {
        if cut {
            eprintln!("differently: {stream} was cut at 1 MiB (the command ran to its end)");
        }
    }
    Ok(exit_code(r.exit_code))
}
