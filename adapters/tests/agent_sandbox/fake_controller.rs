//! The fake's stand-in for the agent-sandbox controllers (sandbox, claim and warm-pool
//! reconcilers), run once per API request: pool replenishment, claim adoption or cold start,
//! Ready conditions forwarded from sandbox to claim, expiry and finalizer-delayed deletes.
//! Reasons and fields follow `sandboxclaim_controller.go` and the v1beta1 types.

use serde_json::{json, Value};

use crate::fake_k8s::{now_rfc3339, Knobs, World, CORE, EXT, WARM_LABEL};

/// Whether an object's `Ready` condition is `True`.
pub fn ready(v: &Value) -> bool {
    condition(v, "Ready").is_some_and(|c| c["status"] == "True")
}

fn condition<'a>(v: &'a Value, t: &str) -> Option<&'a Value> {
    v["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == t)
}

fn cond(status: bool, reason: &str, message: &str) -> Value {
    json!({"type": "Ready", "status": if status { "True" } else { "False" },
           "reason": reason, "message": message, "lastTransitionTime": now_rfc3339(),
           "observedGeneration": 1})
}

fn expired(at: &Value) -> bool {
    at.as_str()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .is_some_and(|t| t <= chrono::Utc::now())
}

fn owner_uid(v: &Value) -> Option<String> {
    v["metadata"]["ownerReferences"][0]["uid"]
        .as_str()
        .map(str::to_owned)
}

/// Garbage collection: sandboxes owned by the deleted object go too.
pub fn cascade(w: &mut World, ns: &str, gone: &Value) {
    let Some(uid) = gone["metadata"]["uid"].as_str() else {
        return;
    };
    for (n, name) in w.names("sandboxes") {
        let owned = w
            .get("sandboxes", &n, &name)
            .is_some_and(|o| n == ns && owner_uid(&o.v).as_deref() == Some(uid));
        if owned {
            w.remove("sandboxes", &n, &name);
        }
    }
}

pub fn reconcile(w: &mut World, k: &Knobs) {
    finish_deletes(w);
    expire(w);
    sandboxes(w);
    pools(w, k);
    claims(w, k);
}

fn finish_deletes(w: &mut World) {
    let tick = w.tick;
    let due: Vec<(String, String, String)> = w
        .objects
        .iter()
        .filter(|(_, o)| o.gone_at.is_some_and(|t| t <= tick))
        .map(|(k, _)| k.clone())
        .collect();
    for (res, ns, name) in due {
        if let Some(o) = w.remove(&res, &ns, &name) {
            cascade(w, &ns, &o.v);
        }
    }
}

fn expire(w: &mut World) {
    for (ns, name) in w.names("sandboxclaims") {
        let Some(o) = w.get("sandboxclaims", &ns, &name) else {
            continue;
        };
        if !expired(&o.v["spec"]["lifecycle"]["shutdownTime"]) {
            continue;
        }
        let policy = o.v["spec"]["lifecycle"]["shutdownPolicy"]
            .as_str()
            .unwrap_or("Retain")
            .to_owned();
        let v = o.v.clone();
        if policy == "Retain" {
            cascade(w, &ns, &v);
            let mut st = v["status"].clone();
            st["conditions"] = json!([cond(
                false,
                "ClaimExpired",
                "Claim expired. Sandbox cleanup initiated."
            )]);
            w.set_status("sandboxclaims", &ns, &name, st);
        } else if let Some(o) = w.remove("sandboxclaims", &ns, &name) {
            cascade(w, &ns, &o.v);
        }
    }
    for (ns, name) in w.names("sandboxes") {
        let Some(o) = w.get("sandboxes", &ns, &name) else {
            continue;
        };
        if !expired(&o.v["spec"]["shutdownTime"]) {
            continue;
        }
        if o.v["spec"]["shutdownPolicy"] == "Delete" {
            w.remove("sandboxes", &ns, &name);
        } else {
            let st = json!({"conditions": [cond(false, "SandboxExpired", "Sandbox has expired")]});
            w.set_status("sandboxes", &ns, &name, st);
        }
    }
}

