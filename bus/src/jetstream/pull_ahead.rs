//! The work-queue consumer read through one standing subscription (`Bus::pull_ahead`).

use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull};
use async_trait::async_trait;
use differently_bus_schema::ConsumerDef;
use futures::StreamExt;

use super::pull::{delivery_of, PULL_EXPIRY};
use super::JetStreamBus;
use crate::error::Detail;
use crate::{BusError, Delivery, Pull};

/// A bound durable pull consumer read through one standing subscription
/// ([`crate::Bus::pull_ahead`]): the client keeps pull requests of up to the bus's fetch
/// batch open at the server, each expiring after [`PULL_EXPIRY`] as `JetStreamPull`'s do (so a request lost
/// with a consumer's leader is replaced within a second), and the server pushes messages
/// into it as they are stored. A request's end, a heartbeat and the next request are the
/// client's business; an exec's two events cost two deliveries and two acks.
///
/// Unlike `JetStreamPull` it does not drop messages held past their ack-wait: it holds at
/// most a batch or two, its caller takes them within milliseconds, and one redelivered meanwhile
/// is handled twice, which its callers must absorb anyway.
struct AheadPull {
    bus: JetStreamBus,
    def: ConsumerDef,
    reconnects: tokio::sync::watch::Receiver<u64>,
    /// `None` after the subscription failed or ended: the next call makes another (binding
    /// the consumer again, which recreates one a server lost with its store).
    messages: Option<pull::Stream>,
}

impl AheadPull {
    async fn open(&mut self) -> Result<pull::Stream, BusError> {
        self.reconnects.borrow_and_update();
        let consumer = self.bus.consumer(&self.def).await?;
        consumer
            .stream()
            .max_messages_per_batch(self.bus.fetch_batch)
            .expires(PULL_EXPIRY)
            // Under half the expiry, as the server requires.
            .heartbeat(PULL_EXPIRY * 2 / 5)
            .messages()
            .await
            .map_err(|e| BusError::Consume(Detail::caused(format!("pull subscription: {e}"), e)))
    }

    /// What the subscription's next item means: a message, or the subscription given up
    /// (dropped, so the next call makes another) with why.
    fn take(
        &mut self,
        item: Option<Result<jetstream::Message, pull::MessagesError>>,
    ) -> Result<Option<Delivery>, BusError> {
        match item {
            Some(Ok(message)) => delivery_of(message).map(Some),
            Some(Err(e)) => {
                self.messages = None;
                Err(BusError::Consume(Detail::caused(format!("pull: {e}"), e)))
            }
            None => {
                self.messages = None;
                Err(BusError::Consume(
                    "pull subscription ended; it is made again".into(),
                ))
            }
        }
    }
}

#[async_trait]
impl Pull for AheadPull {
    async fn next(&mut self, wait: Duration) -> Result<Option<Delivery>, BusError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let mut messages = match self.messages.take() {
                Some(m) => m,
                None => self.open().await?,
            };
            let item = tokio::select! {
                n = tokio::time::timeout_at(deadline, messages.next()) => n,
                // Its requests went to a server this client has left: make them anew.
                Ok(()) = self.reconnects.changed() => {
                    tracing::debug!("bus: connection moved; making the pull subscription again");
                    continue;
                }
            };
            self.messages = Some(messages);
            return match item {
                Ok(item) => self.take(item),
                Err(_) => Ok(None),
            };
        }
    }

    async fn next_buffered(&mut self) -> Result<Option<Delivery>, BusError> {
        use futures::FutureExt;
        let Some(messages) = self.messages.as_mut() else {
            return Ok(None);
        };
        match messages.next().now_or_never() {
            Some(item) => self.take(item),
            None => Ok(None),
        }
    }
}

impl JetStreamBus {
    /// [`crate::Bus::pull_ahead`]: the consumer bound and its subscription open.
    pub(super) async fn bind_pull_ahead(
        &self,
        consumer: &ConsumerDef,
    ) -> Result<Box<dyn Pull>, BusError> {
        let mut pull = AheadPull {
            bus: self.clone(),
            def: consumer.clone(),
            reconnects: self.reconnects.clone(),
            messages: None,
        };
        // Bound here, so a consumer that cannot be made is the caller's error, as `pull`'s.
        pull.messages = Some(pull.open().await?);
        Ok(Box::new(pull))
    }
}
