"""The asynchronous client. ``_sync_client.py`` is generated from this file by
``tools/unasync.py`` (a test fails when it is stale), so both clients have the same surface."""

from __future__ import annotations

import asyncio
import collections
import datetime as _dt
import json
import logging
import os
from typing import (
    TYPE_CHECKING,
    Any,
    AsyncIterable,
    AsyncIterator,
    BinaryIO,
    Callable,
    Dict,
    Generic,
    List,
    Literal,
    Mapping,
    Optional,
    Sequence,
    TypeVar,
    Union,
    cast,
    overload,
)

import httpx

from . import _core as core
from ._codec import UNSET, Unset
from ._core import Call, Op, Reply, RetryPolicy, Sleep, ref, seg
from ._streams import ExecFrames, ExecSSE, SSEDecoder
from ._version import __version__
from .errors import APIError, NetworkError, ProtocolError, PtyError, StreamCutError
from .models import (
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
    AuditEvent,
    AuditSegment,
    AuditSegmentRequest,
    Checkpoint,
    Secret,
    SecretRequest,
    Capability,
    Classification,
    CreatedKey,
    CreateKeyRequest,
    CreateOrgRequest,
    CreateProjectRequest,
    CreateSandboxRequest,
    DryRun,
    ExecEvent,
    ExecExit,
    Process,
    StartProcessRequest,
    TerminalSize,
    ExecRequest,
    ExecResult,
    ExposedPort,
    ExternalMode,
    FileInfo,
    MadeDir,
    Health,
    Isolation,
    Key,
    Org,
    OrgStatus,
    Page,
    PendingOperation,
    Placement,
    Policy,
    Pool,
    PoolRecord,
    PoolRequest,
    PortRequest,
    Profile,
    WarmClass,
    WarmClasses,
    Project,
    Quota,
    QuotaView,
    ResourcesSpec,
    Sandbox,
    SandboxStatus,
    Scope,
    Snapshot,
    SnapshotRequest,
    StatusEvent,
    Strategy,
    Trust,
    TrustReport,
    UpdateOrgRequest,
    UpdateProjectRequest,
    UpdateSandboxRequest,
    Verification,
)

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection

T = TypeVar("T")
E = TypeVar("E", StatusEvent, PublicEvent)
SandboxRef = Union[str, Sandbox]
_CHUNK = 256 * 1024
_NO_REPLY = Reply(0, {}, b"")


def _opt(value: Optional[T]) -> Union[T, Unset]:
    return UNSET if value is None else value


