"""The shared core of both clients, without any I/O.

Each API operation is written once here as a generator: it yields a :class:`Call` (an HTTP
request to make) or a :class:`Sleep`, receives the :class:`Reply`, and returns the decoded
result. The async client drives these generators with ``httpx.AsyncClient`` and the sync
client (generated from the async one, ``tools/unasync.py``) with ``httpx.Client``, so request
building, decoding, waiting loops, error mapping and the retry policy cannot drift apart.
"""

from __future__ import annotations

import base64
import email.utils
import json
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import (
    Any,
    Callable,
    Dict,
    Generator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Type,
    TypeVar,
    Union,
)
from urllib.parse import quote

import httpx

from ._codec import UNSET, Unset, decode, encode, query
from .errors import (
    APIError,
    NetworkError,
    NetworkTimeoutError,
    NotFoundError,
    ProtocolError,
    SandboxEndedError,
    WaitTimeoutError,
    error_class,
)
from .models import (
    FINAL_STATUSES,
    PUBLIC_EVENT_VERSION,
    CreateWebhookRequest,
    EventCredentials,
    EventCredentialsRequest,
    EventSchemaList,
    MetricsSummary,
    PublicEvent,
    QueueReport,
    UpdateWebhookRequest,
    Webhook,
    WebhookDelivery,
    WebhookWithSecret,
    AuditSegment,
    AuditSegmentRequest,
    Checkpoint,
    Secret,
    SecretRequest,
    AuditEvent,
    CreatedKey,
    CreateKeyRequest,
    CreateOrgRequest,
    CreateProjectRequest,
    CreateSandboxRequest,
    DryRun,
    ExecRequest,
    ExecResult,
    ExposedPort,
    FileInfo,
    Health,
    Key,
    MadeDir,
    MakeDirectoryRequest,
    Org,
    Page,
    PendingOperation,
    Placement,
    Process,
    StartProcessRequest,
    Policy,
    Pool,
    PoolRecord,
    PoolRequest,
    PortRequest,
    Project,
    WarmClass,
    WarmClasses,
    Quota,
    QuotaView,
    Sandbox,
    Snapshot,
    SnapshotRequest,
    StatusEvent,
    TrustReport,
    UpdateOrgRequest,
    UpdateProjectRequest,
    UpdateSandboxRequest,
    Verification,
)

T = TypeVar("T")

DEFAULT_URL = "http://127.0.0.1:7070"
#: The server's exec time limit when a request names none (core/src/exec.rs).
DEFAULT_EXEC_TIMEOUT = 60


@dataclass
class Call:
    """One HTTP request an operation wants made."""

    method: str
    path: str
    params: List[Tuple[str, str]] = field(default_factory=list)
    json: Any = UNSET
    content: Any = None
    headers: Dict[str, str] = field(default_factory=dict)
    #: Safe to send again after a failure that may have reached the server: an idempotent
    #: method, a POST carrying an Idempotency-Key, or a POST the API documents as idempotent.
    retry: bool = False
    #: Seconds to wait for an answer, when the operation knows better than the default
    #: (a long-poll wait, a stream with 15 s heartbeats).
    read_timeout: Optional[float] = None


@dataclass
class Sleep:
    """An operation's pause between polls."""

    seconds: float


@dataclass
class Reply:
    """An answer with status < 400 (errors are raised before an operation sees them)."""

    status: int
    headers: Mapping[str, str]
    content: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.content)
        except ValueError as e:
            raise ProtocolError(f"the answer ({self.status}) is not JSON") from e


Op = Generator[Union[Call, Sleep], Reply, T]


def seg(value: str) -> str:
    """A path segment, percent-encoded (an id can never reach another route)."""
    return quote(str(value), safe="")


def ref(value: Any) -> str:
    """An id from an id string or any model that has an ``id``."""
    if isinstance(value, str):
        return value
    ident = getattr(value, "id", None)
    if not isinstance(ident, str):
        raise TypeError(f"expected an id or a model with an id, got {type(value).__name__}")
    return ident


def new_idempotency_key() -> str:
    """A fresh key for one logical create, reused by every retry of it."""
    return f"dly-py-{uuid.uuid4()}"


# --- errors ----------------------------------------------------------------------------------


