//! Processes that outlive a connection (`/v1/sandboxes/{id}/processes`, docs/processes.md):
//! a command started in the background with a pid of the control plane's, which the caller
//! comes back to — to read its output from any byte offset (following it or not), feed its
//! stdin, signal it, resize its terminal, kill it, or ask how it ended. Hanging up a stream
//! only detaches; the process goes on.
//!
//! Reached through [`Client::processes`]: `client.processes().start(sandbox, &req)`.

use bytes::Bytes;
use reqwest::Method;
use serde_json::json;

use crate::exec::{accept, ExecEvent, ExecStream, StreamFormat};
use crate::{
    query, sandbox_path, Client, Error, Process, ProcessList, Result, StartProcess, TransportError,
};

/// The most bytes one `POST …/stdin` takes (the API's bound); [`Processes::send_stdin`]
/// splits larger input into calls of this size, in order.
pub const MAX_STDIN_PER_CALL: usize = 1 << 20;

/// The signals a process may be sent (`POST …/signal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProcessSignal {
    Int,
    Term,
    Kill,
    Hup,
}

impl ProcessSignal {
    /// The wire name (`INT`, `TERM`, `KILL`, `HUP`).
    pub fn as_str(self) -> &'static str {
        match self {
            ProcessSignal::Int => "INT",
            ProcessSignal::Term => "TERM",
            ProcessSignal::Kill => "KILL",
            ProcessSignal::Hup => "HUP",
        }
    }

    /// Parses a signal name, with or without `SIG`, in any case (`term`, `SIGTERM`); `None`
    /// for one a process cannot be sent.
    pub fn parse(name: &str) -> Option<ProcessSignal> {
        let upper = name.to_ascii_uppercase();
        match upper.strip_prefix("SIG").unwrap_or(&upper) {
            "INT" => Some(ProcessSignal::Int),
            "TERM" => Some(ProcessSignal::Term),
            "KILL" => Some(ProcessSignal::Kill),
            "HUP" => Some(ProcessSignal::Hup),
            _ => None,
        }
    }
}

/// What [`Processes::output`] reads: from which byte offset, whether to follow the process
/// until it ends, and in which format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputOptions {
    /// The byte offset to start at (0: the oldest output kept; `Process::output_bytes` or
    /// [`ProcessOutput::offset`] to go on from where a reader stopped).
    pub from: u64,
    /// Stream until the process ends (then its exit); `false`: the output kept now, then
    /// the end of the stream (with the exit only if it has ended).
    pub follow: bool,
    /// The stream's format (binary frames by default: exact bytes).
    pub format: StreamFormat,
}

impl Default for OutputOptions {
    fn default() -> Self {
        OutputOptions {
            from: 0,
            follow: true,
            format: StreamFormat::Frames,
        }
    }
}

/// The process calls of one client, for any sandbox the key reaches.
#[derive(Debug, Clone, Copy)]
pub struct Processes<'a> {
    client: &'a Client,
}

impl Client {
    /// The `/v1/sandboxes/{id}/processes` calls.
    pub fn processes(&self) -> Processes<'_> {
        Processes { client: self }
    }
}

fn process_path(sandbox: &str, pid: u32, rest: &str) -> String {
    sandbox_path(sandbox, &format!("/processes/{pid}{rest}"))
}

