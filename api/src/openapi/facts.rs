//! What the generated schemas cannot learn from serde: the bounds, patterns and vocabularies
//! the code checks, and the prose written for API users. One entry per fact, at the field it
//! is about; the values come from the code's own constants.

use differently_core::exec::MAX_EXEC_TIMEOUT_SECONDS;
use differently_core::ids::id_pattern;
use differently_core::policy::{ExternalMode, Strategy};
use differently_core::sandbox::{
    CLASSIFICATIONS, KNOWN_CAPABILITIES, MAX_IDLE_TIMEOUT_SECONDS, MAX_TTL_SECONDS, PROFILES,
};
use differently_core::tenancy::MAX_QUOTA_COUNT;
use differently_core::{warm, Resources};
use serde_json::{json, Map, Value};

use super::wire;

/// The prefixes of webhook and delivery ids (`whk_…`, `whd_…`, as
/// `store::webhooks::valid_webhook_id` and `valid_delivery_id` check them).
pub(super) const WEBHOOK_PREFIX: &str = "whk";
pub(super) const DELIVERY_PREFIX: &str = "whd";

/// A pool name (`pool::validate_pool_name`); also a warm class's name.
pub(super) const POOL_NAME: &str = "^[a-z0-9][a-z0-9-]{0,62}$";