class _Secret:
    """The API key, kept out of every ``repr`` and message."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def header(self) -> str:
        return f"Bearer {self._value}"

    def __repr__(self) -> str:
        return "<redacted>"


class AsyncClient:
    """A client of one Differently API (``base_url``, else ``$DIFFERENTLY_URL``, else
    ``http://127.0.0.1:7070``) with one API key (``api_key``, else ``$DIFFERENTLY_API_KEY``).

    Use it as a context manager, or call :meth:`aclose`. Safe calls are retried
    (:class:`RetryPolicy`); creates carry a generated ``Idempotency-Key``.
    """

    def __init__(
        self,
        base_url: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        timeout: float = 30.0,
        retry: Optional[RetryPolicy] = None,
        http_client: Optional[httpx.AsyncClient] = None,
    ) -> None:
        url = (base_url or os.environ.get("DIFFERENTLY_URL") or core.DEFAULT_URL).rstrip("/")
        key = api_key if api_key is not None else os.environ.get("DIFFERENTLY_API_KEY")
        self._base_url = url
        self._key = _Secret(key) if key else None
        self._timeout = timeout
        self._retry = retry or RetryPolicy()
        self._own_http = http_client is None
        self._http = http_client or httpx.AsyncClient(
            timeout=timeout, headers={"User-Agent": f"differently-python/{__version__}"}
        )
        self.sandboxes = AsyncSandboxes(self)
        self.files = AsyncFiles(self)
        self.processes = AsyncProcesses(self)
        self.snapshots = AsyncSnapshots(self)
        self.placement = AsyncPlacementApi(self)
        self.events = AsyncEvents(self)
        self.orgs = AsyncOrgs(self)
        self.projects = AsyncProjects(self)
        self.keys = AsyncKeys(self)
        self.quotas = AsyncQuotas(self)
        self.policies = AsyncPolicies(self)
        self.pools = AsyncPools(self)
        self.audit = AsyncAudit(self)
        self.secrets = AsyncSecrets(self)
        self.webhooks = AsyncWebhooks(self)

    @property
    def base_url(self) -> str:
        return self._base_url

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self._base_url!r})"

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._own_http:
            await self._http.aclose()

    # --- plumbing ------------------------------------------------------------------------

    def _headers(self, call: Call) -> Dict[str, str]:
        headers = dict(call.headers)
        if self._key is not None:
            headers["Authorization"] = self._key.header()
        return headers

    def _timeout_for(self, call: Call) -> httpx.Timeout:
        read = self._timeout if call.read_timeout is None else max(self._timeout, call.read_timeout)
        return httpx.Timeout(self._timeout, read=read)

    async def _send(self, call: Call, stream: bool = False) -> httpx.Response:
        """Sends ``call`` (again, when the policy says so) and returns a response with status
        < 400: read, or still open when ``stream``. Raises :class:`APIError` or
        :class:`NetworkError`."""
        attempt = 0
        while True:
            request = self._http.build_request(
                call.method,
                self._base_url + call.path,
                params=tuple(call.params) if call.params else None,
                json=None if call.json is UNSET else call.json,
                content=call.content,
                headers=self._headers(call),
                timeout=self._timeout_for(call),
            )
            try:
                resp = await self._http.send(request, stream=True)
                if resp.status_code < 400 and stream:
                    return resp
                try:
                    await resp.aread()
                finally:
                    await resp.aclose()
            except httpx.TransportError as e:
                delay = self._retry.after_network_error(call, attempt, e)
                if delay is None:
                    raise core.network_error(self._base_url, call, e) from e
                await asyncio.sleep(delay)
                attempt += 1
                continue
            if resp.status_code < 400:
                return resp
            err = core.api_error(call, resp.status_code, resp.headers, resp.content)
            delay = self._retry.after_error(call, attempt, err)
            if delay is None:
                raise err
            await asyncio.sleep(delay)
            attempt += 1

    async def _run(self, op: Op[T]) -> T:
        """Drives one operation of the shared core to its result."""
        try:
            step = next(op)
            while True:
                if isinstance(step, Sleep):
                    await asyncio.sleep(step.seconds)
                    step = op.send(_NO_REPLY)
                    continue
                try:
                    resp = await self._send(step)
                except APIError as err:
                    step = op.throw(err)
                    continue
                step = op.send(Reply(resp.status_code, resp.headers, resp.content))
        except StopIteration as stop:
            return cast(T, stop.value)
        finally:
            op.close()

    async def _paginate(self, page: Callable[[Optional[str]], Op[Page[T]]]) -> AsyncIterator[T]:
        cursor: Optional[str] = None
        while True:
            got = await self._run(page(cursor))
            for item in got.items:
                yield item
            if got.next_cursor is None:
                return
            cursor = got.next_cursor

    # --- installation-wide ---------------------------------------------------------------

    async def health(self) -> Health:
        """``GET /healthz`` (no key needed)."""
        return await self._run(core.health("/healthz"))

    async def ready(self) -> Health:
        """``GET /readyz``: 503 (:class:`UnavailableError`) while not ready."""
        return await self._run(core.health("/readyz"))

    async def openapi(self) -> Dict[str, Any]:
        """The served OpenAPI 3.1 document."""
        return await self._run(core.openapi())

    async def trust_report(self) -> TrustReport:
        """``GET /v1/admin/trust-report`` (admin)."""
        return await self._run(core.trust_report())

    async def metrics_summary(self) -> MetricsSummary:
        """``GET /v1/admin/metrics/summary`` (admin): the answering API process's admission,
        activation and queue-depth counters."""
        return await self._run(core.metrics_summary())

    async def queue(self) -> QueueReport:
        """``GET /v1/admin/queue`` (admin): the fair queue per organization, deepest first."""
        return await self._run(core.queue_report())


class AsyncExecStream:
    """A streamed exec: iterate it for :class:`ExecStdout` / :class:`ExecStderr` chunks in the
    order the server sent them, then one :class:`ExecExit`. Leaving the ``with`` block (or
    :meth:`aclose`) hangs up, which cancels the command on the backend. An ``error`` frame
    raises :class:`ExecStreamError`; a cut connection :class:`StreamCutError`."""

    def __init__(self, client: AsyncClient, call: Call, decoder: Union[ExecFrames, ExecSSE]):
        self._client = client
        self._call = call
        self._decoder = decoder
        self._resp: Optional[httpx.Response] = None

    @property
    def exit(self) -> Optional[ExecExit]:
        """The exit event, once the stream has delivered it."""
        return self._decoder.exit

    @property
    def exit_code(self) -> Optional[int]:
        return None if self._decoder.exit is None else self._decoder.exit.exit_code

    async def __aenter__(self) -> "AsyncExecStream":
        await self._open()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def _open(self) -> httpx.Response:
        if self._resp is None:
            self._resp = await self._client._send(self._call, stream=True)
        return self._resp

    def __aiter__(self) -> AsyncIterator[ExecEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[ExecEvent]:
        resp = await self._open()
        try:
            async for chunk in resp.aiter_raw():
                for event in self._decoder.feed(chunk):
                    yield event
            self._decoder.finish()
        except httpx.TransportError as e:
            raise StreamCutError(
                f"the exec stream from {self._client.base_url} was cut: {e}"
            ) from e
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        if self._resp is not None:
            await self._resp.aclose()


class AsyncProcessOutput(AsyncExecStream):
    """A process's output (``processes.output``): iterate it for :class:`ExecStdout` /
    :class:`ExecStderr` chunks, then (once the process has ended) one :class:`ExecExit`.
    Without ``follow`` it ends after the output kept now, with no exit while the process
    runs. Leaving the ``with`` block only detaches: the process goes on. :attr:`offset` is
    where to attach again from."""

    async def __aenter__(self) -> "AsyncProcessOutput":
        await self._open()
        return self

    @property
    def offset(self) -> int:
        """The byte offset just past the output read so far (``start`` before any), counted
        from ``start`` (the server's SSE ``id:``s are too). A ``start`` outside the output kept
        (older than ``output_dropped``, or past ``output_bytes``) begins at the nearest kept
        byte, so the count is off by the difference: then ``get(…).output_bytes`` is the one
        to trust."""
        return self._decoder.offset


#: The logger handed to ``websockets``. Its level is WARNING so that the handshake, which
#: websockets logs at DEBUG with every header (the API key) and the query (env values), is
#: never logged even when the application logs everything at DEBUG.
_WS_LOGGER = logging.getLogger("differently.pty.websockets")
_WS_LOGGER.setLevel(logging.WARNING)


async def _ws_recv(ws: "ClientConnection", timeout: Optional[float]) -> Union[str, bytes]:
    try:
        return await asyncio.wait_for(ws.recv(), timeout)
    except asyncio.TimeoutError as e:
        raise TimeoutError(f"no terminal output in {timeout} s") from e


class AsyncPty:
    """An interactive terminal in a sandbox (``GET /v1/sandboxes/{id}/pty``, a WebSocket),
    from :meth:`AsyncSandboxes.pty`. Use as ``async with … as term`` (or ``await
    term.open()``): ``write`` keystrokes, ``read`` or iterate the output (stdout and stderr are
    one stream on a terminal), ``resize``, ``signal``, ``wait`` for the exit code.

    Closing (or a lost connection) does not end the program: it runs on for
    ``grace_seconds``, and ``sandboxes.pty(sandbox, session=term.session_id)`` reattaches,
    getting the output it missed (the newest 64 KiB) first. Needs ``differently[pty]``."""

    def __init__(self, client: AsyncClient, call: Call, open_timeout: float) -> None:
        self._client = client
        self._call = call
        self._open_timeout = open_timeout
        self._ws: Optional["ClientConnection"] = None
        self._pending: "collections.deque[bytes]" = collections.deque()
        self._done = False
        #: The session's id (``pty_…``), to reattach with; set once open.
        self.session_id: Optional[str] = None
        #: How long the program outlives a lost connection, in seconds.
        self.grace_seconds: Optional[int] = None
        #: The program's exit code once it ended (128+n when signal n killed it).
        self.exit_code: Optional[int] = None

    async def __aenter__(self) -> "AsyncPty":
        await self.open()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def open(self) -> "AsyncPty":
        """Connects and reads the session frame (done by ``async with`` and on first use)."""
        if self._ws is not None:
            return self
        try:
            from websockets.asyncio.client import connect
            from websockets.exceptions import InvalidStatus, WebSocketException
        except ImportError as e:
            raise ImportError(
                "sandboxes.pty needs the optional extra: pip install 'differently[pty]'"
            ) from e
        c = self._client
        headers = {"Authorization": c._key.header()} if c._key is not None else {}
        url = core.ws_url(c.base_url, self._call)
        try:
            # Entered by hand: the connection outlives this call (closed by close()).
            self._ws = await connect(
                url,
                additional_headers=headers,
                user_agent_header=f"differently-python/{__version__}",
                open_timeout=self._open_timeout,
                logger=_WS_LOGGER,
            ).__aenter__()
        except InvalidStatus as e:
            r = e.response
            raise core.api_error(self._call, r.status_code, _HeaderView(r.headers), bytes(r.body or b"")) from e
        except (OSError, WebSocketException, TimeoutError) as e:
            raise NetworkError(
                f"cannot open the terminal at {c.base_url}{self._call.path}: {e or type(e).__name__}"
                " — is the Differently API running there?"
            ) from e
        first = await self._recv_frame()
        if not isinstance(first, str):
            raise ProtocolError("the terminal's first frame is not its session frame")
        session = self._control(first)
        if session.get("type") != "session":
            raise ProtocolError(f"the terminal's first frame is not its session frame: {first[:200]}")
        self.session_id = str(session.get("id") or "") or None
        grace = session.get("graceSeconds")
        self.grace_seconds = grace if isinstance(grace, int) else None
        return self

    async def _recv_frame(self, timeout: Optional[float] = None) -> Union[str, bytes]:
        from websockets.exceptions import ConnectionClosed

        assert self._ws is not None
        try:
            return await _ws_recv(self._ws, timeout)
        except ConnectionClosed as e:
            self._done = True
            raise StreamCutError(
                f"the terminal's connection to {self._client.base_url} was lost before the "
                f"program's exit ({e}); reattach within the grace period with "
                f"session={self.session_id!r}"
            ) from e

    def _control(self, text: str) -> Dict[str, Any]:
        try:
            frame = json.loads(text)
        except ValueError as e:
            raise ProtocolError(f"a terminal text frame is not JSON: {text[:200]!r}") from e
        if not isinstance(frame, dict):
            raise ProtocolError(f"a terminal text frame is not an object: {text[:200]!r}")
        return frame

    async def _next(self, timeout: Optional[float]) -> bytes:
        """The next output chunk from the socket; ``b""`` once the program has exited."""
        while not self._done:
            frame = await self._recv_frame(timeout)
            if isinstance(frame, bytes):
                if frame:
                    return frame
                continue
            msg = self._control(frame)
            kind = msg.get("type")
            if kind == "exit":
                code = msg.get("exitCode")
                if isinstance(code, bool) or not isinstance(code, int):
                    raise ProtocolError(f"a terminal exit frame without an exit code: {frame[:200]}")
                self.exit_code = code
                self._done = True
            elif kind == "error":
                self._done = True
                details = msg.get("details")
                fld = msg.get("field") or (details.get("field") if isinstance(details, dict) else None)
                raise PtyError(str(msg.get("code") or "internal"), str(msg.get("message") or ""),
                               str(fld) if fld else None)  # fmt: skip
            # any other (newer) control frame is not output: skip it
        return b""

    async def read(self, timeout: Optional[float] = None) -> bytes:
        """The next chunk of output as it came (``b""`` once the program exited). Raises
        :class:`TimeoutError` after ``timeout`` seconds without output (``None``: wait),
        :class:`PtyError` on an error frame, :class:`StreamCutError` on a lost connection."""
        await self.open()
        if self._pending:
            return self._pending.popleft()
        return await self._next(timeout)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[bytes]:
        while True:
            chunk = await self.read()
            if not chunk:
                return
            yield chunk

    async def write(self, data: Union[bytes, str]) -> None:
        """Keystrokes (text is sent as UTF-8); the terminal echoes and line-edits them."""
        await self.open()
        assert self._ws is not None
        await self._ws.send(data.encode("utf-8") if isinstance(data, str) else bytes(data))

    async def resize(self, cols: int, rows: int) -> None:
        """Sets the terminal's size (1-1000 each); the program gets SIGWINCH."""
        frame = core.pty_resize(cols, rows)
        await self.open()
        assert self._ws is not None
        await self._ws.send(frame)

    async def signal(self, name: str) -> None:
        """Sends ``INT``, ``TERM``, ``KILL`` or ``HUP`` to the foreground process group, as
        ^C would."""
        frame = core.pty_signal(name)
        await self.open()
        assert self._ws is not None
        await self._ws.send(frame)

    async def wait(self, timeout: Optional[float] = None) -> int:
        """Until the program exits; its exit code. Output not read yet stays readable with
        :meth:`read`. ``timeout`` bounds the silence between frames, as for ``read``."""
        await self.open()
        while not self._done:
            chunk = await self._next(timeout)
            if chunk:
                self._pending.append(chunk)
        if self.exit_code is None:
            raise ProtocolError("the terminal ended without an exit code")
        return self.exit_code

    async def close(self) -> None:
        """Hangs up. The program keeps running for the grace period unless it has exited
        (``signal("KILL")`` first to end it now)."""
        if self._ws is not None:
            await self._ws.close()


class _HeaderView(Dict[str, str]):
    """A refused upgrade's headers, lower-cased, as ``api_error`` reads them."""

    def __init__(self, headers: Any) -> None:
        super().__init__({str(k).lower(): str(v) for k, v in headers.raw_items()})


class _EventStreamBase(Generic[E]):
    """``GET /v1/events`` as an iterator, reconnecting with ``Last-Event-ID`` after a lost
    connection so no event is missed or repeated (while the server still holds it: 24 h).
    ``last_id`` is the last sequence delivered. The two formats differ only in which SSE
    events they read and how they decode them (:meth:`_decode`)."""

    def __init__(
        self,
        client: AsyncClient,
        call: Callable[[Optional[int]], Call],
        after: Optional[int],
        reconnect: bool,
        max_failures: int,
    ) -> None:
        self._client = client
        self._call = call
        self.last_id = after
        self._reconnect = reconnect
        self._max_failures = max_failures
        self._resp: Optional[httpx.Response] = None
        self._closed = False
        #: How many times the stream was opened again after a lost connection.
        self.reconnects = 0

    def _decode(self, event: Optional[str], ev_id: Optional[str], data: bytes) -> Optional[E]:
        """The event of one SSE message, or ``None`` to skip it."""
        raise NotImplementedError

    def __aiter__(self) -> AsyncIterator[E]:
        return self._events()

    async def _events(self) -> AsyncIterator[E]:
        failures = 0
        retry_ms: Optional[int] = None
        while not self._closed:
            call = self._call(self.last_id)
            try:
                self._resp = await self._client._send(call, stream=True)
                decoder = SSEDecoder()
                async for chunk in self._resp.aiter_raw():
                    for ev in decoder.feed(chunk):
                        if ev.retry is not None:
                            retry_ms = ev.retry
                        event = self._decode(ev.event, ev.id, ev.data)
                        if event is None:
                            continue
                        self.last_id = event.seq
                        failures = 0
                        yield event
                lost: Exception = StreamCutError("the event stream ended")
            except (httpx.TransportError, NetworkError) as e:
                lost = e
            except httpx.StreamError:
                if self._closed:  # closed by aclose() while reading
                    return
                raise
            finally:
                if self._resp is not None:
                    await self._resp.aclose()
                    self._resp = None
            if self._closed:
                return
            failures += 1
            if not self._reconnect or failures > self._max_failures:
                if isinstance(lost, NetworkError):
                    raise lost
                raise StreamCutError(f"the event stream was lost: {lost}") from lost
            await asyncio.sleep(core.reconnect_delay(failures, retry_ms))
            self.reconnects += 1

    async def aclose(self) -> None:
        self._closed = True
        if self._resp is not None:
            await self._resp.aclose()


class AsyncEventStream(_EventStreamBase[StatusEvent]):
    """``GET /v1/events`` (``format=status``) as an iterator of :class:`StatusEvent`,
    reconnecting and resuming after a lost connection; ``last_id`` is the last sequence
    delivered."""

    async def __aenter__(self) -> "AsyncEventStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def _decode(self, event: Optional[str], ev_id: Optional[str], data: bytes) -> Optional[StatusEvent]:
        return core.status_event(ev_id, data) if event == "status" else None


class AsyncPublicEventStream(_EventStreamBase[PublicEvent]):
    """``GET /v1/events?format=public`` as an iterator of :class:`PublicEvent` (the contract
    of docs/events.md, as on NATS and in webhooks), reconnecting and resuming after a lost
    connection; ``last_id`` is the last sequence delivered."""

    async def __aenter__(self) -> "AsyncPublicEventStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def _decode(self, event: Optional[str], ev_id: Optional[str], data: bytes) -> Optional[PublicEvent]:
        # Every message of this format is a public event named by its type; a keep-alive or
        # any other kind has no data.
        return core.sse_public_event(ev_id, data) if data and event != "status" else None


async def _file_chunks(f: BinaryIO) -> AsyncIterator[bytes]:
    while True:
        chunk = f.read(_CHUNK)
        if not chunk:
            return
        yield chunk


class AsyncSandboxes:
    """Sandboxes: lifecycle, exec, ports, placement (``client.sandboxes``)."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def create(
        self,
        *,
        project_id: Optional[str] = None,
        template: Optional[str] = None,
        resources: Optional[ResourcesSpec] = None,
        profile: Optional[Profile] = None,
        env: Optional[Mapping[str, str]] = None,
        labels: Optional[Mapping[str, str]] = None,
        ttl_seconds: Optional[int] = None,
        idle_timeout_seconds: Optional[int] = None,
        capabilities: Optional[Sequence[Capability]] = None,
        classification: Optional[Classification] = None,
        region: Optional[str] = None,
        strategy: Optional[Strategy] = None,
        external: Optional[ExternalMode] = None,
        priority: Optional[int] = None,
        from_snapshot: Optional[str] = None,
        idempotency_key: Optional[str] = None,
    ) -> Sandbox:
        """``POST /v1/sandboxes``: admitted (``queued`` or ``provisioning``); follow with
        :meth:`wait`. ``from_snapshot`` restores/forks a ready snapshot. A generated
        ``Idempotency-Key`` makes retries create one sandbox at most."""
        req = create_request(
            project_id, template, resources, profile, env, labels, ttl_seconds,
            idle_timeout_seconds, capabilities, classification, region, strategy, external,
            priority, from_snapshot,
        )  # fmt: skip
        return await self._c._run(core.create_sandbox(req, idempotency_key))

    async def get(self, sandbox: SandboxRef) -> Sandbox:
        return await self._c._run(core.get_sandbox(ref(sandbox)))

    def list(
        self,
        *,
        status: Optional[SandboxStatus] = None,
        label: Union[None, str, Mapping[str, str], Sequence[str]] = None,
        project_id: Optional[str] = None,
        page_size: Optional[int] = None,
    ) -> AsyncIterator[Sandbox]:
        """Every sandbox matching the filters, fetching pages of ``page_size`` as needed.
        ``label`` is ``{key: value, …}``, ``"key=value"`` or a list of those strings: a
        sandbox must carry every label given."""
        lab = core.label_filter(label)
        return self._c._paginate(
            lambda cursor: core.list_sandboxes(status, lab, project_id, page_size, cursor)
        )

    async def list_page(
        self,
        *,
        status: Optional[SandboxStatus] = None,
        label: Union[None, str, Mapping[str, str], Sequence[str]] = None,
        project_id: Optional[str] = None,
        limit: Optional[int] = None,
        cursor: Optional[str] = None,
    ) -> Page[Sandbox]:
        """One page (``limit`` 1-1000), and the cursor of the next."""
        lab = core.label_filter(label)
        return await self._c._run(core.list_sandboxes(status, lab, project_id, limit, cursor))

    async def wait(
        self, sandbox: SandboxRef, status: SandboxStatus = "running", *, timeout: float = 60.0
    ) -> Sandbox:
        """Until the sandbox has ``status``. Raises :class:`SandboxEndedError` when it ends
        otherwise, :class:`WaitTimeoutError` after ``timeout`` seconds."""
        return await self._c._run(core.wait_sandbox(ref(sandbox), status, timeout))

    async def update(
        self,
        sandbox: SandboxRef,
        *,
        ttl_seconds: Optional[int] = None,
        labels: Optional[Mapping[str, str]] = None,
        idle_timeout_seconds: Union[int, None, Unset] = UNSET,
    ) -> Sandbox:
        """``PATCH``: renew the TTL (from now), replace the labels, set the idle timeout
        (``idle_timeout_seconds=None`` clears it)."""
        req = UpdateSandboxRequest(
            ttl_seconds=_opt(ttl_seconds),
            labels=UNSET if labels is None else dict(labels),
            idle_timeout_seconds=idle_timeout_seconds,
        )
        return await self._c._run(core.update_sandbox(ref(sandbox), req))

    async def delete(self, sandbox: SandboxRef) -> Sandbox:
        """``DELETE``: the sandbox, ``terminating``."""
        return await self._c._run(core.delete_sandbox(ref(sandbox)))

    async def pause(self, sandbox: SandboxRef) -> Sandbox:
        return await self._c._run(core.lifecycle(ref(sandbox), "pause"))

    async def resume(self, sandbox: SandboxRef) -> Sandbox:
        return await self._c._run(core.lifecycle(ref(sandbox), "resume"))

    async def stop(self, sandbox: SandboxRef) -> Sandbox:
        return await self._c._run(core.lifecycle(ref(sandbox), "stop"))

    async def start(self, sandbox: SandboxRef) -> Sandbox:
        return await self._c._run(core.lifecycle(ref(sandbox), "start"))

    async def keepalive(self, sandbox: SandboxRef) -> None:
        """Counts as activity for the idle timeout."""
        await self._c._run(core.keepalive(ref(sandbox)))

    async def placement(self, sandbox: SandboxRef) -> Placement:
        """The stored explanation of where (and why) the sandbox was placed."""
        return await self._c._run(core.placement(ref(sandbox)))

    async def exec(
        self,
        sandbox: SandboxRef,
        command: Sequence[str],
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: Union[None, str, bytes] = None,
        timeout_seconds: Optional[int] = None,
        output_base64: bool = False,
    ) -> ExecResult:
        """Runs ``command`` (argv) and returns its buffered output (1 MiB per stream kept).
        ``stdin`` text is sent as is, bytes exactly (base64 on the wire)."""
        req = exec_request(command, env, cwd, stdin, timeout_seconds, output_base64)
        return await self._c._run(core.exec_buffered(ref(sandbox), req))

    def exec_stream(
        self,
        sandbox: SandboxRef,
        command: Sequence[str],
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: Union[None, str, bytes] = None,
        timeout_seconds: Optional[int] = None,
        transport: str = "frames",
    ) -> AsyncExecStream:
        """Runs ``command`` and streams its output as it is produced. ``transport`` is
        ``"frames"`` (binary, exact bytes, the default) or ``"sse"`` (server-sent events).
        Use as ``async with … as s: async for event in s`` (the request is sent on entry)."""
        if transport not in ("frames", "sse"):
            raise ValueError("transport must be 'frames' or 'sse'")
        req = exec_request(command, env, cwd, stdin, timeout_seconds, False)
        decoder: Union[ExecFrames, ExecSSE] = ExecFrames() if transport == "frames" else ExecSSE(False)
        return AsyncExecStream(self._c, core.exec_call(ref(sandbox), req, transport), decoder)

    async def expose_port(
        self, sandbox: SandboxRef, port: int, *, expires_seconds: Optional[int] = None
    ) -> Union[ExposedPort, PendingOperation]:
        """A URL reaching ``port`` in the sandbox (or the pending operation, when slow)."""
        req = PortRequest(port=port, expires_seconds=_opt(expires_seconds))
        return await self._c._run(core.expose_port(ref(sandbox), req))

    def pty(
        self,
        sandbox: SandboxRef,
        command: Optional[Sequence[str]] = None,
        *,
        cols: Optional[int] = None,
        rows: Optional[int] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        session: Optional[str] = None,
        open_timeout: float = 10.0,
    ) -> AsyncPty:
        """An interactive terminal running ``command`` (argv; default ``sh -l``) at
        ``cols`` x ``rows`` (default 80 x 24), or, with ``session=`` alone, the session of an
        earlier terminal again. Use as ``async with … as term`` (connects on entry). Env
        values travel in the URL: keep secrets in the sandbox's env from create. Needs the
        optional extra ``differently[pty]`` (the ``websockets`` package)."""
        call = core.pty_call(ref(sandbox), command, cols, rows, env, cwd, session)
        return AsyncPty(self._c, call, open_timeout)

def create_request(
    project_id: Optional[str],
    template: Optional[str],
    resources: Optional[ResourcesSpec],
    profile: Optional[Profile],
    env: Optional[Mapping[str, str]],
    labels: Optional[Mapping[str, str]],
    ttl_seconds: Optional[int],
    idle_timeout_seconds: Optional[int],
    capabilities: Optional[Sequence[Capability]],
    classification: Optional[Classification],
    region: Optional[str],
    strategy: Optional[Strategy],
    external: Optional[ExternalMode],
    priority: Optional[int],
    from_snapshot: Optional[str],
) -> CreateSandboxRequest:
    return CreateSandboxRequest(
        project_id=_opt(project_id),
        template=_opt(template),
        resources=_opt(resources),
        profile=_opt(profile),
        env=UNSET if env is None else dict(env),
        labels=UNSET if labels is None else dict(labels),
        ttl_seconds=_opt(ttl_seconds),
        idle_timeout_seconds=_opt(idle_timeout_seconds),
        capabilities=UNSET if capabilities is None else list(capabilities),
        classification=_opt(classification),
        region=_opt(region),
        strategy=_opt(strategy),
        external=_opt(external),
        priority=_opt(priority),
        from_snapshot=_opt(from_snapshot),
    )


def exec_request(
    command: Sequence[str],
    env: Optional[Mapping[str, str]],
    cwd: Optional[str],
    stdin: Union[None, str, bytes],
    timeout_seconds: Optional[int],
    output_base64: bool,
) -> ExecRequest:
    if isinstance(command, str):
        raise TypeError("command is an argv list, e.g. ['sh', '-c', 'echo hi']")
    fields = core.stdin_fields(stdin)
    return ExecRequest(
        command=list(command),
        env=UNSET if env is None else dict(env),
        cwd=_opt(cwd),
        stdin=fields.get("stdin", UNSET),
        stdin_base64=fields.get("stdin_base64", UNSET),
        timeout_seconds=_opt(timeout_seconds),
        output_encoding="base64" if output_base64 else UNSET,
    )


class AsyncFiles:
    """Files in a sandbox (``client.files``); paths are absolute within the sandbox."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def upload(
        self,
        sandbox: SandboxRef,
        path: str,
        data: Union[bytes, str, BinaryIO, AsyncIterable[bytes]],
        *,
        mode: Optional[int] = None,
    ) -> None:
        """Writes ``data`` (bytes, text as UTF-8, a binary file, or an iterable of chunks) to
        ``path``, creating parent directories; ``mode`` e.g. ``0o644``. Only bytes and text
        are retried (a stream cannot be replayed)."""
        body: Any = data.encode("utf-8") if isinstance(data, str) else data
        if hasattr(body, "read"):
            body = _file_chunks(cast(BinaryIO, body))
        await self._c._run(core.upload(ref(sandbox), path, body, mode))

    async def download(
        self, sandbox: SandboxRef, path: str, *, offset: int = 0, length: Optional[int] = None
    ) -> bytes:
        """The file's bytes (a range of them with ``offset``/``length``)."""
        return await self._c._run(core.download(ref(sandbox), path, offset, length))

    async def download_to(
        self,
        sandbox: SandboxRef,
        path: str,
        dest: BinaryIO,
        *,
        offset: int = 0,
        length: Optional[int] = None,
    ) -> int:
        """Streams the file into ``dest`` without holding it in memory; returns the size."""
        call = core.download_call(ref(sandbox), path, offset, length)
        resp = await self._c._send(call, stream=True)
        written = 0
        try:
            async for chunk in resp.aiter_raw():
                dest.write(chunk)
                written += len(chunk)
        except httpx.TransportError as e:
            raise StreamCutError(f"the download of {path} was cut: {e}") from e
        finally:
            await resp.aclose()
        return written

    async def list(
        self, sandbox: SandboxRef, path: str = "/", *, depth: Optional[int] = None
    ) -> List[FileInfo]:
        """Entries under ``path`` (``depth`` 1-16 levels); a file lists as itself."""
        return await self._c._run(core.list_files(ref(sandbox), path, depth))

    async def stat(self, sandbox: SandboxRef, path: str) -> FileInfo:
        """One entry (:class:`NotFoundError` when absent). No stat route exists: this lists."""
        return await self._c._run(core.stat(ref(sandbox), path))

    async def exists(self, sandbox: SandboxRef, path: str) -> bool:
        return await self._c._run(core.exists(ref(sandbox), path))

    async def delete(self, sandbox: SandboxRef, path: str) -> None:
        """Deletes a file or an empty directory (a non-empty one is 422)."""
        await self._c._run(core.delete_file(ref(sandbox), path))

    async def make_dir(
        self, sandbox: SandboxRef, path: str, *, mode: Optional[int] = None
    ) -> MadeDir:
        """Makes the directory ``path`` and its missing parents, like ``mkdir -p`` (parents get
        ``0o755``); ``mode`` e.g. ``0o750`` (default ``0o755``). ``created`` is ``True`` when it
        was made, ``False`` when a directory was already there (its mode left as it was). A
        file at ``path`` or among its parents is a :class:`ConflictError` (``details["reason"]``
        ``exists_not_directory`` or ``not_a_directory``). Retried like the other file calls, so
        after a lost answer ``created`` can be ``False`` for the directory this call made."""
        return await self._c._run(core.make_dir(ref(sandbox), path, mode))


class AsyncProcesses:
    """Processes that outlive a connection (``client.processes``, docs/processes.md): started
    in the background with a pid of the control plane's, then listed, attached to from any
    byte offset, fed stdin, signalled, resized and killed, from any client with the key."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def start(
        self,
        sandbox: SandboxRef,
        command: Sequence[str],
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        timeout_seconds: Optional[int] = None,
        pty: Optional[TerminalSize] = None,
        stdin: bool = False,
        tag: Optional[str] = None,
    ) -> Process:
        """Starts ``command`` (argv) in the background; returns it once the command was sent
        to the backend. ``stdin=True`` keeps its stdin open for :meth:`send_stdin` (the pool
        needs ``exec.stdin``, or ``pty``); ``pty`` runs it on a terminal of that size. Never
        retried after it may have reached the server (a retry would start a second one)."""
        req = StartProcessRequest(
            command=list(command),
            env=dict(env) if env else UNSET,
            cwd=_opt(cwd),
            timeout_seconds=_opt(timeout_seconds),
            pty=_opt(pty),
            stdin=True if stdin else UNSET,
            tag=_opt(tag),
        )
        return await self._c._run(core.start_process(ref(sandbox), req))

    async def list(self, sandbox: SandboxRef, *, status: Optional[str] = None) -> List[Process]:
        """The sandbox's processes, running and recently ended, newest first (``status``:
        ``"running"``, ``"exited"`` or ``"failed"`` only)."""
        return await self._c._run(core.list_processes(ref(sandbox), status))

    async def get(self, sandbox: SandboxRef, pid: int) -> Process:
        """One process: its status, exit code once ended, and output counters."""
        return await self._c._run(core.get_process(ref(sandbox), pid))

    def output(
        self,
        sandbox: SandboxRef,
        pid: int,
        *,
        start: int = 0,
        follow: bool = True,
        transport: str = "frames",
    ) -> AsyncProcessOutput:
        """Its output from byte offset ``start`` (0: the oldest kept), following it until it
        ends (then its exit) or, with ``follow=False``, what is kept now. ``transport`` as
        for ``sandboxes.exec_stream``. Use as ``async with … as out: async for event in out``;
        leaving the block detaches, the process goes on."""
        if transport not in ("frames", "sse"):
            raise ValueError("transport must be 'frames' or 'sse'")
        call = core.process_output_call(ref(sandbox), pid, start, follow, transport)
        decoder: Union[ExecFrames, ExecSSE] = (
            ExecFrames(start, not follow) if transport == "frames" else ExecSSE(False, start, not follow)
        )
        return AsyncProcessOutput(self._c, call, decoder)

    async def wait(self, sandbox: SandboxRef, pid: int) -> int:
        """Waits for it to end and returns its exit code (its output is read and dropped; a
        failed process raises :class:`ExecStreamError`)."""
        async with self.output(sandbox, pid, start=0) as out:
            async for _ in out:
                pass
        return out.exit_code if out.exit_code is not None else -1

    async def send_stdin(self, sandbox: SandboxRef, pid: int, data: Union[str, bytes]) -> None:
        """Hands ``data`` (text as UTF-8) to its stdin (or its terminal), in order; more than
        1 MiB goes in several calls. Not retried once it may have reached the server."""
        for part in core.stdin_parts(data):
            await self._c._run(core.send_stdin(ref(sandbox), pid, part))

    async def close_stdin(self, sandbox: SandboxRef, pid: int) -> None:
        """End of input (a second close is fine)."""
        await self._c._run(core.close_stdin(ref(sandbox), pid))

    async def signal(self, sandbox: SandboxRef, pid: int, signal: str) -> None:
        """Sends ``"INT"``, ``"TERM"``, ``"KILL"`` or ``"HUP"`` (``SIG`` prefix allowed) to its
        process group (a terminal's foreground group)."""
        await self._c._run(core.signal_process(ref(sandbox), pid, signal))

    async def resize(self, sandbox: SandboxRef, pid: int, cols: int, rows: int) -> None:
        """A terminal process's new size (1-1000 each)."""
        await self._c._run(core.resize_process(ref(sandbox), pid, cols, rows))

    async def kill(self, sandbox: SandboxRef, pid: int) -> None:
        """``KILL`` if it still runs; one that has ended already is fine."""
        await self._c._run(core.kill_process(ref(sandbox), pid))


class AsyncSnapshots:
    """Snapshots (``client.snapshots``); fork/restore with
    ``sandboxes.create(from_snapshot=…)``."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def create(
        self,
        sandbox: SandboxRef,
        *,
        name: Optional[str] = None,
        idempotency_key: Optional[str] = None,
    ) -> Snapshot:
        """Snapshots the sandbox; it is ``ready`` only once the backend says so
        (:meth:`wait_ready`)."""
        req = SnapshotRequest(name=_opt(name))
        return await self._c._run(core.create_snapshot(ref(sandbox), req, idempotency_key))

    async def get(self, snapshot: Union[str, Snapshot]) -> Snapshot:
        return await self._c._run(core.get_snapshot(ref(snapshot)))

    def list(
        self,
        *,
        sandbox: Optional[SandboxRef] = None,
        project_id: Optional[str] = None,
        page_size: Optional[int] = None,
    ) -> AsyncIterator[Snapshot]:
        """Every snapshot of the key's scope, or of one sandbox."""
        sid = None if sandbox is None else ref(sandbox)
        return self._c._paginate(
            lambda cursor: core.list_snapshots(sid, project_id, page_size, cursor)
        )

    async def wait_ready(self, snapshot: Union[str, Snapshot], *, timeout: float = 60.0) -> Snapshot:
        return await self._c._run(core.wait_snapshot(ref(snapshot), timeout))

    async def delete(self, snapshot: Union[str, Snapshot]) -> Optional[Snapshot]:
        """``None`` when gone; the snapshot (``deleting``) while the backend is still at it."""
        return await self._c._run(core.delete_snapshot(ref(snapshot)))


class AsyncPlacementApi:
    """Placement explanations and dry runs (``client.placement``)."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def explain(self, sandbox: SandboxRef) -> Placement:
        return await self._c._run(core.placement(ref(sandbox)))

    async def dry_run(
        self,
        *,
        project_id: Optional[str] = None,
        template: Optional[str] = None,
        resources: Optional[ResourcesSpec] = None,
        profile: Optional[Profile] = None,
        env: Optional[Mapping[str, str]] = None,
        labels: Optional[Mapping[str, str]] = None,
        ttl_seconds: Optional[int] = None,
        idle_timeout_seconds: Optional[int] = None,
        capabilities: Optional[Sequence[Capability]] = None,
        classification: Optional[Classification] = None,
        region: Optional[str] = None,
        strategy: Optional[Strategy] = None,
        external: Optional[ExternalMode] = None,
        priority: Optional[int] = None,
        from_snapshot: Optional[str] = None,
    ) -> DryRun:
        """Where a sandbox with this create body would go now, creating nothing."""
        req = create_request(
            project_id, template, resources, profile, env, labels, ttl_seconds,
            idle_timeout_seconds, capabilities, classification, region, strategy, external,
            priority, from_snapshot,
        )  # fmt: skip
        return await self._c._run(core.dry_run(req))


class AsyncEvents:
    """Events (``client.events``): the SSE stream, the public events' JSON Schemas, and NATS
    credentials for them."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    @overload
    def stream(
        self,
        *,
        project_id: Optional[str] = None,
        sandbox_id: Optional[str] = None,
        after: Optional[int] = None,
        reconnect: bool = True,
        max_failures: int = 10,
        format: Literal["status"] = "status",
        types: None = None,
    ) -> AsyncEventStream: ...

    @overload
    def stream(
        self,
        *,
        project_id: Optional[str] = None,
        sandbox_id: Optional[str] = None,
        after: Optional[int] = None,
        reconnect: bool = True,
        max_failures: int = 10,
        format: Literal["public"],
        types: Union[None, str, Sequence[str]] = None,
    ) -> AsyncPublicEventStream: ...

    def stream(
        self,
        *,
        project_id: Optional[str] = None,
        sandbox_id: Optional[str] = None,
        after: Optional[int] = None,
        reconnect: bool = True,
        max_failures: int = 10,
        format: Literal["status", "public"] = "status",
        types: Union[None, str, Sequence[str]] = None,
    ) -> Union[AsyncEventStream, AsyncPublicEventStream]:
        """Events after sequence ``after`` (``None``: only new ones), reconnecting and resuming
        after a lost connection unless ``reconnect=False``. ``format="public"`` yields
        :class:`PublicEvent` (every public type; ``types`` narrows to exact types or prefixes
        such as ``"sandbox.exec.*"``); the default ``"status"`` yields :class:`StatusEvent`."""
        if format == "public":
            wanted = core.event_types_filter(types)
            return AsyncPublicEventStream(
                self._c,
                lambda last: core.events_call(project_id, sandbox_id, last, True, wanted),
                after,
                reconnect,
                max_failures,
            )
        if format != "status":
            raise ValueError("format must be 'status' or 'public'")
        if types is not None:
            raise ValueError("types= filters public events: pass format='public' too")
        return AsyncEventStream(
            self._c,
            lambda last: core.events_call(project_id, sandbox_id, last),
            after,
            reconnect,
            max_failures,
        )

    async def schemas(self) -> EventSchemaList:
        """The JSON Schema (draft 2020-12) of the envelope and of every public event type."""
        return await self._c._run(core.event_schemas())

    async def schema(self, event_type: str) -> Dict[str, Any]:
        """The JSON Schema of one public event type (``NotFoundError`` for an unknown one)."""
        return await self._c._run(core.event_schema(event_type))

    async def create_credentials(
        self, *, project_id: Optional[str] = None, ttl_seconds: Optional[int] = None
    ) -> EventCredentials:
        """NATS credentials for the key's organization's (or ``project_id``'s) public events,
        valid ``ttl_seconds`` (60-86400, default 3600); ``.token`` is shown this once. Raises
        :class:`UnsupportedOperationError` (501 ``unsupported_operation``) where the NATS
        server runs no Differently auth callout, as under ``differently dev``: use
        :meth:`stream` there."""
        req = EventCredentialsRequest(project_id=_opt(project_id), ttl_seconds=_opt(ttl_seconds))
        return await self._c._run(core.create_event_credentials(req))

    async def revoke_credentials(self, credentials: Union[str, EventCredentials]) -> None:
        """New connections with them are refused at once; open ones end within 5 minutes."""
        await self._c._run(core.revoke_event_credentials(ref(credentials)))


class AsyncOrgs:
    """Organizations (admin; an org-bound key reads its own)."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def create(self, name: str, *, idempotency_key: Optional[str] = None) -> Org:
        return await self._c._run(core.create_org(CreateOrgRequest(name=name), idempotency_key))

    async def get(self, org: Union[str, Org]) -> Org:
        return await self._c._run(core.get(f"/v1/orgs/{seg(ref(org))}", Org))

    def list(self, *, page_size: Optional[int] = None) -> AsyncIterator[Org]:
        return self._c._paginate(lambda c: core.list_page("/v1/orgs", Org, {}, page_size, c))

    async def update(
        self,
        org: Union[str, Org],
        *,
        name: Optional[str] = None,
        status: Optional[OrgStatus] = None,
    ) -> Org:
        """Rename, or suspend (``status="suspended"``) / reactivate."""
        req = UpdateOrgRequest(name=_opt(name), status=_opt(status))
        return await self._c._run(core.update_org(ref(org), req))

    async def delete(self, org: Union[str, Org]) -> None:
        await self._c._run(core.delete(f"/v1/orgs/{seg(ref(org))}"))


class AsyncProjects:
    """Projects of an organization."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def create(
        self, name: str, *, org_id: Optional[str] = None, idempotency_key: Optional[str] = None
    ) -> Project:
        req = CreateProjectRequest(name=name, org_id=_opt(org_id))
        return await self._c._run(core.create_project(req, idempotency_key))

    async def get(self, project: Union[str, Project]) -> Project:
        return await self._c._run(core.get(f"/v1/projects/{seg(ref(project))}", Project))

    def list(
        self, *, org_id: Optional[str] = None, page_size: Optional[int] = None
    ) -> AsyncIterator[Project]:
        params = {"orgId": org_id}
        return self._c._paginate(
            lambda c: core.list_page("/v1/projects", Project, params, page_size, c)
        )

    async def update(self, project: Union[str, Project], *, name: str) -> Project:
        return await self._c._run(core.update_project(ref(project), UpdateProjectRequest(name)))

    async def delete(self, project: Union[str, Project]) -> None:
        """Refused (409) while the project has live sandboxes or any snapshot."""
        await self._c._run(core.delete(f"/v1/projects/{seg(ref(project))}"))


