//! The webhook objects (`routes::webhooks`), kept apart from the rest of the catalogue's
//! schemas so the feature reads in one place. Written here because the routes serve the
//! store's records (`store::webhooks`), whose crate derives no schemas.

use differently_store::webhooks::MAX_RESPONSE_BODY_BYTES;
use serde_json::{json, Map, Value};

use super::{array_of, id_of, nullable, page_of, served, time, time_or_null, typed};

/// `whk_…` and `whd_…`.
pub(in crate::openapi) const WEBHOOK_PREFIX: &str = "whk";
pub(in crate::openapi) const DELIVERY_PREFIX: &str = "whd";

/// Adds the webhook schemas to `s`.
pub(in crate::openapi) fn add(s: &mut Map<String, Value>) {
    let webhook: Vec<(&str, Value)> = vec![
        ("id", id_of(WEBHOOK_PREFIX)),
        ("orgId", id_of(differently_core::OrgId::PREFIX)),
        ("projectId", id_of(differently_core::ProjectId::PREFIX)),
        ("url", typed("string")),
        ("eventTypes", array_of(typed("string"))),
        ("description", nullable("string")),
        ("enabled", typed("boolean")),
        ("disabledReason", nullable("string")),
        (
            "consecutiveFailures",
            json!({ "type": "integer", "minimum": 0 }),
        ),
        ("failingSince", time_or_null()),
        ("previousSecretExpiresAt", time_or_null()),
        ("createdAt", time()),
        ("updatedAt", time()),
    ];
    s.insert("Webhook".to_owned(), served(&webhook));
    s.insert("WebhookList".to_owned(), page_of("Webhook"));
    let mut with_secret = webhook.clone();
    with_secret.push((
        "secret",
        json!({ "type": "string", "pattern": "^whsec_[A-Za-z0-9+/]+=*$",
                "description": "The signing secret, shown this once." }),
    ));
    s.insert("WebhookWithSecret".to_owned(), served(&with_secret));
    s.insert(
        "WebhookDelivery".to_owned(),
        served(&[
            ("id", id_of(DELIVERY_PREFIX)),
            ("webhookId", id_of(WEBHOOK_PREFIX)),
            ("eventId", typed("string")),
            ("eventType", typed("string")),
            (
                "status",
                json!({ "type": "string", "enum": ["pending", "succeeded", "failed"] }),
            ),
            ("attempts", json!({ "type": "integer", "minimum": 0 })),
            ("nextAttemptAt", time_or_null()),
            ("responseCode", nullable("integer")),
            ("latencyMs", nullable("integer")),
            ("lastError", nullable("string")),
            (
                "responseBody",
                json!({ "type": ["string", "null"], "maxLength": MAX_RESPONSE_BODY_BYTES }),
            ),
            ("createdAt", time()),
            ("updatedAt", time()),
            ("deliveredAt", time_or_null()),
        ]),
    );
    s.insert("WebhookDeliveryList".to_owned(), page_of("WebhookDelivery"));
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use chrono::Utc;
    use differently_core::{OrgId, ProjectId};
    use differently_store::webhooks::{Delivery, DeliveryStatus, Webhook};
    use serde_json::{Map, Value};

    fn keys(v: &Value) -> BTreeSet<String> {
        v.as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default()
    }

    fn schema(name: &str) -> Value {
        let mut s = Map::new();
        super::add(&mut s);
        s.remove(name).unwrap_or(Value::Null)
    }

    fn required(v: &Value) -> BTreeSet<String> {
        v["required"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// What the routes serve has exactly the fields the schemas list, all present.
    #[test]
    fn served_webhooks_and_deliveries_have_exactly_their_schemas_fields() {
        let now = Utc::now();
        let w = Webhook {
            id: "whk_01ARZ3NDEKTSV4RRFFQ69G5FAV".into(),
            org_id: OrgId::new(),
            project_id: ProjectId::new(),
            url: "https://h.example.com/".into(),
            event_types: vec![],
            description: None,
            enabled: true,
            disabled_reason: None,
            consecutive_failures: 0,
            failing_since: None,
            previous_secret_expires_at: None,
            created_at: now,
            updated_at: now,
        };
        let served = serde_json::to_value(&w).unwrap_or_default();
        let s = schema("Webhook");
        assert_eq!(keys(&served), keys(&s["properties"]));
        assert_eq!(keys(&served), required(&s));
        let d = Delivery {
            id: "whd_01ARZ3NDEKTSV4RRFFQ69G5FAV".into(),
            webhook_id: w.id.clone(),
            org_id: w.org_id.clone(),
            project_id: w.project_id.clone(),
            event_id: "e".into(),
            event_type: "sandbox.status.changed".into(),
            body: "{\"secret-free\":true}".into(),
            status: DeliveryStatus::Pending,
            attempts: 0,
            next_attempt_at: Some(now),
            response_code: None,
            latency_ms: None,
            last_error: None,
            response_body: None,
            created_at: now,
            updated_at: now,
            delivered_at: None,
            lease_until: None,
        };
        let served = serde_json::to_value(&d).unwrap_or_default();
        let s = schema("WebhookDelivery");
        assert_eq!(keys(&served), keys(&s["properties"]));
        assert_eq!(keys(&served), required(&s));
        // The body and the lease are internal.
        assert!(served.get("body").is_none() && served.get("leaseUntil").is_none());
        let mut with = keys(&schema("Webhook")["properties"]);
        with.insert("secret".into());
        assert_eq!(with, keys(&schema("WebhookWithSecret")["properties"]));
    }
}
