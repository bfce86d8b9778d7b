"""The interactive terminal (``GET /v1/sandboxes/{id}/pty``, a WebSocket) against a real
``differently dev``: devhost runs the program on a real pseudo-terminal on this host."""

from __future__ import annotations

import logging
import time
from typing import Any, List

import pytest

from differently import (
    AsyncClient,
    AsyncPty,
    Client,
    InvalidArgumentError,
    NotFoundError,
    Pty,
)

from .conftest import Server


def _read_until(term: Pty, needle: bytes, times: int = 1, timeout: float = 20.0) -> bytes:
    """Output until ``needle`` appeared ``times`` times (the terminal echoes what is typed, so
    a needle that is also in the typed line must be seen once more than it was typed)."""
    seen = b""
    deadline = time.monotonic() + timeout
    while seen.count(needle) < times:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no {needle!r} in the terminal output: {seen!r}")
        try:
            chunk = term.read(timeout=left)
        except TimeoutError:
            raise AssertionError(f"no {needle!r} in the terminal output: {seen!r}") from None
        if not chunk:
            raise AssertionError(f"the program exited before {needle!r}: {seen!r}")
        seen += chunk
    return seen


def _record(client: Client, server: Server, sandbox: Any, opened: int) -> None:
    """The WebSocket does not go through httpx, whose hook records routes for the coverage
    test: record it once the server's audit log shows these terminal opens."""
    records = list(client.audit.list(resource=sandbox.id, action="sandbox.pty"))
    assert len(records) == opened, records
    server.sent.append(("GET", f"/v1/sandboxes/{sandbox.id}/pty"))


def test_shell_echo_resize_exit_code(
    client: Client, sandbox: Any, server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with client.sandboxes.pty(sandbox, ["sh"], cols=80, rows=24) as term:
        assert term.session_id is not None and term.session_id.startswith("pty_")
        assert term.grace_seconds == 30
        term.write(b"echo hi\n")
        # "echo hi" comes back as typed (the terminal echoes), then the command's own "hi"
        # (after a prompt, whose text is the shell's business).
        out = _read_until(term, b"hi\r\n", times=2)
        assert out.count(b"echo hi\r\n") == 1 and out.count(b"hi\r\n") == 2
        term.write(b"stty size\n")
        # The prompt may come between the typed line's echo and the output: match the output alone.
        assert b"24 80\r\n" in _read_until(term, b"24 80\r\n")
        term.resize(132, 40)
        term.write("stty size\n")
        assert b"40 132\r\n" in _read_until(term, b"40 132\r\n")
        term.write(b"exit 3\n")
        assert term.wait(timeout=20) == 3
        assert term.exit_code == 3
        # Output wait() passed over stays readable: the echo of the typed "exit 3".
        rest = b"".join(iter(term))
        assert b"exit 3" in rest and term.read() == b""
    # The handshake (the API key in a header) is never logged, even at DEBUG.
    assert server.admin_key not in caplog.text
    with pytest.raises(ValueError, match="cols"):
        term.resize(0, 10)
    with pytest.raises(ValueError, match="signal"):
        term.signal("STOP")
    _record(client, server, sandbox, 1)


def test_reattach_gets_the_missed_output(client: Client, sandbox: Any) -> None:
    with client.sandboxes.pty(sandbox, ["sh"]) as first:
        first.write(b"echo before-$((40+2))\n")
        _read_until(first, b"before-42")
        session = first.session_id
    # Hung up: the shell keeps running for the grace period; what it prints is kept.
    with client.sandboxes.pty(sandbox, session=session) as again:
        assert again.session_id == session
        again.write(b"echo after-$((6*7))\n")
        _read_until(again, b"after-42")
        again.write(b"exit 4\n")
        assert again.wait(timeout=20) == 4
    with pytest.raises(ValueError, match="alone"):
        client.sandboxes.pty(sandbox, ["sh"], session=session)


def test_refusals_before_the_upgrade(client: Client, sandbox: Any) -> None:
    with pytest.raises(InvalidArgumentError) as e:
        client.sandboxes.pty(sandbox, ["sh"], cols=0).open()
    assert e.value.status == 400 and e.value.field == "cols"
    with pytest.raises(NotFoundError):
        client.sandboxes.pty("sbx_00000000000000000000000000").open()


@pytest.mark.anyio
async def test_async_signal_and_iteration(aclient: AsyncClient, sandbox: Any) -> None:
    term = aclient.sandboxes.pty(sandbox, ["sh", "-c", "echo started; exec sleep 30"])
    assert isinstance(term, AsyncPty)
    async with term:
        seen = b""
        async for chunk in term:
            seen += chunk
            if b"started" in seen:
                break
        await term.signal("INT")  # as ^C: the sleep dies of SIGINT (2)
        assert await term.wait(timeout=20) == 128 + 2
        chunks: List[bytes] = [c async for c in term]
        assert await term.read() == b"" and all(chunks)
