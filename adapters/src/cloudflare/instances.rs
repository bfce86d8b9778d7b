//! Instances on the bridge, which has no listing and starts a container for any name it is
//! asked about: a sandbox is the bridge name derived from its id, and it *exists* while its
//! container holds the marker file create wrote last (the sandbox and installation ids, the
//! tags). A container that went to sleep comes back empty, without the marker: that
//! sandbox is gone. `list` reads the index sandbox (one entry per sandbox with its
//! installation, written before the sandbox, removed by delete) and checks each entry's
//! marker.

use std::time::{SystemTime, UNIX_EPOCH};

use differently_core::ids::InstallationId;
use differently_core::SandboxId;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use super::bridge::Bridge;
use super::{ids, script};
use crate::{AdapterError, CreateInstance, Instance, InstanceRef, InstanceState};

/// How long an index entry may stand without its sandbox's marker before it is taken as
/// stale (its create failed or its container slept): far longer than a create takes, so a
/// create in flight is never mistaken for one.
const STALE_ENTRY_SECONDS: u64 = 600;

/// Sandboxes whose markers `list` reads at once.
const LIST_CONCURRENCY: usize = 8;

/// The marker file's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Marker {
    pub sandbox_id: String,
    pub installation_id: String,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn running(backend_ref: &str, sandbox_id: SandboxId) -> Instance {
    Instance {
        backend_ref: backend_ref.to_owned(),
        sandbox_id,
        state: InstanceState::Running,
    }
}

/// The marker of sandbox name `name`, if its container has one. Asking starts an empty
/// container for a name without one (the bridge's pool does that for every route but
/// destroy); callers that know the name is not theirs destroy it again.
pub(crate) async fn marker(bridge: &Bridge, name: &str) -> Result<Option<Marker>, AdapterError> {
    let Some(bytes) = bridge.get_file(name, script::MARKER).await? else {
        return Ok(None);
    };
    Ok(serde_json::from_slice(&bytes).ok())
}

/// `at` exists and is the sandbox it says; `NotFound` otherwise (a name that is not a
/// bridge name, a container without the marker, another sandbox's marker).
pub(crate) async fn ensure(bridge: &Bridge, at: &InstanceRef) -> Result<(), AdapterError> {
    if !ids::valid(&at.backend_ref) {
        return Err(AdapterError::NotFound);
    }
    match marker(bridge, &at.backend_ref).await? {
        Some(m) if m.sandbox_id == at.sandbox_id.as_str() => Ok(()),
        _ => Err(AdapterError::NotFound),
    }
}

/// Creates the sandbox of `req`, or answers the one its name already holds.
pub(crate) async fn create(
    bridge: &Bridge,
    req: &CreateInstance,
) -> Result<Instance, AdapterError> {
    let name = ids::bridge_id(&req.sandbox_id);
    if let Some(m) = marker(bridge, &name).await? {
        if m.sandbox_id == req.sandbox_id.as_str() {
            return Ok(running(&name, req.sandbox_id.clone()));
        }
    }
    // The index entry first: a sandbox that exists is always in the index.
    let entry = format!("{}/{name}", script::INDEX_DIR);
    let line = format!("{} {}", req.installation_id.as_str(), now_secs());
    bridge
        .put_file(&ids::index_id(), &entry, line.into_bytes())
        .await?;
    bridge
        .put_file(
            &name,
            script::ENV_FILE,
            script::env_file(&req.env).into_bytes(),
        )
        .await?;
    let m = Marker {
        sandbox_id: req.sandbox_id.as_str().to_owned(),
        installation_id: req.installation_id.as_str().to_owned(),
    };
    let body = serde_json::to_vec(&m)
        .map_err(|e| AdapterError::permanent(format!("create: marker: {e}")))?;
    bridge.put_file(&name, script::MARKER, body).await?;
    Ok(running(&name, req.sandbox_id.clone()))
}

/// The sandbox of `id`, if it exists. A name without a marker is left to the bridge, which
/// puts the empty container it just started to sleep after its idle time: destroying it
/// here could destroy the container a create of the same id is writing to.
pub(crate) async fn find(
    bridge: &Bridge,
    id: &SandboxId,
) -> Result<Option<Instance>, AdapterError> {
    let name = ids::bridge_id(id);
    Ok(match marker(bridge, &name).await? {
        Some(m) if m.sandbox_id == id.as_str() => Some(running(&name, id.clone())),
        _ => None,
    })
}

/// Destroys the sandbox of `id` (the bridge starts nothing for a name without a container)
/// and removes its index entry (none is fine).
pub(crate) async fn delete(bridge: &Bridge, id: &SandboxId) -> Result<(), AdapterError> {
    let name = ids::bridge_id(id);
    bridge.destroy(&name).await?;
    let out = bridge
        .run(&ids::index_id(), &script::index_remove(&[&name]))
        .await?;
    if out.exit_code != 0 {
        return Err(AdapterError::transient(format!(
            "delete: removing the index entry failed: {}",
            out.said()
        )));
    }
    Ok(())
}

/// What one index entry turned out to be.
enum Entry {
    Live(Instance),
    /// No marker, and the entry is old: the sandbox is gone.
    Stale(String),
    /// No marker yet (a create in flight), or not ours.
    Skip,
}

async fn check_entry(bridge: &Bridge, name: String, written: u64) -> Result<Entry, AdapterError> {
    let Some(id) = ids::sandbox_of(&name) else {
        return Ok(Entry::Skip);
    };
    match marker(bridge, &name).await? {
        Some(m) if m.sandbox_id == id.as_str() => Ok(Entry::Live(running(&name, id))),
        Some(_) => Ok(Entry::Skip),
        None if now_secs().saturating_sub(written) >= STALE_ENTRY_SECONDS => {
            bridge.destroy(&name).await?;
            Ok(Entry::Stale(name))
        }
        None => Ok(Entry::Skip),
    }
}

/// Every live sandbox of `installation`; stale entries are dropped from the index.
pub(crate) async fn list(
    bridge: &Bridge,
    installation: &InstallationId,
) -> Result<Vec<Instance>, AdapterError> {
    let index = ids::index_id();
    let out = bridge.run(&index, &script::index_list()).await?;
    if out.exit_code != 0 {
        return Err(AdapterError::transient(format!(
            "list: reading the index failed: {}",
            out.said()
        )));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mine: Vec<(String, u64)> = text
        .lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (name, inst) = (f.next()?, f.next()?);
            let written = f.next().and_then(|w| w.parse().ok()).unwrap_or(0);
            (ids::valid(name) && inst == installation.as_str()).then(|| (name.to_owned(), written))
        })
        .collect();
    let checked: Vec<Result<Entry, AdapterError>> = futures::stream::iter(mine)
        .map(|(name, written)| check_entry(bridge, name, written))
        .buffer_unordered(LIST_CONCURRENCY)
        .collect()
        .await;
    let mut live = Vec::new();
    let mut stale = Vec::new();
    for entry in checked {
        match entry? {
            Entry::Live(i) => live.push(i),
            Entry::Stale(name) => stale.push(name),
            Entry::Skip => {}
        }
    }
    if !stale.is_empty() {
        let names: Vec<&str> = stale.iter().map(String::as_str).collect();
        // Best effort: the entries are checked again next time.
        if let Err(e) = bridge.run(&index, &script::index_remove(&names)).await {
            tracing::warn!(error = %e, "cloudflare: dropping stale index entries failed");
        }
    }
    live.sort_by(|a, b| a.sandbox_id.as_str().cmp(b.sandbox_id.as_str()));
    Ok(live)
}
