//! A `differently dev` for the client crate's tests: started on a free port with a sealing
//! key, its URL and key read from what it prints, killed on drop. Shared by the test files
//! (`#[path]`), each of which uses part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use differently_client::{Client, CreateSandbox};

/// A `differently dev` process, killed on drop.
pub struct Dev {
    child: Child,
    pub url: String,
    pub key: String,
    _root: tempfile::TempDir,
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn binary() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/debug/differently");
    assert!(
        p.exists(),
        "{} is missing: run `cargo build -p differently` first (these tests start `differently dev`)",
        p.display()
    );
    p
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl Dev {
    /// Starts `differently dev` and reads the URL and key it prints.
    pub fn start() -> Dev {
        let root = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let mut child = Command::new(binary())
            .args(["dev", "--listen", &format!("127.0.0.1:{port}"), "--root"])
            .arg(root.path().join("sandboxes"))
            // A sealing key, so stored secrets are enabled.
            .env("DIFFERENTLY_SECRETS_KEY", "ab".repeat(32))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start differently dev");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let (mut url, mut key) = (None, None);
        for line in lines.by_ref().take(5) {
            let line = line.expect("dev's stdout");
            if let Some(u) = line.strip_prefix("export DIFFERENTLY_URL=") {
                url = Some(u.to_owned());
            }
            if let Some(k) = line.strip_prefix("export DIFFERENTLY_API_KEY=") {
                key = Some(k.to_owned());
            }
            if url.is_some() && key.is_some() {
                break;
            }
        }
        // Keep draining stdout so the process never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Dev {
            child,
            url: url.expect("dev printed DIFFERENTLY_URL"),
            key: key.expect("dev printed DIFFERENTLY_API_KEY"),
            _root: root,
        }
    }

    pub fn client(&self) -> Client {
        Client::new(&self.url, &self.key).expect("client")
    }
}

pub async fn running(c: &Client, req: &CreateSandbox) -> String {
    let s = c.create_sandbox(req, None).await.expect("create");
    let s = c
        .wait_sandbox(&s.id, "running", Duration::from_secs(30))
        .await
        .expect("wait");
    assert_eq!(s.status, "running", "{s:?}");
    s.id
}
