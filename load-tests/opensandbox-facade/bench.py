"""P8 and the facade's overhead, in one run, with the official OpenSandbox Python SDK.

P8: `sandbox.commands.run("echo hi")` with the official SDK (1.1.1) straight to an OpenSandbox
server (its execd, direct endpoint) against the same SDK through Differently's facade on an
`opensandbox` pool backed by that same server. Interleaved, the order rotated per round.

Overhead: create and exec through the facade against the same call through `/v1`, on
`differently dev`'s devhost pool (same backend both ways, so the difference is the facade):
create = the answer to the create request (202); exec = `echo hi` to the terminal event
(`execution_complete` on the facade's execd stream, `exit` on `/v1`'s exec stream).

Every address is checked to be loopback before anything is sent. Environment:
OSB_URL (the server, e.g. http://127.0.0.1:8090), OSB_KEY_FILE, OSB_IMAGE, DIFFERENTLY_BIN,
ROUNDS (default 30). Prints a JSON report; exits 1 when a target is missed.
"""
import asyncio
import ipaddress
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from datetime import timedelta

import httpx
from opensandbox import Sandbox
from opensandbox.config import ConnectionConfig


def loopback(url_or_host):
    host = urllib.parse.urlsplit(url_or_host if "://" in url_or_host else "http://" + url_or_host).hostname
    try:
        ok = ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = host == "localhost"
    if not ok:
        sys.exit(f"refusing {url_or_host}: this benchmark only sends traffic to loopback")
    return url_or_host


OSB_URL = loopback(os.environ.get("OSB_URL", "http://127.0.0.1:8090"))
OSB_KEY_FILE = os.environ.get("OSB_KEY_FILE", "/tmp/osb/KEY")
OSB_KEY = open(OSB_KEY_FILE).read().strip()
IMAGE = os.environ.get("OSB_IMAGE", "osb/debian:bookworm")
BIN = os.environ.get("DIFFERENTLY_BIN", "target/debug/differently")
ROUNDS = int(os.environ.get("ROUNDS", "30"))
# Which targets fail the run: all of them, or `p8` only (CI, where a shared machine makes the
# sub-millisecond overheads noisy; they are still measured and printed).
ENFORCE = os.environ.get("BENCH_ENFORCE", "all")


def med(xs):
    return statistics.median(xs)


def series(xs):
    s = sorted(xs)
    return {"p50Ms": round(med(s), 3), "p90Ms": round(s[int(0.9 * (len(s) - 1))], 3), "n": len(s)}


def start_dev(tmp):
    port = None
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([BIN, "dev", "--listen", f"127.0.0.1:{port}", "--root", f"{tmp}/sbx"],
                            stdout=subprocess.PIPE, stderr=open(f"{tmp}/dev.log", "w"),
                            stdin=subprocess.DEVNULL, text=True)
    url = proc.stdout.readline().strip().split("=", 1)[1]
    key = proc.stdout.readline().strip().split("=", 1)[1]
    loopback(url)
    for _ in range(300):
        try:
            if httpx.get(f"{url}/readyz").status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    return proc, url, key


async def timed_echo(sb):
    t = time.perf_counter()
    ex = await sb.commands.run("echo hi")
    ms = (time.perf_counter() - t) * 1000
    assert [m.text for m in ex.logs.stdout] == ["hi"] and ex.exit_code == 0, ex
    return ms


