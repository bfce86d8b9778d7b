//! The conformance kit: the adapter contract run against a backend, check by check, with a
//! report a person (table) or a pipeline (JSON) reads. `differently plugin conformance URL`
//! runs [`run_plugin`] against a plugin; [`run`] takes any adapter, so tests and new
//! in-repository adapters use the same checks.
//!
//! The checks need a few programs. A plugin that runs real commands has a POSIX `sh`; an
//! in-memory test plugin may instead speak the reference `fake` adapter's vocabulary
//! (`fake-stderr`, `fake-exit N`). Which one is found first is the report's `dialect`.
//! Both know `echo`, `true`, `false`, `cat` (stdin), `pwd`, `env` and `sleep`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::future::Future;
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use differently_core::exec::ExecRequest;
use differently_core::ids::InstallationId;
use differently_core::{Resources, SandboxId};
use futures::StreamExt;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::credentials::{CredentialRef, Credentials};
use crate::remote::wire::{self, ErrorBody, ErrorCode, Info};
use crate::remote::{RemoteAdapter, RemoteConfig};
use crate::{
    Adapter, AdapterError, ByteRange, CreateInstance, ExecEvent, InstanceRef, InstanceState,
};

/// Longest any one check may take before it fails as hung.
const CHECK_TIMEOUT: Duration = Duration::from_secs(60);

/// How a check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Pass,
    Fail,
    /// Not run: the capability it needs is not declared (its honesty check runs instead).
    Skip,
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Stable dotted name (`exec.timeout`), for scripts and bug reports.
    pub name: String,
    pub outcome: Outcome,
    /// What was seen (on failure: what was expected and what came instead).
    pub detail: String,
}

/// Which programs the checks use (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dialect {
    Posix,
    Fake,
}

/// Everything one run found.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// What the plugin's `/info` said (absent when it could not be read, or for [`run`]).
    pub plugin: Option<Info>,
    /// The capabilities the checks held the backend to.
    pub declared: Vec<String>,
    pub dialect: Option<Dialect>,
    pub checks: Vec<Check>,
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
}

impl Report {
    /// True when no check failed.
    pub fn ok(&self) -> bool {
        self.failed == 0 && self.passed > 0
    }

    /// The check named `name`, if it ran.
    pub fn check(&self, name: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }

    /// Names of the failed checks.
    pub fn failures(&self) -> Vec<&str> {
        self.checks
            .iter()
            .filter(|c| c.outcome == Outcome::Fail)
            .map(|c| c.name.as_str())
            .collect()
    }

    /// The human table: one line per check, then the totals.
    pub fn table(&self) -> String {
        let mut out = String::new();
        if let Some(i) = &self.plugin {
            let _ = writeln!(
                out,
                "plugin {} (protocol {} v{:?}), capabilities: {}",
                i.name,
                i.protocol,
                i.versions,
                i.capabilities.join(", ")
            );
        }
        if let Some(d) = self.dialect {
            let _ = writeln!(out, "programs: {d:?}");
        }
        let width = self.checks.iter().map(|c| c.name.len()).max().unwrap_or(5);
        let _ = writeln!(out, "{:<width$}  RESULT  DETAIL", "CHECK");
        for c in &self.checks {
            let result = match c.outcome {
                Outcome::Pass => "pass",
                Outcome::Fail => "FAIL",
                Outcome::Skip => "skip",
            };
            let _ = writeln!(out, "{:<width$}  {result:<6}  {}", c.name, c.detail);
        }
        let _ = writeln!(
            out,
            "{} passed, {} failed, {} skipped: {}",
            self.passed,
            self.failed,
            self.skipped,
            if self.ok() {
                "CONFORMS"
            } else {
                "DOES NOT CONFORM"
            }
        );
        out
    }

    fn finish(mut self) -> Report {
        self.passed = self.count(Outcome::Pass);
        self.failed = self.count(Outcome::Fail);
        self.skipped = self.count(Outcome::Skip);
        self
    }

    fn count(&self, o: Outcome) -> usize {
        self.checks.iter().filter(|c| c.outcome == o).count()
    }
}

/// Where the plugin is and how to authenticate to it.
#[derive(Debug, Clone)]
pub struct Target {
    /// The plugin's base URL (`/adapter/v1` is added).
    pub url: String,
    /// The bearer token, by reference.
    pub token: CredentialRef,
}

