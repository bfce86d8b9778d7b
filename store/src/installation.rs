//! The installation as a whole: its id and the scheduler's leadership.

use async_trait::async_trait;
use differently_core::ids::InstallationId;

use crate::StoreError;

/// What belongs to the installation rather than a tenant: its id and the scheduler's
/// leadership lock.
#[async_trait]
pub trait InstallationStore: Send + Sync {
    /// This installation's id, created once and kept (backend instances are tagged with it).
    async fn installation_id(&self) -> Result<InstallationId, StoreError>;

    /// Tries to become the scheduler leader. `Some` while held; dropping it releases it.
    async fn try_lead(&self) -> Result<Option<Box<dyn Leadership>>, StoreError> {
        self.try_lead_as(Lead::Scheduler).await
    }

    /// Tries to take the lock of `lead`: one process at a time across the installation.
    /// `Some` while held; dropping it releases it.
    async fn try_lead_as(&self, lead: Lead) -> Result<Option<Box<dyn Leadership>>, StoreError>;
}

/// What a process may lead, each under its own lock, so leading one does not tie up the
/// other's process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lead {
    /// Placement, the sweeps and the other scheduler loops.
    Scheduler,
    /// Reading the public stream into webhook deliveries (`differently_webhooks`): one
    /// reader, so its position can be kept in one place and nothing needs an ack.
    WebhookFanOut,
}

/// A held leadership. Postgres: a session advisory lock on a dedicated connection.
#[async_trait]
pub trait Leadership: Send {
    /// Checks (pings) that the lock is still held; `false` means step down now.
    async fn still_held(&mut self) -> bool;
}
