"""Public events (docs/events.md): ``GET /v1/events?format=public[&types=…]`` as typed
:class:`PublicEvent`, resumable and surviving a cut; the served JSON Schemas; and the NATS
credentials routes, which ``differently dev`` answers 501 (no auth callout)."""

from __future__ import annotations

import json
import threading
from typing import List, Optional

import pytest

from differently import (
    AsyncClient,
    Client,
    InvalidArgumentError,
    NotFoundError,
    PublicEvent,
    UnsupportedOperationError,
)
from differently.models import PUBLIC_EVENT_VERSION

from ._proxies import CuttingProxy
from .conftest import Server, recording_http

ALL_TYPES = {
    "sandbox.status.changed",
    "sandbox.operation.requested",
    "sandbox.operation.finished",
    "sandbox.operation.failed",
    "sandbox.exec.started",
    "sandbox.exec.finished",
    "sandbox.file.written",
    "snapshot.created",
    "snapshot.failed",
    "snapshot.deleted",
    "placement.decided",
    "webhook.disabled",
}


def _collect(
    client: Client,
    sandbox_id: str,
    want: int,
    *,
    after: Optional[int] = 0,
    types: Optional[List[str]] = None,
) -> List[PublicEvent]:
    got: List[PublicEvent] = []
    with client.events.stream(sandbox_id=sandbox_id, after=after, format="public", types=types) as s:
        for ev in s:
            got.append(ev)
            if len(got) == want:
                break
    return got


def _statuses(evs: List[PublicEvent]) -> List[str]:
    changes = [e for e in evs if e.type == "sandbox.status.changed"]
    return [str(e.data["status"]) for e in sorted(changes, key=lambda e: int(e.data["statusVersion"]))]


def test_public_stream_yields_typed_events_and_resumes(client: Client, tag: str) -> None:
    sbx = client.sandboxes.wait(client.sandboxes.create(labels={"test": tag}), timeout=30)
    client.sandboxes.pause(sbx)
    # Status changes only: provisioning, running, paused.
    evs = _collect(client, sbx.id, 3, types=["sandbox.status.changed"])
    assert _statuses(evs) == ["provisioning", "running", "paused"]
    for ev in evs:
        assert ev.version == PUBLIC_EVENT_VERSION and ev.type == "sandbox.status.changed"
        assert ev.sandbox_id == sbx.id and ev.org_id == sbx.org_id and ev.project_id == sbx.project_id
        assert ev.seq is not None and ev.id and ev.time.tzinfo is not None
        assert ev.cause in {"user", "backend", "admin", "reconciler"}
        assert ev.raw["data"] == ev.data
    assert [e.seq for e in evs] == sorted(e.seq for e in evs if e.seq is not None)
    # The pause was asked for with the admin key: an operation event names it. The API
    # publishes `requested` and the worker `finished`, so the stream may hold them in either
    # order (docs/events.md, "Order"): ask for the one this checks.
    ops = _collect(client, sbx.id, 1, types=["sandbox.operation.requested"])
    assert ops[0].type == "sandbox.operation.requested" and ops[0].data["operation"] == "pause"
    assert ops[0].cause in {"user", "admin"}
    assert ops[0].actor is not None and ops[0].actor.key_id.startswith("key_")
    # Resuming after the last one delivered gives exactly what came next.
    client.sandboxes.resume(sbx)
    last = max(e.seq for e in evs if e.seq is not None)
    rest = _collect(client, sbx.id, 1, after=last, types=["sandbox.status.changed"])
    assert _statuses(rest) == ["running"] and (rest[0].seq or 0) > last
    client.sandboxes.delete(sbx)


def test_types_filter_is_sent_and_applied(client: Client, server: Server, tag: str) -> None:
    sbx = client.sandboxes.wait(client.sandboxes.create(labels={"test": tag}), timeout=30)
    got: List[PublicEvent] = []

    def listen() -> None:
        got.extend(_collect(client, sbx.id, 2, after=None, types=["sandbox.operation.*"]))

    t = threading.Thread(target=listen)
    t.start()
    threading.Event().wait(0.5)  # the stream is open before the changes
    client.sandboxes.pause(sbx)  # a status change (filtered out) and operation events
    t.join(30)
    assert not t.is_alive(), "no operation events arrived"
    # Requested (by the API) and finished (by the worker), in either order on the stream.
    assert {e.type for e in got} == {"sandbox.operation.requested", "sandbox.operation.finished"}
    # One comma-separated parameter on the wire, as the API reads it.
    http = recording_http(server)
    with Client(server.url, server.admin_key, http_client=http) as c:
        seen: List[str] = []
        http.event_hooks["request"].append(lambda r: seen.append(str(r.url)))
        next(iter(c.events.stream(sandbox_id=sbx.id, after=0, format="public",
                                  types=["sandbox.status.changed", "sandbox.operation.*"])))  # fmt: skip
    http.close()
    assert "format=public" in seen[0] and "types=sandbox.status.changed%2Csandbox.operation.%2A" in seen[0]
    client.sandboxes.delete(sbx)


