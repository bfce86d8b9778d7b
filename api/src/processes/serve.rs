//! The supervisor on the bus: picking a free slot, serving its subject and the list subject,
//! and asking other supervisors.

use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use differently_bus::{Bus, BusError};
use differently_bus_schema::Naming;
use differently_core::process::Process;
use differently_core::ErrorCode;
use futures::StreamExt;
use rand::Rng;

use super::ask::{Answer, Ask};
use super::registry::{Registry, SLOTS};
use crate::error::{ApiError, ApiResult};
use crate::AppState;

/// Slots tried before giving up (each a bus round trip; 4,095 exist).
const SLOT_TRIES: usize = 16;
/// After the first list answer, how long a gather waits for the next.
const LIST_QUIET: Duration = Duration::from_millis(150);

/// Aborts the serving tasks when the supervisor goes, so its subjects have nobody serving
/// them and callers learn its pids are gone.
pub(super) struct Serving(Vec<tokio::task::AbortHandle>);

impl Drop for Serving {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

fn unavailable(what: &str, e: &BusError) -> ApiError {
    ApiError::new(
        ErrorCode::ProviderUnavailable,
        format!("the process supervisor cannot use the bus ({what}); retry"),
    )
    .with_retry_after(1)
    .with_details(serde_json::json!({ "cause": e.to_string() }))
}

/// A registry on a slot nobody serves, with its subject and the list subject served.
pub(super) async fn claim_slot(
    bus: Arc<dyn Bus>,
    naming: Naming,
) -> ApiResult<(Arc<Registry>, Serving)> {
    let ping = Bytes::from(serde_json::to_vec(&Ask::Ping).map_err(ApiError::internal)?);
    for _ in 0..SLOT_TRIES {
        let slot = rand::rng().random_range(1..=SLOTS);
        let subject = naming.process_subject(slot);
        match bus
            .request(&subject, ping.clone(), Duration::from_secs(1))
            .await
        {
            Err(BusError::NoResponders(_)) => {}
            Ok(_) => continue,                     // taken
            Err(BusError::Timeout(_)) => continue, // someone holds it but is slow
            Err(e) => return Err(unavailable("picking a slot", &e)),
        }
        let registry = Arc::new(Registry::new(slot));
        let weak = Arc::downgrade(&registry);
        let mut requests = bus
            .serve(&subject)
            .await
            .map_err(|e| unavailable("serving", &e))?;
        let mut lists = bus
            .serve(&naming.process_list_subject())
            .await
            .map_err(|e| unavailable("serving", &e))?;
        let own = tokio::spawn({
            let weak = weak.clone();
            async move {
                while let Some(r) = requests.next().await {
                    answer_one(&weak, r);
                }
                tracing::warn!(slot, "process supervisor: its subject closed");
            }
        });
        let list = tokio::spawn(async move {
            while let Some(r) = lists.next().await {
                answer_one(&weak, r);
            }
        });
        tracing::info!(slot, "process supervisor serving");
        return Ok((
            registry,
            Serving(vec![own.abort_handle(), list.abort_handle()]),
        ));
    }
    Err(ApiError::new(
        ErrorCode::ProviderUnavailable,
        "the process supervisor found no free slot; retry",
    )
    .with_retry_after(1))
}

/// Answers one request in a task of its own (a read may wait for output).
fn answer_one(registry: &Weak<Registry>, r: differently_bus::Request) {
    let Some(registry) = registry.upgrade() else {
        return;
    };
    tokio::spawn(async move {
        let answer = match serde_json::from_slice::<Ask>(&r.payload) {
            Ok(ask) => registry.answer(ask).await,
            Err(e) => Answer::Refused {
                message: e.to_string(),
            },
        };
        let bytes = serde_json::to_vec(&answer).unwrap_or_else(|e| {
            serde_json::to_vec(&Answer::Refused {
                message: format!("encode: {e}"),
            })
            .unwrap_or_default()
        });
        if let Err(e) = r.reply(Bytes::from(bytes)).await {
            tracing::warn!(error = %e, "process supervisor: cannot answer");
        }
    });
}

/// `ask` put to the supervisor of `slot`; a slot nobody serves has no processes.
pub(super) async fn ask_remote(
    state: &AppState,
    slot: u16,
    ask: &Ask,
    timeout: Duration,
) -> ApiResult<Answer> {
    let subject = state.announcer.naming().process_subject(slot);
    let question = Bytes::from(serde_json::to_vec(ask).map_err(ApiError::internal)?);
    match state
        .announcer
        .bus()
        .request(&subject, question, timeout)
        .await
    {
        Ok(reply) => serde_json::from_slice(&reply).map_err(ApiError::internal),
        Err(BusError::NoResponders(_)) => Ok(Answer::NotFound),
        Err(e) => Err(ApiError::new(
            ErrorCode::ProviderUnavailable,
            format!(
                "the API process supervising this process did not answer within {} s; retry",
                timeout.as_secs()
            ),
        )
        .with_retry_after(1)
        .with_details(serde_json::json!({ "cause": e.to_string() }))),
    }
}

/// Every supervisor's answer to a list question, merged.
pub(super) async fn gather_lists(state: &AppState, ask: &Ask) -> ApiResult<Vec<Process>> {
    let question = Bytes::from(serde_json::to_vec(ask).map_err(ApiError::internal)?);
    let subject = state.announcer.naming().process_list_subject();
    let answers = state
        .announcer
        .bus()
        .request_all(&subject, question, LIST_QUIET, super::ASK_TIMEOUT)
        .await
        .map_err(|e| unavailable("listing", &e))?;
    let mut items = Vec::new();
    for a in answers {
        match serde_json::from_slice::<Answer>(&a) {
            Ok(Answer::Processes { items: more }) => items.extend(more),
            Ok(other) => tracing::warn!(answer = ?other, "process list: unexpected answer"),
            Err(e) => tracing::warn!(error = %e, "process list: unreadable answer"),
        }
    }
    Ok(items)
}
