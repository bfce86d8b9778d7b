//! Raw baselines measured in the same run, on the same Postgres and nats-server: single-row
//! insert transactions (1 and 8 connections), acknowledged JetStream publishes (1 and 8 in
//! flight), and the two "direct" exec references for P4 (the fake adapter called in-process,
//! and an HTTP round trip to a trivial local axum handler), each also as a streamed-output
//! throughput for P4s.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use differently_adapters::fake::{FakeAdapter, FakeConfig};
use differently_adapters::{Adapter, ExecEvent, InstanceRef};
use differently_core::exec::ExecRequest;
use differently_core::SandboxId;
use sqlx::Connection;

use crate::stats::{summarize, StreamRate, Summary, Throughput};
use crate::LoadError;

/// Autocommit single-row inserts (one statement = one transaction = one commit) from
/// `connections` connections for `duration`, into a scratch table of the run's database.
pub async fn pg_insert_tps(
    url: &str,
    connections: usize,
    duration: Duration,
) -> Result<Throughput, LoadError> {
    let mut setup = sqlx::PgConnection::connect(url)
        .await
        .map_err(|e| LoadError::db("baseline: connect", e))?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS load_baseline (
             id bigserial PRIMARY KEY, payload text NOT NULL, at timestamptz NOT NULL DEFAULT now())",
    )
    .execute(&mut setup)
    .await
    .map_err(|e| LoadError::db("baseline: create table", e))?;
    let mut conns = Vec::with_capacity(connections);
    for _ in 0..connections {
        conns.push(
            sqlx::PgConnection::connect(url)
                .await
                .map_err(|e| LoadError::db("baseline: connect", e))?,
        );
    }
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = tokio::task::JoinSet::new();
    for mut c in conns {
        tasks.spawn(async move {
            let mut lat = Vec::new();
            while Instant::now() < deadline {
                let t = Instant::now();
                sqlx::query("INSERT INTO load_baseline (payload) VALUES ($1)")
                    .bind("baseline-row-of-about-sixty-bytes-like-a-small-sandbox-record")
                    .execute(&mut c)
                    .await?;
                lat.push(t.elapsed());
            }
            let _ = c.close().await;
            Ok::<_, sqlx::Error>(lat)
        });
    }
    let mut all = Vec::new();
    while let Some(r) = tasks.join_next().await {
        let lat = r
            .map_err(|e| LoadError::Process(format!("baseline task: {e}")))?
            .map_err(|e| LoadError::db("baseline: insert", e))?;
        all.extend(lat);
    }
    let wall = started.elapsed();
    Ok(Throughput::new(all.len() as u64, wall, &all))
}

/// Acknowledged JetStream publishes (file storage, a `Nats-Msg-Id` on each, as the bus
/// publishes) with `in_flight` concurrent publishers for `duration`, on a scratch stream.
pub async fn js_publish_rate(
    nats_url: &str,
    in_flight: usize,
    duration: Duration,
) -> Result<Throughput, LoadError> {
    let client = async_nats::connect(nats_url)
        .await
        .map_err(|e| LoadError::Nats(format!("connect {nats_url}: {e}")))?;
    let js = jetstream::new(client);
    let name = format!("LOADBASE{in_flight}");
    js.get_or_create_stream(jetstream::stream::Config {
        name: name.clone(),
        subjects: vec![format!("loadbase{in_flight}.>")],
        storage: jetstream::stream::StorageType::File,
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    })
    .await
    .map_err(|e| LoadError::Nats(format!("create stream {name}: {e}")))?;
    let started = Instant::now();
    let deadline = started + duration;
    let seq = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..in_flight {
        let js = js.clone();
        let seq = seq.clone();
        tasks.spawn(async move {
            let mut lat = Vec::new();
            let payload = bytes::Bytes::from(vec![b'x'; 256]);
            while Instant::now() < deadline {
                let n = seq.fetch_add(1, Ordering::Relaxed);
                let mut headers = async_nats::HeaderMap::new();
                headers.insert(
                    async_nats::header::NATS_MESSAGE_ID,
                    format!("m{n}").as_str(),
                );
                let t = Instant::now();
                let ack = js
                    .publish_with_headers(
                        format!("loadbase{in_flight}.m"),
                        headers,
                        payload.clone(),
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                ack.await.map_err(|e| e.to_string())?;
                lat.push(t.elapsed());
            }
            Ok::<_, String>(lat)
        });
    }
    let mut all = Vec::new();
    while let Some(r) = tasks.join_next().await {
        let lat = r
            .map_err(|e| LoadError::Nats(format!("publish task: {e}")))?
            .map_err(|e| LoadError::Nats(format!("publish: {e}")))?;
        all.extend(lat);
    }
    let wall = started.elapsed();
    let _ = js.delete_stream(&name).await;
    Ok(Throughput::new(all.len() as u64, wall, &all))
}

/// The fake adapter's own `exec` cost: a `FakeAdapter` on the cluster's ledger file (the
/// same fake the API calls, same file lock and append), called in-process, sequentially.
pub async fn direct_fake_exec(
    ledger: &std::path::Path,
    sandbox_id: &SandboxId,
    backend_ref: &str,
    samples: usize,
) -> Result<Summary, LoadError> {
    let fake = FakeAdapter::new(FakeConfig {
        ledger: Some(ledger.to_owned()),
        ..FakeConfig::default()
    });
    let at = InstanceRef {
        sandbox_id: sandbox_id.clone(),
        backend_ref: backend_ref.to_owned(),
    };
    let req = echo_request();
    // The first call replays the whole ledger; it is not part of the steady state.
    fake.exec(&at, &req)
        .await
        .map_err(|e| LoadError::Process(format!("direct fake exec: {e}")))?;
    let mut lat = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t = Instant::now();
        let out = fake
            .exec(&at, &req)
            .await
            .map_err(|e| LoadError::Process(format!("direct fake exec: {e}")))?;
        lat.push(t.elapsed());
        if out.stdout != "hi\n" {
            return Err(LoadError::Process(format!(
                "direct fake exec answered {:?}",
                out.stdout
            )));
        }
    }
    Ok(summarize(&lat))
}

