#!/usr/bin/env python3
"""A Differently backend plugin in plain Python (standard library only): the /adapter/v1
protocol of docs/plugins.md, to show that a pool of kind `remote` can be written in any language.

Sandboxes are records in memory; files live in memory too; commands run as host processes
(a subprocess per exec, in its own process group). There is NO isolation: this is an example
and a conformance target, never a backend for untrusted code.

    python3 plugin.py --port 7082 --token-file token.txt
    differently plugin conformance http://127.0.0.1:7082 --token-file token.txt
"""
import argparse, base64, json, os, re, signal, subprocess, sys, threading, time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

CAPABILITIES = ["exec", "exec.stream", "files", "lifecycle.stop"]
CAP = 1024 * 1024  # collected output kept per stream, as the contract says
STATUS = {"transient": 503, "unavailable": 503, "permanent": 422, "not_found": 404,
          "path_not_found": 404, "unsupported_operation": 501, "unauthenticated": 401,
          "unsupported_version": 400}
TOKEN = ""
LOCK = threading.Lock()
INSTANCES = {}  # sandboxId -> {"backendRef", "installationId", "state", "env", "files"}


class Fail(Exception):
    def __init__(self, code, message, field=None, reason=None):
        super().__init__(message)
        self.code, self.message, self.field, self.reason = code, message, field, reason


def instance_json(sid, i):
    return {"backendRef": i["backendRef"], "sandboxId": sid, "state": i["state"]}


def exit_code(rc):  # killed by signal n: 128+n
    return 128 - rc if rc < 0 else rc


def kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def spawn(inst, req):
    cmd = req.get("command") or []
    if not cmd or not all(isinstance(a, str) for a in cmd):
        raise Fail("permanent", "command must name a program", "command")
    cwd = req.get("cwd") or "/"
    if not os.path.isdir(cwd):
        raise Fail("permanent", f"no such directory: {cwd}", "cwd")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp"}
    env.update(inst["env"])
    env.update(req.get("env") or {})
    stdin = req.get("stdin")
    data = base64.b64decode(req["stdinBase64"]) if req.get("stdinBase64") else (stdin or "").encode()
    try:
        p = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)
    except FileNotFoundError:
        return None, data
    return p, data


def run_exec(inst, req):
    started, timeout = time.monotonic(), req.get("timeoutSeconds") or 60
    p, data = spawn(inst, req)
    if p is None:
        return {"exitCode": 127, "stdout": "", "stderr": f"command not found: {req['command'][0]}\n",
                "stdoutTruncated": False, "stderrTruncated": False, "durationMs": 0}
    try:
        out, err = p.communicate(data, timeout=timeout)
        code = exit_code(p.returncode)
    except subprocess.TimeoutExpired:  # past its time: killed, exit 124 as timeout(1) says
        kill_group(p)
        (out, err), code = p.communicate(), 124
    return {"exitCode": code, "stdout": out[:CAP].decode(errors="replace"),
            "stderr": err[:CAP].decode(errors="replace"), "stdoutTruncated": len(out) > CAP,
            "stderrTruncated": len(err) > CAP, "durationMs": int((time.monotonic() - started) * 1000)}


def stream_exec(handler, inst, req):
    started, timeout = time.monotonic(), req.get("timeoutSeconds") or 60
    p, data = spawn(inst, req)
    handler.start(200, "application/x-ndjson")
    write = lambda frame: (handler.wfile.write(json.dumps(frame).encode() + b"\n"), handler.wfile.flush())
    if p is None:
        write({"type": "stderr", "data": base64.b64encode(f"command not found: {req['command'][0]}\n".encode()).decode()})
        write({"type": "exit", "exitCode": 127, "durationMs": 0})
        return
    lock = threading.Lock()
    def pump(pipe, kind):
        for chunk in iter(lambda: os.read(pipe.fileno(), 65536), b""):
            try:
                with lock:
                    write({"type": kind, "data": base64.b64encode(chunk).decode()})
            except OSError:  # the client hung up: cancel the command
                kill_group(p)
                return
    readers = [threading.Thread(target=pump, args=(p.stdout, "stdout")),
               threading.Thread(target=pump, args=(p.stderr, "stderr"))]
    for t in readers:
        t.start()
    try:
        p.stdin.write(data), p.stdin.close()
    except OSError:
        pass
    try:
        code = exit_code(p.wait(timeout=timeout))
    except subprocess.TimeoutExpired:
        kill_group(p), p.wait()
        code = 124
    for t in readers:
        t.join()
    with lock:
        write({"type": "exit", "exitCode": code, "durationMs": int((time.monotonic() - started) * 1000)})


