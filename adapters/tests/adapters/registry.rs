use differently_adapters::registry::{build, AdapterConfigError};

#[tokio::test]
async fn registry_builds_working_adapters() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = build(
        "devhost",
        &serde_json::json!({ "root": dir.path(), "isolation": "none" }),
    )
    .expect("devhost");
    let caps = a.capabilities();
    use differently_adapters::Capability;
    for c in [
        Capability::Exec,
        Capability::ExecStream,
        Capability::Files,
        Capability::LifecyclePause,
        Capability::Snapshots,
    ] {
        assert!(caps.contains(&c), "{c} in {caps:?}");
    }
    assert!(!caps.contains(&differently_adapters::Capability::LifecycleStop));
    a.health().await.expect("healthy");

    let a = build(
        "fake",
        &serde_json::json!({ "unavailable": true, "capabilities": [] }),
    )
    .expect("fake");
    assert!(a.capabilities().is_empty());
    assert!(a.health().await.is_err());
}

#[test]
fn registry_errors_name_kind_and_field() {
    match build("nope", &serde_json::Value::Null) {
        Err(AdapterConfigError::UnknownKind { kind, known }) => {
            assert_eq!(kind, "nope");
            assert!(
                known.contains("fake") && known.contains("daytona"),
                "{known}"
            );
        }
        other => panic!("unexpected: {:?}", other.map(|a| a.kind())),
    }
    match build("fake", &serde_json::json!({ "failCreates": -1 })) {
        Err(AdapterConfigError::InvalidSettings { kind, field, .. }) => {
            assert_eq!(kind, "fake");
            assert_eq!(field.as_deref(), Some("failCreates"));
        }
        other => panic!("unexpected: {:?}", other.map(|a| a.kind())),
    }
}
