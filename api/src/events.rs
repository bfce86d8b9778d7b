//! One subscription per API process to every status event, fanned out to local waiters
//! (`GET /v1/sandboxes/{id}/wait`), so waiting costs no database polling on the fast path.

use std::time::Duration;

use differently_bus::Bus;
use differently_bus_schema::{Envelope, Naming, StatusChanged};
use differently_core::{SandboxId, SandboxStatus};
use futures::StreamExt;
use tokio::sync::broadcast;

/// A status change seen on the bus.
#[derive(Debug, Clone)]
pub struct StatusEvent {
    pub sandbox_id: SandboxId,
    pub status: SandboxStatus,
}

/// Fan-out of status events inside one process.
#[derive(Clone)]
pub struct EventHub {
    tx: broadcast::Sender<StatusEvent>,
}

impl EventHub {
    /// Starts following the event stream in the background.
    pub fn start(bus: std::sync::Arc<dyn Bus>, naming: Naming) -> EventHub {
        let (tx, _) = broadcast::channel(4096);
        let hub = EventHub { tx: tx.clone() };
        tokio::spawn(async move {
            let stream = naming.events_stream().name;
            let filter = format!("{}.evt.>", naming.prefix());
            loop {
                match bus.events(&stream, &filter, None).await {
                    Ok(mut events) => {
                        while let Some(item) = events.next().await {
                            match item {
                                Ok(ev) => {
                                    if let Ok(env) = serde_json::from_slice::<Envelope<StatusChanged>>(
                                        &ev.payload,
                                    ) {
                                        let _ = tx.send(StatusEvent {
                                            sandbox_id: env.sandbox_id,
                                            status: env.body.status,
                                        });
                                    }
                                }
                                Err(e) => {
                                    tracing::warn!(error = %e, "event stream error");
                                    break;
                                }
                            }
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot follow events; retrying"),
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        hub
    }

    /// A receiver of every event from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<StatusEvent> {
        self.tx.subscribe()
    }
}
