#!/usr/bin/env bash
# Before/after in one run: alternates two server binaries through both SDK benchmarks, pass
# after pass, so the machine's load falls on both alike.
#
#   load-tests/sdk-throughput/compare.sh BEFORE_BIN AFTER_BIN [PASSES] [ROUNDS]
#
# Needs what bench.mjs and python_sdk.py need (sdks/typescript built, httpx importable by
# $PYTHON, default python3). Each bench starts its own `differently dev` on 127.0.0.1.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
before="$1" after="$2" passes="${3:-2}" rounds="${4:-3}"
py="${PYTHON:-python3}"
for p in $(seq 1 "$passes"); do
  for which in before after; do
    bin="$before"; [ "$which" = after ] && bin="$after"
    echo "=== pass $p $which python ($bin)"
    DIFFERENTLY_BIN="$bin" "$py" "$here/python_sdk.py" --rounds "$rounds"
    echo "=== pass $p $which typescript ($bin)"
    DIFFERENTLY_BIN="$bin" node "$here/bench.mjs" --rounds "$rounds"
  done
done
