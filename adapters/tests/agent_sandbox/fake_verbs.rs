//! The fake apiserver's verbs on the custom resources: get, list (label selectors, paging),
//! create (validation, pruning, 409), delete (finalizer delay, cascade) and merge-patch, each
//! answering as a real apiserver does (see `fake_k8s.rs` for the sources).

use axum::http::{HeaderValue, Method};
use axum::response::Response;
use serde_json::{json, Value};

use crate::fake_k8s::{api_version, details, qualified, status, FakeCluster};
use crate::support::http::{json_resp, Req};

/// Spec fields each resource's structural schema knows; others are pruned.
fn known_spec_fields(plural: &str) -> &'static [&'static str] {
    match plural {
        "sandboxes" => &[
            "podTemplate",
            "volumeClaimTemplates",
            "service",
            "shutdownTime",
            "shutdownPolicy",
            "operatingMode",
        ],
        "sandboxclaims" => &[
            "warmPoolRef",
            "lifecycle",
            "additionalPodMetadata",
            "env",
            "volumeClaimTemplates",
        ],
        "sandboxtemplates" => &[
            "podTemplate",
            "volumeClaimTemplates",
            "service",
            "networkPolicy",
            "networkPolicyManagement",
            "envVarsInjectionPolicy",
            "volumeClaimTemplatesPolicy",
        ],
        _ => &["replicas", "sandboxTemplateRef", "updateStrategy"],
    }
}

pub fn verb(
    fake: &FakeCluster,
    r: &Req,
    kind: &str,
    ns: &str,
    plural: &str,
    name: Option<&str>,
) -> Response {
    match (&r.method, name) {
        (&Method::GET, Some(n)) => get(fake, ns, plural, n),
        (&Method::GET, None) => list(fake, r, kind, ns, plural),
        (&Method::POST, None) => create(fake, r, kind, ns, plural),
        (&Method::DELETE, Some(n)) => delete(fake, ns, plural, n),
        (&Method::PATCH, Some(n)) => patch(fake, r, ns, plural, n),
        _ => status(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
            json!({}),
        ),
    }
}

fn not_found(plural: &str, name: &str) -> Response {
    status(
        404,
        "NotFound",
        &format!("{} not found", qualified(plural, name)),
        details(plural, name),
    )
}

fn get(fake: &FakeCluster, ns: &str, plural: &str, name: &str) -> Response {
    match fake.world().get(plural, ns, name) {
        Some(o) => json_resp(200, o.v.clone()),
        None => not_found(plural, name),
    }
}

/// One term of an equality-based selector.
enum Term {
    Eq(String, String),
    Ne(String, String),
    Exists(String),
    Absent(String),
}

fn parse_selector(s: &str) -> Result<Vec<Term>, String> {
    let mut out = Vec::new();
    for t in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let term = if let Some((k, v)) = t.split_once("!=") {
            Term::Ne(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
            Term::Eq(k.trim().into(), v.trim().into())
        } else if let Some(k) = t.strip_prefix('!') {
            Term::Absent(k.trim().into())
        } else if t.contains(' ') || t.contains('(') {
            return Err(format!("unable to parse requirement: {t}"));
        } else {
            Term::Exists(t.into())
        };
        out.push(term);
    }
    Ok(out)
}

fn matches(terms: &[Term], labels: &Value) -> bool {
    let get = |k: &str| labels.get(k).and_then(Value::as_str);
    terms.iter().all(|t| match t {
        Term::Eq(k, v) => get(k) == Some(v.as_str()),
        Term::Ne(k, v) => get(k) != Some(v.as_str()),
        Term::Exists(k) => get(k).is_some(),
        Term::Absent(k) => get(k).is_none(),
    })
}

