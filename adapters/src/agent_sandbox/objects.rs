//! The agent-sandbox objects this adapter writes (a `SandboxClaim` or a `Sandbox`, labelled
//! with Differently's ids) and what it reads back from their status: the `Ready` condition,
//! the terminal reasons the controllers report, and the Sandbox a claim was bound to.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use differently_core::SandboxId;
use serde_json::{json, Value};

use super::kube::Res;
use crate::{CreateInstance, InstanceState};

/// Label carrying Differently's sandbox id (on the object and on its pod).
pub(crate) const LABEL_SANDBOX: &str = crate::kit::SANDBOX_TAG;
/// Label carrying the installation id, for `list`.
pub(crate) const LABEL_INSTALLATION: &str = crate::kit::INSTALLATION_TAG;

/// Ready=False reasons the controllers do not recover from (the claim controller's
/// `computeReadyCondition` and the Sandbox's pod phases).
const TERMINAL: &[&str] = &[
    "TemplateNotFound",
    "WarmPoolNotFound",
    "InvalidMetadata",
    "EnvVarsInjectionRejected",
    "VolumeClaimTemplatesError",
    "ClaimExpired",
    "SandboxExpired",
    "PodFailed",
    "PodSucceeded",
];

/// The object name of a sandbox: its id in the lower-case, dash form names take.
pub(crate) fn object_name(id: &SandboxId) -> String {
    crate::kit::paths::dns_name(id)
}

fn labels(req: &CreateInstance) -> Value {
    json!(crate::kit::tags::create_tags(req))
}

/// The backend-side TTL backstop: `ttl_seconds` from now (none when zero).
pub(crate) fn shutdown_time(ttl_seconds: u64, now: DateTime<Utc>) -> Option<String> {
    (ttl_seconds > 0).then(|| {
        let secs = i64::try_from(ttl_seconds).unwrap_or(i64::MAX / 4);
        (now + chrono::Duration::seconds(secs.min(10 * 365 * 86_400)))
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    })
}

fn env_list(env: &BTreeMap<String, String>) -> Vec<Value> {
    env.iter()
        .map(|(k, v)| json!({"name": k, "value": v}))
        .collect()
}

/// A claim on `pool`. Env goes in `spec.env`, which the controller honours only when the
/// pool's template allows injection, and which makes the claim cold-start.
pub(crate) fn claim_body(req: &CreateInstance, pool: &str, now: DateTime<Utc>) -> Value {
    let mut spec = json!({
        "warmPoolRef": {"name": pool},
        "additionalPodMetadata": {"labels": labels(req)},
    });
    if !req.env.is_empty() {
        spec["env"] = json!(env_list(&req.env));
    }
    if let Some(at) = shutdown_time(req.ttl_seconds, now) {
        spec["lifecycle"] = json!({"shutdownTime": at, "shutdownPolicy": "Delete"});
    }
    json!({
        "apiVersion": Res::Claim.api_version(),
        "kind": "SandboxClaim",
        "metadata": {"name": object_name(&req.sandbox_id), "labels": labels(req)},
        "spec": spec,
    })
}

/// A Sandbox from the pool's pod template: env appended to the first container's (after
/// it, so these win), the image replaced by the sandbox's template when it names one.
pub(crate) fn sandbox_body(
    req: &CreateInstance,
    pod_template: &Value,
    now: DateTime<Utc>,
) -> Value {
    let mut pod = pod_template.clone();
    if let Some(first) = pod
        .pointer_mut("/spec/containers/0")
        .and_then(Value::as_object_mut)
    {
        if let Some(image) = req.template.as_deref().filter(|t| !t.is_empty()) {
            first.insert("image".into(), json!(image));
        }
        if !req.env.is_empty() {
            let mut env: Vec<Value> = first
                .get("env")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            env.retain(|e| {
                e.get("name")
                    .and_then(Value::as_str)
                    .is_none_or(|n| !req.env.contains_key(n))
            });
            env.extend(env_list(&req.env));
            first.insert("env".into(), json!(env));
        }
    }
    // Pod labels: ours over the template's, so the pod can be traced back.
    if !pod["metadata"].is_object() {
        pod["metadata"] = json!({});
    }
    if !pod["metadata"]["labels"].is_object() {
        pod["metadata"]["labels"] = json!({});
    }
    pod["metadata"]["labels"][LABEL_SANDBOX] = json!(req.sandbox_id.as_str());
    pod["metadata"]["labels"][LABEL_INSTALLATION] = json!(req.installation_id.as_str());
    let mut spec = json!({"podTemplate": pod});
    if let Some(at) = shutdown_time(req.ttl_seconds, now) {
        spec["shutdownTime"] = json!(at);
        spec["shutdownPolicy"] = json!("Delete");
    }
    json!({
        "apiVersion": Res::Sandbox.api_version(),
        "kind": "Sandbox",
        "metadata": {"name": object_name(&req.sandbox_id), "labels": labels(req)},
        "spec": spec,
    })
}

/// Where an object stands, as its status says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Not Ready yet (or not bound yet): the reason, for messages.
    Pending(String),
    /// Ready; the name of the Sandbox the runtime is reached by.
    Ready(String),
    /// Will not become Ready: reason and message.
    Failed(String),
    /// Being deleted.
    Gone,
}

fn ready_condition(v: &Value) -> Option<&Value> {
    v.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some("Ready"))
}

