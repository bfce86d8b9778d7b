//! Typed consumption: consumers receive decoded, version-checked envelopes and never parse
//! payloads themselves. What cannot be decoded is dealt with here, once, the same way for
//! every consumer: a newer major version is left for a newer consumer (redelivered later), a
//! malformed message is terminated (it would fail the same way forever), and both are logged
//! and counted (`differently_bus_undecodable_total`).

use std::marker::PhantomData;
use std::time::Duration;

use async_trait::async_trait;
use differently_bus_schema::{
    decode, public::PublicDecodeError, ConsumerDef, DecodeError, Envelope, Message, PublicEvent,
};
use futures::stream::{BoxStream, StreamExt};

use crate::{Bus, BusError, Delivery, Pull};

/// How long a message of a newer schema version waits before it is offered again (to this
/// or, during a rolling upgrade, a newer consumer).
pub const NEWER_VERSION_DELAY: Duration = Duration::from_secs(5);

/// A decoded message and the delivery it came in (for acks and the redelivery count).
pub struct Typed<T> {
    pub env: Envelope<T>,
    pub delivery: Delivery,
}

/// A pull consumer that yields only messages of `T`.
pub struct TypedPull<T> {
    inner: Box<dyn Pull>,
    _message: PhantomData<fn() -> T>,
}

impl<T: Message> TypedPull<T> {
    /// See [`Pull::set_room`].
    pub fn set_room(&mut self, room: usize) {
        self.inner.set_room(room);
    }

    /// Waits up to `wait` for the next decodable message; `Ok(None)` when none arrived (an
    /// undecodable one is handled and also answers `None`, so the caller's loop goes on).
    pub async fn next(&mut self, wait: Duration) -> Result<Option<Typed<T>>, BusError> {
        let Some(delivery) = self.inner.next(wait).await? else {
            return Ok(None);
        };
        match decode::<T>(&delivery.payload) {
            Ok(env) => Ok(Some(Typed { env, delivery })),
            Err(e) => {
                refuse::<T>(&delivery.subject, &e);
                let outcome = match e {
                    DecodeError::NewerVersion { .. } => {
                        delivery.acker.nak(NEWER_VERSION_DELAY).await
                    }
                    _ => delivery.acker.term().await,
                };
                if let Err(e) = outcome {
                    tracing::warn!(subject = %delivery.subject, error = %e, "bus: cannot settle an undecodable message");
                }
                Ok(None)
            }
        }
    }
}

/// One decoded event of the event stream, with its stream sequence.
#[derive(Debug, Clone)]
pub struct TypedEvent<T> {
    pub seq: u64,
    pub subject: String,
    pub env: Envelope<T>,
}

/// Typed access to any [`Bus`].
#[async_trait]
pub trait BusExt {
    /// Binds to a durable pull consumer whose messages are `T`.
    async fn pull_typed<T: Message>(
        &self,
        consumer: &ConsumerDef,
    ) -> Result<TypedPull<T>, BusError>;

    /// Reads the event stream as `T` (see [`Bus::events`]). Events that do not decode are
    /// skipped (and counted); a stream error ends the stream after it is yielded.
    async fn events_typed<T: Message>(
        &self,
        stream: &str,
        filter: &str,
        after: Option<u64>,
    ) -> Result<BoxStream<'static, Result<TypedEvent<T>, BusError>>, BusError>;
}

#[async_trait]
impl<B: Bus + ?Sized> BusExt for B {
    async fn pull_typed<T: Message>(
        &self,
        consumer: &ConsumerDef,
    ) -> Result<TypedPull<T>, BusError> {
        Ok(TypedPull {
            inner: self.pull(consumer).await?,
            _message: PhantomData,
        })
    }

    async fn events_typed<T: Message>(
        &self,
        stream: &str,
        filter: &str,
        after: Option<u64>,
    ) -> Result<BoxStream<'static, Result<TypedEvent<T>, BusError>>, BusError> {
        let events = self.events(stream, filter, after).await?;
        Ok(events
            .filter_map(|item| async move {
                match item {
                    Err(e) => Some(Err(e)),
                    Ok(ev) => decode_event::<T>(&ev).map(|env| {
                        Ok(TypedEvent {
                            seq: ev.seq,
                            subject: ev.subject,
                            env,
                        })
                    }),
                }
            })
            .boxed())
    }
}

/// Decodes one event of the event stream as `T`, the way [`BusExt::events_typed`] does: what
/// does not decode is logged, counted and answered `None`. For readers of [`Bus::events`] that
/// look at the subject first and decode only the events they act on.
pub fn decode_event<T: Message>(ev: &crate::Event) -> Option<Envelope<T>> {
    decode::<T>(&ev.payload)
        .inspect_err(|e| refuse::<T>(&ev.subject, e))
        .ok()
}

/// Decodes a public event for a reader of the public stream (the events API, webhooks).
/// Public events are not envelopes, but what this build cannot read is dealt with as for
/// any message: logged and counted in `differently_bus_undecodable_total` (`kind="public"`),
/// so a rolling upgrade that outpaces a reader shows on the same panel. The caller decides
/// what skipping means for it (the error says why).
pub fn decode_public(subject: &str, payload: &[u8]) -> Result<PublicEvent, PublicDecodeError> {
    PublicEvent::decode(payload).inspect_err(|e| {
        let why = match e {
            PublicDecodeError::NewerVersion { .. } => "newer_version",
            PublicDecodeError::Malformed(_) => "malformed",
        };
        tracing::warn!(%subject, kind = "public", error = %e, "bus: undecodable public event");
        metrics::counter!("differently_bus_undecodable_total", "kind" => "public", "why" => why)
            .increment(1);
    })
}

fn refuse<T: Message>(subject: &str, e: &DecodeError) {
    let why = match e {
        DecodeError::NewerVersion { .. } => "newer_version",
        DecodeError::NotAnEnvelope(_) => "not_an_envelope",
        DecodeError::Malformed { .. } => "malformed",
    };
    tracing::warn!(%subject, kind = T::KIND, error = %e, "bus: undecodable message");
    metrics::counter!("differently_bus_undecodable_total", "kind" => T::KIND, "why" => why)
        .increment(1);
}
