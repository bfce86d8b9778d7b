//! The server side of the `/adapter/v1` plugin protocol, generic over any [`SharedAdapter`]:
//! `differently plugin serve` runs it over the `fake` adapter as the reference plugin, and
//! any other adapter can be served the same way (a backend in this repository reached from
//! a control plane that does not link it).
//!
//! Every route is authenticated with the bearer token; errors are `{code, message,
//! retryable, field?}`; a call needing a capability the adapter does not declare answers
//! `unsupported_operation` here, before the adapter, so what `/info` says is what is served.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use bytes::Bytes;
use differently_core::exec::ExecRequest;
use differently_core::ids::InstallationId;
use differently_core::SandboxId;
use futures::StreamExt;
use tokio::sync::mpsc;

use crate::http::Secret;
use crate::remote::wire::{
    self, At, ErrorBody, ErrorCode, ExecFrame, ExposeBody, FileList, FileQuery, Info, InstanceList,
    ListQuery, MadeDir, RenewBody,
};
use crate::{AdapterError, ByteRange, CreateInstance, ExecEvent, InstanceRef, SharedAdapter};

/// Largest JSON body accepted (an exec's stdin travels in it).
const MAX_JSON_BODY: usize = 64 * 1024 * 1024;
/// Streamed exec output waiting to be written to a slow client, in chunks.
const STREAM_BUFFER: usize = 16;

/// One adapter served over the protocol.
pub struct PluginServer {
    adapter: SharedAdapter,
    name: String,
    token: Secret,
    gate: bool,
}

struct Shared {
    adapter: SharedAdapter,
    name: String,
    token: Secret,
    gate: bool,
}

type St = State<Arc<Shared>>;

impl PluginServer {
    /// Serves `adapter` as plugin `name`, accepting requests that carry `token`.
    pub fn new(adapter: SharedAdapter, name: impl Into<String>, token: Secret) -> Self {
        PluginServer {
            adapter,
            name: name.into(),
            token,
            gate: true,
        }
    }

    /// Passes calls for undeclared capabilities to the adapter instead of refusing them
    /// here: only for tests that need a plugin whose declarations are wrong.
    pub fn trust_adapter_refusals(mut self) -> Self {
        self.gate = false;
        self
    }

    /// The axum router of every route (see `docs/plugin-protocol.json`).
    pub fn router(self) -> Router {
        let shared = Arc::new(Shared {
            adapter: self.adapter,
            name: self.name,
            token: self.token,
            gate: self.gate,
        });
        // One `.route` per path, on one line each: the protocol document's test reads them.
        Router::new()
            .route("/adapter/v1/info", get(info))
            .route("/adapter/v1/health", get(health))
            .route("/adapter/v1/instances", get(list))
            .route(
                "/adapter/v1/instances/{sandbox_id}",
                put(create).get(find).delete(delete),
            )
            .route("/adapter/v1/instances/{sandbox_id}/exec", post(exec))
            .route(
                "/adapter/v1/instances/{sandbox_id}/exec/stream",
                post(exec_stream),
            )
            .route(
                "/adapter/v1/instances/{sandbox_id}/files",
                put(upload).get(download).delete(delete_file),
            )
            .route(
                "/adapter/v1/instances/{sandbox_id}/files/list",
                get(list_files),
            )
            .route(
                "/adapter/v1/instances/{sandbox_id}/files/directories",
                post(make_dir),
            )
            .route("/adapter/v1/instances/{sandbox_id}/pause", post(pause))
            .route("/adapter/v1/instances/{sandbox_id}/resume", post(resume))
            .route("/adapter/v1/instances/{sandbox_id}/stop", post(stop))
            .route("/adapter/v1/instances/{sandbox_id}/start", post(start))
            .route(
                "/adapter/v1/instances/{sandbox_id}/snapshots/{snapshot_id}",
                put(snapshot),
            )
            .route(
                "/adapter/v1/snapshots/{backend_ref}",
                axum::routing::delete(delete_snapshot),
            )
            .route(
                "/adapter/v1/instances/{sandbox_id}/ports/{port}",
                post(expose_port),
            )
            .route("/adapter/v1/instances/{sandbox_id}/renew", post(renew))
            .route("/adapter/v1/instances/{sandbox_id}/claim", post(claim))
            .fallback(no_route)
            .layer(axum::middleware::from_fn_with_state(
                shared.clone(),
                authenticate,
            ))
            .layer(DefaultBodyLimit::max(MAX_JSON_BODY))
            .with_state(shared)
    }
}