/// Where a fact lands: a component, a JSON pointer inside it, and the keys it sets (a null
/// removes the key).
type Fact = (&'static str, String, Value);

fn at(component: &'static str, pointer: &str, patch: Value) -> Fact {
    (component, pointer.to_owned(), patch)
}

/// `min..=max`.
fn between(min: u64, max: u64) -> Value {
    json!({ "minimum": min, "maximum": max })
}

/// One of `values`, or null (an optional field that null leaves unset).
fn one_of_or_null(values: impl IntoIterator<Item = Value>) -> Value {
    let mut all: Vec<Value> = values.into_iter().collect();
    all.push(Value::Null);
    json!({ "enum": all })
}

fn names(values: &[&str]) -> Vec<Value> {
    values.iter().map(|v| json!(v)).collect()
}

/// Environment variable names (`sandbox::validate_env_names`).
fn env_names() -> Value {
    json!({ "propertyNames": { "pattern": "^[A-Za-z_][A-Za-z0-9_]*$" } })
}

/// Labels a caller sets (`sandbox::validate_labels`): keys 1-63 characters without `=`
/// and not in the reserved `differently.dev/` prefix, values at most 255.
pub(super) fn labels() -> Value {
    json!({ "propertyNames": { "minLength": 1, "maxLength": 63, "pattern": "^[^=]*$",
                               "not": { "pattern": "^differently\\.dev/" } },
            "additionalProperties": { "type": "string", "maxLength": 255 } })
}

/// The bounds of one sandbox's resources (`Resources::validate`), under `prefix`.
fn resource_bounds(component: &'static str, prefix: &str) -> [Fact; 3] {
    [
        at(
            component,
            &format!("{prefix}/cpu"),
            between(1, u64::from(Resources::MAX_CPU)),
        ),
        at(
            component,
            &format!("{prefix}/memoryMiB"),
            between(Resources::MIN_MEMORY_MIB, Resources::MAX_MEMORY_MIB),
        ),
        at(
            component,
            &format!("{prefix}/diskGiB"),
            between(0, Resources::MAX_DISK_GIB),
        ),
    ]
}

fn facts() -> Vec<Fact> {
    let mut f = vec![
        // Served: a newer server may add a field.
        at("Resources", "", json!({ "additionalProperties": null })),
        at(
            "CreateSandboxRequest",
            "/properties/template",
            json!({ "minLength": 1, "maxLength": 512 }),
        ),
        at(
            "CreateSandboxRequest",
            "/properties/profile",
            one_of_or_null(names(&PROFILES)),
        ),
        at("CreateSandboxRequest", "/properties/env", env_names()),
        at("CreateSandboxRequest", "/properties/labels", labels()),
        at(
            "CreateSandboxRequest",
            "/properties/ttlSeconds",
            between(1, MAX_TTL_SECONDS),
        ),
        at(
            "CreateSandboxRequest",
            "/properties/idleTimeoutSeconds",
            between(1, MAX_IDLE_TIMEOUT_SECONDS),
        ),
        at(
            "CreateSandboxRequest",
            "/properties/capabilities/items",
            json!({ "enum": names(&KNOWN_CAPABILITIES) }),
        ),
        at(
            "CreateSandboxRequest",
            "/properties/classification",
            one_of_or_null(names(&CLASSIFICATIONS)),
        ),
        at(
            "CreateSandboxRequest",
            "/properties/region",
            json!({ "minLength": 1, "maxLength": 63 }),
        ),
        at(
            "CreateSandboxRequest",
            "/properties/strategy",
            one_of_or_null(Strategy::ALL.map(wire)),
        ),
        at(
            "CreateSandboxRequest",
            "/properties/external",
            one_of_or_null(ExternalMode::ALL.map(wire)),
        ),
        at(
            "CreateSandboxRequest",
            "/properties/priority",
            json!({ "minimum": -100, "maximum": 100 }),
        ),
        at(
            "CreateSandboxRequest",
            "/properties/fromSnapshot",
            json!({ "description": "Restore or fork: a ready snapshot's id." }),
        ),
        // The program (the first item) is never empty.
        at(
            "ExecRequest",
            "/properties/command",
            json!({ "minItems": 1, "prefixItems": [{ "type": "string", "minLength": 1 }] }),
        ),
        at("ExecRequest", "/properties/env", env_names()),
        at(
            "ExecRequest",
            "/properties/cwd",
            json!({ "pattern": "^/", "description": "An absolute path." }),
        ),
        // Canonical padded base64, as the decoder wants it: the bits a short last group
        // drops are zero.
        at(
            "ExecRequest",
            "/properties/stdinBase64",
            json!({ "contentEncoding": "base64",
                "pattern": "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)?$" }),
        ),
        at(
            "ExecRequest",
            "/properties/timeoutSeconds",
            between(1, MAX_EXEC_TIMEOUT_SECONDS),
        ),
        // `stdin` and `stdinBase64` exclude each other (a null is as good as absent).
        at(
            "ExecRequest",
            "",
            json!({ "not": { "required": ["stdin", "stdinBase64"],
                "properties": { "stdin": { "type": "string" },
                                "stdinBase64": { "type": "string" } } } }),
        ),
        // `files::validate_path`, the root included (it is there), and the octal permission
        // bits `u32::from_str_radix(_, 8)` reads, up to 0o777.
        at(
            "MakeDirectory",
            "/properties/path",
            json!({ "pattern": format!("{}/", super::NO_PARENT) }),
        ),
        at(
            "MakeDirectory",
            "/properties/mode",
            json!({ "pattern": "^\\+?0*[0-7]{1,3}$" }),
        ),
        // `StartProcess::validate`: a command's checks, as exec's, and a tag's length.
        at(
            "StartProcess",
            "/properties/command",
            json!({ "minItems": 1, "prefixItems": [{ "type": "string", "minLength": 1 }] }),
        ),
        at("StartProcess", "/properties/env", env_names()),
        at(
            "StartProcess",
            "/properties/cwd",
            json!({ "pattern": "^/", "description": "An absolute path." }),
        ),
        at(
            "StartProcess",
            "/properties/timeoutSeconds",
            between(1, MAX_EXEC_TIMEOUT_SECONDS),
        ),
        at(
            "StartProcess",
            "/properties/tag",
            json!({ "maxLength": differently_core::process::MAX_TAG_LEN }),
        ),
        // `TerminalSize::validate`: each side 1-1000 cells.
        at(
            "TerminalSize",
            "/properties/cols",
            between(1, u64::from(differently_core::process::MAX_PTY_SIDE)),
        ),
        at(
            "TerminalSize",
            "/properties/rows",
            between(1, u64::from(differently_core::process::MAX_PTY_SIDE)),
        ),
        // The bounds of `Quota::validate`.
        at(
            "Quota",
            "/properties/maxActive",
            between(0, MAX_QUOTA_COUNT),
        ),
        at("Quota", "/properties/maxCpu", between(0, MAX_QUOTA_COUNT)),
        at("Quota", "/properties/maxMemoryMiB", between(0, 1 << 30)),
        at("Quota", "/properties/maxDiskGiB", between(0, 1 << 30)),
        at(
            "Quota",
            "/properties/maxQueued",
            between(0, MAX_QUOTA_COUNT),
        ),
        at(
            "Quota",
            "/properties/maxQueueSeconds",
            between(1, 30 * 24 * 3600),
        ),
        at(
            "Policy",
            "",
            json!({ "description": "A placement policy at one level (global, organization, \
                project); an absent field does not restrict, except external use, which fails \
                closed. See docs/placement.md." }),
        ),
        at(
            "Policy",
            "/properties/allowedClassifications/items",
            json!({ "enum": names(&CLASSIFICATIONS) }),
        ),
        at(
            "Policy",
            "/properties/poolClassifications",
            json!({ "propertyNames": { "pattern": POOL_NAME } }),
        ),
        at(
            "Policy",
            "/properties/poolClassifications/additionalProperties/items",
            json!({ "enum": names(&CLASSIFICATIONS) }),
        ),
        at(
            "Policy",
            "/properties/allowedRegions/items",
            json!({ "minLength": 1, "maxLength": 63 }),
        ),
        at(
            "Policy",
            "/properties/externalPools/items",
            json!({ "pattern": POOL_NAME }),
        ),
        at(
            "Policy",
            "/properties/deniedPools/items",
            json!({ "pattern": POOL_NAME }),
        ),
        at(
            "PoolVerdict",
            "/properties/score",
            json!({ "minimum": 0, "maximum": 100 }),
        ),
        at(
            "PoolVerdict",
            "/properties/stage",
            json!({ "description": "The filter that excluded the pool: `security` \
                (classification, trust, external use, denied pools, region), `capability`, \
                `size` (larger than the pool can ever run) or `capacity` (health and slots, \
                which may free up: the request can wait). Absent when eligible." }),
        ),
        at(
            "SnapshotRequest",
            "/properties/name",
            json!({ "minLength": 1, "maxLength": 255 }),
        ),
        // A devhost pool serves what its commands run under.
        at(
            "PoolRecord",
            "/properties/isolation",
            json!({ "type": null, "enum": null, "anyOf": [
                { "type": "string", "enum": ["container", "microvm"] },
                { "type": "string", "enum": ["bwrap", "none"] },
                { "type": "null" }] }),
        ),
        at(
            "PoolRecord",
            "/properties/settings",
            json!({ "description": "Adapter settings: credential references (an environment \
                variable, a file, a stored secret's name), never credentials." }),
        ),
    ];
    f.extend(resource_bounds(
        "CreateSandboxRequest",
        "/properties/resources/anyOf/0/properties",
    ));
    f.extend(resource_bounds(
        "Quota",
        "/properties/maxSandbox/anyOf/0/properties",
    ));
    f.extend(resource_bounds(
        "WarmClass",
        "/properties/resources/anyOf/0/properties",
    ));
    f.extend(warm_class());
    f.extend(bodies());
    f
}

/// An organization, project or key name (`tenancy::validate_name`): 1-100 characters, no
/// control character, not only whitespace.
fn name() -> Value {
    json!({ "maxLength": 100,
            "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f]*[^\\s\\u0000-\\u001f\\u007f-\\u009f][^\\u0000-\\u001f\\u007f-\\u009f]*$" })
}

/// The route-private request bodies and the answers a route builds around a component.
fn bodies() -> Vec<Fact> {
    vec![
        at(
            "UpdateSandboxRequest",
            "/properties/ttlSeconds",
            between(1, MAX_TTL_SECONDS),
        ),
        at("UpdateSandboxRequest", "/properties/labels", labels()),
        at(
            "UpdateSandboxRequest",
            "/properties/idleTimeoutSeconds",
            between(1, MAX_IDLE_TIMEOUT_SECONDS),
        ),
        at(
            "PortRequest",
            "/properties/port",
            between(1, u64::from(u16::MAX)),
        ),
        at(
            "PortRequest",
            "/properties/expiresSeconds",
            between(1, crate::routes::ports::MAX_PORT_SECONDS),
        ),
        at("CreateOrgRequest", "/properties/name", name()),
        at("UpdateOrgRequest", "/properties/name", name()),
        at("CreateProjectRequest", "/properties/name", name()),
        at("UpdateProjectRequest", "/properties/name", name()),
        at("CreateKeyRequest", "/properties/name", name()),
        at(
            "CreateKeyRequest",
            "/properties/scopes",
            json!({ "minItems": 1 }),
        ),
        at(
            "CreateKeyRequest",
            "/properties/expiresAt",
            json!({ "description": "In the future." }),
        ),
        at(
            "CreatedKey",
            "/properties/key",
            json!({ "description": "The secret, `dly_<keyid>_<secret>`: shown this once." }),
        ),
        // `routes::audit::segment`: trimmed, 1-500 characters.
        at(
            "AuditSegmentRequest",
            "/properties/reason",
            json!({ "minLength": 1, "maxLength": 500, "pattern": "\\S" }),
        ),
        at(
            "QuotaView",
            "/properties/usage",
            json!({ "description": "What the scope uses now: active, queued, CPU, memory, disk." }),
        ),
        at(
            "EventCredentialsRequest",
            "/properties/ttlSeconds",
            between(
                crate::routes::event_credentials::MIN_TTL_SECONDS,
                differently_bus::callout::MAX_CREDENTIAL_TTL.as_secs(),
            ),
        ),
        at(
            "EventCredentialsRequest",
            "/properties/projectId",
            json!({ "pattern": id_pattern(differently_core::ProjectId::PREFIX) }),
        ),
        at(
            "PoolRequest",
            "/properties/settings",
            json!({ "description": "Adapter settings (credential references only)." }),
        ),
    ]
    .into_iter()
    .chain(pool_request())
    .chain(webhook_bodies())
    .chain(answers())
    .chain(records())
    .chain(trust_report())
    .collect()
}

/// The admin pools body's bounds, as `routes::pools` checks them (`validate_pool_name`,
/// `check_pool_bounds`: the same for a pool from the config file).
fn pool_request() -> Vec<Fact> {
    use differently_core::pool::{
        MAX_COST_PER_CPU_HOUR, MAX_POOL_CONCURRENT, MAX_REGION_CHARS, MAX_TYPICAL_CREATE_SECONDS,
    };
    vec![
        at(
            "PoolRequest",
            "/properties/name",
            json!({ "pattern": POOL_NAME }),
        ),
        at(
            "PoolRequest",
            "/properties/region",
            json!({ "minLength": 1, "maxLength": MAX_REGION_CHARS,
                    "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f]*$" }),
        ),
        at(
            "PoolRequest",
            "/properties/maxConcurrent",
            between(1, u64::from(MAX_POOL_CONCURRENT)),
        ),
        at(
            "PoolRequest",
            "/properties/costPerCpuHour",
            json!({ "minimum": 0, "maximum": MAX_COST_PER_CPU_HOUR }),
        ),
        at(
            "PoolRequest",
            "/properties/typicalCreateSeconds",
            json!({ "minimum": 0, "maximum": MAX_TYPICAL_CREATE_SECONDS }),
        ),
    ]
}

/// What serde cannot say of the answers routes build.
fn answers() -> Vec<Fact> {
    let codes = || json!({ "enum": differently_core::ErrorCode::ALL.map(|c| c.as_str()) });
    let count = |description: &str| json!({ "minimum": 0, "description": description });
    vec![
        // Serialized duration first (the stream's bytes never changed); listed in the order
        // the SDKs' models take them.
        at(
            "ExecExit",
            "",
            json!({ "required": ["exitCode", "durationMs"] }),
        ),
        at("StreamError", "/properties/code", codes()),
        // `error::ApiError`'s body, whichever layer answers it.
        at("Error", "/properties/error/properties/code", codes()),
        at(
            "Error",
            "/properties/error/properties/details",
            json!({ "description": "Machine-readable: `field` (a JSON path) for bad input, \
                `status`, `operation` …" }),
        ),
        at(
            "Error",
            "/properties/error/properties/requestId",
            json!({ "description": "The request's id: the `X-Request-Id` response header and \
                the audit records' request id." }),
        ),
        // `routes::queue`.
        at(
            "QueueReport",
            "/properties/orgs/items/properties/oldestSandboxId",
            json!({ "pattern": id_pattern(differently_core::SandboxId::PREFIX) }),
        ),
        at(
            "QueueReport",
            "/properties/orgs/items/properties/walls",
            json!({ "propertyNames": { "enum": ["org", "project", "pool", "unknown"] } }),
        ),
        // `routes::warm`: each class as stored (the fields it left out stay out, the filled
        // `maxAgeSeconds` is always there) and its counts.
        at(
            "WarmClassStatus",
            "",
            json!({ "required": ["name", "size", "refillPerSecond", "maxAgeSeconds", "ready",
                                 "creating", "claimsPerMinute", "hitRatio"] }),
        ),
        at(
            "WarmClassStatus",
            "/properties/ready",
            count("Instances ready to be claimed."),
        ),
        at(
            "WarmClassStatus",
            "/properties/creating",
            count("Instances being created."),
        ),
        at(
            "WarmClassStatus",
            "/properties/claimsPerMinute",
            count(
                "Instances claimed per minute over the last 10 minutes, counted by every API \
                 process.",
            ),
        ),
        at(
            "WarmClassStatus",
            "/properties/hitRatio",
            json!({ "minimum": 0, "maximum": 1,
                    "description": "Of the creates that matched the class over the last 10 \
                        minutes, the share answered from a ready instance; null when none \
                        matched." }),
        ),
    ]
}

/// What serde cannot say of the store's records as served (`store::audit`, `store::secrets`,
/// `store::webhooks`): their hashes, ids and counts.
fn records() -> Vec<Fact> {
    use differently_store::webhooks::MAX_RESPONSE_BODY_BYTES;
    let hash = || json!({ "pattern": "^[0-9a-f]{64}$" });
    let count = || json!({ "minimum": 0 });
    let webhook_id = || json!({ "pattern": id_pattern(WEBHOOK_PREFIX) });
    let mut f = vec![
        at(
            "AuditEvent",
            "/properties/chainSeq",
            json!({ "minimum": 1 }),
        ),
        at(
            "AuditEvent",
            "/properties/detail",
            json!({ "description": "What else matters; never a secret, exec arguments or \
                environment values." }),
        ),
        at("Checkpoint", "/properties/seq", json!({ "minimum": 1 })),
        at(
            "Checkpoint",
            "/properties/heads/items/properties/hash",
            hash(),
        ),
        at(
            "Secret",
            "/properties/fingerprint",
            json!({ "pattern": "^sha256:[0-9a-f]{16}$" }),
        ),
        at(
            "SecretRequest",
            "/properties/value",
            json!({ "minLength": 1 }),
        ),
        at("Webhook", "/properties/id", webhook_id()),
        at("Webhook", "/properties/consecutiveFailures", count()),
        at(
            "WebhookWithSecret",
            "/properties/secret",
            json!({ "pattern": "^whsec_[A-Za-z0-9+/]+=*$",
                    "description": "The signing secret, shown this once." }),
        ),
        at(
            "WebhookDelivery",
            "/properties/id",
            json!({ "pattern": id_pattern(DELIVERY_PREFIX) }),
        ),
        at("WebhookDelivery", "/properties/webhookId", webhook_id()),
        at("WebhookDelivery", "/properties/attempts", count()),
        at(
            "WebhookDelivery",
            "/properties/responseBody",
            json!({ "maxLength": MAX_RESPONSE_BODY_BYTES }),
        ),
    ];
    for record in ["AuditEvent", "Checkpoint"] {
        f.push(at(record, "/properties/prevHash", hash()));
        f.push(at(record, "/properties/hash", hash()));
    }
    for n in [
        "chains",
        "records",
        "checkpoints",
        "unchainedRecords",
        "unverifiableRecords",
        "unverifiableCheckpoints",
    ] {
        f.push(at("Verification", &format!("/properties/{n}"), count()));
    }
    f
}

/// `routes::pools` and `routes::trust`: what serde cannot say of the pools as served.
fn trust_report() -> Vec<Fact> {
    let pool = |field: &str| format!("/properties/pools/items/properties/{field}");
    vec![
        at("Pool", "/properties/backendVersion", backend_version()),
        at("TrustReport", &pool("backendVersion"), backend_version()),
        at(
            "TrustReport",
            &pool("credentials/items/properties/kind"),
            json!({ "enum": ["env", "file", "secret", "inline"] }),
        ),
        at(
            "TrustReport",
            "/properties/externalPlacements/items/properties/sandboxes",
            json!({ "minimum": 0 }),
        ),
    ]
}

/// A pool's `backendVersion` (`routes::pools::Backend`), in the pools admin and the trust
/// report.
fn backend_version() -> Value {
    json!({ "description": "The backend version this API process's adapter last detected; \
        null before its first call or when the backend does not say." })
}

/// `routes::webhooks`: what create and patch accept.
fn webhook_bodies() -> Vec<Fact> {
    use crate::routes::webhooks::{MAX_DESCRIPTION, MAX_EVENT_TYPES};
    let url = json!({ "minLength": 1,
        "maxLength": differently_webhooks::url_policy::MAX_URL_LEN,
        "pattern": "^[Hh][Tt][Tt][Pp][Ss]?://" });
    let event_types = json!({ "maxItems": MAX_EVENT_TYPES,
        "description": "Event types delivered: exact (`sandbox.status.changed`), a prefix \
            (`sandbox.exec.*`) or `*`; empty or absent: every type." });
    let description = json!({ "minLength": 0, "maxLength": MAX_DESCRIPTION });
    let mut f = vec![at(
        "CreateWebhookRequest",
        "/properties/projectId",
        json!({ "pattern": id_pattern(differently_core::ProjectId::PREFIX) }),
    )];
    for body in ["CreateWebhookRequest", "UpdateWebhookRequest"] {
        f.extend([
            at(body, "/properties/url", url.clone()),
            at(body, "/properties/eventTypes", event_types.clone()),
            at(
                body,
                "/properties/eventTypes/items",
                json!({ "minLength": 1 }),
            ),
            at(body, "/properties/description", description.clone()),
        ]);
    }
    f
}

/// `core::warm`: a class fixes its instances' resources whole (no field is filled from a
/// default).
fn warm_class() -> Vec<Fact> {
    let p = |field: &str| format!("/properties/{field}");
    vec![
        at(
            "WarmClass",
            &p("name"),
            json!({ "pattern": POOL_NAME, "description": "Unique within the pool." }),
        ),
        at(
            "WarmClass",
            &p("size"),
            json!({ "minimum": 0, "maximum": warm::MAX_SIZE,
                    "description": "Instances kept creating or ready." }),
        ),
        at(
            "WarmClass",
            &p("maxSize"),
            json!({ "minimum": 0, "maximum": warm::MAX_SIZE,
                    "description": "Ready instances above which the surplus is retired \
                        (at least `size`; absent: `size`)." }),
        ),
        at(
            "WarmClass",
            &p("refillPerSecond"),
            json!({ "exclusiveMinimum": 0, "maximum": warm::MAX_REFILL_PER_SECOND,
                    "description": "Creates started per second at most while refilling." }),
        ),
        at(
            "WarmClass",
            &p("maxAgeSeconds"),
            json!({ "minimum": warm::MIN_MAX_AGE_SECONDS,
                    "maximum": warm::MAX_MAX_AGE_SECONDS,
                    "description": "A ready instance older than this is replaced \
                        (default 3600)." }),
        ),
        at(
            "WarmClass",
            &p("template"),
            json!({ "minLength": 1, "maxLength": 512,
                    "description": "The instances' template; absent: the pool's default \
                        (what a create naming no template gets). A create matches the \
                        class when its template and resources are the class's." }),
        ),
        at(
            "WarmClass",
            &p("resources"),
            json!({ "description": "The instances' resources; absent: what a create asking \
                for none gets." }),
        ),
        at(
            "WarmClassesRequest",
            &p("classes"),
            json!({ "maxItems": warm::MAX_CLASSES,
                    "description": "Every class of the pool, in matching order (the first \
                        class a create matches is the one it claims from); `[]` removes \
                        them all." }),
        ),
        // The route reads the body into its own type, where `classes` is required (a
        // forgotten field must never empty a pool's classes); the derived schema has the
        // core type's default.
        at("WarmClassesRequest", "", json!({ "required": ["classes"] })),
    ]
}

/// Applies the facts about the components `which` selects to `schemas`; answers the facts
/// that found no field (a renamed or removed field: a test fails on any).
pub(super) fn apply(schemas: &mut Map<String, Value>, which: impl Fn(&str) -> bool) -> Vec<String> {
    let mut missed = Vec::new();
    for (component, pointer, patch) in facts().into_iter().filter(|(c, _, _)| which(c)) {
        let target = schemas
            .get_mut(component)
            .and_then(|s| s.pointer_mut(&pointer))
            .and_then(Value::as_object_mut);
        let (Some(target), Value::Object(patch)) = (target, patch) else {
            missed.push(format!("{component}{pointer}"));
            continue;
        };
        for (k, v) in patch {
            if v.is_null() {
                target.remove(&k);
            } else {
                target.insert(k, v);
            }
        }
    }
    missed
}
