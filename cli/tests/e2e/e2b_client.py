"""Drives Differently's E2B facade with the official E2B Python SDK (PyPI `e2b`), unchanged.

Run by cli/tests/e2e/e2b_facade.rs against a real `differently dev` (devhost pool). Settings
come from the environment: DIFFERENTLY_URL, KEY_A (org A), KEY_B (another organization),
KEY_A2 (org A, revoked mid-flow), ADMIN_KEY, KEY_ORG_WIDE (org A, bound to no project). With E2B_FLOW_ALIAS=1 the KEY_* are `e2b_`
aliases (for SDKs 2.25-2.4x, which refuse other key shapes) and DLY_KEY_A is the key itself.
With E2B_FLOW_BACKEND=opensandbox (cli/tests/e2e/e2b_facade_osb.rs: every sandbox on an
`opensandbox` pool) the flow also runs a background command without stdin (the steps that
use stdin record the backend's refusal, as they do unchanged) and types one command a line
into the terminal.
Prints one JSON report as its last line; the Rust test asserts on it. Every step records what
the SDK answered (a value, or the exception's class and message), so a failure shows there.
"""

import base64
import datetime
import json
import os
import struct
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid

URL = os.environ["DIFFERENTLY_URL"]
KEY_A = os.environ["KEY_A"]
KEY_B = os.environ["KEY_B"]
os.environ["E2B_API_URL"] = URL + "/e2b"
os.environ["E2B_SANDBOX_URL"] = URL + "/e2b/envd"
os.environ["E2B_API_KEY"] = KEY_A

import e2b  # noqa: E402  (reads the settings above)
from e2b import Sandbox, SandboxQuery  # noqa: E402
from importlib.metadata import version  # noqa: E402

report = {"sdk": version("e2b"), "validate_env": os.environ.get("E2B_VALIDATE_API_KEY")}
ALIAS = os.environ.get("E2B_FLOW_ALIAS") == "1"
# An OpenSandbox pool (no `exec.stdin`): its own background step below, and the
# terminal typed into one command a line.
OPENSANDBOX = os.environ.get("E2B_FLOW_BACKEND") == "opensandbox"

# The control-plane routes the SDK sends (SDKs up to 2.4x send them through httpx; 2.63 does
# not use it, and its routes are then not recorded).
routes = []
try:
    import httpx

    _send = httpx.Client.send

    def _recording_send(self, request, *args, **kwargs):
        if request.url.path.startswith("/e2b/") and not request.url.path.startswith("/e2b/envd"):
            routes.append(f"{request.method} {request.url.path}")
        return _send(self, request, *args, **kwargs)

    httpx.Client.send = _recording_send
except ImportError:
    pass
report["routes"] = routes


def key_id(key):
    """The id of a Differently key, or of the key an `e2b_` alias spells."""
    if key.startswith("e2b_"):
        key = bytes.fromhex(key[4:]).decode()
    return "_".join(key.split("_")[1:3])



def outcome(fn):
    """A step's result: {"ok": value} or {"error": class name, "message": …}."""
    try:
        return {"ok": fn()}
    except Exception as e:  # noqa: BLE001 - the class is what the test checks
        return {"error": type(e).__name__, "message": str(e),
                "mro": [c.__name__ for c in type(e).__mro__]}


tag = uuid.uuid4().hex[:10]
report["tag"] = tag
sbx = Sandbox.create(timeout=120, metadata={"flow": tag, "a=b": "odd key"},
                     envs={"E2B_FLOW_TOKEN": tag})
sid = sbx.sandbox_id
report["id"] = sid
info = sbx.get_info()
report["info"] = {"state": str(info.state.value if hasattr(info.state, "value") else info.state),
                  "metadata": info.metadata, "template": info.template_id,
                  "sandbox_id": info.sandbox_id}
report["metrics"] = outcome(lambda: len(sbx.get_metrics()))
report["is_running"] = sbx.is_running()
# The domain get_host() is built from: one that never resolves, not E2B's own (the SDK's
# fallback when the answer has none).
report["get_host"] = sbx.get_host(3000)
report["sandbox_domain"] = getattr(sbx, "sandbox_domain", None)


def seconds_left(end_at):
    return (end_at - datetime.datetime.now(datetime.timezone.utc)).total_seconds()


