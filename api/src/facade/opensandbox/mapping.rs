//! Pure translations between OpenSandbox's lifecycle shapes and `/v1`'s: the create body, the
//! sandbox, its state, the snapshot. Anything of OpenSandbox's that Differently cannot honour
//! is a 400 naming the field, never silently dropped.

use serde_json::{json, Map, Value};

use super::error::OsbError;

/// The entrypoint the SDKs send by default; Differently runs the template's own, which keeps
/// the sandbox alive the same way.
pub const DEFAULT_ENTRYPOINT: [&str; 3] = ["tail", "-f", "/dev/null"];

/// OpenSandbox's capitalised state of a `/v1` status.
pub fn state_of(status: &str) -> &'static str {
    match status {
        "queued" | "provisioning" => "Pending",
        "running" => "Running",
        "paused" => "Paused",
        "stopped" => "Stopped",
        "terminating" => "Stopping",
        "terminated" => "Terminated",
        "failed" => "Failed",
        _ => "Unknown",
    }
}

/// The `/v1` statuses an OpenSandbox state filter means (`None`: a state we never report).
pub fn statuses_of(state: &str) -> Option<&'static [&'static str]> {
    Some(match state.to_ascii_lowercase().as_str() {
        "pending" => &["queued", "provisioning"],
        "running" => &["running"],
        "paused" => &["paused"],
        "stopped" => &["stopped"],
        "stopping" => &["terminating"],
        "terminated" => &["terminated"],
        "failed" => &["failed"],
        "pausing" | "resuming" => &[],
        _ => return None,
    })
}

/// Whether a sandbox in this `/v1` status is gone for OpenSandbox clients (a killed
/// sandbox answers 404, as on the real server).
pub fn is_gone(status: &str) -> bool {
    matches!(status, "terminating" | "terminated")
}

/// The OpenSandbox request a `/v1` call was made for, so a `/v1` refusal names the field
/// that request sent ([`V1_FIELDS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asked {
    /// `POST /v1/sandboxes` (its `/v1` create body is [`create_body`]).
    Create,
    /// `POST /v1/sandboxes/{id}/renew-expiration` (a `/v1` TTL patch).
    Renew,
    /// execd's `POST /command` and a session's run (a `/v1` process).
    Command,
}

/// The `/v1` fields the facade fills from OpenSandbox fields of another name: (request,
/// `/v1` field, the client's field, the `/v1` unit where the client's is another). A `/v1`
/// refusal naming the `/v1` field, or one below it (`labels.k`), names the client's
/// instead, with the unit its bounds are in.
pub const V1_FIELDS: &[(Asked, &str, &str, &str)] = &[
    (Asked::Create, "template", "image.uri", ""),
    (Asked::Create, "fromSnapshot", "snapshotId", ""),
    (Asked::Create, "ttlSeconds", "timeout", "seconds"),
    (
        Asked::Create,
        "resources.cpu",
        "resourceLimits.cpu",
        "whole CPUs",
    ),
    (
        Asked::Create,
        "resources.memoryMiB",
        "resourceLimits.memory",
        "MiB",
    ),
    (
        Asked::Create,
        "resources.diskGiB",
        "resourceLimits.ephemeral-storage",
        "GiB",
    ),
    (Asked::Create, "resources", "resourceLimits", ""),
    (Asked::Create, "capabilities", "resourceLimits.gpu", ""),
    (Asked::Create, "labels", "metadata", ""),
    (
        Asked::Create,
        "projectId",
        "extensions.differently.projectId",
        "",
    ),
    (Asked::Renew, "ttlSeconds", "expiresAt", "seconds from now"),
    (Asked::Command, "timeoutSeconds", "timeout", "seconds"),
    (Asked::Command, "env", "envs", ""),
];

/// The client's field (and the `/v1` unit) for `/v1` field `v1` of a call made for `asked`.
pub fn client_field(asked: Asked, v1: &str) -> Option<(String, &'static str)> {
    V1_FIELDS.iter().find_map(|(a, from, to, unit)| {
        let rest = v1.strip_prefix(from).filter(|_| *a == asked)?;
        (rest.is_empty() || rest.starts_with('.') || rest.starts_with('['))
            .then(|| (format!("{to}{rest}"), *unit))
    })
}