/// What the plugin declares: the adapter's capabilities the protocol can carry.
pub fn served_capabilities(adapter: &SharedAdapter) -> Vec<String> {
    adapter
        .capabilities()
        .into_iter()
        .filter(|c| wire::PROTOCOL_CAPABILITIES.contains(&c.name()))
        .map(|c| c.name().to_owned())
        .collect()
}

/// An error answer.
struct Failure(ErrorBody);

impl From<AdapterError> for Failure {
    fn from(e: AdapterError) -> Self {
        Failure(ErrorBody::from_error(&e))
    }
}

impl Failure {
    fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Failure(ErrorBody::new(code, message))
    }

    fn invalid(field: &str, message: impl Into<String>) -> Self {
        let mut b = ErrorBody::new(ErrorCode::Permanent, message);
        b.field = Some(field.to_owned());
        Failure(b)
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.0.code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(self.0)).into_response()
    }
}

type Answer<T> = Result<T, Failure>;

/// Constant-time comparison of the presented token with ours.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn authenticate(State(s): St, req: Request, next: Next) -> Response {
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match presented {
        Some(t) if same(t.as_bytes(), s.token.expose().as_bytes()) => {}
        Some(_) => {
            return Failure::new(
                ErrorCode::Unauthenticated,
                "the bearer token is not this plugin's",
            )
            .into_response()
        }
        None => {
            return Failure::new(ErrorCode::Unauthenticated, "a bearer token is required")
                .into_response()
        }
    }
    if let Some(v) = req.headers().get(wire::VERSION_HEADER) {
        let spoken = v.to_str().ok().and_then(|v| v.trim().parse::<u32>().ok());
        if spoken != Some(wire::PROTOCOL_VERSION) {
            return Failure::new(
                ErrorCode::UnsupportedVersion,
                format!(
                    "this plugin speaks protocol version {}",
                    wire::PROTOCOL_VERSION
                ),
            )
            .into_response();
        }
    }
    next.run(req).await
}

async fn no_route(req: Request) -> Failure {
    Failure::new(
        ErrorCode::UnsupportedOperation,
        format!("no such route: {} {}", req.method(), req.uri().path()),
    )
}

fn sandbox(p: Result<Path<String>, PathRejection>) -> Answer<SandboxId> {
    let Path(id) = p.map_err(|e| Failure::invalid("sandboxId", e.body_text()))?;
    SandboxId::parse(&id).map_err(|e| Failure::invalid("sandboxId", e.to_string()))
}

fn query<T>(q: Result<Query<T>, QueryRejection>) -> Answer<T> {
    q.map(|Query(t)| t)
        .map_err(|e| Failure::new(ErrorCode::Permanent, e.body_text()))
}

fn body<T>(j: Result<Json<T>, JsonRejection>) -> Answer<T> {
    j.map(|Json(t)| t)
        .map_err(|e| Failure::new(ErrorCode::Permanent, e.body_text()))
}

fn at(id: SandboxId, backend_ref: String) -> InstanceRef {
    InstanceRef {
        sandbox_id: id,
        backend_ref,
    }
}

/// Refuses what the adapter does not declare (unless told to trust its own refusals).
fn require(s: &Shared, capability: &str) -> Answer<()> {
    if !s.gate
        || served_capabilities(&s.adapter)
            .iter()
            .any(|c| c == capability)
    {
        Ok(())
    } else {
        Err(Failure::new(ErrorCode::UnsupportedOperation, capability))
    }
}

async fn info(State(s): St) -> Json<Info> {
    let timeout = s.adapter.snapshot_timeout();
    Json(Info {
        protocol: wire::PROTOCOL_NAME.to_owned(),
        versions: vec![wire::PROTOCOL_VERSION],
        name: s.name.clone(),
        capabilities: served_capabilities(&s.adapter),
        snapshot_timeout_seconds: (timeout != crate::DEFAULT_SNAPSHOT_TIMEOUT)
            .then_some(timeout.as_secs()),
    })
}

