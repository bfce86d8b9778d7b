//! `VercelAdapter`: sandboxes on Vercel Sandbox (Firecracker microVMs run by Vercel, so pools
//! of this kind are always `external`).
//!
//! A Vercel sandbox is *named*; each run of it is a *session*. The adapter names each sandbox
//! after Differently's sandbox id (`differently-<id>`), which makes `create` idempotent by
//! construction (a repeat finds the name, or gets a 409 for it), and tags it with the sandbox
//! and installation ids so `list` finds orphans. The backend ref is the name; the current
//! session is looked up from it. Commands stream as NDJSON; files go up as a gzip tar;
//! listing and removal run as commands (Vercel has no endpoints for them).
//!
//! The access token, read through its reference at call time, goes only to the API, as
//! `Authorization: Bearer`. See `docs/providers.md`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use differently_core::exec::ExecRequest;
use differently_core::ids::InstallationId;
use differently_core::SandboxId;
use tokio::sync::mpsc;

use crate::exec_output::{checked_stdin, timed_exit};
use crate::kit::paths::unique;
use crate::kit::tags::{self, create_tags, of_installation, Tagged};
use crate::poll::Poll;
use crate::{
    Adapter, AdapterError, ByteRange, ByteStream, Capability, CreateInstance, Download, Endpoint,
    ExecEvent, ExecExit, FileEntry, FileKind, Instance, InstanceRef, InstanceState,
};

mod api;
mod commands;
pub mod config;
pub mod tar;

/// The tags every sandbox carries (the kit's, under the names this module always had).
pub use crate::kit::tags::{INSTALLATION_TAG as TAG_INSTALLATION, SANDBOX_TAG as TAG_SANDBOX};
pub use crate::settings::ConfigError;
pub use config::{Settings, VercelConfig};

/// How long after Differently's own expiry Vercel's timeout fires.
const BACKSTOP_MARGIN: u64 = 300;
/// Largest upload: `fs/write` takes a tar, whose header needs the size, so a body is held
/// whole before it is sent.
pub const MAX_UPLOAD_BYTES: usize = 256 * 1024 * 1024;

/// One Vercel Sandbox pool.
pub struct VercelAdapter {
    settings: Settings,
    api: api::Api,
    /// Current session per sandbox name.
    sessions: Mutex<HashMap<String, String>>,
}

/// The Vercel sandbox name of Differently's sandbox `id` (lower case, `-` for `_`).
pub fn sandbox_name(id: &SandboxId) -> String {
    let body: String = id
        .as_str()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    format!("differently-{body}")
}

fn state(status: &str) -> InstanceState {
    match status {
        "running" => InstanceState::Running,
        "stopping" | "stopped" | "snapshotting" => InstanceState::Stopped,
        "failed" | "aborted" => InstanceState::Failed,
        _ => InstanceState::Pending,
    }
}

fn is_stopped(e: &AdapterError) -> bool {
    matches!(e, AdapterError::Transient(m) if m.starts_with("stopped:"))
}

/// Exit codes of the helper scripts below.
const NO_SUCH_PATH: i32 = 44;
const NOT_A_DIR: i32 = 45;
const NOT_EMPTY: i32 = 46;

crate::kit::from_settings!(VercelAdapter, "vercel", VercelConfig => Settings, |settings, credentials| {
    let api = api::Api::new(&settings, credentials)
        .map_err(|e| crate::kit::client::config_error(e, "apiURL"))?;
    Ok(VercelAdapter {
        settings,
        api,
        sessions: Mutex::new(HashMap::new()),
    })
});

