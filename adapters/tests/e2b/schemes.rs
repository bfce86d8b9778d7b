//! The adapter and the conformance kit under each way an E2B-protocol backend can be reached:
//! envd routed by `E2b-Sandbox-Id`/`E2b-Sandbox-Port` on one URL (E2B Embed's client-proxy),
//! envd by a host per sandbox (`<port>-<id>.<domain>`: E2B's cloud, CubeSandbox, OpenKruise's
//! native protocol) dialled at the fake's address, and the API key as `X-API-Key`, as
//! `Authorization: Bearer` or in a header of the operator's naming. Also the envd version
//! matrix as the adapter applies it.

use differently_adapters::e2b::{E2bAdapter, E2bConfig};
use differently_adapters::{Adapter, AdapterError};
use differently_core::ids::InstallationId;
use serde_json::json;

use crate::fake_server::FakeServer;
use crate::support::cases::{body, collect};
use crate::{cmd, create_req, key_file, settings, support, Setup, KEY};

/// One way of reaching the backend.
struct Scheme {
    name: &'static str,
    /// `true`: a host per sandbox; `false`: one URL routed by headers.
    by_host: bool,
    /// The fake's expected key header (lower case) and whether it is `Bearer`.
    auth: (&'static str, bool),
}

const SCHEMES: [Scheme; 3] = [
    Scheme {
        name: "one URL, routed by headers; X-API-Key",
        by_host: false,
        auth: ("x-api-key", false),
    },
    Scheme {
        name: "a host per sandbox; Authorization: Bearer",
        by_host: true,
        auth: ("authorization", true),
    },
    Scheme {
        name: "a host per sandbox; a named header",
        by_host: true,
        auth: ("x-cube-key", false),
    },
];

async fn setup_as(scheme: &Scheme) -> Setup {
    let fake = FakeServer::start(KEY).await;
    {
        let mut k = fake.knobs();
        k.auth_header = scheme.auth.0.to_owned();
        k.auth_bearer = scheme.auth.1;
    }
    let key = key_file(KEY);
    let mut extra = json!({});
    if scheme.by_host {
        let addr = fake.envd_url().trim_start_matches("http://").to_owned();
        extra = json!({
            "envdURL": null,
            "envdHost": "http://{port}-{sandboxId}.{domain}",
            "domain": "sandboxes.test",
            "envdConnectTo": addr,
        });
    }
    match scheme.auth {
        ("authorization", true) => extra["authScheme"] = json!("bearer"),
        ("x-api-key", false) => {}
        (h, _) => extra["authHeader"] = json!(h),
    }
    let cfg: E2bConfig = serde_json::from_value(settings(&fake, &key, extra)).unwrap();
    let adapter = E2bAdapter::new(cfg).unwrap();
    Setup { fake, adapter, key }
}

/// Routing was the scheme's, and neither the API key nor a bad token reached envd.
fn routed_as(s: &Setup, scheme: &Scheme) {
    let r = s.fake.record();
    let (by_host, by_header) = (r.host_routed, r.header_routed);
    if scheme.by_host {
        assert!(
            by_host > 0 && by_header == 0,
            "{}: {by_host} by host, {by_header} by header",
            scheme.name
        );
    } else {
        assert!(
            by_header > 0 && by_host == 0,
            "{}: {by_host} by host, {by_header} by header",
            scheme.name
        );
    }
    assert_eq!(
        r.key_seen_on_envd, 0,
        "{}: the API key reached envd",
        scheme.name
    );
    assert_eq!(r.bad_tokens, 0, "{}", scheme.name);
}

#[tokio::test]
async fn the_conformance_kit_passes_under_every_scheme() {
    for scheme in &SCHEMES {
        let s = setup_as(scheme).await;
        let report = support::conformance::passes(&s.adapter).await;
        eprintln!("{}\n{}", scheme.name, report.table());
        routed_as(&s, scheme);
    }
}

#[tokio::test]
async fn exec_stdin_files_and_resume_work_under_every_scheme() {
    for scheme in &SCHEMES {
        let s = setup_as(scheme).await;
        let r = crate::running(&s).await;
        let mut req = cmd(&["cat"]);
        req.stdin = Some("piped".to_owned());
        let out = s.adapter.exec(&r, &req).await.unwrap();
        assert_eq!(
            (out.exit_code, out.stdout.as_str()),
            (0, "piped"),
            "{}",
            scheme.name
        );
        let dir = tempfile::tempdir().unwrap();
        let path = format!("{}/f.txt", dir.path().display());
        s.adapter
            .upload(&r, &path, None, body(&[b"abc"]))
            .await
            .unwrap();
        let d = s.adapter.download(&r, &path, None).await.unwrap();
        assert_eq!(collect(d).await, b"abc", "{}", scheme.name);
        s.adapter.pause(&r).await.unwrap();
        s.adapter.resume(&r).await.unwrap();
        let out = s.adapter.exec(&r, &cmd(&["echo", "back"])).await.unwrap();
        assert_eq!(out.stdout.trim(), "back", "{}", scheme.name);
        routed_as(&s, scheme);
    }
}

#[tokio::test]
async fn the_wrong_auth_header_is_refused_by_the_backend() {
    // The fake wants a Bearer token; a pool left on X-API-Key is told so, key unquoted.
    let s = crate::setup(json!({})).await;
    s.fake.knobs().auth_header = "authorization".to_owned();
    s.fake.knobs().auth_bearer = true;
    let e = s
        .adapter
        .create(&create_req(&InstallationId::new()))
        .await
        .err()
        .unwrap();
    assert!(!e.to_string().contains(KEY), "{e}");
    assert!(
        matches!(e, AdapterError::Unavailable(_) | AdapterError::Permanent(_)),
        "{e:?}"
    );
}

#[tokio::test]
async fn addressing_and_auth_rules_name_the_key() {
    let fake = FakeServer::start(KEY).await;
    let key = key_file(KEY);
    let cases = [
        (json!({"envdHost": "https://{sandboxId}.x"}), "envdURL"),
        (
            json!({"envdURL": null, "envdHost": "https://{port}.{domain}"}),
            "envdHost",
        ),
        (
            json!({"envdURL": null, "envdHost": "https://{id}-{sandboxId}.x"}),
            "envdHost",
        ),
        (
            json!({"envdURL": null, "envdHost": "https://{sandboxId}.x", "envdConnectTo": "10.0.0.1:80"}),
            "envdConnectTo",
        ),
        (json!({"envdConnectTo": "10.0.0.1:80"}), "envdConnectTo"),
        (json!({"authHeader": "bad header"}), "authHeader"),
        (json!({"authHeader": "X-Access-Token"}), "authHeader"),
        (json!({"authScheme": "digest"}), "authScheme"),
    ];
    for (extra, field) in cases {
        let (got, message) = support::cases::build_err("e2b", settings(&fake, &key, extra.clone()));
        assert_eq!(got.as_deref(), Some(field), "{extra}: {message}");
    }
}

// ---------------------------------------------------------------------------------------
// The envd version matrix

#[tokio::test]
async fn an_envd_too_old_or_unknown_is_refused_naming_it_and_not_left_running() {
    for version in ["0.0.9", "dev", "1.0.0"] {
        let s = crate::setup(json!({})).await;
        s.fake.knobs().envd_version = version.to_owned();
        let e = s
            .adapter
            .create(&create_req(&InstallationId::new()))
            .await
            .err()
            .unwrap();
        assert!(matches!(e, AdapterError::Permanent(_)), "{version}: {e:?}");
        assert!(e.to_string().contains(version), "{version}: {e}");
        assert!(
            s.fake.sandboxes().is_empty(),
            "{version}: a refused sandbox was left"
        );
    }
}

#[tokio::test]
async fn older_envd_degrades_per_feature_naming_the_version() {
    let s = crate::setup(json!({})).await;
    s.fake.knobs().envd_version = "0.5.2".to_owned();
    let r = crate::running(&s).await;
    // 0.5.2 has CloseStdin but not octet-stream uploads.
    let mut req = cmd(&["cat"]);
    req.stdin = Some("x".to_owned());
    assert_eq!(s.adapter.exec(&r, &req).await.unwrap().stdout, "x");
    let dir = tempfile::tempdir().unwrap();
    let path = format!("{}/f.txt", dir.path().display());
    let e = s
        .adapter
        .upload(&r, &path, None, body(&[b"abc"]))
        .await
        .err()
        .unwrap();
    assert!(
        matches!(&e, AdapterError::Unsupported(m) if m.contains("0.5.2") && m.contains("0.5.7")),
        "{e:?}"
    );

    let s = crate::setup(json!({})).await;
    s.fake.knobs().envd_version = "0.4.1".to_owned();
    let r = crate::running(&s).await;
    assert_eq!(
        s.adapter
            .exec(&r, &cmd(&["echo", "ok"]))
            .await
            .unwrap()
            .stdout
            .trim(),
        "ok"
    );
    let e = s.adapter.exec(&r, &req).await.err().unwrap();
    assert!(
        matches!(&e, AdapterError::Unsupported(m) if m.contains("0.4.1")),
        "{e:?}"
    );
    let starts = s.fake.record().start_bodies.len();
    assert_eq!(starts, 1, "a refused exec must not reach envd");
}