# A paused sandbox outlives the timeout it had (E2B's timeout runs only while it runs), and a
# resume gives it the timeout connect passes. In a thread, as it waits past that timeout.
def paused_kept():
    s = Sandbox.create(timeout=3)
    # Named by the flow's tag (an OpenSandbox flow's fake writes to this host's /tmp).
    kept = f"/tmp/e2b-kept-{tag}.txt"
    s.files.write(kept, "kept " + tag)
    s.pause()
    time.sleep(8)  # past its 3 s and the TTL sweep after it
    info = Sandbox.get_info(s.sandbox_id)
    paused = [str(info.state.value), round(seconds_left(info.end_at) / 86400)]
    r = Sandbox.connect(s.sandbox_id, timeout=90)
    info = r.get_info()
    resumed = [str(info.state.value), seconds_left(info.end_at), r.files.read(kept)]
    r.kill()
    return {"paused": paused, "resumed": resumed}


paused_thread = threading.Thread(target=lambda: report.update(paused_kept=outcome(paused_kept)))
paused_thread.start()

# Users: root's home is made at create as the default user's is, so a command as root runs
# there on a fresh sandbox; another user's missing home is named, with the way round it.
report["user_root"] = outcome(lambda: sbx.commands.run('echo "$HOME"; pwd', user="root").stdout)
report["user_other"] = outcome(lambda: sbx.commands.run("pwd", user="alice").stdout)
report["user_other_cwd"] = outcome(
    lambda: sbx.commands.run("pwd", user="alice", cwd="/tmp").stdout)

# Commands: stdout, stderr, the sandbox's env, a non-zero exit, env and cwd per call.
res = sbx.commands.run('echo "out $E2B_FLOW_TOKEN"; echo "err line" 1>&2')
report["run"] = {"stdout": res.stdout, "stderr": res.stderr, "exit_code": res.exit_code}


def failing():
    try:
        sbx.commands.run('echo before; echo oops 1>&2; exit 3')
    except e2b.CommandExitException as e:
        return {"exit_code": e.exit_code, "stdout": e.stdout, "stderr": e.stderr,
                "error": e.error}
    return "no exception"


report["exit"] = outcome(failing)
report["env_cwd"] = outcome(lambda: sbx.commands.run(
    'echo "$MY_VAR:$(pwd):$HOME"', envs={"MY_VAR": "v1"}, cwd="/tmp").stdout)
report["home_cwd"] = outcome(lambda: sbx.commands.run("pwd").stdout)

# Streaming, bound by events: the command prints, then waits until a file appears that is
# written (through the files API) only once on_stdout has delivered the first line. Output
# held until the end would leave the command waiting until its 30 s deadline.
gate = f"/tmp/e2b-gate-{tag}"
chunks = []
wrote = threading.Event()


def on_stdout(s):
    chunks.append(s)
    if not wrote.is_set():
        wrote.set()
        threading.Thread(target=lambda: sbx.files.write(gate, "go")).start()


report["stream"] = outcome(lambda: sbx.commands.run(
    f'echo first; while [ ! -e {gate} ]; do sleep 0.05; done; echo second',
    on_stdout=on_stdout, timeout=30).stdout)
report["stream_chunks"] = chunks
report["deadline"] = outcome(lambda: sbx.commands.run("sleep 20", timeout=2).stdout)

# Files.
d = f"/tmp/e2b-{tag}"
text = "hello " + tag + "\nzwei: grüße ✓\n"
report["write"] = outcome(lambda: sbx.files.write(f"{d}/a.txt", text).path)
report["read"] = outcome(lambda: sbx.files.read(f"{d}/a.txt"))
report["read_bytes"] = outcome(lambda: base64.b64encode(
    bytes(sbx.files.read(f"{d}/a.txt", format="bytes"))).decode())
report["write_files"] = outcome(lambda: [i.path for i in sbx.files.write_files([
    {"path": f"{d}/m1.txt", "data": "one"}, {"path": f"{d}/sub/m2.txt", "data": b"two"}])])
report["relative"] = outcome(lambda: [sbx.files.write("rel.txt", "rel").path,
                                      sbx.commands.run("cat rel.txt").stdout])
# An empty path (left out of the request by the SDK's proto3 JSON) is the home, as in envd.
report["empty_path"] = outcome(lambda: [
    sorted(e.path for e in sbx.files.list("")) == sorted(e.path for e in sbx.files.list("~")),
    "rel.txt" in [e.name for e in sbx.files.list("")], sbx.files.exists(""),
    sbx.files.make_dir("")])
report["cmd_sees_file"] = outcome(lambda: sbx.commands.run(f"cat {d}/m1.txt").stdout)
sbx.commands.run(f"echo from-cmd > {d}/cmd.txt")
report["file_sees_cmd"] = outcome(lambda: sbx.files.read(f"{d}/cmd.txt"))
report["list"] = outcome(lambda: sorted((e.name, str(e.type.value if e.type else None))
                                        for e in sbx.files.list(d)))