impl VercelAdapter {
    fn remember(&self, name: &str, session: &str) {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_owned(), session.to_owned());
    }

    fn forget(&self, name: &str) {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
    }

    fn session_of(a: &api::Answer) -> Option<String> {
        a.session
            .as_ref()
            .map(|s| s.id.clone())
            .or_else(|| a.sandbox.current_session_id.clone())
    }

    /// The current session of sandbox `name`.
    async fn session(&self, name: &str) -> Result<String, AdapterError> {
        let cached = self
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned();
        if let Some(s) = cached {
            return Ok(s);
        }
        let a = self.api.get(name, false).await?;
        if state(&a.sandbox.status) == InstanceState::Stopped {
            return Err(AdapterError::permanent(
                "the Vercel sandbox is stopped; start it first".to_owned(),
            ));
        }
        let s = Self::session_of(&a)
            .ok_or_else(|| AdapterError::transient("the Vercel sandbox has no session yet"))?;
        self.remember(name, &s);
        Ok(s)
    }

    /// Starts a stopped sandbox (a new session) and waits for it.
    async fn resume(&self, name: &str) -> Result<(), AdapterError> {
        let a = self.api.get(name, true).await?;
        let s = Self::session_of(&a)
            .ok_or_else(|| AdapterError::transient("the resumed sandbox has no session"))?;
        self.remember(name, &s);
        self.wait_running(&s).await
    }

    /// Polls the session until it runs.
    async fn wait_running(&self, session: &str) -> Result<(), AdapterError> {
        let timeout = self.settings.ready_timeout;
        let mut poll = Poll::new(self.settings.poll_interval, timeout);
        loop {
            let s = self.api.session(session).await?;
            match state(&s.status) {
                InstanceState::Running => return Ok(()),
                InstanceState::Failed | InstanceState::Stopped => {
                    return Err(AdapterError::permanent(format!(
                        "the Vercel session is {}",
                        s.status
                    )))
                }
                _ => {}
            }
            if poll.expired() {
                return Err(AdapterError::transient(format!(
                    "the Vercel session is still {} after {} s",
                    s.status,
                    timeout.as_secs()
                )));
            }
            poll.pause().await;
        }
    }

    fn backstop(&self, ttl_seconds: u64) -> Result<u64, AdapterError> {
        let max = self.settings.max_timeout_seconds;
        if ttl_seconds > max {
            return Err(AdapterError::invalid_field(
                "ttlSeconds",
                format!(
                    "this Vercel pool keeps sessions at most {max} s (its plan's limit, maxTimeoutSeconds); ask for a shorter TTL"
                ),
            ));
        }
        Ok(if ttl_seconds == 0 {
            max
        } else {
            (ttl_seconds + BACKSTOP_MARGIN).min(max)
        })
    }

    /// Brings an existing sandbox to running: waits on a pending one, starts a stopped one.
    async fn adopt(&self, a: &api::Answer) -> Result<(), AdapterError> {
        let name = &a.sandbox.name;
        match state(&a.sandbox.status) {
            InstanceState::Stopped => self.resume(name).await,
            _ => {
                let s = Self::session_of(a)
                    .ok_or_else(|| AdapterError::transient("the sandbox has no session yet"))?;
                self.remember(name, &s);
                self.wait_running(&s).await
            }
        }
    }
}

fn check_path(path: &str) -> Result<(), AdapterError> {
    if !path.starts_with('/') || path.contains('\0') {
        return Err(AdapterError::invalid_field(
            "path",
            format!("path must be absolute: {path:?}"),
        ));
    }
    Ok(())
}

impl Tagged for api::Sandbox {
    fn backend_ref(&self) -> &str {
        &self.name
    }
    fn tag(&self, key: &str) -> Option<&str> {
        self.tags.as_ref()?.get(key).map(String::as_str)
    }
    fn state(&self) -> Option<InstanceState> {
        Some(state(&self.status))
    }
}

