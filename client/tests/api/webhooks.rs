//! Webhooks, event schemas, event credentials and the public event stream, through the client.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_round_trip_and_keep_their_secret_to_create_and_rotate() {
    let dev = Dev::start();
    let c = dev.client();
    let created = c
        .create_webhook(
            &CreateWebhook {
                url: "https://hooks.example.com/differently".into(),
                event_types: Some(vec!["sandbox.status.changed".into()]),
                description: Some("ci".into()),
                ..CreateWebhook::default()
            },
            None,
        )
        .await
        .expect("create");
    let hook = &created.webhook;
    assert!(
        created.secret.starts_with("whsec_"),
        "a Standard Webhooks secret"
    );
    assert!(hook.id.starts_with("whk_") && hook.enabled, "{hook:?}");
    assert_eq!(hook.event_types, ["sandbox.status.changed"]);
    assert_eq!(hook.description.as_deref(), Some("ci"));

    let listed: Vec<_> = c.list_webhooks(None).try_collect().await.expect("list");
    assert_eq!(listed.iter().map(|w| &w.id).collect::<Vec<_>>(), [&hook.id]);
    let read = c.get_webhook(&hook.id).await.expect("get");
    assert_eq!(&read, hook);
    assert!(!read.extra.contains_key("secret"), "{read:?}");

    let changed = c
        .update_webhook(
            &hook.id,
            &UpdateWebhook {
                event_types: Some(vec!["sandbox.*".into()]),
                description: Some(None),
                enabled: Some(false),
                ..UpdateWebhook::default()
            },
        )
        .await
        .expect("update");
    assert_eq!(
        (
            changed.event_types.as_slice(),
            changed.description.as_deref(),
            changed.enabled
        ),
        (&["sandbox.*".to_owned()][..], None, false)
    );

    let rotated = c.rotate_webhook_secret(&hook.id).await.expect("rotate");
    assert!(rotated.secret.starts_with("whsec_"));
    assert!(
        rotated.secret != created.secret,
        "the secret did not change"
    );
    assert!(
        rotated.webhook.previous_secret_expires_at.is_some(),
        "the old secret overlaps: {rotated:?}"
    );

    let deliveries: Vec<_> = c
        .list_webhook_deliveries(&hook.id)
        .try_collect()
        .await
        .expect("deliveries");
    assert!(
        deliveries.is_empty(),
        "a disabled webhook, no events: {deliveries:?}"
    );
    let e = c
        .redeliver_webhook_delivery(&hook.id, "whd_00000000000000000000000000")
        .await
        .expect_err("no such delivery");
    assert_eq!(
        (e.status(), e.code()),
        (Some(404), Some("not_found")),
        "{e}"
    );

    // The URL rules answer 422 naming the field (dev allows loopback receivers, not other
    // private addresses); a missing webhook is 404.
    let e = c
        .create_webhook(
            &CreateWebhook {
                url: "https://10.1.2.3/hook".into(),
                ..CreateWebhook::default()
            },
            None,
        )
        .await
        .expect_err("a private address");
    let api = e.api().expect("the API's error");
    assert_eq!(
        (api.status, api.code.as_str(), api.field.as_deref()),
        (422, "validation_failed", Some("url")),
        "{e}"
    );
    c.delete_webhook(&hook.id).await.expect("delete");
    let e = c.get_webhook(&hook.id).await.expect_err("deleted");
    assert_eq!(
        (e.status(), e.code()),
        (Some(404), Some("not_found")),
        "{e}"
    );
    let e = c.delete_webhook(&hook.id).await.expect_err("deleted twice");
    assert_eq!(e.status(), Some(404), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_schemas_credentials_and_the_public_stream() {
    let dev = Dev::start();
    let c = dev.client();
    let schemas = c.event_schemas().await.expect("schemas");
    assert_eq!(schemas.version, 1);
    let types: Vec<&str> = schemas
        .items
        .iter()
        .map(|i| i.event_type.as_str())
        .collect();
    assert!(
        types.contains(&"sandbox.status.changed") && types.contains(&"webhook.disabled"),
        "{types:?}"
    );
    let one = c
        .event_schema("sandbox.status.changed")
        .await
        .expect("one schema");
    assert_eq!(one["title"], "sandbox.status.changed");
    let e = c.event_schema("sandbox.nope").await.expect_err("unknown");
    assert_eq!(e.status(), Some(404), "{e}");

    // `differently dev` has no NATS auth callout: 501 with its stable code, typed.
    let e = c
        .create_event_credentials(&EventCredentialsRequest {
            ttl_seconds: Some(600),
            ..EventCredentialsRequest::default()
        })
        .await
        .expect_err("no callout in dev");
    assert!(matches!(&e, Error::Api(_)), "{e:?}");
    assert_eq!(
        (e.status(), e.code()),
        (Some(501), Some("unsupported_operation")),
        "{e}"
    );
    let e = c
        .revoke_event_credentials("evc_01234567890123456789012345")
        .await
        .expect_err("no callout in dev");
    assert_eq!(
        (e.status(), e.code()),
        (Some(501), Some("unsupported_operation")),
        "{e}"
    );

    // The public stream carries the contract's envelope, narrowed to the types asked.
    let id = running(&c, &CreateSandbox::default()).await;
    let mut events = c
        .public_events(PublicEventFilter {
            sandbox_id: Some(id.clone()),
            types: vec!["sandbox.status.*".into()],
            after: Some(0),
            ..PublicEventFilter::default()
        })
        .await
        .expect("public events");
    let mut statuses = Vec::new();
    let mut last = 0;
    while statuses.last().map(String::as_str) != Some("running") {
        let ev = tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .expect("an event in time")
            .expect("open")
            .expect("event");
        assert!(ev.id > last, "sequences rise: {} after {last}", ev.id);
        last = ev.id;
        assert_eq!(
            (
                ev.event.version,
                ev.event.event_type.as_str(),
                ev.event.sandbox_id.as_deref()
            ),
            (1, "sandbox.status.changed", Some(id.as_str()))
        );
        statuses.push(ev.event.data["status"].as_str().unwrap_or("?").to_owned());
    }
    assert_eq!(events.last_event_id(), Some(last));
    let e = c
        .public_events(PublicEventFilter {
            types: vec!["sandbox.nope".into()],
            ..PublicEventFilter::default()
        })
        .await
        .err()
        .expect("a filter that matches no type");
    assert_eq!(e.status(), Some(400), "{e}");
}