class AsyncKeys:
    """API keys."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def create(
        self,
        name: str,
        scopes: Sequence[Scope],
        *,
        org_id: Optional[str] = None,
        project_id: Optional[str] = None,
        expires_at: Optional[_dt.datetime] = None,
        idempotency_key: Optional[str] = None,
    ) -> CreatedKey:
        """A new key; ``.key`` is its secret, shown this once."""
        req = CreateKeyRequest(
            name=name,
            scopes=list(scopes),
            org_id=_opt(org_id),
            project_id=_opt(project_id),
            expires_at=_opt(expires_at),
        )
        return await self._c._run(core.create_key(req, idempotency_key))

    async def get(self, key: Union[str, Key]) -> Key:
        return await self._c._run(core.get(f"/v1/keys/{seg(ref(key))}", Key))

    def list(
        self, *, org_id: Optional[str] = None, page_size: Optional[int] = None
    ) -> AsyncIterator[Key]:
        params = {"orgId": org_id}
        return self._c._paginate(lambda c: core.list_page("/v1/keys", Key, params, page_size, c))

    async def revoke(self, key: Union[str, Key]) -> Key:
        return await self._c._run(core.revoke_key(ref(key)))


class AsyncQuotas:
    """Quotas of organizations and projects."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def get_org(self, org_id: str) -> QuotaView:
        return await self._c._run(core.get_quota("orgs", org_id))

    async def set_org(self, org_id: str, quota: Quota) -> QuotaView:
        """Replaces the organization's quota (admin)."""
        return await self._c._run(core.put_quota("orgs", org_id, quota))

    async def get_project(self, project_id: str) -> QuotaView:
        return await self._c._run(core.get_quota("projects", project_id))

    async def set_project(self, project_id: str, quota: Quota) -> QuotaView:
        return await self._c._run(core.put_quota("projects", project_id, quota))


