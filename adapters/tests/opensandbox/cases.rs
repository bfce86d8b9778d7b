//! Every adapter method against the fake, in both variants where they differ.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use differently_adapters::credentials::{Credentials, SecretSource, SecretSourceError};
use differently_adapters::opensandbox::{OpenSandboxAdapter, OpenSandboxConfig};
use differently_adapters::registry::{self};
use differently_adapters::{Adapter, AdapterError, ByteRange, ExecEvent, FileKind, InstanceState};
use differently_core::ids::InstallationId;
use differently_core::SandboxId;
use serde_json::json;

use crate::fake_server::{FakeRuntime, FakeServer, Variant};
use crate::support::cases::{self, body, collect};
use crate::{at, cmd, create_req, key_file, running, settings, setup, KEY};

const BOTH: [Variant; 2] = [Variant::Real, Variant::Spec];

fn build_err(v: serde_json::Value) -> (Option<String>, String) {
    cases::build_err("opensandbox", v)
}

// ---------------------------------------------------------------------------------------
// Configuration

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

// ---------------------------------------------------------------------------------------
// Credentials resolved at call time

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

// ---------------------------------------------------------------------------------------
// Lifecycle

#[tokio::test]
async fn create_is_idempotent_and_tags_the_sandbox() {
    for variant in BOTH {
        let s = setup(variant, FakeRuntime::Docker, json!({})).await;
        let inst_id = InstallationId::new();
        let mut req = create_req(&inst_id);
        req.ttl_seconds = 30;
        let a = s.adapter.create(&req).await.unwrap();
        assert_eq!(a.state, InstanceState::Running);
        let b = s.adapter.create(&req).await.unwrap();
        assert_eq!(a, b, "{variant:?}");
        let bodies = s.fake.record().create_bodies.clone();
        assert_eq!(bodies.len(), 1, "{variant:?}: one backend create");
        let body = &bodies[0];
        assert_eq!(
            body["metadata"]["differently-sandbox-id"],
            req.sandbox_id.as_str()
        );
        assert_eq!(
            body["metadata"]["differently-installation-id"],
            inst_id.as_str()
        );
        assert_eq!(
            body["resourceLimits"],
            json!({"cpu": "2", "memory": "2048Mi"})
        );
        assert_eq!(
            body["timeout"], 60,
            "TTL below OpenSandbox's minimum is raised to 60"
        );
        assert_eq!(body["image"]["uri"], "ubuntu:24.04");
        assert_eq!(body["entrypoint"], json!(["tail", "-f", "/dev/null"]));
        assert_eq!(body["env"]["SANDBOX_VAR"], "from-create");
        assert!(body.get("networkPolicy").is_none());

        let found = s.adapter.find(&req.sandbox_id).await.unwrap();
        assert_eq!(found.as_ref(), Some(&a));
        let listed = s.adapter.list(&inst_id).await.unwrap();
        assert_eq!(listed, vec![a.clone()]);
        assert!(s
            .adapter
            .list(&InstallationId::new())
            .await
            .unwrap()
            .is_empty());

        s.adapter.delete(&req.sandbox_id).await.unwrap();
        assert_eq!(s.adapter.find(&req.sandbox_id).await.unwrap(), None);
        s.adapter.delete(&req.sandbox_id).await.unwrap();
        assert!(s.fake.sandboxes().is_empty());
    }
}

#[tokio::test]
async fn create_waits_for_a_pending_sandbox_and_execd() {
    let s = setup(Variant::Spec, FakeRuntime::Docker, json!({})).await;
    let req = create_req(&InstallationId::new());
    let a = s.adapter.create(&req).await.unwrap();
    assert_eq!(s.fake.sandbox(&a.backend_ref).unwrap().state, "Running");
    let reqs = s.fake.record().requests.clone();
    let gets = reqs
        .iter()
        .filter(|r| *r == &format!("GET /v1/sandboxes/{}", a.backend_ref))
        .count();
    assert!(gets >= 3, "polled through Pending: {reqs:?}");
    assert!(
        reqs.iter().any(|r| r.ends_with("/proxy/44772/ping")),
        "pinged execd: {reqs:?}"
    );
}

#[tokio::test]
async fn create_finds_an_earlier_pending_instance_and_clears_a_failed_one() {
    let s = setup(Variant::Spec, FakeRuntime::Docker, json!({})).await;
    let req = create_req(&InstallationId::new());
    let meta = BTreeMap::from([
        (
            "differently-sandbox-id".to_owned(),
            req.sandbox_id.as_str().to_owned(),
        ),
        (
            "differently-installation-id".to_owned(),
            req.installation_id.as_str().to_owned(),
        ),
    ]);
    let pending = s.fake.insert(meta.clone(), "Pending");
    let a = s.adapter.create(&req).await.unwrap();
    assert_eq!(a.backend_ref, pending);
    assert!(s.fake.record().create_bodies.is_empty());

    let req2 = create_req(&InstallationId::new());
    let mut meta2 = meta;
    meta2.insert(
        "differently-sandbox-id".to_owned(),
        req2.sandbox_id.as_str().to_owned(),
    );
    let failed = s.fake.insert(meta2, "Failed");
    let b = s.adapter.create(&req2).await.unwrap();
    assert_ne!(b.backend_ref, failed);
    assert!(
        s.fake.sandbox(&failed).is_none(),
        "the failed leftover is deleted"
    );
}

#[tokio::test]
async fn delete_removes_every_instance_of_a_sandbox() {
    let s = setup(Variant::Real, FakeRuntime::Docker, json!({})).await;
    let req = create_req(&InstallationId::new());
    s.adapter.create(&req).await.unwrap();
    // A second instance, as two racing creators could leave.
    s.fake.insert(
        BTreeMap::from([(
            "differently-sandbox-id".to_owned(),
            req.sandbox_id.as_str().to_owned(),
        )]),
        "Running",
    );
    s.adapter.delete(&req.sandbox_id).await.unwrap();
    assert!(s.fake.sandboxes().is_empty());
}

