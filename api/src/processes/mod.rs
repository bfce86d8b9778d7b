//! The process supervisor: background processes (`/v1/sandboxes/{id}/processes`) that
//! outlive the request that started them (docs/processes.md).
//!
//! The API process that starts a process supervises it: a task of its own holds the adapter's
//! [`process`](differently_adapters::Adapter::process) call for the process's whole life and
//! keeps its output and state ([`entry`]). A pid names its supervisor: its top 12 bits are the
//! supervisor's slot, picked free on the bus when the first process starts here ([`serve`]),
//! so a request for any pid reaching any API process is answered in place or asked of the
//! supervisor over `dly.internal.proc.<slot>` ([`ask`]). A list gathers every supervisor's
//! part. A process dies with its supervisor: the call closes, which cancels the command. The
//! in-process caller of a start can follow the new process's output directly ([`follow`]).

pub mod ask;
pub mod entry;
pub mod follow;
pub mod registry;
mod serve;
mod start;

use std::sync::Arc;
use std::time::Duration;

use differently_core::process::Process;
use differently_core::ErrorCode;
use tokio::sync::OnceCell;

use self::ask::{Answer, Ask};
use self::registry::{slot_of, Registry};
use crate::error::{ApiError, ApiResult};
use crate::AppState;

pub(crate) use start::start;

/// Longest a caller waits for another supervisor's answer (a read's own wait comes on top).
pub const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// This API process's supervisor; its registry and bus subjects exist from the first start.
#[derive(Default)]
pub struct Supervisor {
    live: OnceCell<Live>,
}

/// The registry and what serves it on the bus.
struct Live {
    registry: Arc<Registry>,
    _serving: serve::Serving,
}

impl Supervisor {
    /// The registry, made (a free slot picked and served) on first use.
    async fn registry(&self, state: &AppState) -> ApiResult<Arc<Registry>> {
        let live = self
            .live
            .get_or_try_init(|| async {
                let bus = state.announcer.bus().clone();
                let naming = state.announcer.naming().clone();
                let (registry, serving) = serve::claim_slot(bus, naming).await?;
                Ok::<_, ApiError>(Live {
                    registry,
                    _serving: serving,
                })
            })
            .await?;
        Ok(live.registry.clone())
    }

    /// The registry if this process has started any process.
    fn local(&self) -> Option<&Arc<Registry>> {
        self.live.get().map(|l| &l.registry)
    }
}

/// The answer to `ask` about `pid`: from this process's registry when it supervises the
/// pid, else from its supervisor over the bus (a gone supervisor's pids are not found).
pub(crate) async fn ask_pid(state: &AppState, pid: u32, ask: Ask) -> ApiResult<Answer> {
    let slot = slot_of(pid);
    if let Some(local) = state.processes.local() {
        if local.slot == slot {
            return Ok(local.answer(ask).await);
        }
    }
    if slot == 0 {
        return Ok(Answer::NotFound);
    }
    let wait = match &ask {
        Ask::Read { wait_ms, .. } => Duration::from_millis(*wait_ms),
        _ => Duration::ZERO,
    };
    serve::ask_remote(state, slot, &ask, ASK_TIMEOUT + wait).await
}

/// Every supervisor's processes of `sandbox`, newest first.
pub(crate) async fn list(state: &AppState, sandbox: &str) -> ApiResult<Vec<Process>> {
    let ask = Ask::List {
        sandbox: sandbox.to_owned(),
    };
    // Every supervisor serves the list subject, this process's too when it has one.
    let mut items = serve::gather_lists(state, &ask).await?;
    items.sort_by_key(|p| std::cmp::Reverse(p.started_at));
    items.dedup_by_key(|p| p.pid);
    Ok(items)
}

/// The API's error for an answer that is not what the caller wanted.
pub(crate) fn refusal(answer: Answer, pid: u32) -> ApiError {
    match answer {
        Answer::NotFound => ApiError::not_found("process"),
        Answer::Conflict { message } => ApiError::new(ErrorCode::Conflict, message),
        Answer::Busy { message } => {
            ApiError::new(ErrorCode::ProviderUnavailable, message).with_retry_after(1)
        }
        Answer::Refused { message } => ApiError::internal(format!(
            "the supervisor of process {pid} refused the question: {message}"
        )),
        other => ApiError::internal(format!("unexpected answer about process {pid}: {other:?}")),
    }
}

/// A pid as the path gave it; anything else is not found (as for a pid that never was).
pub(crate) fn parse_pid(raw: &str) -> ApiResult<u32> {
    raw.parse::<u32>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| ApiError::not_found("process"))
}
