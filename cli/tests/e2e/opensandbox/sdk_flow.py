"""The official OpenSandbox Python SDK (1.1.1) driving Differently's OpenSandbox facade.

create -> info -> run (streamed lines, env, exit codes 0 and 3) -> bash sessions -> write -> read -> list ->
renew -> pause -> resume -> kill -> gone, with the async API and the sync one, straight to the
facade's execd endpoint and in server-proxy mode. Configured by the environment:
OSB_DOMAIN (host:port/opensandbox), OSB_KEY (a Differently key), OSB_IMAGE (template).
Prints one line per check; exits 1 on the first mismatch.
"""
import asyncio
import os
import sys
import time
from datetime import datetime, timedelta, timezone

from opensandbox import Sandbox, SandboxSync
from opensandbox.config import ConnectionConfig
from opensandbox.config.connection_sync import ConnectionConfigSync
from opensandbox.manager import SandboxManager
from opensandbox.models.execd import RunCommandOpts
from opensandbox.models.execd_sync import ExecutionHandlersSync
from opensandbox.models.execd import ExecutionHandlers
from opensandbox.models.filesystem import DirectoryListEntry, SearchEntry

DOMAIN = os.environ["OSB_DOMAIN"]
KEY = os.environ["OSB_KEY"]
IMAGE = os.environ.get("OSB_IMAGE", "default")
PAUSE = os.environ.get("OSB_PAUSE", "1") == "1"


def check(label, cond, what):
    print(f"[{label}] {'ok  ' if cond else 'FAIL'} {what}", flush=True)
    if not cond:
        sys.exit(1)


async def async_flow(proxy: bool):
    label = f"async {'proxy' if proxy else 'direct'}"
    cfg = ConnectionConfig(domain=DOMAIN, api_key=KEY, use_server_proxy=proxy,
                           request_timeout=timedelta(seconds=60))
    sb = await Sandbox.create(IMAGE, connection_config=cfg, timeout=timedelta(minutes=10),
                              env={"FLOW": "facade"}, metadata={"flow": "sdk"},
                              resource={"cpu": "1", "memory": "512Mi"},
                              ready_timeout=timedelta(seconds=60))
    try:
        info = await sb.get_info()
        check(label, info.status.state == "Running", f"info: state {info.status.state}")
        check(label, (info.metadata or {}).get("flow") == "sdk", f"info: metadata {info.metadata}")
        streamed = []

        async def on_stdout(m):
            streamed.append(m.text)

        ex = await sb.commands.run("echo one; echo two; echo $FLOW $LOCAL; echo err >&2",
                                   opts=RunCommandOpts(envs={"LOCAL": "x"}),
                                   handlers=ExecutionHandlers(on_stdout=on_stdout))
        out = [m.text for m in ex.logs.stdout]
        err = [m.text for m in ex.logs.stderr]
        check(label, out == ["one", "two", "facade x"], f"run: stdout lines {out}")
        check(label, streamed == out, f"run: streamed handler lines {streamed}")
        check(label, err == ["err"], f"run: stderr {err}")
        check(label, ex.exit_code == 0, f"run: exit code {ex.exit_code}")
        ex = await sb.commands.run("exit 3")
        check(label, ex.exit_code == 3, f"run: exit 3 gives {ex.exit_code}")
        await session_flow(label, sb.commands)
        payload = "zwei: grüße ✓\nline 2\n"
        await sb.files.write_file("/tmp/osb-flow/hello.txt", payload, mode=644)
        back = await sb.files.read_file("/tmp/osb-flow/hello.txt")
        check(label, back == payload, "files: write then read round trip")
        listed = await sb.files.search(SearchEntry(path="/tmp/osb-flow", pattern="*.txt"))
        check(label, [e.path for e in listed] == ["/tmp/osb-flow/hello.txt"],
              f"files: search {[e.path for e in listed]}")
        entries = await sb.files.list_directory(DirectoryListEntry(path="/tmp/osb-flow"))
        check(label, [(e.path, e.size) for e in entries] == [("/tmp/osb-flow/hello.txt", len(payload.encode()))],
              f"files: list {[(e.path, e.size) for e in entries]}")
        before = info.expires_at
        await sb.renew(timedelta(minutes=30))
        after = (await sb.get_info()).expires_at
        check(label, after is not None and (before is None or after > before), f"renew: {before} -> {after}")
        if PAUSE:
            await sb.pause()
            st = (await sb.get_info()).status.state
            check(label, st == "Paused", f"pause: state {st}")
            sb2 = await Sandbox.resume(sb.id, connection_config=cfg)
            ex = await sb2.commands.run("echo resumed")
            check(label, [m.text for m in ex.logs.stdout] == ["resumed"], "resume: commands run")
            back = await sb2.files.read_file("/tmp/osb-flow/hello.txt")
            check(label, back == payload, "resume: the file survived")
            await sb2.close()
        if not proxy:
            await refusals_flow(label, sb, cfg)
    finally:
        await sb.kill()
        try:
            if not proxy:
                await killed_flow(label, sb)
        finally:
            await sb.close()
    mgr = await SandboxManager.create(connection_config=cfg)
    try:
        try:
            await mgr.get_sandbox_info(sb.id)
            check(label, False, "kill: sandbox still there")
        except Exception as e:  # the SDK raises on the 404
            check(label, "SANDBOX_NOT_FOUND" in str(e), f"kill: gone ({type(e).__name__})")
    finally:
        await mgr.close()


async def raised(call):
    """The text of what `call` raised (the SDK's exception, whose message carries the code)."""
    try:
        await call
    except Exception as e:  # any SDK exception
        return f"{type(e).__name__}: {e}"
    return "nothing raised"


