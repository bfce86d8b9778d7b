//! Running commands on a Vercel sandbox's session, and the file writes built on them: the
//! part of the adapter that speaks Vercel's command API (NDJSON logs, one retry on a stopped
//! session), apart from the contract mapping in `mod.rs`.

use super::*;

impl VercelAdapter {
    /// Runs `argv` on the current session, feeding `out`; one retry on a stopped session
    /// (after starting it, as Vercel's SDK does) or when the API never took the command.
    pub(super) async fn run_argv(
        &self,
        name: &str,
        argv: &[String],
        env: &BTreeMap<String, String>,
        cwd: Option<&str>,
        deadline: Duration,
        out: &mpsc::Sender<ExecEvent>,
    ) -> Result<i32, AdapterError> {
        let mut retried = false;
        loop {
            let session = self.session(name).await?;
            let res = self
                .api
                .run(
                    &session,
                    argv,
                    env,
                    cwd,
                    deadline,
                    self.settings.stream_idle,
                    out,
                )
                .await;
            match res {
                Ok(code) => return Ok(code),
                Err(api::RunError::Started(e)) => return Err(e),
                Err(api::RunError::NotStarted(e)) if !retried && is_stopped(&e) => {
                    retried = true;
                    self.forget(name);
                    self.resume(name).await?;
                }
                Err(api::RunError::NotStarted(AdapterError::Unavailable(_))) if !retried => {
                    retried = true;
                    self.forget(name);
                }
                Err(api::RunError::NotStarted(AdapterError::NotFound)) => {
                    // The session is gone: is the sandbox?
                    self.forget(name);
                    return match self.api.get(name, false).await {
                        Err(AdapterError::NotFound) => Err(AdapterError::NotFound),
                        Ok(_) if !retried => {
                            retried = true;
                            continue;
                        }
                        Ok(_) => Err(AdapterError::transient("exec: the session went away")),
                        Err(e) => Err(e),
                    };
                }
                Err(api::RunError::NotStarted(e)) => {
                    if let (Some(dir), AdapterError::Permanent(_)) = (cwd, &e) {
                        if !self.is_dir(name, dir).await {
                            return Err(AdapterError::invalid_field(
                                "cwd",
                                format!("exec: working directory {dir} does not exist"),
                            ));
                        }
                    }
                    return Err(e);
                }
            }
        }
    }

    /// Whether `dir` is a directory, asked once without retries (so it can explain the
    /// failures of [`Self::run_argv`]).
    pub(super) async fn is_dir(&self, name: &str, dir: &str) -> bool {
        let Ok(session) = self.session(name).await else {
            return false;
        };
        let argv = ["test", "-d", dir].map(str::to_owned);
        let (tx, _rx) = mpsc::channel(1);
        let res = self
            .api
            .run(
                &session,
                &argv,
                &BTreeMap::new(),
                None,
                Duration::from_secs(30),
                self.settings.stream_idle,
                &tx,
            )
            .await;
        matches!(res, Ok(0))
    }

    /// Runs a helper command and keeps its whole output.
    pub(super) async fn capture(
        &self,
        name: &str,
        argv: &[String],
    ) -> Result<(i32, Vec<u8>, String), AdapterError> {
        let (tx, rx) = mpsc::channel(64);
        let run = async move {
            let tx = tx;
            self.run_argv(
                name,
                argv,
                &BTreeMap::new(),
                None,
                Duration::from_secs(60),
                &tx,
            )
            .await
        };
        let (code, (out, err)) = tokio::join!(run, crate::exec_output::whole(rx));
        Ok((code?, out, String::from_utf8_lossy(&err).into_owned()))
    }

    pub(super) async fn run(
        &self,
        at: &InstanceRef,
        req: &ExecRequest,
        out: &mpsc::Sender<ExecEvent>,
    ) -> Result<i32, AdapterError> {
        let stdin = checked_stdin(req)?;
        let mut argv = req.command.clone();
        if let Some(input) = stdin {
            // Vercel's command API takes no stdin: the command reads a file, removed as soon
            // as the shell has opened it.
            let path = format!("/tmp/.differently-stdin-{}", unique());
            self.write_file(&at.backend_ref, &path, 0o600, &input)
                .await?;
            let mut wrapped = vec![
                "sh".to_owned(),
                "-c".to_owned(),
                "f=$1; shift; exec 0<\"$f\"; rm -f -- \"$f\"; exec \"$@\"".to_owned(),
                "sh".to_owned(),
                path,
            ];
            wrapped.extend(argv);
            argv = wrapped;
        }
        self.run_argv(
            &at.backend_ref,
            &argv,
            &req.env,
            req.cwd.as_deref(),
            req.timeout(),
            out,
        )
        .await
    }

    pub(super) async fn write_file(
        &self,
        name: &str,
        path: &str,
        mode: u32,
        data: &[u8],
    ) -> Result<(), AdapterError> {
        let rel = path.trim_start_matches('/');
        let archive = tar::tar_one(rel, mode, data)
            .map_err(|why| AdapterError::invalid_field("path", format!("upload: {why}")))?;
        let tgz = tar::gzip_stored(&archive);
        let session = self.session(name).await?;
        match self.api.write(&session, tgz.clone()).await {
            Err(e) if is_stopped(&e) => {
                self.forget(name);
                self.resume(name).await?;
                let session = self.session(name).await?;
                self.api.write(&session, tgz).await
            }
            other => other,
        }
    }
}
