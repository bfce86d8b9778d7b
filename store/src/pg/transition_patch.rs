//! A status change of a row its caller saw (`TransitionStore::transition_seen`), in one
//! statement with no read before it (issue #47, migration 0022).
//!
//! The one-statement change of [`super::transition_swap`] writes the whole new row, so it
//! reads the row first. A change that moves only the status (not to a final status, not to
//! `queued`) changes four fields of the document whatever else the row holds; a caller that
//! saw the row at its status and version (the API deleting a sandbox it served a call on)
//! knows them, and this process's head cache knows the chain's head its record goes onto.
//! `differently_patch_sandbox_status` merges them into the document if the row is still at
//! that status and version and the head at that sequence; otherwise it writes nothing and
//! answers the row and head as they are, which the one-statement path decides on as if it
//! had read them. The outcome is the same either way: what the lane would answer.

use chrono::{DateTime, Utc};
use differently_core::{Sandbox, SandboxStatus};
use serde_json::json;
use sqlx::Row;

use crate::audit::{self, chain_of, AuditEvent};
use crate::pg::audit_standalone::{bind_chained, has_fraction};
use crate::pg::rows::sandbox_of;
use crate::pg::transition_swap::{seen_of, Seen};
use crate::pg::PgStore;
use crate::shared::audit_entry::event_for;
use crate::shared::rules;
use crate::{SeenRow, StoreError, Transition};

/// What one call did.
pub(crate) enum Patched {
    /// Written: the row as it now is.
    Done(Box<Sandbox>),
    /// Nothing written: the row and its chain's head as the call found them.
    Moved(Box<Seen>),
    Gone,
}

/// Applies `t` to the row its caller saw at `seen`. `None`: not sent (a change that does more
/// than move the status, or a chain whose head this process does not know): the caller reads.
pub(crate) async fn patch(
    store: &PgStore,
    t: &Transition,
    seen: &SeenRow,
    now: DateTime<Utc>,
    request_id: Option<&str>,
) -> Result<Option<Patched>, StoreError> {
    let [from] = t.from.as_slice() else {
        return Ok(None);
    };
    // A final status also clears the env values (sealed, re-sealed in Rust); `queued` clears
    // the pool; an illegal change is refused by the rules on the row as it is.
    if t.to.is_final()
        || t.to == SandboxStatus::Queued
        || !differently_core::status::can_transition(*from, t.to)
    {
        return Ok(None);
    }
    let Some(version) = seen.status_version.checked_add(1) else {
        return Ok(None);
    };
    let chain = chain_of(Some(&seen.org_id), t.id.as_str());
    let Some(head) = store.audit_heads().get(&chain) else {
        return Ok(None);
    };
    let entry = rules::transition_entry(t, *from);
    let event = event_for(
        Some(&seen.org_id),
        Some(&seen.project_id),
        t.id.as_str(),
        entry.actor,
        entry.action,
        entry.detail,
    );
    if has_fraction(&event.detail) {
        return Ok(None);
    }
    let prev_seq = head.0;
    let rec = AuditEvent::chained(
        audit::process_key(),
        chain,
        Some(head),
        event,
        now,
        request_id.map(str::to_owned),
    );
    // The fields `accounting::transition` changes for such a status, as the row's document
    // spells them (serde, as `env_at_rest::stored` writes the whole document).
    let doc_patch = json!({
        "status": t.to,
        "statusReason": t.reason,
        "statusVersion": version,
        "updatedAt": now,
    });
    let query = sqlx::query(
        "SELECT o_outcome AS outcome, o_xmin AS xmin, o_doc AS doc,
                o_env_sealed AS env_sealed, o_head_seq AS chain_seq, o_head_hash AS hash
         FROM differently_patch_sandbox_status($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11,
             $12, $13, $14, $15, $16, $17, $18, $19, $20, $21)",
    )
    .bind(t.id.as_str())
    .bind(from.as_str())
    .bind(seen.status_version)
    .bind(prev_seq)
    .bind(t.to.as_str())
    .bind(now)
    .bind(doc_patch);
    let row = bind_chained(query, &rec)
        .bind(&rec.key_id)
        .fetch_one(store.pool())
        .await?;
    let outcome: String = row.try_get("outcome")?;
    match outcome.as_str() {
        "done" => {
            store
                .audit_heads()
                .after_change(&rec.resource, &rec.chain, rec.chain_seq, &rec.hash);
            Ok(Some(Patched::Done(Box::new(sandbox_of(&row)?))))
        }
        "row_moved" | "head_moved" | "no_head" => {
            Ok(Some(Patched::Moved(Box::new(seen_of(&row)?))))
        }
        "gone" => Ok(Some(Patched::Gone)),
        other => Err(StoreError::Internal(format!(
            "differently_patch_sandbox_status answered {other:?}"
        ))),
    }
}