/// Pods come up at their tick: Ready, with an IP and (when asked) a service.
fn sandboxes(w: &mut World) {
    let tick = w.tick;
    for (ns, name) in w.names("sandboxes") {
        let Some(o) = w.get("sandboxes", &ns, &name) else {
            continue;
        };
        if condition(&o.v, "Ready").is_some_and(|c| {
            ["SandboxExpired", "PodFailed"].contains(&c["reason"].as_str().unwrap_or(""))
        }) {
            continue;
        }
        let failed = o.v["metadata"]["annotations"]["fake/pod-fails"] == "true";
        let up = o.ready_at.is_some_and(|t| t <= tick);
        let uid_tail = o.v["metadata"]["uid"]
            .as_str()
            .and_then(|u| u.rsplit('-').next())
            .and_then(|t| t.parse::<u64>().ok())
            .unwrap_or(1);
        let st = if up && failed {
            json!({"conditions": [cond(false, "PodFailed", "Pod failed: Error")]})
        } else if up {
            json!({"conditions": [cond(true, "DependenciesReady", "Pod is Ready; Service Exists")],
                   "podIPs": [format!("10.244.0.{}", uid_tail % 250 + 2)],
                   "nodeName": "fake-node", "selector": format!("agents.x-k8s.io/sandbox-name-hash={name}"),
                   "service": name, "serviceFQDN": format!("{name}.{ns}.svc.cluster.local")})
        } else {
            json!({"conditions": [cond(false, "DependenciesNotReady", "Pod exists with phase: Pending")]})
        };
        w.set_status("sandboxes", &ns, &name, st);
    }
}

fn pool_members(w: &World, ns: &str, pool: &str) -> Vec<String> {
    w.objects
        .iter()
        .filter(|((r, n, _), o)| {
            r == "sandboxes" && n == ns && o.v["metadata"]["labels"][WARM_LABEL] == pool
        })
        .map(|((_, _, name), _)| name.clone())
        .collect()
}