class AsyncPolicies:
    """Placement policies at the global, organization and project levels."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def get_global(self) -> Policy:
        return await self._c._run(core.get_policy("global", None))

    async def set_global(self, policy: Policy) -> Policy:
        return await self._c._run(core.put_policy("global", None, policy))

    async def get_org(self, org_id: str) -> Policy:
        return await self._c._run(core.get_policy("orgs", org_id))

    async def set_org(self, org_id: str, policy: Policy) -> Policy:
        return await self._c._run(core.put_policy("orgs", org_id, policy))

    async def get_project(self, project_id: str) -> Policy:
        return await self._c._run(core.get_policy("projects", project_id))

    async def set_project(self, project_id: str, policy: Policy) -> Policy:
        return await self._c._run(core.put_policy("projects", project_id, policy))


class AsyncPools:
    """Backend pools (admin)."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    def list(self, *, page_size: Optional[int] = None) -> AsyncIterator[Pool]:
        return self._c._paginate(
            lambda c: core.list_page("/v1/admin/pools", Pool, {}, page_size, c)
        )

    async def get(self, name: str) -> Pool:
        return await self._c._run(core.get_pool(name))

    async def create(
        self,
        name: str,
        kind: str,
        *,
        trust: Optional[Trust] = None,
        region: Optional[str] = None,
        max_concurrent: Optional[int] = None,
        isolation: Optional[Isolation] = None,
        cost_per_cpu_hour: Optional[float] = None,
        typical_create_seconds: Optional[float] = None,
        settings: Optional[Mapping[str, Any]] = None,
        idempotency_key: Optional[str] = None,
    ) -> PoolRecord:
        req = PoolRequest(
            name=name,
            kind=kind,
            trust=_opt(trust),
            region=_opt(region),
            max_concurrent=_opt(max_concurrent),
            isolation=_opt(isolation),
            cost_per_cpu_hour=_opt(cost_per_cpu_hour),
            typical_create_seconds=_opt(typical_create_seconds),
            settings=UNSET if settings is None else dict(settings),
        )
        return await self._c._run(core.create_pool(req, idempotency_key))

    async def update(
        self,
        name: str,
        *,
        trust: Optional[Trust] = None,
        region: Optional[str] = None,
        max_concurrent: Optional[int] = None,
        isolation: Optional[Isolation] = None,
        cost_per_cpu_hour: Optional[float] = None,
        typical_create_seconds: Optional[float] = None,
        settings: Optional[Mapping[str, Any]] = None,
    ) -> PoolRecord:
        req = PoolRequest(
            trust=_opt(trust),
            region=_opt(region),
            max_concurrent=_opt(max_concurrent),
            isolation=_opt(isolation),
            cost_per_cpu_hour=_opt(cost_per_cpu_hour),
            typical_create_seconds=_opt(typical_create_seconds),
            settings=UNSET if settings is None else dict(settings),
        )
        return await self._c._run(core.update_pool(name, req))

    async def delete(self, name: str) -> None:
        await self._c._run(core.delete(f"/v1/admin/pools/{seg(name)}"))

    async def get_warm(self, name: str) -> WarmClasses:
        """The pool's warm classes, each with its ``ready`` and ``creating`` instances."""
        return await self._c._run(core.get_warm(name))

    async def set_warm(self, name: str, classes: Sequence[WarmClass]) -> WarmClasses:
        """Replaces the pool's warm classes (``[]`` removes them all); answers as ``get_warm``."""
        return await self._c._run(core.put_warm(name, classes))


