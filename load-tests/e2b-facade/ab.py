"""Two builds of `differently` compared with bench.py, in one sitting: the runs alternate
between them (A, B, B, A, ...) so both see the same machine, and the median of each figure
over its runs is printed per build, with the ratio B/A.

    A=/path/to/old/differently B=target/debug/differently RUNS=4 ROUNDS=30 \\
        $DIFFERENTLY_E2B_PYTHON load-tests/e2b-facade/ab.py

Each run is a fresh `differently dev` (bench.py starts it from DIFFERENTLY_BIN). Prints one
JSON object; enforces nothing (bench.py's own targets are per build, in its report).
"""
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BUILDS = {"A": os.environ.get("A"), "B": os.environ.get("B")}
RUNS = int(os.environ.get("RUNS", "4"))
FIGURES = {
    "runFacadeP50Ms": ("run", "facade", "p50Ms"),
    "runV1ExecP50Ms": ("run", "v1Exec", "p50Ms"),
    "runRatioP50": ("run", "ratioP50"),
    "runOverP50Ms": ("run", "overP50Ms"),
    "firstFacadeP50Ms": ("firstCommand", "facade", "p50Ms"),
    "firstV1P50Ms": ("firstCommand", "v1", "p50Ms"),
    "firstRatioP50": ("firstCommand", "ratioP50"),
    "firstSdkFacadeP50Ms": ("firstCommand", "sdk", "facade", "p50Ms"),
    "firstSdkRatioP50": ("firstCommand", "sdk", "ratioP50"),
    "cpuFacadeRunMs": ("cpuMsPerOp", "facadeRun"),
    "cpuV1ExecMs": ("cpuMsPerOp", "v1Exec"),
}


def dig(report, path):
    for k in path:
        report = report[k]
    return report


def run(binary):
    env = dict(os.environ, DIFFERENTLY_BIN=binary, BENCH_ENFORCE="none")
    out = subprocess.run([sys.executable, os.path.join(HERE, "bench.py")], env=env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def main():
    if not all(BUILDS.values()):
        sys.exit("set A and B to the two `differently` binaries to compare")
    reports = {"A": [], "B": []}
    for i in range(RUNS):
        for name in ("A", "B") if i % 2 == 0 else ("B", "A"):
            reports[name].append(run(BUILDS[name]))
    summary = {}
    for name, rs in reports.items():
        summary[name] = {f: round(statistics.median(dig(r, p) for r in rs), 3)
                         for f, p in FIGURES.items()}
    summary["B/A"] = {f: round(summary["B"][f] / summary["A"][f], 3) if summary["A"][f] else None
                      for f in FIGURES}
    summary["runs"] = RUNS
    print(json.dumps(summary, indent=2))


main()
