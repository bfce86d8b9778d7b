"""Incremental decoders for the two streamed formats the API serves, fed with raw bytes as
they arrive (sans I/O, so the sync and async clients share them):

* the exec stream's binary frames (``application/vnd.differently.exec-stream``): an 8-byte
  header (type, three zero bytes, big-endian u32 length) and a payload;
* server-sent events (``text/event-stream``): exec's SSE form and ``GET /v1/events``.
"""

from __future__ import annotations

import base64
import json
import struct
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

from ._codec import decode
from .errors import ExecStreamError, ProtocolError, StreamCutError
from .models import ExecEvent, ExecExit, ExecStderr, ExecStdout

#: The exec stream's binary media type.
FRAMES_MEDIA_TYPE = "application/vnd.differently.exec-stream"

FRAME_HEARTBEAT = 0
FRAME_STDOUT = 1
FRAME_STDERR = 2
FRAME_EXIT = 3
FRAME_ERROR = 4

# The server sends at most 64 KiB per frame; anything far beyond that is not this protocol.
_MAX_FRAME = 16 * 1024 * 1024


_HEADER = struct.Struct(">II")  # type (high byte) and three zero bytes, then the length


class FrameDecoder:
    """Splits a byte stream into ``(type, payload)`` frames; a frame may span many reads."""

    def __init__(self) -> None:
        self._parts: List[bytes] = []  # an unfinished frame's reads so far
        self._have = 0
        self._need = 8  # bytes that complete the unfinished frame (its header, at first)

    def feed(self, chunk: bytes) -> List[Tuple[int, bytes]]:
        # Most reads carry whole frames: they are sliced once, without copying the read. A
        # frame spread over many reads is joined once, when its last byte arrives.
        if self._parts:
            self._parts.append(bytes(chunk))
            self._have += len(chunk)
            if self._have < self._need:
                return []
            data = b"".join(self._parts)
        else:
            data = bytes(chunk)
        out: List[Tuple[int, bytes]] = []
        pos = 0
        end = len(data)
        unpack = _HEADER.unpack_from
        need = 8
        while end - pos >= 8:
            word, length = unpack(data, pos)
            if word & 0x00FFFFFF:
                raise ProtocolError("exec stream: a frame header's bytes 1-3 are not zero")
            if length > _MAX_FRAME:
                raise ProtocolError(f"exec stream: a frame of {length} bytes")
            stop = pos + 8 + length
            if stop > end:
                need = 8 + length
                break
            out.append((word >> 24, data[pos + 8 : stop]))
            pos = stop
        rest = data[pos:] if pos < end else b""
        self._parts = [rest] if rest else []
        self._have = len(rest)
        self._need = need
        return out

    @property
    def pending(self) -> int:
        """Bytes of an unfinished frame."""
        return self._have


@dataclass(frozen=True)
class SSEEvent:
    """One dispatched server-sent event (``data`` as the UTF-8 bytes it arrived as)."""

    event: str
    data: bytes
    id: Optional[str]
    retry: Optional[int]