class AsyncAudit:
    """The audit log: tenant-scoped list, chain verification, export (admin)."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    def list(
        self,
        *,
        org_id: Optional[str] = None,
        project_id: Optional[str] = None,
        action: Optional[str] = None,
        actor: Optional[str] = None,
        resource: Optional[str] = None,
        since: Optional[_dt.datetime] = None,
        until: Optional[_dt.datetime] = None,
        page_size: Optional[int] = None,
    ) -> AsyncIterator[AuditEvent]:
        params = core.audit_filters(org_id, project_id, action, actor, resource, since, until)
        return self._c._paginate(
            lambda c: core.list_page("/v1/audit", AuditEvent, params, page_size, c)
        )

    async def verify(self) -> Verification:
        return await self._c._run(core.verify_audit())

    async def export(self) -> AsyncIterator[Dict[str, Any]]:
        """Every record and checkpoint, one JSON object per line, streamed (admin)."""
        resp = await self._c._send(core.audit_export_call(), stream=True)
        try:
            async for line in resp.aiter_lines():
                if line.strip():
                    yield core.json_line(line)
        except httpx.TransportError as e:
            raise StreamCutError(f"the audit export was cut: {e}") from e
        finally:
            await resp.aclose()

    async def checkpoint(self) -> Optional[Checkpoint]:
        """Writes a signed checkpoint of every chain head (``None``: nothing new to sign)."""
        return await self._c._run(core.audit_checkpoint())

    async def segment(self, reason: str) -> AuditSegment:
        """Starts a new segment after records signed with a lost key (docs/audit.md); the
        server refuses (409) while every signature verifies."""
        return await self._c._run(core.audit_segment(AuditSegmentRequest(reason=reason)))


class AsyncSecrets:
    """Stored backend credentials (admin): names and fingerprints only, never values."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    def list(self) -> AsyncIterator[Secret]:
        return self._c._paginate(
            lambda c: core.list_page("/v1/admin/secrets", Secret, {}, None, c)
        )

    async def put(self, name: str, value: str) -> Secret:
        """Stores (or replaces) a secret; needs the server's ``DIFFERENTLY_SECRETS_KEY``."""
        return await self._c._run(core.put_secret(name, SecretRequest(value=value)))


