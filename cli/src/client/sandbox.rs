//! `differently sandbox …`: create, read, wait for, run commands in and end sandboxes.

use std::io::Write;
use std::process::ExitCode;

use clap::Subcommand;
use reqwest::Method;
use serde_json::{json, Map, Value};

use super::{fail, pairs, percent_encode, print_json, Client, ClientError, Target};

/// Sandbox commands.
// Parsed once per process: the size of the largest variant costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum SandboxCommand {
    /// Create a sandbox (every flag is optional: `{}` gets the defaults).
    Create {
        /// Project (required for an organization-wide key).
        #[arg(long)]
        project: Option<String>,
        /// Resource profile: small, medium, large, xlarge.
        #[arg(long)]
        profile: Option<String>,
        /// Template (image) to start from; the pool's default when omitted.
        #[arg(long)]
        template: Option<String>,
        /// vCPUs (overrides the profile's).
        #[arg(long)]
        cpu: Option<u32>,
        /// Memory in MiB (overrides the profile's).
        #[arg(long)]
        memory_mib: Option<u64>,
        /// Disk in GiB (overrides the profile's).
        #[arg(long)]
        disk_gib: Option<u64>,
        /// `KEY=VALUE`, repeatable.
        #[arg(long = "label")]
        labels: Vec<String>,
        /// `KEY=VALUE`, repeatable (values never appear in answers).
        #[arg(long = "env")]
        env: Vec<String>,
        /// Capability the pool must have, repeatable (e.g. `exec.stream`).
        #[arg(long = "capability")]
        capabilities: Vec<String>,
        /// Data classification the placement policy reads (e.g. `confidential`).
        #[arg(long)]
        classification: Option<String>,
        /// Region the sandbox must run in (only pools of that region are eligible).
        #[arg(long)]
        region: Option<String>,
        /// Seconds until it is deleted, whatever it is doing.
        #[arg(long)]
        ttl_seconds: Option<u64>,
        /// Seconds without activity before it is paused (or stopped); 1–2592000.
        #[arg(long)]
        idle_timeout_seconds: Option<u64>,
        /// Create from a ready snapshot (restore or fork).
        #[arg(long)]
        from_snapshot: Option<String>,
        /// Sent as `Idempotency-Key`: a retry with the same key creates nothing new.
        #[arg(long)]
        idempotency_key: Option<String>,
        /// Wait until it runs (or ends) and print it then; exit 1 unless it runs.
        #[arg(long)]
        wait: bool,
        /// How long `--wait` waits, in seconds.
        #[arg(long, default_value_t = 120)]
        wait_seconds: u64,
    },
    /// List sandboxes the key can see.
    List {
        /// Only this status (`queued`, `provisioning`, `running`, `paused`, `stopped`, …).
        #[arg(long)]
        status: Option<String>,
        /// Only sandboxes with this label, `KEY=VALUE`.
        #[arg(long)]
        label: Option<String>,
        /// Only this project's.
        #[arg(long)]
        project: Option<String>,
        /// Most items in one page.
        #[arg(long)]
        limit: Option<u32>,
        /// The `nextCursor` of the previous page.
        #[arg(long)]
        cursor: Option<String>,
    },
    /// Read one sandbox.
    Get { id: String },
    /// Wait until a sandbox has a status (default `running`) or a final one.
    Wait {
        id: String,
        /// The status to wait for.
        #[arg(long, default_value = "running")]
        status: String,
        /// Give up after this many seconds (exit 1).
        #[arg(long, default_value_t = 120)]
        timeout_seconds: u64,
    },
    /// Run a command; its stdout and stderr are written out and its exit code is ours.
    Exec {
        id: String,
        /// Working directory.
        #[arg(long)]
        cwd: Option<String>,
        /// `KEY=VALUE`, repeatable.
        #[arg(long = "env")]
        env: Vec<String>,
        /// Kill the command after this many seconds (exit 124).
        #[arg(long)]
        timeout_seconds: Option<u64>,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Why the sandbox runs where it runs.
    Placement { id: String },
    /// Pause a running sandbox.
    Pause { id: String },
    /// Resume a paused sandbox.
    Resume { id: String },
    /// Stop a sandbox (frees its CPU and memory quota).
    Stop { id: String },
    /// Start a stopped sandbox.
    Start { id: String },
    /// Delete a sandbox.
    Delete { id: String },
}

