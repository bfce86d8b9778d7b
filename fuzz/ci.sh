#!/usr/bin/env bash
# The fuzzers in CI: build every target (stable Rust, `-s none`: no sanitizer), replay the
# committed corpus of each (a regression there fails at once), then fuzz each for a bounded
# time. New inputs go to a scratch directory, not the committed corpus; a crash leaves its
# input in fuzz/artifacts/<target>/ and fails the script. See docs/reliability.md.
#
#   fuzz/ci.sh                      # every target, FUZZ_SECONDS (default 10) each
#   FUZZ_SECONDS=600 fuzz/ci.sh request_body
set -euo pipefail
cd "$(dirname "$0")"

CARGO_FUZZ_VERSION=0.13.2
SECONDS_EACH="${FUZZ_SECONDS:-10}"
# Inside the main target directory, so it is ignored by git and cached with it.
TARGET_DIR="$(cd .. && pwd)/target/fuzz"
# --dev: a cold build of the instrumented dependencies takes ~2.5 min instead of ~9 (release)
# on 2 cores; the runs are bounded by time, so the slower unoptimized fuzzing only means
# fewer executions per target. FUZZ_RELEASE=1 builds optimized, for long local runs.
FLAGS=(-s none --codegen-units 16 --target-dir "$TARGET_DIR")
[ -n "${FUZZ_RELEASE:-}" ] || FLAGS+=(--dev)
# The dev profile's full debug info costs ~10% of the cold build's CPU (376 -> 338 CPU-s,
# measured 2026-12-06); line tables keep file:line in a crash's backtrace. As in the main
# workspace's dev profile.
export CARGO_PROFILE_DEV_DEBUG="${CARGO_PROFILE_DEV_DEBUG:-line-tables-only}"

if ! cargo fuzz --version 2>/dev/null | grep -q "$CARGO_FUZZ_VERSION"; then
  echo "fuzz: installing cargo-fuzz $CARGO_FUZZ_VERSION"
  cargo install --quiet --locked cargo-fuzz --version "$CARGO_FUZZ_VERSION"
fi

# The committed lock file must already hold what the targets need: resolving again would need
# the registry and would leave a tracked file changed.
cargo metadata --locked --format-version 1 >/dev/null \
  || { echo "fuzz: fuzz/Cargo.lock is stale; run \`cargo update -w\` in fuzz/ and commit it" >&2; exit 1; }

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo fuzz list)
fi

start=$(date +%s)
cargo fuzz build "${FLAGS[@]}"
echo "fuzz: build took $(( $(date +%s) - start )) s"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# libFuzzer logs every new input; CI shows the last lines of a run only when it fails.
run() { # target, log name, cargo fuzz run arguments…
  local t=$1 log="$scratch/$2.log"
  shift 2
  if ! cargo fuzz run "${FLAGS[@]}" "$t" "$@" >"$log" 2>&1; then
    tail -n 60 "$log" >&2
    echo "fuzz: $t FAILED; the input is in fuzz/artifacts/$t/ (replay: cd fuzz && cargo fuzz run ${FLAGS[*]} $t <file>)" >&2
    exit 1
  fi
  grep -E '^Done [0-9]+ runs' "$log" || true
}
for t in "${targets[@]}"; do
  [ -d "corpus/$t" ] || { echo "fuzz: no committed corpus for $t (fuzz/corpus/$t)" >&2; exit 1; }
  echo "fuzz: $t: replaying $(ls "corpus/$t" | wc -l) committed inputs"
  run "$t" "$t-replay" "corpus/$t" -- -runs=0
  echo "fuzz: $t: fuzzing ${SECONDS_EACH} s"
  mkdir -p "$scratch/$t"
  run "$t" "$t-fuzz" "$scratch/$t" "corpus/$t" -- \
    -max_total_time="$SECONDS_EACH" -max_len=65536 -timeout=10 -rss_limit_mb=2048
done
echo "fuzz: all ${#targets[@]} targets clean in $(( $(date +%s) - start )) s"
