//! `differently process …`: commands that outlive the connection (docs/processes.md). `start`
//! prints the pid and returns at once; the process runs on in the sandbox, and any later
//! command (from any machine with the key) lists it, attaches to its output from a byte
//! offset, feeds its stdin, signals or kills it. `attach` exits with the process's code, so a
//! script can `start`, do other work, then `attach` to wait for it.

use std::process::ExitCode;

use clap::Subcommand;
use differently_client::exec::{ExecEvent, StreamFormat};
use differently_client::processes::{OutputOptions, ProcessSignal};
use differently_client::{Client, StartProcess, TerminalSize};

use super::output::{print_line, write_raw, Column, Output};
use super::sandbox::exit_code;
use super::{fail, finish, pairs, to_json, CliError, Target};

/// Table columns of a process.
const PROCESS_COLUMNS: &[Column] = &[
    ("PID", "pid"),
    ("STATUS", "status"),
    ("EXIT", "exitCode"),
    ("TAG", "tag"),
    ("COMMAND", "command"),
    ("STARTED", "startedAt"),
];

/// The terminal size a `--pty` process gets when ours is unknown (stdout not a terminal).
const DEFAULT_PTY: (u16, u16) = (80, 24);

/// Process commands.
#[derive(Subcommand, Debug)]
pub enum ProcessCommand {
    /// Start a command in the background and print its pid (`-o json`: the whole process).
    Start {
        /// The sandbox.
        sandbox: String,
        /// Keep its stdin open, for `differently process stdin` (the pool needs `exec.stdin`,
        /// or `--pty`).
        #[arg(long)]
        stdin: bool,
        /// Run it on a terminal (our terminal's size, else 80x24): stdout and stderr are one
        /// stream.
        #[arg(long)]
        pty: bool,
        /// A label to find it again by (shown in `process ls`).
        #[arg(long)]
        tag: Option<String>,
        /// Kill it after this many seconds (exit 124).
        #[arg(long)]
        timeout: Option<u64>,
        /// Working directory (absolute).
        #[arg(long)]
        cwd: Option<String>,
        /// `KEY=VALUE`, repeatable (never shown back).
        #[arg(long = "env")]
        env: Vec<String>,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// List a sandbox's processes, running and recently ended, newest first.
    #[command(alias = "list")]
    Ls {
        sandbox: String,
        /// Only those with this status: running, exited, failed.
        #[arg(long)]
        status: Option<String>,
    },
    /// Read one process (status, exit code, output counters).
    Get { sandbox: String, pid: u32 },
    /// Print its output (stdout to stdout, stderr to stderr) until it ends, then exit with its
    /// exit code. ^C detaches; the process goes on.
    Attach {
        sandbox: String,
        pid: u32,
        /// The byte offset to start at (0: the oldest output kept).
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Print the output kept now and return (exit 0 while it still runs).
        #[arg(long)]
        no_follow: bool,
    },
    /// Copy our stdin to its stdin as it comes, then close its stdin at our end of input.
    Stdin {
        sandbox: String,
        pid: u32,
        /// Leave its stdin open at our end of input (more can be sent later).
        #[arg(long)]
        keep_open: bool,
    },
    /// Send a signal: INT, TERM, KILL or HUP (with or without SIG).
    Signal {
        sandbox: String,
        pid: u32,
        signal: String,
    },
    /// Resize a terminal process.
    Resize {
        sandbox: String,
        pid: u32,
        cols: u16,
        rows: u16,
    },
    /// Kill it (KILL); one that has ended already is fine.
    Kill { sandbox: String, pid: u32 },
}

/// Runs a process command.
pub async fn run(target: &Target, command: ProcessCommand) -> ExitCode {
    let client = match target.client() {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    match command {
        ProcessCommand::Attach {
            sandbox,
            pid,
            from,
            no_follow,
        } => match attach(&client, &sandbox, pid, from, !no_follow).await {
            Ok(code) => code,
            Err(e) => fail(&e),
        },
        other => finish(answer(&client, target, other).await),
    }
}

async fn answer(c: &Client, target: &Target, command: ProcessCommand) -> Result<(), CliError> {
    let p = target.printer();
    // The pid is what a script wants from `start` (`PID=$(differently process start …)`), on
    // a terminal too; `-o json`/`-o table` print the whole process.
    let pid_only = matches!(target.output, None | Some(Output::Id));
    match command {
        ProcessCommand::Start {
            sandbox,
            stdin,
            pty,
            tag,
            timeout,
            cwd,
            env,
            command,
        } => {
            let size = pty.then(|| {
                let (cols, rows) = super::terminal::size().unwrap_or(DEFAULT_PTY);
                TerminalSize { cols, rows }
            });
            let req = StartProcess {
                command,
                env: pairs("env", &env)?,
                cwd,
                timeout_seconds: timeout,
                pty: size,
                stdin: stdin.then_some(true),
                tag,
            };
            let proc = c.processes().start(&sandbox, &req).await?;
            if pid_only {
                print_line(&proc.pid.to_string());
                Ok(())
            } else {
                p.print(&to_json(&proc), PROCESS_COLUMNS)
            }
        }
        ProcessCommand::Ls { sandbox, status } => {
            let items = c.processes().list(&sandbox, status.as_deref()).await?;
            if target.output == Some(Output::Id) {
                items.iter().for_each(|i| print_line(&i.pid.to_string()));
                return Ok(());
            }
            p.print_list(items.iter().map(to_json).collect(), PROCESS_COLUMNS)
        }
        ProcessCommand::Get { sandbox, pid } => {
            let proc = c.processes().get(&sandbox, pid).await?;
            if target.output == Some(Output::Id) {
                print_line(&proc.pid.to_string());
                return Ok(());
            }
            p.print(&to_json(&proc), PROCESS_COLUMNS)
        }
        ProcessCommand::Stdin {
            sandbox,
            pid,
            keep_open,
        } => copy_stdin(c, &sandbox, pid, keep_open).await,
        ProcessCommand::Signal {
            sandbox,
            pid,
            signal,
        } => {
            let sig = ProcessSignal::parse(&signal).ok_or_else(|| {
                CliError::Usage(format!(
                    "signal {signal:?}: expected INT, TERM, KILL or HUP"
                ))
            })?;
            Ok(c.processes().signal(&sandbox, pid, sig).await?)
        }
        ProcessCommand::Resize {
            sandbox,
            pid,
            cols,
            rows,
        } => Ok(c.processes().resize(&sandbox, pid, cols, rows).await?),
        ProcessCommand::Kill { sandbox, pid } => Ok(c.processes().kill(&sandbox, pid).await?),
        ProcessCommand::Attach { .. } => Err(CliError::Usage("run on its own".into())),
    }
}

/// Streams the output from `from` to our stdout and stderr; its exit code once it ends.
async fn attach(
    c: &Client,
    sandbox: &str,
    pid: u32,
    from: u64,
    follow: bool,
) -> Result<ExitCode, CliError> {
    let opts = OutputOptions {
        from,
        follow,
        format: StreamFormat::Frames,
    };
    let mut stream = c.processes().output(sandbox, pid, opts).await?;
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    while let Some(ev) = stream.next().await {
        match ev? {
            ExecEvent::Stdout(b) => write_raw(&mut out, &b),
            ExecEvent::Stderr(b) => write_raw(&mut err, &b),
            ExecEvent::Exit(x) => return Ok(exit_code(x.exit_code)),
            ExecEvent::Error(e) => {
                return Err(CliError::Outcome(format!(
                    "process {pid} failed: {}: {}",
                    e.code, e.message
                )))
            }
        }
    }
    if follow {
        return Err(CliError::Outcome(format!(
            "the output of process {pid} ended without its exit; attach again with --from {}",
            stream.offset()
        )));
    }
    Ok(ExitCode::SUCCESS)
}

/// Sends our stdin chunk by chunk as it arrives (so typed lines go at once), then closes the
/// process's stdin at our end of input unless `keep_open`.
async fn copy_stdin(c: &Client, sandbox: &str, pid: u32, keep_open: bool) -> Result<(), CliError> {
    let mut input = super::shell::stdin_reader();
    while let Some(chunk) = input.recv().await {
        c.processes().send_stdin(sandbox, pid, chunk).await?;
    }
    if !keep_open {
        c.processes().close_stdin(sandbox, pid).await?;
    }
    Ok(())
}
