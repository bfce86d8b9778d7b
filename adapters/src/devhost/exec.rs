//! Running commands in a devhost sandbox: the environment and working directory a command
//! gets, finding its program, bubblewrap's arguments, process groups (recorded for pause and
//! delete, killed on drop), and the streamed run with its timeout.

use super::*;

impl DevhostAdapter {
    /// A command's environment: `PATH` from the host, `HOME`, `LANG`, then the sandbox's env
    /// from create, then the request's.
    pub(super) fn command_env(
        &self,
        sandbox_dir: &Path,
        tag: &DevhostTag,
        req_env: &BTreeMap<String, String>,
    ) -> BTreeMap<String, String> {
        let mut env = BTreeMap::new();
        env.insert(
            "PATH".to_owned(),
            std::env::var("PATH").unwrap_or_else(|_| FALLBACK_PATH.to_owned()),
        );
        let home = match self.runner {
            Runner::Plain => sandbox_dir.to_string_lossy().into_owned(),
            Runner::Bwrap(_) | Runner::MissingBwrap => "/".to_owned(),
        };
        env.insert("HOME".to_owned(), home);
        env.insert("LANG".to_owned(), "C.UTF-8".to_owned());
        env.extend(tag.env.clone());
        env.extend(req_env.clone());
        env
    }

    /// `program args`, behind `env --default-signal --` when this host has one: the program
    /// starts with default signal dispositions (see `default_signals`). A program named like
    /// `NAME=VALUE` would be read by env(1) as a variable, so it runs unwrapped.
    pub(super) fn with_default_signals(&self, program: &str, args: &[String]) -> Vec<String> {
        let mut argv: Vec<String> = Vec::with_capacity(args.len() + 4);
        if let Some(env) = self
            .default_signals
            .as_ref()
            .filter(|_| !program.contains('='))
        {
            argv.extend([
                env.to_string_lossy().into_owned(),
                "--default-signal".to_owned(),
                "--".to_owned(),
            ]);
        }
        argv.push(program.to_owned());
        argv.extend(args.iter().cloned());
        argv
    }

    /// `program args` in `cwd` (with default signals), under bubblewrap when this adapter
    /// isolates.
    pub(super) fn command(
        &self,
        sandbox_dir: &Path,
        cwd: &Path,
        program: &str,
        args: &[String],
    ) -> tokio::process::Command {
        let argv = self.with_default_signals(program, args);
        let (program, args) = (&argv[0], &argv[1..]);
        match &self.runner {
            Runner::Plain | Runner::MissingBwrap => {
                let mut c = tokio::process::Command::new(program);
                c.args(args).current_dir(cwd);
                c
            }
            Runner::Bwrap(bwrap) => {
                let inner_cwd = format!(
                    "/{}",
                    cwd.strip_prefix(sandbox_dir)
                        .unwrap_or(Path::new(""))
                        .display()
                );
                let mut c = tokio::process::Command::new(bwrap);
                c.args(bwrap_args(sandbox_dir, &inner_cwd))
                    .arg("--")
                    .arg(program)
                    .args(args)
                    .current_dir(sandbox_dir);
                c
            }
        }
    }

    /// Checks an exec's preconditions: the instance exists, is not paused, and `cwd` is a
    /// directory in it. Returns the sandbox directory, its tag and the resolved cwd.
    pub(super) async fn ready_to_run(
        &self,
        at: &InstanceRef,
        cwd: Option<&str>,
    ) -> Result<(PathBuf, DevhostTag, PathBuf), AdapterError> {
        if self.runner == Runner::MissingBwrap {
            return Err(AdapterError::Unsupported(NO_BWRAP.to_owned()));
        }
        let (sandbox_dir, tag) = self.existing(at).await?;
        if self.is_paused(&at.sandbox_id) {
            return Err(AdapterError::permanent("the sandbox is paused"));
        }
        if let Runner::Bwrap(_) = self.runner {
            ensure_tmp(&sandbox_dir).await?;
        }
        let dir = resolve_cwd(&sandbox_dir, cwd)?;
        if !tokio::fs::metadata(&dir).await.is_ok_and(|m| m.is_dir()) {
            return Err(AdapterError::invalid_field(
                "cwd",
                format!("cwd {} does not exist in the sandbox", cwd.unwrap_or("/")),
            ));
        }
        Ok((sandbox_dir, tag, dir))
    }