/// Whether `url`'s host is this machine (plain http is accepted only there).
fn is_loopback_url(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let authority = rest.split('/').next().unwrap_or("");
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Runs every check against the plugin at `target`: the protocol's own (info, auth,
/// versioning, error shape), then the contract's through a `remote` adapter that passes
/// every call on, declared or not.
pub async fn run_plugin(target: &Target) -> Report {
    let mut r = Runner::new();
    let url = target.url.trim().to_owned();
    let allow_http = is_loopback_url(&url);
    if url.starts_with("http://") && !allow_http {
        r.fail(
            "target",
            "plain http:// only to this machine (127.0.0.1, ::1, localhost); use https://",
        );
        return r.report(None, Vec::new());
    }
    let config = RemoteConfig {
        url: Some(url.clone()),
        token: Some(target.token.to_string()),
        allow_http,
        ..RemoteConfig::default()
    };
    let adapter = match RemoteAdapter::new(&config, &Credentials::default()) {
        Ok(a) => a.ungated(),
        Err(e) => {
            r.fail("target", e.to_string());
            return r.report(None, Vec::new());
        }
    };
    let info = match adapter.refresh_info().await {
        Ok(i) => i,
        Err(e) => {
            r.fail("info", format!("GET /adapter/v1/info: {e}"));
            return r.report(None, Vec::new());
        }
    };
    let unknown: Vec<&String> = info
        .capabilities
        .iter()
        .filter(|c| !wire::PROTOCOL_CAPABILITIES.contains(&c.as_str()))
        .collect();
    if !unknown.is_empty() {
        r.fail(
            "info",
            format!("declares capabilities the protocol does not carry: {unknown:?}"),
        );
    } else if !info.capabilities.iter().any(|c| c == "exec") {
        r.fail(
            "info",
            "does not declare `exec`, which every backend must have",
        );
    } else {
        r.pass(
            "info",
            format!("{} speaks versions {:?}", info.name, info.versions),
        );
    }
    let token = Credentials::default()
        .resolver(target.token.clone())
        .get()
        .await;
    match token {
        Ok(token) => protocol_checks(&mut r, &adapter_base(&url), &token).await,
        Err(e) => r.fail("auth.required", format!("the token cannot be read: {e}")),
    }
    let declared = info.capabilities.clone();
    let dialect = contract_checks(&mut r, &adapter, &declared).await;
    Report {
        dialect,
        ..r.report(Some(info), declared)
    }
    .finish()
}

/// Runs the contract's checks against `adapter`, holding it to `declared`.
pub async fn run(adapter: &dyn Adapter, declared: &[String]) -> Report {
    let mut r = Runner::new();
    let dialect = contract_checks(&mut r, adapter, declared).await;
    Report {
        dialect,
        ..r.report(None, declared.to_vec())
    }
    .finish()
}

fn adapter_base(url: &str) -> String {
    let trimmed = url.trim_end_matches('/');
    let base = trimmed.strip_suffix(wire::BASE_PATH).unwrap_or(trimmed);
    format!("{base}{}", wire::BASE_PATH)
}

/// What only raw HTTP can see: a missing or wrong token, a version it does not speak, the
/// error body's shape.
async fn protocol_checks(r: &mut Runner, base: &str, token: &str) {
    let http = match reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
    {
        Ok(h) => h,
        Err(e) => {
            r.fail("auth.required", format!("cannot build an HTTP client: {e}"));
            return;
        }
    };
    let info = format!("{base}/info");
    let expect = |name: &'static str, status: u16, code: ErrorCode| {
        move |resp: Result<(u16, Vec<u8>), reqwest::Error>| -> Result<String, String> {
            let (s, body) = resp.map_err(|e| format!("request failed: {e}"))?;
            let parsed: Result<ErrorBody, _> = serde_json::from_slice(&body);
            match parsed {
                Ok(b) if s == status && b.code == code => Ok(format!("HTTP {s} {code:?}")),
                Ok(b) => Err(format!(
                    "{name}: expected HTTP {status} {code:?}, got HTTP {s} {:?}",
                    b.code
                )),
                Err(_) => Err(format!(
                    "{name}: expected HTTP {status} with an error body, got HTTP {s}: {}",
                    String::from_utf8_lossy(&body[..body.len().min(120)])
                )),
            }
        }
    };
    async fn call(rb: reqwest::RequestBuilder) -> Result<(u16, Vec<u8>), reqwest::Error> {
        let resp = rb.send().await?;
        let s = resp.status().as_u16();
        Ok((s, resp.bytes().await?.to_vec()))
    }
    let res = call(http.get(&info)).await;
    r.record(
        "auth.required",
        expect("no token", 401, ErrorCode::Unauthenticated)(res),
    );
    let res = call(http.get(&info).bearer_auth("not-the-token")).await;
    r.record(
        "auth.wrong-token",
        expect("wrong token", 401, ErrorCode::Unauthenticated)(res),
    );
    let res = call(
        http.get(&info)
            .bearer_auth(token)
            .header(wire::VERSION_HEADER, "999"),
    )
    .await;
    r.record(
        "version.refused",
        expect("version 999", 400, ErrorCode::UnsupportedVersion)(res),
    );
    let missing = format!("{base}/instances/{}", SandboxId::new());
    let res = call(http.get(&missing).bearer_auth(token)).await;
    let shape = match res {
        Ok((s, body)) => match serde_json::from_slice::<serde_json::Value>(&body) {
            Ok(v)
                if s == 404
                    && v["code"] == "not_found"
                    && v["message"].is_string()
                    && v["retryable"] == false =>
            {
                Ok("a missing instance is HTTP 404 {code: not_found, message, retryable: false}".to_owned())
            }
            _ => Err(format!(
                "a missing instance: expected HTTP 404 {{code: not_found, message, retryable: false}}, got HTTP {s}: {}",
                String::from_utf8_lossy(&body[..body.len().min(160)])
            )),
        },
        Err(e) => Err(format!("request failed: {e}")),
    };
    r.record("errors.shape", shape);
}

