#!/usr/bin/env python3
"""Streamed-exec throughput: the Python SDK against curl on the same route, in one run.

Starts its own `differently dev` (devhost pool) on a free loopback port, creates one sandbox,
then alternates, round after round, curl, the sync SDK client and the async one streaming the same ~50 MB command output
(`head -c 50000000 /dev/zero | tr '\\0' a | fold -w 100`) through `POST …/exec/stream`, in
both formats the route serves (binary frames and SSE). It prints MB/s per client and format
(median of the rounds), the SDK/curl ratio, and the client CPU seconds per run.

    python3 load-tests/sdk-throughput/python_sdk.py [--rounds 5] [--bytes 50000000]

Needs the binary ($DIFFERENTLY_BIN or target/debug/differently), curl, and httpx importable
(the SDK is imported from sdks/python/src). Only 127.0.0.1 is ever contacted.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "sdks" / "python" / "src"))

import asyncio  # noqa: E402

from differently import AsyncClient, Client, ExecExit, ExecStderr, ExecStdout  # noqa: E402

FRAMES = "application/vnd.differently.exec-stream"


def loopback_only(url: str) -> None:
    if urlsplit(url).hostname != "127.0.0.1":
        raise SystemExit(f"refusing to send load to {url}: this benchmark targets 127.0.0.1 only")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_dev(binary: Path, work: Path) -> Tuple["subprocess.Popen[bytes]", str, str]:
    port = free_port()
    key_file = work / "key"
    log = open(work / "dev.log", "wb")
    proc = subprocess.Popen(
        [str(binary), "dev", "--listen", f"127.0.0.1:{port}", "--key-file", str(key_file),
         "--root", str(work / "root")],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env={**os.environ, "RUST_LOG": "warn"},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    import httpx

    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"differently dev exited: {(work / 'dev.log').read_text()}")
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200 and key_file.exists():
                return proc, url, key_file.read_text().strip()
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("differently dev did not become ready")


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_curl(url: str, key: str, sandbox: str, body: bytes, accept: str) -> Tuple[float, float]:
    before = children_cpu()
    cfg = f'header = "Authorization: Bearer {key}"\n'  # the key via stdin, not argv
    started = time.perf_counter()
    done = subprocess.run(
        ["curl", "-sS", "--fail", "-K", "-", "-o", "/dev/null", "-w", "%{size_download}",
         "-H", f"Accept: {accept}", "-H", "Content-Type: application/json",
         "--data-binary", body.decode(), f"{url}/v1/sandboxes/{sandbox}/exec/stream"],
        input=cfg.encode(), capture_output=True, check=True,
    )  # fmt: skip
    wall = time.perf_counter() - started
    if int(done.stdout or b"0") < 1_000_000:
        raise SystemExit(f"curl got only {done.stdout!r} bytes")
    return wall, children_cpu() - before


def run_sdk(client: Client, sandbox: str, command: List[str], transport: str) -> Tuple[float, float, int]:
    cpu0 = time.process_time()
    started = time.perf_counter()
    n = 0
    code = None
    with client.sandboxes.exec_stream(sandbox, command, transport=transport) as stream:
        for ev in stream:
            if isinstance(ev, (ExecStdout, ExecStderr)):
                n += len(ev.data)
            elif isinstance(ev, ExecExit):
                code = ev.exit_code
    wall = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"the command exited {code}")
    return wall, time.process_time() - cpu0, n


async def _stream_async(client: AsyncClient, sandbox: str, command: List[str], transport: str) -> int:
    n = 0
    async with client.sandboxes.exec_stream(sandbox, command, transport=transport) as stream:
        async for ev in stream:
            if isinstance(ev, (ExecStdout, ExecStderr)):
                n += len(ev.data)
    if stream.exit_code != 0:
        raise SystemExit(f"the command exited {stream.exit_code}")
    return n


def run_sdk_async(
    loop: asyncio.AbstractEventLoop, client: AsyncClient, sandbox: str, command: List[str], transport: str
) -> Tuple[float, float]:
    cpu0 = time.process_time()
    started = time.perf_counter()
    loop.run_until_complete(_stream_async(client, sandbox, command, transport))
    return time.perf_counter() - started, time.process_time() - cpu0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--bytes", type=int, default=50_000_000)
    ap.add_argument("--formats", default="frames,sse")
    args = ap.parse_args()
    if shutil.which("curl") is None:
        raise SystemExit("curl is needed (apt-get install curl)")
    binary = Path(os.environ.get("DIFFERENTLY_BIN") or REPO / "target" / "debug" / "differently")
    if not binary.is_file():
        raise SystemExit(f"no binary at {binary}: run `cargo build -p differently` (or set DIFFERENTLY_BIN)")
    work = Path(tempfile.mkdtemp(prefix="sdk-throughput-"))
    proc, url, key = start_dev(binary, work)
    loopback_only(url)
    script = f"head -c {args.bytes} /dev/zero | tr '\\0' a | fold -w 100"
    command = ["sh", "-c", script]
    body = json.dumps({"command": command, "timeoutSeconds": 600}).encode()
    payload = args.bytes + (args.bytes + 99) // 100 - 1  # fold: a newline between 100-byte lines
    results: Dict[Tuple[str, str], List[Tuple[float, float]]] = {}
    loop = asyncio.new_event_loop()
    aclient = AsyncClient(url, key, timeout=120)
    try:
        with Client(url, key, timeout=120) as client:
            sbx = client.sandboxes.wait(client.sandboxes.create(), timeout=60).id
            # One warm-up of each, not counted.
            for fmt in args.formats.split(","):
                run_curl(url, key, sbx, body, FRAMES if fmt == "frames" else "text/event-stream")
                run_sdk(client, sbx, command, fmt)
                run_sdk_async(loop, aclient, sbx, command, fmt)
            for r in range(args.rounds):
                for fmt in args.formats.split(","):
                    accept = FRAMES if fmt == "frames" else "text/event-stream"
                    pairs = [("curl", lambda: run_curl(url, key, sbx, body, accept)),
                             ("sdk", lambda: run_sdk(client, sbx, command, fmt)[:2]),
                             ("async", lambda: run_sdk_async(loop, aclient, sbx, command, fmt))]  # fmt: skip
                    if r % 2:
                        pairs.reverse()  # alternate who goes first
                    for who, fn in pairs:
                        wall, cpu = fn()
                        results.setdefault((fmt, who), []).append((wall, cpu))
            n = run_sdk(client, sbx, command, "frames")[2]
            if n != payload:
                raise SystemExit(f"the SDK received {n} bytes, expected {payload}")
            client.sandboxes.delete(sbx)
    finally:
        loop.run_until_complete(aclient.aclose())
        loop.close()
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(work, ignore_errors=True)

    mb = payload / 1e6
    print(f"streamed exec of {mb:.1f} MB through POST /v1/sandboxes/{{id}}/exec/stream, "
          f"{args.rounds} alternated rounds (median), binary {binary}")  # fmt: skip
    print(f"{'format':8} {'client':6} {'MB/s':>8} {'client CPU s':>13} {'ratio sdk/curl':>15}")
    for fmt in args.formats.split(","):
        speeds = {}
        for who in ("curl", "sdk", "async"):
            runs = results[(fmt, who)]
            speeds[who] = statistics.median(mb / w for w, _ in runs)
            cpu = statistics.median(c for _, c in runs)
            ratio = f"{speeds[who] / speeds['curl']:.3f}x" if who != "curl" else ""
            print(f"{fmt:8} {who:6} {speeds[who]:8.1f} {cpu:13.3f} {ratio:>15}")
        for who in ("curl", "sdk", "async"):
            per = " ".join(f"{mb / w:.0f}" for w, _ in results[(fmt, who)])
            print(f"{'':8} rounds {who:6} {per} MB/s")


if __name__ == "__main__":
    main()
