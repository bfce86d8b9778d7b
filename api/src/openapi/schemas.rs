//! Component schemas: the objects the API serves and accepts, from the code's own
//! vocabularies (statuses, scopes, strategies, capabilities, error codes).

use differently_core::accounting::Wall;
use differently_core::exec::MAX_EXEC_TIMEOUT_SECONDS;
use differently_core::policy::{ExternalMode, Isolation, Strategy};
use differently_core::pool::{PoolSource, Trust};
use differently_core::sandbox::{
    CLASSIFICATIONS, KNOWN_CAPABILITIES, MAX_IDLE_TIMEOUT_SECONDS, MAX_TTL_SECONDS, PROFILES,
};
use differently_core::tenancy::{Scope, MAX_QUOTA_COUNT};
use differently_core::warm;
use differently_core::{ErrorCode, Resources, SandboxStatus};
use serde_json::{json, Map, Value};

use super::wire;

pub(super) mod webhooks;

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

/// The pattern of an id with `prefix`: a ULID (26 characters of Crockford base 32, either
/// case), exactly what `Id::parse` accepts.
pub(super) fn id_pattern(prefix: &str) -> String {
    format!("^{prefix}_[0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{{26}}$")
}

/// An id with `prefix`, or null.
fn id_or_null(prefix: &str) -> Value {
    json!({ "type": ["string", "null"], "pattern": id_pattern(prefix) })
}

/// An id with `prefix`.
fn id_of(prefix: &str) -> Value {
    json!({ "type": "string", "pattern": id_pattern(prefix) })
}

/// A string of `min..=max` characters (null: absent).
fn text_or_null(min: u64, max: u64) -> Value {
    json!({ "type": ["string", "null"], "minLength": min, "maxLength": max })
}

/// An organization, project or key name (`tenancy::validate_name`): 1-100 characters, no
/// control character, not only whitespace.
fn name() -> Value {
    json!({ "type": "string", "maxLength": 100,
            "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f]*[^\\s\\u0000-\\u001f\\u007f-\\u009f][^\\u0000-\\u001f\\u007f-\\u009f]*$" })
}

/// Labels a caller sets (`sandbox::validate_labels`): keys 1-63 characters without `=`
/// and not in the reserved `differently.dev/` prefix, values at most 255.
fn labels() -> Value {
    json!({ "type": ["object", "null"],
            "propertyNames": { "minLength": 1, "maxLength": 63, "pattern": "^[^=]*$",
                               "not": { "pattern": "^differently\\.dev/" } },
            "additionalProperties": { "type": "string", "maxLength": 255 } })
}

/// Environment variables (`sandbox::validate_env_names`): names of letters, digits and `_`,
/// not starting with a digit; `nullable` where the field is optional (create), not where it
/// defaults to empty (exec).
fn env(nullable: bool) -> Value {
    let ty = if nullable {
        json!(["object", "null"])
    } else {
        json!("object")
    };
    json!({ "type": ty,
            "propertyNames": { "pattern": "^[A-Za-z_][A-Za-z0-9_]*$" },
            "additionalProperties": { "type": "string" } })
}

/// A pool name (`pool::validate_pool_name`).
const POOL_NAME: &str = "^[a-z0-9][a-z0-9-]{0,62}$";

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

/// One of `values`, or null (an optional field that null leaves unset).
fn one_of_or_null(values: impl IntoIterator<Item = Value>) -> Value {
    let mut all: Vec<Value> = values.into_iter().collect();
    all.push(Value::Null);
    json!({ "type": ["string", "null"], "enum": all })
}

fn one_of_strings(values: impl IntoIterator<Item = Value>) -> Value {
    json!({ "type": "string", "enum": values.into_iter().collect::<Vec<_>>() })
}

/// A pool's backend as its adapter knows it (`api::routes::pools::Backend`), served by the
/// pools admin and the trust report.
fn backend_fields() -> Vec<(&'static str, Value)> {
    use differently_adapters::VerifiedStatus as V;
    vec![
        (
            "backendVersion",
            json!({ "type": ["string", "null"], "description": "The backend version this \
                API process's adapter last detected; null before its first call or when the \
                backend does not say." }),
        ),
        (
            "verified",
            one_of_strings([V::Live, V::Replayed, V::FakeOnly, V::Unknown].map(wire)),
        ),
        ("verifiedBasis", typed("string")),
    ]
}

