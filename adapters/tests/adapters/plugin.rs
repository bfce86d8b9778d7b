//! The plugin protocol end to end in one process: the reference plugin (the fake served by
//! `plugin_server`) passes the conformance kit over HTTP; plugins that lie about a
//! capability fail it by name; the `remote` adapter drives a plugin, keeps its token out of
//! every message, reaches an https plugin behind a private CA, and refuses a plugin that
//! speaks another version; the protocol document lists exactly the routes the server
//! declares.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use differently_adapters::conformance::{self, Outcome, Target};
use differently_adapters::credentials::{CredentialRef, Credentials};
use differently_adapters::fake::{FakeAdapter, FakeConfig};
use differently_adapters::http::Secret;
use differently_adapters::plugin_server::PluginServer;
use differently_adapters::{
    registry, Adapter, AdapterError, ByteRange, ByteStream, Capability, CreateInstance, Download,
    ExecEvent, ExecExit, FileEntry, Instance, InstanceRef, SharedAdapter,
};
use differently_core::exec::{ExecRequest, ExecResult};
use differently_core::ids::InstallationId;
use differently_core::SandboxId;
use futures::StreamExt;
use serde_json::{json, Value};

use super::{create_req, exec_req};

const TOKEN: &str = "plugin-test-token-0123456789";
const ALL: [&str; 8] = [
    "exec",
    "exec.stream",
    "files",
    "lifecycle.pause",
    "lifecycle.stop",
    "snapshots",
    "ports.expose",
    "warm",
];

fn caps(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| (*s).to_owned()).collect()
}

fn fake(names: &[&str]) -> FakeAdapter {
    FakeAdapter::new(FakeConfig {
        capabilities: caps(names),
        ..FakeConfig::default()
    })
}

/// Serves `router` on a loopback port; its base URL.
async fn serve(router: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    format!("http://{addr}")
}

async fn plugin(adapter: SharedAdapter) -> String {
    serve(PluginServer::new(adapter, "test-plugin", Secret::parse(TOKEN).unwrap()).router()).await
}

/// The token in a file, as `--token-file` and `file:` references read it.
fn token_file(dir: &tempfile::TempDir, token: &str) -> PathBuf {
    let p = dir.path().join("token");
    std::fs::write(&p, format!("{token}\n")).unwrap();
    p
}

fn remote(url: &str, token: &std::path::Path) -> SharedAdapter {
    registry::build_with(
        "remote",
        &json!({"url": url, "allowHttp": true, "token": format!("file:{}", token.display())}),
        &Credentials::default(),
    )
    .unwrap()
}

#[tokio::test]
async fn the_reference_plugin_conforms_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(&dir, TOKEN);
    // Every capability the protocol carries, and the smallest set: undeclared ones are then
    // checked for honest refusals.
    for names in [&ALL[..], &["exec"][..]] {
        let url = plugin(Arc::new(fake(names))).await;
        let report = conformance::run_plugin(&Target {
            url: url.clone(),
            token: CredentialRef::File(token.clone()),
        })
        .await;
        assert!(report.ok(), "{}", report.table());
        assert_eq!(report.declared, caps(names));
        for name in [
            "info",
            "auth.required",
            "auth.wrong-token",
            "version.refused",
            "errors.shape",
            "create.idempotent",
            "exec.timeout",
            "list",
            "delete",
        ] {
            assert_eq!(
                report.check(name).map(|c| c.outcome),
                Some(Outcome::Pass),
                "{name}\n{}",
                report.table()
            );
        }
        // A plugin declaring warm makes an instance with no env, finds it, and claims it.
        let warm = if names.contains(&"warm") {
            Outcome::Pass
        } else {
            Outcome::Skip
        };
        assert_eq!(
            report.check("warm").map(|c| c.outcome),
            Some(warm),
            "{}",
            report.table()
        );
        if names.len() == 1 {
            assert_eq!(
                report.check("honesty.files").map(|c| c.outcome),
                Some(Outcome::Pass)
            );
            assert_eq!(
                report.check("files").map(|c| c.outcome),
                Some(Outcome::Skip)
            );
        } else {
            assert_eq!(
                report.check("files.range").map(|c| c.outcome),
                Some(Outcome::Pass)
            );
            assert!(report.check("honesty.files").is_none());
        }
        // The report reads as JSON for pipelines.
        let v = serde_json::to_value(&report).unwrap();
        assert_eq!(v["failed"], 0);
        assert_eq!(v["plugin"]["name"], "test-plugin");
    }
}

