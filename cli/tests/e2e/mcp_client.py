"""The official MCP Python SDK (PyPI `mcp`) driving Differently's MCP server, over one
transport: `http` (Streamable HTTP at URL/mcp) or `stdio` (`BIN mcp` as a subprocess).

Run by cli/tests/e2e/mcp.rs, which starts `differently dev`, makes the keys and asserts on the
JSON report this prints as its last line. Environment: DIFFERENTLY_URL, KEY_A (org A, every
scope), KEY_READ (org A, sandboxes:read only), KEY_B (another organization), KEY_C (a third, whose
sandboxes land on a fake pool with ports), BIN.
"""

import base64
import json
import os
import sys
import time

import anyio
import httpx2
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

TRANSPORT = sys.argv[1]
URL = os.environ["DIFFERENTLY_URL"]
BIN = os.environ["BIN"]


def connect(key):
    """The SDK's transport for this run, acting with `key`."""
    if TRANSPORT == "http":
        client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=120)
        return streamable_http_client(f"{URL}/mcp", http_client=client)
    env = {"DIFFERENTLY_URL": URL, "DIFFERENTLY_API_KEY": key, "DIFFERENTLY_CLIENT_CONFIG": "/nonexistent"}
    return stdio_client(StdioServerParameters(command=BIN, args=["mcp"], env=env))


def outcome(r):
    """A tool result as plain data."""
    return {"isError": bool(r.is_error), "structured": r.structured_content,
            "text": "".join(c.text for c in r.content if getattr(c, "type", "") == "text")}


def output_summary(r):
    """A sandbox_exec result without its output: what the assertions need, in a short report."""
    sc = r.structured_content or {}
    out = {"isError": bool(r.is_error), "error": sc.get("error")}
    for name in ("stdout", "stderr"):
        text = sc.get(name) or ""
        out[name] = {"len": len(text.encode()), "distinct": sorted(set(text)),
                     "truncated": sc.get(f"{name}Truncated"), "omitted": sc.get(f"{name}OmittedBytes")}
    out["textLen"] = sum(len(c.text.encode()) for c in r.content if getattr(c, "type", "") == "text")
    return out


async def session_run(key, body):
    async with connect(key) as streams:
        read, write = streams[0], streams[1]
        async with ClientSession(read, write) as s:
            init = await s.initialize()
            return await body(s, init)