async def p8(url, key):
    """`echo hi` via the SDK: straight to the server vs through the facade's opensandbox pool."""
    straight_cfg = ConnectionConfig(domain=OSB_URL.split("://", 1)[1], api_key=OSB_KEY,
                                    request_timeout=timedelta(seconds=120))
    facade_cfg = ConnectionConfig(domain=f"{url.split('://', 1)[1]}/opensandbox", api_key=key,
                                  request_timeout=timedelta(seconds=120))
    common = dict(timeout=timedelta(minutes=20), resource={"cpu": "1", "memory": "512Mi"},
                  ready_timeout=timedelta(seconds=120))
    straight = await Sandbox.create(IMAGE, connection_config=straight_cfg, **common)
    through = await Sandbox.create(IMAGE, connection_config=facade_cfg, **common)
    info = await through.get_info()
    pool = (info.extensions or {}).get("differently.pool")
    assert pool == "osb", f"the facade's sandbox is on pool {pool!r}, not the opensandbox pool"
    d, f = [], []
    try:
        for _ in range(3):
            await timed_echo(straight)
            await timed_echo(through)
        for i in range(ROUNDS // 3 or 1):
            if i % 2:
                f.append(await timed_echo(through)); d.append(await timed_echo(straight))
            else:
                d.append(await timed_echo(straight)); f.append(await timed_echo(through))
    finally:
        await straight.kill(); await through.kill()
        await straight.close(); await through.close()
    return {"straight": series(d), "facade": series(f), "ratioP50": round(med(f) / med(d), 4)}


def overhead(url, key):
    """Facade vs /v1 on the devhost pool: create answer and exec to the terminal event."""
    c = httpx.Client(timeout=60)
    v1h = {"Authorization": f"Bearer {key}"}
    osbh = {"OPEN-SANDBOX-API-KEY": key}
    made = []

    def create_v1():
        t = time.perf_counter()
        r = c.post(f"{url}/v1/sandboxes", json={"template": "default", "ttlSeconds": 600,
                   "resources": {"cpu": 1, "memoryMiB": 512}}, headers=v1h)
        ms = (time.perf_counter() - t) * 1000
        assert r.status_code == 202, r.text
        made.append(r.json()["id"])
        return ms

    def create_facade():
        t = time.perf_counter()
        r = c.post(f"{url}/opensandbox/v1/sandboxes", json={"image": {"uri": "default"}, "timeout": 600,
                   "resourceLimits": {"cpu": "1", "memory": "512Mi"}, "entrypoint": ["tail", "-f", "/dev/null"]},
                   headers=osbh)
        ms = (time.perf_counter() - t) * 1000
        assert r.status_code == 202, r.text
        made.append(r.json()["id"])
        return ms

    cv, cf = [], []
    for i in range(ROUNDS):
        if i % 2:
            cf.append(create_facade()); cv.append(create_v1())
        else:
            cv.append(create_v1()); cf.append(create_facade())
        # Delete at once so the quota never queues the next create.
        for sid in made:
            c.delete(f"{url}/v1/sandboxes/{sid}", headers=v1h)
        made.clear()
        # Stay under the key's rate limit (100 requests/s).
        time.sleep(0.05)

    sid = c.post(f"{url}/v1/sandboxes", json={"template": "default"}, headers=v1h).json()["id"]
    c.get(f"{url}/v1/sandboxes/{sid}/wait?status=running&timeoutSeconds=30", headers=v1h)
    ep = c.get(f"{url}/opensandbox/v1/sandboxes/{sid}/endpoints/44772", headers=osbh).json()
    execd = f"http://{ep['endpoint']}"
    loopback(execd)

    def exec_v1():
        t = time.perf_counter()
        with c.stream("POST", f"{url}/v1/sandboxes/{sid}/exec/stream", headers=v1h,
                      json={"command": ["/bin/sh", "-c", "echo hi"]}) as r:
            assert r.status_code == 200
            buf = ""
            for chunk in r.iter_text():
                buf += chunk
                if "event: exit" in buf:
                    return (time.perf_counter() - t) * 1000
        raise AssertionError("no exit event")

    def exec_facade():
        t = time.perf_counter()
        with c.stream("POST", f"{execd}/command", headers=ep["headers"], json={"command": "echo hi"}) as r:
            assert r.status_code == 200
            buf = ""
            for chunk in r.iter_text():
                buf += chunk
                if '"execution_complete"' in buf:
                    return (time.perf_counter() - t) * 1000
        raise AssertionError("no execution_complete")

    ev, ef = [], []
    for _ in range(5):
        exec_v1(); exec_facade()
    for i in range(ROUNDS):
        if i % 2:
            ef.append(exec_facade()); ev.append(exec_v1())
        else:
            ev.append(exec_v1()); ef.append(exec_facade())
    c.delete(f"{url}/v1/sandboxes/{sid}", headers=v1h)
    return {
        "createV1": series(cv), "createFacade": series(cf),
        "createOverheadP50Ms": round(med(cf) - med(cv), 3),
        "execV1": series(ev), "execFacade": series(ef),
        "execOverheadP50Ms": round(med(ef) - med(ev), 3),
    }


async def main():
    with tempfile.TemporaryDirectory() as tmp:
        proc, url, key = start_dev(tmp)
        try:
            over = overhead(url, key)
            h = {"Authorization": f"Bearer {key}"}
            key_file = f"{tmp}/osb.key"
            with open(key_file, "w") as kf:
                kf.write(OSB_KEY)
            settings = {"apiURL": f"{OSB_URL}/v1", "trust": "private", "apiKeyFile": key_file,
                        "image": IMAGE, "useServerProxy": False}
            r = httpx.post(f"{url}/v1/admin/pools", headers=h, timeout=60,
                           json={"name": "osb", "kind": "opensandbox", "trust": "private", "settings": settings})
            assert r.status_code in (200, 201), r.text
            r = httpx.put(f"{url}/v1/admin/policies/global", headers=h, json={"deniedPools": ["local"]})
            assert r.status_code == 200, r.text
            for _ in range(600):
                pools = httpx.get(f"{url}/v1/admin/pools", headers=h).json()["items"]
                if any(p["name"] == "osb" and p.get("healthy") for p in pools):
                    break
                time.sleep(0.1)
            p8r = await p8(url, key)
        finally:
            proc.terminate()
            proc.wait(10)
    report = {"p8": p8r, "overhead": over,
              "targets": {"p8RatioP50<=0.05": p8r["ratioP50"] <= 0.05,
                          "createOverheadP50Ms<=1": over["createOverheadP50Ms"] <= 1.0,
                          "execOverheadP50Ms<=1": over["execOverheadP50Ms"] <= 1.0}}
    print(json.dumps(report, indent=2))
    # `none`: the functional suite's run, which checks that the bench works end to end and
    # leaves the targets to a benchmark run (a ratio on a busy machine is no behaviour).
    if ENFORCE == "none":
        return 0
    enforced = report["targets"] if ENFORCE == "all" else {"p8RatioP50<=0.05": report["targets"]["p8RatioP50<=0.05"]}
    return 0 if all(enforced.values()) else 1


sys.exit(asyncio.run(main()))
