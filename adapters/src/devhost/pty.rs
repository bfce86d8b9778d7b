//! A devhost command on a terminal of its own ([`crate::local_pty`]).

use super::*;

impl DevhostAdapter {
    /// Runs `req.command` on a terminal of its own (`local_pty`); see [`Adapter::pty`].
    pub(super) async fn run_pty(
        &self,
        at: &InstanceRef,
        req: &PtyRequest,
        mut input: mpsc::Receiver<PtyInput>,
        out: mpsc::Sender<Bytes>,
    ) -> Result<ExecExit, AdapterError> {
        let started = Instant::now();
        let Some(setsid) = &self.setsid else {
            return Err(AdapterError::Unsupported(
                "exec.pty (setsid(1) is not installed)".to_owned(),
            ));
        };
        let (sandbox_dir, tag, cwd) = self.ready_to_run(at, req.cwd.as_deref()).await?;
        if req.command.is_empty() {
            return Err(AdapterError::permanent("command is empty"));
        }
        let mut env = self.command_env(&sandbox_dir, &tag, &BTreeMap::new());
        env.insert("TERM".to_owned(), "xterm-256color".to_owned());
        env.extend(req.env.clone());
        let local_pty::Opened {
            mut master,
            output,
            slave,
        } = local_pty::open(req.size).map_err(|e| io_err("open a terminal", e))?;
        // `setsid -c`: a session of its own with the terminal as its controlling terminal.
        // Under bubblewrap it runs inside (bwrap is its own group leader, so the program inside
        // is not and `setsid` needs no fork); otherwise the child is not a group leader either
        // (no `process_group(0)`), so its pid leads the new session and group.
        let mut argv = vec!["-c".to_owned()];
        argv.extend(req.command.iter().cloned());
        if let Err((code, why)) = self.find_program(&sandbox_dir, &cwd, &req.command[0], &env) {
            let msg = format!("devhost: {}: {why}\r\n", req.command[0]);
            let _ = out.send(Bytes::from(msg)).await;
            return Ok(ExecExit {
                exit_code: code,
                duration_ms: millis(started.elapsed()),
            });
        }
        let mut cmd = match &self.runner {
            Runner::Plain | Runner::MissingBwrap => {
                // setsid is the program here, so the signal reset goes inside it (setsid
                // does not reset them).
                let mut c = tokio::process::Command::new(setsid);
                c.arg("-c")
                    .args(self.with_default_signals(&req.command[0], &req.command[1..]))
                    .current_dir(&cwd);
                c
            }
            Runner::Bwrap(_) => {
                let mut c = self.command(&sandbox_dir, &cwd, "setsid", &argv);
                c.process_group(0);
                c
            }
        };
        let stdio = |fd: &std::os::fd::OwnedFd| -> Result<Stdio, AdapterError> {
            Ok(Stdio::from(
                fd.try_clone().map_err(|e| io_err("open a terminal", e))?,
            ))
        };
        cmd.env_clear()
            .envs(&env)
            .stdin(stdio(&slave)?)
            .stdout(stdio(&slave)?)
            .stderr(stdio(&slave)?)
            .kill_on_drop(true);
        let spawned = cmd.spawn();
        // Only the program holds the slave now: its exit closes the terminal (EIO on read).
        drop(cmd);
        drop(slave);
        let mut child = spawned
            .map_err(|e| super::exec::spawn_error(&req.command[0], &req.command[1..], &env, e))?;
        let Some(pgid) = child.id() else {
            return Err(AdapterError::transient(
                "devhost: the terminal's program vanished",
            ));
        };
        let mut guard = GroupGuard {
            pgid: Some(pgid),
            armed: true,
        };
        self.record_group(&at.sandbox_id, pgid).await;

        let mut reader = tokio::spawn(output.pump(out));
        let mut reader_done = None;
        let status = loop {
            tokio::select! {
                status = child.wait() => break Some(status),
                hung_up = &mut reader, if reader_done.is_none() => {
                    let hung_up = hung_up.unwrap_or(false);
                    reader_done = Some(hung_up);
                    if hung_up {
                        break None;
                    }
                }
                msg = input.recv() => match msg {
                    Some(PtyInput::Stdin(b)) => {
                        if let Err(e) = master.write_all(&b).await {
                            tracing::debug!(error = %e, "devhost: pty write failed");
                        }
                    }
                    Some(PtyInput::Resize(size)) => {
                        if let Err(e) = master.resize(size) {
                            tracing::debug!(error = %e, "devhost: pty resize failed");
                        }
                    }
                    Some(PtyInput::Signal(sig)) => {
                        master.signal(sig, pgid);
                    }
                    None => break None,
                },
            }
        };
        let exit_code = match status {
            Some(status) => exit_code(status.map_err(|e| io_err("wait", e))?),
            None => {
                // Hung up: SIGHUP as a closed terminal would, then SIGKILL to what is left.
                tracing::info!(sandbox = %at.sandbox_id, "devhost: terminal hung up");
                local_pty::signal_group(pgid, PtySignal::Hup);
                let status = match tokio::time::timeout(DRAIN_GRACE, child.wait()).await {
                    Ok(s) => s.ok(),
                    Err(_) => {
                        local_pty::signal_group(pgid, PtySignal::Kill);
                        tokio::time::timeout(DRAIN_GRACE, child.wait())
                            .await
                            .ok()
                            .and_then(Result::ok)
                    }
                };
                status.map_or(128 + PtySignal::Kill.number(), exit_code)
            }
        };
        if reader_done.is_none() {
            // Output written just before the exit is still in the terminal: read it, but do
            // not wait on a process that left the group and keeps the terminal open.
            if tokio::time::timeout(DRAIN_GRACE, &mut reader)
                .await
                .is_err()
            {
                reader.abort();
            }
        }
        guard.armed = false;
        // Whatever the program left running in its group goes with it.
        local_pty::signal_group(pgid, PtySignal::Kill);
        Ok(ExecExit {
            exit_code,
            duration_ms: millis(started.elapsed()),
        })
    }
}
