//! Publishing with a message id: deduplicated by the server, and once more after a stream
//! lost with its server's store is recreated.

use async_nats::jetstream::{self, context::PublishErrorKind};
use async_nats::HeaderMap;
use bytes::Bytes;

use super::JetStreamBus;
use crate::error::Detail;
use crate::{BusError, Published};

/// A short, stable label of why a publish was not stored, for the failures metric.
fn publish_failure_kind(e: &jetstream::context::PublishError) -> &'static str {
    use jetstream::context::PublishErrorKind as K;
    match e.kind() {
        K::StreamNotFound => "no_leader",
        K::TimedOut => "timed_out",
        K::BrokenPipe => "connection",
        K::MaxPayloadExceeded => "too_large",
        _ => "other",
    }
}

impl JetStreamBus {
    /// [`crate::Bus::publish`]: stored once per `msg_id` within the duplicate window.
    pub(super) async fn publish_deduplicated(
        &self,
        subject: &str,
        msg_id: &str,
        payload: Bytes,
    ) -> Result<Published, BusError> {
        let mut recreated = false;
        loop {
            let mut headers = HeaderMap::new();
            headers.insert(async_nats::header::NATS_MESSAGE_ID, msg_id);
            let ack = self
                .js
                .publish_with_headers(subject.to_owned(), headers, payload.clone())
                .await
                .map_err(|e| BusError::Publish(Detail::caused(format!("{subject}: {e}"), e)))?;
            let e = match ack.await {
                Ok(ack) => {
                    return Ok(if ack.duplicate {
                        Published::Duplicate
                    } else {
                        Published::Stored
                    })
                }
                Err(e) => e,
            };
            // Another publish of this very message id is being stored right now (a retry
            // raced the original; JetStream error 10158): it will be stored once, which is
            // what a duplicate means.
            if e.to_string().contains("duplicate message id is in process") {
                return Ok(Published::Duplicate);
            }
            // "No stream found" is the client's word for "no responders": either the
            // server lost its store (recreate what this bus ensured, publish once more) or,
            // in a cluster, the stream's leader is being elected (say so; the caller retries).
            if e.kind() == PublishErrorKind::StreamNotFound
                && !recreated
                && self.recreate_lost_stream_for(subject).await
            {
                recreated = true;
                continue;
            }
            let why = match e.kind() {
                PublishErrorKind::StreamNotFound => {
                    "no stream leader answered (an election in progress, or the stream is \
                     missing)"
                        .to_owned()
                }
                _ => e.to_string(),
            };
            metrics::counter!("differently_bus_publish_failures_total", "why" => publish_failure_kind(&e))
                .increment(1);
            return Err(BusError::Publish(Detail::caused(
                format!("{subject}: not stored: {why}"),
                e,
            )));
        }
    }
}