    /// Under bubblewrap, whether `program` is there to run as the command will look it up
    /// (`PATH` from `env`, relative to `cwd`): `(127, "command not found")` or `(126,
    /// "permission denied")` when not, as a shell reports it. Without this, bubblewrap's own
    /// `execvp` failure (exit 1, its name in the message) would be the answer. Plain
    /// processes learn the same from the spawn.
    pub(super) fn find_program(
        &self,
        sandbox_dir: &Path,
        cwd: &Path,
        program: &str,
        env: &BTreeMap<String, String>,
    ) -> Result<(), (i32, &'static str)> {
        if !matches!(self.runner, Runner::Bwrap(_)) {
            return Ok(());
        }
        let candidates: Vec<String> = if program.contains('/') {
            let inner_cwd = cwd.strip_prefix(sandbox_dir).unwrap_or(Path::new(""));
            let full = Path::new("/").join(inner_cwd).join(program);
            vec![full.to_string_lossy().into_owned()]
        } else {
            env.get("PATH")
                .map(String::as_str)
                .unwrap_or(FALLBACK_PATH)
                .split(':')
                .filter(|d| d.starts_with('/'))
                .map(|d| format!("{}/{program}", d.trim_end_matches('/')))
                .collect()
        };
        let mut found_unrunnable = false;
        for c in &candidates {
            if local_fs::components(c).is_err() {
                // `..` in the name: not one this check can follow; bubblewrap decides.
                return Ok(());
            }
            let meta = match self.side(c) {
                Side::HostReadOnly => std::fs::metadata(c).ok(),
                Side::Sandbox => local_fs::metadata_in(sandbox_dir, c),
                Side::Own => return Ok(()),
            };
            match meta {
                Some(m) if m.is_file() => {
                    use std::os::unix::fs::PermissionsExt;
                    if m.permissions().mode() & 0o111 != 0 {
                        return Ok(());
                    }
                    found_unrunnable = true;
                }
                Some(m) if m.is_dir() => found_unrunnable = true,
                _ => {}
            }
        }
        Err(if found_unrunnable {
            (126, "permission denied")
        } else {
            (127, "command not found")
        })
    }

    /// Records process group `pgid` as one of the sandbox's (for pause and delete).
    pub(super) async fn record_group(&self, sandbox_id: &SandboxId, pgid: u32) {
        let dir = self.run_dir(sandbox_id);
        if tokio::fs::create_dir_all(&dir).await.is_ok() {
            let _ = tokio::fs::write(dir.join(pgid.to_string()), b"").await;
        }
    }