async def refusals_flow(label, sb, cfg):
    """What the facade does not serve is refused in a shape the SDK reads, naming what."""
    got = await raised(sb.commands.set_env("A", "B"))
    check(label, "NOT_SUPPORTED" in got and "set_env" in got, f"set_env: refused ({got})")
    got = await raised(sb.patch_metadata({"x": "y"}))
    check(label, "ROUTE_NOT_FOUND" in got, f"patch_metadata: unknown route ({got})")
    got = await raised(Sandbox.create(IMAGE, connection_config=cfg, timeout=timedelta(days=365)))
    check(label, "timeout: " in got and "ttlSeconds" not in got, f"create: the field sent ({got})")
    got = await raised(Sandbox.create(IMAGE, connection_config=cfg, resource={"cpu": "300"}))
    check(label, "resourceLimits.cpu: " in got and "resources" not in got,
          f"create: the field sent ({got})")
    mgr = await SandboxManager.create(connection_config=cfg)
    try:
        got = await raised(mgr.get_template("tpl_x"))
        check(label, "ROUTE_NOT_FOUND" in got, f"get_template: unknown route ({got})")
    finally:
        await mgr.close()


async def killed_flow(label, sb):
    """A killed sandbox is SANDBOX_NOT_FOUND on execd calls too, as on get_info."""
    got = await raised(sb.commands.run("true"))
    check(label, "SANDBOX_NOT_FOUND" in got, f"kill: a command is not found ({got})")
    got = await raised(sb.files.read_file("/tmp/osb-flow/hello.txt"))
    check(label, "SANDBOX_NOT_FOUND" in got, f"kill: a file read is not found ({got})")


async def session_flow(label, commands):
    """A bash session keeps its working directory between runs (execd keeps nothing else)."""
    sid = await commands.create_session()
    ex = await commands.run_in_session(sid, "mkdir -p sess-dir && cd sess-dir && echo in")
    check(label, [m.text for m in ex.logs.stdout] == ["in"] and ex.exit_code == 0,
          f"session: first run {[m.text for m in ex.logs.stdout]} exit {ex.exit_code}")
    ex = await commands.run_in_session(sid, "basename \"$PWD\"")
    got = [m.text for m in ex.logs.stdout]
    check(label, got == ["sess-dir"], f"session: the directory persists {got}")
    ex = await commands.run_in_session(sid, "exit 4")
    check(label, ex.exit_code == 4, f"session: exit 4 gives {ex.exit_code}")
    ex = await commands.run_in_session(sid, "basename \"$PWD\"")
    got = [m.text for m in ex.logs.stdout]
    check(label, got == ["sess-dir"], f"session: still there after an exit {got}")
    other = await commands.create_session()
    ex = await commands.run_in_session(other, "basename \"$PWD\"")
    check(label, [m.text for m in ex.logs.stdout] != ["sess-dir"], "session: two sessions are apart")
    await commands.delete_session(other)
    await commands.delete_session(sid)
    try:
        await commands.run_in_session(sid, "true")
        check(label, False, "session: ran after delete")
    except Exception as e:  # the SDK raises on the 404
        check(label, "SESSION_NOT_FOUND" in str(e) or "404" in str(e),
              f"session: gone after delete ({type(e).__name__}: {e})")


def sync_flow(proxy: bool):
    label = f"sync {'proxy' if proxy else 'direct'}"
    cfg = ConnectionConfigSync(domain=DOMAIN, api_key=KEY, use_server_proxy=proxy,
                               request_timeout=timedelta(seconds=60))
    sb = SandboxSync.create(IMAGE, connection_config=cfg, timeout=None,
                            ready_timeout=timedelta(seconds=60))
    try:
        info = sb.get_info()
        check(label, info.status.state == "Running", f"info: state {info.status.state}")
        # Every Differently sandbox has a TTL: no timeout gets the longest (30 days).
        left = info.expires_at - datetime.now(timezone.utc) if info.expires_at else None
        check(label, left is not None and left > timedelta(days=29), f"create: timeout=None gives {left}")
        streamed = []
        ex = sb.commands.run("for i in 1 2 3; do echo line$i; done",
                             handlers=ExecutionHandlersSync(on_stdout=lambda m: streamed.append(m.text)))
        check(label, streamed == ["line1", "line2", "line3"], f"run: streamed {streamed}")
        check(label, ex.exit_code == 0, f"run: exit {ex.exit_code}")
        check(label, sb.commands.run("exit 3").exit_code == 3, "run: exit 3")
        sid = sb.commands.create_session()
        sb.commands.run_in_session(sid, "mkdir -p sync-sess && cd sync-sess")
        ex = sb.commands.run_in_session(sid, "basename \"$PWD\"")
        got = [m.text for m in ex.logs.stdout]
        check(label, got == ["sync-sess"], f"session: the directory persists {got}")
        sb.commands.delete_session(sid)
        sb.files.write_file("/tmp/osb-sync/a.txt", "sync\n")
        check(label, sb.files.read_file("/tmp/osb-sync/a.txt") == "sync\n", "files: round trip")
        t = time.perf_counter()
        sb.commands.run("echo hi")
        ms = (time.perf_counter() - t) * 1000
        check(label, ms < 900, f"run: echo hi took {ms:.0f} ms (no 1 s hold)")
    finally:
        sb.kill()
        sb.close()


async def main():
    for proxy in (False, True):
        await async_flow(proxy)
    for proxy in (False, True):
        await asyncio.to_thread(sync_flow, proxy)
    print("PASS", flush=True)


asyncio.run(main())