/// The phase of a claim or a Sandbox (`res` says which). A Sandbox is its own backend ref;
/// a claim's is the Sandbox in `status.sandbox.name` (a warm pod's own name when adopted).
pub(crate) fn phase(res: Res, v: &Value) -> Phase {
    if v.pointer("/metadata/deletionTimestamp").is_some() {
        return Phase::Gone;
    }
    let s = |p: &str| v.pointer(p).and_then(Value::as_str).unwrap_or("");
    let target = match res {
        Res::Claim => s("/status/sandbox/name"),
        _ => s("/metadata/name"),
    };
    let Some(c) = ready_condition(v) else {
        return Phase::Pending("no Ready condition yet".into());
    };
    let reason = c.get("reason").and_then(Value::as_str).unwrap_or("");
    let message = c.get("message").and_then(Value::as_str).unwrap_or("");
    if c.get("status").and_then(Value::as_str) == Some("True") && !target.is_empty() {
        return Phase::Ready(target.to_owned());
    }
    if TERMINAL.contains(&reason) {
        return Phase::Failed(format!("{reason}: {message}"));
    }
    Phase::Pending(format!("{reason}: {message}"))
}

/// Our state of a phase; `None` for one being deleted.
pub(crate) fn state(p: &Phase) -> Option<InstanceState> {
    match p {
        Phase::Pending(_) => Some(InstanceState::Pending),
        Phase::Ready(_) => Some(InstanceState::Running),
        Phase::Failed(_) => Some(InstanceState::Failed),
        Phase::Gone => None,
    }
}

/// An object as the kit's tag lookups read it: its labels, its state, and the Sandbox the
/// runtime is reached by (a claim's bound Sandbox once Ready, else the object's own name).
pub(crate) struct Record {
    v: Value,
    backend_ref: String,
    state: Option<InstanceState>,
}

impl Record {
    pub(crate) fn new(res: Res, v: Value) -> Record {
        let phase = phase(res, &v);
        let state = state(&phase);
        let backend_ref = match phase {
            Phase::Ready(s) => s,
            _ => name(&v).to_owned(),
        };
        Record {
            v,
            backend_ref,
            state,
        }
    }
}

impl crate::kit::Tagged for Record {
    fn backend_ref(&self) -> &str {
        &self.backend_ref
    }

    fn tag(&self, key: &str) -> Option<&str> {
        self.v.pointer("/metadata/labels")?.get(key)?.as_str()
    }

    fn state(&self) -> Option<InstanceState> {
        self.state
    }
}

/// The sandbox id label of an object.
pub(crate) fn sandbox_label(v: &Value) -> Option<&str> {
    v.pointer("/metadata/labels")?.get(LABEL_SANDBOX)?.as_str()
}

/// The object's own name.
pub(crate) fn name(v: &Value) -> &str {
    v.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;
    use differently_core::ids::InstallationId;

    fn req() -> CreateInstance {
        CreateInstance {
            sandbox_id: SandboxId::parse("sbx_01J0000000000000000000000A").unwrap(),
            installation_id: InstallationId::new(),
            template: None,
            resources: differently_core::Resources::DEFAULT,
            env: BTreeMap::from([("A".to_owned(), "1".to_owned())]),
            ttl_seconds: 60,
            from_snapshot: None,
        }
    }

    #[test]
    fn claims_carry_labels_env_and_the_backstop() {
        let now = Utc::now();
        let c = claim_body(&req(), "pool", now);
        assert_eq!(c["metadata"]["name"], "sbx-01j0000000000000000000000a");
        assert_eq!(c["spec"]["warmPoolRef"]["name"], "pool");
        assert_eq!(c["spec"]["env"][0], json!({"name": "A", "value": "1"}));
        assert_eq!(c["spec"]["lifecycle"]["shutdownPolicy"], "Delete");
        assert_eq!(
            c["spec"]["additionalPodMetadata"]["labels"][LABEL_SANDBOX],
            "sbx_01J0000000000000000000000A"
        );
        let mut r = req();
        r.env.clear();
        r.ttl_seconds = 0;
        let c = claim_body(&r, "pool", now);
        assert!(c["spec"].get("env").is_none() && c["spec"].get("lifecycle").is_none());
    }

    #[test]
    fn sandboxes_take_the_pool_template_with_env_after_its_own() {
        let t = json!({"spec": {"containers": [{"name": "r", "image": "i",
            "env": [{"name": "A", "value": "0"}, {"name": "B", "value": "2"}]}]}});
        let mut r = req();
        r.template = Some("other:1".into());
        let s = sandbox_body(&r, &t, Utc::now());
        let c = &s["spec"]["podTemplate"]["spec"]["containers"][0];
        assert_eq!(c["image"], "other:1");
        assert_eq!(
            c["env"],
            json!([{"name": "B", "value": "2"}, {"name": "A", "value": "1"}])
        );
        assert!(s["spec"]["podTemplate"]["metadata"]["labels"][LABEL_SANDBOX].is_string());
    }

    #[test]
    fn phases_follow_the_ready_condition() {
        let with = |status: &str, reason: &str, bound: &str| {
            json!({"metadata": {"name": "c"}, "status": {"sandbox": {"name": bound},
                "conditions": [{"type": "Ready", "status": status, "reason": reason}]}})
        };
        assert_eq!(
            phase(Res::Claim, &with("True", "DependenciesReady", "pool-abc")),
            Phase::Ready("pool-abc".into())
        );
        assert!(matches!(
            phase(Res::Claim, &with("False", "EnvVarsInjectionRejected", "")),
            Phase::Failed(_)
        ));
        assert!(matches!(
            phase(Res::Claim, &with("False", "SandboxNotReady", "c")),
            Phase::Pending(_)
        ));
        assert_eq!(
            phase(Res::Sandbox, &with("True", "DependenciesReady", "")),
            Phase::Ready("c".into())
        );
        let gone = json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}});
        assert_eq!(phase(Res::Claim, &gone), Phase::Gone);
        assert_eq!(state(&Phase::Gone), None);
    }
}
