//! Which incarnation of a stream the server holds, watched for the event readers.
//!
//! A NATS server that lost its store gets its streams back empty from the first publisher
//! (`recreate_lost_stream_for`), and their sequences start again at 1. An event reader
//! resumes after the last sequence it forwarded, so on the new stream it would wait for
//! sequences that come only much later, and its readers (an API's waiters, placement's
//! wake-ups, SSE clients) would hear nothing. The ordered consumer gives no sign of it: the
//! client makes its consumer again on its own, after the sequence it had reached. So one task
//! per stream and process asks for the stream's info every [`STREAM_CHECK`] while anyone
//! reads it, and publishes the stream's creation time; a reader that sees it change starts
//! again from the new stream's start.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

use super::JetStreamBus;

/// How often a followed stream's info is asked for: the longest an event reader keeps
/// waiting on a stream made anew, beyond the client noticing its consumer is gone.
pub(super) const STREAM_CHECK: Duration = Duration::from_secs(5);

/// Longest one info request may take; a stream electing a leader answers none, and the
/// check simply comes again.
const INFO_TIMEOUT: Duration = Duration::from_secs(3);

/// When a stream was created, in nanoseconds since the epoch: different for each
/// incarnation of a stream of the same name.
pub(super) type Born = i128;

/// Each followed stream's watch, shared by the readers of one bus (and its clones).
pub(super) type Epochs = Arc<Mutex<HashMap<String, watch::Sender<Option<Born>>>>>;

impl JetStreamBus {
    /// A receiver of `stream`'s creation time (`None` until first read). The task that reads
    /// it runs while any receiver of the stream is held, and ends with the last one.
    pub(super) fn stream_epoch(&self, stream: &str) -> watch::Receiver<Option<Born>> {
        let mut epochs = self.epochs.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(tx) = epochs.get(stream) {
            return tx.subscribe();
        }
        let (tx, rx) = watch::channel(None);
        epochs.insert(stream.to_owned(), tx.clone());
        drop(epochs);
        tokio::spawn(self.clone().watch_epoch(stream.to_owned(), tx));
        rx
    }

    async fn watch_epoch(self, stream: String, tx: watch::Sender<Option<Born>>) {
        loop {
            {
                // Under the map's lock: a reader that subscribes now finds either this task
                // still running or no entry, and then starts a task of its own.
                let mut epochs = self.epochs.lock().unwrap_or_else(PoisonError::into_inner);
                if tx.receiver_count() == 0 {
                    epochs.remove(&stream);
                    return;
                }
            }
            match tokio::time::timeout(INFO_TIMEOUT, self.setup.get_stream(&stream)).await {
                Ok(Ok(s)) => {
                    let born = s.cached_info().created.unix_timestamp_nanos();
                    tx.send_if_modified(|had| {
                        let moved = *had != Some(born);
                        *had = Some(born);
                        moved
                    });
                }
                Ok(Err(e)) => {
                    tracing::debug!(stream, error = %e, "bus: cannot read the stream's info")
                }
                Err(_) => tracing::debug!(stream, "bus: the stream's info did not come in time"),
            }
            tokio::time::sleep(STREAM_CHECK).await;
        }
    }
}

/// What a reader that knew the stream as born at `known` makes of a reading `now`: the time
/// to keep (the first reading is learnt), and whether the stream was made anew.
pub(super) fn made_anew(known: &mut Option<Born>, now: Option<Born>) -> bool {
    match (*known, now) {
        (_, None) => false,
        (None, Some(n)) => {
            *known = Some(n);
            false
        }
        (Some(k), Some(n)) => {
            *known = Some(n);
            k != n
        }
    }
}

#[cfg(test)]
mod tests {
    use super::made_anew;

    #[test]
    fn the_first_reading_is_learnt_and_only_a_different_one_is_a_new_stream() {
        let mut known = None;
        assert!(!made_anew(&mut known, None));
        assert!(!made_anew(&mut known, Some(7)));
        assert_eq!(known, Some(7));
        assert!(!made_anew(&mut known, Some(7)));
        assert!(!made_anew(&mut known, None), "no reading is no news");
        assert!(made_anew(&mut known, Some(9)));
        assert_eq!(known, Some(9));
        assert!(!made_anew(&mut known, Some(9)));
    }
}
