//! Webhooks (`docs/webhooks.md`): a project's public events, sent as signed HTTPS `POST`s.
//! Creating one and rotating its secret are the only answers that carry the signing secret
//! ([`WebhookWithSecret`]); every other read leaves it out. Reading takes `sandboxes:read`,
//! changing `sandboxes:write`; another tenant's webhook is the same 404 as a missing one.

use futures::stream::BoxStream;
use reqwest::Method;

use crate::{
    encode, query, Client, CreateWebhook, Result, UpdateWebhook, Webhook, WebhookDelivery,
    WebhookWithSecret,
};

/// `/v1/webhooks/{id}{rest}`.
fn webhook_path(id: &str, rest: &str) -> String {
    format!("/v1/webhooks/{}{rest}", encode(id))
}

impl Client {
    /// `POST /v1/webhooks`: the webhook and its secret, shown this once. Without a secrets
    /// key on the server, 409; a URL the operator's rules refuse, 422 with field `url`.
    /// With `idempotency_key`, a retry creates no second webhook: it is a 409 whose
    /// `details.id` names the first, never with its secret (shown once).
    pub async fn create_webhook(
        &self,
        req: &CreateWebhook,
        idempotency_key: Option<&str>,
    ) -> Result<WebhookWithSecret> {
        let headers: Vec<(&str, &str)> = idempotency_key
            .map(|k| ("idempotency-key", k))
            .into_iter()
            .collect();
        self.json(Method::POST, "/v1/webhooks", Some(req), &headers)
            .await
    }

    /// Every webhook the key can see (of `project_id` only, when given).
    pub fn list_webhooks(&self, project_id: Option<&str>) -> BoxStream<'static, Result<Webhook>> {
        self.paginate(format!(
            "/v1/webhooks{}",
            query(&[("projectId", project_id.map(str::to_owned))])
        ))
    }

    /// `GET /v1/webhooks/{id}`.
    pub async fn get_webhook(&self, id: &str) -> Result<Webhook> {
        self.json::<_, ()>(Method::GET, &webhook_path(id, ""), None, &[])
            .await
    }

    /// `PATCH /v1/webhooks/{id}`: URL, filter, description, enabled. Re-enabling forgets
    /// the failures that disabled it and resumes its pending deliveries.
    pub async fn update_webhook(&self, id: &str, update: &UpdateWebhook) -> Result<Webhook> {
        self.json(Method::PATCH, &webhook_path(id, ""), Some(update), &[])
            .await
    }

    /// `DELETE /v1/webhooks/{id}`, with its delivery log.
    pub async fn delete_webhook(&self, id: &str) -> Result<()> {
        self.empty::<()>(Method::DELETE, &webhook_path(id, ""), None)
            .await
    }

    /// `POST /v1/webhooks/{id}/rotate-secret`: the new secret (shown this once). The
    /// replaced one keeps signing next to it until `previous_secret_expires_at`.
    pub async fn rotate_webhook_secret(&self, id: &str) -> Result<WebhookWithSecret> {
        self.json::<_, ()>(Method::POST, &webhook_path(id, "/rotate-secret"), None, &[])
            .await
    }

    /// The webhook's delivery log, newest first.
    pub fn list_webhook_deliveries(&self, id: &str) -> BoxStream<'static, Result<WebhookDelivery>> {
        self.paginate(webhook_path(id, "/deliveries"))
    }

    /// `POST …/deliveries/{deliveryId}/redeliver`: the delivery, pending and due now; the
    /// receiver sees the same `webhook-id` as before.
    pub async fn redeliver_webhook_delivery(
        &self,
        id: &str,
        delivery_id: &str,
    ) -> Result<WebhookDelivery> {
        self.json::<_, ()>(
            Method::POST,
            &webhook_path(
                id,
                &format!("/deliveries/{}/redeliver", encode(delivery_id)),
            ),
            None,
            &[],
        )
        .await
    }
}
