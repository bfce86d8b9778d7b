//! Processes the nemesis can hit: `kill -9`, `SIGSTOP`/`SIGCONT`, restart. Signals go through
//! `kill(1)` to pids this harness spawned itself, never to a process found by name.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::LoadError;

/// Sends `sig` (`-9`, `-STOP`, `-CONT`) to `pid`, a child of this harness.
pub fn signal(pid: u32, sig: &str) -> Result<(), LoadError> {
    let status = Command::new("kill")
        .args([sig, &pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .map_err(|e| LoadError::io(format!("kill {sig} {pid}"), e))?;
    if status.success() {
        Ok(())
    } else {
        Err(LoadError::Process(format!("kill {sig} {pid}: {status}")))
    }
}

/// A spawned child with what it takes to start it again.
pub struct Spawned {
    /// What `Command` it was (program, args, env), to respawn after a kill.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Environment on top of the harness's.
    pub env: Vec<(String, String)>,
    /// Where stdout and stderr go (appended across restarts).
    pub log: PathBuf,
    /// The running child, if any.
    pub child: Option<Child>,
    /// Stopped with `SIGSTOP` and not continued yet.
    pub stopped: bool,
}

impl Spawned {
    /// Starts `program args` with `env`, logging to `log` (appending).
    pub fn start(
        program: &Path,
        args: Vec<String>,
        env: Vec<(String, String)>,
        log: PathBuf,
        remove: &[&str],
    ) -> Result<Spawned, LoadError> {
        let mut s = Spawned {
            program: program.to_owned(),
            args,
            env,
            log,
            child: None,
            stopped: false,
        };
        s.launch(remove)?;
        Ok(s)
    }

    /// (Re)starts the child.
    pub fn launch(&mut self, remove: &[&str]) -> Result<(), LoadError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| LoadError::io(format!("opening {}", self.log.display()), e))?;
        let err = file
            .try_clone()
            .map_err(|e| LoadError::io("cloning a log handle", e))?;
        let mut cmd = Command::new(&self.program);
        // Scrub what the harness's own environment might carry first, then set ours.
        for r in remove {
            cmd.env_remove(r);
        }
        cmd.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .spawn()
            .map_err(|e| LoadError::io(format!("spawning {}", self.program.display()), e))?;
        self.child = Some(child);
        self.stopped = false;
        Ok(())
    }

    /// The pid, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `kill -9` and reap (a stopped child is killed too).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.stopped = false;
    }

    /// `SIGSTOP`.
    pub fn pause(&mut self) -> Result<(), LoadError> {
        let pid = self
            .pid()
            .ok_or_else(|| LoadError::Process(format!("{} is not running", self.log.display())))?;
        signal(pid, "-STOP")?;
        self.stopped = true;
        Ok(())
    }

    /// `SIGCONT` (no-op unless stopped).
    pub fn resume(&mut self) -> Result<(), LoadError> {
        if let (true, Some(pid)) = (self.stopped, self.pid()) {
            signal(pid, "-CONT")?;
        }
        self.stopped = false;
        Ok(())
    }

    /// Whether the child has exited on its own (reaps it if so).
    pub fn exited(&mut self) -> Option<String> {
        match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(Some(status))) => {
                self.child = None;
                Some(status.to_string())
            }
            _ => None,
        }
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Waits until something accepts TCP connections on `127.0.0.1:port`.
pub fn wait_port(port: u16, within: Duration) -> bool {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// The length of `log` now (0 if it does not exist yet): where a launch's own lines start.
fn log_len(log: &Path) -> u64 {
    std::fs::metadata(log).map(|m| m.len()).unwrap_or(0)
}

/// Waits until the nats-server of `proc` says, in its log after byte `from`, that it listens
/// on `127.0.0.1:port` and is ready. A connection alone proves nothing: another process may
/// hold the port, and this server then exits on the bind after the probe reached the other.
fn nats_ready(proc: &mut Spawned, from: u64, port: u16, within: Duration) -> bool {
    let listening = format!("Listening for client connections on 127.0.0.1:{port}\n");
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let log = std::fs::read(&proc.log).unwrap_or_default();
        let start = usize::try_from(from).unwrap_or(usize::MAX).min(log.len());
        let ours = String::from_utf8_lossy(&log[start..]);
        if ours.contains(&listening) && ours.contains("Server is ready") {
            return wait_port(port, Duration::from_secs(1));
        }
        if proc.exited().is_some() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// A private nats-server ≥ 2.10 with JetStream on a loopback port, which the nemesis may
/// kill, stop, restart on the same port and store, or restart with its store wiped.
pub struct Nats {
    /// The server process.
    pub proc: Spawned,
    /// Client port on 127.0.0.1.
    pub port: u16,
    /// JetStream store directory.
    pub store: PathBuf,
}

impl Nats {
    /// Starts `binary` on a free port with its store under `dir`.
    pub fn start(binary: &Path, dir: &Path) -> Result<Nats, LoadError> {
        let store = dir.join("nats-store");
        let mut last = String::new();
        for _ in 0..5 {
            let port = crate::cluster::free_port()?;
            let args = vec![
                "-a".to_owned(),
                "127.0.0.1".to_owned(),
                "-p".to_owned(),
                port.to_string(),
                "-js".to_owned(),
                "-sd".to_owned(),
                store.display().to_string(),
            ];
            let log = dir.join("nats.log");
            let from = log_len(&log);
            let mut proc = Spawned::start(binary, args, vec![], log, &[])?;
            if nats_ready(&mut proc, from, port, Duration::from_secs(10)) {
                return Ok(Nats { proc, port, store });
            }
            last = proc
                .exited()
                .unwrap_or_else(|| "no connection in 10 s".to_owned());
            proc.kill9();
        }
        Err(LoadError::Process(format!(
            "nats-server did not start: {last}"
        )))
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts it again (same port, same store), waiting until it accepts connections.
    pub fn restart(&mut self) -> Result<(), LoadError> {
        self.proc.kill9();
        for _ in 0..50 {
            let from = log_len(&self.proc.log);
            self.proc.launch(&[])?;
            if nats_ready(&mut self.proc, from, self.port, Duration::from_secs(5)) {
                return Ok(());
            }
            self.proc.kill9();
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(LoadError::Process(format!(
            "nats-server did not restart on port {}",
            self.port
        )))
    }

    /// "Amnesia": kill it, remove the whole JetStream store, start it again empty.
    pub fn wipe_and_restart(&mut self) -> Result<(), LoadError> {
        self.proc.kill9();
        if self.store.exists() {
            std::fs::remove_dir_all(&self.store)
                .map_err(|e| LoadError::io(format!("removing {}", self.store.display()), e))?;
        }
        self.restart()
    }
}