report["list_depth2"] = outcome(lambda: sorted(e.path for e in sbx.files.list(d, depth=2)))
report["exists"] = outcome(lambda: [sbx.files.exists(f"{d}/a.txt"),
                                    sbx.files.exists(f"{d}/missing")])
report["get_info"] = outcome(lambda: (lambda i: {"name": i.name, "size": i.size, "type":
                                                 str(i.type.value), "mode": i.mode,
                                                 "permissions": i.permissions})(
    sbx.files.get_info(f"{d}/a.txt")))
report["make_dir"] = outcome(lambda: [sbx.files.make_dir(f"{d}/new/deep"),
                                      sbx.files.make_dir(f"{d}/new/deep")])
report["rename"] = outcome(lambda: sbx.files.rename(f"{d}/a.txt", f"{d}/new/b.txt").path)
report["after_rename"] = outcome(lambda: [sbx.files.exists(f"{d}/a.txt"),
                                          sbx.files.read(f"{d}/new/b.txt")])
report["rename_missing"] = outcome(lambda: sbx.files.rename(f"{d}/nope", f"{d}/x").path)


# Rename is envd's (Go's os.Rename): never into a directory; onto one is an error.
def rename_semantics():
    rd = f"{d}/ren"
    sbx.files.write(f"{rd}/f.txt", "f")
    sbx.files.write(f"{rd}/g.txt", "g")
    sbx.files.make_dir(f"{rd}/empty")
    sbx.files.write(f"{rd}/full/x.txt", "x")

    def moved(src, dst):
        e = sbx.files.rename(f"{rd}/{src}", f"{rd}/{dst}")
        return [e.path, str(e.type.value)]

    out = {
        "file_onto_dir": outcome(lambda: moved("f.txt", "empty")),
        "dir_onto_empty_dir": outcome(lambda: moved("full", "empty")),
        "file_onto_itself": outcome(lambda: moved("f.txt", "f.txt")),
        "dir_onto_itself": outcome(lambda: moved("full", "full")),
        "file_onto_file": outcome(lambda: moved("g.txt", "f.txt")),
        "dir_to_new": outcome(lambda: moved("full", "moved")),
    }
    out["tree"] = sorted(e.path[len(rd) + 1:] for e in sbx.files.list(rd, depth=2))
    out["f_txt"] = sbx.files.read(f"{rd}/f.txt")
    sbx.files.remove(rd)
    return out


report["rename_semantics"] = outcome(rename_semantics)
# A name over 255 bytes is the caller's mistake, not a backend outage.
long_name = f"{d}/" + "n" * 300
report["long_name"] = {
    "write": outcome(lambda: sbx.files.write(long_name, "x").path),
    "make_dir": outcome(lambda: sbx.files.make_dir(long_name)),
    "read": outcome(lambda: sbx.files.read(long_name)),
}
report["remove"] = outcome(lambda: [sbx.files.remove(f"{d}/new"),
                                    sbx.files.exists(f"{d}/new/b.txt")])
report["read_missing"] = outcome(lambda: sbx.files.read(f"{d}/missing"))

# Watching a directory: files that commands create, write and remove are seen (the facade
# polls the listing, so each event comes within a few seconds; waits are bound by events).
wd = f"{d}/watched"
sbx.files.make_dir(wd)


def wait_for(fn, what, deadline=30):
    """Calls fn() until it is true or the deadline passes."""
    end = time.monotonic() + deadline
    while not fn():
        if time.monotonic() > end:
            raise TimeoutError(f"no {what} within {deadline} s")
        time.sleep(0.2)


def sync_watch():
    h = sbx.files.watch_dir(wd)
    seen = []

    def saw(name, kind):
        seen.extend([e.name, e.type.value] for e in h.get_new_events())
        return [name, kind] in seen

    sbx.commands.run(f"echo one > {wd}/f.txt")
    wait_for(lambda: saw("f.txt", "create"), "create")
    sbx.commands.run(f"echo more >> {wd}/f.txt")
    wait_for(lambda: saw("f.txt", "write"), "write")
    sbx.commands.run(f"rm {wd}/f.txt")
    wait_for(lambda: saw("f.txt", "remove"), "remove")
    h.stop()
    return seen


report["watch_sync"] = outcome(sync_watch)


