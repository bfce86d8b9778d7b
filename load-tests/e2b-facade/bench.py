"""The E2B facade's overhead (issue #43 targets), in one run, with the official E2B Python SDK.

Against one `differently dev` (devhost pool: the same backend both ways, so the difference is
the facade and the SDK's protocol), interleaved, the order alternated per round:

- run: `sandbox.commands.run("echo hi")` through the facade (envd's Connect-RPC stream, which
  is a /v1 process) against `POST /v1/sandboxes/{id}/exec` of the same command on the same
  sandbox (httpx). The same command is what the SDK sends: `/bin/bash -l -c "echo hi"` (a
  login shell, about 5 ms more than `/bin/sh -c` on devhost). Targets: facade p50 <= 1.3x
  /v1 and <= 3 ms over it.
- first command: a create then the same command through the facade against `/v1` create ->
  wait until running -> exec, two ways. On the wire (the enforced target, within 10 % of /v1):
  the facade's create and envd `Start` as the SDK sends them, on the same httpx client as the
  /v1 side, so both sides pay the same client. With the SDK (reported): `Sandbox.create()`
  then `commands.run`, which adds the SDK's own work on the facade side only (building the
  sandbox object, a new connection for envd); `sdkCreateOverWireMs` shows that part.

CPU: the `differently dev` process's CPU time (user + system, from /proc) per operation of
each kind, measured over a block of each kind run back to back (the steadiest figure on a
shared machine).

Every address is checked to be loopback before anything is sent. Environment: DIFFERENTLY_BIN
(default target/debug/differently), ROUNDS (default 30), BENCH_ENFORCE (`all`, or `none` for
the functional run that only checks the bench works end to end). Prints a JSON report; exits
1 when an enforced target is missed. Needs the `e2b` package (2.63.0, as scripts/test
installs for the e2e tests) and httpx.
"""
import ipaddress
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse

import httpx


def loopback(url):
    host = urllib.parse.urlsplit(url).hostname
    try:
        ok = ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = host == "localhost"
    if not ok:
        sys.exit(f"refusing {url}: this benchmark only sends traffic to loopback")
    return url


BIN = os.environ.get("DIFFERENTLY_BIN", "target/debug/differently")
ROUNDS = int(os.environ.get("ROUNDS", "30"))
ENFORCE = os.environ.get("BENCH_ENFORCE", "all")
TICKS = os.sysconf("SC_CLK_TCK")
# What `commands.run("echo hi")` starts (the SDK's `Commands.run`: cmd `/bin/bash`, args
# `-l -c <command>`), so both sides run the same program.
SDK_ARGV = ["/bin/bash", "-l", "-c", "echo hi"]


def med(xs):
    return statistics.median(xs)


def series(xs):
    s = sorted(xs)
    return {"p50Ms": round(med(s), 3), "p90Ms": round(s[int(0.9 * (len(s) - 1))], 3), "n": len(s)}