async fn health(State(s): St) -> Answer<StatusCode> {
    s.adapter.health().await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn list(
    State(s): St,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Answer<Json<InstanceList>> {
    let q = query(q)?;
    let installation = InstallationId::parse(&q.installation_id)
        .map_err(|e| Failure::invalid("installationId", e.to_string()))?;
    let instances = s.adapter.list(&installation).await?;
    Ok(Json(InstanceList { instances }))
}

async fn create(
    State(s): St,
    p: Result<Path<String>, PathRejection>,
    j: Result<Json<CreateInstance>, JsonRejection>,
) -> Answer<Json<crate::Instance>> {
    let id = sandbox(p)?;
    let req = body(j)?;
    if req.sandbox_id != id {
        return Err(Failure::invalid(
            "sandboxId",
            "the body's sandboxId is not the path's",
        ));
    }
    if req.from_snapshot.is_some() {
        require(&s, "snapshots")?;
    }
    Ok(Json(s.adapter.create(&req).await?))
}

async fn find(
    State(s): St,
    p: Result<Path<String>, PathRejection>,
) -> Answer<Json<crate::Instance>> {
    let id = sandbox(p)?;
    match s.adapter.find(&id).await? {
        Some(i) => Ok(Json(i)),
        None => Err(AdapterError::NotFound.into()),
    }
}

async fn delete(State(s): St, p: Result<Path<String>, PathRejection>) -> Answer<StatusCode> {
    let id = sandbox(p)?;
    s.adapter.delete(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn exec(
    State(s): St,
    p: Result<Path<String>, PathRejection>,
    q: Result<Query<At>, QueryRejection>,
    j: Result<Json<ExecRequest>, JsonRejection>,
) -> Answer<Json<differently_core::exec::ExecResult>> {
    let id = sandbox(p)?;
    let q = query(q)?;
    let req = body(j)?;
    require(&s, "exec")?;
    let req = checked(req)?;
    Ok(Json(s.adapter.exec(&at(id, q.backend_ref), &req).await?))
}

/// The exec request as the API would have validated it: plugins get the same guarantees.
fn checked(req: ExecRequest) -> Answer<ExecRequest> {
    req.validate()
        .map_err(|e| Failure::invalid(&e.field, e.message))?;
    Ok(req)
}

async fn exec_stream(
    State(s): St,
    p: Result<Path<String>, PathRejection>,
    q: Result<Query<At>, QueryRejection>,
    j: Result<Json<ExecRequest>, JsonRejection>,
) -> Answer<Response> {
    let id = sandbox(p)?;
    let q = query(q)?;
    let req = checked(body(j)?)?;
    require(&s, "exec.stream")?;
    let (tx, mut rx) = mpsc::channel::<ExecEvent>(STREAM_BUFFER);
    let adapter = s.adapter.clone();
    let target = at(id, q.backend_ref);
    let mut run = tokio::spawn(async move { adapter.exec_stream(&target, &req, tx).await });
    // Until the first output, a failure is still an ordinary error answer.
    let first = tokio::select! {
        ev = rx.recv() => ev,
        done = &mut run => {
            let exit = done.map_err(|e| AdapterError::transient(format!("exec task: {e}")))??;
            // Whatever was sent before the end is still in the channel.
            let mut lines = Vec::new();
            while let Ok(ev) = rx.try_recv() {
                lines.extend(frame_of(&ev).line());
            }
            lines.extend(ExecFrame::Exit { exit_code: exit.exit_code, duration_ms: exit.duration_ms }.line());
            return Ok(ndjson(Body::from(lines)));
        }
    };
    let head = first.map(|ev| frame_of(&ev).line());
    // Frames, then the end: `exit` or `error`. Dropping the body (the client hung up) drops
    // `rx`, which the adapter sees as a closed channel and cancels the command.
    let events = futures::stream::unfold(Some((rx, run)), |state| async move {
        let (mut rx, run) = state?;
        match rx.recv().await {
            Some(ev) => Some((frame_of(&ev).line(), Some((rx, run)))),
            None => {
                let end = match run.await {
                    Ok(Ok(exit)) => ExecFrame::Exit {
                        exit_code: exit.exit_code,
                        duration_ms: exit.duration_ms,
                    },
                    Ok(Err(e)) => ExecFrame::Error {
                        error: ErrorBody::from_error(&e),
                    },
                    Err(e) => ExecFrame::Error {
                        error: ErrorBody::new(ErrorCode::Transient, format!("exec task: {e}")),
                    },
                };
                Some((end.line(), None))
            }
        }
    });
    let stream = futures::stream::iter(head)
        .chain(events)
        .map(|line| Ok::<_, std::convert::Infallible>(Bytes::from(line)));
    Ok(ndjson(Body::from_stream(stream)))
}

fn frame_of(ev: &ExecEvent) -> ExecFrame {
    match ev {
        ExecEvent::Stdout(b) => ExecFrame::output(false, b),
        ExecEvent::Stderr(b) => ExecFrame::output(true, b),
    }
}

fn ndjson(body: Body) -> Response {
    let mut r = Response::new(body);
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(wire::NDJSON));
    r
}

async fn upload(
    State(s): St,
    p: Result<Path<String>, PathRejection>,
    q: Result<Query<FileQuery>, QueryRejection>,
    b: Body,
) -> Answer<StatusCode> {
    let id = sandbox(p)?;
    let q = query(q)?;
    require(&s, "files")?;
    let stream = b
        .into_data_stream()
        .map(|r| r.map_err(|e| AdapterError::transient(format!("upload body: {e}"))))
        .boxed();
    s.adapter
        .upload(&at(id, q.backend_ref), &q.path, q.mode, stream)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `Range: bytes=a-b` or `bytes=a-` (one range; anything else is refused).
fn range_of(headers: &HeaderMap) -> Answer<Option<ByteRange>> {
    let Some(v) = headers.get(header::RANGE) else {
        return Ok(None);
    };
    let bad = || Failure::invalid("range", "one range, `bytes=START-` or `bytes=START-END`");
    let spec = v
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("bytes="))
        .ok_or_else(bad)?;
    let (start, end) = spec.split_once('-').ok_or_else(bad)?;
    let start: u64 = start.trim().parse().map_err(|_| bad())?;
    let end = match end.trim() {
        "" => None,
        e => Some(e.parse::<u64>().map_err(|_| bad())?),
    };
    if end.is_some_and(|e| e < start) {
        return Err(bad());
    }
    Ok(Some(ByteRange { start, end }))
}

async fn download(
    State(s): St,
    p: Result<Path<String>, PathRejection>,
    q: Result<Query<FileQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Answer<Response> {
    let id = sandbox(p)?;
    let q = query(q)?;
    require(&s, "files")?;
    let range = range_of(&headers)?;
    let d = s
        .adapter
        .download(&at(id, q.backend_ref), &q.path, range)
        .await?;
    // A body that fails part-way aborts the answer, so the client sees it cut, never short.
    let body = Body::from_stream(d.body.map(|r| r.map_err(std::io::Error::other)));
    let mut r = Response::new(body);
    if range.is_some() {
        *r.status_mut() = StatusCode::PARTIAL_CONTENT;
    }
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    if let Some(n) = d.total_size {
        r.headers_mut()
            .insert(wire::TOTAL_SIZE_HEADER, HeaderValue::from(n));
    }
    Ok(r)
}

async fn list_files(
    State(s): St,
    p: Result<Path<String>, PathRejection>,
    q: Result<Query<FileQuery>, QueryRejection>,
) -> Answer<Json<FileList>> {
    let id = sandbox(p)?;
    let q = query(q)?;
    require(&s, "files")?;
    let entries = s
        .adapter
        .list_files(&at(id, q.backend_ref), &q.path, q.depth.unwrap_or(1))
        .await?;
    Ok(Json(FileList { entries }))
}

async fn delete_file(
    State(s): St,
    p: Result<Path<String>, PathRejection>,
    q: Result<Query<FileQuery>, QueryRejection>,
) -> Answer<StatusCode> {
    let id = sandbox(p)?;
    let q = query(q)?;
    require(&s, "files")?;
    s.adapter
        .delete_file(&at(id, q.backend_ref), &q.path)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn make_dir(
    State(s): St,
    p: Result<Path<String>, PathRejection>,
    q: Result<Query<FileQuery>, QueryRejection>,
) -> Answer<Json<MadeDir>> {
    let id = sandbox(p)?;
    let q = query(q)?;
    require(&s, "files")?;
    let created = s
        .adapter
        .make_dir(&at(id, q.backend_ref), &q.path, q.mode)
        .await?;
    Ok(Json(MadeDir { created }))
}

/// The four lifecycle verbs.
#[derive(Clone, Copy)]
enum Verb {
    Pause,
    Resume,
    Stop,
    Start,
}

async fn lifecycle(
    s: &Shared,
    p: Result<Path<String>, PathRejection>,
    q: Result<Query<At>, QueryRejection>,
    verb: Verb,
) -> Answer<StatusCode> {
    let id = sandbox(p)?;
    let q = query(q)?;
    let target = at(id, q.backend_ref);
    match verb {
        Verb::Pause | Verb::Resume => require(s, "lifecycle.pause")?,
        Verb::Stop | Verb::Start => require(s, "lifecycle.stop")?,
    }
    match verb {
        Verb::Pause => s.adapter.pause(&target).await?,
        Verb::Resume => s.adapter.resume(&target).await?,
        Verb::Stop => s.adapter.stop(&target).await?,
        Verb::Start => s.adapter.start(&target).await?,
    }
    Ok(StatusCode::NO_CONTENT)
}

async fn pause(
    State(s): St,
    p: Result<Path<String>, PathRejection>,
    q: Result<Query<At>, QueryRejection>,
) -> Answer<StatusCode> {
    lifecycle(&s, p, q, Verb::Pause).await
}

async fn resume(
    State(s): St,
    p: Result<Path<String>, PathRejection>,
    q: Result<Query<At>, QueryRejection>,
) -> Answer<StatusCode> {
    lifecycle(&s, p, q, Verb::Resume).await
}

async fn stop(
    State(s): St,
    p: Result<Path<String>, PathRejection>,
    q: Result<Query<At>, QueryRejection>,
) -> Answer<StatusCode> {
    lifecycle(&s, p, q, Verb::Stop).await
}

async fn start(
    State(s): St,
    p: Result<Path<String>, PathRejection>,
    q: Result<Query<At>, QueryRejection>,
) -> Answer<StatusCode> {
    lifecycle(&s, p, q, Verb::Start).await
}

async fn snapshot(
    State(s): St,
    p: Result<Path<(String, String)>, PathRejection>,
    q: Result<Query<At>, QueryRejection>,
) -> Answer<Json<crate::SnapshotInfo>> {
    let Path((id, snapshot_id)) = p.map_err(|e| Failure::invalid("sandboxId", e.body_text()))?;
    let id = SandboxId::parse(&id).map_err(|e| Failure::invalid("sandboxId", e.to_string()))?;
    let q = query(q)?;
    require(&s, "snapshots")?;
    Ok(Json(
        s.adapter
            .snapshot(&at(id, q.backend_ref), &snapshot_id)
            .await?,
    ))
}

async fn delete_snapshot(
    State(s): St,
    p: Result<Path<String>, PathRejection>,
) -> Answer<StatusCode> {
    let Path(backend_ref) = p.map_err(|e| Failure::invalid("backendRef", e.body_text()))?;
    require(&s, "snapshots")?;
    s.adapter.delete_snapshot(&backend_ref).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn expose_port(
    State(s): St,
    p: Result<Path<(String, String)>, PathRejection>,
    q: Result<Query<At>, QueryRejection>,
    j: Result<Json<ExposeBody>, JsonRejection>,
) -> Answer<Json<crate::Endpoint>> {
    let Path((id, port)) = p.map_err(|e| Failure::invalid("sandboxId", e.body_text()))?;
    let id = SandboxId::parse(&id).map_err(|e| Failure::invalid("sandboxId", e.to_string()))?;
    let port: u16 = match port.parse() {
        Ok(p) if p > 0 => p,
        _ => return Err(Failure::invalid("port", "a port number, 1-65535")),
    };
    let q = query(q)?;
    let b = body(j)?;
    require(&s, "ports.expose")?;
    let expires = b.expires_seconds.map(std::time::Duration::from_secs);
    Ok(Json(
        s.adapter
            .expose_port(&at(id, q.backend_ref), port, expires)
            .await?,
    ))
}

/// `POST …/claim` (`{ttlSeconds}`): readies a warm instance for its claimer (`warm`).
async fn claim(
    State(s): St,
    p: Result<Path<String>, PathRejection>,
    q: Result<Query<At>, QueryRejection>,
    j: Result<Json<RenewBody>, JsonRejection>,
) -> Answer<StatusCode> {
    let id = sandbox(p)?;
    let q = query(q)?;
    let b = body(j)?;
    s.adapter
        .claim(&at(id, q.backend_ref), b.ttl_seconds)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn renew(
    State(s): St,
    p: Result<Path<String>, PathRejection>,
    q: Result<Query<At>, QueryRejection>,
    j: Result<Json<RenewBody>, JsonRejection>,
) -> Answer<StatusCode> {
    let id = sandbox(p)?;
    let q = query(q)?;
    let b = body(j)?;
    s.adapter
        .renew(
            &at(id, q.backend_ref),
            std::time::Duration::from_secs(b.ttl_seconds),
        )
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
