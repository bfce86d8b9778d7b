//! The installation's id and the process-wide leadership flags.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use differently_core::ids::InstallationId;

use super::MemoryStore;
use crate::prelude::*;
use crate::StoreError;

#[async_trait]
impl InstallationStore for MemoryStore {
    async fn installation_id(&self) -> Result<InstallationId, StoreError> {
        let mut st = self.lock();
        Ok(st
            .installation_id
            .get_or_insert_with(InstallationId::new)
            .clone())
    }

    async fn try_lead_as(&self, lead: Lead) -> Result<Option<Box<dyn Leadership>>, StoreError> {
        let flag = match lead {
            Lead::Scheduler => &self.leader,
            Lead::WebhookFanOut => &self.fan_out_leader,
        };
        if flag
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            Ok(Some(Box::new(MemoryLeadership { flag: flag.clone() })))
        } else {
            Ok(None)
        }
    }
}

/// Leadership of a `MemoryStore`: a process-wide flag cleared on drop.
struct MemoryLeadership {
    flag: Arc<AtomicBool>,
}

#[async_trait]
impl Leadership for MemoryLeadership {
    async fn still_held(&mut self) -> bool {
        true
    }
}

impl Drop for MemoryLeadership {
    fn drop(&mut self) {
        self.flag.store(false, Ordering::SeqCst);
    }
}
