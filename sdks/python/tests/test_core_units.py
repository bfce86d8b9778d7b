"""The sans-I/O parts on their own: frame and SSE decoders fed in every split, the codec, the
retry policy, and the generated sync client being current and identical in surface."""

from __future__ import annotations

import inspect
import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import httpx
import pytest

import differently
from differently import AsyncClient, Client, ExecStreamError, ProtocolError, StreamCutError
from differently._codec import UNSET, decode, encode, parse_datetime
from differently._core import Call, RetryPolicy, api_error, retry_after_seconds
from differently._streams import ExecFrames, ExecSSE, FrameDecoder, SSEDecoder
from differently.errors import NotFoundError, RateLimitError, ServerError, ValidationError
from differently.models import ExecExit, ExecStderr, ExecStdout, Sandbox, UpdateSandboxRequest

ROOT = Path(__file__).resolve().parents[1]


def frame(kind: int, payload: bytes) -> bytes:
    return struct.pack(">B3xI", kind, len(payload)) + payload


def test_frames_in_every_split() -> None:
    stream = (
        frame(1, b"out\xe2\x82")  # a UTF-8 character split across frames stays bytes
        + frame(0, b"")
        + frame(2, b"err")
        + frame(1, b"\xac")
        + frame(3, json.dumps({"exitCode": 7, "durationMs": 12}).encode())
    )
    for cut in range(len(stream) + 1):
        dec = ExecFrames()
        events = dec.feed(stream[:cut]) + dec.feed(stream[cut:])
        assert events == [ExecStdout(b"out\xe2\x82"), ExecStderr(b"err"), ExecStdout(b"\xac"), events[-1]]
        assert isinstance(events[-1], ExecExit) and events[-1].exit_code == 7
        dec.finish()
    one_byte = ExecFrames()
    got = [e for b in stream for e in one_byte.feed(bytes([b]))]
    assert len(got) == 4


def test_frames_error_cut_and_garbage() -> None:
    with pytest.raises(ExecStreamError) as e:
        ExecFrames().feed(frame(4, b'{"code":"provider_unavailable","message":"gone"}'))
    assert (e.value.code, e.value.message) == ("provider_unavailable", "gone")
    dec = ExecFrames()
    dec.feed(frame(1, b"partial"))
    with pytest.raises(StreamCutError):
        dec.finish()
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(b"\x01\x01\x00\x00\x00\x00\x00\x00")


def test_sse_decoder_rules() -> None:
    text = (
        b": ping\r\n\r\nevent: stdout\r\ndata: {\"data\":\"a\\n\"}\r\n\r\n"
        b"id: 5\nevent: status\ndata: line1\ndata: line2\nretry: 1500\n\n"
        b"data:no-space\n\n"
    )
    for cut in range(len(text) + 1):
        dec = SSEDecoder()
        evs = dec.feed(text[:cut]) + dec.feed(text[cut:])
        assert [(e.event, e.data, e.id) for e in evs] == [
            ("stdout", b'{"data":"a\\n"}', None),
            ("status", b"line1\nline2", "5"),
            ("message", b"no-space", "5"),
        ]
        assert evs[1].retry == 1500


def test_exec_sse_events() -> None:
    body = (
        b'event: stdout\ndata: {"data":"h\xc3\xa9"}\n\n'
        b'event: stderr\ndata: {"data":"e"}\n\n'
        b'event: exit\ndata: {"exitCode":0,"durationMs":1}\n\n'
    )
    dec = ExecSSE(False)
    evs = dec.feed(body)
    assert evs[0] == ExecStdout("hé".encode()) and evs[1] == ExecStderr(b"e")
    assert dec.exit is not None and dec.exit.exit_code == 0
    with pytest.raises(ExecStreamError):
        ExecSSE(False).feed(b'event: error\ndata: {"code":"internal","message":"x"}\n\n')


def test_codec() -> None:
    when = parse_datetime("2026-12-01T15:06:14.511285317Z")
    assert (when.microsecond, when.utcoffset()) == (511285, __import__("datetime").timedelta(0))
    assert encode(UpdateSandboxRequest(idle_timeout_seconds=None)) == {"idleTimeoutSeconds": None}
    assert encode(UpdateSandboxRequest()) == {}
    assert UNSET is type(UNSET)() and not UNSET
    with pytest.raises(ProtocolError) as e:
        decode(Sandbox, {"id": "sbx_1"})
    assert "missing" in str(e.value)


