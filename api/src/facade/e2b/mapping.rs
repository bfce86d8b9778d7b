//! Differently's sandbox as E2B's `Sandbox`, `SandboxDetail` and `ListedSandbox`, and E2B
//! metadata as labels.
//!
//! Metadata keys that labels accept (1–63 characters, no `=`, not the reserved
//! `differently.dev/` prefix, not the facade's own `e2b~` prefix) are labels unchanged, so
//! `/v1` clients and the dashboard see them as they are. Any other key becomes the label
//! `e2b~<32 hex of SHA-256(key)>` whose value is `<base64url(key)>:<value>`: deterministic,
//! so a metadata query finds it, and lossless, so reads give the key back. A value (with the
//! encoded key, for such keys) longer than a label value's 255 characters is refused.

use std::collections::BTreeMap;

use base64::Engine;
use differently_core::sandbox::{FROM_SNAPSHOT_LABEL, RESERVED_LABEL_PREFIX};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use super::error::E2bError;

/// Prefix of an encoded metadata key.
pub const ENCODED_PREFIX: &str = "e2b~";
/// The envd version the facade reports: the newest whose client-side feature gates promise
/// only what the facade serves (0.6.2 would switch on file metadata, which it does not keep).
pub const ENVD_VERSION: &str = "0.6.1";
/// `clientID` (a legacy field the Python SDK requires).
pub const CLIENT_ID: &str = "differently";
/// E2B's default template, which maps onto the pool's default template.
pub const DEFAULT_TEMPLATE: &str = "base";

fn plain_key(k: &str) -> bool {
    !k.is_empty()
        && k.chars().count() <= 63
        && !k.contains('=')
        && !k.starts_with(RESERVED_LABEL_PREFIX)
        && !k.starts_with(ENCODED_PREFIX)
}

/// One metadata entry as a label.
pub fn label_of(key: &str, value: &str) -> Result<(String, String), E2bError> {
    let (k, v) = if plain_key(key) {
        (key.to_owned(), value.to_owned())
    } else {
        let digest = Sha256::digest(key.as_bytes());
        let hex = hex::encode(&digest[..16]);
        let enc = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(key.as_bytes());
        (format!("{ENCODED_PREFIX}{hex}"), format!("{enc}:{value}"))
    };
    if v.chars().count() > 255 {
        return Err(E2bError::field(
            &format!("metadata.{key}"),
            "too long: a value (with its key, for keys longer than 63 characters or holding '=') \
             is at most 255 characters",
        ));
    }
    Ok((k, v))
}

/// Metadata as labels.
pub fn labels_of(
    metadata: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, E2bError> {
    metadata.iter().map(|(k, v)| label_of(k, v)).collect()
}

/// `s` with its `%XX` escapes decoded (how the E2B SDK encodes each metadata key and value
/// of a list query, inside the query's own encoding).
pub fn unescape(s: &str) -> Result<String, E2bError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| E2bError::field("metadata", "not UTF-8 once decoded"))
}

/// Labels as metadata: encoded keys decoded, the system's own labels left out.
pub fn metadata_of(labels: &Value) -> Value {
    let mut out = Map::new();
    let Some(labels) = labels.as_object() else {
        return Value::Object(out);
    };
    for (k, v) in labels {
        let Some(v) = v.as_str() else { continue };
        if k.starts_with(RESERVED_LABEL_PREFIX) {
            continue;
        }
        if k.starts_with(ENCODED_PREFIX) {
            let decoded = v.split_once(':').and_then(|(enc, value)| {
                let key = base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .decode(enc)
                    .ok()?;
                Some((String::from_utf8(key).ok()?, value.to_owned()))
            });
            if let Some((key, value)) = decoded {
                out.insert(key, Value::String(value));
            }
            continue;
        }
        out.insert(k.clone(), Value::String(v.to_owned()));
    }
    Value::Object(out)
}

/// E2B's state of a `/v1` status: `None` for a sandbox that has ended (E2B answers 404).
/// A sandbox not yet running counts as running: E2B has no such state, and the facade's
/// create and connect answer only once it runs.
pub fn state_of(status: &str) -> Option<&'static str> {
    match status {
        "queued" | "provisioning" | "running" => Some("running"),
        "paused" | "stopped" => Some("paused"),
        _ => None,
    }
}

