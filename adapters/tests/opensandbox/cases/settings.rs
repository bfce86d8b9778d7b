//! The adapter's settings: the rules that name the field at fault, the capabilities each
//! runtime has, an API key that never shows, and credentials resolved at call time (stored
//! secrets, a rotated key file).

use std::collections::BTreeMap;
use std::time::Duration;

use differently_adapters::credentials::{Credentials, SecretSource, SecretSourceError};
use differently_adapters::opensandbox::{OpenSandboxAdapter, OpenSandboxConfig};
use differently_adapters::registry;
use differently_adapters::{Adapter, AdapterError};
use differently_core::ids::InstallationId;
use differently_core::SandboxId;
use serde_json::json;

use crate::fake_server::{FakeRuntime, FakeServer, Variant};
use crate::support::cases;
use crate::{cmd, create_req, key_file, running, settings, setup, KEY};

fn build_err(v: serde_json::Value) -> (Option<String>, String) {
    cases::build_err("opensandbox", v)
}

#[tokio::test]
async fn configuration_rules_name_the_field() {
    let key = key_file(KEY);
    let base = |extra| settings("http://127.0.0.1:9/v1", &key, extra);
    let cases = [
        (json!({"apiURL": null}), "apiURL"),
        (json!({"apiURL": "ftp://os.example/v1"}), "apiURL"),
        (json!({"caBundle": "/nonexistent/ca.pem"}), "caBundle"),
        (json!({"apiURL": "http://user:pw@os.example/v1"}), "apiURL"),
        (json!({"trust": null}), "trust"),
        (json!({"trust": "trusted"}), "trust"),
        (json!({"isolation": "vm"}), "isolation"),
        (json!({"runtime": "fastsandbox"}), "templateId"),
        (
            json!({"runtime": "fastsandbox", "templateId": "t", "isolation": "container"}),
            "isolation",
        ),
        (
            json!({"runtime": "fastsandbox", "templateId": "t", "ports": "signed"}),
            "ports",
        ),
        (json!({"ports": "signed"}), "ports"),
        (json!({"templateId": "t"}), "templateId"),
        (json!({"egress": "allowlist"}), "egressAllow"),
        (json!({"egressAllow": "pypi.org"}), "egressAllow"),
        (
            json!({"egress": "allowlist", "egressAllow": "pypi.org,bad host"}),
            "egressAllow",
        ),
        (json!({"features": "exec,teleport"}), "features"),
        (json!({"useServerProxy": "maybe"}), "useServerProxy"),
        (json!({"lineEndings": "crlf"}), "lineEndings"),
        (json!({"timeoutSeconds": 30}), "timeoutSeconds"),
        (json!({"poolCPU": "2"}), "poolMemory"),
        (json!({"poolCPU": "two", "poolMemory": "4Gi"}), "poolCPU"),
        (
            json!({"checkpointTimeoutSeconds": "0"}),
            "checkpointTimeoutSeconds",
        ),
        (json!({"apiKeyEnv": "X"}), "apiKeyFile"),
        (json!({"apiKeyFile": null}), "apiKeyEnv"),
        (
            json!({"apiKeyFile": null, "apiKeyEnv": "DIFFERENTLY_TEST_SURELY_UNSET_VAR"}),
            "apiKeyEnv",
        ),
        (json!({"apiKeyFile": "/nonexistent/key"}), "apiKeyFile"),
        (json!({"surprise": 1}), "surprise"),
    ];
    for (extra, field) in cases {
        let (got, message) = build_err(base(extra.clone()));
        assert_eq!(got.as_deref(), Some(field), "{extra}: {message}");
    }
    // Strings for booleans, numbers and lists, as pool configs write them.
    let ok = base(
        json!({"useServerProxy": "false", "checkpointTimeoutSeconds": "60",
                         "egress": "allowlist", "egressAllow": "pypi.org,*.github.com"}),
    );
    let a = registry::build("opensandbox", &ok).unwrap();
    assert_eq!(a.kind(), "opensandbox");
    assert!(a
        .capabilities()
        .contains(&differently_adapters::Capability::NetworkEgressControl));
}

