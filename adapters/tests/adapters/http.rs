//! The shared HTTP layer: an `https://` backend with a private CA reached through `caBundle`,
//! and retries of idempotent requests on transient answers.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use differently_adapters::credentials::Credentials;
use differently_adapters::http::HttpClientBuilder;
use differently_adapters::registry;
use differently_adapters::AdapterError;
use reqwest::Method;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

const KEY: &str = "tls-test-key-0123456789";

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tls")
        .join(name)
}

/// Reads one request's head and answers `status` with `body`; returns the head.
async fn answer<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    status: &str,
    body: &str,
) -> std::io::Result<String> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let resp = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(resp.as_bytes()).await?;
    s.shutdown().await?;
    Ok(String::from_utf8_lossy(&head).into_owned())
}

/// An https server on loopback with the fixture certificate (signed by the fixture CA),
/// answering every request with an empty sandbox page; the request heads it saw.
async fn https_server() -> (String, Arc<Mutex<Vec<String>>>) {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(fixture("server.pem"))
        .unwrap()
        .map(|c| c.unwrap())
        .collect();
    let key = PrivateKeyDer::from_pem_file(fixture("server.key")).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let seen = seen2.clone();
            tokio::spawn(async move {
                // A client that does not trust the certificate hangs up in the handshake.
                if let Ok(tls) = acceptor.accept(tcp).await {
                    let body = r#"{"items":[],"pagination":null}"#;
                    if let Ok(head) = answer(tls, "200 OK", body).await {
                        seen.lock().unwrap().push(head);
                    }
                }
            });
        }
    });
    (format!("https://127.0.0.1:{}/v1", addr.port()), seen)
}

fn key_file() -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    writeln!(f, "{KEY}").unwrap();
    f
}

#[tokio::test]
async fn an_https_backend_with_a_private_ca_is_reached_through_ca_bundle() {
    let (url, seen) = https_server().await;
    let key = key_file();
    let settings = serde_json::json!({
        "apiURL": url,
        "trust": "private",
        "apiKeyFile": key.path(),
        "caBundle": fixture("ca.pem"),
    });
    let a = registry::build("opensandbox", &settings).unwrap();
    a.health().await.unwrap();
    let heads = seen.lock().unwrap().clone();
    // The probe lists, then (once per pool) asks the server's version; both over TLS.
    assert_eq!(heads.len(), 2, "{heads:?}");
    assert!(heads[0].starts_with("GET /v1/sandboxes?"), "{}", heads[0]);
    assert!(heads[1].starts_with("GET /version "), "{}", heads[1]);
    for head in &heads {
        assert!(
            head.to_ascii_lowercase()
                .contains(&format!("open-sandbox-api-key: {KEY}")),
            "the key goes to the server over TLS: {head}"
        );
    }

    // Without the bundle the certificate is unknown: refused, and the key is not in the error.
    let mut untrusted = settings.clone();
    untrusted.as_object_mut().unwrap().remove("caBundle");
    let a = registry::build("opensandbox", &untrusted).unwrap();
    let e = a.health().await.unwrap_err();
    assert!(e.is_retryable(), "{e:?}");
    let text = e.to_string();
    assert!(text.contains("health check"), "{text}");
    assert!(!text.contains(KEY), "{text}");
    assert_eq!(
        seen.lock().unwrap().len(),
        heads.len(),
        "no request got through"
    );
}

#[tokio::test]
async fn a_bad_ca_bundle_is_refused_naming_the_setting() {
    let key = key_file();
    let not_pem = tempfile::NamedTempFile::new().unwrap();
    for path in [PathBuf::from("/nonexistent/ca.pem"), not_pem.path().into()] {
        let settings = serde_json::json!({
            "apiURL": "https://127.0.0.1:9/v1",
            "trust": "private",
            "apiKeyFile": key.path(),
            "caBundle": path,
        });
        match registry::build("opensandbox", &settings) {
            Err(registry::AdapterConfigError::InvalidSettings { field, .. }) => {
                assert_eq!(field.as_deref(), Some("caBundle"))
            }
            Err(e) => panic!("unexpected {e}"),
            Ok(_) => panic!("accepted {settings}"),
        }
    }
}

/// A plain-http server answering 503 to the first `busy` requests, then 200.
async fn flaky_server(busy: usize) -> (String, Arc<Mutex<usize>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(Mutex::new(0usize));
    let count2 = count.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let n = {
                let mut c = count2.lock().unwrap();
                *c += 1;
                *c
            };
            let status = if n <= busy {
                "503 Service Unavailable"
            } else {
                "200 OK"
            };
            tokio::spawn(answer(tcp, status, "{}"));
        }
    });
    (format!("http://127.0.0.1:{}", addr.port()), count)
}

#[tokio::test]
async fn idempotent_requests_are_retried_on_transient_answers() {
    let (url, count) = flaky_server(2).await;
    let c = HttpClientBuilder::new("Test", url)
        .retries(3, Duration::from_millis(1))
        .build(&Credentials::default())
        .unwrap();
    let resp = c.send(c.api(Method::GET, "/x"), "get x").await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(*count.lock().unwrap(), 3, "two 503s, then the answer");

    // A POST is not repeated: its 503 comes back as it is.
    let (url, count) = flaky_server(1).await;
    let c = HttpClientBuilder::new("Test", url)
        .retries(3, Duration::from_millis(1))
        .build(&Credentials::default())
        .unwrap();
    let resp = c.send(c.api(Method::POST, "/x"), "post x").await.unwrap();
    assert_eq!(resp.status().as_u16(), 503);
    assert_eq!(*count.lock().unwrap(), 1);
}

#[tokio::test]
async fn an_unreachable_backend_is_unavailable_after_the_retries() {
    // Bind then drop: nothing listens on the port any more.
    let port = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let c = HttpClientBuilder::new("Test", format!("http://127.0.0.1:{port}"))
        .retries(2, Duration::from_millis(1))
        .build(&Credentials::default())
        .unwrap();
    let e = c.send(c.api(Method::GET, "/x"), "get x").await.unwrap_err();
    assert!(matches!(e, AdapterError::Unavailable(_)), "{e:?}");
    // The transport error is kept as the cause (no secret in it to hide).
    use std::error::Error;
    assert!(e.source().and_then(|r| r.source()).is_some());
}