/// Keeps each pool at its replicas and reports how many are Ready.
fn pools(w: &mut World, k: &Knobs) {
    for (ns, pool) in w.names("sandboxwarmpools") {
        let Some(p) = w.get("sandboxwarmpools", &ns, &pool) else {
            continue;
        };
        let replicas = p.v["spec"]["replicas"].as_u64().unwrap_or(1) as usize;
        let tname = p.v["spec"]["sandboxTemplateRef"]["name"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        let Some(t) = w.get("sandboxtemplates", &ns, &tname) else {
            continue;
        };
        let pod_template = t.v["spec"]["podTemplate"].clone();
        let have = pool_members(w, &ns, &pool);
        for _ in have.len()..replicas {
            let seq = w.next_seq();
            let name = format!("{pool}-{:05x}", seq * 7919 % 0xfffff);
            let v = json!({"apiVersion": format!("{CORE}/v1beta1"), "kind": "Sandbox",
                "metadata": {"name": name, "labels": {WARM_LABEL: pool},
                             "annotations": {"agents.x-k8s.io/sandbox-template-ref": tname}},
                "spec": {"podTemplate": pod_template}});
            let at = w.tick + k.warm_ready_ticks;
            w.insert("sandboxes", &ns, v, Some(at));
        }
        let members = pool_members(w, &ns, &pool);
        let ready_n = members
            .iter()
            .filter(|m| w.get("sandboxes", &ns, m).is_some_and(|o| ready(&o.v)))
            .count();
        let st = json!({"replicas": members.len(), "readyReplicas": ready_n,
                        "selector": format!("{WARM_LABEL}={pool}"), "observedGeneration": 1});
        w.set_status("sandboxwarmpools", &ns, &pool, st);
    }
}

/// Why a claim cannot be served, as the controller's Ready=False reason and message.
fn refusal(w: &World, ns: &str, claim: &Value) -> Result<(String, Value), (&'static str, String)> {
    let pool = claim["spec"]["warmPoolRef"]["name"].as_str().unwrap_or("");
    let p = w.get("sandboxwarmpools", ns, pool).ok_or((
        "WarmPoolNotFound",
        format!("SandboxWarmPool {pool:?} not found"),
    ))?;
    let tname = p.v["spec"]["sandboxTemplateRef"]["name"]
        .as_str()
        .unwrap_or("");
    let t = w.get("sandboxtemplates", ns, tname).ok_or((
        "TemplateNotFound",
        format!("sandboxtemplates.{EXT} \"{tname}\" not found"),
    ))?;
    let env = claim["spec"]["env"].as_array().cloned().unwrap_or_default();
    let policy = t.v["spec"]["envVarsInjectionPolicy"]
        .as_str()
        .unwrap_or("Disallowed");
    let base_env = t.v["spec"]["podTemplate"]["spec"]["containers"][0]["env"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !env.is_empty() {
        if policy == "Disallowed" {
            return Err((
                "EnvVarsInjectionRejected",
                format!("template {tname:?} does not allow environment variable injection (envVarsInjectionPolicy: Disallowed)"),
            ));
        }
        if policy == "Allowed" {
            if let Some(e) = env
                .iter()
                .find(|e| base_env.iter().any(|b| b["name"] == e["name"]))
            {
                return Err((
                    "EnvVarsInjectionRejected",
                    format!(
                        "template {tname:?} defines {} and does not allow overrides",
                        e["name"]
                    ),
                ));
            }
        }
    }
    let mut pod = t.v["spec"]["podTemplate"].clone();
    let mut merged: Vec<Value> = base_env
        .into_iter()
        .filter(|b| !env.iter().any(|e| e["name"] == b["name"]))
        .collect();
    merged.extend(
        env.iter()
            .map(|e| json!({"name": e["name"], "value": e["value"]})),
    );
    pod["spec"]["containers"][0]["env"] = json!(merged);
    Ok((pool.to_owned(), pod))
}

fn claims(w: &mut World, k: &Knobs) {
    let tick = w.tick;
    for (ns, name) in w.names("sandboxclaims") {
        let Some(o) = w.get("sandboxclaims", &ns, &name) else {
            continue;
        };
        let claim = o.v.clone();
        if claim["metadata"].get("deletionTimestamp").is_some()
            || condition(&claim, "Ready").is_some_and(|c| c["reason"] == "ClaimExpired")
        {
            continue;
        }
        let bound = claim["status"]["sandbox"]["name"]
            .as_str()
            .map(str::to_owned);
        let sandbox = match bound {
            Some(s) => s,
            None => match refusal(w, &ns, &claim) {
                Err((reason, msg)) => {
                    w.set_status(
                        "sandboxclaims",
                        &ns,
                        &name,
                        json!({"conditions": [cond(false, reason, &msg)]}),
                    );
                    continue;
                }
                Ok((pool, pod)) => bind(w, k, &ns, &name, &claim, &pool, pod, tick),
            },
        };
        let st = match w.get("sandboxes", &ns, &sandbox) {
            None => json!({"sandbox": {"name": sandbox},
                           "conditions": [cond(false, "SandboxMissing", "Sandbox does not exist")]}),
            Some(s) => {
                let c = condition(&s.v, "Ready")
                    .cloned()
                    .unwrap_or_else(|| cond(false, "SandboxNotReady", "Sandbox is not ready"));
                let mut st = json!({"sandbox": {"name": sandbox}, "conditions": [c]});
                if let Some(ips) = s.v["status"].get("podIPs") {
                    st["sandbox"]["podIPs"] = ips.clone();
                }
                st
            }
        };
        w.set_status("sandboxclaims", &ns, &name, st);
    }
}

/// Adopts a Ready pool sandbox (no env, no volumes) or cold-starts one named like the claim.
#[allow(clippy::too_many_arguments)]
fn bind(
    w: &mut World,
    k: &Knobs,
    ns: &str,
    name: &str,
    claim: &Value,
    pool: &str,
    pod: Value,
    tick: u64,
) -> String {
    let owner = json!([{"apiVersion": format!("{EXT}/v1beta1"), "kind": "SandboxClaim",
        "name": name, "uid": claim["metadata"]["uid"], "controller": true}]);
    let extra_labels = claim["spec"]["additionalPodMetadata"]["labels"].clone();
    let warm_ok = claim["spec"]
        .get("env")
        .is_none_or(|e| e.as_array().is_some_and(Vec::is_empty))
        && claim["spec"].get("volumeClaimTemplates").is_none();
    if warm_ok {
        let ready_member = pool_members(w, ns, pool)
            .into_iter()
            .find(|m| w.get("sandboxes", ns, m).is_some_and(|o| ready(&o.v)));
        if let Some(m) = ready_member {
            let rv = w.next_rv();
            if let Some(o) = w.get_mut("sandboxes", ns, &m) {
                if let Some(l) = o.v["metadata"]["labels"].as_object_mut() {
                    l.remove(WARM_LABEL);
                }
                o.v["metadata"]["ownerReferences"] = owner;
                merge_labels(
                    &mut o.v["spec"]["podTemplate"]["metadata"]["labels"],
                    &extra_labels,
                );
                o.v["metadata"]["resourceVersion"] = json!(rv);
            }
            return m;
        }
    }
    let mut pod = pod;
    merge_labels(&mut pod["metadata"]["labels"], &extra_labels);
    let mut annotations = json!({"agents.x-k8s.io/sandbox-template-ref": pool});
    if k.pod_fails {
        annotations["fake/pod-fails"] = json!("true");
    }
    let v = json!({"apiVersion": format!("{CORE}/v1beta1"), "kind": "Sandbox",
        "metadata": {"name": name, "ownerReferences": owner, "annotations": annotations},
        "spec": {"podTemplate": pod}});
    if w.get("sandboxes", ns, name).is_none() {
        w.insert("sandboxes", ns, v, Some(tick + k.cold_ready_ticks));
    }
    name.to_owned()
}

fn merge_labels(target: &mut Value, extra: &Value) {
    if let Some(e) = extra.as_object() {
        if !target.is_object() {
            *target = json!({});
        }
        for (k, v) in e {
            target[k] = v.clone();
        }
    }
}