#[tokio::test]
async fn a_wrong_token_fails_conformance_without_showing_either_token() {
    let dir = tempfile::tempdir().unwrap();
    let url = plugin(Arc::new(fake(&["exec"]))).await;
    let wrong = token_file(&dir, "the-wrong-token-value");
    let report = conformance::run_plugin(&Target {
        url,
        token: CredentialRef::File(wrong),
    })
    .await;
    assert!(!report.ok());
    assert_eq!(report.failures(), vec!["info"], "{}", report.table());
    let text = report.table();
    assert!(
        !text.contains("the-wrong-token-value") && !text.contains(TOKEN),
        "{text}"
    );
}

/// An adapter whose declarations are not what it does: it claims `extra` and hides `hidden`.
struct Liar {
    inner: FakeAdapter,
    extra: &'static str,
    hidden: &'static str,
}

#[async_trait]
impl Adapter for Liar {
    fn kind(&self) -> &'static str {
        "fake"
    }
    fn capabilities(&self) -> Vec<Capability> {
        let mut c: Vec<Capability> = self
            .inner
            .capabilities()
            .into_iter()
            .filter(|c| *c != self.hidden)
            .collect();
        c.extend(Capability::parse(self.extra));
        c
    }
    async fn create(&self, req: &CreateInstance) -> Result<Instance, AdapterError> {
        self.inner.create(req).await
    }
    async fn delete(&self, id: &SandboxId) -> Result<(), AdapterError> {
        self.inner.delete(id).await
    }
    async fn find(&self, id: &SandboxId) -> Result<Option<Instance>, AdapterError> {
        self.inner.find(id).await
    }
    async fn list(&self, i: &InstallationId) -> Result<Vec<Instance>, AdapterError> {
        self.inner.list(i).await
    }
    async fn exec(&self, at: &InstanceRef, req: &ExecRequest) -> Result<ExecResult, AdapterError> {
        self.inner.exec(at, req).await
    }
    async fn health(&self) -> Result<(), AdapterError> {
        self.inner.health().await
    }
    async fn exec_stream(
        &self,
        at: &InstanceRef,
        req: &ExecRequest,
        out: tokio::sync::mpsc::Sender<ExecEvent>,
    ) -> Result<ExecExit, AdapterError> {
        self.inner.exec_stream(at, req, out).await
    }
    async fn upload(
        &self,
        at: &InstanceRef,
        path: &str,
        mode: Option<u32>,
        body: ByteStream,
    ) -> Result<(), AdapterError> {
        self.inner.upload(at, path, mode, body).await
    }
    async fn download(
        &self,
        at: &InstanceRef,
        path: &str,
        range: Option<ByteRange>,
    ) -> Result<Download, AdapterError> {
        self.inner.download(at, path, range).await
    }
    async fn list_files(
        &self,
        at: &InstanceRef,
        path: &str,
        depth: u32,
    ) -> Result<Vec<FileEntry>, AdapterError> {
        self.inner.list_files(at, path, depth).await
    }
    async fn delete_file(&self, at: &InstanceRef, path: &str) -> Result<(), AdapterError> {
        self.inner.delete_file(at, path).await
    }
    async fn make_dir(
        &self,
        at: &InstanceRef,
        path: &str,
        mode: Option<u32>,
    ) -> Result<bool, AdapterError> {
        self.inner.make_dir(at, path, mode).await
    }
}