/// Collects check results.
struct Runner {
    checks: Vec<Check>,
}

impl Runner {
    fn new() -> Self {
        Runner { checks: Vec::new() }
    }

    fn record(&mut self, name: &str, result: Result<String, String>) {
        let (outcome, detail) = match result {
            Ok(d) => (Outcome::Pass, d),
            Err(d) => (Outcome::Fail, d),
        };
        self.checks.push(Check {
            name: name.to_owned(),
            outcome,
            detail,
        });
    }

    fn pass(&mut self, name: &str, detail: impl Into<String>) {
        self.record(name, Ok(detail.into()));
    }

    fn fail(&mut self, name: &str, detail: impl Into<String>) {
        self.record(name, Err(detail.into()));
    }

    fn skip(&mut self, name: &str, detail: impl Into<String>) {
        self.checks.push(Check {
            name: name.to_owned(),
            outcome: Outcome::Skip,
            detail: detail.into(),
        });
    }

    /// Runs one check with the hang timeout.
    async fn check<F>(&mut self, name: &str, f: F)
    where
        F: Future<Output = Result<String, String>>,
    {
        let r = match tokio::time::timeout(CHECK_TIMEOUT, f).await {
            Ok(r) => r,
            Err(_) => Err(format!("no answer within {} s", CHECK_TIMEOUT.as_secs())),
        };
        self.record(name, r);
    }

    fn report(self, plugin: Option<Info>, declared: Vec<String>) -> Report {
        Report {
            plugin,
            declared,
            dialect: None,
            checks: self.checks,
            passed: 0,
            failed: 0,
            skipped: 0,
        }
        .finish()
    }
}

fn cmd(args: &[&str]) -> ExecRequest {
    ExecRequest {
        command: args.iter().map(|s| (*s).to_owned()).collect(),
        timeout_seconds: Some(30),
        ..ExecRequest::default()
    }
}

fn spec(sandbox_id: &SandboxId, installation: &InstallationId) -> CreateInstance {
    CreateInstance {
        sandbox_id: sandbox_id.clone(),
        installation_id: installation.clone(),
        template: None,
        resources: Resources::DEFAULT,
        env: BTreeMap::from([("DIFFERENTLY_CONFORMANCE".to_owned(), "1".to_owned())]),
        ttl_seconds: 600,
        from_snapshot: None,
    }
}

fn kind(e: &AdapterError) -> &'static str {
    match e {
        AdapterError::Transient(_) => "transient",
        AdapterError::Permanent(_) => "permanent",
        AdapterError::NotFound => "not_found",
        AdapterError::PathNotFound(_) => "path_not_found",
        AdapterError::Unsupported(_) => "unsupported_operation",
        AdapterError::Unavailable(_) => "unavailable",
        AdapterError::Capacity(_) => "insufficient_capacity",
        AdapterError::BadPath(_) => "bad_path",
    }
}

/// The programs of a dialect.
struct Programs {
    /// Writes `text` to stderr, nothing to stdout, exits 0.
    stderr: fn(&str) -> Vec<String>,
    /// Exits with `code`.
    exit: fn(i32) -> Vec<String>,
}

const POSIX: Programs = Programs {
    stderr: |t| {
        vec![
            "sh".into(),
            "-c".into(),
            format!("printf '%s\\n' '{t}' >&2"),
        ]
    },
    exit: |c| vec!["sh".into(), "-c".into(), format!("exit {c}")],
};

const FAKE: Programs = Programs {
    stderr: |t| vec!["fake-stderr".into(), t.into()],
    exit: |c| vec!["fake-exit".into(), c.to_string()],
};

async fn exec(
    a: &dyn Adapter,
    at: &InstanceRef,
    command: Vec<String>,
) -> Result<differently_core::exec::ExecResult, String> {
    let req = ExecRequest {
        command,
        timeout_seconds: Some(30),
        ..ExecRequest::default()
    };
    a.exec(at, &req)
        .await
        .map_err(|e| format!("exec failed: {} ({e})", kind(&e)))
}

/// Finds the dialect: POSIX first, then the fake's. An adapter that says its buffered exec
/// answers stderr combined with stdout is probed for the stderr text in either.
async fn dialect(a: &dyn Adapter, at: &InstanceRef) -> Option<Dialect> {
    let merged = !a.exec_fidelity().buffered_stderr;
    for (d, p) in [(Dialect::Posix, &POSIX), (Dialect::Fake, &FAKE)] {
        let Ok(r) = exec(a, at, (p.exit)(7)).await else {
            continue;
        };
        if r.exit_code != 7 {
            continue;
        }
        if let Ok(r) = exec(a, at, (p.stderr)("conformance-probe")).await {
            let seen = r.stderr.contains("conformance-probe")
                || (merged && r.stdout.contains("conformance-probe"));
            if r.exit_code == 0 && seen {
                return Some(d);
            }
        }
    }
    None
}