def async_watch():
    import asyncio
    from e2b import AsyncSandbox

    async def run():
        asbx = await AsyncSandbox.connect(sid)
        got, exits = [], []

        async def until(name, kind):
            end = time.monotonic() + 30
            while [name, kind] not in got:
                if time.monotonic() > end:
                    raise TimeoutError(f"no {kind} of {name}: {got}")
                await asyncio.sleep(0.2)

        h = await asbx.files.watch_dir(
            wd, lambda e: got.append([e.name, e.type.value]), recursive=True,
            on_exit=lambda err: exits.append(repr(err)), timeout=60)
        await asbx.commands.run(f"mkdir -p {wd}/sub && echo x > {wd}/sub/g.txt")
        await until("sub/g.txt", "create")
        await asbx.commands.run(f"echo y >> {wd}/sub/g.txt")
        await until("sub/g.txt", "write")
        await asbx.commands.run(f"rm -r {wd}/sub")
        await until("sub/g.txt", "remove")
        await h.stop()
        return got

    return asyncio.run(run())


report["watch_async"] = outcome(async_watch)

# Signed file URLs, fetched with plain HTTP and no headers (as a browser would).
def http(url, data=None, content_type=None, headers=None):
    """A request with no SDK headers: [status, body]."""
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    if content_type:
        req.add_header("Content-Type", content_type)
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return [r.status, r.read().decode(errors="replace")]
    except urllib.error.HTTPError as e:
        return [e.code, e.read().decode(errors="replace")]


def multipart(name, data):
    boundary = "b" + uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            f"filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n").encode()
    body += data + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


signed_path = f"{d}/signed.txt"
sbx.files.write(signed_path, "signed " + tag)
down = sbx.download_url(signed_path)
report["signed_url"] = down
report["signed_get"] = http(down)
report["signed_get_expiring"] = http(sbx.download_url(signed_path, use_signature_expiration=300))
report["signed_get_expired"] = http(sbx.download_url(signed_path, use_signature_expiration=-60))
forged = down[:-3] + ("AAA" if not down.endswith("AAA") else "BBB")
report["signed_get_forged"] = http(forged)
up = sbx.upload_url(f"{d}/uploaded.txt")
report["signed_post"] = http(up, *multipart("uploaded.txt", ("up " + tag).encode()))
report["signed_post_read"] = outcome(lambda: sbx.files.read(f"{d}/uploaded.txt"))
# A read signature does not write.
report["signed_read_as_write"] = http(down, *multipart("x", b"x"))

# Background processes: a command fed stdin (send_stdin, then stream_input where the SDK has
# it), listed while it runs, its output read through its handle, then killed by pid.
def background():
    h = sbx.commands.run("cat", background=True, stdin=True, timeout=0)
    pid = h.pid
    sbx.commands.send_stdin(pid, f"ping {tag}\n")
    want = f"ping {tag}\n"
    if hasattr(sbx.commands, "stream_input"):
        sbx.commands.stream_input(pid, ["one\n", b"two\n"])
        want += "one\ntwo\n"
    listed = [[p.pid, p.cmd, p.args, p.envs, p.cwd] for p in sbx.commands.list()
              if p.pid == pid]
    seen = ""
    for out, _, _ in h:
        seen += out or ""
        if seen == want or len(seen) > len(want):
            break
    killed = sbx.commands.kill(pid)
    try:
        end = h.wait().exit_code
    except e2b.CommandExitException as e:
        end = [e.exit_code, e.error]
    return {"pid": pid, "listed": listed, "seen": seen, "want": want, "killed": killed,
            "end": end, "after": [p.pid for p in sbx.commands.list() if p.pid == pid],
            "kill_again": sbx.commands.kill(pid)}


report["background"] = outcome(background)


# A background command without stdin (what a backend without `exec.stdin` runs): its output
# through its handle, listed, input refused, killed by pid, then gone from the list.
def background_no_stdin():
    h = sbx.commands.run(f"echo bg {tag}; exec sleep 600", background=True, timeout=0)
    pid = h.pid
    seen = ""
    for out, _, _ in h:
        seen += out or ""
        if "\n" in seen:
            break
    listed = [[p.pid, p.cmd, p.args, p.envs, p.cwd] for p in sbx.commands.list()
              if p.pid == pid]
    stdin = outcome(lambda: sbx.commands.send_stdin(pid, "x"))
    killed = sbx.commands.kill(pid)
    try:
        end = h.wait().exit_code
    except e2b.CommandExitException as e:
        end = [e.exit_code, e.error]
    return {"pid": pid, "listed": listed, "seen": seen, "stdin": stdin, "killed": killed,
            "end": end, "after": [p.pid for p in sbx.commands.list() if p.pid == pid],
            "kill_again": sbx.commands.kill(pid)}


if OPENSANDBOX:
    report["background_no_stdin"] = outcome(background_no_stdin)