#[tokio::test]
async fn a_plugin_that_lies_about_a_capability_fails_the_named_check() {
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(&dir, TOKEN);
    // Declares snapshots it does not have.
    let liar = Liar {
        inner: fake(&["exec", "exec.stream", "files"]),
        extra: "snapshots",
        hidden: "",
    };
    let url = plugin(Arc::new(liar)).await;
    let report = conformance::run_plugin(&Target {
        url,
        token: CredentialRef::File(token.clone()),
    })
    .await;
    assert_eq!(report.failures(), vec!["snapshots"], "{}", report.table());
    assert!(
        report
            .check("snapshots")
            .unwrap()
            .detail
            .contains("unsupported_operation"),
        "{}",
        report.table()
    );

    // Serves files without declaring them (its server trusts the adapter's refusals).
    let liar = Liar {
        inner: fake(&["exec", "files"]),
        extra: "exec",
        hidden: "files",
    };
    let router = PluginServer::new(Arc::new(liar), "liar", Secret::parse(TOKEN).unwrap())
        .trust_adapter_refusals()
        .router();
    let url = serve(router).await;
    let report = conformance::run_plugin(&Target {
        url,
        token: CredentialRef::File(token),
    })
    .await;
    assert_eq!(
        report.failures(),
        vec!["honesty.files"],
        "{}",
        report.table()
    );
}

#[tokio::test]
async fn the_remote_adapter_drives_a_plugin_and_gates_on_its_info() {
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(&dir, TOKEN);
    let backend = Arc::new(fake(&["exec", "exec.stream", "files"]));
    let url = plugin(backend.clone()).await;
    let a = remote(&url, &token);
    assert_eq!(a.kind(), "remote");
    // The plugin's `/info` is read in the background as soon as the adapter exists, so a
    // process that never probes the pool (an API process) learns its capabilities too.
    let known = async {
        while a.capabilities().is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), known)
        .await
        .expect("capabilities read from /info without any call");
    assert_eq!(a.capabilities(), caps(&["exec", "files", "exec.stream"]));
    a.health().await.unwrap();

    let (id, inst) = (SandboxId::new(), InstallationId::new());
    let i = a.create(&create_req(&id, &inst)).await.unwrap();
    assert_eq!(a.create(&create_req(&id, &inst)).await.unwrap(), i);
    let at = InstanceRef {
        sandbox_id: id.clone(),
        backend_ref: i.backend_ref.clone(),
    };
    let r = a
        .exec(&at, &exec_req(&["echo", "through", "plugin"]))
        .await
        .unwrap();
    assert_eq!((r.exit_code, r.stdout.as_str()), (0, "through plugin\n"));

    // A big streamed output arrives whole and in order.
    let (tx, mut rx) = tokio::sync::mpsc::channel(4);
    let req = exec_req(&["fake-output", "300000"]);
    let collect = async {
        let mut n = 0usize;
        while let Some(ev) = rx.recv().await {
            let ExecEvent::Stdout(b) = ev else {
                panic!("stderr")
            };
            n += b.len();
        }
        n
    };
    let (exit, n) = tokio::join!(a.exec_stream(&at, &req, tx), collect);
    assert_eq!((exit.unwrap().exit_code, n), (0, 300_000));

    // A reader that goes away cancels the command on the backend.
    let (tx, mut rx) = tokio::sync::mpsc::channel(1);
    let req = exec_req(&["fake-output", "100000000"]);
    let reader = async {
        rx.recv().await;
        drop(rx);
    };
    let (exit, ()) = tokio::join!(a.exec_stream(&at, &req, tx), reader);
    assert_eq!(exit.unwrap().exit_code, 137);
    let cancelled = async {
        loop {
            let seen = backend
                .ledger()
                .iter()
                .any(|e| serde_json::to_value(e).unwrap()["outcome"] == "cancelled");
            if seen {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), cancelled)
        .await
        .expect("the backend saw the hang-up as a cancelled exec");

    // Files, with a range.
    let body = futures::stream::iter(vec![Ok(bytes::Bytes::from_static(b"0123456789"))]).boxed();
    a.upload(&at, "/work/f.txt", Some(0o600), body)
        .await
        .unwrap();
    let d = a
        .download(
            &at,
            "/work/f.txt",
            Some(ByteRange {
                start: 2,
                end: Some(4),
            }),
        )
        .await
        .unwrap();
    let got: Vec<u8> = d.body.map(|c| c.unwrap().to_vec()).concat().await;
    assert_eq!(
        (d.total_size, got.as_slice()),
        (Some(10), b"234".as_slice())
    );
    assert!(matches!(
        a.download(&at, "/work/none", None).await.err(),
        Some(AdapterError::PathNotFound(_))
    ));

    // Undeclared: refused here, as unsupported.
    assert!(matches!(
        a.pause(&at).await,
        Err(AdapterError::Unsupported(_))
    ));
    assert!(matches!(
        a.snapshot(&at, "snp_x").await,
        Err(AdapterError::Unsupported(_))
    ));
    // Renew is fine whatever the backend has.
    a.renew(&at, Duration::from_secs(60)).await.unwrap();

    assert_eq!(a.list(&inst).await.unwrap(), vec![i.clone()]);
    a.delete(&id).await.unwrap();
    a.delete(&id).await.unwrap();
    assert_eq!(a.find(&id).await.unwrap(), None);
    assert!(matches!(
        a.exec(&at, &exec_req(&["true"])).await,
        Err(AdapterError::NotFound)
    ));
}

