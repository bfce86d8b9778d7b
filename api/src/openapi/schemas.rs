//! Component schemas: the objects the API serves and accepts, from the code's own
//! vocabularies (statuses, scopes, strategies, capabilities, error codes).

use differently_core::exec::MAX_EXEC_TIMEOUT_SECONDS;
use differently_core::policy::{ExternalMode, Isolation, Strategy};
use differently_core::pool::{PoolSource, Trust};
use differently_core::sandbox::{CLASSIFICATIONS, KNOWN_CAPABILITIES, MAX_TTL_SECONDS, PROFILES};
use differently_core::tenancy::Scope;
use differently_core::{ErrorCode, Resources, SandboxStatus};
use serde_json::{json, Map, Value};

use super::wire;

pub(super) fn reference(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn typed(ty: &str) -> Value {
    json!({ "type": ty })
}

fn nullable(ty: &str) -> Value {
    json!({ "type": [ty, "null"] })
}

/// An optional integer within `min..=max` (null: the default), the bounds the code checks.
fn bounded(min: u64, max: u64) -> Value {
    json!({ "type": ["integer", "null"], "minimum": min, "maximum": max })
}

fn time() -> Value {
    json!({ "type": "string", "format": "date-time" })
}

fn time_or_null() -> Value {
    json!({ "type": ["string", "null"], "format": "date-time" })
}

fn array_of(items: Value) -> Value {
    json!({ "type": "array", "items": items })
}

fn string_map() -> Value {
    json!({ "type": "object", "additionalProperties": { "type": "string" } })
}

fn one_of_strings(values: impl IntoIterator<Item = Value>) -> Value {
    json!({ "type": "string", "enum": values.into_iter().collect::<Vec<_>>() })
}

/// An object whose listed properties are all present (as the API serves them).
fn served(props: &[(&str, Value)]) -> Value {
    object(props, true)
}

/// An object of optional properties that refuses any other (as the API accepts them).
fn accepted(props: &[(&str, Value)], required: &[&str]) -> Value {
    let mut o = object(props, false);
    o["additionalProperties"] = Value::Bool(false);
    if !required.is_empty() {
        o["required"] = json!(required);
    }
    o
}

fn object(props: &[(&str, Value)], all_required: bool) -> Value {
    let mut properties = Map::new();
    for (name, schema) in props {
        properties.insert((*name).to_owned(), schema.clone());
    }
    let mut o = json!({ "type": "object", "properties": properties });
    if all_required {
        o["required"] = json!(props.iter().map(|(n, _)| *n).collect::<Vec<_>>());
    }
    o
}

/// A page of `item`s.
fn page_of(item: &str) -> Value {
    served(&[
        ("items", array_of(reference(item))),
        ("nextCursor", nullable("string")),
    ])
}

/// An object this document describes only in prose (see docs/api.md).
fn described(description: &str) -> Value {
    json!({ "type": "object", "description": description })
}

pub(super) fn schemas() -> Value {
    let statuses = || one_of_strings(SandboxStatus::ALL.map(wire));
    let scopes = one_of_strings(Scope::ALL.map(wire));
    let resources = served(&[
        ("cpu", typed("integer")),
        ("memoryMiB", typed("integer")),
        ("diskGiB", typed("integer")),
    ]);
    let quota = accepted(
        &[
            ("maxActive", nullable("integer")),
            ("maxCpu", nullable("integer")),
            ("maxMemoryMiB", nullable("integer")),
            ("maxDiskGiB", nullable("integer")),
            ("maxQueued", nullable("integer")),
            ("maxQueueSeconds", nullable("integer")),
            (
                "maxSandbox",
                json!({ "anyOf": [reference("Resources"), { "type": "null" }] }),
            ),
        ],
        &[],
    );
    let key = served(&[
        ("id", typed("string")),
        ("orgId", typed("string")),
        ("projectId", nullable("string")),
        ("name", typed("string")),
        ("scopes", array_of(scopes.clone())),
        ("createdAt", time()),
        ("expiresAt", time_or_null()),
        ("revokedAt", time_or_null()),
        ("lastUsedAt", time_or_null()),
    ]);
    let mut created_key = key.clone();
    created_key["properties"]["key"] = json!({ "type": "string",
        "description": "The secret, `dly_<keyid>_<secret>`: shown this once." });
    if let Some(required) = created_key["required"].as_array_mut() {
        required.push(json!("key"));
    }
    let mut s = Map::new();
    s.insert(
        "Error".to_owned(),
        served(&[(
            "error",
            object(
                &[
                    (
                        "code",
                        one_of_strings(ErrorCode::ALL.map(|c| json!(c.as_str()))),
                    ),
                    ("message", typed("string")),
                    (
                        "details",
                        json!({ "type": "object",
                        "description": "Machine-readable: `field` (a JSON path) for bad input, \
                            `status`, `operation` …" }),
                    ),
                    (
                        "requestId",
                        json!({ "type": "string",
                        "description": "The request's id: the `X-Request-Id` response header \
                            and the audit records' request id." }),
                    ),
                ],
                false,
            ),
        )]),
    );
    s.insert("Resources".to_owned(), resources);
    s.insert(
        "Sandbox".to_owned(),
        served(&[
            ("id", typed("string")),
            ("orgId", typed("string")),
            ("projectId", typed("string")),
            ("status", statuses()),
            ("statusReason", nullable("string")),
            ("pool", nullable("string")),
            ("resources", reference("Resources")),
            ("capabilities", array_of(typed("string"))),
            ("classification", typed("string")),
            ("region", nullable("string")),
            ("labels", string_map()),
            ("template", nullable("string")),
            ("envKeys", array_of(typed("string"))),
            ("ttlSeconds", typed("integer")),
            ("idleTimeoutSeconds", nullable("integer")),
            ("priority", typed("integer")),
            ("attempts", typed("integer")),
            ("createdAt", time()),
            ("startedAt", time_or_null()),
            ("expiresAt", time_or_null()),
            ("endedAt", time_or_null()),
        ]),
    );
    s.insert("SandboxList".to_owned(), page_of("Sandbox"));
    s.insert(
        "CreateSandboxRequest".to_owned(),
        accepted(
            &[
                ("projectId", nullable("string")),
                ("template", nullable("string")),
                (
                    "resources",
                    json!({ "anyOf": [accepted(&[
                ("cpu", bounded(1, u64::from(Resources::MAX_CPU))),
                ("memoryMiB", bounded(Resources::MIN_MEMORY_MIB, Resources::MAX_MEMORY_MIB)),
                ("diskGiB", bounded(0, Resources::MAX_DISK_GIB)),
            ], &[]), { "type": "null" }] }),
                ),
                ("profile", one_of_strings(PROFILES.map(|p| json!(p)))),
                ("env", string_map()),
                ("labels", string_map()),
                ("ttlSeconds", bounded(1, MAX_TTL_SECONDS)),
                ("idleTimeoutSeconds", nullable("integer")),
                (
                    "capabilities",
                    array_of(one_of_strings(KNOWN_CAPABILITIES.map(|c| json!(c)))),
                ),
                (
                    "classification",
                    one_of_strings(CLASSIFICATIONS.map(|c| json!(c))),
                ),
                ("region", nullable("string")),
                ("strategy", one_of_strings(Strategy::ALL.map(wire))),
                ("external", one_of_strings(ExternalMode::ALL.map(wire))),
                ("priority", nullable("integer")),
                (
                    "fromSnapshot",
                    json!({ "type": ["string", "null"],
                "description": "Restore or fork: a ready snapshot's id." }),
                ),
            ],
            &[],
        ),
    );
    s.insert(
        "UpdateSandboxRequest".to_owned(),
        accepted(
            &[
                ("ttlSeconds", bounded(1, MAX_TTL_SECONDS)),
                ("labels", string_map()),
                ("idleTimeoutSeconds", nullable("integer")),
            ],
            &[],
        ),
    );
    s.insert(
        "ExecRequest".to_owned(),
        accepted(
            &[
                (
                    "command",
                    json!({ "type": "array", "items": { "type": "string" }, "minItems": 1 }),
                ),
                ("env", string_map()),
                ("cwd", nullable("string")),
                ("stdin", nullable("string")),
                ("stdinBase64", nullable("string")),
                ("timeoutSeconds", bounded(1, MAX_EXEC_TIMEOUT_SECONDS)),
                (
                    "outputEncoding",
                    json!({ "type": ["string", "null"], "enum": ["utf8", "base64", null] }),
                ),
            ],
            &["command"],
        ),
    );
    s.insert(
        "ExecResult".to_owned(),
        served(&[
            ("exitCode", typed("integer")),
            ("stdout", typed("string")),
            ("stderr", typed("string")),
            ("stdoutTruncated", typed("boolean")),
            ("stderrTruncated", typed("boolean")),
            ("durationMs", typed("integer")),
        ]),
    );
    s.insert(
        "ExecExit".to_owned(),
        served(&[
            ("exitCode", typed("integer")),
            ("durationMs", typed("integer")),
        ]),
    );
    s.insert(
        "StreamError".to_owned(),
        served(&[
            (
                "code",
                one_of_strings(ErrorCode::ALL.map(|c| json!(c.as_str()))),
            ),
            ("message", typed("string")),
        ]),
    );
    s.insert(
        "FileList".to_owned(),
        served(&[(
            "items",
            array_of(served(&[
                ("path", typed("string")),
                ("type", typed("string")),
                ("size", typed("integer")),
                ("mode", typed("integer")),
                ("modifiedAt", time_or_null()),
            ])),
        )]),
    );
    s.insert(
        "PortRequest".to_owned(),
        accepted(
            &[
                ("port", bounded(1, u64::from(u16::MAX))),
                ("expiresSeconds", nullable("integer")),
            ],
            &["port"],
        ),
    );
    s.insert(
        "PortAnswer".to_owned(),
        served(&[("url", typed("string")), ("expiresAt", time_or_null())]),
    );
    s.insert(
        "PendingOperation".to_owned(),
        served(&[("operation", typed("string")), ("status", typed("string"))]),
    );
    s.insert(
        "SnapshotRequest".to_owned(),
        accepted(&[("name", nullable("string"))], &[]),
    );
    s.insert(
        "Snapshot".to_owned(),
        served(&[
            ("id", typed("string")),
            ("orgId", typed("string")),
            ("projectId", typed("string")),
            ("sandboxId", typed("string")),
            ("pool", typed("string")),
            ("name", nullable("string")),
            (
                "status",
                one_of_strings(["creating", "ready", "failed", "deleting"].map(|s| json!(s))),
            ),
            ("statusReason", nullable("string")),
            ("createdAt", time()),
        ]),
    );
    s.insert("SnapshotList".to_owned(), page_of("Snapshot"));
    s.insert(
        "StatusEvent".to_owned(),
        served(&[
            ("sandboxId", typed("string")),
            ("orgId", typed("string")),
            ("projectId", typed("string")),
            ("status", statuses()),
            ("statusReason", nullable("string")),
            ("pool", nullable("string")),
            ("statusVersion", typed("integer")),
            ("at", time()),
        ]),
    );
    s.insert(
        "Org".to_owned(),
        served(&[
            ("id", typed("string")),
            ("name", typed("string")),
            (
                "status",
                one_of_strings(["active", "suspended"].map(|s| json!(s))),
            ),
            ("createdAt", time()),
        ]),
    );
    s.insert("OrgList".to_owned(), page_of("Org"));
    s.insert(
        "CreateOrgRequest".to_owned(),
        accepted(&[("name", typed("string"))], &["name"]),
    );
    s.insert(
        "UpdateOrgRequest".to_owned(),
        accepted(
            &[
                ("name", typed("string")),
                (
                    "status",
                    one_of_strings(["active", "suspended"].map(|s| json!(s))),
                ),
            ],
            &[],
        ),
    );
    s.insert(
        "Project".to_owned(),
        served(&[
            ("id", typed("string")),
            ("orgId", typed("string")),
            ("name", typed("string")),
            ("createdAt", time()),
        ]),
    );
    s.insert("ProjectList".to_owned(), page_of("Project"));
    s.insert(
        "CreateProjectRequest".to_owned(),
        accepted(
            &[("orgId", typed("string")), ("name", typed("string"))],
            &["name"],
        ),
    );
    s.insert(
        "UpdateProjectRequest".to_owned(),
        accepted(&[("name", typed("string"))], &["name"]),
    );
    s.insert("Key".to_owned(), key);
    s.insert("CreatedKey".to_owned(), created_key);
    s.insert("KeyList".to_owned(), page_of("Key"));
    s.insert(
        "CreateKeyRequest".to_owned(),
        accepted(
            &[
                ("orgId", typed("string")),
                ("projectId", typed("string")),
                ("name", typed("string")),
                ("scopes", array_of(scopes)),
                ("expiresAt", time_or_null()),
            ],
            &["name", "scopes"],
        ),
    );
    s.insert("Quota".to_owned(), quota);
    s.insert(
        "QuotaView".to_owned(),
        served(&[
            ("quota", reference("Quota")),
            ("effective", reference("Quota")),
            (
                "usage",
                described("What the scope uses now: active, queued, CPU, memory, disk."),
            ),
        ]),
    );
    let classification = || one_of_strings(CLASSIFICATIONS.map(|c| json!(c)));
    s.insert(
        "Policy".to_owned(),
        json!({
            "type": "object",
            "additionalProperties": false,
            "description": "A placement policy at one level (global, organization, project); \
                an absent field does not restrict, except external use, which fails closed. \
                See docs/placement.md.",
            "properties": {
                "allowedClassifications": { "type": ["array", "null"], "items": classification() },
                "poolClassifications": { "type": "object",
                    "additionalProperties": array_of(classification()) },
                "allowedRegions": { "type": ["array", "null"], "items": typed("string") },
                "allowExternal": nullable("boolean"),
                "externalPools": { "type": ["array", "null"], "items": typed("string") },
                "deniedPools": array_of(typed("string")),
                "defaultStrategy": {
                    "anyOf": [one_of_strings(Strategy::ALL.map(wire)), { "type": "null" }] },
            },
        }),
    );
    s.insert(
        "Placement".to_owned(),
        described(
            "The stored explanation of a placement: the decision, the pool, \
            and every pool considered with why it was or was not eligible.",
        ),
    );
    s.insert(
        "DryRun".to_owned(),
        described(
            "`{decision: placed|waiting|rejected, pool?, code?, reason?, pools: \
            [{name, eligible, reason?, score?}]}`",
        ),
    );
    let record_fields = || {
        vec![
            ("name", typed("string")),
            ("kind", typed("string")),
            (
                "trust",
                one_of_strings([Trust::Private, Trust::External].map(wire)),
            ),
            ("region", nullable("string")),
            ("maxConcurrent", nullable("integer")),
            (
                "isolation",
                json!({ "anyOf": [
                    one_of_strings([Isolation::Container, Isolation::Microvm].map(wire)),
                    { "type": "null" }] }),
            ),
            ("costPerCpuHour", typed("number")),
            ("typicalCreateSeconds", nullable("number")),
            (
                "settings",
                json!({ "description": "Adapter settings: credential references (an \
                    environment variable, a file, a stored secret's name), never credentials." }),
            ),
            (
                "source",
                one_of_strings([PoolSource::Config, PoolSource::Api].map(wire)),
            ),
            ("createdAt", time()),
            ("updatedAt", time()),
        ]
    };
    s.insert("PoolRecord".to_owned(), served(&record_fields()));
    let mut pool = record_fields();
    pool.extend([
        ("capabilities", array_of(typed("string"))),
        ("healthy", typed("boolean")),
        (
            "health",
            json!({ "anyOf": [reference("PoolHealth"), { "type": "null" }] }),
        ),
        ("usedSlots", typed("integer")),
    ]);
    s.insert("Pool".to_owned(), served(&pool));
    s.insert(
        "PoolHealth".to_owned(),
        served(&[
            ("name", typed("string")),
            ("healthy", typed("boolean")),
            ("capabilities", array_of(typed("string"))),
            ("error", nullable("string")),
            ("checkedAt", time()),
            ("checkedBy", typed("string")),
        ]),
    );
    s.insert(
        "PoolRequest".to_owned(),
        accepted(
            &[
                ("name", nullable("string")),
                ("kind", nullable("string")),
                (
                    "trust",
                    json!({ "type": ["string", "null"], "enum": ["private", "external", null] }),
                ),
                ("region", nullable("string")),
                ("maxConcurrent", nullable("integer")),
                (
                    "isolation",
                    json!({ "type": ["string", "null"], "enum": ["container", "microvm", null] }),
                ),
                ("costPerCpuHour", nullable("number")),
                ("typicalCreateSeconds", nullable("number")),
                (
                    "settings",
                    json!({ "description": "Adapter settings (credential references only)." }),
                ),
            ],
            &[],
        ),
    );
    s.insert("PoolList".to_owned(), page_of("Pool"));
    s.insert(
        "AuditEvent".to_owned(),
        described(
            "One audit record: chain, sequence, actor, action, resource, \
            outcome, details, time, and its hash over the previous record's.",
        ),
    );
    s.insert("AuditList".to_owned(), page_of("AuditEvent"));
    s.insert(
        "Verification".to_owned(),
        described(
            "The result of verifying every audit chain: whether all \
            hold, and the first record that does not.",
        ),
    );
    s.insert(
        "Checkpoint".to_owned(),
        described("A signed checkpoint of every audit chain's head."),
    );
    s.insert(
        "AuditSegmentRequest".to_owned(),
        accepted(&[("reason", typed("string"))], &["reason"]),
    );
    s.insert(
        "AuditSegment".to_owned(),
        described("The segment checkpoint written, and verification with it in place."),
    );
    s.insert(
        "Secret".to_owned(),
        described("A stored backend secret as its name and fingerprint (never the value)."),
    );
    s.insert("SecretList".to_owned(), page_of("Secret"));
    s.insert(
        "SecretRequest".to_owned(),
        accepted(&[("value", typed("string"))], &["value"]),
    );
    s.insert(
        "TrustReport".to_owned(),
        described(
            "Per pool and per organization: where work may go, under which \
            policy, with which credentials (fingerprints), and what ran where.",
        ),
    );
    s.insert("Health".to_owned(), served(&[("status", typed("string"))]));
    s.insert("OpenApi".to_owned(), described("This document."));
    Value::Object(s)
}