def test_stream_arguments_are_checked_before_sending(client: Client) -> None:
    with pytest.raises(ValueError, match="format='public'"):
        client.events.stream(types=["sandbox.status.changed"])  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="format"):
        client.events.stream(format="nope")  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="one type"):
        client.events.stream(format="public", types=["a,b"])


def test_an_unknown_type_filter_is_the_servers_400(client: Client) -> None:
    with pytest.raises(InvalidArgumentError) as e:
        next(iter(client.events.stream(format="public", types=["no.such.type"], after=0)))
    assert e.value.status == 400 and e.value.code == "invalid_argument"


def test_public_stream_reconnects_after_a_cut(server: Server, tag: str) -> None:
    proxy = CuttingProxy(server.url)
    http = recording_http(server)
    try:
        with Client(proxy.url, server.admin_key, http_client=http) as c:
            sbx = c.sandboxes.wait(c.sandboxes.create(labels={"test": tag}), timeout=30)
            stream = c.events.stream(sandbox_id=sbx.id, after=0, format="public",
                                     types=["sandbox.status.changed"])  # fmt: skip
            it = iter(stream)
            got = [next(it), next(it)]
            proxy.cut()
            c.sandboxes.pause(sbx)
            got.append(next(it))
            stream.close()
            assert stream.reconnects >= 1 and proxy.connections >= 2
            assert _statuses(got) == ["provisioning", "running", "paused"]
            assert len({e.id for e in got}) == 3, "no event twice"
            c.sandboxes.delete(sbx)
    finally:
        proxy.close()
        http.close()


@pytest.mark.anyio
async def test_async_public_stream(aclient: AsyncClient, tag: str) -> None:
    sbx = await aclient.sandboxes.create(labels={"test": tag})
    await aclient.sandboxes.wait(sbx, timeout=30)
    got: List[PublicEvent] = []
    async with aclient.events.stream(sandbox_id=sbx.id, after=0, format="public",
                                     types="sandbox.status.changed") as stream:  # fmt: skip
        async for ev in stream:
            got.append(ev)
            if len(got) == 2:
                break
    assert _statuses(got) == ["provisioning", "running"]
    await aclient.sandboxes.delete(sbx)


def test_event_schemas(client: Client) -> None:
    listed = client.events.schemas()
    assert listed.version == PUBLIC_EVENT_VERSION
    assert {i.type for i in listed.items} == ALL_TYPES
    assert set(listed.envelope["required"]) >= {"version", "id", "type", "time", "data"}
    one = client.events.schema("sandbox.status.changed")
    assert one["$schema"].startswith("https://json-schema.org/draft/2020-12")
    by_type = {i.type: i.schema for i in listed.items}
    assert one == by_type["sandbox.status.changed"]
    assert "statusVersion" in one["properties"]["data"]["properties"]
    with pytest.raises((NotFoundError, InvalidArgumentError)) as e:
        client.events.schema("no.such.type")
    assert e.value.status in (400, 404)


@pytest.mark.anyio
async def test_async_event_schemas(aclient: AsyncClient) -> None:
    assert len((await aclient.events.schemas()).items) == len(ALL_TYPES)
    assert (await aclient.events.schema("snapshot.created"))["type"] == "object"


def test_event_credentials_are_501_without_an_auth_callout(client: Client) -> None:
    # differently dev has an in-process bus and no NATS auth callout: both routes say so with
    # the stable code, which the SDK maps to its typed error.
    with pytest.raises(UnsupportedOperationError) as e:
        client.events.create_credentials(ttl_seconds=600)
    assert e.value.status == 501 and e.value.code == "unsupported_operation"
    assert "callout" in e.value.message and e.value.request_id
    with pytest.raises(UnsupportedOperationError) as e:
        client.events.revoke_credentials("evc_" + "0" * 26)
    assert e.value.status == 501 and e.value.code == "unsupported_operation"


@pytest.mark.anyio
async def test_async_event_credentials_are_501(aclient: AsyncClient) -> None:
    with pytest.raises(UnsupportedOperationError) as e:
        await aclient.events.create_credentials()
    assert e.value.code == "unsupported_operation"
    with pytest.raises(UnsupportedOperationError):
        await aclient.events.revoke_credentials("evc_" + "1" * 26)


def test_an_envelope_of_another_major_version_is_refused() -> None:
    from differently import ProtocolError
    from differently._core import sse_public_event

    event = {
        "version": 1, "id": "e", "type": "some.future.type", "time": "2026-01-01T00:00:00Z",
        "orgId": "org_x", "projectId": "prj_x", "sandboxId": None, "cause": "something-new",
        "actor": None, "data": {"new": True}, "addedLater": 1,
    }  # fmt: skip
    # Unknown types, causes and fields of the same major version pass through ("ignore what
    # you do not know"); another major version is refused rather than misread.
    ev = sse_public_event("7", json.dumps(event).encode())
    assert ev.seq == 7 and str(ev.type) == "some.future.type" and ev.raw["addedLater"] == 1
    with pytest.raises(ProtocolError, match="version 2"):
        sse_public_event("8", json.dumps({**event, "version": 2}).encode())
    with pytest.raises(ProtocolError, match="sequence"):
        sse_public_event("x", json.dumps(event).encode())
