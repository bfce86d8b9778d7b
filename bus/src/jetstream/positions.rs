//! Where a stream ends and where a durable consumer has acked through: for a reader that
//! keeps its own position (the webhook fan-out) and moves off a durable consumer.

use async_nats::jetstream::context::ConsumerInfoErrorKind;
use async_nats::jetstream::stream::ConsumerErrorKind;
use async_nats::jetstream::ErrorCode;

use super::JetStreamBus;
use crate::error::Detail;
use crate::BusError;

impl JetStreamBus {
    /// [`crate::Bus::last_sequence`].
    pub(super) async fn stream_last_sequence(&self, stream: &str) -> Result<u64, BusError> {
        let mut s = self.stream_or_setup_error(stream).await?;
        let info = s
            .info()
            .await
            .map_err(|e| BusError::Setup(Detail::caused(format!("stream {stream}: {e}"), e)))?;
        Ok(info.state.last_sequence)
    }

    /// [`crate::Bus::consumer_ack_floor`].
    pub(super) async fn durable_ack_floor(
        &self,
        stream: &str,
        durable: &str,
    ) -> Result<Option<u64>, BusError> {
        let s = self.stream_or_setup_error(stream).await?;
        match s.consumer_info(durable).await {
            Ok(info) => Ok(Some(info.ack_floor.stream_sequence)),
            Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => Ok(None),
            Err(e) => Err(BusError::Setup(Detail::caused(
                format!("consumer {stream}/{durable}: {e}"),
                e,
            ))),
        }
    }

    /// [`crate::Bus::delete_consumer`].
    pub(super) async fn delete_durable(&self, stream: &str, durable: &str) -> Result<(), BusError> {
        let s = self.stream_or_setup_error(stream).await?;
        match s.delete_consumer(durable).await {
            Ok(_) => Ok(()),
            Err(e) if matches!(e.kind(), ConsumerErrorKind::JetStream(j) if j.error_code() == ErrorCode::CONSUMER_NOT_FOUND) => {
                Ok(())
            }
            Err(e) => Err(BusError::Setup(Detail::caused(
                format!("deleting consumer {stream}/{durable}: {e}"),
                e,
            ))),
        }
    }
}