/// Streams `req`, returning (stdout, stderr, exit code).
async fn stream(
    a: &dyn Adapter,
    at: &InstanceRef,
    req: &ExecRequest,
) -> Result<(Vec<u8>, Vec<u8>, i32), AdapterError> {
    let (tx, mut rx) = mpsc::channel(8);
    let collect = async {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        while let Some(ev) = rx.recv().await {
            match ev {
                ExecEvent::Stdout(b) => out.extend_from_slice(&b),
                ExecEvent::Stderr(b) => err.extend_from_slice(&b),
            }
        }
        (out, err)
    };
    let (exit, (out, err)) = tokio::join!(a.exec_stream(at, req, tx), collect);
    Ok((out, err, exit?.exit_code))
}

async fn read_all(
    a: &dyn Adapter,
    at: &InstanceRef,
    path: &str,
    range: Option<ByteRange>,
) -> Result<(Option<u64>, Vec<u8>), AdapterError> {
    let d = a.download(at, path, range).await?;
    let mut body = d.body;
    let mut bytes = Vec::new();
    while let Some(chunk) = body.next().await {
        bytes.extend_from_slice(&chunk?);
    }
    Ok((d.total_size, bytes))
}

fn expect_eq<T: PartialEq + std::fmt::Debug>(what: &str, want: T, got: T) -> Result<(), String> {
    if want == got {
        Ok(())
    } else {
        Err(format!("{what}: expected {want:?}, got {got:?}"))
    }
}

fn expect_kind<T: std::fmt::Debug>(
    what: &str,
    want: &str,
    got: Result<T, AdapterError>,
) -> Result<String, String> {
    match got {
        Err(e) if kind(&e) == want => Ok(format!("{what}: {want}")),
        Err(e) => Err(format!("{what}: expected {want}, got {} ({e})", kind(&e))),
        Ok(v) => Err(format!("{what}: expected {want}, got success ({v:?})")),
    }
}