/// Runs a sandbox command; the process's exit code.
pub async fn run(target: &Target, command: SandboxCommand) -> ExitCode {
    let client = match Client::new(target) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    if let SandboxCommand::Exec {
        id,
        cwd,
        env,
        timeout_seconds,
        command,
    } = command
    {
        return exec(&client, &id, cwd, &env, timeout_seconds, command).await;
    }
    match answer(&client, command)
        .await
        .and_then(|v| target.output.print(&v))
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

/// The fields that were given (not null), as a JSON object: a flag left out is a field the
/// API fills with its default.
fn present<const N: usize>(fields: [(&str, Value); N]) -> Map<String, Value> {
    fields
        .into_iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
}

fn object_or_null(m: Map<String, Value>) -> Value {
    if m.is_empty() {
        Value::Null
    } else {
        Value::Object(m)
    }
}

fn array_or_null(items: Vec<String>) -> Value {
    if items.is_empty() {
        Value::Null
    } else {
        json!(items)
    }
}

fn path(id: &str, rest: &str) -> String {
    format!("/v1/sandboxes/{}{rest}", percent_encode(id))
}

async fn answer(c: &Client, command: SandboxCommand) -> Result<Value, ClientError> {
    match command {
        SandboxCommand::Create {
            project,
            profile,
            template,
            cpu,
            memory_mib,
            disk_gib,
            labels,
            env,
            capabilities,
            classification,
            region,
            ttl_seconds,
            idle_timeout_seconds,
            from_snapshot,
            idempotency_key,
            wait,
            wait_seconds,
        } => {
            let resources = present([
                ("cpu", json!(cpu)),
                ("memoryMiB", json!(memory_mib)),
                ("diskGiB", json!(disk_gib)),
            ]);
            let labels = pairs("label", &labels)?;
            let env = pairs("env", &env)?;
            let body = present([
                ("projectId", json!(project)),
                ("profile", json!(profile)),
                ("template", json!(template)),
                ("resources", object_or_null(resources)),
                ("labels", object_or_null(labels)),
                ("env", object_or_null(env)),
                ("capabilities", array_or_null(capabilities)),
                ("classification", json!(classification)),
                ("region", json!(region)),
                ("ttlSeconds", json!(ttl_seconds)),
                ("idleTimeoutSeconds", json!(idle_timeout_seconds)),
                ("fromSnapshot", json!(from_snapshot)),
            ]);
            let headers: Vec<(&str, &str)> = idempotency_key
                .as_deref()
                .map(|k| ("idempotency-key", k))
                .into_iter()
                .collect();
            let created = c
                .call(
                    Method::POST,
                    "/v1/sandboxes",
                    Some(&Value::Object(body)),
                    &headers,
                )
                .await?;
            if !wait {
                return Ok(created);
            }
            let id = created["id"]
                .as_str()
                .ok_or_else(|| ClientError::Transport("the create answer has no id".into()))?;
            let done = wait_for(c, id, "running", wait_seconds).await?;
            if done["status"] != "running" {
                print_json(&done);
                return Err(ClientError::Outcome(format!(
                    "sandbox {id} is {} (not running) after the wait",
                    done["status"]
                )));
            }
            Ok(done)
        }
        SandboxCommand::List {
            status,
            label,
            project,
            limit,
            cursor,
        } => {
            let mut q: Vec<String> = Vec::new();
            let params = [
                ("status", status),
                ("label", label),
                ("projectId", project),
                ("limit", limit.map(|l| l.to_string())),
                ("cursor", cursor),
            ];
            for (k, v) in params {
                if let Some(v) = v {
                    q.push(format!("{k}={}", percent_encode(&v)));
                }
            }
            let query = if q.is_empty() {
                String::new()
            } else {
                format!("?{}", q.join("&"))
            };
            c.call(Method::GET, &format!("/v1/sandboxes{query}"), None, &[])
                .await
        }
        SandboxCommand::Get { id } => c.call(Method::GET, &path(&id, ""), None, &[]).await,
        SandboxCommand::Wait {
            id,
            status,
            timeout_seconds,
        } => wait_for(c, &id, &status, timeout_seconds).await,
        SandboxCommand::Placement { id } => {
            c.call(Method::GET, &path(&id, "/placement"), None, &[])
                .await
        }
        SandboxCommand::Pause { id } => lifecycle(c, &id, "pause").await,
        SandboxCommand::Resume { id } => lifecycle(c, &id, "resume").await,
        SandboxCommand::Stop { id } => lifecycle(c, &id, "stop").await,
        SandboxCommand::Start { id } => lifecycle(c, &id, "start").await,
        SandboxCommand::Delete { id } => c.call(Method::DELETE, &path(&id, ""), None, &[]).await,
        SandboxCommand::Exec { .. } => Err(ClientError::Usage("exec is run on its own".into())),
    }
}

async fn lifecycle(c: &Client, id: &str, what: &str) -> Result<Value, ClientError> {
    c.call(Method::POST, &path(id, &format!("/{what}")), None, &[])
        .await
}

/// Waits (in calls of at most 300 s, the API's bound) until `status` or a final one.
async fn wait_for(c: &Client, id: &str, status: &str, seconds: u64) -> Result<Value, ClientError> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
    loop {
        let left = deadline
            .saturating_duration_since(std::time::Instant::now())
            .as_secs()
            .clamp(1, 300);
        let rest = format!(
            "/wait?status={}&timeoutSeconds={left}",
            percent_encode(status)
        );
        let v = c.call(Method::GET, &path(id, &rest), None, &[]).await?;
        let s = v["status"].as_str().unwrap_or_default();
        let ended = matches!(s, "terminated" | "failed");
        if s == status || ended || std::time::Instant::now() >= deadline {
            return Ok(v);
        }
    }
}