#[tokio::test]
async fn image_pull_failures_name_the_image_and_keep_the_pool_healthy() {
    for (variant, runtime, transient) in [
        (Variant::Real, FakeRuntime::Docker, false),
        (Variant::Spec, FakeRuntime::Docker, false),
        (Variant::Real, FakeRuntime::Kubernetes, true),
    ] {
        let s = setup(variant, runtime, json!({})).await;
        s.fake.knobs().bad_images.push("nosuch/image:1".to_owned());
        let mut req = create_req(&InstallationId::new());
        req.template = Some("nosuch/image:1".to_owned());
        let e = s.adapter.create(&req).await.unwrap_err();
        assert_eq!(
            matches!(e, AdapterError::Transient(_)),
            transient,
            "{variant:?} {runtime:?}: {e:?}"
        );
        assert!(!matches!(e, AdapterError::Unavailable(_)));
        assert!(e.to_string().contains("nosuch/image:1"), "{e}");
        for internal in ["http+docker", "192.0.2.53", "registry-1.docker.io"] {
            assert!(
                !e.to_string().contains(internal),
                "the server's internals are not passed on: {e}"
            );
        }
        s.adapter.health().await.unwrap();
        assert_eq!(
            s.adapter.find(&req.sandbox_id).await.unwrap(),
            None,
            "nothing left behind"
        );
    }
}

#[tokio::test]
async fn lifecycle_errors_map_by_status() {
    for variant in BOTH {
        let s = setup(variant, FakeRuntime::Docker, json!({})).await;
        // 422 (real) or 400 (spec) validation: permanent, naming the field.
        let mut req = create_req(&InstallationId::new());
        req.resources.cpu = 0;
        let e = s.adapter.create(&req).await.unwrap_err();
        assert!(
            matches!(&e, AdapterError::Permanent(m) if m.contains("resourceLimits")),
            "{variant:?}: {e:?}"
        );
        // 5xx: transient, and the retry works.
        s.fake
            .knobs()
            .fail_next
            .push_back(("/sandboxes".to_owned(), 503));
        let req = create_req(&InstallationId::new());
        assert!(matches!(
            s.adapter.create(&req).await,
            Err(AdapterError::Transient(_))
        ));
        let inst = s.adapter.create(&req).await.unwrap();
        // 404: not found.
        s.fake
            .knobs()
            .fail_next
            .push_back(("/pause".to_owned(), 404));
        assert_eq!(
            s.adapter.pause(&at(&inst)).await,
            Err(AdapterError::NotFound)
        );
        // 409 from a second pause is not an error; a 409 for another reason is.
        s.adapter.pause(&at(&inst)).await.unwrap();
        s.adapter.pause(&at(&inst)).await.unwrap();
        let e = s.adapter.snapshot(&at(&inst), "snp_1").await.unwrap_err();
        assert!(matches!(e, AdapterError::Permanent(_)), "{e:?}");
        s.adapter.resume(&at(&inst)).await.unwrap();
        s.adapter.resume(&at(&inst)).await.unwrap();
    }
}

#[tokio::test]
async fn slow_and_unreachable_servers() {
    let s = setup(
        Variant::Real,
        FakeRuntime::Docker,
        json!({"timeouts": {"requestSeconds": 1}}),
    )
    .await;
    s.fake.knobs().delay_ms = 1500;
    let e = s.adapter.health().await.unwrap_err();
    assert!(
        matches!(&e, AdapterError::Transient(m) if m.contains("timed out")),
        "{e:?}"
    );
    s.fake.knobs().delay_ms = 0;
    s.adapter.health().await.unwrap();

    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let key = key_file(KEY);
    let cfg: OpenSandboxConfig =
        serde_json::from_value(settings(&format!("http://{addr}/v1"), &key, json!({}))).unwrap();
    let a = OpenSandboxAdapter::new(cfg).unwrap();
    assert!(matches!(
        a.health().await,
        Err(AdapterError::Unavailable(_))
    ));
    assert!(matches!(
        a.find(&SandboxId::new()).await,
        Err(AdapterError::Unavailable(_))
    ));
}

#[tokio::test]
async fn a_wrong_api_url_is_not_a_missing_sandbox() {
    let fake = FakeServer::start(Variant::Real, FakeRuntime::Docker, KEY).await;
    let key = key_file(KEY);
    let url = fake.api_url().replace("/v1", "/v2");
    let cfg: OpenSandboxConfig = serde_json::from_value(settings(&url, &key, json!({}))).unwrap();
    let a = OpenSandboxAdapter::new(cfg).unwrap();
    let e = a.health().await.unwrap_err();
    assert!(
        matches!(&e, AdapterError::Permanent(m) if m.contains("apiURL")),
        "{e:?}"
    );
}

#[tokio::test]
async fn orphans_are_listed_for_the_reaper() {
    let s = setup(Variant::Real, FakeRuntime::Docker, json!({})).await;
    let installation = InstallationId::new();
    let orphan = SandboxId::new();
    let backend = s.fake.insert(
        BTreeMap::from([
            (
                "differently-sandbox-id".to_owned(),
                orphan.as_str().to_owned(),
            ),
            (
                "differently-installation-id".to_owned(),
                installation.as_str().to_owned(),
            ),
        ]),
        "Running",
    );
    // Someone else's sandbox and an untagged one are not ours.
    s.fake.insert(
        BTreeMap::from([(
            "differently-installation-id".to_owned(),
            "inst_other".to_owned(),
        )]),
        "Running",
    );
    s.fake.insert(BTreeMap::new(), "Running");
    let listed = s.adapter.list(&installation).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].sandbox_id, orphan);
    assert_eq!(listed[0].backend_ref, backend);
    s.adapter.delete(&orphan).await.unwrap();
    assert_eq!(s.fake.sandboxes().len(), 2);
}

#[tokio::test]
async fn list_follows_pages() {
    let s = setup(Variant::Real, FakeRuntime::Docker, json!({})).await;
    let installation = InstallationId::new();
    for _ in 0..205 {
        s.fake.insert(
            BTreeMap::from([
                (
                    "differently-sandbox-id".to_owned(),
                    SandboxId::new().as_str().to_owned(),
                ),
                (
                    "differently-installation-id".to_owned(),
                    installation.as_str().to_owned(),
                ),
            ]),
            "Running",
        );
    }
    assert_eq!(s.adapter.list(&installation).await.unwrap().len(), 205);
}