fn list(fake: &FakeCluster, r: &Req, kind: &str, ns: &str, plural: &str) -> Response {
    let terms = match parse_selector(r.q("labelSelector").unwrap_or("")) {
        Ok(t) => t,
        Err(m) => return status(400, "BadRequest", &m, json!({})),
    };
    let max_page = fake.knobs().max_page;
    let limit = r
        .q("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX)
        .min(max_page);
    let after = r.q("continue").map(|c| {
        // The token is opaque to clients; this one is the last name served, reversed.
        c.chars().rev().collect::<String>()
    });
    let w = fake.world();
    let all: Vec<&Value> = w
        .objects
        .iter()
        .filter(|((res, n, name), _)| {
            res == plural && n == ns && after.as_deref().is_none_or(|a| name.as_str() > a)
        })
        .map(|(_, o)| &o.v)
        .filter(|v| matches(&terms, &v["metadata"]["labels"]))
        .collect();
    let page: Vec<Value> = all.iter().take(limit).map(|v| (*v).clone()).collect();
    let mut meta = json!({"resourceVersion": w.rv.to_string()});
    if all.len() > page.len() {
        let last = page
            .last()
            .and_then(|v| v["metadata"]["name"].as_str())
            .unwrap_or_default();
        meta["continue"] = json!(last.chars().rev().collect::<String>());
        meta["remainingItemCount"] = json!(all.len() - page.len());
    }
    json_resp(
        200,
        json!({"apiVersion": api_version(plural), "kind": format!("{kind}List"),
               "metadata": meta, "items": page}),
    )
}

/// DNS-1123 subdomain, as object names must be.
fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 253
        && n.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// A label value: at most 63 of [A-Za-z0-9_.-], alphanumeric at both ends (or empty).
fn valid_label_value(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
            && v.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && v.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric()))
}

fn invalid(kind: &str, plural: &str, name: &str, field: &str, why: &str) -> Response {
    let group = if plural == "sandboxes" {
        crate::fake_k8s::CORE
    } else {
        crate::fake_k8s::EXT
    };
    status(
        422,
        "Invalid",
        &format!("{kind}.{group} \"{name}\" is invalid: {field}: {why}"),
        json!({"name": name, "group": group, "kind": kind,
               "causes": [{"reason": "FieldValueInvalid", "message": why, "field": field}]}),
    )
}

/// Checks what the CRD's schema requires of `v`; the field and reason of the first miss.
fn schema_miss(plural: &str, v: &Value) -> Option<(&'static str, String)> {
    let spec = &v["spec"];
    if !spec.is_object() {
        return Some(("spec", "Required value".into()));
    }
    match plural {
        "sandboxes" if !spec["podTemplate"]["spec"].is_object() => {
            Some(("spec.podTemplate", "Required value".into()))
        }
        "sandboxclaims" => {
            if spec["warmPoolRef"]["name"]
                .as_str()
                .is_none_or(str::is_empty)
            {
                return Some(("spec.warmPoolRef", "Required value".into()));
            }
            if let Some(env) = spec.get("env") {
                let ok = env.as_array().is_some_and(|a| {
                    a.iter()
                        .all(|e| e["name"].as_str().is_some() && e["value"].as_str().is_some())
                });
                if !ok {
                    return Some(("spec.env", "name and value are required".into()));
                }
            }
            let policy = spec["lifecycle"]["shutdownPolicy"].as_str();
            if policy.is_some_and(|p| !["Delete", "DeleteForeground", "Retain"].contains(&p)) {
                return Some((
                    "spec.lifecycle.shutdownPolicy",
                    "Unsupported value: supported values: \"Delete\", \"DeleteForeground\", \"Retain\"".into(),
                ));
            }
            None
        }
        _ => None,
    }
}

fn create(fake: &FakeCluster, r: &Req, kind: &str, ns: &str, plural: &str) -> Response {
    let Ok(mut v) = serde_json::from_slice::<Value>(&r.body) else {
        return status(
            400,
            "BadRequest",
            "the body of the request was in an unknown format",
            json!({}),
        );
    };
    fake.record().created.push((plural.to_owned(), v.clone()));
    if v["apiVersion"].as_str() != Some(api_version(plural).as_str())
        || v["kind"].as_str() != Some(kind)
    {
        return status(
            400,
            "BadRequest",
            &format!(
                "the API version in the data ({}) does not match the expected API version ({})",
                v["apiVersion"].as_str().unwrap_or(""),
                api_version(plural)
            ),
            json!({}),
        );
    }
    let name = v["metadata"]["name"].as_str().unwrap_or("").to_owned();
    if name.is_empty() {
        return invalid(
            kind,
            plural,
            "",
            "metadata.name",
            "Required value: name or generateName is required",
        );
    }
    if !valid_name(&name) {
        return invalid(kind, plural, &name, "metadata.name", "Invalid value: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'");
    }
    if v["metadata"]["namespace"].as_str().is_some_and(|n| n != ns) {
        return status(
            400,
            "BadRequest",
            "the namespace of the provided object does not match the namespace sent on the request",
            json!({}),
        );
    }
    if let Some(labels) = v["metadata"]["labels"].as_object() {
        for (k, l) in labels {
            let val = l.as_str().unwrap_or("\u{0}");
            if !valid_label_value(val) {
                return invalid(kind, plural, &name, &format!("metadata.labels: Invalid value: \"{val}\""), "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.'");
            }
            if k.is_empty() || k.len() > 317 {
                return invalid(
                    kind,
                    plural,
                    &name,
                    "metadata.labels",
                    "Invalid value: bad key",
                );
            }
        }
    }
    if let Some((field, why)) = schema_miss(plural, &v) {
        return invalid(kind, plural, &name, field, &why);
    }
    // Status is a subresource: ignored on create. Unknown spec fields are pruned.
    v.as_object_mut().map(|o| o.remove("status"));
    let mut pruned = Vec::new();
    if let Some(spec) = v["spec"].as_object_mut() {
        let known = known_spec_fields(plural);
        spec.retain(|k, _| {
            let keep = known.contains(&k.as_str());
            if !keep {
                pruned.push(k.clone());
            }
            keep
        });
    }
    let cold_ticks = fake.knobs().cold_ready_ticks;
    let mut w = fake.world();
    if w.get(plural, ns, &name).is_some() {
        return status(
            409,
            "AlreadyExists",
            &format!("{} already exists", qualified(plural, &name)),
            details(plural, &name),
        );
    }
    let ready_at = (plural == "sandboxes").then(|| w.tick + cold_ticks);
    w.insert(plural, ns, v, ready_at);
    let stored = w
        .get(plural, ns, &name)
        .map(|o| o.v.clone())
        .unwrap_or_default();
    drop(w);
    let mut resp = json_resp(201, stored);
    for p in pruned {
        if let Ok(h) = HeaderValue::from_str(&format!("299 - \"unknown field \\\"spec.{p}\\\"\"")) {
            resp.headers_mut().append("warning", h);
        }
    }
    resp
}