/// The E2B template id of a `/v1` sandbox: for one restored from a snapshot, the snapshot's
/// id (the template E2B's create named).
pub fn template_of(sbx: &Value) -> Value {
    if let Some(snap) = sbx["labels"][FROM_SNAPSHOT_LABEL].as_str() {
        return json!(snap);
    }
    match sbx["template"].as_str() {
        Some(t) => json!(t),
        None => json!(DEFAULT_TEMPLATE),
    }
}

/// The `Sandbox` answer of create and connect: `token` opens envd, `traffic` the sandbox's
/// other ports (the code interpreter SDK sends only it on `/contexts`), `domain` the one
/// `get_host(port)` is built from (`Facade::domain`).
pub fn created(sbx: &Value, token: &str, traffic: &str, domain: &str) -> Value {
    json!({
        "templateID": template_of(sbx),
        "sandboxID": sbx["id"],
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "alias": null,
        "envdAccessToken": token,
        "trafficAccessToken": traffic,
        "domain": domain,
    })
}

/// A `ListedSandbox` (`None` for one that has ended).
pub fn listed(sbx: &Value) -> Option<Value> {
    let state = state_of(sbx["status"].as_str().unwrap_or(""))?;
    let started = if sbx["startedAt"].is_string() {
        sbx["startedAt"].clone()
    } else {
        sbx["createdAt"].clone()
    };
    let end = if sbx["expiresAt"].is_string() {
        sbx["expiresAt"].clone()
    } else {
        started.clone()
    };
    Some(json!({
        "templateID": template_of(sbx),
        "sandboxID": sbx["id"],
        "clientID": CLIENT_ID,
        "alias": null,
        "startedAt": started,
        "endAt": end,
        "cpuCount": sbx["resources"]["cpu"].as_u64().unwrap_or(1),
        "memoryMB": sbx["resources"]["memoryMiB"].as_u64().unwrap_or(0),
        "diskSizeMB": sbx["resources"]["diskGiB"].as_u64().unwrap_or(0) * 1024,
        "state": state,
        "envdVersion": ENVD_VERSION,
        "metadata": metadata_of(&sbx["labels"]),
    }))
}

/// A `SandboxDetail` (`None` for one that has ended), with `domain` as in [`created`].
pub fn detail(sbx: &Value, token: &str, domain: &str) -> Option<Value> {
    let mut v = listed(sbx)?;
    v["envdAccessToken"] = json!(token);
    v["domain"] = json!(domain);
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_keys_labels_refuse_are_encoded_and_decoded_back() {
        let long = "k".repeat(70);
        let md: BTreeMap<String, String> = [
            ("flow".to_owned(), "a".to_owned()),
            ("a=b".to_owned(), "c".to_owned()),
            (long.clone(), "v".to_owned()),
            ("differently.dev/x".to_owned(), "y".to_owned()),
        ]
        .into();
        let labels = labels_of(&md).unwrap();
        assert_eq!(labels["flow"], "a");
        assert!(labels
            .keys()
            .all(|k| k.chars().count() <= 63 && !k.contains('=')));
        assert!(!labels.keys().any(|k| k.starts_with(RESERVED_LABEL_PREFIX)));
        let back = metadata_of(&serde_json::to_value(&labels).unwrap());
        assert_eq!(back, serde_json::to_value(&md).unwrap());
        // The same key always gives the same label, so a query finds it.
        assert_eq!(label_of("a=b", "c").unwrap(), label_of("a=b", "c").unwrap());
        assert!(label_of("k", &"v".repeat(256)).is_err());
    }

    #[test]
    fn list_queries_are_unescaped_once_more() {
        assert_eq!(unescape("a%3Db").unwrap(), "a=b");
        assert_eq!(unescape("odd%20key%").unwrap(), "odd key%");
        assert_eq!(unescape("gr%C3%BC%C3%9Fe").unwrap(), "grüße");
        assert!(unescape("%FF").is_err());
    }

    #[test]
    fn the_domain_answered_is_the_one_given_never_null() {
        let sbx = json!({"id": "sbx_1", "status": "running", "template": null});
        let d = "e2b-facade.invalid";
        assert_eq!(created(&sbx, "t", "tt", d)["domain"], d);
        assert_eq!(detail(&sbx, "t", d).unwrap()["domain"], d);
    }

    #[test]
    fn ended_sandboxes_have_no_e2b_state() {
        assert_eq!(state_of("provisioning"), Some("running"));
        assert_eq!(state_of("stopped"), Some("paused"));
        assert_eq!(state_of("terminating"), None);
        assert!(listed(&json!({"id": "sbx_1", "status": "failed"})).is_none());
    }
}
