//! Commands on execd: the command body, stdin through a file, the retries that cannot run a
//! command twice, and the sinks that collect or forward its output.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use differently_core::exec::ExecRequest;

use super::config::Runtime;
use super::execd::{self, CommandBody, Sink, Target};
use super::{files, lifecycle, OpenSandboxAdapter};
use crate::error::Reason;
use crate::exec_output::CollectedOutput;
use crate::go_ahead::GoAhead;
use crate::kit::paths::unique;
use crate::{AdapterError, ByteStream, ExecEvent, InstanceRef};

impl OpenSandboxAdapter {
    /// A restored microVM keeps the time its checkpoint was written; step it to now.
    pub(super) async fn set_clock(&self, backend_ref: &str) {
        let now = chrono::Utc::now().timestamp();
        let argv = [
            "date".to_owned(),
            "-u".to_owned(),
            "-s".to_owned(),
            format!("@{now}"),
        ];
        let body = CommandBody {
            command: execd::shell_join(&argv),
            cwd: None,
            timeout: Some(10_000),
            envs: BTreeMap::new(),
        };
        let target = match self.target(backend_ref).await {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "setting the guest clock failed");
                return;
            }
        };
        let mut sink = Collect::default();
        let mut accepted = false;
        let res = execd::run(
            &self.client,
            &target,
            &body,
            self.run_options(Some(Duration::from_secs(10))),
            &mut sink,
            &mut accepted,
            None,
        )
        .await;
        match res {
            Ok(0) => {}
            Ok(code) => tracing::warn!(code, "setting the guest clock failed"),
            Err(e) => tracing::warn!(error = %e, "setting the guest clock failed"),
        }
    }

    pub(super) fn run_options(&self, deadline: Option<Duration>) -> execd::RunOptions {
        execd::RunOptions {
            line_endings: self.settings.line_endings,
            stream_idle: self.settings.stream_idle,
            deadline,
        }
    }

    /// Runs `req` through execd, feeding `sink`; returns the exit code.
    /// Runs `req` on the sandbox's execd. With `go`, the command goes only once it is given
    /// (the connection and request head before it; a command with stdin waits for it first,
    /// since its input is written into the sandbox ahead of the command).
    pub(super) async fn run(
        &self,
        at: &InstanceRef,
        req: &ExecRequest,
        sink: &mut (impl Sink + Send),
        mut go: Option<&GoAhead>,
    ) -> Result<i32, AdapterError> {
        if req.command.is_empty() || req.command[0].is_empty() {
            return Err(AdapterError::permanent("command is empty"));
        }
        if req.command.iter().any(|a| a.contains('\0')) {
            return Err(AdapterError::permanent(
                "arguments may not contain NUL".to_owned(),
            ));
        }
        let stdin: Option<Vec<u8>> = match (&req.stdin, &req.stdin_base64) {
            (Some(_), Some(_)) => {
                return Err(AdapterError::permanent(
                    "give stdin or stdinBase64, not both".to_owned(),
                ))
            }
            (Some(s), None) => Some(s.clone().into_bytes()),
            (None, Some(b)) => {
                use base64::Engine as _;
                Some(
                    base64::engine::general_purpose::STANDARD
                        .decode(b)
                        .map_err(|e| {
                            AdapterError::Permanent(Reason::caused_by(
                                format!("stdinBase64: {e}"),
                                e,
                            ))
                        })?,
                )
            }
            (None, None) => None,
        };
        let mut target = self.target(&at.backend_ref).await?;
        let mut command = execd::shell_join(&req.command);
        if let Some(input) = stdin {
            if let Some(go) = go.take() {
                go.wait().await?;
            }
            // execd's command API takes no stdin: the command reads a file, which is unlinked
            // as soon as the shell has opened it.
            let path = format!("/tmp/.differently-stdin-{}", unique());
            let input = Bytes::from(input);
            let body = |b: Bytes| -> ByteStream {
                Box::pin(futures::stream::once(
                    async move { Ok::<_, AdapterError>(b) },
                ))
            };
            let mut res = files::upload(
                &self.client,
                &target,
                &path,
                Some(0o600),
                body(input.clone()),
            )
            .await;
            if matches!(&res, Err(e) if execd::token_refused(e)) {
                // A rotated access token (1.3): resolve it anew, once.
                self.forget(&at.backend_ref);
                target = self.target(&at.backend_ref).await?;
                res = files::upload(&self.client, &target, &path, Some(0o600), body(input)).await;
            }
            if let Err(e) = res {
                self.forget(&at.backend_ref);
                return Err(e);
            }
            let q = execd::shell_quote(&path);
            command = format!("{{ rm -f -- {q}; {command}\n}} < {q}");
        }
        let timeout = req.timeout();
        let body = CommandBody {
            command,
            cwd: req.cwd.clone(),
            timeout: Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)),
            envs: req.env.clone(),
        };
        let mut reresolved = false;
        let mut resumed = false;
        loop {
            let mut accepted = false;
            let res = execd::run(
                &self.client,
                &target,
                &body,
                self.run_options(Some(timeout)),
                sink,
                &mut accepted,
                go,
            )
            .await;
            let e = match res {
                Ok(code) => return Ok(code),
                Err(e) if accepted => return Err(e),
                Err(e) => e,
            };
            // execd never took the command, so sending it again cannot run it twice.
            if (matches!(e, AdapterError::Unavailable(_)) || execd::token_refused(&e))
                && !reresolved
            {
                reresolved = true;
                self.forget(&at.backend_ref);
                target = self.target(&at.backend_ref).await?;
                continue;
            }
            if e.is_retryable() && !resumed && self.settings.runtime == Runtime::Fastsandbox {
                // A microVM its idle policy paused, which the gateway did not wake in time.
                let paused = lifecycle::get(&self.client, &at.backend_ref)
                    .await
                    .is_ok_and(|s| s.status.state == "Paused");
                if paused {
                    resumed = true;
                    self.thaw(at).await?;
                    target = self.target(&at.backend_ref).await?;
                    continue;
                }
            }
            if matches!(e, AdapterError::NotFound)
                && lifecycle::get(&self.client, &at.backend_ref).await.is_ok()
            {
                // execd's 404 through the proxy, but the sandbox exists.
                return Err(AdapterError::permanent(
                    "exec: execd answered 404".to_owned(),
                ));
            }
            return Err(e);
        }
    }

    /// Runs an idempotent execd call, re-resolving the endpoint once if it cannot connect or
    /// its access token was refused.
    pub(super) async fn on_execd<T, F, Fut>(
        &self,
        at: &InstanceRef,
        f: F,
    ) -> Result<T, AdapterError>
    where
        F: Fn(Target) -> Fut,
        Fut: std::future::Future<Output = Result<T, AdapterError>>,
    {
        let target = self.target(&at.backend_ref).await?;
        match f(target).await {
            Err(e) if matches!(e, AdapterError::Unavailable(_)) || execd::token_refused(&e) => {
                self.forget(&at.backend_ref);
                let target = self.target(&at.backend_ref).await?;
                f(target).await
            }
            other => other,
        }
    }
}

/// Collects output for `exec`, keeping the capped head of each stream.
#[derive(Debug, Default)]
pub(super) struct Collect(pub(super) CollectedOutput);

impl Sink for Collect {
    fn accept(&mut self, ev: ExecEvent) -> impl std::future::Future<Output = bool> + Send {
        self.0.push(&ev);
        std::future::ready(true)
    }
}

/// Sends output to the caller's channel; waiting on a full channel is the backpressure.
pub(super) struct Channel(pub(super) tokio::sync::mpsc::Sender<ExecEvent>);

impl Sink for Channel {
    fn accept(&mut self, ev: ExecEvent) -> impl std::future::Future<Output = bool> + Send {
        let tx = self.0.clone();
        async move { tx.send(ev).await.is_ok() }
    }

    fn gone(&self) -> impl std::future::Future<Output = ()> + Send {
        let tx = self.0.clone();
        async move { tx.closed().await }
    }
}