class SSEDecoder:
    """The event-stream parsing rules of the HTML standard, for a stream fed in pieces. Lines
    stay bytes (only field names and ids are decoded), so a large ``data:`` line is not
    decoded and re-encoded on its way to ``json.loads``."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._event = b""
        self._data: List[bytes] = []
        self._id: Optional[str] = None
        self._retry: Optional[int] = None
        self._has_fields = False

    def feed(self, chunk: bytes) -> List[SSEEvent]:
        buf = self._buf
        buf += chunk
        out: List[SSEEvent] = []
        pos = 0
        find = buf.find
        while True:
            nl = find(b"\n", pos)
            if nl < 0:
                break
            end = nl - 1 if nl > pos and buf[nl - 1] == 13 else nl  # CRLF
            line = bytes(buf[pos:end])
            pos = nl + 1
            ev = self._line(line)
            if ev is not None:
                out.append(ev)
        if pos:
            del buf[:pos]
        return out

    def _line(self, line: bytes) -> Optional[SSEEvent]:
        if not line:
            if not self._has_fields:
                return None
            ev = None
            if self._data or self._event:
                event = self._event.decode("utf-8", "replace") or "message"
                ev = SSEEvent(event, b"\n".join(self._data), self._id, self._retry)
            self._event, self._data, self._retry, self._has_fields = b"", [], None, False
            return ev
        if line[:1] == b":":
            return None  # a comment: the heartbeat (`: ping`)
        name, sep, value = line.partition(b":")
        if sep and value[:1] == b" ":
            value = value[1:]
        self._has_fields = True
        if name == b"data":
            self._data.append(value)
        elif name == b"event":
            self._event = value
        elif name == b"id" and b"\0" not in value:
            self._id = value.decode("utf-8", "replace")
        elif name == b"retry" and value.isdigit():
            self._retry = int(value)
        return None


def _json(payload: bytes, what: str) -> Any:
    try:
        # Decoding first skips json's encoding detection, a Python-level cost per event.
        return json.loads(payload.decode("utf-8"))
    except ValueError as e:
        raise ProtocolError(f"{what}: not JSON") from e


class ExecFrames:
    """Exec events from the binary frame format. ``offset`` counts the output bytes from
    ``start`` (a process's output offset); with ``open_ended`` the body may end without the
    exit (a process's output read without following it)."""

    def __init__(self, start: int = 0, open_ended: bool = False) -> None:
        self._dec = FrameDecoder()
        self.exit: Optional[ExecExit] = None
        self.offset = start
        self._open_ended = open_ended

    def feed(self, chunk: bytes) -> List[ExecEvent]:
        out: List[ExecEvent] = []
        for kind, payload in self._dec.feed(chunk):
            if self.exit is not None:
                raise ProtocolError("exec stream: a frame after the exit frame")
            if kind == FRAME_STDOUT:
                self.offset += len(payload)
                out.append(ExecStdout(payload))
            elif kind == FRAME_STDERR:
                self.offset += len(payload)
                out.append(ExecStderr(payload))
            elif kind == FRAME_EXIT:
                self.exit = decode(ExecExit, _json(payload, "exit frame"), "exit")
                out.append(self.exit)
            elif kind == FRAME_ERROR:
                raise _stream_error(_json(payload, "error frame"))
            # FRAME_HEARTBEAT and types a newer server may add carry nothing for us.
        return out

    def finish(self) -> None:
        if self._open_ended and self._dec.pending:
            raise StreamCutError("the stream ended inside a frame: the connection was lost")
        if self.exit is None and not self._open_ended:
            raise StreamCutError(
                "the exec stream ended without its exit frame: the connection was lost"
            )


class ExecSSE:
    """Exec events from the SSE format (``outputEncoding`` utf8 or base64). ``offset`` is the
    last output event's ``id:`` (a process's output offset), ``start`` before one arrives;
    ``open_ended`` as for :class:`ExecFrames`."""

    def __init__(self, base64_output: bool, start: int = 0, open_ended: bool = False) -> None:
        self._dec = SSEDecoder()
        self._b64 = base64_output
        self.exit: Optional[ExecExit] = None
        self.offset = start
        self._open_ended = open_ended

    def feed(self, chunk: bytes) -> List[ExecEvent]:
        out: List[ExecEvent] = []
        for ev in self._dec.feed(chunk):
            if ev.event in ("stdout", "stderr"):
                body = _json(ev.data, f"{ev.event} event")
                text = body.get("data", "") if isinstance(body, dict) else ""
                data = base64.b64decode(text) if self._b64 else str(text).encode("utf-8")
                if ev.id is not None and ev.id.isdigit():
                    self.offset = int(ev.id)
                out.append(ExecStdout(data) if ev.event == "stdout" else ExecStderr(data))
            elif ev.event == "exit":
                self.exit = decode(ExecExit, _json(ev.data, "exit event"), "exit")
                out.append(self.exit)
            elif ev.event == "error":
                raise _stream_error(_json(ev.data, "error event"))
        return out

    def finish(self) -> None:
        if self.exit is None and not self._open_ended:
            raise StreamCutError(
                "the exec stream ended without its exit event: the connection was lost"
            )


def _stream_error(body: Any) -> ExecStreamError:
    # A failed process's output ends with the API's error envelope (``{"error": {…}}``).
    if isinstance(body, dict) and isinstance(body.get("error"), dict) and "code" not in body:
        body = body["error"]
    if not isinstance(body, dict):
        return ExecStreamError("internal", "malformed error event")
    return ExecStreamError(str(body.get("code", "internal")), str(body.get("message", "")))
