//! `differently org|project|key|quota|policy …`: tenancy over the API. Creating
//! organizations, setting quotas and policies need an admin key; an organization's key
//! manages its own projects and keys.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{ArgGroup, Args, Subcommand};
use differently_client::tenancy::Scope;
use differently_client::{Client, CreateKey, Quota, UpdateOrg};
use futures::TryStreamExt;

use super::output::{print_line, Column};
use super::{fail, finish, to_json, CliError, Output, Printer, Target};

const ORG_COLUMNS: &[Column] = &[
    ("ID", "id"),
    ("NAME", "name"),
    ("STATUS", "status"),
    ("CREATED", "createdAt"),
];
const PROJECT_COLUMNS: &[Column] = &[
    ("ID", "id"),
    ("NAME", "name"),
    ("ORG", "orgId"),
    ("CREATED", "createdAt"),
];
const KEY_COLUMNS: &[Column] = &[
    ("ID", "id"),
    ("NAME", "name"),
    ("PROJECT", "projectId"),
    ("SCOPES", "scopes"),
    ("EXPIRES", "expiresAt"),
    ("REVOKED", "revokedAt"),
];

/// Organization commands.
#[derive(Subcommand, Debug)]
pub enum OrgCommand {
    /// Create an organization (admin).
    Create {
        name: String,
        /// Sent as `Idempotency-Key`.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// List organizations (an organization's key sees its own).
    List,
    /// Read an organization.
    Get { id: String },
    /// Rename, suspend or reactivate an organization (admin).
    Update {
        id: String,
        /// A new name.
        #[arg(long)]
        name: Option<String>,
        /// `active` or `suspended`.
        #[arg(long)]
        status: Option<String>,
    },
    /// Delete an organization that has nothing left in it (admin).
    Delete { id: String },
}

/// Project commands.
#[derive(Subcommand, Debug)]
pub enum ProjectCommand {
    /// Create a project.
    Create {
        name: String,
        /// Its organization (admin keys; default: the key's own).
        #[arg(long)]
        org: Option<String>,
        /// Sent as `Idempotency-Key`.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// List an organization's projects.
    List {
        /// The organization (admin keys; default: the key's own).
        #[arg(long)]
        org: Option<String>,
    },
    /// Read a project.
    Get { id: String },
    /// Rename a project.
    Rename { id: String, name: String },
    /// Delete a project that has nothing left in it.
    Delete { id: String },
}

/// API key commands.
#[derive(Subcommand, Debug)]
pub enum KeyCommand {
    /// Print a new random key, offline: an API key (for DIFFERENTLY_BOOTSTRAP_KEY), or with
    /// `--audit` or `--secrets` a 32-byte hex key (DIFFERENTLY_AUDIT_KEY,
    /// DIFFERENTLY_SECRETS_KEY).
    Generate {
        /// An audit chain HMAC key (64 hex characters).
        #[arg(long, conflicts_with = "secrets")]
        audit: bool,
        /// A secrets sealing key (64 hex characters).
        #[arg(long)]
        secrets: bool,
    },
    /// Create an API key; its secret is printed this once (`-o id` prints only the secret).
    Create {
        name: String,
        /// A scope, repeatable: sandboxes:read, sandboxes:write, sandboxes:exec, files:read,
        /// files:write, admin, …
        #[arg(long = "scope", required = true)]
        scopes: Vec<String>,
        /// Its organization (admin keys; default: the key's own).
        #[arg(long)]
        org: Option<String>,
        /// Bind it to one project.
        #[arg(long)]
        project: Option<String>,
        /// RFC 3339 time at which it stops working.
        #[arg(long)]
        expires_at: Option<String>,
        /// Sent as `Idempotency-Key`.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// List an organization's keys (records, never secrets).
    List {
        /// The organization (admin keys; default: the key's own).
        #[arg(long)]
        org: Option<String>,
    },
    /// Read a key's record.
    Get { id: String },
    /// Revoke a key.
    Revoke { id: String },
    /// Print the `e2b_` alias of a key, offline, for E2B SDKs that refuse other key shapes
    /// (docs/e2b-facade.md): of the key piped on standard input, else of the configured key (`--key`, `DIFFERENTLY_API_KEY`, the profile). The alias is the key
    /// spelled in hex: it works as the key on `/e2b` and is revoked with it.
    E2bAlias,
}

/// Which organization or project a quota or policy is about.
#[derive(Args, Debug)]
#[command(group(ArgGroup::new("scope").required(true).args(["org", "project"])))]
pub struct TenantScope {
    /// An organization.
    #[arg(long)]
    pub org: Option<String>,
    /// A project.
    #[arg(long)]
    pub project: Option<String>,
}

impl TenantScope {
    fn scope(&self) -> Scope<'_> {
        match (&self.org, &self.project) {
            (Some(o), _) => Scope::Org(o),
            (None, Some(p)) => Scope::Project(p),
            (None, None) => Scope::Global,
        }
    }
}

/// Quota commands.
#[derive(Subcommand, Debug)]
pub enum QuotaCommand {
    /// An organization's or project's quota, the limits in force, and usage.
    Get {
        #[command(flatten)]
        scope: TenantScope,
    },
    /// Replace an organization's or project's quota (admin); an absent limit does not restrict.
    Set {
        #[command(flatten)]
        scope: TenantScope,
        /// Sandboxes active at once.
        #[arg(long)]
        max_active: Option<u64>,
        /// vCPUs in use at once.
        #[arg(long)]
        max_cpu: Option<u64>,
        /// Memory in use at once, MiB.
        #[arg(long)]
        max_memory_mib: Option<u64>,
        /// Disk in use at once, GiB.
        #[arg(long)]
        max_disk_gib: Option<u64>,
        /// Sandboxes waiting for room at once.
        #[arg(long)]
        max_queued: Option<u64>,
        /// How long one may wait for room, in seconds.
        #[arg(long)]
        max_queue_seconds: Option<u64>,
    },
}

/// Placement policy commands.
#[derive(Subcommand, Debug)]
pub enum PolicyCommand {
    /// The placement policy of the installation, an organization or a project.
    Get {
        #[command(flatten)]
        scope: PolicyScope,
    },
    /// Replace a placement policy (admin) with a JSON document (docs/placement.md).
    Set {
        #[command(flatten)]
        scope: PolicyScope,
        /// The policy's JSON file (`-` for standard input).
        #[arg(long)]
        file: PathBuf,
    },
}

/// Which level a policy is at.
#[derive(Args, Debug)]
#[command(group(ArgGroup::new("level").required(true).args(["global", "org", "project"])))]
pub struct PolicyScope {
    /// The installation's.
    #[arg(long)]
    pub global: bool,
    /// An organization's.
    #[arg(long)]
    pub org: Option<String>,
    /// A project's.
    #[arg(long)]
    pub project: Option<String>,
}

impl PolicyScope {
    fn scope(&self) -> Scope<'_> {
        match (&self.org, &self.project) {
            (Some(o), _) => Scope::Org(o),
            (None, Some(p)) => Scope::Project(p),
            (None, None) => Scope::Global,
        }
    }
}

fn with_client(target: &Target) -> Result<(Client, Printer), CliError> {
    Ok((target.client()?, target.printer()))
}

/// Runs an org command.
pub async fn org(target: &Target, command: OrgCommand) -> ExitCode {
    let (c, p) = match with_client(target) {
        Ok(x) => x,
        Err(e) => return fail(&e),
    };
    finish(
        async {
            let v = match command {
                OrgCommand::Create {
                    name,
                    idempotency_key,
                } => to_json(&c.create_org(&name, idempotency_key.as_deref()).await?),
                OrgCommand::List => {
                    let items: Vec<_> = c.list_orgs().try_collect().await?;
                    return p.print_list(items.iter().map(to_json).collect(), ORG_COLUMNS);
                }
                OrgCommand::Get { id } => to_json(&c.get_org(&id).await?),
                OrgCommand::Update { id, name, status } => {
                    if name.is_none() && status.is_none() {
                        return Err(CliError::Usage(
                            "nothing to change: give --name or --status".into(),
                        ));
                    }
                    to_json(&c.update_org(&id, &UpdateOrg { name, status }).await?)
                }
                OrgCommand::Delete { id } => {
                    c.delete_org(&id).await?;
                    return Ok(());
                }
            };
            p.print(&v, ORG_COLUMNS)
        }
        .await,
    )
}

/// Runs a project command.
pub async fn project(target: &Target, command: ProjectCommand) -> ExitCode {
    let (c, p) = match with_client(target) {
        Ok(x) => x,
        Err(e) => return fail(&e),
    };
    finish(
        async {
            let v = match command {
                ProjectCommand::Create {
                    name,
                    org,
                    idempotency_key,
                } => to_json(
                    &c.create_project(org.as_deref(), &name, idempotency_key.as_deref())
                        .await?,
                ),
                ProjectCommand::List { org } => {
                    let items: Vec<_> = c.list_projects(org.as_deref()).try_collect().await?;
                    return p.print_list(items.iter().map(to_json).collect(), PROJECT_COLUMNS);
                }
                ProjectCommand::Get { id } => to_json(&c.get_project(&id).await?),
                ProjectCommand::Rename { id, name } => {
                    to_json(&c.rename_project(&id, &name).await?)
                }
                ProjectCommand::Delete { id } => {
                    c.delete_project(&id).await?;
                    return Ok(());
                }
            };
            p.print(&v, PROJECT_COLUMNS)
        }
        .await,
    )
}

/// Runs a key command (`generate` needs no API).
pub async fn key(target: &Target, command: KeyCommand) -> ExitCode {
    if let KeyCommand::Generate { audit, secrets } = command {
        if audit || secrets {
            return match differently_store::audit::AuditKey::random() {
                Ok(k) => {
                    print_line(&k.to_hex());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("differently: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        print_line(&differently_api::generate_key());
        return ExitCode::SUCCESS;
    }
    if let KeyCommand::E2bAlias = command {
        return match e2b_alias(target) {
            Ok(alias) => {
                print_line(&alias);
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e),
        };
    }
    let (c, p) = match with_client(target) {
        Ok(x) => x,
        Err(e) => return fail(&e),
    };
    finish(
        async {
            let v = match command {
                KeyCommand::Generate { .. } | KeyCommand::E2bAlias => return Ok(()),
                KeyCommand::Create {
                    name,
                    scopes,
                    org,
                    project,
                    expires_at,
                    idempotency_key,
                } => {
                    let req = CreateKey {
                        org_id: org,
                        project_id: project,
                        name,
                        scopes,
                        expires_at,
                    };
                    let created = c.create_key(&req, idempotency_key.as_deref()).await?;
                    if p.output == Output::Id {
                        // The secret is what a script needs from a new key.
                        print_line(&created.key);
                        return Ok(());
                    }
                    to_json(&created)
                }
                KeyCommand::List { org } => {
                    let items: Vec<_> = c.list_keys(org.as_deref()).try_collect().await?;
                    return p.print_list(items.iter().map(to_json).collect(), KEY_COLUMNS);
                }
                KeyCommand::Get { id } => to_json(&c.get_key(&id).await?),
                KeyCommand::Revoke { id } => to_json(&c.revoke_key(&id).await?),
            };
            p.print(&v, KEY_COLUMNS)
        }
        .await,
    )
}

/// The alias of the key on standard input (when it is not a terminal), else of the
/// configured key. Nothing is sent anywhere; the key is never printed.
fn e2b_alias(target: &Target) -> Result<String, CliError> {
    use std::io::{BufRead, IsTerminal};
    let stdin = std::io::stdin();
    let mut piped = String::new();
    if !stdin.is_terminal() {
        stdin
            .lock()
            .read_line(&mut piped)
            .map_err(|e| CliError::io("reading the key from standard input", e))?;
    }
    let key = match piped.trim() {
        "" => super::profile::resolve(target)?.key.ok_or_else(|| {
            CliError::Usage(
                "no key: pipe one on standard input, or set DIFFERENTLY_API_KEY or `differently login`"
                    .into(),
            )
        })?,
        k => k.to_owned(),
    };
    if differently_api::auth::parse_key(&key).is_none() {
        return Err(CliError::Usage(
            "not a Differently API key (dly_key_…): its alias would be refused".into(),
        ));
    }
    Ok(differently_api::facade::e2b::alias::to_alias(&key))
}

/// Runs a quota command.
pub async fn quota(target: &Target, command: QuotaCommand) -> ExitCode {
    let (c, p) = match with_client(target) {
        Ok(x) => x,
        Err(e) => return fail(&e),
    };
    finish(
        async {
            let v = match command {
                QuotaCommand::Get { scope } => c.quota(scope.scope()).await?,
                QuotaCommand::Set {
                    scope,
                    max_active,
                    max_cpu,
                    max_memory_mib,
                    max_disk_gib,
                    max_queued,
                    max_queue_seconds,
                } => {
                    let q = Quota {
                        max_active,
                        max_cpu,
                        max_memory_mib,
                        max_disk_gib,
                        max_queued,
                        max_queue_seconds,
                        max_sandbox: None,
                    };
                    c.put_quota(scope.scope(), &q).await?
                }
            };
            p.print(&to_json(&v), &[])
        }
        .await,
    )
}

/// Runs a policy command.
pub async fn policy(target: &Target, command: PolicyCommand) -> ExitCode {
    let (c, p) = match with_client(target) {
        Ok(x) => x,
        Err(e) => return fail(&e),
    };
    finish(
        async {
            let v = match command {
                PolicyCommand::Get { scope } => c.policy(scope.scope()).await?,
                PolicyCommand::Set { scope, file } => {
                    let policy = read_policy(&file)?;
                    c.put_policy(scope.scope(), &policy).await?
                }
            };
            p.print(&to_json(&v), &[])
        }
        .await,
    )
}

/// The file's JSON as it is: the API refuses a field it does not know, naming it.
fn read_policy(file: &std::path::Path) -> Result<serde_json::Value, CliError> {
    let text = if file.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| CliError::io("reading the policy from standard input", e))?;
        s
    } else {
        std::fs::read_to_string(file).map_err(|e| CliError::io(file.display().to_string(), e))?
    };
    serde_json::from_str(&text).map_err(|e| {
        CliError::Usage(format!(
            "--file {}: not a policy document ({e}); see docs/placement.md",
            file.display()
        ))
    })
}