#[tokio::test]
async fn renew_moves_the_backstop_past_our_expiry() {
    for variant in BOTH {
        let s = setup(variant, FakeRuntime::Docker, json!({})).await;
        let r = running(&s).await;
        s.adapter
            .renew(&r, Duration::from_secs(3600))
            .await
            .unwrap();
        let exp = s.fake.sandbox(&r.backend_ref).unwrap().expires_at.unwrap();
        let want = chrono::Utc::now() + chrono::Duration::seconds(3900);
        assert!((exp - want).num_seconds().abs() < 10, "{exp} vs {want}");
        // Shortening: the spec's server refuses an earlier time; the later backstop stays.
        s.adapter.renew(&r, Duration::from_secs(60)).await.unwrap();
    }
}

// ---------------------------------------------------------------------------------------
// Exec

#[tokio::test]
async fn exec_exit_codes_stderr_env_cwd_and_quoting() {
    let dir = tempfile::tempdir().unwrap();
    let dir_s = dir.path().to_str().unwrap().to_owned();
    for (variant, endings) in [(Variant::Real, "stripped"), (Variant::Spec, "kept")] {
        let s = setup(
            variant,
            FakeRuntime::Docker,
            json!({"lineEndings": endings}),
        )
        .await;
        let r = running(&s).await;
        let out = s
            .adapter
            .exec(
                &r,
                &cmd(&["bash", "-c", "echo hello; echo oops >&2; exit 3"]),
            )
            .await
            .unwrap();
        assert_eq!(
            (out.exit_code, out.stdout.as_str(), out.stderr.as_str()),
            (3, "hello\n", "oops\n")
        );

        let out = s
            .adapter
            .exec(
                &r,
                &cmd(&["printf", "%s|", "a b", "it's", "$HOME", "", "*"]),
            )
            .await
            .unwrap();
        let exact = "a b|it's|$HOME||*|";
        let want = if endings == "kept" {
            exact.to_owned()
        } else {
            format!("{exact}\n")
        };
        assert_eq!(out.stdout, want, "{variant:?}");

        let mut req = cmd(&["sh", "-c", "echo \"$FOO\"; pwd"]);
        req.env.insert("FOO".to_owned(), "bar baz".to_owned());
        req.cwd = Some(dir_s.clone());
        let out = s.adapter.exec(&r, &req).await.unwrap();
        assert_eq!(out.stdout, format!("bar baz\n{dir_s}\n"));
        assert_eq!(
            s.fake.record().command_bodies.last().unwrap()["timeout"],
            60_000
        );

        let out = s
            .adapter
            .exec(&r, &cmd(&["printf", "a\\n\\nb\\n"]))
            .await
            .unwrap();
        // Recorded on real execd: a blank line arrives as an event with text "\n" (the fake
        // used to drop it), so the blank line survives either way.
        assert_eq!(out.stdout, "a\n\nb\n", "{variant:?}: blank lines survive");

        let out = s
            .adapter
            .exec(&r, &cmd(&["sh", "-c", "exit 0"]))
            .await
            .unwrap();
        assert_eq!(out.exit_code, 0);
        let out = s
            .adapter
            .exec(&r, &cmd(&["no-such-program-xyz"]))
            .await
            .unwrap();
        assert_eq!(out.exit_code, 127);
        let out = s
            .adapter
            .exec(&r, &cmd(&["sh", "-c", "kill -9 $$"]))
            .await
            .unwrap();
        assert_eq!(out.exit_code, 137, "killed by a signal, not by our timeout");

        let mut req = cmd(&["pwd"]);
        req.cwd = Some("/definitely/not/here".to_owned());
        assert!(matches!(
            s.adapter.exec(&r, &req).await,
            Err(AdapterError::Permanent(m)) if m.field() == Some("cwd")
        ));
    }
}

