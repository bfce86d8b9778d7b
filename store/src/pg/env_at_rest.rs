//! Sandbox env values at rest. With a secrets key configured (`sealed::process_key`), a row's
//! env map is sealed into `env_sealed` and its document keeps the names with empty values, so
//! a dump, a backup or a `SELECT doc` shows no value; every read in this store opens it again,
//! so workers get the values they pass to the backend. The sandbox id is in the associated
//! data: a blob copied onto another row does not open. Without a key the document holds the
//! values, as before, and `env_sealed` stays NULL. A sandbox that ended keeps no values at all.

use std::collections::BTreeMap;

use differently_core::{Sandbox, SandboxId};
use sqlx::types::Json;
use sqlx::{PgConnection, Row};

use crate::sealed;
use crate::StoreError;

/// The associated-data name of a sandbox's env blob. Secret names cannot hold `:`, so no
/// stored secret's blob opens as an env blob or the other way round.
fn aad_name(id: &SandboxId) -> String {
    format!("sandbox-env:{id}")
}

/// The env as the document keeps it once the values are elsewhere (or gone): names only.
fn names_only(env: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    env.keys().map(|k| (k.clone(), String::new())).collect()
}

/// What a row stores for `s`: its document, and the sealed env when a key is configured and
/// there are values to keep (a live sandbox with a non-empty env).
pub(crate) fn stored(s: &Sandbox) -> Result<(serde_json::Value, Option<Vec<u8>>), StoreError> {
    let keep = !s.status.is_final() && s.spec.env.values().any(|v| !v.is_empty());
    let sealed = match (keep, sealed::process_key()) {
        (true, Some(key)) => Some(seal(key, &s.id, &s.spec.env)?),
        _ => None,
    };
    let mut doc = serde_json::to_value(s).map_err(|e| StoreError::Internal(e.to_string()))?;
    if sealed.is_some() || s.status.is_final() {
        let names = serde_json::to_value(names_only(&s.spec.env))
            .map_err(|e| StoreError::Internal(e.to_string()))?;
        if let Some(spec) = doc.get_mut("spec").and_then(|v| v.as_object_mut()) {
            spec.insert("env".to_owned(), names);
        }
    }
    Ok((doc, sealed))
}

fn seal(
    key: &sealed::SealKey,
    id: &SandboxId,
    env: &BTreeMap<String, String>,
) -> Result<Vec<u8>, StoreError> {
    let plain = serde_json::to_vec(env).map_err(|e| StoreError::Internal(e.to_string()))?;
    sealed::seal(key, &aad_name(id), &plain).map_err(|e| StoreError::Internal(e.to_string()))
}

/// Puts the values of a sealed env back into `s` (read from its row). A sealed env without a
/// key, or under another key, is an error naming the sandbox, never a value.
pub(crate) fn restore(s: &mut Sandbox, blob: Option<&[u8]>) -> Result<(), StoreError> {
    let Some(blob) = blob else {
        return Ok(());
    };
    let key = sealed::process_key().ok_or_else(|| {
        StoreError::Internal(format!(
            "sandbox {}: its env is sealed and no secrets key is configured (set DIFFERENTLY_SECRETS_KEY)",
            s.id
        ))
    })?;
    let plain = sealed::open(key, &aad_name(&s.id), blob)
        .map_err(|e| StoreError::Internal(e.to_string()))?;
    s.spec.env = serde_json::from_slice(&plain)
        .map_err(|e| StoreError::Internal(format!("sandbox {}: sealed env: {e}", s.id)))?;
    Ok(())
}

/// Rebuilds a sandbox from a row selecting `doc` and `env_sealed`.
pub(crate) fn sandbox_of(row: &sqlx::postgres::PgRow) -> Result<Sandbox, StoreError> {
    let Json(mut s): Json<Sandbox> = row.try_get("doc")?;
    let blob: Option<Vec<u8>> = row.try_get("env_sealed")?;
    restore(&mut s, blob.as_deref())?;
    Ok(s)
}

/// Rows handled per statement by [`seal_plaintext_rows`].
const BATCH: i64 = 500;

/// Seals the env of every live row still holding values in its document (written without a
/// key, or before sealing existed), when a key is configured; answers how many. Run at
/// start-up under the migration lock. Each batch is one transaction over rows it locked and
/// re-checked, so a concurrent writer's newer document is never undone.
pub(crate) async fn seal_plaintext_rows(conn: &mut PgConnection) -> Result<u64, StoreError> {
    if sealed::process_key().is_none() {
        return Ok(0);
    }
    let mut sealed_rows = 0u64;
    let mut after = String::new();
    loop {
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        let rows = sqlx::query(
            "SELECT id, doc, env_sealed FROM sandboxes
             WHERE id > $1 AND env_sealed IS NULL AND NOT (status = ANY($2))
               AND jsonb_typeof(doc -> 'spec' -> 'env') = 'object'
               AND EXISTS (SELECT 1 FROM jsonb_each_text(doc -> 'spec' -> 'env') AS e
                           WHERE e.value <> '')
             ORDER BY id LIMIT $3
             FOR UPDATE",
        )
        .bind(&after)
        .bind(super::rows::statuses_where(|s| s.is_final()))
        .bind(BATCH)
        .fetch_all(&mut *tx)
        .await?;
        let Some(last) = rows.last() else {
            tx.commit().await?;
            return Ok(sealed_rows);
        };
        after = last.try_get("id")?;
        for row in &rows {
            let s = match sandbox_of(row) {
                Ok(s) => s,
                Err(e) => {
                    let id: String = row.try_get("id").unwrap_or_default();
                    tracing::warn!(sandbox = %id, error = %e, "store: a sandbox row does not decode; its env stays as it is");
                    continue;
                }
            };
            let (doc, blob) = stored(&s)?;
            sqlx::query("UPDATE sandboxes SET doc = $2, env_sealed = $3 WHERE id = $1")
                .bind(s.id.as_str())
                .bind(doc)
                .bind(blob)
                .execute(&mut *tx)
                .await?;
            sealed_rows += 1;
        }
        tx.commit().await?;
    }
}
