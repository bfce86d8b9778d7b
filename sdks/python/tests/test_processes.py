"""Processes against a real ``differently dev`` (devhost: ``exec.stdin``, terminals, signals to
the process group): start in the background, list and get, attach from an offset in both
formats, detach without ending it, stdin, close, signal, resize, kill, and the async client."""

from __future__ import annotations

import time
from typing import Any, List

import pytest

from differently import (
    AsyncClient,
    Client,
    ConflictError,
    ExecExit,
    ExecStderr,
    ExecStdout,
    ExecStreamError,
    NotFoundError,
    Process,
    TerminalSize,
)

#: Generous: the machine running the suite may be busy.
DEADLINE = 60.0


def wait_until_ended(client: Client, sandbox: Any, pid: int) -> Process:
    deadline = time.monotonic() + DEADLINE
    while True:
        proc = client.processes.get(sandbox, pid)
        if proc.status != "running":
            return proc
        assert time.monotonic() < deadline, f"process {pid} still runs: {proc}"
        time.sleep(0.1)


@pytest.mark.parametrize("transport", ["frames", "sse"])
def test_started_process_runs_to_its_exit_and_output_is_kept(
    client: Client, sandbox: Any, transport: str
) -> None:
    proc = client.processes.start(
        sandbox, ["sh", "-c", "echo out; echo err >&2; exit 3"], tag="t1", cwd="/tmp"
    )
    assert proc.pid > 0 and proc.tag == "t1" and proc.command[0] == "sh"
    with client.processes.output(sandbox, proc.pid, transport=transport) as out:
        events: List[Any] = list(out)
    stdout = b"".join(e.data for e in events if isinstance(e, ExecStdout))
    stderr = b"".join(e.data for e in events if isinstance(e, ExecStderr))
    assert (stdout, stderr) == (b"out\n", b"err\n")
    assert isinstance(events[-1], ExecExit) and events[-1].exit_code == 3
    assert out.exit_code == 3 and out.offset == len(b"out\nerr\n")
    ended = client.processes.get(sandbox, proc.pid)
    assert (ended.status, ended.exit_code, ended.output_bytes) == ("exited", 3, 8)
    assert proc.pid in [p.pid for p in client.processes.list(sandbox, status="exited")]
    assert proc.pid not in [p.pid for p in client.processes.list(sandbox, status="running")]


def test_detach_reattach_from_an_offset_then_stdin_and_close(client: Client, sandbox: Any) -> None:
    proc = client.processes.start(sandbox, ["sh", "-c", "echo ready; cat; echo done"], stdin=True)
    assert proc.stdin_open
    # Attach, read the first line, hang up: the process goes on.
    with client.processes.output(sandbox, proc.pid) as out:
        first = next(iter(out))
    assert isinstance(first, ExecStdout) and first.data == b"ready\n"
    assert out.offset == 6
    assert client.processes.get(sandbox, proc.pid).status == "running"
    client.processes.send_stdin(sandbox, proc.pid, "hello\n")
    client.processes.send_stdin(sandbox, proc.pid, b"\x00\xffbytes\n")
    client.processes.close_stdin(sandbox, proc.pid)
    client.processes.close_stdin(sandbox, proc.pid)  # a second close is fine
    with client.processes.output(sandbox, proc.pid, start=6) as out:
        rest = b"".join(e.data for e in out if isinstance(e, ExecStdout))
    assert rest == b"hello\n\x00\xffbytes\ndone\n"
    assert out.exit_code == 0
    with pytest.raises(ConflictError):
        client.processes.send_stdin(sandbox, proc.pid, "late\n")


