"""Webhooks (docs/webhooks.md) against the session's ``differently dev``, which allows plain
http to loopback (conftest): real deliveries to a receiver this test runs on 127.0.0.1, their
Standard Webhooks signatures checked by hand and by :func:`verify_webhook`, the delivery log,
redelivery, secret rotation (both secrets sign during the overlap), and CRUD. A server with the
default rules refuses a loopback URL (422, field ``url``); that is checked on a second server."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import shutil
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

import pytest

from differently import (
    AsyncClient,
    Client,
    ConflictError,
    NotFoundError,
    ProtocolError,
    PublicEvent,
    ValidationError,
    Webhook,
    WebhookDelivery,
    WebhookVerificationError,
    WebhookWithSecret,
    verify_webhook,
)
from differently.webhooks import sign_webhook

from .conftest import Server, find_binary, start_server, stop_server

Request = Tuple[Dict[str, str], bytes]


class Receiver:
    """An HTTP endpoint on 127.0.0.1 recording every POST (headers lower-cased, exact body)
    and answering ``status`` (settable, to make attempts fail)."""

    def __init__(self) -> None:
        self.requests: List[Request] = []
        self.status = 200
        self._cond = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with receiver._cond:
                    receiver.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                    receiver._cond.notify_all()
                    status = receiver.status
                self.send_response(status)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok" if status < 300 else b"no")

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hook"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def wait_for(self, match: Callable[[Request], bool], timeout: float = 30, after: int = 0) -> Tuple[int, Request]:
        """The first request from index ``after`` on that ``match``es, and its index."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for i in range(after, len(self.requests)):
                    if match(self.requests[i]):
                        return i, self.requests[i]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no matching webhook request in {timeout} s ({len(self.requests)} received)")
                self._cond.wait(left)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def _about(sandbox_id: str, status: Optional[str] = None) -> Callable[[Request], bool]:
    def match(req: Request) -> bool:
        body = json.loads(req[1])
        return bool(body.get("sandboxId") == sandbox_id and (status is None or body["data"].get("status") == status))

    return match


def _hand_signatures(secret: str, headers: Dict[str, str], body: bytes) -> str:
    """The signature computed here from the specification, not by the SDK."""
    key = base64.b64decode(secret[len("whsec_"):])
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def _delivery(client: Client, hook: Union[Webhook, WebhookWithSecret], event_id: str, done: Callable[[WebhookDelivery], bool]) -> WebhookDelivery:
    deadline = time.monotonic() + 30
    while True:
        found = [d for d in client.webhooks.deliveries(hook) if d.event_id == event_id]
        if found and done(found[0]):
            return found[0]
        assert time.monotonic() < deadline, f"delivery of {event_id} never became what was awaited: {found}"
        time.sleep(0.2)


def test_a_real_delivery_is_signed_logged_redelivered_and_rotated(
    client: Client, receiver: Receiver, tag: str
) -> None:
    hook = client.webhooks.create(
        receiver.url, event_types=["sandbox.status.changed"], description=f"sdk test {tag}"
    )
    sbx = None
    try:
        assert hook.secret.startswith("whsec_") and hook.secret not in repr(hook)
        assert hook.url == receiver.url and hook.event_types == ["sandbox.status.changed"]
        assert hook.enabled and hook.previous_secret_expires_at is None

        sbx = client.sandboxes.wait(client.sandboxes.create(labels={"test": tag}), timeout=30)
        _, (headers, body) = receiver.wait_for(_about(sbx.id, "running"))
        # The Standard Webhooks headers, and a signature computed here by hand.
        assert headers["content-type"].startswith("application/json")
        assert abs(int(headers["webhook-timestamp"]) - time.time()) < 120
        assert headers["webhook-signature"].split() == [_hand_signatures(hook.secret, headers, body)]
        event = verify_webhook(hook.secret, headers, body)
        assert isinstance(event, PublicEvent) and event.seq is None
        assert event.id == headers["webhook-id"] and event.sandbox_id == sbx.id
        assert event.type == "sandbox.status.changed" and event.data["status"] == "running"
        # The same request with another secret or another body does not verify.
        other = "whsec_" + base64.b64encode(b"k" * 32).decode()
        with pytest.raises(WebhookVerificationError) as e:
            verify_webhook(other, headers, body)
        assert e.value.code == "invalid_signature" and other not in str(e.value)
        with pytest.raises(WebhookVerificationError) as e:
            verify_webhook(hook.secret, headers, body.replace(b"running", b"stopped"))
        assert e.value.code == "invalid_signature"

        # The delivery log has it, succeeded on the first attempt.
        d = _delivery(client, hook, headers["webhook-id"], lambda d: d.status == "succeeded")
        assert d.webhook_id == hook.id and d.event_type == "sandbox.status.changed"
        assert d.attempts == 1 and d.response_code == 200 and d.response_body == "ok"
        assert d.delivered_at is not None and d.last_error is None and d.latency_ms is not None

        # A failing receiver: the attempt is logged as failed and retried; redelivery sends it
        # again now, with the same webhook-id.
        receiver.status = 500
        mark = len(receiver.requests)
        client.sandboxes.pause(sbx)
        _, (h500, _) = receiver.wait_for(_about(sbx.id, "paused"), after=mark)
        failed = _delivery(client, hook, h500["webhook-id"], lambda d: d.response_code == 500)
        assert failed.status == "pending" and failed.attempts >= 1 and failed.next_attempt_at is not None
        receiver.status = 200
        mark = len(receiver.requests)
        again = client.webhooks.redeliver(hook, failed)
        assert again.id == failed.id and again.status == "pending"
        _, (hagain, bagain) = receiver.wait_for(_about(sbx.id, "paused"), after=mark)
        assert hagain["webhook-id"] == h500["webhook-id"]
        assert verify_webhook(hook.secret, hagain, bagain).data["status"] == "paused"
        ok = _delivery(client, hook, h500["webhook-id"], lambda d: d.status == "succeeded")
        assert ok.attempts >= 2 and ok.response_code == 200

        # Rotation: a new secret, and both sign until the overlap ends (new first).
        rotated = client.webhooks.rotate_secret(hook)
        assert rotated.id == hook.id and rotated.secret != hook.secret
        assert rotated.secret.startswith("whsec_") and rotated.secret not in repr(rotated)
        assert rotated.previous_secret_expires_at is not None
        mark = len(receiver.requests)
        client.sandboxes.resume(sbx)
        _, (hrot, brot) = receiver.wait_for(_about(sbx.id, "running"), after=mark)
        assert hrot["webhook-signature"].split() == [
            _hand_signatures(rotated.secret, hrot, brot),
            _hand_signatures(hook.secret, hrot, brot),
        ]
        assert verify_webhook(rotated.secret, hrot, brot).id == hrot["webhook-id"]
        assert verify_webhook(hook.secret, hrot, brot).id == hrot["webhook-id"]
    finally:
        if sbx is not None:
            client.sandboxes.delete(sbx)
        client.webhooks.delete(hook)


