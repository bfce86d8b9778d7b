"""Loopback-only stand-ins between the SDK and the real server, for faults the server does not
produce on demand: a TCP proxy that can cut every open connection (a lost event stream), and
an HTTP front that answers the first matching requests with a canned error (a 503 with
``Retry-After``) and forwards everything else. Both refuse any upstream but 127.0.0.1.
"""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

import httpx


def _loopback(url: str) -> Tuple[str, int]:
    parts = urlsplit(url)
    if parts.hostname != "127.0.0.1" or parts.port is None:
        raise ValueError(f"test proxies forward to 127.0.0.1 only, not {url}")
    return parts.hostname, parts.port


class CuttingProxy:
    """Forwards TCP to the upstream; :meth:`cut` drops every connection open now."""

    def __init__(self, upstream_url: str) -> None:
        self._upstream = _loopback(upstream_url)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._open: List[socket.socket] = []
        self.connections = 0
        self._stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                down, _ = self._listener.accept()
            except OSError:
                return
            up = socket.create_connection(self._upstream)
            with self._lock:
                self._open += [down, up]
                self.connections += 1
            threading.Thread(target=self._pump, args=(down, up), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, down), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        with self._lock:
            conns, self._open = self._open, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self._stopped = True
        self._listener.close()
        self.cut()


Rule = Callable[[str, str], bool]


class FlakyFront:
    """An HTTP front: the first ``times`` requests that ``match`` get ``status`` with
    ``headers`` and an API error envelope; every request is counted and the rest forwarded."""

    def __init__(
        self,
        upstream_url: str,
        match: Rule,
        status: int,
        code: str,
        headers: Optional[Dict[str, str]] = None,
        times: int = 1,
    ) -> None:
        _loopback(upstream_url)
        self.upstream = upstream_url
        self.counts: Dict[Tuple[str, str], int] = {}
        self.injected = 0
        self.idempotency_keys: List[str] = []
        front = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _handle(self) -> None:
                path = urlsplit(self.path).path
                key = (self.command, path)
                front.counts[key] = front.counts.get(key, 0) + 1
                if self.headers.get("Idempotency-Key"):
                    front.idempotency_keys.append(self.headers["Idempotency-Key"])
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if match(self.command, path) and front.injected < times:
                    front.injected += 1
                    payload = json.dumps(
                        {"error": {"code": code, "message": "injected by the test front"}}
                    ).encode()
                    self.send_response(status)
                    for k, v in (headers or {}).items():
                        self.send_header(k, v)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                fwd = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                r = httpx.request(
                    self.command, front.upstream + self.path, headers=fwd, content=body, timeout=60
                )
                self.send_response(r.status_code)
                for k, v in r.headers.items():
                    if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
