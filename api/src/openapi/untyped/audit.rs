//! `store::audit` and `store::secrets`: records, checkpoints, verification and secrets as
//! served. Written here because the store's types derive no schemas (the store crate does not
//! depend on utoipa).

use serde_json::{json, Map, Value};

use super::{
    accepted, array_of, nullable, one_of_strings, page_of, reference, served, served_except, time,
    typed,
};

/// Adds the audit and secret schemas to `s`.
pub(super) fn add(s: &mut Map<String, Value>) {
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
}
