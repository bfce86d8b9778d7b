//! The fake OpenSandbox's version switch: what 1.2 and 1.3 change, per their release notes.
//!
//! 1.1.1 is what `Variant::Real` was built from (recorded). 1.2 and 1.3 were not run here;
//! their behaviour below is modelled from the release notes of OpenSandbox 1.2.0
//! (2026-10-27), 1.2.1-rc.2 (2026-11-11), 1.3.0-rc.4 (2026-11-27) and 1.3.0 (2026-11-30), and
//! from FastAPI/pydantic's own error shapes; `docs/opensandbox.md` lists what each rests on:
//!
//! * 1.2+: request objects reject unknown fields (pydantic `extra="forbid"`): FastAPI's 422
//!   with an `extra_forbidden` item naming the field. 1.1.1 ignores them.
//! * 1.3: `GET /sandboxes/{id}/endpoints/44772` (direct) answers execd's per-sandbox
//!   `X-EXECD-ACCESS-TOKEN` in `headers`, derived from a versioned master key, and execd's
//!   own port refuses any other token with its 401; the server proxy (maintenance mode) adds
//!   the token itself. Rotating the master key invalidates every token handed out.
//! * 1.3: snapshots take `mode: "rootfsOnly"` (Fast Sandbox runtimes).
//! * 1.3: the DevOps diagnostics routes (`…/diagnostics/inspect`, `…/summary`) are gone: 404.
//! * Any version: `POST /sandboxes` answers 429 with `Retry-After` while throttled (a knob).

use std::hash::{Hash, Hasher};

use serde_json::{json, Value};

/// Which server release the fake plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum FakeVersion {
    #[default]
    V1_1_1,
    V1_2,
    V1_3,
}

/// `CreateSandboxRequest`'s fields (server 1.1.1's OpenAPI document; 1.2/1.3 add none the
/// adapter sends).
const CREATE_FIELDS: &[&str] = &[
    "image",
    "snapshotId",
    "templateId",
    "platform",
    "timeout",
    "resourceLimits",
    "resourceRequests",
    "env",
    "metadata",
    "lifecycle",
    "entrypoint",
    "networkPolicy",
    "credentialProxy",
    "secureAccess",
    "volumes",
    "extensions",
];

/// The request bodies the fake checks for unknown fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    CreateSandbox,
    CreateSnapshot,
    Renew,
}

impl FakeVersion {
    /// What `GET /version` answers.
    pub fn answer(self) -> &'static str {
        match self {
            FakeVersion::V1_1_1 => "1.1.1",
            FakeVersion::V1_2 => "1.2.1",
            FakeVersion::V1_3 => "1.3.0",
        }
    }

    /// Whether execd reached directly needs the per-sandbox token.
    pub fn execd_tokens(self) -> bool {
        self >= FakeVersion::V1_3
    }

    /// Whether snapshots take `mode`.
    pub fn snapshot_modes(self) -> bool {
        self >= FakeVersion::V1_3
    }

    fn fields(self, kind: BodyKind) -> &'static [&'static str] {
        match kind {
            BodyKind::CreateSandbox => CREATE_FIELDS,
            BodyKind::CreateSnapshot if self.snapshot_modes() => &["name", "mode"],
            BodyKind::CreateSnapshot => &["name"],
            BodyKind::Renew => &["expiresAt"],
        }
    }

    /// The 422 a 1.2+ server answers to a body with a field it does not know (pydantic's
    /// `extra_forbidden`, one item per field); `None` if the body passes (always on 1.1.1,
    /// which ignores unknown fields).
    pub fn refuse_unknown(self, kind: BodyKind, body: &Value) -> Option<Value> {
        if self < FakeVersion::V1_2 {
            return None;
        }
        let known = self.fields(kind);
        let items: Vec<Value> = body
            .as_object()?
            .iter()
            .filter(|(k, _)| !known.contains(&k.as_str()))
            .map(|(k, v)| {
                json!({"type": "extra_forbidden", "loc": ["body", k],
                       "msg": "Extra inputs are not permitted", "input": v})
            })
            .collect();
        (!items.is_empty()).then(|| json!({ "detail": items }))
    }

    /// Whether the route (segments after `/v1`) was removed in this version.
    pub fn removed(self, segs: &[&str]) -> bool {
        self >= FakeVersion::V1_3
            && matches!(segs, ["sandboxes", _, "diagnostics", "inspect" | "summary"])
    }
}

/// The sandbox's execd token under master key `key_version`. The real server derives it by
/// HMAC from its versioned master key; the fake's keyed hash stands in for it (the adapter
/// never derives a token: it relays the one the endpoint API gives).
pub fn execd_token(key_version: u32, sandbox: &str) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    ("fake-master-key", key_version, sandbox).hash(&mut h);
    format!("v{key_version}.{:016x}", h.finish())
}
