//! Webhooks on a bare `differently dev`, as a new user first meets them: no secrets key and
//! no URL switch set, a receiver on this machine over plain http. `dev` makes a secrets key
//! for the run and allows loopback receivers (saying so), so a webhook made with the CLI
//! gets a signed delivery; with those defaults turned off, the refusals name the variable
//! that allows what was refused.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::client_cli_dev::json;
use crate::client_cli_webhooks::{next_for, receiver, verifies};
use crate::harness::{binary, free_port, Proc};

/// Variables that would hide what a bare `dev` does: the test runs without them.
const SWITCHES: [&str; 5] = [
    "DIFFERENTLY_SECRETS_KEY",
    "DIFFERENTLY_WEBHOOKS_ALLOW_PRIVATE",
    "DIFFERENTLY_WEBHOOKS_ALLOW_HTTP",
    "DIFFERENTLY_WEBHOOKS_ALLOW_LOOPBACK",
    "DIFFERENTLY_BOOTSTRAP_KEY",
];

/// A `differently dev` started with only `env` set of [`SWITCHES`]; its URL and admin key.
struct BareDev {
    _proc: Proc,
    url: String,
    key: String,
    dir: tempfile::TempDir,
}

impl BareDev {
    fn start(env: &[(&str, &str)]) -> BareDev {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(binary());
        cmd.args([
            "dev",
            "--listen",
            &format!("127.0.0.1:{}", free_port()),
            "--root",
        ])
        .arg(dir.path().join("sandboxes"));
        for v in SWITCHES {
            cmd.env_remove(v);
        }
        let child = cmd
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.path().join("dev.log")).unwrap())
            .spawn()
            .unwrap();
        let mut proc = Proc { child };
        let mut lines = BufReader::new(proc.child.stdout.take().unwrap()).lines();
        let mut next = |prefix: &str| -> String {
            let line = lines.next().unwrap().unwrap();
            line.strip_prefix(prefix)
                .unwrap_or_else(|| panic!("dev printed {line:?}, not {prefix}…"))
                .to_owned()
        };
        let url = next("export DIFFERENTLY_URL=");
        let key = next("export DIFFERENTLY_API_KEY=");
        std::thread::spawn(move || for _ in lines {});
        BareDev {
            _proc: proc,
            url,
            key,
            dir,
        }
    }

    /// `differently args…` against this server: (exit code, stdout, stderr).
    fn run(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(binary())
            .args(args)
            .env("DIFFERENTLY_URL", &self.url)
            .env("DIFFERENTLY_API_KEY", &self.key)
            .env(
                "DIFFERENTLY_CLIENT_CONFIG",
                self.dir.path().join("client.toml"),
            )
            .env_remove("DIFFERENTLY_PROFILE")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    #[track_caller]
    fn ok(&self, args: &[&str]) -> String {
        let (code, out, err) = self.run(args);
        assert_eq!(code, 0, "differently {args:?}: {err}\n{out}");
        out
    }

    /// What the server wrote on stderr so far, once it holds `what` (up to 30 s).
    fn log_once_it_says(&self, what: &str) -> String {
        let path = self.dir.path().join("dev.log");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let log = read(&path);
            if log.contains(what) || std::time::Instant::now() > deadline {
                return log;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[test]
fn a_bare_dev_delivers_signed_webhooks_to_a_loopback_receiver() {
    let dev = BareDev::start(&[]);
    let log = dev.log_once_it_says("webhooks may point at receivers on this machine");
    assert!(
        log.contains("webhooks may point at receivers on this machine") && log.contains("dev only"),
        "the banner says loopback receivers are allowed, in dev only: {log}"
    );
    let (url, rx) = receiver();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let created = json(&dev.ok(&[
        "webhooks",
        "create",
        &url,
        "--types",
        "sandbox.status.changed",
        "-o",
        "json",
    ]));
    let secret = created["secret"].as_str().expect("a secret").to_owned();
    // Private ranges stay refused in dev, naming the switch that would allow them.
    let (code, _, err) = dev.run(&["webhooks", "create", "http://10.1.2.3/hook"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("(field url)") && err.contains("DIFFERENTLY_WEBHOOKS_ALLOW_HTTP"),
        "{err}"
    );
    let (code, _, err) = dev.run(&["webhooks", "create", "https://10.1.2.3/hook"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("private") && err.contains("DIFFERENTLY_WEBHOOKS_ALLOW_PRIVATE"),
        "{err}"
    );

    let sandbox = dev
        .ok(&["sandbox", "create", "--wait", "-o", "id"])
        .trim()
        .to_owned();
    let got = next_for(&rx, &sandbox, Duration::from_secs(60));
    assert!(
        verifies(&got, &secret),
        "the delivery is signed with the secret shown at create"
    );
    let log = read(&dev.dir.path().join("dev.log"));
    assert!(!log.contains(&secret), "the secret never reaches the log");
}

#[test]
fn with_dev_defaults_turned_off_refusals_name_the_variable_to_set() {
    let dev = BareDev::start(&[
        ("DIFFERENTLY_SECRETS_KEY", ""),
        ("DIFFERENTLY_WEBHOOKS_ALLOW_LOOPBACK", "false"),
    ]);
    let (code, _, err) = dev.run(&["webhooks", "create", "http://127.0.0.1:9/hook"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("(field url)") && err.contains("DIFFERENTLY_WEBHOOKS_ALLOW_HTTP"),
        "{err}"
    );
    let (code, _, err) = dev.run(&["webhooks", "create", "https://127.0.0.1:9/hook"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("loopback") && err.contains("DIFFERENTLY_WEBHOOKS_ALLOW_PRIVATE"),
        "{err}"
    );
    let (code, _, err) = dev.run(&["webhooks", "create", "https://hooks.example.com/in"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("409") && err.contains("DIFFERENTLY_SECRETS_KEY"),
        "the conflict names the variable to set: {err}"
    );
}