impl Processes<'_> {
    /// `POST …/processes`: starts `req` in the background; answers it once the command was
    /// sent to the backend (`status` `running`, or already ended).
    pub async fn start(&self, sandbox: &str, req: &StartProcess) -> Result<Process> {
        match req.command.first() {
            None => return Err(Error::invalid("command", "is empty: name a program to run")),
            Some(p) if p.is_empty() => {
                return Err(Error::invalid("command[0]", "the program is empty"))
            }
            Some(_) => {}
        }
        let path = sandbox_path(sandbox, "/processes");
        self.client.json(Method::POST, &path, Some(req), &[]).await
    }

    /// `GET …/processes`: the sandbox's processes, running and recently ended, newest first;
    /// only those with `status` (`running`, `exited`, `failed`) when given.
    pub async fn list(&self, sandbox: &str, status: Option<&str>) -> Result<Vec<Process>> {
        let path = sandbox_path(
            sandbox,
            &format!(
                "/processes{}",
                query(&[("status", status.map(str::to_owned))])
            ),
        );
        let list: ProcessList = self
            .client
            .json::<_, ()>(Method::GET, &path, None, &[])
            .await?;
        Ok(list.items)
    }

    /// `GET …/processes/{pid}`: its status, exit code once ended, and output counters.
    pub async fn get(&self, sandbox: &str, pid: u32) -> Result<Process> {
        self.client
            .json::<_, ()>(Method::GET, &process_path(sandbox, pid, ""), None, &[])
            .await
    }

    /// `GET …/processes/{pid}/output`: its output from `opts.from`, as [`ExecEvent`]s; the
    /// exit (or error) comes last once the process has ended. Dropping the stream detaches.
    pub async fn output(
        &self,
        sandbox: &str,
        pid: u32,
        opts: OutputOptions,
    ) -> Result<ProcessOutput> {
        let path = process_path(
            sandbox,
            pid,
            &format!(
                "/output{}",
                query(&[
                    ("from", Some(opts.from.to_string())),
                    ("follow", Some(opts.follow.to_string())),
                ])
            ),
        );
        let resp = self
            .client
            .call::<()>(Method::GET, &path, None, &[("accept", accept(opts.format))])
            .await?;
        let stream = ExecStream::open(
            resp,
            opts.format,
            format!("GET {path}"),
            self.client.base_url(),
            false,
            !opts.follow,
        )?;
        Ok(ProcessOutput {
            stream,
            offset: opts.from,
        })
    }

    /// `POST …/processes/{pid}/stdin`: hands `bytes` to its stdin (or its terminal), in
    /// order; input over [`MAX_STDIN_PER_CALL`] is sent in several calls.
    pub async fn send_stdin(&self, sandbox: &str, pid: u32, bytes: impl Into<Bytes>) -> Result<()> {
        let bytes: Bytes = bytes.into();
        let path = process_path(sandbox, pid, "/stdin");
        let mut rest = bytes;
        loop {
            let part = rest.split_to(rest.len().min(MAX_STDIN_PER_CALL));
            let rb = self
                .client
                .authorized(Method::POST, &path)
                .header("content-type", "application/octet-stream")
                .body(part);
            let resp = self.client.send(&Method::POST, &path, rb).await?;
            let url = resp.url().to_string();
            resp.bytes()
                .await
                .map_err(|e| TransportError::new("POST", &url, self.client.base_url(), e))?;
            if rest.is_empty() {
                return Ok(());
            }
        }
    }

    /// `DELETE …/processes/{pid}/stdin`: end of input (a second close is fine).
    pub async fn close_stdin(&self, sandbox: &str, pid: u32) -> Result<()> {
        self.client
            .empty::<()>(Method::DELETE, &process_path(sandbox, pid, "/stdin"), None)
            .await
    }

    /// `POST …/processes/{pid}/signal`: to its process group (a terminal's foreground group).
    pub async fn signal(&self, sandbox: &str, pid: u32, signal: ProcessSignal) -> Result<()> {
        let body = json!({ "signal": signal.as_str() });
        self.client
            .empty(
                Method::POST,
                &process_path(sandbox, pid, "/signal"),
                Some(&body),
            )
            .await
    }

    /// `POST …/processes/{pid}/resize`: a terminal process's new size (1–1000 each).
    pub async fn resize(&self, sandbox: &str, pid: u32, cols: u16, rows: u16) -> Result<()> {
        let body = json!({ "cols": cols, "rows": rows });
        self.client
            .empty(
                Method::POST,
                &process_path(sandbox, pid, "/resize"),
                Some(&body),
            )
            .await
    }

    /// `DELETE …/processes/{pid}`: `KILL` if it still runs; an ended one is fine.
    pub async fn kill(&self, sandbox: &str, pid: u32) -> Result<()> {
        self.client
            .empty::<()>(Method::DELETE, &process_path(sandbox, pid, ""), None)
            .await
    }
}

/// A process's output, read with [`next`](ProcessOutput::next); [`offset`](ProcessOutput::offset)
/// is where to re-attach from.
pub struct ProcessOutput {
    stream: ExecStream,
    offset: u64,
}

impl ProcessOutput {
    /// The next piece; `None` after the last (the exit or error, or with `follow: false` the
    /// end of the output kept).
    pub async fn next(&mut self) -> Option<Result<ExecEvent>> {
        let ev = self.stream.next().await;
        if let Some(Ok(ExecEvent::Stdout(b) | ExecEvent::Stderr(b))) = &ev {
            // SSE says the offset past each chunk (its text is lossy UTF-8, so its length is
            // not the bytes'); frames carry the exact bytes, counted.
            self.offset = match self.stream.last_id.take() {
                Some(id) => id,
                None => self.offset + b.len() as u64,
            };
        }
        ev
    }

    /// The byte offset just past the output read so far: `from` for the next attach.
    ///
    /// It counts from the `from` asked for (the server's SSE `id:`s do too). A `from` outside
    /// the output kept (older than `Process::output_dropped`, or past `output_bytes`) starts
    /// the stream at the nearest kept byte, so the count is off by the difference: then
    /// `Process::output_bytes` from [`Processes::get`] is the offset to trust.
    pub fn offset(&self) -> u64 {
        self.offset
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_parse_with_or_without_sig_in_any_case() {
        for (name, sig) in [
            ("TERM", ProcessSignal::Term),
            ("sigkill", ProcessSignal::Kill),
            ("SIGINT", ProcessSignal::Int),
            ("hup", ProcessSignal::Hup),
        ] {
            assert_eq!(ProcessSignal::parse(name), Some(sig), "{name}");
            assert_eq!(ProcessSignal::parse(sig.as_str()), Some(sig));
        }
        assert_eq!(ProcessSignal::parse("USR1"), None);
    }

    #[test]
    fn paths_carry_the_pid_and_the_query() {
        assert_eq!(
            process_path("sbx_1", 1048577, "/stdin"),
            "/v1/sandboxes/sbx_1/processes/1048577/stdin"
        );
    }
}