#[tokio::test]
async fn exec_stdin_goes_through_a_removed_file() {
    let s = setup(Variant::Real, FakeRuntime::Docker, json!({})).await;
    let r = running(&s).await;
    let mut req = cmd(&["cat"]);
    req.stdin = Some("line1\nline2\n".to_owned());
    let out = s.adapter.exec(&r, &req).await.unwrap();
    assert_eq!(out.stdout, "line1\nline2\n");
    let command = s.fake.record().command_bodies.last().unwrap()["command"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = command
        .split_whitespace()
        .find(|t| t.starts_with("/tmp/.differently-stdin-"))
        .unwrap()
        .trim_end_matches(';')
        .to_owned();
    assert!(path.starts_with("/tmp/.differently-stdin-"), "{command}");
    assert!(!std::path::Path::new(&path).exists(), "stdin file removed");

    let mut req = cmd(&["od", "-An", "-tx1"]);
    req.stdin_base64 = Some("AP+A".to_owned());
    let out = s.adapter.exec(&r, &req).await.unwrap();
    assert_eq!(out.stdout.trim(), "00 ff 80");

    let mut req = cmd(&["cat"]);
    req.stdin_base64 = Some("not base64!".to_owned());
    assert!(
        matches!(s.adapter.exec(&r, &req).await, Err(AdapterError::Permanent(m)) if m.contains("stdinBase64"))
    );
}

#[tokio::test]
async fn exec_timeout_is_124() {
    for variant in BOTH {
        let s = setup(variant, FakeRuntime::Docker, json!({})).await;
        let r = running(&s).await;
        let mut req = cmd(&["sleep", "30"]);
        req.timeout_seconds = Some(1);
        let started = Instant::now();
        let out = s.adapter.exec(&r, &req).await.unwrap();
        assert_eq!(out.exit_code, 124);
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(
            s.fake.record().command_bodies.last().unwrap()["timeout"],
            1000
        );
    }
}

#[tokio::test]
async fn exec_huge_binaryish_and_slow_output() {
    for variant in BOTH {
        let s = setup(variant, FakeRuntime::Docker, json!({})).await;
        let r = running(&s).await;
        // 3 MB in 1000-byte lines: capped at 1 MiB and flagged.
        let out = s
            .adapter
            .exec(
                &r,
                &cmd(&[
                    "sh",
                    "-c",
                    "head -c 3000000 /dev/zero | tr '\\0' a | fold -w 1000",
                ]),
            )
            .await
            .unwrap();
        assert_eq!(out.exit_code, 0);
        assert!(out.stdout_truncated && !out.stderr_truncated);
        assert_eq!(out.stdout.len(), 1024 * 1024);
        // One 2 MB line in one event.
        let out = s
            .adapter
            .exec(
                &r,
                &cmd(&["sh", "-c", "head -c 2000000 /dev/zero | tr '\\0' x"]),
            )
            .await
            .unwrap();
        assert!(out.stdout_truncated && out.stdout.bytes().all(|b| b == b'x'));
        // Non-UTF-8 bytes arrive lossily (execd's events are JSON text).
        let out = s
            .adapter
            .exec(&r, &cmd(&["printf", "\\377ok\\n"]))
            .await
            .unwrap();
        assert!(out.stdout.ends_with("ok\n"), "{:?}", out.stdout);

        s.fake.knobs().frame_delay_ms = 30;
        let out = s
            .adapter
            .exec(
                &r,
                &cmd(&["sh", "-c", "for i in 1 2 3 4 5; do echo $i; done"]),
            )
            .await
            .unwrap();
        assert_eq!(out.stdout, "1\n2\n3\n4\n5\n");
    }
}

#[tokio::test]
async fn truncated_and_silent_streams_are_transient() {
    for variant in BOTH {
        let s = setup(
            variant,
            FakeRuntime::Docker,
            json!({"timeouts": {"streamIdleSeconds": 1}}),
        )
        .await;
        let r = running(&s).await;
        s.fake.knobs().truncate_after_frames = Some(3);
        let e = s
            .adapter
            .exec(&r, &cmd(&["sh", "-c", "echo 1; echo 2; echo 3; echo 4"]))
            .await
            .unwrap_err();
        assert!(
            matches!(&e, AdapterError::Transient(m) if m.contains("ended")),
            "{e:?}"
        );
        s.fake.knobs().truncate_after_frames = None;
        s.fake.knobs().stall_ms = 2500;
        let e = s.adapter.exec(&r, &cmd(&["true"])).await.unwrap_err();
        assert!(
            matches!(&e, AdapterError::Transient(m) if m.contains("no output")),
            "{e:?}"
        );
        s.fake.knobs().stall_ms = 0;
        assert_eq!(
            s.adapter.exec(&r, &cmd(&["true"])).await.unwrap().exit_code,
            0
        );
    }
}

#[tokio::test]
async fn exec_stream_delivers_in_order_with_backpressure_and_cancels() {
    for variant in BOTH {
        let s = setup(
            variant,
            FakeRuntime::Docker,
            json!({"lineEndings": "stripped"}),
        )
        .await;
        let r = running(&s).await;
        let (tx, mut rx) = tokio::sync::mpsc::channel(1);
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(ev) = rx.recv().await {
                tokio::time::sleep(Duration::from_millis(2)).await;
                got.push(ev);
            }
            got
        });
        let exit = s
            .adapter
            .exec_stream(
                &r,
                &cmd(&[
                    "sh",
                    "-c",
                    "for i in $(seq 1 200); do echo $i; done; echo e >&2; exit 2",
                ]),
                tx,
            )
            .await
            .unwrap();
        assert_eq!(exit.exit_code, 2);
        let got = reader.await.unwrap();
        let stdout: Vec<Bytes> = got
            .iter()
            .filter_map(|e| match e {
                ExecEvent::Stdout(b) => Some(b.clone()),
                ExecEvent::Stderr(_) => None,
            })
            .collect();
        assert_eq!(stdout.len(), 200);
        assert_eq!(stdout[0], Bytes::from("1\n"));
        assert_eq!(stdout[199], Bytes::from("200\n"));
        assert!(got.contains(&ExecEvent::Stderr(Bytes::from("e\n"))));

        // A closed receiver cancels the command on the backend.
        let (tx, mut rx) = tokio::sync::mpsc::channel(1);
        let a = &s.adapter;
        let endless = cmd(&["sh", "-c", "while true; do echo x; sleep 0.05; done"]);
        let run = a.exec_stream(&r, &endless, tx);
        let stop = async {
            rx.recv().await;
            drop(rx);
        };
        let (res, ()) = tokio::join!(run, stop);
        assert!(res.is_err());
        assert!(s.fake.record().interrupts >= 1);
    }
}

/// Waits up to 5 s for the fake execd to run no command; false if one still runs.
async fn no_command_runs(s: &crate::Setup) -> bool {
    for _ in 0..100 {
        if s.fake.commands_running() == 0 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// Real execd keeps a foreground command running when its stream's client goes away
/// (recorded: still running 8 s later), so the adapter must interrupt it itself: when the
/// caller's receiver goes away while the command prints nothing, and when the caller drops
/// the call altogether (an HTTP client that disconnected).
#[tokio::test]
async fn a_caller_who_goes_away_leaves_no_command_running() {
    let s = setup(Variant::Real, FakeRuntime::Docker, json!({})).await;
    let r = running(&s).await;
    let silent = cmd(&["sleep", "30"]);

    // The receiver goes away; the command prints nothing.
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let run = s.adapter.exec_stream(&r, &silent, tx);
    let hang_up = async {
        while s.fake.commands_running() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(rx);
    };
    let (res, ()) = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::join!(run, hang_up)
    })
    .await
    .expect("the call ends soon after its receiver goes away");
    assert!(res.is_err(), "{res:?}");
    assert!(
        no_command_runs(&s).await,
        "the silent command was left running"
    );
    let interrupts = s.fake.record().interrupts;
    assert!(interrupts >= 1);

    // The call itself is dropped mid-flight.
    let (tx, _rx) = tokio::sync::mpsc::channel(16);
    let dropped = tokio::time::timeout(Duration::from_millis(500), async {
        let _ = s.adapter.exec_stream(&r, &silent, tx).await;
    })
    .await;
    assert!(dropped.is_err(), "the call was still running when dropped");
    assert!(
        no_command_runs(&s).await,
        "the dropped call's command was left running"
    );
    assert!(s.fake.record().interrupts > interrupts);
    assert!(s.fake.record().abandoned >= 1, "the fake saw its client go");
}

