"""MCP overhead of running a command: `sandbox_exec` over `POST /mcp` against the very
`/v1` exec it maps to (`POST /v1/sandboxes/{id}/exec`), on one sandbox of a running
`differently dev` (or any API), same client, same keep-alive connection, interleaved so both
see the same machine load. Prints p50/p90/p99 of each and of the per-pair difference.

    differently dev --listen 127.0.0.1:7070 &   # prints DIFFERENTLY_URL and DIFFERENTLY_API_KEY
    export DIFFERENTLY_URL=… DIFFERENTLY_API_KEY=…
    ~/.cache/differently/mcp-py/bin/python load-tests/mcp/bench.py [--n 500]

Needs only httpx2 (installed with the MCP Python SDK) — or httpx.
"""

import argparse
import json
import os
import statistics
import time

try:
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx

p = argparse.ArgumentParser()
p.add_argument("--n", type=int, default=500)
p.add_argument("--warmup", type=int, default=30)
args = p.parse_args()
url, key = os.environ["DIFFERENTLY_URL"], os.environ["DIFFERENTLY_API_KEY"]
c = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60)

sbx = c.post("/v1/sandboxes", json={"template": "bench", "ttlSeconds": 900}).json()["id"]
c.get(f"/v1/sandboxes/{sbx}/wait", params={"status": "running", "timeoutSeconds": 60})
cmd = ["true"]
init = c.post("/mcp", json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}},
    headers={"Accept": "application/json, text/event-stream"})
session = {"Mcp-Session-Id": init.headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25",
           "Accept": "application/json, text/event-stream"}


def v1():
    t = time.perf_counter()
    r = c.post(f"/v1/sandboxes/{sbx}/exec", json={"command": cmd})
    d = time.perf_counter() - t
    assert r.status_code == 200 and r.json()["exitCode"] == 0, r.text
    return d


def mcp(i):
    body = {"jsonrpc": "2.0", "id": i, "method": "tools/call",
            "params": {"name": "sandbox_exec", "arguments": {"sandboxId": sbx, "command": cmd}}}
    t = time.perf_counter()
    r = c.post("/mcp", json=body, headers=session)
    d = time.perf_counter() - t
    res = r.json()["result"]
    assert not res.get("isError") and res["structuredContent"]["exitCode"] == 0, r.text
    return d


for i in range(args.warmup):
    v1(), mcp(i)
a, b = [], []
for i in range(args.n):
    # Alternate which goes first, so neither always follows the other.
    if i % 2:
        a.append(v1()); b.append(mcp(i))
    else:
        b.append(mcp(i)); a.append(v1())
c.delete(f"/v1/sandboxes/{sbx}")


def q(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] * 1000


diff = [y - x for x, y in zip(a, b)]
out = {
    "n": args.n,
    "v1_exec_ms": {"p50": q(a, .5), "p90": q(a, .9), "p99": q(a, .99)},
    "mcp_exec_ms": {"p50": q(b, .5), "p90": q(b, .9), "p99": q(b, .99)},
    "overhead_ms": {"p50_of_pairs": statistics.median(diff) * 1000,
                    "p50_difference": q(b, .5) - q(a, .5)},
}
print(json.dumps(out, indent=2))
