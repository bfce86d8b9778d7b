//! The installation's id and the scheduler leader's session lock.

use async_trait::async_trait;
use differently_core::ids::InstallationId;
use sqlx::{Connection, PgConnection};

use super::PgStore;
use crate::prelude::*;
use crate::StoreError;

/// Session advisory lock of the scheduler leader (`dly_ldr`).
const LEADER_LOCK: i64 = 0x0064_6c79_5f6c_6472; // "dly_ldr"

/// Session advisory lock of the webhook fan-out (`dly_whf`).
const WEBHOOK_FAN_OUT_LOCK: i64 = 0x0064_6c79_5f77_6866; // "dly_whf"

/// The advisory lock id of `lead`.
fn lock_of(lead: Lead) -> i64 {
    match lead {
        Lead::Scheduler => LEADER_LOCK,
        Lead::WebhookFanOut => WEBHOOK_FAN_OUT_LOCK,
    }
}

const INSTALLATION_KEY: &str = "installation_id";

/// How long the leader's lock session may go without a query before Postgres ends it
/// (`idle_session_timeout`), releasing the lock. The leader pings every second; a leader that
/// stopped (SIGSTOP, a paused VM, a hung runtime) keeps its TCP connection and so, without
/// this, its lock forever, and no standby could lead: placement and every sweep would stop
/// until it woke. Woken, its next ping fails and it steps down.
pub const LEADER_IDLE_TIMEOUT_SECONDS: u64 = 10;

#[async_trait]
impl InstallationStore for PgStore {
    async fn installation_id(&self) -> Result<InstallationId, StoreError> {
        let mut tx = self.begin().await?;
        sqlx::query("INSERT INTO meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING")
            .bind(INSTALLATION_KEY)
            .bind(InstallationId::new().as_str())
            .execute(&mut *tx)
            .await?;
        let value: String = sqlx::query_scalar("SELECT value FROM meta WHERE key = $1")
            .bind(INSTALLATION_KEY)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        InstallationId::parse(&value)
            .map_err(|e| StoreError::Internal(format!("stored installation id {value:?}: {e}")))
    }

    async fn try_lead_as(&self, lead: Lead) -> Result<Option<Box<dyn Leadership>>, StoreError> {
        let mut standby = self.standby.lock().await;
        let mut conn = match standby.remove(&lead) {
            Some(c) => c,
            None => PgConnection::connect_with(&self.options).await?,
        };
        // On error the connection is dropped (closing its session) and the next attempt
        // opens a fresh one.
        let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(lock_of(lead))
            .fetch_one(&mut conn)
            .await?;
        if got {
            // Postgres ≥ 14; on an older server the lock simply has no idle bound.
            let set = format!("SET idle_session_timeout = '{LEADER_IDLE_TIMEOUT_SECONDS}s'");
            if let Err(e) = sqlx::query(&set).execute(&mut conn).await {
                tracing::warn!(error = %e, "leader lock: cannot bound its idle time; a stopped leader keeps the lock");
            }
            Ok(Some(Box::new(PgLeadership { conn })))
        } else {
            standby.insert(lead, conn);
            Ok(None)
        }
    }
}

/// A held `dly_ldr` session lock on its own connection; dropping it closes the session,
/// which releases the lock.
struct PgLeadership {
    conn: PgConnection,
}

#[async_trait]
impl Leadership for PgLeadership {
    async fn still_held(&mut self) -> bool {
        sqlx::query("SELECT 1")
            .execute(&mut self.conn)
            .await
            .is_ok()
    }
}