#[tokio::test]
async fn the_token_stays_out_of_messages_and_other_versions_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(&dir, TOKEN);
    // A plugin that quotes the Authorization header back in its error message.
    let echo = axum::Router::new().fallback(|headers: axum::http::HeaderMap| async move {
        let auth = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(
                json!({"code": "transient", "message": format!("saw {auth}"), "retryable": true}),
            ),
        )
    });
    let a = remote(&serve(echo).await, &token);
    let e = a.health().await.unwrap_err();
    assert!(matches!(e, AdapterError::Transient(_)), "{e:?}");
    let text = format!("{e} {e:?}");
    assert!(text.contains("saw Bearer ***"), "{text}");
    assert!(!text.contains(TOKEN), "{text}");

    // The plugin refuses our token: permanent, and neither token is shown.
    let url = plugin(Arc::new(fake(&["exec"]))).await;
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "another-token-entirely").unwrap();
    let e = remote(&url, &wrong).health().await.unwrap_err();
    assert!(matches!(e, AdapterError::Permanent(_)), "{e:?}");
    let text = format!("{e} {e:?}");
    assert!(text.contains("refused the token"), "{text}");
    assert!(
        !text.contains("another-token") && !text.contains(TOKEN),
        "{text}"
    );

    // A token reference that does not resolve: unavailable, naming the reference.
    let gone = dir.path().join("absent");
    let e = remote(&url, &gone).health().await.unwrap_err();
    assert!(matches!(e, AdapterError::Unavailable(_)), "{e:?}");
    assert!(e.to_string().contains("absent"), "{e}");

    // A plugin of protocol version 2 only.
    let v2 = axum::Router::new().route(
        "/adapter/v1/info",
        axum::routing::get(|| async {
            axum::Json(json!({"protocol": "differently-adapter", "versions": [2], "name": "future", "capabilities": ["exec"]}))
        }),
    );
    let e = remote(&serve(v2).await, &token).health().await.unwrap_err();
    assert!(matches!(e, AdapterError::Permanent(_)), "{e:?}");
    assert!(e.to_string().contains("[2]"), "{e}");

    // Something at the URL that is not a plugin: a 404 is not "no such instance".
    let nothing = axum::Router::new();
    let a = remote(&serve(nothing).await, &token);
    let e = a.find(&SandboxId::new()).await.unwrap_err();
    assert!(matches!(e, AdapterError::Permanent(_)), "{e:?}");
}

/// `(method, path)` of every route the server declares, read from its source: each
/// `.route("PATH", get(..).put(..))` call.
fn served_routes() -> BTreeSet<(String, String)> {
    let src = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/plugin_server/mod.rs"
    ))
    .unwrap();
    let mut out = BTreeSet::new();
    for (start, _) in src.match_indices(".route(") {
        let rest = src[start + ".route(".len()..].trim_start();
        let Some(rest) = rest.strip_prefix('"') else {
            continue;
        };
        let end = rest.find('"').unwrap();
        let path = rest[..end].to_owned();
        let mut depth = 1usize;
        let mut args = "";
        for (i, c) in rest[end..].char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        args = &rest[end..end + i];
                        break;
                    }
                }
                _ => {}
            }
        }
        for m in ["get", "put", "post", "delete"] {
            let called = args.match_indices(&format!("{m}(")).any(|(i, _)| {
                i == 0
                    || !args.as_bytes()[i - 1].is_ascii_alphanumeric()
                        && args.as_bytes()[i - 1] != b'_'
            });
            if called {
                out.insert((m.to_uppercase(), path.clone()));
            }
        }
    }
    out
}