def test_error_mapping_and_retry_after() -> None:
    call = Call("GET", "/v1/x")
    body = b'{"error":{"code":"validation_failed","message":"m","details":{"field":"a.b"},"requestId":"r1"}}'
    err = api_error(call, 422, httpx.Headers({}), body)
    assert isinstance(err, ValidationError) and (err.field, err.request_id) == ("a.b", "r1")
    plain = api_error(call, 502, httpx.Headers({"x-request-id": "r2"}), b"Bad Gateway")
    assert isinstance(plain, ServerError) and plain.request_id == "r2" and plain.code == "http_502"
    assert isinstance(api_error(call, 404, httpx.Headers({}), b""), NotFoundError)
    limited = api_error(call, 429, httpx.Headers({"retry-after": "3"}), b'{"error":{"code":"rate_limited","message":""}}')
    assert isinstance(limited, RateLimitError) and limited.retry_after == 3
    assert retry_after_seconds(httpx.Headers({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"})) == 0
    policy = RetryPolicy()
    safe = Call("GET", "/v1/x", retry=True)
    assert policy.after_error(safe, 0, limited) == 3
    assert policy.after_error(Call("POST", "/v1/x"), 0, limited) is None
    quota = api_error(call, 429, httpx.Headers({}), b'{"error":{"code":"quota_exceeded","message":""}}')
    assert policy.after_error(safe, 0, quota) is None
    assert policy.after_error(safe, 3, limited) is None
    assert policy.after_network_error(Call("POST", "/v1/x"), 0, httpx.ConnectError("refused")) is not None
    assert policy.after_network_error(Call("POST", "/v1/x"), 0, httpx.ReadError("reset")) is None
    assert policy.after_network_error(safe, 0, httpx.ReadError("reset")) is not None


def test_sync_client_is_generated_from_the_async_one() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "unasync.py"), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _surface(root: Any) -> List[str]:
    out = []
    instance = root("http://127.0.0.1:1", "k")
    for ns_name, ns in sorted(vars(instance).items()):
        if ns_name.startswith("_"):
            continue
        for name, fn in inspect.getmembers(type(ns), inspect.isfunction):
            if not name.startswith("_"):
                sig = inspect.signature(fn)
                out.append(f"{ns_name}.{name}{[(p.name, p.kind, p.default) for p in sig.parameters.values()]}")
    return sorted(out)


def test_sync_and_async_have_the_same_surface() -> None:
    assert _surface(Client) == _surface(AsyncClient)
    assert len(_surface(Client)) > 60


def test_repr_never_shows_the_key() -> None:
    c = Client("http://127.0.0.1:1", "dly_key_abc_supersecret")
    assert "supersecret" not in repr(c) and "supersecret" not in repr(vars(c))
    assert differently.__version__


def test_sources_stay_python_39() -> None:
    import ast
    import re

    for path in sorted((ROOT / "src" / "differently").glob("*.py")):
        text = path.read_text(encoding="utf-8")
        ast.parse(text, filename=str(path), feature_version=(3, 9))
        if path.name in ("models.py", "_codec.py"):
            # These annotations are evaluated at run time (typing.get_type_hints): no PEP 604
            # unions or PEP 585 generics, which Python 3.9 cannot evaluate.
            for ann in re.findall(r"^\s+\w+: (.+?)(?: = |$)", text, re.M):
                assert "|" not in ann and not re.search(r"\b(list|dict|tuple)\[", ann), f"{path.name}: {ann}"


def test_label_filters_and_terminal_urls() -> None:
    from differently import _core as core
    from differently._codec import query

    assert core.label_filter({"a": "1", "b": "2"}) == ["a=1", "b=2"]
    assert core.label_filter("a=1") == ["a=1"] and core.label_filter(None) is None
    assert core.label_filter(["a=1", "b=x=y"]) == ["a=1", "b=x=y"]
    with pytest.raises(ValueError):
        core.label_filter(["a"])
    assert query({"label": ["a=1", "b=2"], "limit": 5}) == [("label", "a=1"), ("label", "b=2"), ("limit", "5")]
    call = core.pty_call("sbx_1", ["sh", "-c", "echo a&b"], 100, None, {"X": "1 2"}, "/w", None)
    assert core.ws_url("http://127.0.0.1:7070", call) == (
        "ws://127.0.0.1:7070/v1/sandboxes/sbx_1/pty?cols=100&command=sh&command=-c"
        "&command=echo%20a%26b&env=X%3D1%202&cwd=%2Fw"
    )
    again = core.pty_call("sbx_1", None, None, None, None, None, "pty_9")
    assert core.ws_url("https://h/api", again) == "wss://h/api/v1/sandboxes/sbx_1/pty?session=pty_9"
    with pytest.raises(ValueError):
        core.ws_url("ftp://h", again)
    assert json.loads(core.pty_resize(80, 24)) == {"type": "resize", "cols": 80, "rows": 24}
    for bad in ((0, 24), (80, 1001), (True, 24)):
        with pytest.raises(ValueError):
            core.pty_resize(*bad)
    assert json.loads(core.pty_signal("sigint")) == {"type": "signal", "signal": "INT"}
    with pytest.raises(ValueError):
        core.pty_signal("USR1")


def test_placement_wall_is_read_from_raw() -> None:
    from differently.models import Placement

    policy: Dict[str, Any] = {"allowedClassifications": None, "poolClassifications": {}, "allowedRegions": None,
              "externalForbiddenBy": "global", "externalPools": [], "deniedPools": [],
              "defaultStrategy": "private-first"}  # fmt: skip
    body = {"decision": "waiting", "reason": "waiting: org cpu quota 2/2", "wall": "org",
            "pools": [], "policy": policy, "decidedAt": "2026-12-01T16:00:00Z"}  # fmt: skip
    p = decode(Placement, body)
    assert (p.decision, p.wall, p.pool, p.policy.external_forbidden_by) == ("waiting", "org", None, "global")
    assert decode(Placement, {**body, "wall": None}).wall is None