def retry_after_seconds(headers: Mapping[str, str]) -> Optional[float]:
    """``Retry-After`` as seconds (a number or an HTTP date), if present and sane."""
    raw = headers.get("retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def api_error(call: Call, status: int, headers: Mapping[str, str], body: bytes) -> APIError:
    """The exception for an error answer, from its envelope (or its status when it has none)."""
    code, message, details, request_id = f"http_{status}", "", None, None
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    env = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(env, dict):
        code = str(env.get("code") or code)
        message = str(env.get("message") or "")
        details = env.get("details") if isinstance(env.get("details"), dict) else None
        rid = env.get("requestId")
        request_id = rid if isinstance(rid, str) else None
    else:
        message = body[:300].decode("utf-8", "replace").strip() or f"HTTP {status}"
    if request_id is None:
        request_id = headers.get("x-request-id")
    cls = error_class(status, code)
    return cls(
        status,
        code,
        message,
        details=details,
        request_id=request_id,
        retry_after=retry_after_seconds(headers),
        method=call.method,
        path=call.path,
    )


def network_error(base_url: str, call: Call, exc: BaseException) -> NetworkError:
    """A transport failure as a message that says where and what to do (never the key)."""
    where = f"{call.method} {base_url}{call.path}"
    if isinstance(exc, httpx.ConnectTimeout):
        return NetworkTimeoutError(
            f"connecting to {base_url} timed out ({where}) — is the Differently API "
            f"reachable there? Set DIFFERENTLY_URL (or base_url=) to its address."
        )
    if isinstance(exc, httpx.TimeoutException):
        return NetworkTimeoutError(
            f"no answer from {base_url} in time ({where}); the server may be overloaded — "
            f"retry, or raise the client's timeout"
        )
    if isinstance(exc, httpx.ConnectError):
        reason = _reason(exc)
        return NetworkError(
            f"{reason} at {base_url} — is `differently dev` (or the API server) running "
            f"there? Set DIFFERENTLY_URL (or base_url=) to its address. ({where})"
        )
    return NetworkError(f"the connection to {base_url} failed: {_reason(exc)} ({where})")


def _reason(exc: BaseException) -> str:
    text = str(exc)
    low = text.lower()
    if "refused" in low:
        return "connection refused"
    if "name or service not known" in low or "nodename nor servname" in low:
        return "unknown host"
    return text or type(exc).__name__


# --- retries ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """When to send a request again. Only safe calls (:attr:`Call.retry`) are retried after a
    failure that may have reached the server; a refused connection (nothing was sent) is
    retried for every call. ``Retry-After`` is honoured up to ``max_retry_after`` seconds."""

    max_retries: int = 3
    backoff: float = 0.25
    max_backoff: float = 4.0
    max_retry_after: float = 30.0

    def _backoff(self, attempt: int) -> float:
        return float(min(self.max_backoff, self.backoff * 2.0**attempt))

    def after_network_error(self, call: Call, attempt: int, exc: BaseException) -> Optional[float]:
        if attempt >= self.max_retries or not _replayable(call):
            return None
        if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
            return self._backoff(attempt)
        if call.retry and isinstance(exc, httpx.TransportError):
            return self._backoff(attempt)
        return None

    def after_error(self, call: Call, attempt: int, err: APIError) -> Optional[float]:
        if attempt >= self.max_retries or not call.retry or not _replayable(call):
            return None
        transient = (
            (err.status == 429 and err.code == "rate_limited")
            or err.status in (408, 502, 504)
            or (err.status == 503 and err.code != "insufficient_capacity")
        )
        if not transient:
            return None
        if err.retry_after is not None:
            return err.retry_after if err.retry_after <= self.max_retry_after else None
        return self._backoff(attempt)


def _replayable(call: Call) -> bool:
    return call.content is None or isinstance(call.content, (bytes, str))


# --- sandboxes -------------------------------------------------------------------------------


def _page(cls: Type[T], body: Any) -> Page[T]:
    if not isinstance(body, dict) or not isinstance(body.get("items"), list):
        raise ProtocolError("a list answer without items")
    items = [decode(cls, x, f"{cls.__name__}[{i}]") for i, x in enumerate(body["items"])]
    nxt = body.get("nextCursor")
    return Page(items, nxt if isinstance(nxt, str) and nxt else None)


def _one(cls: Type[T]) -> Callable[[Reply], T]:
    return lambda r: decode(cls, r.json())


def simple(call: Call, parse: Callable[[Reply], T]) -> Op[T]:
    reply = yield call
    return parse(reply)


def nothing(call: Call) -> Op[None]:
    yield call
    return None


def create_sandbox(req: CreateSandboxRequest, idempotency_key: Optional[str]) -> Op[Sandbox]:
    key = idempotency_key or new_idempotency_key()
    call = Call(
        "POST", "/v1/sandboxes", json=encode(req), headers={"Idempotency-Key": key}, retry=True
    )
    return simple(call, _one(Sandbox))


def get_sandbox(sandbox_id: str) -> Op[Sandbox]:
    return simple(Call("GET", f"/v1/sandboxes/{seg(sandbox_id)}", retry=True), _one(Sandbox))


def list_sandboxes(
    status: Optional[str],
    label: Optional[List[str]],
    project_id: Optional[str],
    limit: Optional[int],
    cursor: Optional[str],
) -> Op[Page[Sandbox]]:
    params = query(
        {"status": status, "label": label, "projectId": project_id, "limit": limit, "cursor": cursor}
    )
    call = Call("GET", "/v1/sandboxes", params=params, retry=True)
    return simple(call, lambda r: _page(Sandbox, r.json()))


def label_filter(
    labels: Union[None, str, Mapping[str, str], Sequence[str]],
) -> Optional[List[str]]:
    """``key=value`` strings, one ``?label=`` each (a sandbox must carry every one); from a
    mapping, one ``key=value`` string, or a sequence of them."""
    if labels is None:
        return None
    if isinstance(labels, str):
        items = [labels]
    elif isinstance(labels, Mapping):
        items = [f"{k}={v}" for k, v in labels.items()]
    else:
        items = list(labels)
    for item in items:
        if not isinstance(item, str) or "=" not in item:
            raise ValueError(f"label filter {item!r} is not 'key=value'")
    return items or None


def wait_sandbox(sandbox_id: str, status: str, timeout: float) -> Op[Sandbox]:
    """Long-polls ``GET …/wait`` (each poll at most 300 s, the API's bound) until the sandbox
    has ``status``; raises when it ends otherwise or the time runs out."""
    deadline = time.monotonic() + max(0.0, timeout)
    while True:
        remaining = deadline - time.monotonic()
        poll = int(min(300, max(0, math.ceil(remaining))))
        call = Call(
            "GET",
            f"/v1/sandboxes/{seg(sandbox_id)}/wait",
            params=query({"status": status, "timeoutSeconds": poll}),
            retry=True,
            read_timeout=poll + 15.0,
        )
        reply = yield call
        sbx = decode(Sandbox, reply.json())
        if sbx.status == status:
            return sbx
        if sbx.status in FINAL_STATUSES:
            raise SandboxEndedError(
                f"sandbox {sbx.id} is {sbx.status} ({sbx.status_reason or 'no reason given'}), "
                f"it will never be {status}",
                sbx,
            )
        if time.monotonic() >= deadline:
            raise WaitTimeoutError(
                f"sandbox {sbx.id} is still {sbx.status} after {timeout:g}s (waited for {status})",
                sbx,
            )


def update_sandbox(sandbox_id: str, req: UpdateSandboxRequest) -> Op[Sandbox]:
    call = Call("PATCH", f"/v1/sandboxes/{seg(sandbox_id)}", json=encode(req), retry=True)
    return simple(call, _one(Sandbox))


def delete_sandbox(sandbox_id: str) -> Op[Sandbox]:
    return simple(Call("DELETE", f"/v1/sandboxes/{seg(sandbox_id)}", retry=True), _one(Sandbox))


def lifecycle(sandbox_id: str, action: str) -> Op[Sandbox]:
    # The API answers 200 "when done (also when already there)": sending it again is safe.
    call = Call("POST", f"/v1/sandboxes/{seg(sandbox_id)}/{action}", retry=True)
    return simple(call, _one(Sandbox))


def keepalive(sandbox_id: str) -> Op[None]:
    return nothing(Call("POST", f"/v1/sandboxes/{seg(sandbox_id)}/keepalive", retry=True))


def placement(sandbox_id: str) -> Op[Placement]:
    call = Call("GET", f"/v1/sandboxes/{seg(sandbox_id)}/placement", retry=True)
    return simple(call, _one(Placement))


def dry_run(req: CreateSandboxRequest) -> Op[DryRun]:
    # Dry-run changes nothing: safe to send again.
    call = Call("POST", "/v1/placement/dry-run", json=encode(req), retry=True)
    return simple(call, _one(DryRun))


def stdin_fields(stdin: Union[None, str, bytes]) -> Dict[str, Any]:
    """Text goes as ``stdin``; bytes as ``stdinBase64`` (exact, any byte)."""
    if stdin is None:
        return {}
    if isinstance(stdin, bytes):
        return {"stdin_base64": base64.b64encode(stdin).decode("ascii")}
    return {"stdin": stdin}


def exec_call(sandbox_id: str, req: ExecRequest, stream: Optional[str] = None) -> Call:
    """The exec request; ``stream`` is None (buffered), ``"frames"`` or ``"sse"``."""
    if stream is None:
        path = f"/v1/sandboxes/{seg(sandbox_id)}/exec"
        limit = req.timeout_seconds if isinstance(req.timeout_seconds, int) else DEFAULT_EXEC_TIMEOUT
        # The answer comes when the command ends: wait for its own limit, and some.
        return Call("POST", path, json=encode(req), read_timeout=float(limit) + 30.0)
    headers = {"Accept": "application/vnd.differently.exec-stream" if stream == "frames" else "text/event-stream"}
    # Heartbeats come every 15 s: a silent minute means the connection is gone.
    return Call(
        "POST",
        f"/v1/sandboxes/{seg(sandbox_id)}/exec/stream",
        json=encode(req),
        headers=headers,
        read_timeout=60.0,
    )


#: Signals a terminal's foreground process group can be sent (docs/api.md, Terminal).
PTY_SIGNALS = ("INT", "TERM", "KILL", "HUP")


def pty_call(
    sandbox_id: str,
    command: Optional[Sequence[str]],
    cols: Optional[int],
    rows: Optional[int],
    env: Optional[Mapping[str, str]],
    cwd: Optional[str],
    session: Optional[str],
) -> Call:
    """The WebSocket upgrade of ``GET …/pty``: everything travels in the query (the server
    checks it before the upgrade and answers bad input with the usual error envelope)."""
    if session is not None and any(v is not None for v in (command, cols, rows, env, cwd)):
        raise ValueError("session= reattaches alone: the session keeps its command, size, env and cwd")
    params = query(
        {
            "session": session,
            "cols": cols,
            "rows": rows,
            "command": list(command) if command is not None else None,
            "env": [f"{k}={v}" for k, v in env.items()] if env else None,
            "cwd": cwd,
        }
    )
    return Call("GET", f"/v1/sandboxes/{seg(sandbox_id)}/pty", params=params)


def pty_resize(cols: int, rows: int) -> str:
    """The text frame resizing the terminal (1-1000 each; the server closes on anything else)."""
    for name, v in (("cols", cols), ("rows", rows)):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1000:
            raise ValueError(f"{name} must be an integer from 1 to 1000, not {v!r}")
    return json.dumps({"type": "resize", "cols": cols, "rows": rows})


def pty_signal(name: str) -> str:
    """The text frame sending ``name`` (``INT``, ``TERM``, ``KILL``, ``HUP``; ``SIG`` prefix
    allowed) to the terminal's foreground process group."""
    sig = name.upper()
    if sig.startswith("SIG"):
        sig = sig[3:]
    if sig not in PTY_SIGNALS:
        raise ValueError(f"signal must be one of {', '.join(PTY_SIGNALS)}, not {name!r}")
    return json.dumps({"type": "signal", "signal": sig})


def ws_url(base_url: str, call: Call) -> str:
    """``ws://``/``wss://`` URL of a call against an ``http(s)://`` base URL."""
    if base_url.startswith("https://"):
        base = "wss://" + base_url[len("https://") :]
    elif base_url.startswith("http://"):
        base = "ws://" + base_url[len("http://") :]
    else:
        raise ValueError(f"the base URL {base_url!r} is not http:// or https://")
    qs = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in call.params)
    return base + call.path + (f"?{qs}" if qs else "")


def exec_buffered(sandbox_id: str, req: ExecRequest) -> Op[ExecResult]:
    return simple(exec_call(sandbox_id, req), _one(ExecResult))


def expose_port(sandbox_id: str, req: PortRequest) -> Op[Union[ExposedPort, PendingOperation]]:
    call = Call("POST", f"/v1/sandboxes/{seg(sandbox_id)}/ports", json=encode(req), retry=True)

    def parse(r: Reply) -> Union[ExposedPort, PendingOperation]:
        body = r.json()
        if r.status == 202:
            return decode(PendingOperation, body)
        return decode(ExposedPort, body)

    return simple(call, parse)


# --- files -----------------------------------------------------------------------------------


# --- processes (docs/processes.md) ----------------------------------------------------------

#: Signals a process can be sent (``POST …/processes/{pid}/signal``).
PROCESS_SIGNALS = ("INT", "TERM", "KILL", "HUP")
#: The most bytes one ``POST …/stdin`` takes; larger input is sent in calls of this size.
MAX_STDIN_PER_CALL = 1 << 20


def _process_path(sandbox_id: str, pid: Optional[int] = None, rest: str = "") -> str:
    base = f"/v1/sandboxes/{seg(sandbox_id)}/processes"
    if pid is None:
        return base
    if isinstance(pid, bool) or not isinstance(pid, int) or pid < 0:
        raise ValueError(f"pid must be a non-negative int, got {pid!r}")
    return f"{base}/{pid}{rest}"


def start_process(sandbox_id: str, req: StartProcessRequest) -> Op[Process]:
    if not req.command or not req.command[0]:
        raise ValueError("command must name a program")
    # Not retried: a second POST would start a second process.
    return simple(Call("POST", _process_path(sandbox_id), json=encode(req)), _one(Process))


def list_processes(sandbox_id: str, status: Optional[str]) -> Op[List[Process]]:
    call = Call("GET", _process_path(sandbox_id), params=query({"status": status}), retry=True)
    return simple(call, lambda r: _page(Process, r.json()).items)


def get_process(sandbox_id: str, pid: int) -> Op[Process]:
    return get(_process_path(sandbox_id, pid), Process)


def process_output_call(sandbox_id: str, pid: int, start: int, follow: bool, stream: str) -> Call:
    """``GET …/output``; ``stream`` is ``"frames"`` or ``"sse"``."""
    if start < 0:
        raise ValueError("offset must be >= 0")
    headers = {"Accept": "application/vnd.differently.exec-stream" if stream == "frames" else "text/event-stream"}
    params = [("from", str(start)), ("follow", "true" if follow else "false")]
    # Heartbeats come every 15 s while it follows: a silent minute means the connection is gone.
    return Call(
        "GET", _process_path(sandbox_id, pid, "/output"), params=params, headers=headers,
        retry=True, read_timeout=60.0,
    )


def stdin_parts(data: Union[str, bytes]) -> List[bytes]:
    """The bodies of the ``POST …/stdin`` calls that send ``data`` (text as UTF-8), in order."""
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    if not raw:
        return [b""]
    return [raw[i : i + MAX_STDIN_PER_CALL] for i in range(0, len(raw), MAX_STDIN_PER_CALL)]


def send_stdin(sandbox_id: str, pid: int, part: bytes) -> Op[None]:
    # Not retried: bytes that reached the program once must not reach it twice.
    call = Call(
        "POST", _process_path(sandbox_id, pid, "/stdin"), content=part,
        headers={"Content-Type": "application/octet-stream"},
    )
    return nothing(call)


def close_stdin(sandbox_id: str, pid: int) -> Op[None]:
    return nothing(Call("DELETE", _process_path(sandbox_id, pid, "/stdin"), retry=True))


def signal_process(sandbox_id: str, pid: int, signal: str) -> Op[None]:
    name = signal.upper()
    name = name[3:] if name.startswith("SIG") else name
    if name not in PROCESS_SIGNALS:
        raise ValueError(f"signal must be one of {', '.join(PROCESS_SIGNALS)}, got {signal!r}")
    # Not retried: a second INT is another keystroke, not the same one.
    call = Call("POST", _process_path(sandbox_id, pid, "/signal"), json={"signal": name})
    return nothing(call)


def resize_process(sandbox_id: str, pid: int, cols: int, rows: int) -> Op[None]:
    call = Call(
        "POST", _process_path(sandbox_id, pid, "/resize"), json={"cols": cols, "rows": rows},
        retry=True,
    )
    return nothing(call)


def kill_process(sandbox_id: str, pid: int) -> Op[None]:
    return nothing(Call("DELETE", _process_path(sandbox_id, pid), retry=True))


def _files_path(sandbox_id: str) -> str:
    return f"/v1/sandboxes/{seg(sandbox_id)}/files"


def upload(sandbox_id: str, path: str, content: Any, mode: Optional[int]) -> Op[None]:
    params = query({"path": path, "mode": None if mode is None else format(mode, "o")})
    call = Call(
        "PUT",
        _files_path(sandbox_id),
        params=params,
        content=content,
        headers={"Content-Type": "application/octet-stream"},
        retry=True,
    )
    return nothing(call)


def range_header(offset: int, length: Optional[int]) -> Dict[str, str]:
    if offset < 0 or (length is not None and length < 1):
        raise ValueError("offset must be >= 0 and length >= 1")
    if offset == 0 and length is None:
        return {}
    end = "" if length is None else str(offset + length - 1)
    return {"Range": f"bytes={offset}-{end}"}


def download_call(sandbox_id: str, path: str, offset: int, length: Optional[int]) -> Call:
    return Call(
        "GET",
        _files_path(sandbox_id),
        params=query({"path": path}),
        headers=range_header(offset, length),
        retry=True,
    )


def download(sandbox_id: str, path: str, offset: int, length: Optional[int]) -> Op[bytes]:
    return simple(download_call(sandbox_id, path, offset, length), lambda r: r.content)


def list_files(sandbox_id: str, path: str, depth: Optional[int]) -> Op[List[FileInfo]]:
    call = Call(
        "GET",
        f"{_files_path(sandbox_id)}/list",
        params=query({"path": path, "depth": depth}),
        retry=True,
    )
    return simple(call, lambda r: _page(FileInfo, {**r.json(), "nextCursor": None}).items)


def _norm(path: str) -> str:
    return "/" + "/".join(p for p in path.split("/") if p)


def stat(sandbox_id: str, path: str) -> Op[FileInfo]:
    """There is no stat route: a file lists as itself; a directory is found in its parent's
    listing. A missing path is the server's own 404."""
    want = _norm(path)
    if want == "/":
        raise ValueError("the API has no entry for / itself; list it instead")
    items = yield from list_files(sandbox_id, want, 1)
    if len(items) == 1 and _norm(items[0].path) == want and items[0].type != "dir":
        return items[0]
    parent = want.rsplit("/", 1)[0] or "/"
    for item in (yield from list_files(sandbox_id, parent, 1)):
        if _norm(item.path) == want:
            return item
    raise NotFoundError(404, "not_found", f"no such file or directory: {want}")


def exists(sandbox_id: str, path: str) -> Op[bool]:
    try:
        yield from list_files(sandbox_id, path, 1)
    except NotFoundError:
        return False
    return True


def delete_file(sandbox_id: str, path: str) -> Op[None]:
    return nothing(
        Call("DELETE", _files_path(sandbox_id), params=query({"path": path}), retry=True)
    )


def make_dir(sandbox_id: str, path: str, mode: Optional[int]) -> Op[MadeDir]:
    req = MakeDirectoryRequest(path=path, mode=UNSET if mode is None else format(mode, "o"))
    # Retried like the other file calls: making a directory twice leaves the same directory
    # (a retry after a lost answer reads ``created=False`` for the one the first attempt made).
    call = Call("POST", f"{_files_path(sandbox_id)}/directories", json=encode(req), retry=True)
    return simple(call, _one(MadeDir))


# --- snapshots -------------------------------------------------------------------------------


def create_snapshot(
    sandbox_id: str, req: SnapshotRequest, idempotency_key: Optional[str]
) -> Op[Snapshot]:
    call = Call(
        "POST",
        f"/v1/sandboxes/{seg(sandbox_id)}/snapshots",
        json=encode(req),
        headers={"Idempotency-Key": idempotency_key or new_idempotency_key()},
        retry=True,
    )
    return simple(call, _one(Snapshot))


def get_snapshot(snapshot_id: str) -> Op[Snapshot]:
    return simple(Call("GET", f"/v1/snapshots/{seg(snapshot_id)}", retry=True), _one(Snapshot))


def list_snapshots(
    sandbox_id: Optional[str], project_id: Optional[str], limit: Optional[int], cursor: Optional[str]
) -> Op[Page[Snapshot]]:
    if sandbox_id is not None:
        path = f"/v1/sandboxes/{seg(sandbox_id)}/snapshots"
        params = query({"limit": limit, "cursor": cursor})
    else:
        path = "/v1/snapshots"
        params = query({"projectId": project_id, "limit": limit, "cursor": cursor})
    return simple(Call("GET", path, params=params, retry=True), lambda r: _page(Snapshot, r.json()))


def delete_snapshot(snapshot_id: str) -> Op[Optional[Snapshot]]:
    """``None`` when gone (204); the snapshot, ``deleting``, when the backend is still at it."""
    reply = yield Call("DELETE", f"/v1/snapshots/{seg(snapshot_id)}", retry=True)
    if reply.status == 204 or not reply.content:
        return None
    return decode(Snapshot, reply.json())


def wait_snapshot(snapshot_id: str, timeout: float, poll: float = 0.2) -> Op[Snapshot]:
    """Polls until the snapshot is ``ready`` (there is no wait route for snapshots)."""
    deadline = time.monotonic() + timeout
    while True:
        snap = yield from get_snapshot(snapshot_id)
        if snap.status == "ready":
            return snap
        if snap.status == "failed":
            raise SandboxEndedError(
                f"snapshot {snap.id} failed: {snap.status_reason or 'no reason given'}", snap
            )
        if time.monotonic() >= deadline:
            raise WaitTimeoutError(f"snapshot {snap.id} is still {snap.status} after {timeout:g}s", snap)
        yield Sleep(poll)


# --- tenancy ---------------------------------------------------------------------------------


def _creating(path: str, body: Any, key: Optional[str]) -> Call:
    return Call(
        "POST",
        path,
        json=body,
        headers={"Idempotency-Key": key or new_idempotency_key()},
        retry=True,
    )


def create_org(req: CreateOrgRequest, key: Optional[str]) -> Op[Org]:
    return simple(_creating("/v1/orgs", encode(req), key), _one(Org))


def get(path: str, cls: Type[T]) -> Op[T]:
    return simple(Call("GET", path, retry=True), _one(cls))


def list_page(
    path: str, cls: Type[T], params: Mapping[str, Any], limit: Optional[int], cursor: Optional[str]
) -> Op[Page[T]]:
    q = query({**params, "limit": limit, "cursor": cursor})
    return simple(Call("GET", path, params=q, retry=True), lambda r: _page(cls, r.json()))


def patch(path: str, body: Any, cls: Type[T]) -> Op[T]:
    return simple(Call("PATCH", path, json=body, retry=True), _one(cls))


def put(path: str, body: Any, cls: Type[T]) -> Op[T]:
    return simple(Call("PUT", path, json=body, retry=True), _one(cls))


def delete(path: str) -> Op[None]:
    return nothing(Call("DELETE", path, retry=True))


def update_org(org_id: str, req: UpdateOrgRequest) -> Op[Org]:
    return patch(f"/v1/orgs/{seg(org_id)}", encode(req), Org)


def create_project(req: CreateProjectRequest, key: Optional[str]) -> Op[Project]:
    return simple(_creating("/v1/projects", encode(req), key), _one(Project))


def update_project(project_id: str, req: UpdateProjectRequest) -> Op[Project]:
    return patch(f"/v1/projects/{seg(project_id)}", encode(req), Project)


def create_key(req: CreateKeyRequest, key: Optional[str]) -> Op[CreatedKey]:
    # A retry after the key was made gets 409 with details.id naming it (the secret is shown
    # once): the ConflictError says so.
    return simple(_creating("/v1/keys", encode(req), key), _one(CreatedKey))


def revoke_key(key_id: str) -> Op[Key]:
    return simple(Call("DELETE", f"/v1/keys/{seg(key_id)}", retry=True), _one(Key))


def quota_path(level: str, ident: str) -> str:
    return f"/v1/{level}/{seg(ident)}/quota"


def get_quota(level: str, ident: str) -> Op[QuotaView]:
    return get(quota_path(level, ident), QuotaView)


def put_quota(level: str, ident: str, quota: Quota) -> Op[QuotaView]:
    return put(quota_path(level, ident), encode(quota), QuotaView)


def policy_path(level: str, ident: Optional[str]) -> str:
    if level == "global":
        return "/v1/admin/policies/global"
    return f"/v1/{level}/{seg(ident or '')}/policy"


def get_policy(level: str, ident: Optional[str]) -> Op[Policy]:
    return get(policy_path(level, ident), Policy)


def put_policy(level: str, ident: Optional[str], policy: Policy) -> Op[Policy]:
    return put(policy_path(level, ident), encode(policy), Policy)


def create_pool(req: PoolRequest, key: Optional[str]) -> Op[PoolRecord]:
    return simple(_creating("/v1/admin/pools", encode(req), key), _one(PoolRecord))


def update_pool(name: str, req: PoolRequest) -> Op[PoolRecord]:
    return patch(f"/v1/admin/pools/{seg(name)}", encode(req), PoolRecord)


def get_pool(name: str) -> Op[Pool]:
    return get(f"/v1/admin/pools/{seg(name)}", Pool)


def get_warm(pool: str) -> Op[WarmClasses]:
    return get(f"/v1/admin/pools/{seg(pool)}/warm", WarmClasses)


def put_warm(pool: str, classes: Sequence[WarmClass]) -> Op[WarmClasses]:
    body = {"classes": [encode(c) for c in classes]}
    return put(f"/v1/admin/pools/{seg(pool)}/warm", body, WarmClasses)


# --- audit, trust, health --------------------------------------------------------------------


def audit_filters(
    org_id: Optional[str],
    project_id: Optional[str],
    action: Optional[str],
    actor: Optional[str],
    resource: Optional[str],
    since: Any,
    until: Any,
) -> Dict[str, Any]:
    return {
        "orgId": org_id,
        "projectId": project_id,
        "action": action,
        "actor": actor,
        "resource": resource,
        "since": since,
        "until": until,
    }


def verify_audit() -> Op[Verification]:
    return get("/v1/admin/audit/verify", Verification)


def trust_report() -> Op[TrustReport]:
    return get("/v1/admin/trust-report", TrustReport)


def health(path: str) -> Op[Health]:
    return get(path, Health)


def openapi() -> Op[Dict[str, Any]]:
    return simple(Call("GET", "/v1/openapi.json", retry=True), lambda r: dict(r.json()))


def put_secret(name: str, req: SecretRequest) -> Op[Secret]:
    return put(f"/v1/admin/secrets/{seg(name)}", encode(req), Secret)


def audit_checkpoint() -> Op[Optional[Checkpoint]]:
    """A signed checkpoint of every chain head; ``None`` when nothing changed since the last."""
    reply = yield Call("POST", "/v1/admin/audit/checkpoints")
    return None if reply.status == 204 or not reply.content else decode(Checkpoint, reply.json())


def audit_segment(req: AuditSegmentRequest) -> Op[AuditSegment]:
    return simple(Call("POST", "/v1/admin/audit/segments", json=encode(req)), _one(AuditSegment))


def audit_export_call() -> Call:
    return Call("GET", "/v1/admin/audit/export", retry=True, read_timeout=120.0)


def events_call(
    project_id: Optional[str],
    sandbox_id: Optional[str],
    after: Optional[int],
    public: bool = False,
    types: Optional[Sequence[str]] = None,
) -> Call:
    """``GET /v1/events``; ``public`` asks for the public contract (``format=public``), whose
    ``types`` filter is sent as one comma-separated parameter (``types=a,b.*``)."""
    headers = {"Accept": "text/event-stream"}
    if after is not None:
        headers["Last-Event-ID"] = str(after)
    params = {"projectId": project_id, "sandboxId": sandbox_id}
    if public:
        params["format"] = "public"
        params["types"] = ",".join(types) if types else None
    return Call(
        "GET",
        "/v1/events",
        params=query(params),
        headers=headers,
        retry=True,
        read_timeout=60.0,
    )


def event_types_filter(types: Union[None, str, Sequence[str]]) -> Optional[List[str]]:
    """``types=`` as a list: exact types or prefixes ending in ``.*``; a comma inside one
    would split it on the wire, so it is refused here rather than misread there."""
    if types is None:
        return None
    items = [types] if isinstance(types, str) else list(types)
    for item in items:
        if not isinstance(item, str) or not item or "," in item:
            raise ValueError(f"event type filter {item!r} is not one type or 'prefix.*'")
    return items or None


def _sequence(ev_id: Optional[str]) -> int:
    try:
        return int(ev_id or "")
    except ValueError as e:
        raise ProtocolError(f"an event id that is not a sequence: {ev_id!r}") from e


def public_event(value: Any, seq: Optional[int]) -> PublicEvent:
    """A public event from its JSON, refusing an envelope of another major version (its
    fields may mean something else: docs/events.md)."""
    if not isinstance(value, dict):
        raise ProtocolError("a public event that is not a JSON object")
    version = value.get("version")
    if version != PUBLIC_EVENT_VERSION:
        raise ProtocolError(
            f"a public event of version {version!r}; this SDK reads version "
            f"{PUBLIC_EVENT_VERSION}: upgrade the differently package"
        )
    return decode(PublicEvent, value, "PublicEvent", local={"seq": seq})


def sse_public_event(ev_id: Optional[str], data: bytes) -> PublicEvent:
    seq = _sequence(ev_id)
    try:
        body = json.loads(data.decode("utf-8"))
    except ValueError as e:
        raise ProtocolError("a public event whose data is not JSON") from e
    return public_event(body, seq)


def status_event(ev_id: Optional[str], data: bytes) -> StatusEvent:
    seq = _sequence(ev_id)
    try:
        body = json.loads(data.decode("utf-8"))
    except ValueError as e:
        raise ProtocolError("a status event whose data is not JSON") from e
    return decode(StatusEvent, body, "StatusEvent", local={"seq": seq})


def reconnect_delay(failures: int, retry_ms: Optional[int]) -> float:
    """Back-off between event-stream reconnections (the server's ``retry:`` when it sent one)."""
    base = (retry_ms / 1000.0) if retry_ms is not None else 0.25
    return float(min(5.0, base * (2 ** max(0, failures - 1))))


# --- operators' summaries, event schemas and credentials, webhooks --------------------------


def metrics_summary() -> Op[MetricsSummary]:
    return get("/v1/admin/metrics/summary", MetricsSummary)


def queue_report() -> Op[QueueReport]:
    return get("/v1/admin/queue", QueueReport)


def event_schemas() -> Op[EventSchemaList]:
    return get("/v1/events/schemas", EventSchemaList)


def event_schema(event_type: str) -> Op[Dict[str, Any]]:
    call = Call("GET", f"/v1/events/schemas/{seg(event_type)}", retry=True)
    return simple(call, lambda r: _object(r.json(), "an event schema"))


def _object(value: Any, what: str) -> Dict[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolError(f"{what} that is not a JSON object")
    return value


def create_event_credentials(req: EventCredentialsRequest) -> Op[EventCredentials]:
    # Not retried: each call issues a new token, and the first one's would be lost.
    call = Call("POST", "/v1/events/credentials", json=encode(req))
    return simple(call, _one(EventCredentials))


def revoke_event_credentials(credential_id: str) -> Op[None]:
    return delete(f"/v1/events/credentials/{seg(credential_id)}")


def _webhook_path(webhook_id: str) -> str:
    return f"/v1/webhooks/{seg(webhook_id)}"


def create_webhook(req: CreateWebhookRequest, key: Optional[str]) -> Op[WebhookWithSecret]:
    # A replay of the Idempotency-Key answers 409 naming the webhook (its secret is shown once).
    return simple(_creating("/v1/webhooks", encode(req), key), _one(WebhookWithSecret))


def update_webhook(webhook_id: str, req: UpdateWebhookRequest) -> Op[Webhook]:
    return patch(_webhook_path(webhook_id), encode(req), Webhook)


def rotate_webhook_secret(webhook_id: str) -> Op[WebhookWithSecret]:
    # Not retried: a second rotation would drop the secret the first one kept signing.
    call = Call("POST", f"{_webhook_path(webhook_id)}/rotate-secret")
    return simple(call, _one(WebhookWithSecret))


def list_webhook_deliveries(
    webhook_id: str, limit: Optional[int], cursor: Optional[str]
) -> Op[Page[WebhookDelivery]]:
    return list_page(f"{_webhook_path(webhook_id)}/deliveries", WebhookDelivery, {}, limit, cursor)


def redeliver_webhook(webhook_id: str, delivery_id: str) -> Op[WebhookDelivery]:
    # Sent again, it makes the delivery due once more: one more request at most, with the
    # same webhook-id, which receivers de-duplicate on (at least once, docs/webhooks.md).
    path = f"{_webhook_path(webhook_id)}/deliveries/{seg(delivery_id)}/redeliver"
    return simple(Call("POST", path, retry=True), _one(WebhookDelivery))


__all__ = ["Call", "Sleep", "Reply", "Op", "RetryPolicy", "Unset", "AuditEvent"]


def json_line(line: str) -> Dict[str, Any]:
    """One line of the audit export."""
    try:
        value = json.loads(line)
    except ValueError as e:
        raise ProtocolError("an audit export line that is not JSON") from e
    if not isinstance(value, dict):
        raise ProtocolError("an audit export line that is not an object")
    return value
