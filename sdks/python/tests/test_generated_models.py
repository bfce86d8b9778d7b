"""The generated models are what ``docs/openapi.json`` produces, and a field added to the
document reaches both SDKs' models by running ``scripts/gen-sdk-models`` (no hand edit): the
generator is run here on a copy of the committed document with one field more."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pytest

ROOT = Path(__file__).resolve().parents[3]
GENERATOR = ROOT / "scripts" / "gen-sdk-models"
DOC = ROOT / "docs" / "openapi.json"
PY_OUT = "sdks/python/src/differently/_generated_models.py"
TS_OUT = "sdks/typescript/src/generated/models.ts"
TS_MANIFEST = "sdks/typescript/src/generated/manifest.ts"


def _run(*args: str) -> "subprocess.CompletedProcess[str]":
    if sys.version_info < (3, 11):
        pytest.fail("scripts/gen-sdk-models needs Python >= 3.11 (tomllib): run the tests on it")
    return subprocess.run(
        [sys.executable, str(GENERATOR), *args], capture_output=True, text=True, timeout=120
    )


def _doc() -> Dict[str, Any]:
    assert DOC.is_file(), f"{DOC} is missing: the api crate's tests write it (see docs/api.md)"
    doc: Dict[str, Any] = json.loads(DOC.read_text())
    return doc


def test_committed_models_are_what_the_document_produces() -> None:
    done = _run("--check")
    assert done.returncode == 0, done.stderr


def test_a_field_added_to_the_document_reaches_both_sdks(tmp_path: Path) -> None:
    doc = _doc()
    sandbox = doc["components"]["schemas"]["Sandbox"]
    sandbox["properties"]["gpuCount"] = {"type": ["integer", "null"], "description": "GPUs held by the gpu pool."}
    sandbox["required"].append("gpuCount")
    changed = tmp_path / "openapi.json"
    changed.write_text(json.dumps(doc))

    # The committed files are now stale, and the check names the first line that differs.
    done = _run("--check", "--doc", str(changed))
    assert done.returncode == 1, done.stderr
    for rel in (PY_OUT, TS_OUT, TS_MANIFEST):
        assert re.search(rf"{re.escape(rel)}:\d+: committed ", done.stderr), done.stderr
    assert "generated '    #: GPUs held by the gpu pool.'" in done.stderr, done.stderr
    assert "run scripts/gen-sdk-models" in done.stderr

    # What the generator writes for that document has the field in each SDK's model.
    sys.path.insert(0, str(GENERATOR.parent))
    try:
        import importlib.machinery
        import importlib.util

        loader = importlib.machinery.SourceFileLoader("gen_sdk_models", str(GENERATOR))
        spec = importlib.util.spec_from_loader("gen_sdk_models", loader)
        assert spec is not None
        gen = importlib.util.module_from_spec(spec)
        sys.modules["gen_sdk_models"] = gen  # its dataclasses look their module up
        loader.exec_module(gen)
    finally:
        sys.path.remove(str(GENERATOR.parent))
        sys.modules.pop("gen_sdk_models", None)
    files = {str(p.relative_to(ROOT)): text for p, text in gen.generate(changed).items()}
    py_sandbox = files[PY_OUT].split("class Sandbox:", 1)[1].split("\nclass ", 1)[0]
    assert "    #: GPUs held by the gpu pool.\n    gpu_count: Optional[int]\n" in py_sandbox
    ts_sandbox = files[TS_OUT].split("export interface Sandbox {", 1)[1].split("}", 1)[0]
    assert "  /** GPUs held by the gpu pool. */\n  gpuCount: number | null;\n" in ts_sandbox
    ts_manifest = files[TS_MANIFEST].split("  Sandbox: {", 1)[1].split("  },", 1)[0]
    assert 'gpuCount: "integer?"' in ts_manifest
    # Nothing else moved: the new lines are the field's (the manifest re-wraps one line).
    for rel, text in files.items():
        before = (ROOT / rel).read_text().splitlines()
        after = text.splitlines()
        added = [line for line in after if line not in before]
        removed = [line for line in before if line not in after]
        rewrapped = [line for line in added if "gpu" not in line.lower()]
        assert len(added) > len(rewrapped), (rel, added)
        assert len(rewrapped) == len(removed) <= 1, (rel, added, removed)


def test_a_document_the_generator_cannot_type_fails_with_where(tmp_path: Path) -> None:
    doc = _doc()
    # An object nested in a model needs an SDK name; the generator says which path lacks one.
    doc["components"]["schemas"]["Sandbox"]["properties"]["gpu"] = {
        "type": "object",
        "properties": {"model": {"type": "string"}},
        "required": ["model"],
    }
    changed = tmp_path / "openapi.json"
    changed.write_text(json.dumps(doc))
    done = _run("--doc", str(changed), "--check")
    assert done.returncode == 2, done.stderr
    assert "Sandbox.gpu" in done.stderr and "sdks/models.toml" in done.stderr, done.stderr