def file_entry(path, f):
    kind = "dir" if f.get("dir") else "file"
    return {"path": path, "type": kind, "size": len(f["data"]), "mode": f["mode"], "modifiedAt": f["at"]}


def list_dir(files, path, depth):
    base = path.rstrip("/")
    under = [p for p in files if p.startswith(base + "/")]
    if base and not under:
        raise Fail("path_not_found", path)
    out = {}
    for p in under:
        parts = p[len(base) + 1:].split("/")
        for level in range(1, min(len(parts), depth) + 1):
            sub = base + "/" + "/".join(parts[:level])
            if level == len(parts):
                out[sub] = file_entry(sub, files[p])
            else:
                out.setdefault(sub, {"path": sub, "type": "dir", "size": 0, "mode": 0o755, "modifiedAt": None})
    return sorted(out.values(), key=lambda e: e["path"])


def make_dir(files, path, mode):  # mkdir -p: False when a directory is already there
    base, parts = path.rstrip("/"), path.rstrip("/").split("/")
    for i in range(2, len(parts) + 1):
        f, last = files.get("/".join(parts[:i])), i == len(parts)
        if f is not None and not f.get("dir"):
            why = "exists and is not a directory" if last else "a parent of the path is not a directory"
            raise Fail("permanent", f"{path}: {why}", "path", "exists_not_directory" if last else "not_a_directory")
    if not base or base in files or any(p.startswith(base + "/") for p in files):
        return False
    files[base] = {"dir": True, "data": b"", "mode": mode, "at": datetime.now(timezone.utc).isoformat()}
    return True


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # no request lines on stderr: queries name paths
        return

    def start(self, status, ctype, length=None, headers=()):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        for k, v in headers:
            self.send_header(k, v)
        if length is not None:
            self.send_header("Content-Length", str(length))
        self.send_header("Connection", "close")
        self.end_headers()

    def reply(self, status, body=None, ctype="application/json", headers=()):
        data = b"" if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
        self.start(status, ctype, len(data), headers)
        self.wfile.write(data)

    def body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def json_body(self):
        try:
            return json.loads(self.body() or b"{}")
        except ValueError as e:
            raise Fail("permanent", f"not JSON: {e}")

    def handle_any(self):
        try:
            auth = self.headers.get("Authorization", "")
            if not TOKEN or auth != "Bearer " + TOKEN:
                raise Fail("unauthenticated", "a bearer token is required" if not auth else "wrong token")
            if self.headers.get("Differently-Adapter-Protocol", "1").strip() != "1":
                raise Fail("unsupported_version", "this plugin speaks protocol version 1")
            url = urlsplit(self.path)
            q = {k: v[0] for k, v in parse_qs(url.query).items()}
            self.route(url.path, q)
        except Fail as f:
            body = {"code": f.code, "message": f.message, "retryable": f.code in ("transient", "unavailable", "insufficient_capacity")}
            if f.field:
                body["field"] = f.field
            if f.reason:
                body["reason"] = f.reason
            self.reply(STATUS[f.code], body)
        except BrokenPipeError:
            pass

    do_GET = do_PUT = do_POST = do_DELETE = handle_any

    def route(self, path, q):
        verb = self.command
        if path == "/adapter/v1/info" and verb == "GET":
            return self.reply(200, {"protocol": "differently-adapter", "versions": [1],
                                    "name": "python-example", "capabilities": CAPABILITIES})
        if path == "/adapter/v1/health" and verb == "GET":
            return self.reply(204)
        if path == "/adapter/v1/instances" and verb == "GET":
            with LOCK:
                items = [instance_json(s, i) for s, i in INSTANCES.items()
                         if i["installationId"] == q.get("installationId")]
            return self.reply(200, {"instances": items})
        m = re.fullmatch(r"/adapter/v1/instances/([^/]+)(/.*)?", path)
        if not m:
            raise Fail("unsupported_operation", f"no such route: {verb} {path}")
        sid, rest = m.group(1), m.group(2) or ""
        if rest == "":
            return self.instance(sid, verb)
        with LOCK:
            inst = INSTANCES.get(sid)
        if inst is None or inst["backendRef"] != q.get("backendRef"):  # deleted, or another one
            raise Fail("not_found", "no such instance")
        if rest in ("/exec", "/exec/stream") and verb == "POST":
            req = self.json_body()
            if inst["state"] != "running":
                raise Fail("permanent", f"the instance is {inst['state']}")
            return self.reply(200, run_exec(inst, req)) if rest == "/exec" else stream_exec(self, inst, req)
        if rest in ("/stop", "/start") and verb == "POST":
            want, other = ("stopped", "running") if rest == "/stop" else ("running", "stopped")
            if inst["state"] not in (want, other):
                raise Fail("permanent", f"cannot {rest[1:]} an instance that is {inst['state']}")
            inst["state"] = want
            return self.reply(204)
        if rest == "/renew" and verb == "POST":
            self.json_body()
            return self.reply(204)
        if rest in ("/files", "/files/list", "/files/directories"):
            return self.files(inst["files"], rest, verb, q)
        raise Fail("unsupported_operation", f"no such route: {verb} {path}")

    def instance(self, sid, verb):
        with LOCK:
            inst = INSTANCES.get(sid)
            if verb == "PUT":
                req = self.json_body()
                if req.get("sandboxId") != sid:
                    raise Fail("permanent", "the body's sandboxId is not the path's", "sandboxId")
                if req.get("fromSnapshot"):
                    raise Fail("unsupported_operation", "snapshots")
                if inst is None:
                    inst = INSTANCES[sid] = {"backendRef": "py-" + sid, "state": "running", "files": {},
                                             "installationId": req.get("installationId"), "env": req.get("env") or {}}
                return self.reply(200, instance_json(sid, inst))
            if verb == "GET":
                if inst is None:
                    raise Fail("not_found", "no such instance")
                return self.reply(200, instance_json(sid, inst))
            if verb == "DELETE":  # a missing instance is fine
                return INSTANCES.pop(sid, None), self.reply(204)
        raise Fail("unsupported_operation", f"no such route: {verb}")

    def files(self, files, rest, verb, q):
        path = q.get("path", "")
        if not path.startswith("/") or "/../" in path + "/":
            raise Fail("permanent", "path must be absolute, without ..", "path")
        if rest == "/files/list" and verb == "GET":
            return self.reply(200, {"entries": list_dir(files, path, int(q.get("depth", "1")))})
        if rest == "/files/directories" and verb == "POST":
            return self.reply(200, {"created": make_dir(files, path, int(q.get("mode", "493")))})
        if verb == "PUT":
            now = datetime.now(timezone.utc).isoformat()
            files[path] = {"data": self.body(), "mode": int(q.get("mode", "420")), "at": now}
            return self.reply(204)
        if path not in files:
            raise Fail("path_not_found", path)
        if verb == "DELETE":
            return files.pop(path), self.reply(204)
        data, status = files[path]["data"], 200
        rng = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if rng:
            end = int(rng.group(2)) + 1 if rng.group(2) else len(data)
            data, status = data[int(rng.group(1)):end], 206
        total = str(len(files[path]["data"]))
        return self.reply(status, data, "application/octet-stream", [("Differently-Total-Size", total)])


def main():
    global TOKEN
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=7082, help="loopback port (0: any free one)")
    ap.add_argument("--token-file", help="file holding the bearer token (else DIFFERENTLY_PLUGIN_TOKEN)")
    args = ap.parse_args()
    TOKEN = open(args.token_file).read().strip() if args.token_file else os.environ.get("DIFFERENTLY_PLUGIN_TOKEN", "")
    if not TOKEN:
        sys.exit("a token is required: --token-file FILE or DIFFERENTLY_PLUGIN_TOKEN")
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)  # loopback only
    print(f"plugin listening on http://127.0.0.1:{server.server_address[1]}/adapter/v1", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
