"""Fixtures: one real ``differently dev`` per test session (devhost pool: real processes on this
host), on a free loopback port with a temporary key file and sandbox root, stopped afterwards.

The binary is ``$DIFFERENTLY_BIN`` or ``<repo>/target/debug/differently``; without one the
session fails (never skips) with what to run.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import httpx
import pytest

from differently import AsyncClient, Client

REPO = Path(__file__).resolve().parents[3]


def find_binary() -> Path:
    env = os.environ.get("DIFFERENTLY_BIN")
    candidate = Path(env) if env else REPO / "target" / "debug" / "differently"
    if not candidate.is_file() or not os.access(candidate, os.X_OK):
        pytest.fail(
            f"no differently binary at {candidate}: run `cargo build -p differently` in {REPO} "
            "(or set DIFFERENTLY_BIN to one)",
            pytrace=False,
        )
    return candidate


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    url: str
    admin_key: str = field(repr=False)
    process: "subprocess.Popen[bytes]" = field(repr=False)
    log: Path = field(repr=False)
    # The served OpenAPI document, and every (method, path) the SDK sent during the session.
    openapi: Dict[str, Any] = field(default_factory=dict, repr=False)
    sent: List[Tuple[str, str]] = field(default_factory=list, repr=False)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"


#: The session server's settings: a secrets key, and webhooks allowed to reach a receiver on
#: 127.0.0.1 over http (both refused by default).
WEBHOOK_RECEIVER_ENV = {
    "DIFFERENTLY_SECRETS_KEY": os.urandom(32).hex(),
    "DIFFERENTLY_WEBHOOKS_ALLOW_PRIVATE": "true",
    "DIFFERENTLY_WEBHOOKS_ALLOW_HTTP": "true",
}


def start_server(binary: Path, workdir: Path, env: Optional[Dict[str, str]] = None) -> Server:
    port = free_port()
    key_file = workdir / "admin-key"
    log = workdir / "dev.log"
    root = workdir / "sandboxes"
    root.mkdir(exist_ok=True)
    out = open(log, "wb")
    proc = subprocess.Popen(
        [str(binary), "dev", "--listen", f"127.0.0.1:{port}", "--key-file", str(key_file),
         "--root", str(root)],
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn"), **(env or {})},
    )  # fmt: skip
    out.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"differently dev exited ({proc.returncode}):\n{log.read_text()}")
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200 and key_file.exists():
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"differently dev did not become ready:\n{log.read_text()}")
        time.sleep(0.1)
    key = key_file.read_text().strip()
    assert re.fullmatch(r"dly_\w+", key), "the key file does not hold an API key"
    return Server(url, key, proc, log)


def stop_server(server: Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    binary = find_binary()
    workdir = Path(tempfile.mkdtemp(prefix="differently-sdk-py-"))
    # A secrets key so the stored-secrets routes and webhooks work (they refuse without one);
    # webhooks may point at plain http on loopback so the tests' receiver on 127.0.0.1 gets
    # real deliveries (docs/webhooks.md; a server without these refuses such URLs: tested).
    srv = start_server(binary, workdir, WEBHOOK_RECEIVER_ENV)
    srv.openapi = httpx.get(f"{srv.url}/v1/openapi.json").json()
    try:
        yield srv
    finally:
        stop_server(srv)
        _check_routes(srv)
        shutil.rmtree(workdir, ignore_errors=True)


def _route_regex(path: str) -> "re.Pattern[str]":
    return re.compile("^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(path)) + "$")


def _check_routes(srv: Server) -> None:
    """Every request the SDK sent in this session is an operation the OpenAPI document lists."""
    ops = [
        (method.upper(), _route_regex(path))
        for path, item in srv.openapi.get("paths", {}).items()
        for method in item
    ]
    unknown = sorted(
        {(m, p) for m, p in srv.sent if not any(m == om and rx.match(p) for om, rx in ops)}
    )
    assert not unknown, f"the SDK called routes the OpenAPI document does not list: {unknown}"


def recording_http(server: Server) -> httpx.Client:
    def record(request: httpx.Request) -> None:
        server.sent.append((request.method, request.url.path))

    return httpx.Client(event_hooks={"request": [record]})


def recording_async_http(server: Server) -> httpx.AsyncClient:
    async def record(request: httpx.Request) -> None:
        server.sent.append((request.method, request.url.path))

    return httpx.AsyncClient(event_hooks={"request": [record]})


@pytest.fixture
def client(server: Server) -> Iterator[Client]:
    http = recording_http(server)
    with Client(server.url, server.admin_key, http_client=http) as c:
        yield c
    http.close()


@pytest.fixture
async def aclient(server: Server) -> Any:
    http = recording_async_http(server)
    async with AsyncClient(server.url, server.admin_key, http_client=http) as c:
        yield c
    await http.aclose()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def tag() -> str:
    """A label value unique to one test, so list filters see only its sandboxes."""
    return uuid.uuid4().hex[:12]


@pytest.fixture
def sandbox(client: Client, tag: str) -> Iterator[Any]:
    """A running sandbox, deleted after the test."""
    sbx = client.sandboxes.create(labels={"test": tag})
    sbx = client.sandboxes.wait(sbx, "running", timeout=30)
    yield sbx
    try:
        client.sandboxes.delete(sbx)
    except Exception:
        pass


def pytest_collection_modifyitems(items: List[pytest.Item]) -> None:
    """The route-coverage test reads what every other test sent: it goes last."""
    last = [i for i in items if "test_zz_route_coverage" in i.nodeid]
    items[:] = [i for i in items if i not in last] + last