/// The `POST …/command` requests whose heads reached the fake, with their declared length.
fn command_heads(s: &crate::Setup) -> Vec<Option<u64>> {
    s.fake
        .record()
        .heads
        .iter()
        .filter(|(line, _)| line.starts_with("POST ") && line.ends_with("/command"))
        .map(|(_, length)| *length)
        .collect()
}

/// Waits up to 5 s for `n` command request heads to reach the fake.
async fn command_heads_reach(s: &crate::Setup, n: usize) {
    for _ in 0..500 {
        if command_heads(s).len() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{n} command request head(s) never reached execd");
}

/// `exec_stream_after`: the request to execd goes at once (its head, so the connection's
/// set-up overlaps the caller's audit record) but its body, the command, only with the
/// go-ahead; a withdrawn go-ahead runs nothing, and one that takes longer than the hold limit
/// (1 s) sends the command on a new request, once. Directly to execd and through the server's
/// proxy.
#[tokio::test]
async fn a_held_command_goes_only_with_its_go_ahead() {
    use differently_adapters::go_ahead::GoAhead;
    for proxy in [true, false] {
        let s = setup(
            Variant::Real,
            FakeRuntime::Docker,
            json!({"useServerProxy": proxy}),
        )
        .await;
        let r = running(&s).await;
        let echo = cmd(&["echo", "hi"]);
        let stdout = |rx: &mut tokio::sync::mpsc::Receiver<ExecEvent>| {
            let mut out = Vec::new();
            while let Ok(ev) = rx.try_recv() {
                if let ExecEvent::Stdout(b) = ev {
                    out.extend_from_slice(&b);
                }
            }
            out
        };

        // Given after the head arrived.
        let (giver, go) = GoAhead::pair();
        let (tx, mut rx) = tokio::sync::mpsc::channel(16);
        let control = async {
            command_heads_reach(&s, 1).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
            let early = s.fake.record().command_bodies.len();
            giver.give();
            early
        };
        let (exit, early) = tokio::join!(s.adapter.exec_stream_after(&r, &echo, tx, go), control);
        assert_eq!(
            early, 0,
            "proxy {proxy}: the command went before its go-ahead"
        );
        assert_eq!(exit.unwrap().exit_code, 0, "proxy {proxy}");
        assert_eq!(stdout(&mut rx), b"hi\n", "proxy {proxy}");
        let heads = command_heads(&s);
        assert_eq!(heads.len(), 1, "proxy {proxy}: one request");
        let sent = serde_json::to_vec(&s.fake.record().command_bodies[0]).unwrap();
        assert_eq!(
            heads[0],
            Some(sent.len() as u64),
            "proxy {proxy}: the held request declares its length, as an unheld one does"
        );

        // Withdrawn: nothing runs, and the call says why.
        let (giver, go) = GoAhead::pair();
        let (tx, _rx) = tokio::sync::mpsc::channel(16);
        let touch = cmd(&["touch", "/tmp/differently-withdrawn"]);
        let control = async {
            command_heads_reach(&s, 2).await;
            drop(giver);
        };
        let (res, ()) = tokio::join!(s.adapter.exec_stream_after(&r, &touch, tx, go), control);
        assert!(
            matches!(&res, Err(AdapterError::Permanent(r)) if r.to_string().contains("withdrawn")),
            "proxy {proxy}: {res:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            s.fake.record().command_bodies.len(),
            1,
            "proxy {proxy}: a withdrawn command reached execd"
        );
        assert!(no_command_runs(&s).await);

        // Held past the limit: abandoned unsent, then sent once on a new request.
        let (giver, go) = GoAhead::pair();
        let (tx, mut rx) = tokio::sync::mpsc::channel(16);
        let control = async {
            command_heads_reach(&s, 3).await;
            tokio::time::sleep(Duration::from_millis(1300)).await;
            let before = s.fake.record().command_bodies.len();
            giver.give();
            before
        };
        let (exit, before) = tokio::join!(s.adapter.exec_stream_after(&r, &echo, tx, go), control);
        assert_eq!(before, 1, "proxy {proxy}: sent while held");
        assert_eq!(exit.unwrap().exit_code, 0, "proxy {proxy}");
        assert_eq!(stdout(&mut rx), b"hi\n", "proxy {proxy}");
        assert_eq!(
            command_heads(&s).len(),
            4,
            "proxy {proxy}: abandoned, then sent anew"
        );
        assert_eq!(
            s.fake.record().command_bodies.len(),
            2,
            "proxy {proxy}: the held-too-long command ran once"
        );
    }
}

#[tokio::test]
async fn execd_headers_from_the_endpoint_are_used_and_stale_endpoints_re_resolved() {
    let s = setup(
        Variant::Real,
        FakeRuntime::Docker,
        json!({"useServerProxy": false}),
    )
    .await;
    s.fake.knobs().execd_token = Some("execd-token".to_owned());
    s.fake.knobs().endpoint_headers =
        BTreeMap::from([("X-EXECD-ACCESS-TOKEN".to_owned(), "execd-token".to_owned())]);
    let r = running(&s).await;
    assert_eq!(
        s.adapter.exec(&r, &cmd(&["true"])).await.unwrap().exit_code,
        0
    );
    // The endpoint is resolved once and cached.
    let resolves = |s: &crate::Setup| {
        s.fake
            .record()
            .requests
            .iter()
            .filter(|q| q.contains("/endpoints/44772"))
            .count()
    };
    let before = resolves(&s);
    s.adapter.exec(&r, &cmd(&["true"])).await.unwrap();
    assert_eq!(resolves(&s), before);
}

// ---------------------------------------------------------------------------------------
// Files

#[tokio::test]
async fn files_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_owned();
    for variant in BOTH {
        let s = setup(variant, FakeRuntime::Docker, json!({})).await;
        let r = running(&s).await;
        let file = format!("{root}/{variant:?}/sub/data.bin");
        s.adapter
            .upload(
                &r,
                &file,
                Some(0o640),
                body(&[b"\x00\x01binary", b"\xff rest\n"]),
            )
            .await
            .unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"\x00\x01binary\xff rest\n");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o640
        );
        s.adapter
            .upload(
                &r,
                &format!("{root}/{variant:?}/plain.txt"),
                None,
                body(&[b"hi"]),
            )
            .await
            .unwrap();
        let mode = std::fs::metadata(format!("{root}/{variant:?}/plain.txt"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o644, "not execd's default 755");

        let d = s.adapter.download(&r, &file, None).await.unwrap();
        assert_eq!(d.total_size, Some(15));
        assert_eq!(collect(d).await, b"\x00\x01binary\xff rest\n");
        let d = s
            .adapter
            .download(
                &r,
                &file,
                Some(ByteRange {
                    start: 2,
                    end: Some(7),
                }),
            )
            .await
            .unwrap();
        assert_eq!(d.total_size, Some(15));
        assert_eq!(collect(d).await, b"binary");
        let d = s
            .adapter
            .download(
                &r,
                &file,
                Some(ByteRange {
                    start: 8,
                    end: None,
                }),
            )
            .await
            .unwrap();
        assert_eq!(collect(d).await, b"\xff rest\n");
        s.fake.knobs().ignore_range = true;
        let d = s
            .adapter
            .download(
                &r,
                &file,
                Some(ByteRange {
                    start: 2,
                    end: Some(7),
                }),
            )
            .await
            .unwrap();
        assert_eq!(
            collect(d).await,
            b"binary",
            "cut client-side when the server ignores Range"
        );
        s.fake.knobs().ignore_range = false;
        let e = s
            .adapter
            .download(
                &r,
                &file,
                Some(ByteRange {
                    start: 99,
                    end: None,
                }),
            )
            .await
            .err()
            .unwrap();
        assert!(matches!(e, AdapterError::Permanent(_)), "416: {e:?}");
        let e = s
            .adapter
            .download(&r, &format!("{root}/nope"), None)
            .await
            .err()
            .unwrap();
        // Real execd answers 404 FILE_NOT_FOUND: the path is missing, the sandbox is not.
        let nope = format!("{root}/nope");
        assert!(
            matches!(&e, AdapterError::PathNotFound(p) if p == &nope),
            "PathNotFound, not NotFound or Permanent: {e:?}"
        );
        let e = s.adapter.list_files(&r, &nope, 1).await.unwrap_err();
        assert!(
            matches!(&e, AdapterError::PathNotFound(p) if p == &nope),
            "list: {e:?}"
        );
        let e = s.adapter.delete_file(&r, &nope).await.unwrap_err();
        assert!(
            matches!(&e, AdapterError::PathNotFound(p) if p == &nope),
            "delete: {e:?}"
        );
        assert!(matches!(
            s.adapter.download(&r, "relative", None).await,
            Err(AdapterError::Permanent(_))
        ));

        let base = format!("{root}/{variant:?}");
        let entries = s.adapter.list_files(&r, &base, 2).await.unwrap();
        let names: Vec<(&str, FileKind)> =
            entries.iter().map(|e| (e.path.as_str(), e.kind)).collect();
        assert_eq!(
            names,
            [
                (format!("{base}/plain.txt").as_str(), FileKind::File),
                (format!("{base}/sub").as_str(), FileKind::Dir),
                (file.as_str(), FileKind::File),
            ]
        );
        assert_eq!(entries[2].mode, 0o640);
        assert_eq!(entries[2].size, 15);
        assert!(entries[2].modified_at.is_some());

        let e = s
            .adapter
            .delete_file(&r, &format!("{base}/sub"))
            .await
            .unwrap_err();
        assert!(
            matches!(&e, AdapterError::Permanent(m) if m.contains("not empty")),
            "{e:?}"
        );
        s.adapter.delete_file(&r, &file).await.unwrap();
        assert!(!std::path::Path::new(&file).exists());
        s.adapter
            .delete_file(&r, &format!("{base}/sub"))
            .await
            .unwrap();
        assert!(!std::path::Path::new(&format!("{base}/sub")).exists());
    }
}