# A dropped stream does not kill a background process: reconnected by pid, it still runs and
# its later output (after the gate file appears) arrives; output from before is not replayed.
def detached():
    gate = f"/tmp/e2b-bg-gate-{tag}"
    h = sbx.commands.run(f"echo early; while [ ! -e {gate} ]; do sleep 0.05; done; echo late; "
                         "exec sleep 600", background=True, timeout=0)
    pid = h.pid
    for out, _, _ in h:
        if out and "early" in out:
            break
    h.disconnect()
    running = [p.pid for p in sbx.commands.list()]
    h2 = sbx.commands.connect(pid, timeout=0)
    sbx.files.write(gate, "go")
    seen = ""
    for out, _, _ in h2:
        seen += out or ""
        if "late" in seen:
            break
    killed = h2.kill()
    try:
        end = h2.wait().exit_code
    except e2b.CommandExitException as e:
        end = e.exit_code
    return {"running_after_drop": pid in running, "reattached": seen, "killed": killed,
            "end": end}


report["detached"] = outcome(detached)
report["close_stdin"] = outcome(lambda: (lambda h: [
    sbx.commands.send_stdin(h.pid, "last\n"), sbx.commands.close_stdin(h.pid),
    h.wait().stdout][2])(sbx.commands.run("cat", background=True, stdin=True)))
report["connect_missing"] = outcome(lambda: sbx.commands.connect(4294967295).wait().exit_code)
report["kill_missing"] = outcome(lambda: sbx.commands.kill(4294967295))


# A terminal: resized, typed into, its output as the PTY wrote it.
def terminal():
    from e2b import PtySize
    out = []
    h = sbx.pty.create(PtySize(rows=24, cols=80), timeout=60)
    sbx.pty.resize(h.pid, PtySize(rows=30, cols=100))
    typed = b"echo pty$((40+2)); stty size; exit\n"
    if OPENSANDBOX:
        # One command a line: the fake OpenSandbox's PTY runs a scripted shell (no lists).
        typed = b"echo pty42\nstty size\nexit\n"
    sbx.pty.send_stdin(h.pid, typed)
    r = h.wait(on_pty=lambda b: out.append(bytes(b)))
    text = b"".join(out).decode(errors="replace")
    return {"exit": r.exit_code, "echo": "pty42" in text, "size": "30 100" in text,
            "text": text[-300:]}


report["terminal"] = outcome(terminal)
# A running process of A's, which B must not reach (below).
a_bg = sbx.commands.run("sleep 600", background=True, timeout=0)

# Lifecycle.
report["set_timeout"] = outcome(lambda: sbx.set_timeout(200))
report["list_meta"] = outcome(lambda: [s.sandbox_id for s in Sandbox.list(
    query=SandboxQuery(metadata={"flow": tag})).next_items()])
report["list_odd_key"] = outcome(lambda: [s.sandbox_id for s in Sandbox.list(
    query=SandboxQuery(metadata={"a=b": "odd key"})).next_items()])
report["list_other_tag"] = outcome(lambda: [s.sandbox_id for s in Sandbox.list(
    query=SandboxQuery(metadata={"flow": "not-" + tag})).next_items()])
sbx.files.write(f"{d}/keep.txt", "survives")
report["pause"] = outcome(lambda: sbx.pause())
report["state_paused"] = outcome(lambda: str(sbx.get_info().state.value))
report["pause_again"] = outcome(lambda: sbx.pause())
report["resume"] = outcome(lambda: Sandbox.connect(sid).sandbox_id)
report["state_resumed"] = outcome(lambda: str(sbx.get_info().state.value))
report["survived"] = outcome(lambda: sbx.files.read(f"{d}/keep.txt"))