#[async_trait]
impl Adapter for VercelAdapter {
    fn kind(&self) -> &'static str {
        "vercel"
    }

    /// Command logs are NDJSON lines whose `data` is text (see docs/providers.md).
    fn exec_fidelity(&self) -> crate::ExecFidelity {
        crate::ExecFidelity::TEXT
    }

    fn capabilities(&self) -> Vec<Capability> {
        let mut caps = vec![Capability::Exec, Capability::Files, Capability::ExecStream];
        if self.settings.persistent {
            caps.push(Capability::LifecycleStop);
        }
        if !self.settings.ports.is_empty() {
            caps.push(Capability::PortsExpose);
        }
        caps
    }

    async fn create(&self, req: &CreateInstance) -> Result<Instance, AdapterError> {
        if req.from_snapshot.is_some() {
            return Err(AdapterError::Unsupported(
                "snapshots are not offered by Vercel pools".to_owned(),
            ));
        }
        let name = sandbox_name(&req.sandbox_id);
        let instance = |state| Instance {
            backend_ref: name.clone(),
            sandbox_id: req.sandbox_id.clone(),
            state,
        };
        // Idempotency: the name is the sandbox id.
        match self.api.get(&name, false).await {
            Ok(a) if state(&a.sandbox.status) == InstanceState::Failed => {
                // A failed earlier attempt: clear it so this one can succeed.
                self.api.delete(&name).await?;
            }
            Ok(a) => {
                self.adopt(&a).await?;
                return Ok(instance(InstanceState::Running));
            }
            Err(AdapterError::NotFound) => {}
            Err(e) => return Err(e),
        }
        let s = &self.settings;
        let body = api::NewSandbox {
            project_id: s.project_id.clone(),
            name: name.clone(),
            image: req
                .template
                .clone()
                .filter(|t| !t.is_empty())
                .or_else(|| s.image.clone()),
            timeout: self.backstop(req.ttl_seconds)? * 1000,
            resources: serde_json::json!({ "vcpus": req.resources.cpu.max(1) }),
            persistent: s.persistent,
            env: req.env.clone(),
            tags: create_tags(req),
            ports: s.ports.clone(),
            region: s.region.clone(),
        };
        let created = match self.api.create(&body).await {
            Ok(a) => a,
            // Another attempt created the name in between: adopt it.
            Err(AdapterError::Permanent(m)) if m.contains("HTTP 409") => {
                self.api.get(&name, false).await?
            }
            Err(e) => return Err(e),
        };
        if let Err(e) = self.adopt(&created).await {
            if matches!(e, AdapterError::Permanent(_)) {
                if let Err(d) = self.api.delete(&name).await {
                    tracing::warn!(error = %d, "vercel: removing a sandbox that did not start");
                }
            }
            return Err(e);
        }
        Ok(instance(InstanceState::Running))
    }

    async fn delete(&self, sandbox_id: &SandboxId) -> Result<(), AdapterError> {
        let name = sandbox_name(sandbox_id);
        self.api.delete(&name).await?;
        self.forget(&name);
        Ok(())
    }

    async fn find(&self, sandbox_id: &SandboxId) -> Result<Option<Instance>, AdapterError> {
        match self.api.get(&sandbox_name(sandbox_id), false).await {
            Ok(a) => Ok(tags::instance(&a.sandbox).filter(|i| &i.sandbox_id == sandbox_id)),
            Err(AdapterError::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn list(&self, installation: &InstallationId) -> Result<Vec<Instance>, AdapterError> {
        let all = self
            .api
            .list_tagged(tags::INSTALLATION_TAG, installation.as_str())
            .await?;
        Ok(of_installation(&all, installation))
    }

    async fn health(&self) -> Result<(), AdapterError> {
        self.api.probe().await
    }

    async fn exec_stream(
        &self,
        at: &InstanceRef,
        req: &ExecRequest,
        out: mpsc::Sender<ExecEvent>,
    ) -> Result<ExecExit, AdapterError> {
        timed_exit(self.run(at, req, &out)).await
    }

    async fn upload(
        &self,
        at: &InstanceRef,
        path: &str,
        mode: Option<u32>,
        body: ByteStream,
    ) -> Result<(), AdapterError> {
        check_path(path)?;
        let too_big = format!(
            "upload: Vercel pools take files up to {} MiB",
            MAX_UPLOAD_BYTES >> 20
        );
        let data = crate::files::read_whole(body, MAX_UPLOAD_BYTES, &too_big).await?;
        self.write_file(&at.backend_ref, path, mode.unwrap_or(0o644), &data)
            .await
    }

    async fn download(
        &self,
        at: &InstanceRef,
        path: &str,
        range: Option<ByteRange>,
    ) -> Result<Download, AdapterError> {
        check_path(path)?;
        let session = self.session(&at.backend_ref).await?;
        let (len, body) = match self.api.read(&session, path).await {
            Err(AdapterError::PathNotFound(_)) => {
                // Vercel answers 404 for a directory too.
                return Err(if self.is_dir(&at.backend_ref, path).await {
                    AdapterError::invalid_field("path", format!("download: {path} is a directory"))
                } else {
                    AdapterError::PathNotFound(path.to_owned())
                });
            }
            other => other?,
        };
        // Vercel reads whole files: a range is cut here.
        Ok(Download {
            total_size: len,
            body: crate::files::cut_to_range(body, range),
        })
    }

    async fn list_files(
        &self,
        at: &InstanceRef,
        path: &str,
        depth: u32,
    ) -> Result<Vec<FileEntry>, AdapterError> {
        check_path(path)?;
        let script = format!(
            "[ -e \"$1\" ] || exit {NO_SUCH_PATH}; [ -d \"$1\" ] || exit {NOT_A_DIR}; exec find \"$1\" -mindepth 1 -maxdepth \"$2\" -printf '%y\\t%s\\t%m\\t%T@\\t%p\\0'"
        );
        let argv = vec![
            "sh".to_owned(),
            "-c".to_owned(),
            script,
            "sh".to_owned(),
            path.to_owned(),
            depth.max(1).to_string(),
        ];
        let (code, out, err) = self.capture(&at.backend_ref, &argv).await?;
        match code {
            0 => {}
            NO_SUCH_PATH => return Err(AdapterError::PathNotFound(path.to_owned())),
            NOT_A_DIR => {
                return Err(AdapterError::invalid_field(
                    "path",
                    format!("list files: {path} is not a directory"),
                ))
            }
            c => {
                return Err(AdapterError::transient(format!(
                    "list files: find exited {c}: {}",
                    err.trim()
                )))
            }
        }
        let mut entries: Vec<FileEntry> = out
            .split(|b| *b == 0)
            .filter(|r| !r.is_empty())
            .filter_map(|rec| {
                let rec = String::from_utf8_lossy(rec);
                let mut f = rec.splitn(5, '\t');
                let (kind, size, mode, mtime, p) =
                    (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
                let secs: f64 = mtime.parse().ok()?;
                Some(FileEntry {
                    path: p.to_owned(),
                    kind: match kind {
                        "f" => FileKind::File,
                        "d" => FileKind::Dir,
                        "l" => FileKind::Symlink,
                        _ => FileKind::Other,
                    },
                    size: size.parse().unwrap_or(0),
                    mode: u32::from_str_radix(mode, 8).unwrap_or(0) & 0o7777,
                    #[allow(clippy::cast_possible_truncation)]
                    modified_at: chrono::DateTime::from_timestamp(
                        secs.trunc() as i64,
                        (secs.fract() * 1e9) as u32,
                    ),
                })
            })
            .collect();
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(entries)
    }

    async fn delete_file(&self, at: &InstanceRef, path: &str) -> Result<(), AdapterError> {
        check_path(path)?;
        let script = format!(
            "if [ ! -e \"$1\" ] && [ ! -L \"$1\" ]; then exit {NO_SUCH_PATH}; fi; if [ -d \"$1\" ] && [ ! -L \"$1\" ]; then [ -z \"$(ls -A -- \"$1\")\" ] || exit {NOT_EMPTY}; exec rmdir -- \"$1\"; fi; exec rm -f -- \"$1\""
        );
        let argv = vec![
            "sh".to_owned(),
            "-c".to_owned(),
            script,
            "sh".to_owned(),
            path.to_owned(),
        ];
        let (code, _, err) = self.capture(&at.backend_ref, &argv).await?;
        match code {
            0 => Ok(()),
            NO_SUCH_PATH => Err(AdapterError::PathNotFound(path.to_owned())),
            NOT_EMPTY => Err(AdapterError::permanent(format!(
                "delete: directory not empty: {path}"
            ))),
            c => Err(AdapterError::permanent(format!(
                "delete: exited {c}: {}",
                err.trim()
            ))),
        }
    }

    async fn stop(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        if !self.settings.persistent {
            return Err(AdapterError::Unsupported(
                "lifecycle.stop needs a persistent Vercel pool".to_owned(),
            ));
        }
        let a = self.api.get(&at.backend_ref, false).await?;
        if state(&a.sandbox.status) == InstanceState::Stopped {
            return Ok(());
        }
        let Some(session) = Self::session_of(&a) else {
            return Ok(());
        };
        match self.api.stop(&session).await {
            Ok(()) => {}
            Err(e) if is_stopped(&e) => {}
            Err(e) => return Err(e),
        }
        self.forget(&at.backend_ref);
        Ok(())
    }

    async fn start(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        if !self.settings.persistent {
            return Err(AdapterError::Unsupported(
                "lifecycle.stop needs a persistent Vercel pool".to_owned(),
            ));
        }
        self.forget(&at.backend_ref);
        self.resume(&at.backend_ref).await
    }

    async fn expose_port(
        &self,
        at: &InstanceRef,
        port: u16,
        _expires: Option<Duration>,
    ) -> Result<Endpoint, AdapterError> {
        if self.settings.ports.is_empty() {
            return Err(AdapterError::Unsupported(
                "ports.expose is not offered by this Vercel pool (no ports setting)".to_owned(),
            ));
        }
        if !self.settings.ports.contains(&port) {
            return Err(AdapterError::invalid_field(
                "port",
                format!(
                    "Vercel opens ports at create: this pool opens {:?}",
                    self.settings.ports
                ),
            ));
        }
        let a = self.api.get(&at.backend_ref, false).await?;
        let route = a.routes.iter().find(|r| r.port == port).ok_or_else(|| {
            AdapterError::transient(format!("Vercel has no route for port {port} yet"))
        })?;
        // Vercel's routes are public URLs without expiry or signature.
        Ok(Endpoint {
            url: route.url.clone(),
            expires_at: None,
        })
    }

    async fn renew(&self, at: &InstanceRef, ttl: Duration) -> Result<(), AdapterError> {
        let want_ms = self.backstop(ttl.as_secs().max(1))? * 1000;
        let session = match self.session(&at.backend_ref).await {
            Ok(s) => s,
            // A stopped sandbox has no running session to keep alive.
            Err(AdapterError::Permanent(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        let s = self.api.session(&session).await?;
        let now = chrono::Utc::now().timestamp_millis();
        let ends = s
            .started_at
            .unwrap_or(now)
            .saturating_add(i64::try_from(s.timeout.unwrap_or(0)).unwrap_or(i64::MAX));
        let left = u64::try_from(ends.saturating_sub(now)).unwrap_or(0);
        if want_ms > left {
            self.api.extend(&session, want_ms - left).await?;
        }
        Ok(())
    }
}

/// Bytes → body stream (tests and helpers).
pub fn body_of(data: Vec<u8>) -> ByteStream {
    Box::pin(futures::stream::once(async move {
        Ok::<_, AdapterError>(Bytes::from(data))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_sandbox_id() {
        let id = SandboxId::parse("sbx_01JABCDEFGHJKMNPQRSTVWXYZ0").unwrap();
        assert_eq!(
            sandbox_name(&id),
            "differently-sbx-01jabcdefghjkmnpqrstvwxyz0"
        );
        assert_eq!(state("running"), InstanceState::Running);
        assert_eq!(state("snapshotting"), InstanceState::Stopped);
        assert_eq!(state("aborted"), InstanceState::Failed);
        assert_eq!(state("pending"), InstanceState::Pending);
    }
}
