#!/usr/bin/env python3
"""How the server cuts a streamed exec into HTTP chunks: the count and sizes a client sees.

Every HTTP chunk costs each SDK a fixed amount of work (h11/undici parsing, an event-loop turn,
a decoder call), so this is the server-side figure behind the SDK throughput. Starts its own
`differently dev` ($DIFFERENTLY_BIN), streams the benchmark's ~50 MB once per format over a raw
socket that reads as fast as it can, and prints the chunk-size distribution.

    DIFFERENTLY_BIN=target/release/differently python3 load-tests/sdk-throughput/chunks.py

Needs httpx (as python_sdk.py does). Only 127.0.0.1 is ever contacted.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from python_sdk import FRAMES, REPO, loopback_only, start_dev  # noqa: E402

from differently import Client  # noqa: E402


def chunk_sizes(port: int, key: str, sandbox: str, body: str, accept: str) -> tuple[list[int], float]:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(
            (f"POST /v1/sandboxes/{sandbox}/exec/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n"
             f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\nAccept: {accept}\r\n"
             f"Content-Length: {len(body)}\r\n\r\n{body}").encode()
        )  # fmt: skip
        f = s.makefile("rb", buffering=1 << 16)
        status = f.readline()
        if b" 200 " not in status:
            raise SystemExit(f"exec/stream answered {status!r}")
        while f.readline() not in (b"\r\n", b""):
            pass
        sizes = []
        started = time.perf_counter()
        while (n := int(f.readline().split(b";")[0], 16)) != 0:
            f.read(n)
            f.readline()
            sizes.append(n)
        return sizes, time.perf_counter() - started


def main() -> None:
    binary = Path(os.environ.get("DIFFERENTLY_BIN") or REPO / "target" / "debug" / "differently")
    work = Path(tempfile.mkdtemp(prefix="sdk-chunks-"))
    proc, url, key = start_dev(binary, work)
    loopback_only(url)
    port = int(url.rsplit(":", 1)[1])
    script = "head -c 50000000 /dev/zero | tr '\\0' a | fold -w 100"
    body = json.dumps({"command": ["sh", "-c", script], "timeoutSeconds": 600})
    try:
        with Client(url, key, timeout=120) as c:
            sbx = c.sandboxes.wait(c.sandboxes.create(), timeout=60).id
            for name, accept in (("frames", FRAMES), ("sse", "text/event-stream")):
                sizes, wall = chunk_sizes(port, key, sbx, body, accept)
                sizes.sort()
                total = sum(sizes)
                print(f"{name:6} {len(sizes):6} chunks, mean {total // len(sizes):6} B, median "
                      f"{sizes[len(sizes) // 2]:6} B, max {sizes[-1]:6} B, {total / 1e6 / wall:5.0f} MB/s")  # fmt: skip
            c.sandboxes.delete(sbx)
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