#[tokio::test]
async fn capabilities_follow_the_runtime_table() {
    let key = key_file(KEY);
    let caps = |extra| -> Vec<differently_adapters::Capability> {
        let cfg: OpenSandboxConfig =
            serde_json::from_value(settings("http://127.0.0.1:9/v1", &key, extra)).unwrap();
        let mut all = OpenSandboxAdapter::new(cfg).unwrap().capabilities();
        // Every runtime holds warm instances (claimed by renewing their expiry).
        assert_eq!(
            all.pop(),
            Some(differently_adapters::Capability::Warm),
            "{all:?}"
        );
        all
    };
    assert_eq!(
        caps(json!({})),
        [
            "exec",
            "files",
            "exec.stream",
            "lifecycle.pause",
            "snapshots"
        ]
    );
    assert_eq!(
        caps(json!({"runtime": "kubernetes"})),
        [
            "exec",
            "files",
            "exec.stream",
            "lifecycle.stop",
            "snapshots"
        ]
    );
    assert_eq!(
        caps(json!({"runtime": "kubernetes", "ports": "signed", "egress": "none"})),
        [
            "exec",
            "files",
            "exec.stream",
            "lifecycle.stop",
            "snapshots",
            "ports.expose",
            "network.egress-control"
        ]
    );
    assert_eq!(
        caps(json!({"runtime": "fastsandbox", "templateId": "tpl"})),
        [
            "exec",
            "files",
            "exec.stream",
            "exec.pty",
            "lifecycle.pause",
            "snapshots"
        ]
    );
    // execd's PTY WebSocket only when execd is reached directly (Fast Sandbox's default).
    assert_eq!(
        caps(json!({"useServerProxy": false})),
        [
            "exec",
            "files",
            "exec.stream",
            "exec.pty",
            "lifecycle.pause",
            "snapshots"
        ]
    );
    assert_eq!(
        caps(json!({"features": "exec,exec.pty"})),
        ["exec"],
        "through the server proxy exec.pty is dropped even when declared"
    );
    assert_eq!(
        caps(
            json!({"runtime": "fastsandbox", "templateId": "tpl", "features": "exec,ports.expose"})
        ),
        ["exec", "ports.expose"]
    );
    // The seeds' spellings are accepted for the two API names they rename.
    assert_eq!(
        caps(json!({"features": "exec,lifecycle.pause-resume,snapshots.disk"})),
        ["exec", "lifecycle.pause", "snapshots"]
    );
    let (field, message) = build_err(settings(
        "http://127.0.0.1:9/v1",
        &key,
        json!({"features": "exec,isolation.microvm"}),
    ));
    assert_eq!(field.as_deref(), Some("features"));
    assert!(message.contains("`isolation`"), "{message}");
    // A feature without a working method on the runtime is dropped; declared-only ones stay.
    assert_eq!(
        caps(json!({"features": ["exec", "lifecycle.stop", "ports.expose", "gpu"]})),
        ["exec", "gpu"]
    );
}

#[tokio::test]
async fn the_api_key_never_shows() {
    let s = setup(Variant::Real, FakeRuntime::Docker, json!({})).await;
    assert!(!format!("{:?}", s.adapter).contains(KEY));
    assert!(!format!("{:?}", s.adapter.settings()).contains(KEY));
    let cfg: OpenSandboxConfig = serde_json::from_value(json!({"apiKeyFile": "/k"})).unwrap();
    assert!(!format!("{cfg:?}").contains(KEY));

    // A server that echoes the key in an error: scrubbed.
    s.fake
        .knobs()
        .fail_next
        .push_back(("/sandboxes".to_owned(), 500));
    let e = s.adapter.find(&SandboxId::new()).await.unwrap_err();
    assert!(matches!(e, AdapterError::Transient(_)), "{e:?}");
    assert!(
        !e.to_string().contains(KEY) && e.to_string().contains("***"),
        "{e}"
    );

    // Wrong key: refused, and the message holds neither key.
    let other = FakeServer::start(Variant::Real, FakeRuntime::Docker, "the-other-key-123").await;
    let cfg: OpenSandboxConfig =
        serde_json::from_value(settings(&other.api_url(), &s.key, json!({}))).unwrap();
    let a = OpenSandboxAdapter::new(cfg).unwrap();
    let e = a.health().await.unwrap_err();
    assert!(matches!(e, AdapterError::Permanent(_)), "{e:?}");
    assert!(
        !e.to_string().contains(KEY) && !e.to_string().contains("the-other-key"),
        "{e}"
    );

    // A redirect is not followed, so the key header cannot travel with it.
    s.fake.knobs().redirect_to = Some(format!("{}/x/proxy/44772/ping", s.fake.execd_origin()));
    assert!(matches!(
        s.adapter.health().await,
        Err(AdapterError::Permanent(_))
    ));
    assert_eq!(s.fake.record().key_seen_on_execd, 0);

    // execd reached directly never sees the key; through the server proxy it may.
    let d = setup(
        Variant::Real,
        FakeRuntime::Docker,
        json!({"useServerProxy": false}),
    )
    .await;
    let r = running(&d).await;
    let out = d.adapter.exec(&r, &cmd(&["true"])).await.unwrap();
    assert_eq!(out.exit_code, 0);
    assert_eq!(d.fake.record().key_seen_on_execd, 0);
    assert!(d
        .fake
        .record()
        .requests
        .iter()
        .all(|r| !r.contains("/proxy/44772") || !r.starts_with("POST /v1")));
}

/// An in-memory stored-secret source, as the store provides in a server.
#[derive(Default)]
struct Secrets(std::sync::Mutex<BTreeMap<String, String>>);

impl Secrets {
    fn put(&self, name: &str, value: &str) {
        self.0
            .lock()
            .unwrap()
            .insert(name.to_owned(), value.to_owned());
    }
}

#[async_trait::async_trait]
impl SecretSource for Secrets {
    async fn open(&self, name: &str) -> Result<Option<Vec<u8>>, SecretSourceError> {
        Ok(self.0.lock().unwrap().get(name).map(|v| v.clone().into()))
    }
}