#[tokio::test]
async fn the_metadata_part_must_be_a_file_part_on_the_real_execd() {
    for (variant, status) in [(Variant::Real, 400), (Variant::Spec, 200)] {
        let s = setup(variant, FakeRuntime::Docker, json!({})).await;
        let r = running(&s).await;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.txt");
        let meta = json!({"path": path}).to_string();
        let b = "XyZ";
        let form = format!(
            "--{b}\r\nContent-Disposition: form-data; name=\"metadata\"\r\n\r\n{meta}\r\n--{b}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\r\nhello\r\n--{b}--\r\n"
        );
        let url = format!(
            "{}/sandboxes/{}/proxy/44772/files/upload",
            s.fake.api_url(),
            r.backend_ref
        );
        let resp = reqwest::Client::new()
            .post(url)
            .header("content-type", format!("multipart/form-data; boundary={b}"))
            .header("OPEN-SANDBOX-API-KEY", KEY)
            .body(form)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), status, "{variant:?}");
    }
}

// ---------------------------------------------------------------------------------------
// Pause, stop, snapshots, ports

#[tokio::test]
async fn pause_and_resume_keep_the_sandbox() {
    for variant in BOTH {
        let s = setup(variant, FakeRuntime::Docker, json!({})).await;
        let r = running(&s).await;
        s.adapter.pause(&r).await.unwrap();
        assert_eq!(
            s.adapter.find(&r.sandbox_id).await.unwrap().unwrap().state,
            InstanceState::Paused
        );
        let e = s.adapter.exec(&r, &cmd(&["true"])).await.unwrap_err();
        assert!(e.is_retryable(), "{e:?}");
        s.adapter.resume(&r).await.unwrap();
        assert_eq!(
            s.adapter.exec(&r, &cmd(&["true"])).await.unwrap().exit_code,
            0
        );
        assert!(matches!(
            s.adapter.stop(&r).await,
            Err(AdapterError::Unsupported(_))
        ));
        assert!(matches!(
            s.adapter.start(&r).await,
            Err(AdapterError::Unsupported(_))
        ));
    }
}

