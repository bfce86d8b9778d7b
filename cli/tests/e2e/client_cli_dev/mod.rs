//! The client commands added for parity with the peers' CLIs, run as a user runs them
//! against a real `differently dev` (devhost pool: real processes and files). Here the
//! harness the cases (and other e2e modules) share; the cases by concern: `exec_and_files`
//! (exec with stdin and exit codes, `cp` both ways with directories, `ls`/`rm`, a closed
//! pipe), `lifecycle` (snapshots and forks, ports, keepalive, TTL and label updates, events
//! and logs, waits that give up), `tenancy` (tenancy, quotas, policies, placement dry run,
//! audit list and export), `login` (profiles with `login`, completions), `processes`
//! (`process start`/`attach`/`stdin`/`signal`/`kill`) and `terminal` (output formats and
//! `exec -it` on a terminal).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::harness::{binary, free_port, Proc};

mod exec_and_files;
mod lifecycle;
mod login;
mod processes;
mod tenancy;
mod terminal;

/// A `differently dev` with its URL and admin key, and a private (absent) client config.
/// Shared with `client_cli_webhooks`.
pub(crate) struct Dev {
    _proc: Proc,
    pub(crate) url: String,
    pub(crate) key: String,
    pub(crate) dir: tempfile::TempDir,
}

impl Dev {
    pub(crate) fn start() -> Dev {
        Dev::start_with(&[])
    }

    /// Started with these extra environment variables (e.g. the webhook URL switches).
    pub(crate) fn start_with(env: &[(&str, &str)]) -> Dev {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let child = Command::new(binary())
            .args(["dev", "--listen", &format!("127.0.0.1:{port}"), "--root"])
            .arg(dir.path().join("sandboxes"))
            // A sealing key, so stored secrets are enabled.
            .env("DIFFERENTLY_SECRETS_KEY", "cd".repeat(32))
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.path().join("dev.log")).unwrap())
            .spawn()
            .unwrap();
        let mut proc = Proc { child };
        let stdout = proc.child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let url = lines.next().unwrap().unwrap();
        let key = lines.next().unwrap().unwrap();
        std::thread::spawn(move || for _ in lines {});
        Dev {
            _proc: proc,
            url: url
                .strip_prefix("export DIFFERENTLY_URL=")
                .unwrap()
                .to_owned(),
            key: key
                .strip_prefix("export DIFFERENTLY_API_KEY=")
                .unwrap()
                .to_owned(),
            dir,
        }
    }

    /// `POST path` with the admin key; the JSON answer, which must be a success.
    pub(crate) async fn post(&self, path: &str, body: Value) -> Value {
        let resp = reqwest::Client::new()
            .post(format!("{}{path}", self.url))
            .bearer_auth(&self.key)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_success(), "{path}: {}", resp.status());
        resp.json().await.unwrap()
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("client").join("client.toml")
    }

    /// `differently args…` with the URL and key in the environment.
    pub(crate) fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(binary());
        cmd.args(args)
            .env("DIFFERENTLY_URL", &self.url)
            .env("DIFFERENTLY_API_KEY", &self.key)
            .env("DIFFERENTLY_CLIENT_CONFIG", self.config())
            .env_remove("DIFFERENTLY_PROFILE")
            .stdin(Stdio::null());
        cmd
    }

    pub(crate) fn run(&self, args: &[&str]) -> (i32, String, String) {
        output(self.cmd(args), None)
    }

    /// Runs and expects exit 0; stdout.
    #[track_caller]
    pub(crate) fn ok(&self, args: &[&str]) -> String {
        let (code, out, err) = self.run(args);
        assert_eq!(code, 0, "differently {args:?}: {err}\n{out}");
        out
    }

    #[track_caller]
    pub(crate) fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        json(&self.ok(&all))
    }
}

/// Runs `cmd` with `stdin` (or none); (exit code, stdout, stderr).
fn output(mut cmd: Command, stdin: Option<&[u8]>) -> (i32, String, String) {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    if stdin.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let mut child = cmd.spawn().unwrap();
    if let Some(bytes) = stdin {
        let mut w = child.stdin.take().unwrap();
        w.write_all(bytes).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[track_caller]
pub(crate) fn json(text: &str) -> Value {
    match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => panic!("not JSON ({e}): {text}"),
    }
}

fn ids(v: &Value) -> Vec<String> {
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap().to_owned())
        .collect()
}

#[cfg(unix)]
fn set_mode(p: &Path, m: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
}

#[cfg(unix)]
fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}