def test_without_follow_the_kept_output_then_the_end(client: Client, sandbox: Any) -> None:
    proc = client.processes.start(sandbox, ["sh", "-c", "echo one; sleep 60"])
    deadline = time.monotonic() + DEADLINE
    while client.processes.get(sandbox, proc.pid).output_bytes < 4:
        assert time.monotonic() < deadline, "no output"
        time.sleep(0.1)
    with client.processes.output(sandbox, proc.pid, follow=False) as out:
        events = list(out)
    assert b"".join(e.data for e in events if isinstance(e, ExecStdout)) == b"one\n"
    assert out.exit is None, "it still runs: no exit"
    client.processes.kill(sandbox, proc.pid)
    ended = wait_until_ended(client, sandbox, proc.pid)
    assert ended.exit_code == 128 + 9
    client.processes.kill(sandbox, proc.pid)  # an ended one is fine


def test_signal_ends_it_with_128_plus_n(client: Client, sandbox: Any) -> None:
    proc = client.processes.start(sandbox, ["sleep", "60"])
    client.processes.signal(sandbox, proc.pid, "SIGTERM")
    assert client.processes.wait(sandbox, proc.pid) == 128 + 15
    with pytest.raises(ValueError):
        client.processes.signal(sandbox, proc.pid, "USR1")


def test_terminal_process_resize_and_conflicts(client: Client, sandbox: Any) -> None:
    proc = client.processes.start(
        sandbox, ["sh", "-c", "read x; stty size; echo got $x"], pty=TerminalSize(cols=80, rows=24)
    )
    assert proc.pty
    client.processes.resize(sandbox, proc.pid, 100, 30)
    client.processes.send_stdin(sandbox, proc.pid, "hi\n")
    with client.processes.output(sandbox, proc.pid) as out:
        text = b"".join(e.data for e in out if isinstance(e, ExecStdout)).decode()
    assert "30 100" in text and "got hi" in text, text
    plain = client.processes.start(sandbox, ["true"])
    with pytest.raises(ConflictError):
        client.processes.resize(sandbox, plain.pid, 80, 24)


def test_unknown_pid_is_not_found(client: Client, sandbox: Any) -> None:
    with pytest.raises(NotFoundError):
        client.processes.get(sandbox, 4_000_000_000)
    with pytest.raises(NotFoundError):
        with client.processes.output(sandbox, 4_000_000_000) as out:
            list(out)


@pytest.mark.anyio
async def test_async_client_starts_and_attaches(aclient: AsyncClient, sandbox: Any) -> None:
    proc = await aclient.processes.start(sandbox, ["sh", "-c", "printf abc; exit 7"])
    got = b""
    async with aclient.processes.output(sandbox, proc.pid, transport="sse") as out:
        async for ev in out:
            if isinstance(ev, ExecStdout):
                got += ev.data
    assert (got, out.exit_code, out.offset) == (b"abc", 7, 3)
    assert proc.pid in [p.pid for p in await aclient.processes.list(sandbox)]
    assert (await aclient.processes.get(sandbox, proc.pid)).exit_code == 7
    try:
        await aclient.processes.wait(sandbox, proc.pid)
    except ExecStreamError:
        pytest.fail("an exited process is no stream error")


def _frame(kind: int, payload: bytes) -> bytes:
    return bytes([kind, 0, 0, 0]) + len(payload).to_bytes(4, "big") + payload


def test_decoders_count_the_offset_and_may_end_without_an_exit() -> None:
    from differently._streams import ExecFrames, ExecSSE

    frames = ExecFrames(start=10, open_ended=True)
    body = _frame(1, b"abc") + _frame(0, b"") + _frame(2, b"de")
    for i in range(len(body)):  # split anywhere
        frames.feed(body[i : i + 1])
    assert frames.offset == 15
    frames.finish()  # no exit, and that is the end of what is kept
    cut = ExecFrames(open_ended=True)
    cut.feed(_frame(1, b"abc")[:5])
    with pytest.raises(Exception, match="inside a frame"):
        cut.finish()
    sse = ExecSSE(False, start=3, open_ended=True)
    sse.feed(b'id: 7\nevent: stdout\ndata: {"data": "h\\u00e9y"}\n\n')
    assert sse.offset == 7
    sse.finish()
    with pytest.raises(ExecStreamError, match="not_found"):
        ExecSSE(False).feed(b'event: error\ndata: {"error": {"code": "not_found", "message": "gone"}}\n\n')
