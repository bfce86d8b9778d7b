//! A private Postgres cluster for S11 (`pg_ctl -m immediate stop` under load, then start):
//! its own data directory under a temporary directory and its own loopback port, run as the
//! `postgres` user (initdb refuses root), so stopping it touches nothing else on the machine.

use std::path::{Path, PathBuf};
use std::process::Command;

use tempfile::TempDir;

use crate::cluster::free_port;
use crate::LoadError;

/// The running private cluster; stopped (immediately) on drop.
pub struct PrivatePg {
    dir: TempDir,
    bin: PathBuf,
    /// Loopback port.
    pub port: u16,
    /// Whether `as_postgres` must wrap commands (the harness runs as root).
    runuser: bool,
}

fn pg_bindir() -> Result<PathBuf, LoadError> {
    let out = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .map_err(|e| {
            LoadError::Preflight(format!("pg_config not found ({e}): install postgresql"))
        })?;
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if dir.join("initdb").is_file() && dir.join("pg_ctl").is_file() {
        Ok(dir)
    } else {
        Err(LoadError::Preflight(format!(
            "no initdb/pg_ctl in {} (pg_config --bindir): install the postgresql server package",
            dir.display()
        )))
    }
}

impl PrivatePg {
    /// `initdb` (trust auth, loopback only) and start on a free port.
    pub fn start() -> Result<PrivatePg, LoadError> {
        let bin = pg_bindir()?;
        let dir = tempfile::Builder::new()
            .prefix("differently-pg-")
            .tempdir()
            .map_err(|e| LoadError::io("a directory for the private cluster", e))?;
        let runuser = Command::new("id")
            .arg("-u")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
            .unwrap_or(false);
        if runuser {
            let ok = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .map_err(|e| LoadError::io("chown for the private cluster", e))?;
            if !ok.success() {
                return Err(LoadError::Preflight(
                    "cannot chown the private cluster's directory to user postgres (is there a postgres user?)".into(),
                ));
            }
        }
        let pg = PrivatePg {
            dir,
            bin,
            port: free_port()?,
            runuser,
        };
        let data = pg.data();
        pg.run(
            "initdb",
            &[
                "-D",
                &data.display().to_string(),
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
            ],
        )?;
        pg.ctl_start()?;
        Ok(pg)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn run(&self, tool: &str, args: &[&str]) -> Result<(), LoadError> {
        let exe = self.bin.join(tool);
        let mut cmd = if self.runuser {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&exe);
            c
        } else {
            Command::new(&exe)
        };
        let out = cmd
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .map_err(|e| LoadError::io(format!("running {tool}"), e))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(LoadError::Process(format!(
                "{tool} {args:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )))
        }
    }

    /// `pg_ctl start -w` on 127.0.0.1 only, socket in the cluster's own directory.
    pub fn ctl_start(&self) -> Result<(), LoadError> {
        let opts = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {} -c max_connections=200 -c fsync=on",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("postgres.log").display().to_string();
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data().display().to_string(),
                "-o",
                &opts,
                "-l",
                &log,
                "-w",
                "start",
            ],
        )
    }

    /// `pg_ctl -m immediate stop`: every backend killed, no checkpoint; the next start
    /// runs crash recovery.
    pub fn stop_immediate(&self) -> Result<(), LoadError> {
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data().display().to_string(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
        )
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The server log (recovery messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }

    /// Where it lives.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for PrivatePg {
    fn drop(&mut self) {
        let _ = self.stop_immediate();
    }
}
