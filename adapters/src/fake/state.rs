//! The fake's instance table: reads of it shared with other processes through the ledger
//! file, the lines each call records, and the checks and transitions its calls share
//! (capabilities, files, lifecycle).

use super::*;

impl FakeAdapter {
    /// Reads the current state (other processes' lines included) without recording a line.
    pub(super) async fn peek<R, F>(&self, read: F) -> Result<R, AdapterError>
    where
        F: FnOnce(&State) -> R + Send + 'static,
        R: Send + 'static,
    {
        match &self.files {
            None => Ok(read(&self.lock_inner().state)),
            Some(files) => {
                let this = self.clone();
                let files = files.clone();
                tokio::task::spawn_blocking(move || -> io::Result<R> {
                    let mut inner = this.lock_inner();
                    under_file_lock(&mut inner, &files, |inner, _| Ok(read(&inner.state)))
                })
                .await
                .map_err(|e| {
                    AdapterError::Transient(Reason::caused_by(
                        format!("fake ledger task failed: {e}"),
                        e,
                    ))
                })?
                .map_err(|e| {
                    AdapterError::Transient(Reason::caused_by(format!("fake ledger: {e}"), e))
                })
            }
        }
    }
}

/// Runs `f` under the ledger's file lock, after catching `inner` up on other writers' lines,
/// with the ledger open for appending.
pub(super) fn under_file_lock<R>(
    inner: &mut Inner,
    files: &FilePaths,
    f: impl FnOnce(&mut Inner, &mut File) -> io::Result<R>,
) -> io::Result<R> {
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&files.lock)?;
    lock.lock()?;
    let result = (|| {
        let mut ledger = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&files.ledger)?;
        catch_up(inner, &mut ledger)?;
        f(inner, &mut ledger)
    })();
    // Dropping the file would release the lock too; unlocking explicitly keeps it obvious.
    let _ = lock.unlock();
    result
}

/// The file-ledger transaction: lock, catch up on other writers' lines, decide, append, unlock.
pub(super) fn file_transact<R>(
    inner: &mut Inner,
    files: &FilePaths,
    decide: impl FnOnce(&State) -> (LedgerEntry, R),
) -> io::Result<R> {
    under_file_lock(inner, files, |inner, ledger| {
        let (entry, r) = decide(&inner.state);
        let mut line = serde_json::to_vec(&entry).map_err(io::Error::other)?;
        line.push(b'\n');
        // One write on an O_APPEND file: the line lands whole.
        ledger.write_all(&line)?;
        ledger.flush()?;
        inner.offset += line.len() as u64;
        inner.state.apply(&entry);
        Ok(r)
    })
}

/// Replays the lines appended since `inner.offset`. A ledger that shrank (someone truncated
/// it) is replayed from the start.
pub(super) fn catch_up(inner: &mut Inner, ledger: &mut File) -> io::Result<()> {
    let len = ledger.metadata()?.len();
    if len < inner.offset {
        inner.state = State::default();
        inner.offset = 0;
    }
    ledger.seek(SeekFrom::Start(inner.offset))?;
    let mut bytes = Vec::new();
    ledger.read_to_end(&mut bytes)?;
    let (entries, consumed) = parse_lines(&bytes);
    if consumed < bytes.len() {
        // A torn line from a writer killed mid-write: terminate it so our line stays parseable.
        tracing::warn!("fake ledger ends with a torn line; terminating it");
        ledger.write_all(b"\n")?;
        inner.offset += bytes.len() as u64 + 1;
    } else {
        inner.offset += consumed as u64;
    }
    for e in &entries {
        inner.state.apply(e);
    }
    Ok(())
}

pub(super) fn entry(
    op: LedgerOp,
    sandbox_id: Option<SandboxId>,
    outcome: LedgerOutcome,
) -> LedgerEntry {
    LedgerEntry {
        at: Utc::now(),
        op,
        sandbox_id,
        backend_ref: None,
        installation_id: None,
        outcome,
        pid: std::process::id(),
        program: None,
        snapshot: None,
        port: None,
    }
}