/// CPU cores from a Kubernetes quantity (`"1"`, `"500m"`, `"2.5"`), rounded up to whole cores
/// (Differently reserves whole CPUs).
pub fn parse_cpu(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let millis: f64 = if let Some(m) = s.strip_suffix('m') {
        m.parse::<f64>()
            .map_err(|_| format!("`{s}` is not a CPU quantity"))?
    } else {
        s.parse::<f64>()
            .map_err(|_| format!("`{s}` is not a CPU quantity"))?
            * 1000.0
    };
    if !millis.is_finite() || millis <= 0.0 {
        return Err(format!("`{s}` must be positive"));
    }
    Ok(((millis / 1000.0).ceil() as u64).max(1))
}

/// Bytes of a Kubernetes quantity (`"512Mi"`, `"2Gi"`, `"1G"`, `"1048576"`).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let units: [(&str, f64); 12] = [
        ("Ki", 1024.0),
        ("Mi", 1024.0 * 1024.0),
        ("Gi", 1024.0 * 1024.0 * 1024.0),
        ("Ti", 1024.0f64.powi(4)),
        ("Pi", 1024.0f64.powi(5)),
        ("Ei", 1024.0f64.powi(6)),
        ("k", 1e3),
        ("K", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
    ];
    let (num, mult) = units
        .iter()
        .find_map(|(u, m)| t.strip_suffix(u).map(|n| (n, *m)))
        .unwrap_or((t, 1.0));
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a byte quantity"))?;
    if !n.is_finite() || n <= 0.0 {
        return Err(format!("`{s}` must be positive"));
    }
    Ok((n * mult).ceil() as u64)
}