    /// Spawns `program args` (env cleared to `env`) in a process group of its own, recorded for
    /// pause and delete and killed if the returned guard drops armed, with stdout and stderr
    /// piped. `Ok(Err((code, why)))`: the program is not there to run, as a shell reports it
    /// (127 not found, 126 not runnable).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn spawn_group(
        &self,
        at: &InstanceRef,
        sandbox_dir: &Path,
        cwd: &Path,
        program: &str,
        args: &[String],
        env: &BTreeMap<String, String>,
        stdin: Stdio,
    ) -> Result<Result<(tokio::process::Child, GroupGuard), (i32, &'static str)>, AdapterError>
    {
        if let Err(refused) = self.find_program(sandbox_dir, cwd, program, env) {
            return Ok(Err(refused));
        }
        let mut cmd = self.command(sandbox_dir, cwd, program, args);
        cmd.env_clear()
            .envs(env)
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                return match e.kind() {
                    io::ErrorKind::NotFound => Ok(Err((127, "command not found"))),
                    io::ErrorKind::PermissionDenied => Ok(Err((126, "permission denied"))),
                    _ => Err(spawn_error(program, args, env, e)),
                }
            }
        };
        // Kills the group if the caller's future is dropped (it went away) before the end.
        let guard = GroupGuard {
            pgid: child.id(),
            armed: true,
        };
        if let Some(pgid) = child.id() {
            self.record_group(&at.sandbox_id, pgid).await;
        }
        Ok(Ok((child, guard)))
    }

    /// Runs one command, sending its output to `out`; see the module docs.
    pub(super) async fn run(
        &self,
        at: &InstanceRef,
        req: &ExecRequest,
        out: mpsc::Sender<ExecEvent>,
    ) -> Result<ExecExit, AdapterError> {
        let started = Instant::now();
        let (sandbox_dir, tag, cwd) = self.ready_to_run(at, req.cwd.as_deref()).await?;
        let Some((program, args)) = req.command.split_first() else {
            return Err(AdapterError::permanent("command is empty"));
        };
        let stdin = stdin_bytes(req)?;

        let env = self.command_env(&sandbox_dir, &tag, &req.env);
        let stdio = if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        };
        let (mut child, mut guard) = match self
            .spawn_group(at, &sandbox_dir, &cwd, program, args, &env, stdio)
            .await?
        {
            Ok(spawned) => spawned,
            Err((code, why)) => {
                let msg = format!("devhost: {program}: {why}\n");
                let _ = out.send(ExecEvent::Stderr(Bytes::from(msg))).await;
                return Ok(ExecExit {
                    exit_code: code,
                    duration_ms: millis(started.elapsed()),
                });
            }
        };

        if let (Some(mut pipe), Some(input)) = (child.stdin.take(), stdin) {
            tokio::spawn(async move {
                // A child that exits without reading its stdin is not an error.
                let _ = pipe.write_all(&input).await;
                let _ = pipe.shutdown().await;
            });
        }
        let mut readers = Vec::new();
        if let Some(pipe) = child.stdout.take() {
            readers.push(tokio::spawn(pump(pipe, out.clone(), ExecEvent::Stdout)));
        }
        if let Some(pipe) = child.stderr.take() {
            readers.push(tokio::spawn(pump(pipe, out.clone(), ExecEvent::Stderr)));
        }

        let finish = async {
            let status = child.wait().await;
            // Pop only finished readers, so a later path never polls a completed handle.
            while let Some(r) = readers.last_mut() {
                let _ = r.await;
                readers.pop();
            }
            status
        };
        enum End {
            Exited(io::Result<ExitStatus>),
            TimedOut,
            Cancelled,
        }
        let end = tokio::select! {
            status = finish => End::Exited(status),
            _ = tokio::time::sleep(req.timeout()) => End::TimedOut,
            _ = out.closed() => End::Cancelled,
        };
        let timed_out = matches!(end, End::TimedOut);
        let exit_code = match end {
            End::Exited(status) => exit_code(status.map_err(|e| io_err("wait", e))?),
            End::TimedOut | End::Cancelled => {
                match child.id() {
                    Some(pgid) => {
                        signal_group(pgid, "-KILL").await;
                    }
                    None => {
                        let _ = child.start_kill();
                    }
                }
                let _ = tokio::time::timeout(DRAIN_GRACE, child.wait()).await;
                let _ = tokio::time::timeout(DRAIN_GRACE, async {
                    while let Some(r) = readers.last_mut() {
                        let _ = r.await;
                        readers.pop();
                    }
                })
                .await;
                for r in &readers {
                    r.abort();
                }
                if timed_out {
                    TIMEOUT_EXIT_CODE
                } else {
                    tracing::info!(sandbox = %at.sandbox_id, "devhost: exec cancelled by the caller");
                    128 + 9
                }
            }
        };
        guard.armed = false;
        Ok(ExecExit {
            exit_code,
            duration_ms: millis(started.elapsed()),
        })
    }
}

/// Arguments for `bwrap`: the sandbox directory as `/` (its `/tmp` too, so the files API
/// and every command see one filesystem), the host's system directories read-only, fresh
/// `/proc` and `/dev`, and every namespace unshared.
pub(super) fn bwrap_args(sandbox_dir: &Path, cwd: &str) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "--bind".into(),
        sandbox_dir.to_string_lossy().into_owned(),
        "/".into(),
    ];
    for dir in READ_ONLY_MOUNTS {
        a.extend(["--ro-bind-try".into(), dir.into(), dir.into()]);
    }
    a.extend(
        [
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--unshare-all",
            "--die-with-parent",
            "--chdir",
        ]
        .map(String::from),
    );
    a.push(cwd.to_owned());
    a
}

/// Makes the sandbox's `/tmp` (sticky, writable by all, as a `/tmp` is) if it is missing.
pub(super) async fn ensure_tmp(sandbox_dir: &Path) -> Result<(), AdapterError> {
    use std::os::unix::fs::PermissionsExt;
    let tmp = sandbox_dir.join("tmp");
    match tokio::fs::symlink_metadata(&tmp).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            match tokio::fs::create_dir(&tmp).await {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(()),
                Err(e) => return Err(io_err("create /tmp", e)),
            }
            tokio::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777))
                .await
                .map_err(|e| io_err("create /tmp", e))
        }
        Err(e) => Err(io_err("create /tmp", e)),
    }
}

