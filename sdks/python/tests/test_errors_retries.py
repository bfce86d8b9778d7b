"""Errors carry status, code, field and request id; network failures say what to do; retries
happen only where safe and honour Retry-After; the API key appears nowhere."""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any, List

import pytest

from differently import (
    APIError,
    AuthenticationError,
    Client,
    ExecStderr,
    ExecStdout,
    InvalidArgumentError,
    NetworkError,
    NetworkTimeoutError,
    RateLimitError,
    ResourcesSpec,
    RetryPolicy,
    UnavailableError,
    ValidationError,
)

from ._proxies import FlakyFront
from .conftest import Server, free_port


def test_validation_error_names_the_field(client: Client) -> None:
    with pytest.raises(ValidationError) as e:
        client.sandboxes.create(resources=ResourcesSpec(cpu=0))
    err = e.value
    assert (err.status, err.code, err.field) == (422, "validation_failed", "resources.cpu")
    assert "between 1 and 256" in err.message and err.request_id
    assert "resources.cpu" in str(err) and "POST /v1/sandboxes" in str(err)
    with pytest.raises(ValidationError) as e2:
        client.sandboxes.create(env={"1BAD": "x"})
    assert e2.value.field == "env.1BAD"
    with pytest.raises(InvalidArgumentError) as e3:
        client.sandboxes.list_page(limit=0)
    assert (e3.value.status, e3.value.field) == (400, "limit")
    assert isinstance(e3.value, APIError)


def test_connection_refused_says_what_to_do() -> None:
    port = free_port()
    c = Client(f"http://127.0.0.1:{port}", "dly_key_x_y", retry=RetryPolicy(max_retries=1, backoff=0.01))
    with pytest.raises(NetworkError) as e:
        c.sandboxes.get("sbx_00000000000000000000000000")
    text = str(e.value)
    assert f"connection refused at http://127.0.0.1:{port}" in text
    assert "is `differently dev`" in text and "DIFFERENTLY_URL" in text
    assert e.value.__cause__ is not None


def test_timeout_is_a_network_timeout() -> None:
    listener = socket.create_server(("127.0.0.1", 0))  # accepts, never answers
    port = listener.getsockname()[1]
    try:
        c = Client(f"http://127.0.0.1:{port}", "k", timeout=0.5, retry=RetryPolicy(max_retries=0))
        with pytest.raises(NetworkTimeoutError):
            c.health()
    finally:
        listener.close()


def _front(server: Server, **kw: Any) -> FlakyFront:
    return FlakyFront(server.url, **kw)


def test_retry_after_is_honoured_on_a_safe_call(server: Server, client: Client, sandbox: Any) -> None:
    path = f"/v1/sandboxes/{sandbox.id}"
    front = _front(server, match=lambda m, p: m == "GET" and p == path, status=503,
                   code="provider_unavailable", headers={"Retry-After": "1"})  # fmt: skip
    try:
        with Client(front.url, server.admin_key) as c:
            started = time.monotonic()
            assert c.sandboxes.get(sandbox).id == sandbox.id
            assert time.monotonic() - started >= 0.95, "waited as Retry-After said"
        assert front.counts[("GET", path)] == 2
    finally:
        front.close()


def test_exec_is_not_retried(server: Server, sandbox: Any) -> None:
    path = f"/v1/sandboxes/{sandbox.id}/exec"
    front = _front(server, match=lambda m, p: p == path, status=503, code="provider_unavailable",
                   headers={"Retry-After": "0"})  # fmt: skip
    try:
        with Client(front.url, server.admin_key) as c:
            with pytest.raises(UnavailableError) as e:
                c.sandboxes.exec(sandbox, ["touch", "once"])
            assert e.value.status == 503 and e.value.retry_after == 0
        assert front.counts[("POST", path)] == 1
    finally:
        front.close()


def test_create_is_retried_with_one_idempotency_key(server: Server, client: Client, tag: str) -> None:
    front = _front(server, match=lambda m, p: m == "POST" and p == "/v1/sandboxes", status=503,
                   code="provider_unavailable", times=2)  # fmt: skip
    try:
        with Client(front.url, server.admin_key, retry=RetryPolicy(backoff=0.05)) as c:
            sbx = c.sandboxes.create(labels={"test": tag})
        assert front.counts[("POST", "/v1/sandboxes")] == 3
        assert len(set(front.idempotency_keys)) == 1, "every attempt carried the same key"
        assert [s.id for s in client.sandboxes.list(label={"test": tag})] == [sbx.id]
        client.sandboxes.delete(sbx)
    finally:
        front.close()


def test_long_retry_after_is_not_slept_through(server: Server) -> None:
    front = _front(server, match=lambda m, p: p == "/v1/orgs", status=429, code="rate_limited",
                   headers={"Retry-After": "120"})  # fmt: skip
    try:
        with Client(front.url, server.admin_key) as c:
            started = time.monotonic()
            with pytest.raises(RateLimitError) as e:
                list(c.orgs.list())
            assert time.monotonic() - started < 5
            assert e.value.retry_after == 120
    finally:
        front.close()


def test_the_key_appears_nowhere(server: Server, caplog: pytest.LogCaptureFixture) -> None:
    secret = server.admin_key
    wrong = secret[:-4] + "XXXX"
    caplog.set_level(logging.DEBUG)
    messages: List[str] = []
    with Client(server.url, secret) as c:
        messages += [repr(c), str(c)]
        sbx = c.sandboxes.wait(c.sandboxes.create(), timeout=30)
        c.sandboxes.exec(sbx, ["true"])
        for ev in c.sandboxes.exec_stream(sbx, ["echo", "x"]):
            messages.append(repr(ev))
        try:
            c.sandboxes.create(resources=ResourcesSpec(cpu=0))
        except APIError as e:
            messages += [str(e), repr(e), repr(e.details)]
        c.sandboxes.delete(sbx)
    with Client(server.url, wrong) as bad:
        with pytest.raises(AuthenticationError) as e2:
            bad.sandboxes.get(sbx)
        messages += [str(e2.value), repr(e2.value), repr(bad)]
    with Client(f"http://127.0.0.1:{free_port()}", secret, retry=RetryPolicy(max_retries=0)) as down:
        with pytest.raises(NetworkError) as e3:
            down.sandboxes.get(sbx)
        messages += [str(e3.value), repr(e3.value), str(e3.value.__cause__)]
    assert caplog.records, "httpx logged requests at DEBUG"
    everything = caplog.text + "\n".join(messages)
    key_secret = secret.rsplit("_", 1)[1]
    assert key_secret not in everything and wrong.rsplit("_", 1)[1] not in everything


def test_exec_waits_past_the_client_timeout(server: Server, sandbox: Any) -> None:
    # A buffered exec answers when the command ends: its wait follows the exec's own limit,
    # not the client's default timeout.
    with Client(server.url, server.admin_key, timeout=1.0) as c:
        result = c.sandboxes.exec(sandbox, ["sh", "-c", "sleep 2; echo done"])
        assert (result.exit_code, result.stdout) == (0, "done\n")
        with c.sandboxes.exec_stream(sandbox, ["sh", "-c", "sleep 2; echo streamed"]) as s:
            chunks = b"".join(ev.data for ev in s if isinstance(ev, (ExecStdout, ExecStderr)))
        assert chunks == b"streamed\n" and s.exit_code == 0