fn secret_settings(api_url: &str, name: &str) -> serde_json::Value {
    json!({
        "apiURL": api_url, "trust": "private", "apiKeySecret": name,
        "timeouts": {"pollMillis": 20, "readySeconds": 20, "requestSeconds": 10},
    })
}

#[tokio::test]
async fn a_replaced_secret_is_sent_on_the_next_call() {
    let fake = FakeServer::start(Variant::Real, FakeRuntime::Docker, KEY).await;
    let secrets = std::sync::Arc::new(Secrets::default());
    secrets.put("os-key", KEY);
    let creds = Credentials::new(secrets.clone());
    let a = registry::build_with(
        "opensandbox",
        &secret_settings(&fake.api_url(), "os-key"),
        &creds,
    )
    .unwrap();
    a.health().await.unwrap();
    let sbx = a.create(&create_req(&InstallationId::new())).await.unwrap();

    // Rotation as an operator does it: PUT the new secret (which tells this process), then
    // revoke the old key on the server. The very next call carries the new key.
    secrets.put("os-key", "sk-rotated-2");
    creds.changed();
    fake.set_key("sk-rotated-2");
    a.health().await.unwrap();
    assert!(a.find(&sbx.sandbox_id).await.unwrap().is_some());

    // A process that was not told (another replica) reuses its value for at most the TTL,
    // and a refusal makes it read again at once: one refused call, then the new key.
    secrets.put("os-key", "sk-rotated-3");
    fake.set_key("sk-rotated-3");
    let e = a.health().await.unwrap_err();
    assert!(matches!(e, AdapterError::Permanent(_)), "{e:?}");
    assert!(!e.to_string().contains("sk-rotated"), "{e}");
    a.health().await.unwrap();

    // The same without any refusal: the TTL runs out and the key is read again.
    let quick = Credentials::new(secrets.clone()).with_ttl(Duration::from_millis(100));
    let b = registry::build_with(
        "opensandbox",
        &secret_settings(&fake.api_url(), "os-key"),
        &quick,
    )
    .unwrap();
    b.health().await.unwrap();
    secrets.put("os-key", "sk-rotated-4");
    fake.set_key("sk-rotated-4");
    tokio::time::sleep(Duration::from_millis(150)).await;
    b.health().await.unwrap();
    // `a` holds -3 until its TTL passes or the server refuses it; either way it recovers.
    if a.delete(&sbx.sandbox_id).await.is_err() {
        a.delete(&sbx.sandbox_id).await.unwrap();
    }
}

#[tokio::test]
async fn a_missing_secret_fails_calls_naming_the_reference() {
    let fake = FakeServer::start(Variant::Real, FakeRuntime::Docker, KEY).await;
    let secrets = std::sync::Arc::new(Secrets::default());
    let creds = Credentials::new(secrets.clone());
    // Registering a pool before its secret is stored is fine: the pool is unusable until then.
    let a = registry::build_with(
        "opensandbox",
        &secret_settings(&fake.api_url(), "not-yet"),
        &creds,
    )
    .unwrap();
    let e = a.health().await.unwrap_err();
    assert!(matches!(e, AdapterError::Unavailable(_)), "{e:?}");
    assert!(e.to_string().contains("secret:not-yet"), "{e}");
    assert!(
        fake.record().requests.is_empty(),
        "nothing sent without a key"
    );
    secrets.put("not-yet", KEY);
    creds.changed();
    a.health().await.unwrap();

    // A stored value a header cannot carry: refused, never quoted.
    secrets.put("not-yet", "two words");
    creds.changed();
    let e = a.health().await.unwrap_err();
    assert!(e.to_string().contains("secret:not-yet"), "{e}");
    assert!(!e.to_string().contains("two words"), "{e}");

    // Built without a secret source (settings validation only): a clear error at call time.
    let v = registry::build("opensandbox", &secret_settings(&fake.api_url(), "x"))
        .unwrap()
        .health()
        .await
        .unwrap_err();
    assert!(v.to_string().contains("no secret store"), "{v}");

    // Names are checked at build, naming the field.
    let (field, _) = build_err(secret_settings(&fake.api_url(), "Bad Name"));
    assert_eq!(field.as_deref(), Some("apiKeySecret"));
    let mut both = secret_settings(&fake.api_url(), "ok");
    both["apiKeyEnv"] = json!("PATH");
    let (field, message) = build_err(both);
    assert_eq!(field.as_deref(), Some("apiKeySecret"), "{message}");
}

#[tokio::test]
async fn a_rotated_key_file_is_read_again() {
    let fake = FakeServer::start(Variant::Real, FakeRuntime::Docker, KEY).await;
    let key = key_file(KEY);
    let creds = Credentials::default().with_ttl(Duration::from_millis(50));
    let a = registry::build_with(
        "opensandbox",
        &settings(&fake.api_url(), &key, json!({})),
        &creds,
    )
    .unwrap();
    a.health().await.unwrap();
    std::fs::write(key.path(), "sk-from-rotated-file\n").unwrap();
    fake.set_key("sk-from-rotated-file");
    tokio::time::sleep(Duration::from_millis(80)).await;
    a.health().await.unwrap();
}
