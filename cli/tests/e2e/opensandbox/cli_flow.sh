#!/usr/bin/env bash
# The official OpenSandbox CLI (`osb`, PyPI opensandbox-cli) against Differently's facade:
# sandbox create/get/list/renew/pause/resume/health/kill, command run (exit codes, background,
# status, logs), file write/cat/info/search/rm. Environment: OSB (the osb executable),
# OPEN_SANDBOX_DOMAIN, OPEN_SANDBOX_API_KEY, OSB_IMAGE. Exits non-zero on the first mismatch.
set -euo pipefail
export OPENSANDBOX_DISABLE_METRICS=1 NO_COLOR=1
o() { "$OSB" --no-color "$@"; }
fail() { echo "[cli] FAIL $*"; exit 1; }
ok() { echo "[cli] ok   $*"; }
jq_py() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

id=$(o sandbox create -i "${OSB_IMAGE:-default}" -m via=cli -o json | jq_py 'd["id"]')
[[ $id == sbx_* ]] || fail "create: id $id"; ok "sandbox create: $id"
trap 'o sandbox kill "$id" >/dev/null 2>&1 || true' EXIT
state=$(o sandbox get "$id" -o json | jq_py 'd["status"]["state"]')
[[ $state == Running ]] || fail "get: state $state"; ok "sandbox get: $state"
o sandbox list -o json | jq_py '[i["id"] for i in d["items"]]' | grep -q "$id" || fail "list: $id missing"
ok "sandbox list has it"
out=$(o command run "$id" -- sh -c 'echo hello from cli')
[[ $out == "hello from cli" ]] || fail "command run: $out"; ok "command run: $out"
if o command run "$id" -- sh -c 'exit 3' >/dev/null 2>&1; then fail "exit 3 reported success"; fi
ok "command run: exit 3 fails"
o file write "$id" /tmp/cli/a.txt -c "from cli" >/dev/null
[[ $(o file cat "$id" /tmp/cli/a.txt) == "from cli" ]] || fail "file cat"; ok "file write + cat"
size=$(o file info "$id" /tmp/cli/a.txt -o json | jq_py 'd[0]["size"]')
[[ $size == 8 ]] || fail "file info: size $size"; ok "file info: size 8"
o file search "$id" /tmp/cli --pattern '*.txt' -o json | jq_py '[i["path"] for i in d]' | grep -q a.txt \
  || fail "file search"; ok "file search"
o file rm "$id" /tmp/cli/a.txt >/dev/null
if o file cat "$id" /tmp/cli/a.txt >/dev/null 2>&1; then fail "file rm: still readable"; fi
ok "file rm"
exe=$(o command run -d "$id" -o json -- sh -c 'echo bg1; echo bg2' | jq_py 'd["execution_id"]')
for _ in $(seq 50); do
  running=$(o command status "$id" "$exe" -o json | jq_py 'd["running"]')
  [[ $running == False ]] && break; sleep 0.1
done
code=$(o command status "$id" "$exe" -o json | jq_py 'd["exit_code"]')
[[ $code == 0 ]] || fail "command status: exit $code"; ok "background command status: exit 0"
o command logs "$id" "$exe" | grep -q bg2 || fail "command logs"; ok "command logs"
o sandbox renew "$id" -t 30m >/dev/null || fail "renew"; ok "sandbox renew"
o sandbox pause "$id" >/dev/null
[[ $(o sandbox get "$id" -o json | jq_py 'd["status"]["state"]') == Paused ]] || fail "pause"; ok "sandbox pause"
o sandbox resume "$id" >/dev/null
o sandbox health "$id" >/dev/null || fail "health after resume"; ok "sandbox resume + health"
o sandbox kill "$id" >/dev/null; trap - EXIT
if o sandbox get "$id" >/dev/null 2>&1; then fail "kill: still there"; fi
ok "sandbox kill: gone"
echo PASS