# Snapshots: taken after a file is written (and the file changed after it), listed by
# sandbox a page at a time and by name, restored by create(template=<snapshot id>) with the
# file as it was, deleted (True, then False). Feature-detected: an SDK without them says so.
def snapshots():
    import inspect
    out = {}
    snap_path = f"{d}/snap.txt"
    sbx.files.write(snap_path, "in snapshot " + tag)
    s1 = sbx.create_snapshot(name=f"snap-{tag}")
    out["first"] = {"id": s1.snapshot_id, "names": s1.names}
    sbx.files.write(snap_path, "changed after " + tag)
    s2 = Sandbox.create_snapshot(sid)
    out["second"] = {"id": s2.snapshot_id, "names": s2.names}
    pages, p = [], Sandbox.list_snapshots(sandbox_id=sid, limit=1)
    while p.has_next and len(pages) < 5:
        pages.append([s.snapshot_id for s in p.next_items()])
    out["pages"] = pages
    out["own_list"] = [s.snapshot_id for s in sbx.list_snapshots().next_items()]
    out["by_name"] = [[s.snapshot_id, s.names] for s in
                      Sandbox.list_snapshots(name=f"snap-{tag}").next_items()]
    if "mode" in inspect.signature(Sandbox._cls_create_snapshot).parameters:
        out["memory"] = outcome(lambda: sbx.create_snapshot(mode="full").snapshot_id)
    restored = Sandbox.create(template=s1.snapshot_id, timeout=60)
    out["restored"] = outcome(lambda: [restored.files.read(snap_path),
                                       restored.get_info().template_id])
    out["restored_id"] = restored.sandbox_id
    # Another organization: not found on every route.
    out["b_list_sandbox"] = outcome(lambda: [s.snapshot_id for s in Sandbox.list_snapshots(
        sandbox_id=sid, api_key=KEY_B).next_items()])
    out["b_list_all"] = outcome(lambda: [s.snapshot_id for s in Sandbox.list_snapshots(
        api_key=KEY_B).next_items()])
    out["b_create_from"] = outcome(lambda: Sandbox.create(
        template=s1.snapshot_id, timeout=60, api_key=KEY_B).sandbox_id)
    out["b_take"] = outcome(lambda: Sandbox.create_snapshot(sid, api_key=KEY_B).snapshot_id)
    out["b_delete"] = outcome(lambda: Sandbox.delete_snapshot(s1.snapshot_id, api_key=KEY_B))
    restored.kill()
    out["delete"] = outcome(lambda: [Sandbox.delete_snapshot(s1.snapshot_id),
                                     Sandbox.delete_snapshot(s1.snapshot_id),
                                     Sandbox.delete_snapshot(s2.snapshot_id)])
    out["delete_template"] = outcome(lambda: Sandbox.delete_snapshot("base"))
    out["after_delete"] = outcome(lambda: [s.snapshot_id for s in Sandbox.list_snapshots(
        sandbox_id=sid).next_items()])
    out["create_from_deleted"] = outcome(lambda: Sandbox.create(
        template=s1.snapshot_id, timeout=60).sandbox_id)
    return out


if hasattr(Sandbox, "create_snapshot") and hasattr(Sandbox, "list_snapshots"):
    report["snapshots"] = outcome(snapshots)
else:
    report["snapshots_skipped"] = f"e2b {version('e2b')} has no create_snapshot/list_snapshots"

# Another organization's key, and its envd token, on this sandbox.
report["b_get"] = outcome(lambda: Sandbox.get_info(sid, api_key=KEY_B).sandbox_id)
report["b_connect"] = outcome(lambda: Sandbox.connect(sid, api_key=KEY_B).sandbox_id)
report["b_set_timeout"] = outcome(lambda: Sandbox.set_timeout(sid, 100, api_key=KEY_B))
report["b_pause"] = outcome(lambda: Sandbox.pause(sid, api_key=KEY_B))
report["b_kill"] = outcome(lambda: Sandbox.kill(sid, api_key=KEY_B))
report["b_metrics"] = outcome(lambda: Sandbox.get_metrics(sid, api_key=KEY_B))
report["b_list"] = outcome(lambda: [s.sandbox_id for s in Sandbox.list(
    query=SandboxQuery(metadata={"flow": tag}), api_key=KEY_B).next_items()])
sbx_b = Sandbox.create(timeout=60, api_key=KEY_B)
token_b = sbx_b._envd_access_token
report["b_token_own"] = outcome(lambda: sbx_b.commands.run("echo b").stdout)
# B's token on A's pid, through B's own sandbox: not found, and A's process runs on.
report["b_pid_kill"] = outcome(lambda: sbx_b.commands.kill(a_bg.pid))
report["b_pid_stdin"] = outcome(lambda: sbx_b.commands.send_stdin(a_bg.pid, "x"))
report["b_pid_connect"] = outcome(lambda: sbx_b.commands.connect(a_bg.pid).wait().exit_code)
report["b_pid_list"] = outcome(lambda: [p.pid for p in sbx_b.commands.list()])


def raw(path, body=None, content_type=None, method="POST", sandbox=sid, token=token_b):
    """One envd request with B's token naming A's sandbox: (status, body)."""
    req = urllib.request.Request(URL + "/e2b/envd" + path, data=body, method=method)
    req.add_header("X-Access-Token", token)
    req.add_header("E2b-Sandbox-Id", sandbox)
    req.add_header("E2b-Sandbox-Port", "49983")
    if content_type:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return [r.status, r.read().decode(errors="replace")]
    except urllib.error.HTTPError as e:
        return [e.code, e.read().decode(errors="replace")]