fn string_map(v: &Value, field: &str) -> Result<Map<String, Value>, OsbError> {
    let m = v
        .as_object()
        .ok_or_else(|| OsbError::field(field, "must be an object of strings"))?;
    for (k, x) in m {
        if !x.is_string() {
            return Err(OsbError::field(&format!("{field}.{k}"), "must be a string"));
        }
    }
    Ok(m.clone())
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

/// A `/v1` create body for an OpenSandbox `CreateSandboxRequest`.
pub fn create_body(req: &Value) -> Result<Value, OsbError> {
    let obj = req
        .as_object()
        .ok_or_else(|| OsbError::field("body", "must be a JSON object"))?;
    let mut out = Map::new();
    let mut capabilities: Vec<Value> = Vec::new();
    for (k, v) in obj {
        match k.as_str() {
            "image" => {
                if v.is_null() {
                    continue;
                }
                let img = v
                    .as_object()
                    .ok_or_else(|| OsbError::field("image", "must be an object {uri}"))?;
                for ik in img.keys() {
                    match ik.as_str() {
                        "uri" => {}
                        "auth" if img["auth"].is_null() => {}
                        "auth" => {
                            return Err(OsbError::unsupported_field(
                                "image.auth",
                                "registry credentials belong to the pool's configuration",
                            ))
                        }
                        other => {
                            return Err(OsbError::field(&format!("image.{other}"), "unknown field"))
                        }
                    }
                }
                let uri = img
                    .get("uri")
                    .and_then(Value::as_str)
                    .ok_or_else(|| OsbError::field("image.uri", "required string"))?;
                out.insert("template".into(), json!(uri));
            }
            "snapshotId" => {
                if v.is_null() {
                    continue;
                }
                let s = v
                    .as_str()
                    .ok_or_else(|| OsbError::field("snapshotId", "must be a string"))?;
                out.insert("fromSnapshot".into(), json!(s));
            }
            "timeout" => match v {
                Value::Null => {}
                Value::Number(n) => {
                    let t = n.as_u64().filter(|t| *t > 0).ok_or_else(|| {
                        OsbError::field("timeout", "must be a positive integer of seconds or null")
                    })?;
                    out.insert("ttlSeconds".into(), json!(t));
                }
                _ => return Err(OsbError::field("timeout", "must be an integer or null")),
            },
            "resourceLimits" => {
                if v.is_null() {
                    continue;
                }
                let m = string_map(v, "resourceLimits")?;
                let mut res = Map::new();
                for (rk, rv) in &m {
                    let s = rv.as_str().unwrap_or_default();
                    let field = format!("resourceLimits.{rk}");
                    match rk.as_str() {
                        "cpu" => {
                            let c = parse_cpu(s).map_err(|e| OsbError::field(&field, e))?;
                            res.insert("cpu".into(), json!(c));
                        }
                        "memory" => {
                            let b = parse_bytes(s).map_err(|e| OsbError::field(&field, e))?;
                            res.insert("memoryMiB".into(), json!(b.div_ceil(1 << 20)));
                        }
                        "ephemeral-storage" | "disk" => {
                            let b = parse_bytes(s).map_err(|e| OsbError::field(&field, e))?;
                            res.insert("diskGiB".into(), json!(b.div_ceil(1 << 30)));
                        }
                        "gpu" | "nvidia.com/gpu" => {
                            if s.trim() != "0" {
                                capabilities.push(json!("gpu"));
                            }
                        }
                        _ => {
                            return Err(OsbError::unsupported_field(
                                &field,
                                "Differently reserves cpu, memory, ephemeral-storage and gpu",
                            ))
                        }
                    }
                }
                if !res.is_empty() {
                    out.insert("resources".into(), Value::Object(res));
                }
            }
            // Differently reserves what it limits; a smaller request changes nothing.
            "resourceRequests" => {
                if !v.is_null() {
                    string_map(v, "resourceRequests")?;
                }
            }
            "env" => {
                if !is_empty(v) {
                    out.insert("env".into(), Value::Object(string_map(v, "env")?));
                }
            }
            "metadata" => {
                if !is_empty(v) {
                    out.insert("labels".into(), Value::Object(string_map(v, "metadata")?));
                }
            }
            "entrypoint" => {
                let default = v.is_null()
                    || v.as_array().is_some_and(|a| {
                        a.len() == DEFAULT_ENTRYPOINT.len()
                            && a.iter().zip(DEFAULT_ENTRYPOINT).all(|(x, d)| x == d)
                    });
                if !default {
                    return Err(OsbError::unsupported_field(
                        "entrypoint",
                        "sandboxes run their template's own entrypoint; run the process with commands.run(background=True)",
                    ));
                }
            }
            // Every execd call through the facade is authenticated (the endpoint token).
            "secureAccess" => {
                if !(v.is_null() || v.is_boolean()) {
                    return Err(OsbError::field("secureAccess", "must be a boolean"));
                }
            }
            "platform" => {
                if v.is_null() {
                    continue;
                }
                let os = v.get("os").and_then(Value::as_str).unwrap_or("linux");
                if os != "linux" {
                    return Err(OsbError::unsupported_field(
                        "platform.os",
                        "Differently sandboxes run linux",
                    ));
                }
            }
            "networkPolicy" => {
                if v.is_null() {
                    continue;
                }
                let allow_all = v
                    .get("defaultAction")
                    .and_then(Value::as_str)
                    .is_none_or(|a| a == "allow")
                    && v.get("egress").is_none_or(is_empty);
                if !allow_all {
                    return Err(OsbError::unsupported_field(
                        "networkPolicy",
                        "egress rules are set by the pool's operator policy, not per sandbox",
                    ));
                }
            }
            "credentialProxy" => {
                let off = v.is_null() || v.get("enabled").and_then(Value::as_bool) == Some(false);
                if !off {
                    return Err(OsbError::unsupported_field(
                        "credentialProxy",
                        "no credential proxy; put secrets in env",
                    ));
                }
            }
            // The one extension understood: the project to create in, for org-wide keys
            // (a project-bound key creates in its own project).
            "extensions" if !v.is_null() => {
                let m = string_map(v, "extensions")?;
                for (ek, ev) in m {
                    if ek != "differently.projectId" {
                        return Err(OsbError::unsupported_field(
                            &format!("extensions.{ek}"),
                            "the only extension understood is differently.projectId",
                        ));
                    }
                    out.insert("projectId".into(), ev);
                }
            }
            "extensions" => {}
            "volumes" | "lifecycle" => {
                if !is_empty(v) {
                    let why = if k == "volumes" {
                        "sandboxes have no mounted volumes"
                    } else {
                        "use timeout and renew"
                    };
                    return Err(OsbError::unsupported_field(k, why));
                }
            }
            other => return Err(OsbError::field(other, "unknown field")),
        }
    }
    // No timeout (null or omitted) is OpenSandbox's "no expiry"; every Differently sandbox
    // has a TTL, so it gets the longest one.
    out.entry("ttlSeconds")
        .or_insert(json!(differently_core::sandbox::MAX_TTL_SECONDS));
    if out.contains_key("template") && out.contains_key("fromSnapshot") {
        return Err(OsbError::field(
            "image",
            "give image or snapshotId, not both",
        ));
    }
    if !capabilities.is_empty() {
        out.insert("capabilities".into(), Value::Array(capabilities));
    }
    Ok(Value::Object(out))
}

/// The `status` object of a `/v1` sandbox. `lastTransitionAt` is the latest time `/v1`
/// keeps (ended, first started, created): it records none for a pause or a resume, so the
/// value stays put across them, as OpenSandbox 1.1.1's on Docker does (recorded).
fn status_of(sbx: &Value) -> Value {
    let status = sbx["status"].as_str().unwrap_or("");
    let mut st = json!({ "state": state_of(status), "reason": status.to_ascii_uppercase() });
    if let Some(r) = sbx["statusReason"].as_str() {
        st["message"] = json!(r);
    }
    let at = ["endedAt", "startedAt", "createdAt"]
        .iter()
        .find_map(|k| sbx[*k].as_str());
    if let Some(at) = at {
        st["lastTransitionAt"] = json!(at);
    }
    st
}

/// OpenSandbox's `Sandbox` of a `/v1` sandbox. `extensions` carries the pool and where the
/// placement explanation is (`GET /v1/sandboxes/{id}/placement` with the same key).
pub fn sandbox_of(sbx: &Value) -> Value {
    let id = sbx["id"].as_str().unwrap_or_default();
    let mut out = json!({
        "id": id,
        "status": status_of(sbx),
        "entrypoint": DEFAULT_ENTRYPOINT,
        "createdAt": sbx["createdAt"],
        "metadata": sbx.get("labels").cloned().unwrap_or_else(|| json!({})),
        "extensions": {
            "differently.placement": format!("/v1/sandboxes/{id}/placement"),
        },
    });
    if let Some(t) = sbx["template"].as_str() {
        out["image"] = json!({ "uri": t });
    }
    if let Some(p) = sbx["pool"].as_str() {
        out["extensions"]["differently.pool"] = json!(p);
    }
    if let Some(e) = sbx["expiresAt"].as_str() {
        out["expiresAt"] = json!(e);
    }
    out
}

/// The create answer: `{id, status, metadata, expiresAt?, createdAt, entrypoint}`.
pub fn created_of(sbx: &Value) -> Value {
    let mut s = sandbox_of(sbx);
    if let Some(o) = s.as_object_mut() {
        o.remove("image");
    }
    s
}

/// OpenSandbox's `Snapshot` of a `/v1` snapshot.
pub fn snapshot_of(snp: &Value) -> Value {
    let state = match snp["status"].as_str().unwrap_or("") {
        "creating" => "Creating",
        "ready" => "Ready",
        "failed" => "Failed",
        "deleting" => "Deleting",
        _ => "Unknown",
    };
    let mut st = json!({ "state": state });
    if let Some(r) = snp["statusReason"].as_str() {
        st["reason"] = json!(r);
    }
    json!({
        "id": snp["id"],
        "sandboxId": snp["sandboxId"],
        "name": snp["name"],
        "status": st,
        "createdAt": snp["createdAt"],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sdk_default_create_maps_onto_a_v1_create() {
        let req = json!({"image":{"uri":"python:3.11-slim"},"timeout":600,
            "resourceLimits":{"cpu":"500m","memory":"512Mi"},"env":{"K":"V"},
            "metadata":{"osb-flow":"yes"},"entrypoint":["tail","-f","/dev/null"],"secureAccess":false});
        let body = create_body(&req).unwrap();
        assert_eq!(
            body,
            json!({"template":"python:3.11-slim","ttlSeconds":600,
                "resources":{"cpu":1,"memoryMiB":512},"env":{"K":"V"},"labels":{"osb-flow":"yes"}})
        );
    }

    #[test]
    fn null_timeout_means_no_ttl_and_snapshot_maps_to_from_snapshot() {
        let body = create_body(&json!({"snapshotId":"snp_1","timeout":null})).unwrap();
        assert_eq!(
            body,
            json!({"fromSnapshot":"snp_1","ttlSeconds":differently_core::sandbox::MAX_TTL_SECONDS})
        );
    }

    #[test]
    fn unmappable_fields_are_400s_naming_the_field() {
        let cases = [
            (
                json!({"networkPolicy":{"defaultAction":"deny"}}),
                "networkPolicy",
            ),
            (json!({"entrypoint":["python","app.py"]}), "entrypoint"),
            (
                json!({"image":{"uri":"x","auth":{"username":"u","password":"p"}}}),
                "image.auth",
            ),
            (
                json!({"resourceLimits":{"cpu":"lots"}}),
                "resourceLimits.cpu",
            ),
            (json!({"volumes":[{"name":"v"}]}), "volumes"),
            (json!({"extensions":{"poolRef":"x"}}), "extensions.poolRef"),
            (json!({"timeout":-5}), "timeout"),
            (json!({"bogus":1}), "bogus"),
            (json!({"image":{"uri":"x"},"snapshotId":"snp_1"}), "image"),
        ];
        for (req, field) in cases {
            let e = create_body(&req).unwrap_err();
            assert_eq!(e.status.as_u16(), 400, "{req}");
            assert_eq!(e.code, "SANDBOX::INVALID_PARAMETER");
            assert!(e.message.starts_with(field), "{req}: {}", e.message);
        }
        // An allow-all policy asks for nothing Differently does not do.
        assert!(
            create_body(&json!({"networkPolicy":{"defaultAction":"allow","egress":[]}})).is_ok()
        );
    }

    #[test]
    fn v1_fields_map_back_to_what_the_client_sent() {
        let f = |a, v1| client_field(a, v1).map(|(f, u)| (f, u.to_owned()));
        assert_eq!(
            f(Asked::Create, "labels.a.b"),
            Some(("metadata.a.b".into(), String::new()))
        );
        assert_eq!(
            f(Asked::Create, "resources.memoryMiB"),
            Some(("resourceLimits.memory".into(), "MiB".into()))
        );
        assert_eq!(
            f(Asked::Create, "resources"),
            Some(("resourceLimits".into(), String::new()))
        );
        assert_eq!(
            f(Asked::Renew, "ttlSeconds").map(|(f, _)| f),
            Some("expiresAt".into())
        );
        assert_eq!(
            f(Asked::Command, "env.K").map(|(f, _)| f),
            Some("envs.K".into())
        );
        // Only whole segments, and only the request's own fields.
        assert_eq!(f(Asked::Create, "labelsX"), None);
        assert_eq!(f(Asked::Command, "ttlSeconds"), None);
        assert_eq!(f(Asked::Create, "env.K"), None);
    }

    #[test]
    fn last_transition_is_the_latest_time_v1_keeps() {
        let at = |v: Value| sandbox_of(&v)["status"]["lastTransitionAt"].clone();
        let base = json!({"id": "sbx_1", "createdAt": "t0"});
        let mut s = base.clone();
        s["status"] = json!("queued");
        assert_eq!(at(s.clone()), "t0");
        s["status"] = json!("paused");
        s["startedAt"] = json!("t1");
        assert_eq!(at(s.clone()), "t1", "no time of the pause is kept");
        s["status"] = json!("terminated");
        s["endedAt"] = json!("t2");
        assert_eq!(at(s), "t2");
    }

    #[test]
    fn quantities_round_up() {
        assert_eq!(parse_cpu("250m"), Ok(1));
        assert_eq!(parse_cpu("2.5"), Ok(3));
        assert_eq!(parse_bytes("2Gi"), Ok(2 << 30));
        assert_eq!(parse_bytes("1G"), Ok(1_000_000_000));
        assert!(parse_bytes("0").is_err());
    }

    #[test]
    fn states_are_capitalised_and_killed_sandboxes_are_gone() {
        assert_eq!(state_of("queued"), "Pending");
        assert_eq!(state_of("paused"), "Paused");
        assert_eq!(state_of("terminated"), "Terminated");
        assert!(is_gone("terminating") && !is_gone("failed"));
        let s = sandbox_of(
            &json!({"id":"sbx_1","status":"queued","statusReason":"waiting: org cpu quota 2/2",
            "createdAt":"2026-12-01T00:00:00Z","labels":{"a":"b"},"template":"img","pool":"p"}),
        );
        assert_eq!(s["status"]["state"], "Pending");
        assert_eq!(s["status"]["message"], "waiting: org cpu quota 2/2");
        assert_eq!(s["metadata"], json!({"a":"b"}));
        assert_eq!(
            s["extensions"]["differently.placement"],
            "/v1/sandboxes/sbx_1/placement"
        );
        assert_eq!(s["entrypoint"], json!(DEFAULT_ENTRYPOINT));
    }
}
