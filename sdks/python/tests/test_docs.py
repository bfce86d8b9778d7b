"""docs/sdk-python.md's quickstart, run as written against the session's server, so the doc
cannot drift from the SDK."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from .conftest import REPO, Server

DOC = REPO / "docs" / "sdk-python.md"
MARKER = "<!-- quickstart: tested by sdks/python/tests/test_docs.py -->"


def _block(marker: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    assert marker in text, f"{DOC} lost its marker {marker}"
    m = re.search(re.escape(marker) + r"\s*```python\n(.*?)```", text, re.S)
    assert m, "no python block after the marker"
    return m.group(1)


def test_quickstart_runs(server: Server, tmp_path: Path) -> None:
    script = tmp_path / "quickstart.py"
    script.write_text(_block(MARKER), encoding="utf-8")
    env = {
        **os.environ,
        "DIFFERENTLY_URL": server.url,
        "DIFFERENTLY_API_KEY": server.admin_key,
        "PYTHONPATH": str(REPO / "sdks" / "python" / "src"),
    }
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "0 hello world"
    outs = " ".join(line[len("out: "):] for line in lines if line.startswith("out: "))
    assert outs.split() == ["1", "2", "3"]
    assert "exit: 0" in lines and "42" in lines and "['/work/data.txt']" in lines
    assert any(re.fullmatch(r"event: paused seq \d+", line) for line in lines)
    assert lines[-1] == "error: 422 validation_failed resources.cpu"


def test_async_example_runs(server: Server, tmp_path: Path) -> None:
    text = DOC.read_text(encoding="utf-8")
    m = re.search(r"## Async.*?```python\n(.*?)```", text, re.S)
    assert m
    script = tmp_path / "async_example.py"
    script.write_text(m.group(1) + "\nimport asyncio\nasyncio.run(main())\n", encoding="utf-8")
    env = {
        **os.environ,
        "DIFFERENTLY_URL": server.url,
        "DIFFERENTLY_API_KEY": server.admin_key,
        "PYTHONPATH": str(REPO / "sdks" / "python" / "src"),
    }
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "hi\n"


def test_terminal_example_runs(server: Server, tmp_path: Path) -> None:
    script = tmp_path / "terminal.py"
    script.write_text(_block("<!-- terminal: tested by sdks/python/tests/test_docs.py -->"), encoding="utf-8")
    env = {
        **os.environ,
        "DIFFERENTLY_URL": server.url,
        "DIFFERENTLY_API_KEY": server.admin_key,
        "PYTHONPATH": str(REPO / "sdks" / "python" / "src"),
    }
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines == ["2 times hi", "exit code 3"], lines


def test_webhooks_example_runs(server: Server, tmp_path: Path) -> None:
    # The session's server lets webhooks reach http on loopback (conftest), as the doc says.
    script = tmp_path / "webhooks.py"
    script.write_text(_block("<!-- webhooks: tested by sdks/python/tests/test_docs.py -->"), encoding="utf-8")
    env = {
        **os.environ,
        "DIFFERENTLY_URL": server.url,
        "DIFFERENTLY_API_KEY": server.admin_key,
        "PYTHONPATH": str(REPO / "sdks" / "python" / "src"),
    }
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert sorted(lines[:2]) == sorted(
        ["sse: sandbox.status.changed running cause backend", "webhook: sandbox.status.changed running verified"]
    ), lines
    assert lines[2:] == ["delivered: True"], lines


def test_processes_example_runs(server: Server, tmp_path: Path) -> None:
    script = tmp_path / "processes.py"
    script.write_text(_block("<!-- processes: tested by sdks/python/tests/test_docs.py -->"), encoding="utf-8")
    env = {
        **os.environ,
        "DIFFERENTLY_URL": server.url,
        "DIFFERENTLY_API_KEY": server.admin_key,
        "PYTHONPATH": str(REPO / "sdks" / "python" / "src"),
    }
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "ExecStdout(data=b'ready\\n')",
        "b'hello\\ndone\\n'",
        "0 exited",
    ]