/// Every contract check. Sandboxes made here are deleted at the end whatever happened.
async fn contract_checks(r: &mut Runner, a: &dyn Adapter, declared: &[String]) -> Option<Dialect> {
    let has = |c: &str| declared.iter().any(|d| d == c);
    let installation = InstallationId::new();
    let id = SandboxId::new();
    let mut made = vec![id.clone()];

    r.check("health", async {
        a.health()
            .await
            .map(|()| "answers".to_owned())
            .map_err(|e| format!("{} ({e})", kind(&e)))
    })
    .await;

    // Create, twice: the same instance.
    let mut first = None;
    r.check("create", async {
        let i = a
            .create(&spec(&id, &installation))
            .await
            .map_err(|e| format!("{} ({e})", kind(&e)))?;
        expect_eq("sandboxId", &id, &i.sandbox_id)?;
        if !matches!(i.state, InstanceState::Running | InstanceState::Pending) {
            return Err(format!(
                "a new instance is {:?}, not running or pending",
                i.state
            ));
        }
        let d = format!("backendRef {}", i.backend_ref);
        first = Some(i);
        Ok(d)
    })
    .await;
    let Some(first) = first else {
        r.fail("contract", "nothing else can run without an instance");
        cleanup(a, &made).await;
        return None;
    };
    let at = InstanceRef {
        sandbox_id: id.clone(),
        backend_ref: first.backend_ref.clone(),
    };
    r.check("create.idempotent", async {
        let again = a
            .create(&spec(&id, &installation))
            .await
            .map_err(|e| format!("{} ({e})", kind(&e)))?;
        expect_eq(
            "the second create's backendRef",
            &first.backend_ref,
            &again.backend_ref,
        )?;
        Ok("a second create answers the same instance".to_owned())
    })
    .await;
    // Readiness: a pending instance must become running.
    r.check("create.ready", async {
        let deadline = Instant::now() + Duration::from_secs(50);
        loop {
            match a.find(&id).await {
                Ok(Some(i)) if i.state == InstanceState::Running => return Ok("running".to_owned()),
                Ok(Some(i)) if i.state == InstanceState::Pending && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(250)).await
                }
                Ok(other) => return Err(format!("expected a running instance, found {other:?}")),
                Err(e) => return Err(format!("find: {} ({e})", kind(&e))),
            }
        }
    })
    .await;
    r.check("find", async {
        let got = a
            .find(&id)
            .await
            .map_err(|e| format!("{} ({e})", kind(&e)))?;
        let got = got.ok_or("the instance just created is not found")?;
        expect_eq("backendRef", &first.backend_ref, &got.backend_ref)?;
        let missing = a
            .find(&SandboxId::new())
            .await
            .map_err(|e| format!("find of an unknown id: {} ({e})", kind(&e)))?;
        expect_eq("find of an unknown id", None, missing)?;
        Ok("finds it; an unknown id is none".to_owned())
    })
    .await;
    r.check("list", async {
        let mine = a
            .list(&installation)
            .await
            .map_err(|e| format!("{} ({e})", kind(&e)))?;
        if !mine.iter().any(|i| i.sandbox_id == id) {
            return Err(format!("list of its installation lacks it: {mine:?}"));
        }
        let other = a
            .list(&InstallationId::new())
            .await
            .map_err(|e| format!("{} ({e})", kind(&e)))?;
        if other.iter().any(|i| i.sandbox_id == id) {
            return Err("list of another installation has it".to_owned());
        }
        Ok(format!(
            "{} instance(s) of this installation; none of another",
            mine.len()
        ))
    })
    .await;

    // Exec.
    let programs = dialect(a, &at).await;
    let p = match programs {
        Some(Dialect::Posix) => &POSIX,
        Some(Dialect::Fake) => &FAKE,
        None => {
            r.fail("exec.programs", "neither `sh -c 'exit 7'` nor `fake-exit 7` exits 7 with stderr through `sh -c`/`fake-stderr`");
            &POSIX
        }
    };
    r.check("exec.stdout", async {
        let res = exec(a, &at, cmd(&["echo", "hello", "conformance"]).command).await?;
        expect_eq("exit code", 0, res.exit_code)?;
        expect_eq("stdout", "hello conformance\n", res.stdout.as_str())?;
        expect_eq("stderr", "", res.stderr.as_str())?;
        Ok("echo: stdout, exit 0".to_owned())
    })
    .await;
    r.check("exec.exit-code", async {
        expect_eq(
            "false",
            1,
            exec(a, &at, cmd(&["false"]).command).await?.exit_code,
        )?;
        expect_eq("exit 3", 3, exec(a, &at, (p.exit)(3)).await?.exit_code)?;
        expect_eq(
            "true",
            0,
            exec(a, &at, cmd(&["true"]).command).await?.exit_code,
        )?;
        Ok("false 1, exit 3, true 0".to_owned())
    })
    .await;
    let fidelity = a.exec_fidelity();
    r.check("exec.stderr", async {
        let res = exec(a, &at, (p.stderr)("to-stderr")).await?;
        if !fidelity.buffered_stderr {
            // Declared: the provider answers both streams as one, in stdout.
            expect_eq(
                "stdout (stderr combined, as declared)",
                "to-stderr\n",
                res.stdout.as_str(),
            )?;
            expect_eq("stderr", "", res.stderr.as_str())?;
            return Ok("stderr combined into stdout, as the adapter declares".to_owned());
        }
        expect_eq("stderr", "to-stderr\n", res.stderr.as_str())?;
        expect_eq("stdout", "", res.stdout.as_str())?;
        Ok("stderr apart from stdout".to_owned())
    })
    .await;
    r.check("exec.env", async {
        let mut req = cmd(&["env"]);
        req.env
            .insert("CONFORMANCE_VAR".into(), "some value=x".into());
        let res = a
            .exec(&at, &req)
            .await
            .map_err(|e| format!("{} ({e})", kind(&e)))?;
        if !res
            .stdout
            .lines()
            .any(|l| l == "CONFORMANCE_VAR=some value=x")
        {
            return Err(format!(
                "`env` output lacks CONFORMANCE_VAR=some value=x: {:?}",
                res.stdout
            ));
        }
        Ok("the request's env reaches the command".to_owned())
    })
    .await;
    r.check("exec.cwd", async {
        let mut req = cmd(&["pwd"]);
        req.cwd = Some("/tmp".into());
        let res = a
            .exec(&at, &req)
            .await
            .map_err(|e| format!("{} ({e})", kind(&e)))?;
        expect_eq("pwd in /tmp", "/tmp\n", res.stdout.as_str())?;
        Ok("cwd /tmp".to_owned())
    })
    .await;
    r.check("exec.stdin", async {
        let mut req = cmd(&["cat"]);
        req.stdin = Some("line one\nline two".into());
        let res = a
            .exec(&at, &req)
            .await
            .map_err(|e| format!("{} ({e})", kind(&e)))?;
        if !fidelity.exact_line_endings {
            // Declared: line-framed output, so the final line gains its newline.
            expect_eq(
                "cat of stdin (line-framed, as declared)",
                "line one\nline two\n",
                res.stdout.as_str(),
            )?;
            return Ok(
                "stdin reaches the command (final line gains a newline, as declared)".to_owned(),
            );
        }
        expect_eq("cat of stdin", "line one\nline two", res.stdout.as_str())?;
        Ok("stdin reaches the command".to_owned())
    })
    .await;
    r.check("exec.timeout", async {
        let mut req = cmd(&["sleep", "10"]);
        req.timeout_seconds = Some(1);
        let started = Instant::now();
        let res = a
            .exec(&at, &req)
            .await
            .map_err(|e| format!("{} ({e})", kind(&e)))?;
        expect_eq(
            "exit code of a command past its timeout",
            124,
            res.exit_code,
        )?;
        let took = started.elapsed();
        if took > Duration::from_secs(6) {
            return Err(format!("a 1 s timeout took {} ms", took.as_millis()));
        }
        Ok(format!("exit 124 after {} ms", took.as_millis()))
    })
    .await;
    r.check("exec.not-found", async {
        let nowhere = InstanceRef {
            sandbox_id: SandboxId::new(),
            backend_ref: "conformance-no-such-instance".into(),
        };
        expect_kind(
            "exec on an instance that does not exist",
            "not_found",
            a.exec(&nowhere, &cmd(&["true"])).await,
        )
    })
    .await;

    // Streamed exec.
    if has("exec.stream") {
        r.check("exec.stream", async {
            // Every byte value, or, where the adapter declares text-only output, text with
            // characters of every UTF-8 length.
            let all: Vec<u8> = if fidelity.binary_output {
                (0..=255u8).cycle().take(3 * 256 + 7).collect()
            } else {
                "plain ascii, é, €, 😀 and a newline\n"
                    .repeat(20)
                    .into_bytes()
            };
            let what = if fidelity.binary_output {
                "binary"
            } else {
                "UTF-8 text (declared text-only)"
            };
            let mut req = cmd(&["cat"]);
            req.stdin_base64 = Some(base64::engine::general_purpose::STANDARD.encode(&all));
            let (out, err, code) = stream(a, &at, &req)
                .await
                .map_err(|e| format!("{} ({e})", kind(&e)))?;
            expect_eq("exit code", 0, code)?;
            if out != all {
                return Err(format!(
                    "stdout is not the {} {what} bytes sent ({} bytes back)",
                    all.len(),
                    out.len()
                ));
            }
            expect_eq("stderr", 0, err.len())?;
            Ok(format!("{} {what} bytes through, exit 0", out.len()))
        })
        .await;
        r.check("exec.stream.stderr", async {
            let req = ExecRequest {
                command: (p.stderr)("streamed"),
                timeout_seconds: Some(30),
                ..ExecRequest::default()
            };
            let (out, err, code) = stream(a, &at, &req)
                .await
                .map_err(|e| format!("{} ({e})", kind(&e)))?;
            expect_eq("stderr", b"streamed\n".as_slice(), err.as_slice())?;
            expect_eq("stdout", 0, out.len())?;
            expect_eq("exit code", 0, code)?;
            let code = stream(
                a,
                &at,
                &ExecRequest {
                    command: (p.exit)(5),
                    timeout_seconds: Some(30),
                    ..ExecRequest::default()
                },
            )
            .await
            .map_err(|e| format!("{} ({e})", kind(&e)))?
            .2;
            expect_eq("streamed exit 5", 5, code)?;
            Ok("stderr apart, exit codes kept".to_owned())
        })
        .await;
        r.check("exec.stream.timeout", async {
            let mut req = cmd(&["sleep", "10"]);
            req.timeout_seconds = Some(1);
            let (_, _, code) = stream(a, &at, &req)
                .await
                .map_err(|e| format!("{} ({e})", kind(&e)))?;
            expect_eq("exit code past the timeout", 124, code)?;
            Ok("exit 124".to_owned())
        })
        .await;
    } else {
        r.skip("exec.stream", "not declared");
    }

    // Files.
    if has("files") {
        let dir = format!("/tmp/conformance-{}", id.as_str().to_ascii_lowercase());
        let path = format!("{dir}/data.bin");
        let content: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        r.check("files.upload-download", async {
            let chunks: Vec<Result<Bytes, AdapterError>> = content
                .chunks(30_000)
                .map(|c| Ok(Bytes::copy_from_slice(c)))
                .collect();
            a.upload(
                &at,
                &path,
                Some(0o640),
                futures::stream::iter(chunks).boxed(),
            )
            .await
            .map_err(|e| format!("upload: {} ({e})", kind(&e)))?;
            let (total, back) = read_all(a, &at, &path, None)
                .await
                .map_err(|e| format!("download: {} ({e})", kind(&e)))?;
            if back != content {
                return Err(format!(
                    "downloaded {} bytes that are not the {} uploaded",
                    back.len(),
                    content.len()
                ));
            }
            if let Some(t) = total {
                expect_eq("total size", content.len() as u64, t)?;
            }
            Ok(format!("{} binary bytes both ways", content.len()))
        })
        .await;
        r.check("files.range", async {
            let (_, part) = read_all(
                a,
                &at,
                &path,
                Some(ByteRange {
                    start: 10,
                    end: Some(19),
                }),
            )
            .await
            .map_err(|e| format!("{} ({e})", kind(&e)))?;
            expect_eq("bytes 10-19", &content[10..20], part.as_slice())?;
            let (_, tail) = read_all(
                a,
                &at,
                &path,
                Some(ByteRange {
                    start: 99_990,
                    end: None,
                }),
            )
            .await
            .map_err(|e| format!("{} ({e})", kind(&e)))?;
            expect_eq("bytes 99990-", &content[99_990..], tail.as_slice())?;
            Ok("ranges 10-19 and 99990-".to_owned())
        })
        .await;
        r.check("files.list", async {
            let entries = a
                .list_files(&at, &dir, 1)
                .await
                .map_err(|e| format!("{} ({e})", kind(&e)))?;
            let e = entries
                .iter()
                .find(|e| e.path == path)
                .ok_or_else(|| format!("listing {dir} lacks {path}: {entries:?}"))?;
            expect_eq("type", crate::FileKind::File, e.kind)?;
            expect_eq("size", content.len() as u64, e.size)?;
            expect_eq("mode", 0o640, e.mode & 0o777)?;
            Ok("path, type, size and mode".to_owned())
        })
        .await;
        r.check("files.not-found", async {
            expect_kind(
                "download of a missing file",
                "path_not_found",
                read_all(a, &at, &format!("{dir}/missing"), None)
                    .await
                    .map(|(_, b)| b.len()),
            )
        })
        .await;
        r.check("files.delete", async {
            a.delete_file(&at, &path)
                .await
                .map_err(|e| format!("{} ({e})", kind(&e)))?;
            expect_kind(
                "download after delete",
                "path_not_found",
                read_all(a, &at, &path, None).await.map(|(_, b)| b.len()),
            )?;
            Ok("deleted; reads as path_not_found".to_owned())
        })
        .await;
    } else {
        r.skip("files", "not declared");
    }

    // Lifecycle.
    for (cap, down, up, state, down_name, up_name) in [
        (
            "lifecycle.pause",
            Verb::Pause,
            Verb::Resume,
            InstanceState::Paused,
            "pause",
            "resume",
        ),
        (
            "lifecycle.stop",
            Verb::Stop,
            Verb::Start,
            InstanceState::Stopped,
            "stop",
            "start",
        ),
    ] {
        if !has(cap) {
            r.skip(cap, "not declared");
            continue;
        }
        r.check(cap, async {
            verb(a, &at, down)
                .await
                .map_err(|e| format!("{down_name}: {} ({e})", kind(&e)))?;
            verb(a, &at, down).await.map_err(|e| {
                format!("{down_name} again (must be idempotent): {} ({e})", kind(&e))
            })?;
            let s = a
                .find(&id)
                .await
                .map_err(|e| format!("find: {e}"))?
                .map(|i| i.state);
            expect_eq(&format!("state after {down_name}"), Some(state), s)?;
            verb(a, &at, up)
                .await
                .map_err(|e| format!("{up_name}: {} ({e})", kind(&e)))?;
            verb(a, &at, up)
                .await
                .map_err(|e| format!("{up_name} again (must be idempotent): {} ({e})", kind(&e)))?;
            let s = a
                .find(&id)
                .await
                .map_err(|e| format!("find: {e}"))?
                .map(|i| i.state);
            expect_eq(
                &format!("state after {up_name}"),
                Some(InstanceState::Running),
                s,
            )?;
            expect_eq(
                &format!("exec after {up_name}"),
                0,
                exec(a, &at, cmd(&["true"]).command).await?.exit_code,
            )?;
            Ok(format!(
                "{down_name} → {state:?} → {up_name} → running, each idempotent"
            ))
        })
        .await;
    }

    // Snapshots.
    if has("snapshots") {
        let restored = SandboxId::new();
        made.push(restored.clone());
        r.check("snapshots", async {
            let snap_id = format!("snp_conformance{}", id.as_str().to_ascii_lowercase());
            let deadline = Instant::now() + Duration::from_secs(45);
            let info = loop {
                let s = a
                    .snapshot(&at, &snap_id)
                    .await
                    .map_err(|e| format!("snapshot: {} ({e})", kind(&e)))?;
                if s.ready {
                    break s;
                }
                if Instant::now() > deadline {
                    return Err("the snapshot never became ready".to_owned());
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            };
            let again = a
                .snapshot(&at, &snap_id)
                .await
                .map_err(|e| format!("snapshot again: {} ({e})", kind(&e)))?;
            expect_eq(
                "the same snapshot id's backendRef",
                &info.backend_ref,
                &again.backend_ref,
            )?;
            let mut req = spec(&restored, &installation);
            req.from_snapshot = Some(info.backend_ref.clone());
            a.create(&req)
                .await
                .map_err(|e| format!("create from the snapshot: {} ({e})", kind(&e)))?;
            a.delete(&restored)
                .await
                .map_err(|e| format!("delete the restored instance: {} ({e})", kind(&e)))?;
            a.delete_snapshot(&info.backend_ref)
                .await
                .map_err(|e| format!("delete snapshot: {} ({e})", kind(&e)))?;
            a.delete_snapshot(&info.backend_ref).await.map_err(|e| {
                format!(
                    "delete a deleted snapshot (must succeed): {} ({e})",
                    kind(&e)
                )
            })?;
            Ok("taken (idempotent), restored from, deleted twice".to_owned())
        })
        .await;
    } else {
        r.skip("snapshots", "not declared");
    }

    // Ports.
    if has("ports.expose") {
        r.check("ports.expose", async {
            let e = a
                .expose_port(&at, 8080, Some(Duration::from_secs(600)))
                .await
                .map_err(|e| format!("{} ({e})", kind(&e)))?;
            if !(e.url.starts_with("https://") || e.url.starts_with("http://")) {
                return Err(format!("not an http(s) URL: {}", e.url));
            }
            if e.expires_at.is_some_and(|t| t <= chrono::Utc::now()) {
                return Err("the URL has already expired".to_owned());
            }
            Ok("an http(s) URL, not expired".to_owned())
        })
        .await;
    } else {
        r.skip("ports.expose", "not declared");
    }

    // Warm instances: made with no env, tagged with their id, found, and claimable.
    if has(crate::WARM_CAPABILITY) {
        r.check("warm", async {
            let warm = SandboxId::new();
            let mut req = spec(&warm, &installation);
            req.env.clear();
            let made = a
                .create(&req)
                .await
                .map_err(|e| format!("create with no env: {} ({e})", kind(&e)))?;
            let outcome = async {
                expect_eq("created instance's sandbox id", &warm, &made.sandbox_id)?;
                let found = a
                    .find(&warm)
                    .await
                    .map_err(|e| format!("find: {} ({e})", kind(&e)))?
                    .ok_or("find does not return the warm instance")?;
                expect_eq("found backend ref", &made.backend_ref, &found.backend_ref)?;
                let at = InstanceRef {
                    sandbox_id: warm.clone(),
                    backend_ref: made.backend_ref.clone(),
                };
                a.claim(&at, 600)
                    .await
                    .map_err(|e| format!("claim: {} ({e})", kind(&e)))?;
                a.claim(&at, 600)
                    .await
                    .map_err(|e| format!("claim again (must succeed): {} ({e})", kind(&e)))?;
                let ran = exec(a, &at, vec!["true".to_owned()]).await?;
                expect_eq("exit code of `true` after the claim", 0, ran.exit_code)?;
                Ok::<_, String>(())
            }
            .await;
            let deleted = a.delete(&warm).await;
            outcome?;
            deleted.map_err(|e| format!("delete: {} ({e})", kind(&e)))?;
            Ok("made with no env, found by its id, claimed twice, runs".to_owned())
        })
        .await;
    } else {
        r.skip("warm", "not declared");
    }

    // Capability honesty: what is not declared must be refused as such.
    for cap in [
        "exec.stream",
        "files",
        "lifecycle.pause",
        "lifecycle.stop",
        "snapshots",
        "ports.expose",
    ] {
        if has(cap) {
            continue;
        }
        let name = format!("honesty.{cap}");
        r.check(&name, async {
            let got: Result<(), AdapterError> = match cap {
                "exec.stream" => stream(a, &at, &cmd(&["true"])).await.map(drop),
                "files" => read_all(a, &at, "/etc/hostname", None).await.map(drop),
                "lifecycle.pause" => a.pause(&at).await,
                "lifecycle.stop" => a.stop(&at).await,
                "snapshots" => a.snapshot(&at, "snp_conformancehonesty").await.map(drop),
                _ => a.expose_port(&at, 8080, None).await.map(drop),
            };
            expect_kind(&format!("undeclared {cap}"), "unsupported_operation", got)
        })
        .await;
    }

    // Delete, twice; then it is gone everywhere.
    r.check("delete", async {
        a.delete(&id)
            .await
            .map_err(|e| format!("{} ({e})", kind(&e)))?;
        a.delete(&id)
            .await
            .map_err(|e| format!("delete again (must succeed): {} ({e})", kind(&e)))?;
        let found = a
            .find(&id)
            .await
            .map_err(|e| format!("find: {} ({e})", kind(&e)))?;
        expect_eq("find after delete", None, found)?;
        let listed = a
            .list(&installation)
            .await
            .map_err(|e| format!("list: {} ({e})", kind(&e)))?;
        if listed.iter().any(|i| i.sandbox_id == id) {
            return Err("list still has the deleted instance".to_owned());
        }
        expect_kind(
            "exec after delete",
            "not_found",
            a.exec(&at, &cmd(&["true"])).await,
        )?;
        Ok("gone from find and list; exec is not_found; delete is idempotent".to_owned())
    })
    .await;
    made.retain(|m| m != &id);
    cleanup(a, &made).await;
    programs
}