pub(super) fn running(sandbox_id: &SandboxId, backend_ref: &str) -> Instance {
    Instance {
        backend_ref: backend_ref.to_owned(),
        sandbox_id: sandbox_id.clone(),
        state: InstanceState::Running,
    }
}

pub(super) fn instance_of(live: &LiveInstance) -> Instance {
    Instance {
        backend_ref: live.backend_ref.clone(),
        sandbox_id: live.sandbox_id.clone(),
        state: live.state,
    }
}

impl FakeAdapter {
    /// `Unsupported` unless `capability` is configured.
    pub(super) fn require(&self, capability: Capability) -> Result<(), AdapterError> {
        self.check_available()?;
        if self.offers(capability) {
            Ok(())
        } else {
            Err(AdapterError::Unsupported(capability.name().to_owned()))
        }
    }

    /// Where sandbox files live.
    pub(super) fn files_root(&self) -> PathBuf {
        if let Some(r) = &self.config.files_root {
            return r.clone();
        }
        match &self.config.ledger {
            Some(l) => {
                let mut p = l.as_os_str().to_owned();
                p.push(".files");
                PathBuf::from(p)
            }
            None => self.scratch.clone(),
        }
    }

    /// Records an exec line and answers whether the instance exists and is running.
    pub(super) async fn exec_line(
        &self,
        at: &InstanceRef,
        program: &str,
        outcome: Option<LedgerOutcome>,
    ) -> Result<(), AdapterError> {
        let at = at.clone();
        let program = program.to_owned();
        self.transact(move |state| {
            let mut e = entry(
                LedgerOp::Exec,
                Some(at.sandbox_id.clone()),
                outcome.unwrap_or(LedgerOutcome::Ok),
            );
            e.backend_ref = Some(at.backend_ref.clone());
            e.program = Some(program);
            let live = state
                .live
                .get(&at.sandbox_id)
                .filter(|l| l.backend_ref == at.backend_ref);
            let r = match (outcome, live) {
                (Some(_), _) => Ok(()),
                (None, None) => {
                    e.outcome = LedgerOutcome::Missing;
                    Err(AdapterError::NotFound)
                }
                (None, Some(l)) if l.state != InstanceState::Running => {
                    e.outcome = LedgerOutcome::Refused;
                    Err(AdapterError::permanent(format!(
                        "the instance is {:?}",
                        l.state
                    )))
                }
                (None, Some(_)) => Ok(()),
            };
            (e, r)
        })
        .await?
    }

    /// The files directory of an existing instance (created on first use).
    pub(super) async fn sandbox_files(&self, at: &InstanceRef) -> Result<PathBuf, AdapterError> {
        self.require(Capability::Files)?;
        let found = self.find(&at.sandbox_id).await?;
        if found.is_none_or(|i| i.backend_ref != at.backend_ref) {
            return Err(AdapterError::NotFound);
        }
        let dir = self.files_root().join(at.sandbox_id.as_str());
        tokio::fs::create_dir_all(&dir).await.map_err(|e| {
            AdapterError::Transient(Reason::caused_by(format!("fake files: {e}"), e))
        })?;
        Ok(dir)
    }

    /// A lifecycle call: checks the instance is in `from` (or already in `to`: idempotent)
    /// and records the line.
    pub(super) async fn lifecycle(
        &self,
        at: &InstanceRef,
        capability: Capability,
        op: LedgerOp,
        from: InstanceState,
        to: InstanceState,
    ) -> Result<(), AdapterError> {
        self.require(capability)?;
        self.latency().await;
        let at = at.clone();
        self.transact(move |state| {
            let mut e = entry(op, Some(at.sandbox_id.clone()), LedgerOutcome::Ok);
            e.backend_ref = Some(at.backend_ref.clone());
            let r = match state.live.get(&at.sandbox_id) {
                None => {
                    e.outcome = LedgerOutcome::Missing;
                    Err(AdapterError::NotFound)
                }
                Some(l) if l.state == from || l.state == to => Ok(()),
                Some(l) => {
                    e.outcome = LedgerOutcome::Refused;
                    Err(AdapterError::permanent(format!(
                        "cannot {op:?} an instance that is {:?}",
                        l.state
                    )))
                }
            };
            (e, r)
        })
        .await?
    }
}
