//! Permission to send a command the adapter has already prepared.
//!
//! The API stages an exec's audit record (one Postgres round trip) before the command may
//! run. An adapter that talks HTTP can do its own set-up meanwhile: open the connection to
//! the sandbox and send the request head, holding back only the body that names the command.
//! The command is sent when the caller gives the go-ahead; if the caller withdraws it (the
//! record could not be staged), the request is abandoned with none of its body sent, so no
//! command can have run.

use futures::future::{FutureExt, Shared};
use tokio::sync::oneshot;

use crate::AdapterError;

/// The adapter's side: waits for the caller's go-ahead. Cloneable, so a call that re-resolves
/// its endpoint and tries again waits on the same one.
#[derive(Debug, Clone)]
pub struct GoAhead(Shared<oneshot::Receiver<()>>);

/// The caller's side: [`GoAheadGiver::give`] lets the command go; dropping it unused
/// withdraws it.
#[derive(Debug)]
pub struct GoAheadGiver(oneshot::Sender<()>);

/// The caller withdrew the go-ahead: the command was not sent and must not be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the command was withdrawn before it was sent")]
pub struct Withdrawn;

impl From<Withdrawn> for AdapterError {
    fn from(w: Withdrawn) -> Self {
        AdapterError::permanent(w.to_string())
    }
}

impl GoAhead {
    /// A go-ahead and the giver that opens it.
    pub fn pair() -> (GoAheadGiver, GoAhead) {
        let (tx, rx) = oneshot::channel();
        (GoAheadGiver(tx), GoAhead(rx.shared()))
    }

    /// A go-ahead already given: the command may be sent at once.
    pub fn now() -> GoAhead {
        let (giver, go) = GoAhead::pair();
        giver.give();
        go
    }

    /// Waits until the caller gives the go-ahead or withdraws it.
    pub async fn wait(&self) -> Result<(), Withdrawn> {
        self.0.clone().await.map_err(|_| Withdrawn)
    }
}

impl GoAheadGiver {
    /// Lets the command go.
    pub fn give(self) {
        // The adapter may have given up already (its call failed); nothing waits then.
        let _ = self.0.send(());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_given_go_ahead_opens_every_clone() {
        let (giver, go) = GoAhead::pair();
        let copy = go.clone();
        let waiting = tokio::spawn(async move { copy.wait().await });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "nothing given yet");
        giver.give();
        assert_eq!(go.wait().await, Ok(()));
        assert_eq!(waiting.await.ok(), Some(Ok(())));
        assert_eq!(GoAhead::now().wait().await, Ok(()));
    }

    #[tokio::test]
    async fn a_dropped_giver_withdraws_it() {
        let (giver, go) = GoAhead::pair();
        drop(giver);
        assert_eq!(go.wait().await, Err(Withdrawn));
        assert!(matches!(
            AdapterError::from(Withdrawn),
            AdapterError::Permanent(_)
        ));
    }
}
