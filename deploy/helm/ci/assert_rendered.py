"""Assertions on the chart as rendered by `helm template` (deploy/check.sh runs this).

    python assert_rendered.py CASE RENDERED.yaml VALUES.yaml REPO_ROOT

CASE is the values file's name (defaults | opensandbox | existing-secret). Each check fails
with a message naming the object and what is wrong; the schema itself is checked by
kubernetes-validate before this runs.
"""

import base64
import re
import sys
import tomllib
from pathlib import Path

import yaml

FAILURES = []


def check(ok, message):
    if not ok:
        FAILURES.append(message)


def objects(path):
    return [d for d in yaml.safe_load_all(Path(path).read_text()) if d]


def name_of(obj):
    return f"{obj['kind']}/{obj['metadata']['name']}"


def component(obj):
    return obj["metadata"].get("labels", {}).get("app.kubernetes.io/component")


def pod_spec(obj):
    return obj["spec"]["template"]["spec"]


def binary_reads(root, var):
    """Whether the binary's source names environment variable `var` as a string literal."""
    needle = f'"{var}"'
    for d in ("cli/src", "api/src", "adapters/src", "store/src", "core/src"):
        for f in (root / d).rglob("*.rs"):
            if needle in f.read_text():
                return True
    return False


def main():
    case, rendered, values_file, root = sys.argv[1:5]
    root = Path(root)
    docs = objects(rendered)
    values = yaml.safe_load(Path(values_file).read_text()) or {}
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)

    deployments = {component(d): d for d in by_kind.get("Deployment", []) if component(d) != "worker"}
    workers = [d for d in by_kind.get("Deployment", []) if component(d) == "worker"]
    check("api" in deployments, "no api Deployment")
    check("scheduler" in deployments, "no scheduler Deployment")
    check(workers, "no worker Deployment")

    # Two schedulers: one leads, one stands by.
    if "scheduler" in deployments:
        check(deployments["scheduler"]["spec"]["replicas"] == 2,
              f"scheduler replicas = {deployments['scheduler']['spec']['replicas']}, want 2")

    # The config every role reads.
    cms = by_kind.get("ConfigMap", [])
    check(len(cms) == 1, f"{len(cms)} ConfigMaps, want 1")
    toml_text = cms[0]["data"]["differently.toml"] if cms else ""
    config = tomllib.loads(toml_text)
    api_port = int(config["listen"].rsplit(":", 1)[1])
    check("metrics" in config, "no [metrics] listen: scheduler and worker would have no probe")
    metrics_port = int(config.get("metrics", {}).get("listen", ":0").rsplit(":", 1)[1])

    # Probes on what the binary serves: the API's /healthz and /readyz on its listener; the
    # other roles serve only /metrics on the metrics listener.
    for d in list(deployments.values()) + workers:
        c = pod_spec(d)["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
        want = (("/healthz", "/readyz", "http", api_port) if component(d) == "api"
                else ("/metrics", "/metrics", "metrics", metrics_port))
        for probe, path in (("livenessProbe", want[0]), ("readinessProbe", want[1])):
            p = c.get(probe)
            check(p is not None, f"{name_of(d)}: no {probe}")
            if p:
                check(p.get("httpGet", {}).get("path") == path,
                      f"{name_of(d)}: {probe} asks {p.get('httpGet')}, want {path}")
                check(p.get("httpGet", {}).get("port") == want[2],
                      f"{name_of(d)}: {probe} port {p.get('httpGet', {}).get('port')}, want {want[2]}")
        check(ports.get(want[2]) == want[3],
              f"{name_of(d)}: port {want[2]} = {ports.get(want[2])}, config says {want[3]}")
        args = c["args"]
        check(args[:3] == ["server", "--role", component(d)], f"{name_of(d)}: args {args}")
        check("--config" in args and args[args.index("--config") + 1].endswith("differently.toml"),
              f"{name_of(d)}: args {args} do not name the config file")

    # Hardened pods: non-root, read-only root filesystem, no privilege escalation, no caps,
    # no service account token (the binary never calls the Kubernetes API).
    for d in by_kind.get("Deployment", []) + by_kind.get("Job", []):
        spec = pod_spec(d)
        check(spec.get("securityContext", {}).get("runAsNonRoot") is True, f"{name_of(d)}: runAsNonRoot")
        check(spec.get("automountServiceAccountToken") is False, f"{name_of(d)}: service account token mounted")
        for c in spec["containers"]:
            sc = c.get("securityContext", {})
            check(sc.get("readOnlyRootFilesystem") is True, f"{name_of(d)}: root filesystem writable")
            check(sc.get("allowPrivilegeEscalation") is False, f"{name_of(d)}: privilege escalation")
            check(sc.get("capabilities", {}).get("drop") == ["ALL"], f"{name_of(d)}: capabilities kept")
            for e in c.get("env", []):
                check(binary_reads(root, e["name"]),
                      f"{name_of(d)}: env {e['name']} is read nowhere in the binary's source")
                check("value" not in e or not e["name"].endswith(("_KEY", "_URL")),
                      f"{name_of(d)}: {e['name']} is a literal value, not a Secret reference")

    # Each role's secret references: bootstrap key only for the api.
    secret_name = values.get("secrets", {}).get("existingSecret") or "dly-differently"
    keys = {"bootstrapKey": "bootstrap-key", "auditKey": "audit-key", "secretsKey": "secrets-key",
            "databaseURL": "database-url", "natsURL": "nats-url"}
    keys.update(values.get("secrets", {}).get("keys", {}))
    for d in list(deployments.values()) + workers:
        env = {e["name"]: e for e in pod_spec(d)["containers"][0]["env"]}
        want = {"DIFFERENTLY_DATABASE_URL": "databaseURL", "DIFFERENTLY_NATS_URL": "natsURL",
                "DIFFERENTLY_AUDIT_KEY": "auditKey", "DIFFERENTLY_SECRETS_KEY": "secretsKey"}
        if component(d) == "api":
            want["DIFFERENTLY_BOOTSTRAP_KEY"] = "bootstrapKey"
        else:
            check("DIFFERENTLY_BOOTSTRAP_KEY" not in env, f"{name_of(d)}: gets the bootstrap key")
        for var, key in want.items():
            ref = env.get(var, {}).get("valueFrom", {}).get("secretKeyRef", {})
            check(ref.get("name") == secret_name and ref.get("key") == keys[key],
                  f"{name_of(d)}: {var} from {ref}, want {secret_name}/{keys[key]}")

    # No secret value outside a Secret: the values' secrets (and their base64) appear in no
    # other object, the ConfigMap included.
    markers = [v for k, v in values.get("secrets", {}).items()
               if isinstance(v, str) and k not in ("existingSecret",) and v]
    for d in docs:
        if d["kind"] == "Secret":
            continue
        text = yaml.safe_dump(d)
        for m in markers:
            check(m not in text, f"{name_of(d)} holds the value of a secret")
            check(base64.b64encode(m.encode()).decode() not in text, f"{name_of(d)} holds a secret, base64")
    check(not re.search(r"(?i)password|dly_key_|postgres://|nats://", toml_text),
          "differently.toml holds a credential or URL")
    for k in ("database_url", "nats_url", "bootstrap_key"):
        check(k not in config, f"differently.toml sets {k}: it belongs in the Secret")

    secrets = [s for s in by_kind.get("Secret", []) if component(s) != "migrate"]
    if case == "existing-secret":
        check(not by_kind.get("Secret"), "a Secret is rendered although secrets.existingSecret is set")
    else:
        check(len(secrets) == 1, f"{len(secrets)} Secrets, want 1")
        if secrets:
            data = {k: base64.b64decode(v).decode() for k, v in secrets[0]["data"].items()}
            for k, v in values["secrets"].items():
                if k in keys and v:
                    check(data.get(keys[k]) == v, f"Secret entry {keys[k]} does not hold secrets.{k}")

    # Migrations before any new pod: a pre-install/pre-upgrade hook Job running `migrate`.
    jobs = by_kind.get("Job", [])
    check(len(jobs) == 1, f"{len(jobs)} Jobs, want the migrate hook")
    for j in jobs:
        ann = j["metadata"].get("annotations", {})
        check(ann.get("helm.sh/hook") == "pre-install,pre-upgrade", f"{name_of(j)}: hook {ann.get('helm.sh/hook')}")
        check(pod_spec(j)["containers"][0]["args"] == ["migrate"], f"{name_of(j)}: args")
        check("serviceAccountName" not in pod_spec(j), f"{name_of(j)}: names a ServiceAccount the hook runs before")
        ref = pod_spec(j)["containers"][0]["env"][0]["valueFrom"]["secretKeyRef"]
        hook_secret = [s for s in by_kind.get("Secret", []) if s["metadata"]["name"] == ref["name"]]
        if case == "existing-secret":
            check(ref["name"] == secret_name, f"{name_of(j)}: reads {ref['name']}")
        else:
            check(hook_secret and "pre-install" in hook_secret[0]["metadata"]["annotations"]["helm.sh/hook"]
                  and int(hook_secret[0]["metadata"]["annotations"]["helm.sh/hook-weight"])
                  < int(ann.get("helm.sh/hook-weight", "0")),
                  f"{name_of(j)}: its Secret {ref['name']} is not a hook created before it")

    # Disruption budgets for every role; network policies for every role.
    pdbs = {p["metadata"]["name"] for p in by_kind.get("PodDisruptionBudget", [])}
    for want in ["dly-differently-api", "dly-differently-scheduler"] + [
            w["metadata"]["name"] for w in workers]:
        check(want in pdbs, f"no PodDisruptionBudget {want} (have {sorted(pdbs)})")
    policies = {p["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"]: p
                for p in by_kind.get("NetworkPolicy", [])}
    for role in ("api", "scheduler", "worker", "migrate"):
        check(role in policies, f"no NetworkPolicy for {role}")
    for role in ("scheduler", "worker"):
        if role in policies:
            ingress = policies[role]["spec"].get("ingress")
            check(isinstance(ingress, list), f"NetworkPolicy {role}: ingress is {ingress!r}, not a list")
            ingress = ingress or []
            check(all(r.get("from") for r in ingress) and
                  all(p["port"] == metrics_port for r in ingress for p in r["ports"]),
                  f"NetworkPolicy {role}: ingress beyond the scraper on the metrics port: {ingress}")

    # Worker groups: `--pools` as the values say.
    groups = {g["name"]: g for g in values.get("workers", {}).get("groups", [{"name": "all", "pools": []}])}
    check(len(workers) == len(groups), f"{len(workers)} worker Deployments for {len(groups)} groups")
    for w in workers:
        g = groups.get(w["metadata"]["labels"].get("differently/worker-group"), {})
        args = pod_spec(w)["containers"][0]["args"]
        if g.get("pools"):
            check(args[-2:] == ["--pools", ",".join(g["pools"])], f"{name_of(w)}: args {args}")
        else:
            check("--pools" not in args, f"{name_of(w)}: args {args}")

    # Pools whose API key is a Secret reference: mounted in every role, named by apiKeyFile.
    for i, pool in enumerate(values.get("pools", [])):
        ref = pool.get("apiKeySecretRef")
        rendered_pool = config["pools"][i]
        check(rendered_pool["name"] == pool["name"], f"pools[{i}] rendered as {rendered_pool['name']}")
        if not ref:
            continue
        key_file = rendered_pool["settings"].get("apiKeyFile", "")
        for d in list(deployments.values()) + workers:
            spec = pod_spec(d)
            vols = {v["name"]: v for v in spec["volumes"]}
            mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
            v = vols.get(f"pool-{pool['name']}", {}).get("secret", {})
            m = mounts.get(f"pool-{pool['name']}", {})
            check(v.get("secretName") == ref["name"] and v.get("items") == [{"key": ref["key"], "path": "api-key"}],
                  f"{name_of(d)}: pool {pool['name']} secret volume {v}")
            check(m.get("readOnly") is True and key_file == f"{m.get('mountPath')}/api-key",
                  f"{name_of(d)}: apiKeyFile {key_file} is not where the Secret is mounted ({m})")

    monitors = by_kind.get("ServiceMonitor", [])
    if values.get("metrics", {}).get("serviceMonitor", {}).get("enabled"):
        check(len(monitors) == 1, "metrics.serviceMonitor.enabled renders no ServiceMonitor")
        targets = [s for s in by_kind.get("Service", []) if s["metadata"]["labels"].get("differently/metrics") == "true"]
        check(sorted(component(s) for s in targets) == ["api", "scheduler", "worker"],
              f"metrics Services for {[component(s) for s in targets]}")
        for m in monitors:
            sel = m["spec"]["selector"]["matchLabels"]
            check(all(all(s["metadata"]["labels"].get(k) == v for k, v in sel.items()) for s in targets),
                  f"ServiceMonitor selector {sel} misses a metrics Service")
            check(m["spec"]["endpoints"][0]["port"] == "metrics" and m["spec"]["endpoints"][0]["path"] == "/metrics",
                  f"ServiceMonitor endpoint {m['spec']['endpoints']}")
            # deploy/prometheus/alerts.yml groups targets by `role`.
            relabel = m["spec"]["endpoints"][0].get("relabelings", [])
            check(any(r.get("targetLabel") == "role" and r.get("sourceLabels") ==
                      ["__meta_kubernetes_service_label_app_kubernetes_io_component"] for r in relabel),
                  f"ServiceMonitor does not set the role label the alerts use: {relabel}")
    else:
        check(not monitors, "a ServiceMonitor is rendered although metrics.serviceMonitor.enabled is off")

    if FAILURES:
        for f in FAILURES:
            print(f"deploy-check: {case}: {f}", file=sys.stderr)
        sys.exit(1)
    print(f"deploy-check: {case}: {len(docs)} objects, every assertion holds")


if __name__ == "__main__":
    main()
