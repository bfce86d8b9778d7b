"""An agent-framework integration from PyPI, langchain-opensandbox (LangChain deep agents'
OpenSandbox backend), driven against Differently's facade without a model: the backend's
tool operations are called directly, as the agent's tools would call them.
Environment: OSB_DOMAIN, OSB_KEY, OSB_IMAGE. Exits 1 on the first mismatch.
"""
import os
import sys
from datetime import timedelta

from opensandbox.config.connection_sync import ConnectionConfigSync
from opensandbox.sync.sandbox import SandboxSync
from langchain_opensandbox import OpenSandboxSandbox


def check(cond, what):
    print(f"[langchain] {'ok  ' if cond else 'FAIL'} {what}", flush=True)
    if not cond:
        sys.exit(1)


cfg = ConnectionConfigSync(domain=os.environ["OSB_DOMAIN"], api_key=os.environ["OSB_KEY"],
                           request_timeout=timedelta(seconds=60))
sandbox = SandboxSync.create(os.environ.get("OSB_IMAGE", "default"), connection_config=cfg,
                             ready_timeout=timedelta(seconds=60))
backend = OpenSandboxSandbox(sandbox=sandbox)
try:
    check(backend.id == sandbox.id, f"backend id {backend.id}")
    r = backend.execute("echo tool says hi; echo oops >&2; exit 3")
    check("tool says hi" in r.output and "oops" in r.output, f"execute: output {r.output!r}")
    check(r.exit_code == 3, f"execute: exit code {r.exit_code}")
    r = backend.execute("echo fine")
    check(r.exit_code == 0 and r.output.strip() == "fine", f"execute: {r.exit_code} {r.output!r}")
    up = backend.upload_files([("/tmp/lc/notes.txt", b"agent notes\n")])
    check(all(u.error is None for u in up), f"upload_files: {[u.error for u in up]}")
    down = backend.download_files(["/tmp/lc/notes.txt", "/tmp/lc/missing.txt"])
    check(down[0].content == b"agent notes\n" and down[0].error is None, f"download_files: {down[0]}")
    check(down[1].error is not None, f"download_files: missing file is an error ({down[1].error})")
finally:
    sandbox.kill()
    sandbox.close()
print("PASS", flush=True)