def cpu_ms(pid):
    """User + system CPU time of process `pid` so far, in ms."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / TICKS


def start_dev(tmp):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([BIN, "dev", "--listen", f"127.0.0.1:{port}", "--root", f"{tmp}/sbx"],
                            stdout=subprocess.PIPE, stderr=open(f"{tmp}/dev.log", "w"),
                            stdin=subprocess.DEVNULL, text=True)
    url = loopback(proc.stdout.readline().strip().split("=", 1)[1])
    key = proc.stdout.readline().strip().split("=", 1)[1]
    for _ in range(600):
        try:
            if httpx.get(f"{url}/readyz").status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    return proc, url, key


def main():
    with tempfile.TemporaryDirectory() as tmp:
        proc, url, key = start_dev(tmp)
        os.environ["E2B_API_URL"] = url + "/e2b"
        os.environ["E2B_SANDBOX_URL"] = url + "/e2b/envd"
        os.environ["E2B_API_KEY"] = key
        from e2b import Sandbox  # reads the settings above

        c = httpx.Client(timeout=120, headers={"Authorization": f"Bearer {key}"})
        try:
            report = measure(proc.pid, url, c, Sandbox)
        finally:
            c.close()
            proc.terminate()
            proc.wait(10)
    print(json.dumps(report, indent=2))
    if ENFORCE == "none":
        return 0
    return 0 if all(report["targets"].values()) else 1


def measure(pid, url, c, Sandbox):
    def v1_exec(sid):
        t = time.perf_counter()
        r = c.post(f"{url}/v1/sandboxes/{sid}/exec", json={"command": SDK_ARGV})
        ms = (time.perf_counter() - t) * 1000
        assert r.status_code == 200 and r.json()["stdout"] == "hi\n", r.text
        return ms

    def facade_run(sb):
        t = time.perf_counter()
        r = sb.commands.run("echo hi")
        ms = (time.perf_counter() - t) * 1000
        assert r.stdout == "hi\n" and r.exit_code == 0, r
        return ms

    def v1_first():
        t = time.perf_counter()
        r = c.post(f"{url}/v1/sandboxes", json={"ttlSeconds": 600})
        assert r.status_code == 202, r.text
        sid = r.json()["id"]
        w = c.get(f"{url}/v1/sandboxes/{sid}/wait?status=running&timeoutSeconds=60")
        assert w.status_code == 200 and w.json()["status"] == "running", w.text
        v1_exec(sid)
        ms = (time.perf_counter() - t) * 1000
        c.delete(f"{url}/v1/sandboxes/{sid}")
        return ms

    def facade_first():
        t = time.perf_counter()
        sb = Sandbox.create(timeout=600)
        facade_run(sb)
        ms = (time.perf_counter() - t) * 1000
        sb.kill()
        return ms

    e2b_key = {"X-API-Key": os.environ["E2B_API_KEY"]}

    def wire_create():
        r = c.post(f"{url}/e2b/sandboxes", json={"templateID": "base", "timeout": 600},
                   headers=e2b_key)
        assert r.status_code == 201, r.text
        return r.json()["sandboxID"], r.json()["envdAccessToken"]

    def wire_first():
        t = time.perf_counter()
        sid, token = wire_create()
        msg = json.dumps({"process": {"cmd": SDK_ARGV[0], "args": SDK_ARGV[1:]}}).encode()
        headers = {"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1",
                   "X-Access-Token": token, "E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49983"}
        with c.stream("POST", f"{url}/e2b/envd/process.Process/Start",
                      content=b"\0" + len(msg).to_bytes(4, "big") + msg, headers=headers) as r:
            body = r.read()
        ms = (time.perf_counter() - t) * 1000
        # stdout "hi\n" (base64 aGkK) and an end envelope with no error.
        assert r.status_code == 200 and b"aGkK" in body and body.endswith(b"\x02\0\0\0\x02{}"), body
        c.delete(f"{url}/e2b/sandboxes/{sid}", headers=e2b_key)
        return ms

    def sdk_create():
        t = time.perf_counter()
        sb = Sandbox.create(timeout=600)
        ms = (time.perf_counter() - t) * 1000
        sb.kill()
        return ms

    def wire_create_only():
        t = time.perf_counter()
        sid, _ = wire_create()
        ms = (time.perf_counter() - t) * 1000
        c.delete(f"{url}/e2b/sandboxes/{sid}", headers=e2b_key)
        return ms

    sb = Sandbox.create(timeout=1200)
    sid = sb.sandbox_id
    # Warm both paths (connections, the API's remembered row).
    for _ in range(5):
        v1_exec(sid)
        facade_run(sb)
    rv, rf = [], []
    for i in range(ROUNDS):
        if i % 2:
            rf.append(facade_run(sb)); rv.append(v1_exec(sid))
        else:
            rv.append(v1_exec(sid)); rf.append(facade_run(sb))
    # CPU per operation of the control plane: each kind in a block of its own.
    cpu = {}
    for name, op in (("v1Exec", lambda: v1_exec(sid)), ("facadeRun", lambda: facade_run(sb))):
        before = cpu_ms(pid)
        for _ in range(ROUNDS):
            op()
        cpu[name] = round((cpu_ms(pid) - before) / ROUNDS, 3)
    sb.kill()
    fv, ff, fw, cs, cw = [], [], [], [], []
    for i in range(max(ROUNDS // 3, 3)):
        order = [(fv, v1_first), (ff, facade_first), (fw, wire_first), (cs, sdk_create),
                 (cw, wire_create_only)]
        for out, op in (order if i % 2 else order[::-1]):
            out.append(op())
            time.sleep(0.02)  # stay under the key's rate limit
    run_ratio = med(rf) / med(rv)
    first_ratio = med(fw) / med(fv)
    sdk_ratio = med(ff) / med(fv)
    return {
        "run": {"v1Exec": series(rv), "facade": series(rf), "ratioP50": round(run_ratio, 4),
                "overP50Ms": round(med(rf) - med(rv), 3)},
        "firstCommand": {"v1": series(fv), "facade": series(fw), "ratioP50": round(first_ratio, 4),
                         "sdk": {"facade": series(ff), "ratioP50": round(sdk_ratio, 4),
                                 "sdkCreateOverWireMs": round(med(cs) - med(cw), 3)}},
        "cpuMsPerOp": {**cpu, "ratio": round(cpu["facadeRun"] / cpu["v1Exec"], 3) if cpu["v1Exec"] else None},
        "targets": {
            "runRatioP50<=1.3": run_ratio <= 1.3,
            "runOverP50Ms<=3": med(rf) - med(rv) <= 3.0,
            "firstCommandRatioP50<=1.1": first_ratio <= 1.1,
        },
    }


sys.exit(main())
