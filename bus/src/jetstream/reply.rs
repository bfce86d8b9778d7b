//! Request/reply over core NATS: served subjects and requests with a deadline.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;

use super::JetStreamBus;
use crate::error::Detail;
use crate::{BusError, Replier, Request};

impl JetStreamBus {
    /// [`crate::Bus::serve`]: the requests sent to `subject`, each with its replier.
    pub(super) async fn serve_requests(
        &self,
        subject: &str,
    ) -> Result<BoxStream<'static, Request>, BusError> {
        let client = self.js.client();
        let sub = client
            .subscribe(subject.to_owned())
            .await
            .map_err(|e| BusError::Setup(Detail::caused(format!("serve {subject}: {e}"), e)))?;
        // The server has the subscription once it answered a ping: a request sent by another
        // process after `serve` returned reaches it.
        client.flush().await.map_err(|e| {
            BusError::Connection(Detail::caused(format!("serve {subject}: flush: {e}"), e))
        })?;
        Ok(sub
            .filter_map(move |m| {
                let client = client.clone();
                async move {
                    // A plain publish (no reply subject) asks nothing.
                    let reply = m.reply?;
                    Some(Request::new(
                        m.subject.to_string(),
                        m.payload,
                        Box::new(NatsReplier { client, reply }),
                    ))
                }
            })
            .boxed())
    }
}

impl JetStreamBus {
    /// [`crate::Bus::request`]: one request and its answer, or why none came.
    pub(super) async fn send_request(
        &self,
        subject: &str,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<Bytes, BusError> {
        use async_nats::RequestErrorKind as K;
        let request = async_nats::Request::new()
            .payload(payload)
            .timeout(Some(timeout));
        match self
            .js
            .client()
            .send_request(subject.to_owned(), request)
            .await
        {
            Ok(m) => Ok(m.payload),
            Err(e) => Err(match e.kind() {
                K::NoResponders => BusError::NoResponders(Detail::caused(subject, e)),
                K::TimedOut => BusError::Timeout(Detail::caused(
                    format!("{subject}: no answer within {} ms", timeout.as_millis()),
                    e,
                )),
                K::InvalidSubject | K::MaxPayloadExceeded => {
                    BusError::Publish(Detail::caused(format!("{subject}: {e}"), e))
                }
                _ => BusError::Connection(Detail::caused(format!("{subject}: {e}"), e)),
            }),
        }
    }
}

impl JetStreamBus {
    /// [`crate::Bus::request_all`]: one request on a fresh inbox, and every answer that
    /// arrives on it within the deadline and the quiet window.
    pub(super) async fn gather(
        &self,
        subject: &str,
        payload: Bytes,
        quiet: Duration,
        deadline: Duration,
    ) -> Result<Vec<Bytes>, BusError> {
        let client = self.js.client();
        let inbox = client.new_inbox();
        let conn = |what: &str, e: &dyn std::fmt::Display| {
            BusError::Connection(Detail::from(format!("{subject}: {what}: {e}")))
        };
        let mut answers = client
            .subscribe(inbox.clone())
            .await
            .map_err(|e| conn("subscribe", &e))?;
        client
            .publish_with_reply(subject.to_owned(), inbox, payload)
            .await
            .map_err(|e| BusError::Publish(Detail::caused(format!("{subject}: {e}"), e)))?;
        client.flush().await.map_err(|e| conn("flush", &e))?;
        let mut got = Vec::new();
        let mut until = tokio::time::Instant::now() + deadline;
        while let Ok(Some(m)) = tokio::time::timeout_at(until, answers.next()).await {
            // A status message (no responders: 503) answers nothing.
            if m.status.is_some() {
                break;
            }
            got.push(m.payload);
            until = tokio::time::Instant::now() + quiet;
        }
        let _ = answers.unsubscribe().await;
        Ok(got)
    }
}

/// Answers one served request by publishing to its reply subject.
struct NatsReplier {
    client: async_nats::Client,
    reply: async_nats::Subject,
}

#[async_trait]
impl Replier for NatsReplier {
    async fn reply(self: Box<Self>, payload: Bytes) -> Result<(), BusError> {
        self.client
            .publish(self.reply, payload)
            .await
            .map_err(|e| BusError::Publish(Detail::caused(format!("reply: {e}"), e)))
    }
}
