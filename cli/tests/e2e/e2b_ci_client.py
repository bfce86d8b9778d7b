"""The E2B code interpreter SDK (PyPI `e2b-code-interpreter`) against the E2B facade, run by
cli/tests/e2e/e2b_code_interpreter.rs, which asserts on the JSON report printed last.

Set up as a user sets it up: E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY (a Differently
key). PHASE=unsupported: a sandbox whose pool cannot expose ports. PHASE=flow: a sandbox with
nothing on port 49999, then the test double of E2B's code-interpreter server
(fixtures/code_interpreter_server.py, SERVER) started in it through the SDK's own
`commands.run(background=True)`, and the SDK's calls: run_code (stdout, a result, an error with
its traceback), contexts (create, list, run in, restart, remove), a run_code timeout whose
close reaches the server, and raw port requests (no token, a wrong token, a plain-text 404).
"""

import json
import os
import sys
import time
import traceback

import httpx
from e2b_code_interpreter import Sandbox


def outcome(fn):
    """{"ok": value} or {"error", "mro", "message"}."""
    try:
        return {"ok": fn()}
    except Exception as e:  # reported, asserted on by the Rust side
        return {
            "error": type(e).__name__,
            "mro": [c.__name__ for c in type(e).__mro__],
            "message": str(e),
            "trace": traceback.format_exc(limit=3),
        }


def execution(ex):
    return {
        "stdout": ex.logs.stdout,
        "stderr": ex.logs.stderr,
        "results": [r.text for r in ex.results],
        "error": None
        if ex.error is None
        else {"name": ex.error.name, "value": ex.error.value, "traceback": ex.error.traceback},
        "count": ex.execution_count,
    }


def unsupported():
    sbx = Sandbox.create()
    try:
        return {
            "id": sbx.sandbox_id,
            "run_code": outcome(lambda: execution(sbx.run_code("1+1"))),
            "contexts": outcome(lambda: [c.id for c in sbx.list_code_contexts()]),
        }
    finally:
        sbx.kill()


def raw(sbx, method, path, headers):
    base = os.environ["E2B_SANDBOX_URL"].rstrip("/")
    h = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49999", **headers}
    r = httpx.request(method, f"{base}{path}", headers=h, timeout=60)
    return [r.status_code, r.headers.get("content-type"), r.text]


def flow():
    tag = os.environ["TAG"]
    log = f"/tmp/e2b-ci-{tag}.log"
    r = {"tag": tag}
    sbx = Sandbox.create(timeout=600)
    r["id"] = sbx.sandbox_id
    r["has_traffic_token"] = bool(sbx.traffic_access_token)
    try:
        # Nothing listens on 49999 yet.
        r["nothing_run"] = outcome(lambda: execution(sbx.run_code("1")))
        r["nothing_contexts"] = outcome(lambda: [c.id for c in sbx.list_code_contexts()])

        # The server, started through the SDK as a user would start one.
        with open(os.environ["SERVER"]) as f:
            src = f.read()
        # cwd "/": the sandbox's directory (a devhost pool without isolation has no
        # /home/user of its own).
        server = sbx.commands.run(
            f"exec python3 - {log} <<'E2B_CI_EOF'\n{src}\nE2B_CI_EOF", background=True, cwd="/"
        )
        deadline = time.monotonic() + 60
        while True:
            ready = outcome(lambda: execution(sbx.run_code("'ready'")))
            if "ok" in ready or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        r["ready"] = ready
        if "ok" not in ready:
            server.kill()
            out = outcome(lambda: server.wait())
            r["server_output"] = out
            return r

        r["run"] = outcome(lambda: execution(sbx.run_code("x = 41\nprint('hello', x)\nx + 1")))
        seen = []
        r["streamed"] = outcome(
            lambda: execution(
                sbx.run_code(
                    "import sys\nprint('out line')\nprint('err line', file=sys.stderr)",
                    on_stdout=lambda m: seen.append(["stdout", m.line]),
                    on_stderr=lambda m: seen.append(["stderr", m.line]),
                )
            )
        )
        r["seen"] = seen
        r["error"] = outcome(
            lambda: execution(sbx.run_code("def f():\n    raise ValueError('bad value')\nf()"))
        )
        r["envs"] = outcome(
            lambda: execution(
                sbx.run_code("import os\nos.environ['CI_VAR']", envs={"CI_VAR": "from-envs"})
            )
        )

        # Contexts.
        ctx = sbx.create_code_context(cwd="/tmp")
        r["context"] = {"id": ctx.id, "language": ctx.language, "cwd": ctx.cwd}
        r["ctx_set"] = outcome(lambda: execution(sbx.run_code("y = 7", context=ctx)))
        r["ctx_get"] = outcome(lambda: execution(sbx.run_code("y", context=ctx)))
        r["default_get"] = outcome(lambda: execution(sbx.run_code("y")))
        r["listed"] = outcome(lambda: [c.id for c in sbx.list_code_contexts()])
        r["restart"] = outcome(lambda: sbx.restart_code_context(ctx))
        r["after_restart"] = outcome(lambda: execution(sbx.run_code("y", context=ctx)))
        r["remove"] = outcome(lambda: sbx.remove_code_context(ctx.id))
        r["listed_after"] = outcome(lambda: [c.id for c in sbx.list_code_contexts()])
        r["removed_run"] = outcome(lambda: execution(sbx.run_code("1", context=ctx)))

        # A timeout: the SDK closes its connection; the close must reach the server.
        ticks = "import time\nwhile True:\n    print('tick')\n    time.sleep(0.2)"
        t0 = time.monotonic()
        r["timeout"] = outcome(lambda: execution(sbx.run_code(ticks, timeout=3)))
        r["timeout_seconds"] = time.monotonic() - t0
        deadline = time.monotonic() + 60
        while True:
            text = sbx.commands.run(f"cat {log}", cwd="/").stdout
            if "cancelled" in text or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        r["cancel_seen_after"] = time.monotonic() - t0
        r["server_log"] = text.splitlines()
        r["after_cancel"] = outcome(lambda: execution(sbx.run_code("'still here'")))

        # Raw requests to the port, as get_host users send them.
        token = sbx._envd_access_token
        r["raw_no_token"] = raw(sbx, "GET", "/contexts", {})
        r["raw_wrong_token"] = raw(sbx, "GET", "/contexts", {"X-Access-Token": "ea1.x.y"})
        r["raw_health"] = raw(sbx, "GET", "/health", {"X-Access-Token": token})
        r["raw_unknown"] = raw(sbx, "GET", "/nowhere?a=1", {"X-Access-Token": token})
        r["raw_port_word"] = raw(
            sbx, "GET", "/health", {"X-Access-Token": token, "E2b-Sandbox-Port": "jupyter"}
        )
        server.kill()
    finally:
        sbx.kill()
        try:
            os.remove(log)
        except OSError:
            pass
    return r


print(json.dumps(unsupported() if os.environ["PHASE"] == "unsupported" else flow()))
sys.stdout.flush()