/// An object whose listed properties are all present (as the API serves them).
fn served(props: &[(&str, Value)]) -> Value {
    object(props, true)
}

/// An object the API serves whose properties are all present except `optional` (left out
/// when empty or not applicable).
fn served_except(props: &[(&str, Value)], optional: &[&str]) -> Value {
    let mut o = object(props, false);
    o["required"] = json!(props
        .iter()
        .map(|(n, _)| *n)
        .filter(|n| !optional.contains(n))
        .collect::<Vec<_>>());
    o
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
    // The bounds of `Quota::validate`.
    let sandbox_limit = accepted(
        &[
            (
                "cpu",
                json!({ "type": "integer", "minimum": 1, "maximum": Resources::MAX_CPU }),
            ),
            (
                "memoryMiB",
                json!({ "type": "integer", "minimum": Resources::MIN_MEMORY_MIB,
                        "maximum": Resources::MAX_MEMORY_MIB }),
            ),
            (
                "diskGiB",
                json!({ "type": "integer", "minimum": 0, "maximum": Resources::MAX_DISK_GIB }),
            ),
        ],
        &["cpu", "memoryMiB", "diskGiB"],
    );
    let quota = accepted(
        &[
            ("maxActive", bounded(0, MAX_QUOTA_COUNT)),
            ("maxCpu", bounded(0, MAX_QUOTA_COUNT)),
            ("maxMemoryMiB", bounded(0, 1 << 30)),
            ("maxDiskGiB", bounded(0, 1 << 30)),
            ("maxQueued", bounded(0, MAX_QUOTA_COUNT)),
            ("maxQueueSeconds", bounded(1, 30 * 24 * 3600)),
            (
                "maxSandbox",
                json!({ "anyOf": [sandbox_limit, { "type": "null" }] }),
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
                ("projectId", id_or_null("prj")),
                ("template", text_or_null(1, 512)),
                (
                    "resources",
                    json!({ "anyOf": [accepted(&[
                ("cpu", bounded(1, u64::from(Resources::MAX_CPU))),
                ("memoryMiB", bounded(Resources::MIN_MEMORY_MIB, Resources::MAX_MEMORY_MIB)),
                ("diskGiB", bounded(0, Resources::MAX_DISK_GIB)),
            ], &[]), { "type": "null" }] }),
                ),
                ("profile", one_of_or_null(PROFILES.map(|p| json!(p)))),
                ("env", env(true)),
                ("labels", labels()),
                ("ttlSeconds", bounded(1, MAX_TTL_SECONDS)),
                ("idleTimeoutSeconds", bounded(1, MAX_IDLE_TIMEOUT_SECONDS)),
                (
                    "capabilities",
                    json!({ "type": ["array", "null"],
                        "items": one_of_strings(KNOWN_CAPABILITIES.map(|c| json!(c))) }),
                ),
                (
                    "classification",
                    one_of_or_null(CLASSIFICATIONS.map(|c| json!(c))),
                ),
                ("region", text_or_null(1, 63)),
                ("strategy", one_of_or_null(Strategy::ALL.map(wire))),
                ("external", one_of_or_null(ExternalMode::ALL.map(wire))),
                (
                    "priority",
                    json!({ "type": ["integer", "null"], "minimum": -100, "maximum": 100 }),
                ),
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
                ("labels", labels()),
                ("idleTimeoutSeconds", bounded(1, MAX_IDLE_TIMEOUT_SECONDS)),
            ],
            &[],
        ),
    );
    let mut exec = accepted(
        &[
            (
                "command",
                // The program (the first item) is never empty.
                json!({ "type": "array", "minItems": 1,
                        "prefixItems": [{ "type": "string", "minLength": 1 }],
                        "items": { "type": "string" } }),
            ),
            ("env", env(false)),
            (
                "cwd",
                json!({ "type": ["string", "null"], "pattern": "^/",
                        "description": "An absolute path." }),
            ),
            ("stdin", nullable("string")),
            (
                "stdinBase64",
                json!({ "type": ["string", "null"], "contentEncoding": "base64",
                        // Canonical padded base64, as the decoder wants it: the bits a
                        // short last group drops are zero.
                        "pattern": "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)?$" }),
            ),
            ("timeoutSeconds", bounded(1, MAX_EXEC_TIMEOUT_SECONDS)),
            (
                "outputEncoding",
                json!({ "type": ["string", "null"], "enum": ["utf8", "base64", null] }),
            ),
        ],
        &["command"],
    );
    // `stdin` and `stdinBase64` exclude each other (a null is as good as absent).
    exec["not"] = json!({ "required": ["stdin", "stdinBase64"],
        "properties": { "stdin": typed("string"), "stdinBase64": typed("string") } });
    s.insert("ExecRequest".to_owned(), exec);
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
                (
                    "port",
                    json!({ "type": "integer", "minimum": 1, "maximum": u16::MAX }),
                ),
                (
                    "expiresSeconds",
                    bounded(1, crate::routes::ports::MAX_PORT_SECONDS),
                ),
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
        accepted(&[("name", text_or_null(1, 255))], &[]),
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
    // The public event contract, from the definitions the events are built from.
    s.insert(
        "PublicEvent".to_owned(),
        differently_bus_schema::public::envelope_schema(),
    );
    s.insert(
        "EventCredentialsRequest".to_owned(),
        json!({ "type": "object", "additionalProperties": false, "properties": {
            "ttlSeconds": bounded(60, 86_400),
            "projectId": id_or_null("prj"),
        } }),
    );
    s.insert(
        "EventCredentials".to_owned(),
        served(&[
            ("id", typed("string")),
            ("token", typed("string")),
            ("expiresAt", time()),
            ("orgId", id_of("org")),
            ("projectId", id_or_null("prj")),
            ("subscribe", typed("string")),
            ("inboxPrefix", typed("string")),
            ("stream", typed("string")),
            ("consumerCreate", typed("string")),
        ]),
    );
    s.insert(
        "EventSchema".to_owned(),
        described("A JSON Schema (draft 2020-12) of one public event type."),
    );
    s.insert(
        "EventSchemaList".to_owned(),
        served(&[
            ("version", typed("integer")),
            ("envelope", reference("EventSchema")),
            (
                "items",
                json!({ "type": "array", "items": served(&[
                    ("type", typed("string")),
                    ("schema", reference("EventSchema")),
                ]) }),
            ),
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
        accepted(&[("name", name())], &["name"]),
    );
    s.insert(
        "UpdateOrgRequest".to_owned(),
        accepted(
            &[
                ("name", name()),
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
        accepted(&[("orgId", id_of("org")), ("name", name())], &["name"]),
    );
    s.insert(
        "UpdateProjectRequest".to_owned(),
        accepted(&[("name", name())], &["name"]),
    );
    s.insert("Key".to_owned(), key);
    s.insert("CreatedKey".to_owned(), created_key);
    s.insert("KeyList".to_owned(), page_of("Key"));
    s.insert(
        "CreateKeyRequest".to_owned(),
        accepted(
            &[
                ("orgId", id_of("org")),
                ("projectId", id_of("prj")),
                ("name", name()),
                (
                    "scopes",
                    json!({ "type": "array", "items": scopes, "minItems": 1 }),
                ),
                (
                    "expiresAt",
                    json!({ "type": ["string", "null"], "format": "date-time",
                            "description": "In the future." }),
                ),
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
                    "propertyNames": { "pattern": POOL_NAME },
                    "additionalProperties": array_of(classification()) },
                "allowedRegions": { "type": ["array", "null"],
                    "items": { "type": "string", "minLength": 1, "maxLength": 63 } },
                "allowExternal": nullable("boolean"),
                "externalPools": { "type": ["array", "null"],
                    "items": { "type": "string", "pattern": POOL_NAME } },
                "deniedPools": array_of(json!({ "type": "string", "pattern": POOL_NAME })),
                "defaultStrategy": {
                    "anyOf": [one_of_strings(Strategy::ALL.map(wire)), { "type": "null" }] },
            },
        }),
    );
    // `core::policy::explain`: the decision flattened with every pool's verdict.
    let decision_fields = || {
        vec![
            (
                "decision",
                one_of_strings(["placed", "waiting", "rejected"].map(|d| json!(d))),
            ),
            ("pool", typed("string")),
            (
                "code",
                one_of_strings(ErrorCode::ALL.map(|c| json!(c.as_str()))),
            ),
            ("reason", typed("string")),
            ("pools", array_of(reference("PoolVerdict"))),
        ]
    };
    s.insert(
        "PoolVerdict".to_owned(),
        served_except(
            &[
                ("name", typed("string")),
                ("eligible", typed("boolean")),
                ("reason", typed("string")),
                (
                    "score",
                    json!({ "type": "number", "minimum": 0, "maximum": 100 }),
                ),
            ],
            &["reason", "score"],
        ),
    );
    s.insert(
        "DryRun".to_owned(),
        served_except(&decision_fields(), &["pool", "code", "reason"]),
    );
    let mut placement = decision_fields();
    placement.extend([
        ("policy", reference("EffectivePolicy")),
        ("decidedAt", time()),
        // A waiting explanation names the limit it waits behind (`scheduler::placement`).
        ("wall", one_of_strings(Wall::ALL.map(|w| json!(w.as_str())))),
    ]);
    s.insert(
        "Placement".to_owned(),
        served_except(&placement, &["pool", "code", "reason", "wall"]),
    );
    s.insert(
        "EffectivePolicy".to_owned(),
        served(&[
            (
                "allowedClassifications",
                json!({ "type": ["array", "null"], "items": typed("string") }),
            ),
            (
                "poolClassifications",
                json!({ "type": "object",
                "additionalProperties": array_of(typed("string")) }),
            ),
            (
                "allowedRegions",
                json!({ "type": ["array", "null"], "items": typed("string") }),
            ),
            (
                "externalForbiddenBy",
                one_of_or_null(["global", "org", "project"].map(|l| json!(l))),
            ),
            ("externalPools", array_of(typed("string"))),
            ("deniedPools", array_of(typed("string"))),
            ("defaultStrategy", one_of_strings(Strategy::ALL.map(wire))),
        ]),
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
                    // A devhost pool serves what its commands run under.
                    { "type": "string", "enum": ["bwrap", "none"] },
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
    pool.extend([("capabilities", array_of(typed("string")))]);
    pool.extend(backend_fields());
    pool.extend([
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
    warm_schemas(&mut s);
    // `store::audit`: records, checkpoints and verification as served.
    let hash = || json!({ "type": "string", "pattern": "^[0-9a-f]{64}$" });
    s.insert(
        "AuditEvent".to_owned(),
        served_except(
            &[
                ("seq", typed("integer")),
                ("chain", typed("string")),
                ("chainSeq", json!({ "type": "integer", "minimum": 1 })),
                ("orgId", nullable("string")),
                ("projectId", nullable("string")),
                ("actor", typed("string")),
                ("action", typed("string")),
                ("resource", typed("string")),
                ("outcome", typed("string")),
                ("requestId", nullable("string")),
                ("at", time()),
                (
                    "detail",
                    json!({ "description": "What else matters; never a secret, \
                    exec arguments or environment values." }),
                ),
                ("prevHash", hash()),
                ("hash", hash()),
                ("keyId", typed("string")),
            ],
            &["keyId"],
        ),
    );
    s.insert("AuditList".to_owned(), page_of("AuditEvent"));
    let problem = served(&[
        (
            "kind",
            one_of_strings(
                [
                    "hash_mismatch",
                    "broken_link",
                    "missing",
                    "duplicate",
                    "checkpoint_mismatch",
                    "truncated",
                    "bad_checkpoint",
                    "unknown_key",
                ]
                .map(|k| json!(k)),
            ),
        ),
        ("chain", typed("string")),
        ("chainSeq", typed("integer")),
        ("seq", nullable("integer")),
        ("message", typed("string")),
    ]);
    s.insert("AuditProblem".to_owned(), problem);
    let count = || json!({ "type": "integer", "minimum": 0 });
    s.insert(
        "Verification".to_owned(),
        served(&[
            ("ok", typed("boolean")),
            ("chains", count()),
            ("records", count()),
            ("checkpoints", count()),
            ("unchainedRecords", count()),
            (
                "firstBad",
                json!({ "anyOf": [reference("AuditProblem"), { "type": "null" }] }),
            ),
            ("problems", array_of(reference("AuditProblem"))),
            ("unverifiableRecords", count()),
            ("unverifiableCheckpoints", count()),
            ("unknownKeyIds", array_of(typed("string"))),
            (
                "segments",
                array_of(served(&[
                    ("seq", typed("integer")),
                    ("at", time()),
                    ("keyId", nullable("string")),
                    ("reason", typed("string")),
                    ("lostKeyIds", array_of(typed("string"))),
                ])),
            ),
        ]),
    );
    s.insert(
        "Checkpoint".to_owned(),
        served_except(
            &[
                ("seq", json!({ "type": "integer", "minimum": 1 })),
                ("at", time()),
                (
                    "heads",
                    array_of(served(&[
                        ("chain", typed("string")),
                        ("chainSeq", typed("integer")),
                        ("hash", hash()),
                    ])),
                ),
                ("prevHash", hash()),
                ("hash", hash()),
                ("keyId", typed("string")),
                (
                    "segment",
                    served(&[
                        ("reason", typed("string")),
                        ("lostKeyIds", array_of(typed("string"))),
                    ]),
                ),
            ],
            &["keyId", "segment"],
        ),
    );
    s.insert(
        "AuditSegmentRequest".to_owned(),
        // `routes::audit::segment`: trimmed, 1-500 characters.
        accepted(
            &[(
                "reason",
                json!({ "type": "string", "minLength": 1, "maxLength": 500, "pattern": "\\S" }),
            )],
            &["reason"],
        ),
    );
    s.insert(
        "AuditSegment".to_owned(),
        served(&[
            ("checkpoint", reference("Checkpoint")),
            ("report", reference("Verification")),
        ]),
    );
    s.insert(
        "Secret".to_owned(),
        served(&[
            ("name", typed("string")),
            (
                "fingerprint",
                json!({ "type": "string", "pattern": "^sha256:[0-9a-f]{16}$" }),
            ),
            ("updatedBy", typed("string")),
            ("updatedAt", time()),
            ("createdAt", time()),
        ]),
    );
    s.insert("SecretList".to_owned(), page_of("Secret"));
    s.insert(
        "SecretRequest".to_owned(),
        accepted(
            &[("value", json!({ "type": "string", "minLength": 1 }))],
            &["value"],
        ),
    );
    // `api::routes::trust`.
    let credential = served(&[
        (
            "kind",
            one_of_strings(["env", "file", "secret", "inline"].map(|k| json!(k))),
        ),
        ("setting", typed("string")),
        ("reference", typed("string")),
        ("name", nullable("string")),
        ("fingerprint", nullable("string")),
        ("updatedBy", nullable("string")),
        ("updatedAt", time_or_null()),
        ("problem", nullable("string")),
    ]);
    let mut trust_pool = vec![
        ("name", typed("string")),
        ("kind", typed("string")),
        (
            "trust",
            one_of_strings([Trust::Private, Trust::External].map(wire)),
        ),
        ("region", nullable("string")),
        ("isolation", typed("string")),
        ("egress", typed("string")),
        ("endpoint", nullable("string")),
        ("credentials", array_of(credential)),
        (
            "source",
            one_of_strings([PoolSource::Config, PoolSource::Api].map(wire)),
        ),
        ("healthy", typed("boolean")),
        (
            "health",
            json!({ "anyOf": [reference("PoolHealth"), { "type": "null" }] }),
        ),
        ("warm", array_of(reference("WarmClassStatus"))),
    ];
    trust_pool.extend(backend_fields());
    let trust_pool = served(&trust_pool);
    let external = served(&[
        ("orgId", typed("string")),
        ("orgName", nullable("string")),
        ("pool", typed("string")),
        ("sandboxes", count()),
        ("firstAt", time()),
        ("lastAt", time()),
        (
            "policy",
            json!({ "anyOf": [reference("EffectivePolicy"), { "type": "null" }] }),
        ),
    ]);
    s.insert(
        "TrustReport".to_owned(),
        served(&[
            ("generatedAt", time()),
            ("installationId", typed("string")),
            ("telemetry", typed("string")),
            ("pools", array_of(trust_pool)),
            ("externalPlacements", array_of(external)),
            ("notEnforced", array_of(typed("string"))),
        ]),
    );
    // `api::routes::queue`.
    let counts = || json!({ "type": "object", "additionalProperties": { "type": "number" } });
    let org_queue = served(&[
        ("orgId", typed("string")),
        ("orgName", nullable("string")),
        ("depth", typed("integer")),
        ("oldestQueuedAt", time()),
        ("oldestSandboxId", id_of("sbx")),
        (
            "walls",
            json!({ "type": "object",
                    "propertyNames": { "enum": ["org", "project", "pool", "unknown"] },
                    "additionalProperties": { "type": "integer" } }),
        ),
        (
            "reasons",
            array_of(served(&[
                ("reason", typed("string")),
                ("count", typed("integer")),
            ])),
        ),
    ]);
    s.insert(
        "QueueReport".to_owned(),
        served(&[
            ("generatedAt", time()),
            ("total", typed("integer")),
            ("truncated", typed("boolean")),
            ("orgs", array_of(org_queue)),
        ]),
    );
    s.insert(
        "MetricsSummary".to_owned(),
        served(&[
            ("generatedAt", time()),
            ("enabled", typed("boolean")),
            ("admissions", counts()),
            ("activations", counts()),
            ("queueDepth", counts()),
        ]),
    );
    webhooks::add(&mut s);
    s.insert("Health".to_owned(), served(&[("status", typed("string"))]));
    s.insert("OpenApi".to_owned(), described("This document."));
    // Every string a request carries is refused with a NUL (`crate::nul`), except exec's
    // `stdin`, which is the caller's data.
    for (name, schema) in s.iter_mut() {
        if name.ends_with("Request") || name == "Policy" || name == "Quota" {
            forbid_nul(schema, name == "ExecRequest");
        }
    }
    Value::Object(s)
}

/// The pattern of a string without a NUL.
pub(super) const NO_NUL: &str = "^[^\\u0000]*$";

/// Adds [`NO_NUL`] to every string in `schema` (values, object keys, items); with
/// `keep_stdin`, not to a top-level `stdin`.
pub(super) fn forbid_nul(schema: &mut Value, keep_stdin: bool) {
    let Some(o) = schema.as_object_mut() else {
        return;
    };
    let is_string = match o.get("type") {
        Some(Value::String(t)) => t == "string",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "string"),
        _ => false,
    };
    if is_string {
        if o.contains_key("pattern") {
            o.insert("allOf".to_owned(), json!([{ "pattern": NO_NUL }]));
        } else {
            o.insert("pattern".to_owned(), json!(NO_NUL));
        }
    }
    if let Some(names) = o.get_mut("propertyNames") {
        if let Some(n) = names.as_object_mut() {
            if n.contains_key("pattern") {
                n.insert("allOf".to_owned(), json!([{ "pattern": NO_NUL }]));
            } else {
                n.insert("pattern".to_owned(), json!(NO_NUL));
            }
        }
    }
    if let Some(Value::Object(props)) = o.get_mut("properties") {
        for (k, v) in props.iter_mut() {
            if !(keep_stdin && k == "stdin") {
                forbid_nul(v, false);
            }
        }
    }
    for key in ["additionalProperties", "items"] {
        if let Some(v) = o.get_mut(key) {
            forbid_nul(v, false);
        }
    }
    for key in ["anyOf", "prefixItems"] {
        if let Some(Value::Array(vs)) = o.get_mut(key) {
            vs.iter_mut().for_each(|v| forbid_nul(v, false));
        }
    }
}

/// `core::warm`: a pool's warm classes as put, and as served with their instance counts.
fn warm_schemas(s: &mut Map<String, Value>) {
    // A class fixes its instances' resources whole (no field is filled from a default).
    let resources = accepted(
        &[
            (
                "cpu",
                json!({ "type": "integer", "minimum": 1, "maximum": Resources::MAX_CPU }),
            ),
            (
                "memoryMiB",
                json!({ "type": "integer", "minimum": Resources::MIN_MEMORY_MIB,
                        "maximum": Resources::MAX_MEMORY_MIB }),
            ),
            (
                "diskGiB",
                json!({ "type": "integer", "minimum": 0, "maximum": Resources::MAX_DISK_GIB }),
            ),
        ],
        &["cpu", "memoryMiB", "diskGiB"],
    );
    let fields = || {
        vec![
            (
                "name",
                json!({ "type": "string", "pattern": POOL_NAME,
                        "description": "Unique within the pool." }),
            ),
            (
                "size",
                json!({ "type": "integer", "minimum": 0, "maximum": warm::MAX_SIZE,
                        "description": "Instances kept creating or ready." }),
            ),
            (
                "maxSize",
                json!({ "type": ["integer", "null"], "minimum": 0, "maximum": warm::MAX_SIZE,
                        "description": "Ready instances above which the surplus is retired \
                            (at least `size`; absent: `size`)." }),
            ),
            (
                "refillPerSecond",
                json!({ "type": "number", "exclusiveMinimum": 0,
                        "maximum": warm::MAX_REFILL_PER_SECOND,
                        "description": "Creates started per second at most while refilling." }),
            ),
            (
                "maxAgeSeconds",
                json!({ "type": "integer", "minimum": warm::MIN_MAX_AGE_SECONDS,
                        "maximum": warm::MAX_MAX_AGE_SECONDS,
                        "description": "A ready instance older than this is replaced \
                            (default 3600)." }),
            ),
            (
                "template",
                json!({ "type": ["string", "null"], "minLength": 1, "maxLength": 512,
                        "description": "The instances' template; absent: the pool's default \
                            (what a create naming no template gets). A create matches the \
                            class when its template and resources are the class's." }),
            ),
            (
                "resources",
                json!({ "anyOf": [resources, { "type": "null" }],
                        "description": "The instances' resources; absent: what a create asking \
                            for none gets." }),
            ),
        ]
    };
    s.insert(
        "WarmClass".to_owned(),
        accepted(&fields(), &["name", "size", "refillPerSecond"]),
    );
    s.insert(
        "WarmClassesRequest".to_owned(),
        accepted(
            &[(
                "classes",
                json!({ "type": "array", "maxItems": warm::MAX_CLASSES,
                        "items": reference("WarmClass"),
                        "description": "Every class of the pool, in matching order (the first \
                            class a create matches is the one it claims from); `[]` removes \
                            them all." }),
            )],
            &["classes"],
        ),
    );
    let mut status = fields();
    status.extend([
        (
            "ready",
            json!({ "type": "integer", "minimum": 0,
                    "description": "Instances ready to be claimed." }),
        ),
        (
            "creating",
            json!({ "type": "integer", "minimum": 0,
                    "description": "Instances being created." }),
        ),
        (
            "claimsPerMinute",
            json!({ "type": "number", "minimum": 0,
                    "description": "Instances claimed per minute over the last 10 minutes, \
                        counted by every API process." }),
        ),
        (
            "hitRatio",
            json!({ "type": ["number", "null"], "minimum": 0, "maximum": 1,
                    "description": "Of the creates that matched the class over the last 10 \
                        minutes, the share answered from a ready instance; null when none \
                        matched." }),
        ),
    ]);
    // Served as stored: the fields a class left out stay out (`maxAgeSeconds` is filled).
    s.insert(
        "WarmClassStatus".to_owned(),
        served_except(&status, &["maxSize", "template", "resources"]),
    );
    s.insert(
        "WarmClasses".to_owned(),
        served(&[("classes", array_of(reference("WarmClassStatus")))]),
    );
}