async def main():
    report = {}

    async def as_a(s, init):
        report["protocolVersion"] = init.protocol_version
        report["serverName"] = init.server_info.name
        tools = await s.list_tools()
        report["tools"] = sorted(t.name for t in tools.tools)
        report["schemasOk"] = all(t.input_schema.get("type") == "object" for t in tools.tools)
        created = outcome(await s.call_tool("sandbox_create", {
            "template": "python", "ttlSeconds": 600, "labels": {"via": "mcp"},
            "env": {"SECRET_TOKEN": "s3cr3t-value"}}))
        report["create"] = created
        sid = created["structured"]["id"]
        report["sandboxId"] = sid
        report["get"] = outcome(await s.call_tool("sandbox_get", {"sandboxId": sid}))
        report["list"] = outcome(await s.call_tool("sandbox_list", {"labels": {"via": "mcp"}}))
        report["exec"] = outcome(await s.call_tool("sandbox_exec", {
            "sandboxId": sid, "command": ["sh", "-c", "echo hi; echo oops >&2; exit 3"]}))
        report["write"] = outcome(await s.call_tool("files_write", {
            "sandboxId": sid, "path": "/tmp/hello.txt", "content": "hello from mcp\n"}))
        report["read"] = outcome(await s.call_tool("files_read", {"sandboxId": sid, "path": "/tmp/hello.txt"}))
        report["writeB64"] = outcome(await s.call_tool("files_write", {
            "sandboxId": sid, "path": "/tmp/bin.dat", "encoding": "base64",
            "content": base64.b64encode(bytes([0, 255, 1, 254])).decode()}))
        report["readB64"] = outcome(await s.call_tool("files_read", {"sandboxId": sid, "path": "/tmp/bin.dat"}))
        report["listFiles"] = outcome(await s.call_tool("files_list", {"sandboxId": sid, "path": "/tmp"}))
        report["mkdir"] = outcome(await s.call_tool("files_mkdir", {
            "sandboxId": sid, "path": "/tmp/made/deep", "mode": "750"}))
        report["mkdirAgain"] = outcome(await s.call_tool("files_mkdir", {"sandboxId": sid, "path": "/tmp/made/deep"}))
        report["mkdirOnFile"] = outcome(await s.call_tool("files_mkdir", {"sandboxId": sid, "path": "/tmp/hello.txt"}))
        report["mkdirListed"] = outcome(await s.call_tool("files_list", {"sandboxId": sid, "path": "/tmp/made"}))
        report["malformed"] = outcome(await s.call_tool("sandbox_exec", {"sandboxId": sid, "command": "ls"}))
        report["badTtl"] = outcome(await s.call_tool("sandbox_extend", {"sandboxId": sid, "ttlSeconds": 0}))
        report["extend"] = outcome(await s.call_tool("sandbox_extend", {"sandboxId": sid, "ttlSeconds": 1200}))
        report["overCap"] = outcome(await s.call_tool("sandbox_exec", {
            "sandboxId": sid, "command": ["sh", "-c", "head -c 1300000 /dev/zero | tr '\\0' a"]}))
        report["overCap"]["stdoutLen"] = len(report["overCap"]["structured"]["stdout"])
        report["overCap"]["structured"]["stdout"] = ""
        report["overCap"]["text"] = ""
        # The loudest output /v1 keeps: over 1 MiB of control characters on each stream (6 bytes
        # of JSON each), buffered and streamed. With the SDK's defaults (a 1 MiB SSE event), both
        # are results, not errors: the result carries the start of each stream and counts the
        # rest; a streamed call's progress carries the output as it comes.
        loud = ("head -c 1300000 /dev/zero | tr '\\0' '\\1'; "
                "head -c 1300000 /dev/zero | tr '\\0' '\\2' >&2")
        report["loudBuffered"] = output_summary(await s.call_tool("sandbox_exec", {
            "sandboxId": sid, "command": ["sh", "-c", loud]}))
        loud_progress = []

        async def on_loud_progress(progress, total, message):
            loud_progress.append(len(message.encode()))

        try:
            r = await s.call_tool("sandbox_exec", {"sandboxId": sid, "command": ["sh", "-c", loud]},
                                  progress_callback=on_loud_progress)
            report["loudStreamed"] = output_summary(r)
        except Exception as e:  # the SDK's own failure (an SSE event over its limit)
            report["loudStreamed"] = {"exception": f"{type(e).__name__}: {e}"}
        report["loudStreamed"]["progressMessages"] = len(loud_progress)
        report["loudStreamed"]["progressBytes"] = sum(loud_progress)
        # Plain text over 1 MiB, streamed: the same bound, counted in bytes of text.
        try:
            r = await s.call_tool("sandbox_exec", {
                "sandboxId": sid, "command": ["sh", "-c", "head -c 1300000 /dev/zero | tr '\\0' a"]},
                progress_callback=on_loud_progress)
            report["bigStreamed"] = output_summary(r)
        except Exception as e:
            report["bigStreamed"] = {"exception": f"{type(e).__name__}: {e}"}
        # A streamed command: progress arrives while it runs, before the result.
        seen = []

        async def on_progress(progress, total, message):
            seen.append({"at": time.monotonic(), "progress": progress, "message": message})

        r = await s.call_tool("sandbox_exec", {
            "sandboxId": sid, "command": ["sh", "-c", "echo first; sleep 2; echo second"]},
            progress_callback=on_progress)
        ended = time.monotonic()
        report["streamed"] = outcome(r)
        report["progress"] = [{"message": p["message"], "beforeEndSeconds": ended - p["at"]} for p in seen]
        # A cancelled command: the client stops waiting; the command must not finish.
        with anyio.move_on_after(1.5):
            await s.call_tool("sandbox_exec", {
                "sandboxId": sid, "command": ["sh", "-c", "sleep 4; echo done > /tmp/marker"]},
                progress_callback=on_progress)
        await anyio.sleep(6)
        report["afterCancel"] = outcome(await s.call_tool("files_read", {"sandboxId": sid, "path": "/tmp/marker"}))
        # Resources: the sandbox's events and its command log.
        templates = await s.list_resource_templates()
        report["resourceTemplates"] = sorted(t.uri_template for t in templates.resource_templates)
        ev = await s.read_resource(f"differently://sandboxes/{sid}/events")
        report["events"] = json.loads(ev.contents[0].text)
        logs = await s.read_resource(f"differently://sandboxes/{sid}/logs")
        report["logs"] = json.loads(logs.contents[0].text)
        await s.subscribe_resource(f"differently://sandboxes/{sid}/logs")
        report["snapshot"] = outcome(await s.call_tool("snapshot_create", {"sandboxId": sid}))
        snap = (report["snapshot"]["structured"] or {}).get("id", "snp_none")
        report["fork"] = outcome(await s.call_tool("sandbox_fork", {"snapshotId": snap}))
        fork_id = (report["fork"]["structured"] or {}).get("id")
        if fork_id:
            report["forkRead"] = outcome(await s.call_tool("files_read", {"sandboxId": fork_id, "path": "/tmp/hello.txt"}))
            await s.call_tool("sandbox_delete", {"sandboxId": fork_id})
        report["port"] = outcome(await s.call_tool("port_url", {"sandboxId": sid, "port": 8080}))
        # A background process: started, read from an offset until its line is there, fed
        # stdin, listed, then killed.
        started = outcome(await s.call_tool("process_start", {
            "sandboxId": sid, "command": ["sh", "-c", "echo ready; read line; echo got $line; sleep 600"],
            "stdin": True, "tag": "mcp"}))
        report["processStart"] = started
        pid = (started["structured"] or {}).get("pid")
        if pid:
            seen, nxt = "", 0
            for _ in range(200):
                r = outcome(await s.call_tool("process_output", {"sandboxId": sid, "pid": pid, "from": nxt}))
                seen += (r["structured"] or {}).get("stdout", "")
                nxt = (r["structured"] or {}).get("next", nxt)
                if "ready" in seen:
                    break
                await anyio.sleep(0.1)
            report["processStdin"] = outcome(await s.call_tool("process_stdin", {
                "sandboxId": sid, "pid": pid, "data": "over\n"}))
            for _ in range(200):
                r = outcome(await s.call_tool("process_output", {"sandboxId": sid, "pid": pid, "from": nxt}))
                seen += (r["structured"] or {}).get("stdout", "")
                nxt = (r["structured"] or {}).get("next", nxt)
                if "got over" in seen:
                    break
                await anyio.sleep(0.1)
            report["processSeen"] = seen
            report["processList"] = outcome(await s.call_tool("process_list", {"sandboxId": sid, "status": "running"}))
            report["processKill"] = outcome(await s.call_tool("process_signal", {"sandboxId": sid, "pid": pid, "signal": "KILL"}))
            for _ in range(200):
                r = outcome(await s.call_tool("process_output", {"sandboxId": sid, "pid": pid, "from": nxt}))
                if (r["structured"] or {}).get("status") != "running":
                    break
                await anyio.sleep(0.1)
            report["processEnded"] = r
        return sid

    sid = await session_run(os.environ["KEY_A"], as_a)

    async def as_read_only(s, init):
        report["denied"] = outcome(await s.call_tool("sandbox_exec", {"sandboxId": sid, "command": ["true"]}))
        report["readOnlyGet"] = outcome(await s.call_tool("sandbox_get", {"sandboxId": sid}))

    await session_run(os.environ["KEY_READ"], as_read_only)

    async def as_b(s, init):
        calls = {
            "sandbox_get": {"sandboxId": sid},
            "sandbox_exec": {"sandboxId": sid, "command": ["true"]},
            "files_read": {"sandboxId": sid, "path": "/tmp/hello.txt"},
            "files_write": {"sandboxId": sid, "path": "/tmp/x", "content": "x"},
            "files_list": {"sandboxId": sid, "path": "/"},
            "files_mkdir": {"sandboxId": sid, "path": "/tmp/theirs"},
            "snapshot_create": {"sandboxId": sid},
            "port_url": {"sandboxId": sid, "port": 8080},
            "sandbox_extend": {"sandboxId": sid, "ttlSeconds": 60},
            "sandbox_delete": {"sandboxId": sid},
        }
        report["crossTenant"] = {n: outcome(await s.call_tool(n, a)) for n, a in calls.items()}
        fork_of = (report.get("snapshot", {}).get("structured") or {}).get("id", "snp_none")
        report["crossTenant"]["sandbox_fork"] = outcome(await s.call_tool("sandbox_fork", {"snapshotId": fork_of}))
        listed = outcome(await s.call_tool("sandbox_list", {}))
        report["crossTenantList"] = [i["id"] for i in listed["structured"]["items"]]
        try:
            await s.read_resource(f"differently://sandboxes/{sid}/events")
            report["crossTenantResource"] = "read"
        except Exception as e:  # the SDK raises the JSON-RPC error
            report["crossTenantResource"] = str(e)

    await session_run(os.environ["KEY_B"], as_b)

    async def as_c(s, init):
        made = outcome(await s.call_tool("sandbox_create", {"ttlSeconds": 600}))
        report["ported"] = made
        made_id = (made["structured"] or {}).get("id")
        if made_id is None:  # reported, and asserted on by mcp.rs
            report["portedUrl"] = {"isError": True, "structured": made["structured"], "text": ""}
            return
        report["portedUrl"] = outcome(await s.call_tool("port_url", {"sandboxId": made_id, "port": 8080}))
        await s.call_tool("sandbox_delete", {"sandboxId": made_id})

    await session_run(os.environ["KEY_C"], as_c)

    async def delete(s, init):
        report["delete"] = outcome(await s.call_tool("sandbox_delete", {"sandboxId": sid}))

    await session_run(os.environ["KEY_A"], delete)
    print(json.dumps(report))


anyio.run(main)