def test_webhook_crud(client: Client, tag: str) -> None:
    created = client.webhooks.create(
        "http://127.0.0.1:9/crud", description=f"crud {tag}", idempotency_key=f"crud-{tag}"
    )
    try:
        # A replayed create names the webhook it made; its secret is never shown again.
        with pytest.raises(ConflictError) as replay:
            client.webhooks.create(
                "http://127.0.0.1:9/crud", description=f"crud {tag}", idempotency_key=f"crud-{tag}"
            )
        assert replay.value.details.get("id") == created.id
        assert created.secret not in str(replay.value) + repr(replay.value.details)
        assert created.event_types == [] and created.description == f"crud {tag}"
        got = client.webhooks.get(created)
        assert got.id == created.id and got.url == created.url and "secret" not in got.raw
        assert created.id in {w.id for w in client.webhooks.list(project_id=created.project_id, page_size=1)}
        changed = client.webhooks.update(
            created, url="http://127.0.0.1:9/other", event_types=["sandbox.exec.*"], description=None
        )
        assert changed.url == "http://127.0.0.1:9/other" and changed.event_types == ["sandbox.exec.*"]
        assert changed.description is None and changed.updated_at >= created.updated_at
        disabled = client.webhooks.update(created, enabled=False)
        assert not disabled.enabled and disabled.url == changed.url, "a patch changes only what it names"
        assert client.webhooks.update(created, enabled=True).enabled
        assert list(client.webhooks.deliveries(created)) == []
    finally:
        client.webhooks.delete(created)
    with pytest.raises(NotFoundError):
        client.webhooks.get(created.id)
    assert created.id not in {w.id for w in client.webhooks.list()}


def test_refused_urls_and_filters_are_422_naming_the_field(client: Client) -> None:
    with pytest.raises(ValidationError) as e:
        client.webhooks.create("http://user:pw@127.0.0.1:9/x")
    assert e.value.status == 422 and e.value.code == "validation_failed" and e.value.field == "url"
    assert "pw" not in str(e.value.details)
    with pytest.raises(ValidationError) as e:
        client.webhooks.create("http://127.0.0.1:9/x", event_types=["nope.*"])
    assert e.value.field == "eventTypes"


@pytest.fixture(scope="module")
def strict_server() -> Iterator[Server]:
    """A ``differently dev`` with a server's default webhook rules (https only, no loopback)
    and no secrets key: dev's own loopback allowance and per-run key turned off."""
    workdir = Path(tempfile.mkdtemp(prefix="differently-sdk-py-strict-"))
    srv = start_server(
        find_binary(),
        workdir,
        {"DIFFERENTLY_WEBHOOKS_ALLOW_LOOPBACK": "false", "DIFFERENTLY_SECRETS_KEY": ""},
    )
    try:
        yield srv
    finally:
        stop_server(srv)
        shutil.rmtree(workdir, ignore_errors=True)