fn document() -> Value {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/plugin-protocol.json"
    ))
    .unwrap();
    serde_json::from_str(&text).unwrap()
}

#[tokio::test]
async fn the_protocol_document_lists_exactly_the_served_routes() {
    let doc = document();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for m in ["get", "put", "post", "delete", "patch"] {
            if item.get(m).is_some() {
                documented.insert((m.to_uppercase(), format!("/adapter/v1{path}")));
            }
        }
    }
    let served = served_routes();
    assert!(served.len() >= 19, "{served:?}");
    assert_eq!(documented, served, "document vs server");

    // Every documented route is answered by a handler (a protocol error body at worst),
    // never the fallback nor a 405.
    let url = plugin(Arc::new(fake(&ALL))).await;
    let http = reqwest::Client::new();
    for (method, path) in &documented {
        let concrete = path
            .replace("{sandbox_id}", SandboxId::new().as_str())
            .replace("{snapshot_id}", "snp_x")
            .replace("{backend_ref}", "ref")
            .replace("{port}", "8080");
        let resp = http
            .request(
                method.parse().unwrap(),
                format!(
                    "{url}{concrete}?backendRef=r&path=/x&installationId={}",
                    InstallationId::new()
                ),
            )
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let body = resp.text().await.unwrap();
        assert_ne!(status, 405, "{method} {path}: {body}");
        assert!(!body.contains("no such route"), "{method} {path}: {body}");
        // Every documented operation has a 2xx answer and the error response.
        let op = &doc["paths"][path.trim_start_matches("/adapter/v1")][method.to_lowercase()];
        let responses = op["responses"].as_object().unwrap();
        assert!(
            responses.keys().any(|k| k.starts_with('2')),
            "{method} {path}"
        );
        assert!(
            responses.contains_key("default"),
            "{method} {path}: no error response"
        );
    }
    // An unknown route is unsupported, in the protocol's shape.
    let resp = http
        .get(format!("{url}/adapter/v1/pty"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 501);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["code"], "unsupported_operation");
}

/// Accepts TLS connections with the fixture certificate (signed by the fixture CA); a client
/// that does not trust it fails the handshake, which is skipped.
struct TlsListener {
    tcp: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((tcp, addr)) = self.tcp.accept().await else {
                continue;
            };
            if let Ok(tls) = self.acceptor.accept(tcp).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

fn tls_fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tls")
        .join(name)
}

#[tokio::test]
async fn a_plugin_over_https_with_a_private_ca_is_reached_through_ca_bundle() {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(tls_fixture("server.pem"))
            .unwrap()
            .map(|c| c.unwrap())
            .collect();
    let key = PrivateKeyDer::from_pem_file(tls_fixture("server.key")).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let listener = TlsListener {
        tcp: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
    };
    let port = listener.tcp.local_addr().unwrap().port();
    let router = PluginServer::new(
        Arc::new(fake(&["exec"])),
        "tls",
        Secret::parse(TOKEN).unwrap(),
    )
    .router();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(&dir, TOKEN);
    let url = format!("https://127.0.0.1:{port}");
    let settings = |ca: bool| {
        let mut s = json!({"url": url, "token": format!("file:{}", token.display())});
        if ca {
            s["caBundle"] = json!(tls_fixture("ca.pem"));
        }
        s
    };
    let a = registry::build_with("remote", &settings(true), &Credentials::default()).unwrap();
    a.health().await.unwrap();
    let (id, inst) = (SandboxId::new(), InstallationId::new());
    let i = a.create(&create_req(&id, &inst)).await.unwrap();
    let at = InstanceRef {
        sandbox_id: id.clone(),
        backend_ref: i.backend_ref,
    };
    let r = a
        .exec(&at, &exec_req(&["echo", "over", "tls"]))
        .await
        .unwrap();
    assert_eq!(r.stdout, "over tls\n");
    a.delete(&id).await.unwrap();

    // Without the bundle the certificate is unknown: refused before any token is sent.
    let a = registry::build_with("remote", &settings(false), &Credentials::default()).unwrap();
    let e = a.health().await.unwrap_err();
    assert!(e.is_retryable(), "{e:?}");
    assert!(!format!("{e} {e:?}").contains(TOKEN), "{e:?}");
}