def envelope(msg):
    data = json.dumps(msg).encode()
    return struct.pack(">BI", 0, len(data)) + data


start = envelope({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo leak"]}})
cross = {
    "start": raw("/process.Process/Start", start, "application/connect+json"),
    "stat": raw("/filesystem.Filesystem/Stat", json.dumps({"path": d}).encode(),
                "application/json"),
    "list_dir": raw("/filesystem.Filesystem/ListDir", json.dumps({"path": d}).encode(),
                    "application/json"),
    "make_dir": raw("/filesystem.Filesystem/MakeDir", json.dumps({"path": d + "/b"}).encode(),
                    "application/json"),
    "move": raw("/filesystem.Filesystem/Move", json.dumps(
        {"source": f"{d}/keep.txt", "destination": f"{d}/stolen"}).encode(), "application/json"),
    "remove": raw("/filesystem.Filesystem/Remove", json.dumps({"path": d}).encode(),
                  "application/json"),
    "download": raw(f"/files?path={d}/keep.txt", method="GET"),
    "upload": raw(f"/files?path={d}/planted", b"x", "application/octet-stream"),
    "health": raw("/health", method="GET"),
    "proc_list": raw("/process.Process/List", b"{}", "application/json"),
    "proc_signal": raw("/process.Process/SendSignal", json.dumps(
        {"process": {"pid": a_bg.pid}, "signal": "SIGNAL_SIGKILL"}).encode(), "application/json"),
    "proc_connect": raw("/process.Process/Connect", envelope({"process": {"pid": a_bg.pid}}),
                        "application/connect+json"),
    "no_token": raw("/filesystem.Filesystem/Stat", json.dumps({"path": d}).encode(),
                    "application/json", token=""),
}
report["cross_envd"] = cross

# B's token and signatures on A's watcher and files.
watcher_a = sbx.files.watch_dir(d)
report["b_watcher"] = raw("/filesystem.Filesystem/GetWatcherEvents", json.dumps(
    {"watcherId": watcher_a._watcher_id}).encode(), "application/json",
    sandbox=sbx_b.sandbox_id)
report["b_remove_watcher"] = raw("/filesystem.Filesystem/RemoveWatcher", json.dumps(
    {"watcherId": watcher_a._watcher_id}).encode(), "application/json",
    sandbox=sbx_b.sandbox_id)
report["a_watcher_after_b"] = outcome(lambda: watcher_a.get_new_events() or [])
watcher_a.stop()
b_url = sbx_b.download_url(signed_path)
report["b_signed_own"] = http(b_url)
report["b_signed_naming_a"] = http(b_url, headers={"E2b-Sandbox-Id": sid})
report["a_signed_naming_b"] = http(down, headers={"E2b-Sandbox-Id": sbx_b.sandbox_id})


def watch_own_deadline():
    req = urllib.request.Request(
        URL + "/e2b/envd/filesystem.Filesystem/WatchDir",
        data=envelope({"path": d}), method="POST")
    for k, v in {"X-Access-Token": sbx._envd_access_token, "E2b-Sandbox-Id": sid,
                 "Content-Type": "application/connect+json", "Connect-Timeout-Ms": "2500",
                 "Keepalive-Ping-Interval": "1"}.items():
        req.add_header(k, v)
    with urllib.request.urlopen(req, timeout=25) as r:
        return stream_end([r.status, r.read().decode()])
# The facade's own deadline: Connect-Timeout-Ms ends a command the client would wait for.
def stream_end(answer):
    """The JSON messages of a Connect stream body."""
    body, msgs = answer[1].encode(), []
    while len(body) >= 5:
        flags, n = struct.unpack(">BI", body[:5])
        msgs.append([flags, json.loads(body[5:5 + n])])
        body = body[5 + n:]
    return msgs


def own_deadline():
    req = urllib.request.Request(
        URL + "/e2b/envd/process.Process/Start",
        data=envelope({"process": {"cmd": "/bin/sh", "args": ["-c", "echo started; sleep 30"]}}),
        method="POST")
    for k, v in {"X-Access-Token": sbx._envd_access_token, "E2b-Sandbox-Id": sid,
                 "Content-Type": "application/connect+json", "Connect-Timeout-Ms": "1500",
                 "Keepalive-Ping-Interval": "1"}.items():
        req.add_header(k, v)
    with urllib.request.urlopen(req, timeout=25) as r:
        return stream_end([r.status, r.read().decode()])


report["own_deadline"] = outcome(own_deadline)
report["watch_own_deadline"] = outcome(watch_own_deadline)
report["after_cross"] = outcome(lambda: [sbx.files.read(f"{d}/keep.txt"),
                                         sbx.files.exists(f"{d}/planted"),
                                         sbx.files.exists(f"{d}/b")])
report["a_bg_after_cross"] = outcome(lambda: [a_bg.pid in [p.pid for p in sbx.commands.list()],
                                              a_bg.kill()])
sbx_b.kill()

# A token stops working when its key is revoked.
key_a2 = os.environ["KEY_A2"]
sbx2 = Sandbox.create(timeout=60, api_key=key_a2)
report["a2_before"] = outcome(lambda: sbx2.commands.run("echo a2").stdout)
revoke = urllib.request.Request(
    URL + "/v1/keys/" + key_id(key_a2), method="DELETE")
revoke.add_header("Authorization", "Bearer " + os.environ["ADMIN_KEY"])
report["a2_revoke"] = urllib.request.urlopen(revoke, timeout=30).status
report["a2_run_after"] = outcome(lambda: sbx2.commands.run("echo a2").stdout)
report["a2_read_after"] = outcome(lambda: sbx2.files.read("/etc/hostname"))
report["a2_stat_after"] = outcome(lambda: sbx2.files.exists("/tmp"))
Sandbox.kill(sbx2.sandbox_id)

# Bad input and a bad key.
report["bad_key"] = outcome(lambda: Sandbox.create(api_key="not-a-key").sandbox_id)
# Shaped like an alias (so an SDK that checks the shape sends it), but no key's: the facade.
report["bad_alias"] = outcome(lambda: Sandbox.create(api_key="e2b_" + "0" * 40).sandbox_id)
if ALIAS:
    # The SDK's own check is on: the key as it is never leaves the SDK.
    report["dly_key_refused"] = outcome(
        lambda: Sandbox.create(api_key=os.environ["DLY_KEY_A"]).sandbox_id)
report["bad_env"] = outcome(lambda: Sandbox.create(envs={"1bad": "x"}).sandbox_id)
report["timeout_negative"] = outcome(lambda: Sandbox.create(timeout=-5).sandbox_id)
report["set_timeout_negative"] = outcome(lambda: sbx.set_timeout(-1))
# An organization-wide key: E2B's API cannot name a project, so create says which key to use.
report["org_wide_key"] = outcome(
    lambda: Sandbox.create(timeout=30, api_key=os.environ["KEY_ORG_WIDE"]).sandbox_id)
# Routes of E2B's API the facade does not serve: 501 with the facade's message, which the SDK
# shows (a 404 would become "Sandbox … not found" for a sandbox that runs).
if hasattr(sbx, "update_network"):
    report["update_network"] = outcome(lambda: sbx.update_network({"deny_out": ["1.1.1.1"]}))
if hasattr(sbx, "fork"):
    report["fork"] = outcome(lambda: sbx.fork())
api_key = {"X-API-KEY": os.environ["E2B_API_KEY"]}
report["unserved_routes"] = {
    "templates_get": http(URL + "/e2b/templates/base", headers=api_key),
    "sandboxes_metrics": http(URL + "/e2b/sandboxes/metrics", headers=api_key),
    "unknown": http(URL + "/e2b/no/such/route", headers=api_key),
}
report["after_unserved"] = outcome(lambda: sbx.is_running())
paused_thread.join()

# The end.
w_end = sbx.files.watch_dir(d)
report["kill"] = outcome(lambda: sbx.kill())
report["after_kill_get"] = outcome(lambda: sbx.get_info().state)
report["after_kill_kill"] = outcome(lambda: Sandbox.kill(sid))
report["after_kill_run"] = outcome(lambda: sbx.commands.run("echo x").stdout)


def watcher_after_kill():
    """The watcher's answer once it is no longer 200 (its sandbox ended), by a deadline."""
    body = json.dumps({"watcherId": w_end._watcher_id}).encode()
    end = time.monotonic() + 30
    while True:
        ans = raw("/filesystem.Filesystem/GetWatcherEvents", body, "application/json",
                  token=sbx._envd_access_token)
        if ans[0] != 200 or time.monotonic() > end:
            return ans
        time.sleep(0.2)


report["watcher_after_kill"] = outcome(watcher_after_kill)
report["after_kill_list"] = outcome(lambda: [s.sandbox_id for s in Sandbox.list(
    query=SandboxQuery(metadata={"flow": tag})).next_items()])

print(json.dumps(report, default=str))
sys.stdout.flush()