#[derive(Clone, Copy)]
enum Verb {
    Pause,
    Resume,
    Stop,
    Start,
}

async fn verb(a: &dyn Adapter, at: &InstanceRef, v: Verb) -> Result<(), AdapterError> {
    match v {
        Verb::Pause => a.pause(at).await,
        Verb::Resume => a.resume(at).await,
        Verb::Stop => a.stop(at).await,
        Verb::Start => a.start(at).await,
    }
}

async fn cleanup(a: &dyn Adapter, ids: &[SandboxId]) {
    for id in ids {
        if let Err(e) = a.delete(id).await {
            tracing::warn!(sandbox = %id, error = %e, "conformance: cleanup delete failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_only_to_this_machine() {
        assert!(is_loopback_url("http://127.0.0.1:9/"));
        assert!(is_loopback_url("http://[::1]:9"));
        assert!(is_loopback_url("http://localhost:9"));
        assert!(!is_loopback_url("http://10.0.0.1:9"));
        assert!(!is_loopback_url("https://127.0.0.1:9"));
        assert_eq!(
            adapter_base("http://h:1/adapter/v1/"),
            "http://h:1/adapter/v1"
        );
    }

    #[tokio::test]
    async fn the_fake_adapter_conforms_in_process() {
        let caps: Vec<String> = [
            "exec",
            "exec.stream",
            "files",
            "lifecycle.pause",
            "lifecycle.stop",
            "snapshots",
            "ports.expose",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let fake = crate::fake::FakeAdapter::new(crate::fake::FakeConfig {
            capabilities: caps.clone(),
            ..crate::fake::FakeConfig::default()
        });
        let report = run(&fake, &caps).await;
        assert!(report.ok(), "{}", report.table());
        assert_eq!(report.dialect, Some(Dialect::Fake));
    }
}