#[tokio::test]
async fn kubernetes_stops_instead_of_pausing() {
    let s = setup(
        Variant::Real,
        FakeRuntime::Kubernetes,
        json!({"runtime": "kubernetes"}),
    )
    .await;
    let r = running(&s).await;
    assert!(matches!(
        s.adapter.pause(&r).await,
        Err(AdapterError::Unsupported(_))
    ));
    s.adapter.stop(&r).await.unwrap();
    assert_eq!(
        s.adapter.find(&r.sandbox_id).await.unwrap().unwrap().state,
        InstanceState::Stopped
    );
    s.adapter.start(&r).await.unwrap();
    assert_eq!(
        s.adapter.exec(&r, &cmd(&["true"])).await.unwrap().exit_code,
        0
    );
    // No snapshot registry: OpenSandbox's RegistryNotConfigured is unsupported_operation.
    let e = s.adapter.snapshot(&r, "snp_1").await.unwrap_err();
    assert!(matches!(e, AdapterError::Unsupported(_)), "{e:?}");
    s.fake.knobs().registry = true;
    s.adapter.snapshot(&r, "snp_1").await.unwrap();
}

#[tokio::test]
async fn snapshots_and_restore() {
    for variant in BOTH {
        let s = setup(variant, FakeRuntime::Docker, json!({})).await;
        let r = running(&s).await;
        let first = s.adapter.snapshot(&r, "snp_a").await.unwrap();
        assert!(!first.ready);
        let e = s
            .adapter
            .delete_snapshot(&first.backend_ref)
            .await
            .unwrap_err();
        assert!(matches!(e, AdapterError::Transient(_)), "{e:?}");
        if variant == Variant::Real {
            // The operator is told which of the two refusals it was.
            assert!(
                e.to_string()
                    .contains("still being written (SNAPSHOT::INVALID_STATE)"),
                "{e}"
            );
        }
        let mut info = first.clone();
        for _ in 0..10 {
            if info.ready {
                break;
            }
            info = s.adapter.snapshot(&r, "snp_a").await.unwrap();
        }
        assert!(info.ready);
        assert_eq!(
            info.backend_ref, first.backend_ref,
            "idempotent on the snapshot id"
        );
        assert_eq!(s.fake.snapshot_names().len(), 1);

        let mut req = create_req(&InstallationId::new());
        req.from_snapshot = Some(info.backend_ref.clone());
        let restored = s.adapter.create(&req).await.unwrap();
        let body = s.fake.record().create_bodies.last().unwrap().clone();
        assert_eq!(body["snapshotId"], info.backend_ref.as_str());
        assert!(body.get("image").is_none() && body.get("entrypoint").is_none());
        assert_eq!(
            s.fake
                .sandbox(&restored.backend_ref)
                .unwrap()
                .snapshot_id
                .as_deref(),
            Some(info.backend_ref.as_str())
        );

        // Recorded on the real server: while a sandbox restored from it exists, the delete is
        // refused (409 DELETE_CONFLICT), which is worth retrying, not final.
        if variant == Variant::Real {
            let e = s
                .adapter
                .delete_snapshot(&info.backend_ref)
                .await
                .unwrap_err();
            assert!(matches!(e, AdapterError::Transient(_)), "{e:?}");
            assert!(
                e.to_string()
                    .contains("in use by a sandbox restored from it"),
                "{e}"
            );
        }
        s.adapter.delete(&req.sandbox_id).await.unwrap();
        s.adapter.delete_snapshot(&info.backend_ref).await.unwrap();
        s.adapter.delete_snapshot(&info.backend_ref).await.unwrap();
        assert!(s.fake.snapshot_names().is_empty());
    }
}

#[tokio::test]
async fn ports_only_where_configured_and_never_with_headers() {
    let s = setup(Variant::Real, FakeRuntime::Docker, json!({})).await;
    let r = running(&s).await;
    assert!(matches!(
        s.adapter.expose_port(&r, 8080, None).await,
        Err(AdapterError::Unsupported(_))
    ));

    let s = setup(
        Variant::Real,
        FakeRuntime::Kubernetes,
        json!({"runtime": "kubernetes", "ports": "signed"}),
    )
    .await;
    let r = running(&s).await;
    let body = s.fake.record().create_bodies[0].clone();
    assert_eq!(body["secureAccess"], true);
    let ep = s
        .adapter
        .expose_port(&r, 3000, Some(Duration::from_secs(600)))
        .await
        .unwrap();
    assert!(
        ep.url.starts_with("https://gateway.example.test/"),
        "{}",
        ep.url
    );
    let exp = ep.expires_at.unwrap();
    assert!((exp - chrono::Utc::now()).num_seconds().abs() - 600 < 10);
    assert!(ep.url.contains(&exp.timestamp().to_string()));
    s.fake.knobs().endpoint_headers = BTreeMap::from([("X-Secure".to_owned(), "t".to_owned())]);
    assert!(matches!(
        s.adapter.expose_port(&r, 3000, None).await,
        Err(AdapterError::Permanent(_))
    ));

    let s = setup(
        Variant::Real,
        FakeRuntime::Fastsandbox,
        json!({"runtime": "fastsandbox", "templateId": "tpl-1", "features": "exec,ports.expose"}),
    )
    .await;
    let r = running(&s).await;
    let ep = s.adapter.expose_port(&r, 6080, None).await.unwrap();
    assert_eq!(
        ep.url,
        format!("https://gateway.example.test/scope-{}-6080", r.backend_ref)
    );
    assert_eq!(ep.expires_at, None);
}