WebhookRef = Union[str, Webhook, WebhookWithSecret]


class AsyncWebhooks:
    """A project's webhooks (``client.webhooks``; docs/webhooks.md): signed deliveries of its
    public events. The signing secret is in the answers of :meth:`create` and
    :meth:`rotate_secret` only; check requests with :func:`differently.verify_webhook`."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    def list(
        self, *, project_id: Optional[str] = None, page_size: Optional[int] = None
    ) -> AsyncIterator[Webhook]:
        """The webhooks of the key's organization (its project's, for a project-bound key)."""
        params = {"projectId": project_id}
        return self._c._paginate(
            lambda c: core.list_page("/v1/webhooks", Webhook, params, page_size, c)
        )

    async def create(
        self,
        url: str,
        *,
        project_id: Optional[str] = None,
        event_types: Optional[Sequence[str]] = None,
        description: Optional[str] = None,
        idempotency_key: Optional[str] = None,
    ) -> WebhookWithSecret:
        """A webhook POSTing to ``url`` the events of ``event_types`` (exact types, prefixes
        like ``"sandbox.exec.*"``, or ``"*"``; unset: every type). ``project_id`` defaults to
        the key's project. A URL the operator's rules refuse (loopback, private ranges, plain
        ``http``, unless allowed) is :class:`ValidationError` with ``field == "url"``; a
        server without a secrets key answers :class:`ConflictError`."""
        req = CreateWebhookRequest(
            url=url,
            project_id=_opt(project_id),
            event_types=UNSET if event_types is None else list(event_types),
            description=_opt(description),
        )
        return await self._c._run(core.create_webhook(req, idempotency_key))

    async def get(self, webhook: WebhookRef) -> Webhook:
        return await self._c._run(core.get(f"/v1/webhooks/{seg(ref(webhook))}", Webhook))

    async def update(
        self,
        webhook: WebhookRef,
        *,
        url: Optional[str] = None,
        event_types: Optional[Sequence[str]] = None,
        description: Union[str, None, Unset] = UNSET,
        enabled: Optional[bool] = None,
    ) -> Webhook:
        """``PATCH``: a new URL or filter, a description (``None`` clears it), or
        ``enabled=False`` / ``True`` (re-enabling forgets the failures that disabled it)."""
        req = UpdateWebhookRequest(
            url=_opt(url),
            event_types=UNSET if event_types is None else list(event_types),
            description=description,
            enabled=_opt(enabled),
        )
        return await self._c._run(core.update_webhook(ref(webhook), req))

    async def delete(self, webhook: WebhookRef) -> None:
        """Deletes the webhook and its delivery log."""
        await self._c._run(core.delete(f"/v1/webhooks/{seg(ref(webhook))}"))

    async def rotate_secret(self, webhook: WebhookRef) -> WebhookWithSecret:
        """A new signing secret (shown this once). Until ``previous_secret_expires_at`` the
        replaced one signs next to it, so receivers can switch over without a gap."""
        return await self._c._run(core.rotate_webhook_secret(ref(webhook)))

    def deliveries(
        self, webhook: WebhookRef, *, page_size: Optional[int] = None
    ) -> AsyncIterator[WebhookDelivery]:
        """The webhook's delivery log, newest first."""
        wid = ref(webhook)
        return self._c._paginate(lambda c: core.list_webhook_deliveries(wid, page_size, c))

    async def redeliver(
        self, webhook: WebhookRef, delivery: Union[str, WebhookDelivery]
    ) -> WebhookDelivery:
        """Makes a delivery due now (``pending``), sent again with the same ``webhook-id``."""
        return await self._c._run(core.redeliver_webhook(ref(webhook), ref(delivery)))

