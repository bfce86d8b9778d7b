use super::programs::Plan;
use super::*;

#[test]
fn config_defaults_and_rejects_unknown_fields() {
    let c: FakeConfig = serde_json::from_str("{}").expect("empty config");
    assert_eq!(c, FakeConfig::default());
    assert_eq!(c.capabilities, vec!["exec".to_owned()]);
    let c: FakeConfig =
        serde_json::from_str(r#"{"latencyMs": 5, "failCreates": 2}"#).expect("config");
    assert_eq!((c.latency_ms, c.fail_creates), (5, 2));
    assert!(serde_json::from_str::<FakeConfig>(r#"{"latency": 5}"#).is_err());
}

#[test]
fn torn_and_bad_lines_are_skipped() {
    let sbx = SandboxId::new();
    let mut e = entry(LedgerOp::Create, Some(sbx.clone()), LedgerOutcome::Created);
    e.backend_ref = Some("r".into());
    let mut bytes = serde_json::to_vec(&e).expect("serialize");
    bytes.push(b'\n');
    bytes.extend_from_slice(b"{\"at\":");
    let (entries, consumed) = parse_lines(&bytes);
    assert_eq!(entries.len(), 1);
    assert_eq!(created_count(&entries, &sbx), 1);
    assert_eq!(live_instances(&entries)[0].backend_ref, "r");
    assert!(consumed < bytes.len());
    assert!(parse_lines(b"garbage\n").0.is_empty());
}

#[test]
fn exec_semantics() {
    let req = |v: &[&str]| ExecRequest {
        command: v.iter().map(|s| s.to_string()).collect(),
        ..ExecRequest::default()
    };
    let out = |p: &Plan| match p.output.first() {
        Some(Output::Stdout(b)) | Some(Output::Stderr(b)) => {
            String::from_utf8_lossy(b).into_owned()
        }
        _ => String::new(),
    };
    assert_eq!(out(&plan(&req(&["echo", "a", "b"]), vec![])), "a b\n");
    assert_eq!(plan(&req(&["false"]), vec![]).exit_code, 1);
    assert_eq!(plan(&req(&["fake-exit", "7"]), vec![]).exit_code, 7);
    assert_eq!(out(&plan(&req(&["cat"]), b"in".to_vec())), "in");
    let p = plan(&req(&["sh", "-c", "echo x"]), vec![]);
    assert_eq!(p.exit_code, 127);
    assert_eq!(
        p.output,
        vec![Output::Stderr(b"fake: command not found: sh\n".to_vec())]
    );
    assert_eq!(
        plan(&req(&["fake-output", "10", "stderr"]), vec![]).output,
        vec![Output::Generate {
            n: 10,
            stderr: true
        }]
    );
    assert_eq!(&yes_bytes(0, 5)[..], b"y\ny\ny");
    assert_eq!(&yes_bytes(1, 2)[..], b"\ny");
    assert_eq!(
        plan(&req(&["sleep", "0.5"]), vec![]).sleep,
        Some(Duration::from_millis(500))
    );
}