#[tokio::test]
async fn fast_sandbox_uses_templates_pool_size_and_sets_the_clock() {
    let s = setup(
        Variant::Real,
        FakeRuntime::Fastsandbox,
        json!({"runtime": "fastsandbox", "templateId": "tpl-1", "poolCPU": "2", "poolMemory": "4Gi",
               "egress": "allowlist", "egressAllow": ["pypi.org"]}),
    )
    .await;
    let installation = InstallationId::new();
    let mut req = create_req(&installation);
    assert!(
        matches!(s.adapter.create(&req).await, Err(AdapterError::Permanent(m)) if m.contains("env"))
    );
    req.env.clear();
    req.ttl_seconds = 0;
    let inst = s.adapter.create(&req).await.unwrap();
    let body = s.fake.record().create_bodies.last().unwrap().clone();
    assert_eq!(body["templateId"], "tpl-1");
    assert_eq!(body["timeout"], 86400);
    assert_eq!(
        body["networkPolicy"],
        json!({"defaultAction": "deny", "egress": [{"action": "allow", "target": "pypi.org"}]})
    );
    for f in [
        "image",
        "entrypoint",
        "resourceLimits",
        "env",
        "secureAccess",
    ] {
        assert!(body.get(f).is_none(), "{f} sent in template mode");
    }
    let clock = s.fake.record().command_bodies.last().unwrap()["command"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(clock.starts_with("date -u -s @"), "{clock}");

    let snap = loop {
        let i = s.adapter.snapshot(&at(&inst), "snp_f").await.unwrap();
        if i.ready {
            break i;
        }
    };
    let mut restore = create_req(&installation);
    restore.env.clear();
    restore.from_snapshot = Some(snap.backend_ref.clone());
    s.adapter.create(&restore).await.unwrap();
    let body = s.fake.record().create_bodies.last().unwrap().clone();
    assert_eq!(body["resourceLimits"], json!({"cpu": "2", "memory": "4Gi"}));

    let mut other = create_req(&installation);
    other.env.clear();
    other.template = Some("tpl-2".to_owned());
    assert!(matches!(
        s.adapter.create(&other).await,
        Err(AdapterError::Permanent(_))
    ));

    s.adapter.pause(&at(&inst)).await.unwrap();
    s.adapter.resume(&at(&inst)).await.unwrap();
    let clock = s.fake.record().command_bodies.last().unwrap()["command"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        clock.starts_with("date -u -s @"),
        "clock set after resume: {clock}"
    );
}

#[tokio::test]
async fn routes_without_v1_and_the_unauthenticated_proxy_are_real_server_only() {
    for (variant, works, proxy_status) in [(Variant::Real, true, 200), (Variant::Spec, false, 401)]
    {
        let s = setup(variant, FakeRuntime::Docker, json!({})).await;
        let r = running(&s).await;
        let cfg: OpenSandboxConfig = serde_json::from_value(settings(
            s.fake.api_url().trim_end_matches("/v1"),
            &s.key,
            json!({}),
        ))
        .unwrap();
        let bare = OpenSandboxAdapter::new(cfg).unwrap();
        let res = bare.health().await;
        assert_eq!(res.is_ok(), works, "{variant:?}: {res:?}");
        if !works {
            assert!(
                matches!(&res, Err(AdapterError::Permanent(m)) if m.contains("apiURL")),
                "{res:?}"
            );
        }
        let url = format!(
            "{}/sandboxes/{}/proxy/44772/ping",
            s.fake.api_url(),
            r.backend_ref
        );
        let status = reqwest::get(url).await.unwrap().status().as_u16();
        assert_eq!(status, proxy_status, "{variant:?}: proxy without the key");
    }
}

#[tokio::test]
async fn execd_refusing_its_token_is_permanent() {
    let s = setup(
        Variant::Real,
        FakeRuntime::Docker,
        json!({"useServerProxy": false}),
    )
    .await;
    let r = running(&s).await;
    s.fake.knobs().execd_token = Some("needed".to_owned());
    let e = s.adapter.exec(&r, &cmd(&["true"])).await.unwrap_err();
    assert!(
        matches!(&e, AdapterError::Permanent(m) if m.contains("access token")),
        "{e:?}"
    );
}

#[tokio::test]
async fn fast_sandbox_exec_resumes_an_idle_paused_microvm() {
    let s = setup(
        Variant::Real,
        FakeRuntime::Fastsandbox,
        json!({"runtime": "fastsandbox", "templateId": "tpl-1"}),
    )
    .await;
    let r = running(&s).await;
    s.fake.set_state(&r.backend_ref, "Paused");
    let out = s.adapter.exec(&r, &cmd(&["echo", "awake"])).await.unwrap();
    assert_eq!(out.stdout, "awake\n");
    assert_eq!(s.fake.sandbox(&r.backend_ref).unwrap().state, "Running");
    // Docker does not resume behind the caller's back.
    let d = setup(Variant::Real, FakeRuntime::Docker, json!({})).await;
    let r = running(&d).await;
    d.fake.set_state(&r.backend_ref, "Paused");
    assert!(d
        .adapter
        .exec(&r, &cmd(&["true"]))
        .await
        .unwrap_err()
        .is_retryable());
    assert_eq!(d.fake.sandbox(&r.backend_ref).unwrap().state, "Paused");
}

#[tokio::test]
async fn exit_code_from_command_status_and_missing_sandboxes() {
    let s = setup(Variant::Real, FakeRuntime::Docker, json!({})).await;
    let r = running(&s).await;
    s.fake.knobs().evalue_text = true;
    let out = s
        .adapter
        .exec(&r, &cmd(&["sh", "-c", "exit 5"]))
        .await
        .unwrap();
    assert_eq!(out.exit_code, 5);
    assert!(s
        .fake
        .record()
        .requests
        .iter()
        .any(|q| q.contains("/command/status/")));

    // The sandbox is gone: exec through a cached endpoint and through a fresh lookup.
    s.adapter.delete(&r.sandbox_id).await.unwrap();
    assert_eq!(
        s.adapter.exec(&r, &cmd(&["true"])).await.unwrap_err(),
        AdapterError::NotFound
    );
    let fresh = setup(Variant::Real, FakeRuntime::Docker, json!({})).await;
    let gone = differently_adapters::InstanceRef {
        sandbox_id: SandboxId::new(),
        backend_ref: "doesnotexist".to_owned(),
    };
    assert_eq!(
        fresh
            .adapter
            .exec(&gone, &cmd(&["true"]))
            .await
            .unwrap_err(),
        AdapterError::NotFound
    );
    assert_eq!(
        fresh.adapter.pause(&gone).await.unwrap_err(),
        AdapterError::NotFound
    );
    assert!(matches!(
        fresh.adapter.list_files(&gone, "/", 1).await,
        Err(AdapterError::NotFound)
    ));
}
