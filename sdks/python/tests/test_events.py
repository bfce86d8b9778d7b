"""``GET /v1/events``: events arrive, resume from a sequence, and survive a lost connection."""

from __future__ import annotations

import threading
import time
from typing import Any, List, Optional

import pytest

from differently import AsyncClient, Client, StatusEvent

from ._proxies import CuttingProxy
from .conftest import Server, recording_http


def _collect(
    client: Client, sandbox_id: str, count: int, after: Optional[int] = None
) -> List[StatusEvent]:
    got: List[StatusEvent] = []
    with client.events.stream(sandbox_id=sandbox_id, after=after) as stream:
        for ev in stream:
            got.append(ev)
            if len(got) == count:
                break
    return got


def _in_status_order(evs: List[StatusEvent]) -> List[str]:
    # The stream's order is its sequence; one sandbox's events may be published out of
    # statusVersion order (README, KNOWN-ISSUES), so the order of changes is statusVersion's.
    return [e.status for e in sorted(evs, key=lambda e: e.status_version)]


def test_events_arrive_in_order_and_resume(client: Client, tag: str) -> None:
    sbx = client.sandboxes.create(labels={"test": tag})
    client.sandboxes.wait(sbx, "running", timeout=30)
    client.sandboxes.pause(sbx)
    client.sandboxes.resume(sbx)
    # From the beginning of the stream: every change of this sandbox, in order.
    evs = _collect(client, sbx.id, 3, after=0)
    assert _in_status_order(evs) == ["provisioning", "running", "paused"]
    assert all(e.sandbox_id == sbx.id and e.org_id == sbx.org_id for e in evs)
    assert [e.seq for e in evs] == sorted(e.seq for e in evs)
    # Resuming after the last one delivered gives exactly what came next.
    rest = _collect(client, sbx.id, 1, after=evs[-1].seq)
    assert [e.status for e in rest] == ["running"] and rest[0].seq > evs[-1].seq
    client.sandboxes.delete(sbx)


def test_new_events_only_without_a_cursor(client: Client, tag: str) -> None:
    sbx = client.sandboxes.wait(client.sandboxes.create(labels={"test": tag}), timeout=30)
    got: List[StatusEvent] = []

    def listen() -> None:
        got.extend(_collect(client, sbx.id, 1))

    t = threading.Thread(target=listen)
    t.start()
    time.sleep(0.5)  # the stream is open before the change
    client.sandboxes.pause(sbx)
    t.join(30)
    assert [e.status for e in got] == ["paused"], "old events are not replayed without a cursor"
    client.sandboxes.delete(sbx)


def test_reconnects_and_resumes_after_a_cut(server: Server, tag: str) -> None:
    proxy = CuttingProxy(server.url)
    http = recording_http(server)
    try:
        with Client(proxy.url, server.admin_key, http_client=http) as c:
            sbx = c.sandboxes.wait(c.sandboxes.create(labels={"test": tag}), timeout=30)
            got: List[StatusEvent] = []
            stream = c.events.stream(sandbox_id=sbx.id, after=0)
            it = iter(stream)
            while len(got) < 2:
                got.append(next(it))
            proxy.cut()  # the connection is lost mid-stream …
            c.sandboxes.pause(sbx)  # … and changes happen meanwhile
            c.sandboxes.resume(sbx)
            while len(got) < 4:
                got.append(next(it))
            stream.close()
            assert stream.reconnects >= 1 and proxy.connections >= 2
            assert _in_status_order(got) == ["provisioning", "running", "paused", "running"]
            assert len({e.seq for e in got}) == len(got), "no event twice"
            c.sandboxes.delete(sbx)
    finally:
        proxy.close()
        http.close()


@pytest.mark.anyio
async def test_async_events_and_reconnect(server: Server, tag: str) -> None:
    proxy = CuttingProxy(server.url)
    try:
        async with AsyncClient(proxy.url, server.admin_key) as c:
            sbx = await c.sandboxes.create(labels={"test": tag})
            await c.sandboxes.wait(sbx, timeout=30)
            got: List[StatusEvent] = []
            async with c.events.stream(sandbox_id=sbx.id, after=0) as stream:
                async for ev in stream:
                    got.append(ev)
                    if len(got) == 2:
                        proxy.cut()
                        await c.sandboxes.pause(sbx)
                    if len(got) == 3:
                        break
            assert _in_status_order(got) == ["provisioning", "running", "paused"]
            assert stream.reconnects >= 1
            await c.sandboxes.delete(sbx)
    finally:
        proxy.close()


def test_no_reconnect_raises(server: Server, tag: str) -> None:
    from differently import NetworkError

    proxy = CuttingProxy(server.url)
    try:
        with Client(proxy.url, server.admin_key) as c:
            sbx = c.sandboxes.create(labels={"test": tag})
            stream = c.events.stream(sandbox_id=sbx.id, after=0, reconnect=False)
            it = iter(stream)
            next(it)
            proxy.cut()
            with pytest.raises(NetworkError):
                for _ in range(100):
                    next(it)
            c.sandboxes.delete(sbx)
    finally:
        proxy.close()