/// The exec body used everywhere: `echo hi`, which the fake answers.
pub fn echo_request() -> ExecRequest {
    ExecRequest {
        command: vec!["echo".to_owned(), "hi".to_owned()],
        ..ExecRequest::default()
    }
}

/// One HTTP round trip to a trivial local axum handler that answers an exec-shaped JSON
/// body: the cost of the HTTP hop alone with the same client library.
pub async fn trivial_http_rtt(
    http: &reqwest::Client,
    samples: usize,
) -> Result<Summary, LoadError> {
    use axum::routing::post;
    let app = axum::Router::new().route(
        "/exec",
        post(|body: axum::body::Bytes| async move {
            let _ = body.len();
            axum::Json(serde_json::json!({
                "exitCode": 0, "stdout": "hi\n", "stderr": "",
                "stdoutTruncated": false, "stderrTruncated": false, "durationMs": 0
            }))
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| LoadError::io("binding the trivial handler", e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| LoadError::io("trivial handler address", e))?;
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let url = format!("http://{addr}/exec");
    let body = serde_json::json!({"command": ["echo", "hi"]});
    let mut lat = Vec::with_capacity(samples);
    let mut result = Ok(());
    for i in 0..=samples {
        let t = Instant::now();
        let r = http
            .post(&url)
            .bearer_auth("dly_key_trivial")
            .json(&body)
            .send()
            .await
            .map_err(|e| LoadError::http("trivial handler", e));
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                result = Err(e);
                break;
            }
        };
        if let Err(e) = r.bytes().await {
            result = Err(LoadError::http("trivial handler body", e));
            break;
        }
        // The first request opens the connection; it is not part of the steady state.
        if i > 0 {
            lat.push(t.elapsed());
        }
    }
    server.abort();
    result.map(|()| summarize(&lat))
}

/// Chunks buffered between the adapter and its reader, as the API buffers them
/// (`differently_api::routes::exec::STREAM_BUFFER`), so the in-process baseline has the same
/// back-pressure as the served path.
pub const STREAM_BUFFER: usize = 8;

/// Payload bytes of the small stream each streamed variant runs once before measuring: it
/// opens the HTTP connection, or makes a fresh `FakeAdapter` replay the ledger.
pub const STREAM_WARMUP_BYTES: u64 = 4096;

/// `fake-output N`: N bytes of `y\n` on stdout, generated as the reader takes them.
pub fn fake_output_request(bytes: u64) -> ExecRequest {
    ExecRequest {
        command: vec!["fake-output".to_owned(), bytes.to_string()],
        ..ExecRequest::default()
    }
}

/// Runs `fake-output bytes` once through `FakeAdapter::exec_stream`, draining the channel
/// and counting stdout bytes; the count must be exactly `bytes`.
async fn fake_stream_once(
    fake: &FakeAdapter,
    at: &InstanceRef,
    bytes: u64,
) -> Result<(), LoadError> {
    let req = fake_output_request(bytes);
    let (tx, mut rx) = tokio::sync::mpsc::channel(STREAM_BUFFER);
    let drain = async {
        let (mut out, mut err) = (0u64, 0u64);
        while let Some(ev) = rx.recv().await {
            match ev {
                ExecEvent::Stdout(b) => out += b.len() as u64,
                ExecEvent::Stderr(b) => err += b.len() as u64,
            }
        }
        (out, err)
    };
    let (exit, (out, err)) = tokio::join!(fake.exec_stream(at, &req, tx), drain);
    let exit = exit.map_err(|e| LoadError::Process(format!("direct fake exec_stream: {e}")))?;
    if exit.exit_code != 0 || err != 0 {
        return Err(LoadError::Check(format!(
            "direct fake exec_stream of {bytes} bytes exited with {} ({err} stderr bytes)",
            exit.exit_code
        )));
    }
    if out != bytes {
        return Err(LoadError::Check(format!(
            "direct fake exec_stream: asked for {bytes} bytes, {out} arrived"
        )));
    }
    Ok(())
}

/// The fake adapter's own streamed-exec throughput: a `FakeAdapter` with `exec.stream` on
/// the cluster's ledger file (same ledger lock and append as the served call), streaming
/// `fake-output bytes` in-process into a channel of the API's size, `repetitions` times.
/// This is the "direct" of P4s: what a client of the backend itself would get, minus its
/// own transport.
pub async fn direct_fake_exec_stream(
    ledger: &std::path::Path,
    sandbox_id: &SandboxId,
    backend_ref: &str,
    bytes: u64,
    repetitions: usize,
) -> Result<StreamRate, LoadError> {
    let fake = FakeAdapter::new(FakeConfig {
        ledger: Some(ledger.to_owned()),
        capabilities: vec!["exec".to_owned(), "exec.stream".to_owned()],
        ..FakeConfig::default()
    });
    let at = InstanceRef {
        sandbox_id: sandbox_id.clone(),
        backend_ref: backend_ref.to_owned(),
    };
    fake_stream_once(&fake, &at, STREAM_WARMUP_BYTES).await?;
    let mut walls = Vec::with_capacity(repetitions);
    for _ in 0..repetitions {
        let t = Instant::now();
        fake_stream_once(&fake, &at, bytes).await?;
        walls.push(t.elapsed());
    }
    Ok(StreamRate::new(bytes, &walls))
}

/// The bare HTTP cost of moving `bytes` in one response with the same client: a trivial
/// local axum handler answers `POST /stream {"bytes": N}` with N bytes of `y\n` prepared
/// before the clock starts, the client reads and counts them, `repetitions` times. Whatever
/// the API path loses beyond this is its own work (SSE framing, JSON, the adapter hand-off),
/// not HTTP's.
pub async fn trivial_http_stream(
    http: &reqwest::Client,
    bytes: u64,
    repetitions: usize,
) -> Result<StreamRate, LoadError> {
    use axum::routing::post;
    let size = usize::try_from(bytes.max(STREAM_WARMUP_BYTES))
        .map_err(|_| LoadError::Plan(format!("--stream-bytes {bytes} does not fit in memory")))?;
    let payload = bytes::Bytes::from(
        (0..size)
            .map(|i| if i % 2 == 0 { b'y' } else { b'\n' })
            .collect::<Vec<u8>>(),
    );
    let app = axum::Router::new().route(
        "/stream",
        post(
            move |axum::Json(body): axum::Json<serde_json::Value>| async move {
                let n = body["bytes"].as_u64().unwrap_or(0);
                let n = usize::try_from(n).unwrap_or(usize::MAX).min(payload.len());
                (
                    [("content-type", "application/octet-stream")],
                    payload.slice(..n),
                )
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| LoadError::io("binding the trivial stream handler", e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| LoadError::io("trivial stream handler address", e))?;
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let url = format!("http://{addr}/stream");
    let once = |n: u64| {
        let url = url.clone();
        async move {
            let mut r = http
                .post(&url)
                .bearer_auth("dly_key_trivial")
                .json(&serde_json::json!({ "bytes": n }))
                .send()
                .await
                .map_err(|e| LoadError::http("trivial stream handler", e))?;
            let mut got = 0u64;
            while let Some(c) = r
                .chunk()
                .await
                .map_err(|e| LoadError::http("trivial stream handler body", e))?
            {
                got += c.len() as u64;
            }
            if got == n {
                Ok(())
            } else {
                Err(LoadError::Check(format!(
                    "trivial stream handler: asked for {n} bytes, {got} arrived"
                )))
            }
        }
    };
    let result = async {
        once(STREAM_WARMUP_BYTES).await?;
        let mut walls = Vec::with_capacity(repetitions);
        for _ in 0..repetitions {
            let t = Instant::now();
            once(bytes).await?;
            walls.push(t.elapsed());
        }
        Ok(StreamRate::new(bytes, &walls))
    }
    .await;
    server.abort();
    result
}