fn delete(fake: &FakeCluster, ns: &str, plural: &str, name: &str) -> Response {
    let delay = fake.knobs().claim_delete_ticks;
    let mut w = fake.world();
    let tick = w.tick;
    let Some(o) = w.get_mut(plural, ns, name) else {
        return not_found(plural, name);
    };
    if o.v["metadata"].get("deletionTimestamp").is_some() {
        return json_resp(200, o.v.clone());
    }
    if plural == "sandboxclaims" && delay > 0 {
        // The claim controller's finalizer holds it until its sandbox is gone.
        o.v["metadata"]["deletionTimestamp"] = json!(crate::fake_k8s::now_rfc3339());
        o.v["metadata"]["finalizers"] = json!(["extensions.agents.x-k8s.io/sandboxclaim"]);
        o.gone_at = Some(tick + delay);
        let out = o.v.clone();
        let rv = w.next_rv();
        if let Some(o) = w.get_mut(plural, ns, name) {
            o.v["metadata"]["resourceVersion"] = json!(rv);
        }
        return json_resp(200, out);
    }
    let gone = w.remove(plural, ns, name).map(|o| o.v).unwrap_or_default();
    crate::fake_controller::cascade(&mut w, ns, &gone);
    json_resp(200, gone)
}

/// RFC 7386 merge patch of `patch` into `target`.
fn merge(target: &mut Value, patch: &Value) {
    match (target.as_object_mut(), patch.as_object()) {
        (Some(t), Some(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        _ => *target = patch.clone(),
    }
}

fn patch(fake: &FakeCluster, r: &Req, ns: &str, plural: &str, name: &str) -> Response {
    let ct = r.header("content-type").unwrap_or("");
    if !ct.starts_with("application/merge-patch+json")
        && !ct.starts_with("application/json-patch+json")
    {
        return status(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
            json!({}),
        );
    }
    let Ok(p) = serde_json::from_slice::<Value>(&r.body) else {
        return status(400, "BadRequest", "invalid JSON in patch", json!({}));
    };
    if !ct.starts_with("application/merge-patch+json") {
        return status(
            422,
            "Invalid",
            "this fake serves merge patches only",
            json!({}),
        );
    }
    fake.record()
        .patches
        .push((plural.to_owned(), name.to_owned(), p.clone()));
    let mut w = fake.world();
    let rv = w.rv + 1;
    let Some(o) = w.get_mut(plural, ns, name) else {
        return not_found(plural, name);
    };
    let before = o.v["spec"].clone();
    // Status is a subresource: a patch of the main resource does not change it.
    let mut p = p;
    p.as_object_mut().map(|m| m.remove("status"));
    merge(&mut o.v, &p);
    if o.v["spec"] != before {
        let g = o.v["metadata"]["generation"].as_u64().unwrap_or(1) + 1;
        o.v["metadata"]["generation"] = json!(g);
    }
    o.v["metadata"]["resourceVersion"] = json!(rv.to_string());
    let out = o.v.clone();
    w.rv = rv;
    json_resp(200, out)
}