async fn exec(
    c: &Client,
    id: &str,
    cwd: Option<String>,
    env: &[String],
    timeout_seconds: Option<u64>,
    command: Vec<String>,
) -> ExitCode {
    let env = match pairs("env", env) {
        Ok(e) => e,
        Err(e) => return fail(&e),
    };
    let mut body = json!({ "command": command, "env": env });
    if let Some(cwd) = cwd {
        body["cwd"] = json!(cwd);
    }
    if let Some(t) = timeout_seconds {
        body["timeoutSeconds"] = json!(t);
    }
    let result = match c
        .call(Method::POST, &path(id, "/exec"), Some(&body), &[])
        .await
    {
        Ok(v) => v,
        Err(e) => return fail(&e),
    };
    let out = result["stdout"].as_str().unwrap_or_default();
    let err = result["stderr"].as_str().unwrap_or_default();
    // A closed pipe on our side is the reader's choice, not a failure of the command.
    let _ = std::io::stdout().write_all(out.as_bytes());
    let _ = std::io::stderr().write_all(err.as_bytes());
    for (flag, stream) in [("stdoutTruncated", "stdout"), ("stderrTruncated", "stderr")] {
        if result[flag] == true {
            eprintln!("differently: {stream} was cut at 1 MiB (the command ran to its end)");
        }
    }
    let code = result["exitCode"].as_i64().unwrap_or(1);
    ExitCode::from(u8::try_from(code.clamp(0, 255)).unwrap_or(1))
}