def test_default_rules_refuse_loopback_and_need_a_secrets_key(strict_server: Server) -> None:
    with Client(strict_server.url, strict_server.admin_key) as c:
        for url in ("https://127.0.0.1:8443/hook", "https://localhost/hook", "http://example.com/hook"):
            with pytest.raises(ValidationError) as e:
                c.webhooks.create(url)
            assert e.value.status == 422 and e.value.field == "url", url
        with pytest.raises(ConflictError) as c409:
            c.webhooks.create("https://example.com/hook")
        assert "secrets key" in c409.value.message


@pytest.mark.anyio
async def test_async_webhooks(aclient: AsyncClient, receiver: Receiver, tag: str) -> None:
    hook = await aclient.webhooks.create(receiver.url, event_types=["sandbox.status.changed"])
    try:
        assert (await aclient.webhooks.get(hook.id)).url == receiver.url
        assert hook.id in {w.id async for w in aclient.webhooks.list()}
        assert (await aclient.webhooks.update(hook, description="async")).description == "async"
        rotated = await aclient.webhooks.rotate_secret(hook)
        assert rotated.secret != hook.secret
        sbx = await aclient.sandboxes.wait(await aclient.sandboxes.create(labels={"test": tag}), timeout=30)
        _, (headers, body) = await _in_thread(lambda: receiver.wait_for(_about(sbx.id, "running")))
        assert verify_webhook(rotated.secret, headers, body).sandbox_id == sbx.id
        deliveries = [d async for d in aclient.webhooks.deliveries(hook)]
        mine = [d for d in deliveries if d.event_id == headers["webhook-id"]]
        assert mine, deliveries
        again = await aclient.webhooks.redeliver(hook, mine[0].id)
        assert again.status == "pending" and again.event_id == headers["webhook-id"]
        await aclient.sandboxes.delete(sbx)
    finally:
        await aclient.webhooks.delete(hook)


async def _in_thread(fn: Callable[[], Any]) -> Any:
    import asyncio

    return await asyncio.get_running_loop().run_in_executor(None, fn)


# --- verify_webhook on its own: the specification's rules ------------------------------------

SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()
BODY = json.dumps(
    {
        "version": 1, "id": "evt-1", "type": "sandbox.status.changed", "time": "2026-01-01T00:00:00Z",
        "orgId": "org_x", "projectId": "prj_x", "sandboxId": None, "cause": "user",
        "actor": {"keyId": "key_x"}, "data": {"status": "running"},
    }  # fmt: skip
).encode()


def _signed(ts: int, secret: str = SECRET, body: bytes = BODY) -> Dict[str, str]:
    return {
        "Webhook-Id": "evt-1",
        "Webhook-Timestamp": str(ts),
        "Webhook-Signature": sign_webhook(secret, "evt-1", ts, body),
    }


def test_verify_webhook_rules() -> None:
    now = 1_800_000_000
    event = verify_webhook(SECRET, _signed(now), BODY, now=now)  # header names in any case
    assert event.actor is not None and event.actor.key_id == "key_x" and event.sandbox_id is None
    assert verify_webhook(SECRET, _signed(now), BODY.decode(), now=now + 299).id == "evt-1"
    # Two signatures (a rotation): either matching is enough, in any position.
    other = "whsec_" + base64.b64encode(b"x" * 24).decode()
    both = dict(_signed(now), **{"Webhook-Signature": f"{sign_webhook(other, 'evt-1', now, BODY)} {_signed(now)['Webhook-Signature']}"})
    assert verify_webhook(SECRET, both, BODY, now=now).id == "evt-1"
    cases = [
        ({k: v for k, v in _signed(now).items() if k != "Webhook-Signature"}, BODY, now, "missing_header"),
        (dict(_signed(now), **{"Webhook-Timestamp": "soon"}), BODY, now, "invalid_timestamp"),
        (_signed(now - 301), BODY, now, "timestamp_out_of_tolerance"),
        (_signed(now + 301), BODY, now, "timestamp_out_of_tolerance"),
        (_signed(now), BODY + b" ", now, "invalid_signature"),
        (dict(_signed(now), **{"Webhook-Id": "evt-2"}), BODY, now, "invalid_signature"),
        (dict(_signed(now), **{"Webhook-Signature": "v2," + _signed(now)["Webhook-Signature"][3:]}), BODY, now, "invalid_signature"),
    ]  # fmt: skip
    for headers, body, at, code in cases:
        with pytest.raises(WebhookVerificationError) as e:
            verify_webhook(SECRET, headers, body, now=at)
        assert e.value.code == code, (headers, e.value)
        assert SECRET not in str(e.value)
    with pytest.raises(WebhookVerificationError) as e:
        verify_webhook("whsec_not base64!", _signed(now), BODY, now=now)
    assert e.value.code == "invalid_secret"


def test_verify_webhook_matches_the_standard_webhooks_example() -> None:
    # The example of the Standard Webhooks specification (also webhooks/src/signing.rs's vector).
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"test": 2432232314}'
    headers = {
        "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
        "webhook-timestamp": "1614265330",
        "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
    }
    assert sign_webhook(secret, headers["webhook-id"], 1614265330, body) == headers["webhook-signature"]
    with pytest.raises(ProtocolError) as e:  # a valid signature, but not a public event
        verify_webhook(secret, headers, body, now=1614265330)
    assert "version" in str(e.value)