/// Kills a process group when dropped while armed.
pub(super) struct GroupGuard {
    pub(super) pgid: Option<u32>,
    pub(super) armed: bool,
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let (true, Some(pgid)) = (self.armed, self.pgid) {
            // kill(2) on the group through rustix: synchronous, as drop must be.
            local_pty::signal_group(pgid, PtySignal::Kill);
        }
    }
}

/// Decoded stdin of a request.
pub(super) fn stdin_bytes(req: &ExecRequest) -> Result<Option<Vec<u8>>, AdapterError> {
    match (&req.stdin, &req.stdin_base64) {
        (Some(s), _) => Ok(Some(s.as_bytes().to_vec())),
        (None, Some(b)) => base64::engine::general_purpose::STANDARD
            .decode(b)
            .map(Some)
            .map_err(|e| {
                AdapterError::Permanent(Reason::caused_by(format!("stdinBase64: {e}"), e))
            }),
        (None, None) => Ok(None),
    }
}

/// Reads `pipe` to the end, sending each chunk; a closed channel stops reading (the caller
/// kills the group).
pub(super) async fn pump(
    mut pipe: impl AsyncRead + Unpin,
    out: mpsc::Sender<ExecEvent>,
    wrap: fn(Bytes) -> ExecEvent,
) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if out
            .send(wrap(Bytes::copy_from_slice(&buf[..n])))
            .await
            .is_err()
        {
            return;
        }
    }
}

/// The directory an exec runs in: `cwd` taken relative to the sandbox directory.
pub(super) fn resolve_cwd(sandbox_dir: &Path, cwd: Option<&str>) -> Result<PathBuf, AdapterError> {
    let mut dir = sandbox_dir.to_path_buf();
    for c in Path::new(cwd.unwrap_or("/")).components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(part) => dir.push(part),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(AdapterError::permanent(
                    "cwd may not contain `..`".to_owned(),
                ))
            }
        }
    }
    Ok(dir)
}

/// Exit code as a shell reports it.
pub(super) fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        (None, None) => 1,
    }
}

/// Sends `signal` (e.g. `-STOP`) to process group `pgid`; false if there is no such group.
pub(super) async fn signal_group(pgid: u32, signal: &str) -> bool {
    let res = tokio::process::Command::new("kill")
        .args([signal, "--", &format!("-{pgid}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await;
    match res {
        Ok(s) => s.success(),
        Err(e) => {
            tracing::warn!(pgid, error = %e, "devhost: could not run kill(1)");
            false
        }
    }
}

/// Runs `tar` with `args`; a failure is an error carrying its stderr.
pub(super) async fn tar(args: &[&std::ffi::OsStr]) -> Result<(), AdapterError> {
    let out = tokio::process::Command::new("tar")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| io_err("run tar", e))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(AdapterError::transient(format!(
            "devhost: tar failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Longest single argument or `NAME=value` string Linux passes to a program (`MAX_ARG_STRLEN`,
/// 32 pages).
const MAX_ARG_STRLEN: usize = 32 * 4096;

/// A failed spawn of `program args` with `env`, as what it means to the caller. The kernel
/// refuses arguments and environment too large for one process (`E2BIG`): that is the
/// request's, not the host's, so it is invalid and names the field to shorten (an argument or
/// a variable over [`MAX_ARG_STRLEN`], else the command as a whole), never a retryable
/// failure that clients would take for the backend being down.
pub(super) fn spawn_error(
    program: &str,
    args: &[String],
    env: &BTreeMap<String, String>,
    e: io::Error,
) -> AdapterError {
    if e.kind() != io::ErrorKind::ArgumentListTooLong {
        return io_err(&format!("spawn {program}"), e);
    }
    let limit = MAX_ARG_STRLEN;
    if let Some(name) = env
        .iter()
        .find_map(|(k, v)| (k.len() + v.len() + 1 >= limit).then_some(k))
    {
        return AdapterError::invalid_field(
            "env",
            format!("env {name}: too long for a process (Linux takes at most {limit} bytes per variable)"),
        );
    }
    if args.iter().any(|a| a.len() >= limit) || program.len() >= limit {
        return AdapterError::invalid_field(
            "command",
            format!("command: an argument is too long for a process (Linux takes at most {limit} bytes per argument)"),
        );
    }
    AdapterError::invalid_field(
        "command",
        "command: the arguments and environment together are too long for a process (Linux's limit is about a quarter of the stack limit, 2 MiB by default)",
    )
}
