//! What is Azure dynamic sessions' own: sessions addressed only by an identifier that is
//! allocated by any call, ended by cooldown; a full pool answering 404; bash as the exec
//! model; files through the data directory; Entra tokens and throttling.

use std::time::Duration;

use bytes::Bytes;
use differently_adapters::registry;
use differently_adapters::{Adapter, AdapterError, ByteStream, InstanceRef, PathProblem};
use differently_core::exec::ExecRequest;
use differently_core::ids::InstallationId;
use differently_core::pool::{Trust, TrustRule};
use futures::StreamExt;

use crate::support::cases::{
    body, build_err, collect, exec_sees_env_and_cwd,
    exec_timeout_is_124_and_a_missing_cwd_names_the_field, field_of, files_round_trip,
};
use crate::{at, cmd, create_req, running, setup, TOKEN};

#[tokio::test]
async fn every_call_names_the_version_and_the_session_and_carries_the_token() {
    let s = setup(serde_json::json!({})).await;
    let installation = InstallationId::new();
    let req = create_req(&installation);
    let inst = s.adapter.create(&req).await.unwrap();
    let id = &inst.backend_ref;
    // The identifier carries both ids: it is all Azure keeps of a session.
    assert!(id.starts_with("dly-"), "{id}");
    assert!(
        id.ends_with(req.sandbox_id.as_str().trim_start_matches("sbx_")),
        "{id}"
    );
    assert!(
        id.contains(installation.as_str().trim_start_matches("inst_")),
        "{id}"
    );
    s.adapter.exec(&at(&inst), &cmd(&["true"])).await.unwrap();
    let record = s.fake.record();
    assert_eq!(record.unauthorized, 0);
    assert!(!record.requests.is_empty());
    for r in &record.requests {
        assert!(r.contains("api-version=2025-10-02-preview"), "{r}");
        if !r.contains("/listSessions") {
            assert!(r.contains(&format!("identifier={id}")), "{r}");
        }
    }
    // Shell executions only: never Python `code`; the sandbox env travels as stdin.
    let create_body = &record.executions[0];
    assert!(create_body.get("code").is_none(), "{create_body}");
    assert_eq!(create_body["executionType"], "Synchronous");
    assert_eq!(create_body["stdin"], "export SANDBOX_VAR='from-create'\n");
    assert!(create_body["shellCommand"].is_string());
}

#[tokio::test]
async fn exec_spells_argv_env_cwd_and_stdin_as_given() {
    let s = setup(serde_json::json!({})).await;
    let r = running(&s).await;
    exec_sees_env_and_cwd(&s.adapter, &r, 3).await;
    exec_timeout_is_124_and_a_missing_cwd_names_the_field(&s.adapter, &r).await;
    // Quotes, spaces and `$` reach the program as they were given, one argument each.
    let odd = ["it's", "a b", "$HOME", "`id`", "\\n", ""];
    let mut argv = vec!["printf", "[%s]"];
    argv.extend(odd);
    let res = s.adapter.exec(&r, &cmd(&argv)).await.unwrap();
    assert_eq!(res.stdout, "[it's][a b][$HOME][`id`][\\n][]");
    let mut req = cmd(&["cat"]);
    req.stdin = Some("line one\nline 'two'".into());
    assert_eq!(
        s.adapter.exec(&r, &req).await.unwrap().stdout,
        "line one\nline 'two'"
    );
    // Azure's stdin is a JSON string: bytes that are not UTF-8 cannot go.
    let req = ExecRequest {
        stdin_base64: Some("/w==".into()),
        ..cmd(&["cat"])
    };
    let e = s.adapter.exec(&r, &req).await.unwrap_err();
    assert_eq!(field_of(&e), Some("stdinBase64"), "{e:?}");
    // Past the pool's longest execution: refused, naming the field.
    let mut req = cmd(&["true"]);
    req.timeout_seconds = Some(600);
    let e = s.adapter.exec(&r, &req).await.unwrap_err();
    assert_eq!(field_of(&e), Some("timeoutSeconds"), "{e:?}");
}

#[tokio::test]
async fn output_cut_by_azure_is_flagged_truncated() {
    let s = setup(serde_json::json!({"outputMaxLength": 4096})).await;
    let r = running(&s).await;
    let res = s
        .adapter
        .exec(
            &r,
            &cmd(&["sh", "-c", "head -c 5000 /dev/zero | tr '\\0' a"]),
        )
        .await
        .unwrap();
    assert_eq!(res.stdout.len(), 4096);
    assert!(res.stdout_truncated && !res.stderr_truncated, "{res:?}");
    assert_eq!(
        s.fake.record().executions.last().unwrap()["outputStreamsMaxLength"],
        4096
    );
}

#[tokio::test]
async fn a_session_gone_by_cooldown_is_not_found_and_never_allocated_again() {
    let s = setup(serde_json::json!({})).await;
    let inst = s
        .adapter
        .create(&create_req(&InstallationId::new()))
        .await
        .unwrap();
    let r = at(&inst);
    s.fake.age(&inst.backend_ref);
    assert_eq!(
        s.adapter.exec(&r, &cmd(&["true"])).await.unwrap_err(),
        AdapterError::NotFound
    );
    assert_eq!(
        s.adapter.download(&r, "/etc/hostname", None).await.err(),
        Some(AdapterError::NotFound)
    );
    // A call with the identifier would have allocated a new, empty session: none was made.
    assert!(s.fake.sessions().is_empty(), "{:?}", s.fake.sessions());
    assert_eq!(s.adapter.find(&inst.sandbox_id).await.unwrap(), None);
    s.adapter.delete(&inst.sandbox_id).await.unwrap();
}

#[tokio::test]
async fn list_and_find_read_the_identifiers_and_skip_strangers() {
    let s = setup(serde_json::json!({})).await;
    s.fake.knobs().page_size = 2;
    let (mine, theirs) = (InstallationId::new(), InstallationId::new());
    let mut made = Vec::new();
    for _ in 0..3 {
        made.push(s.adapter.create(&create_req(&mine)).await.unwrap());
    }
    let other = s.adapter.create(&create_req(&theirs)).await.unwrap();
    s.fake.allocate("a-session-of-another-application");
    s.fake.allocate("dly-not-ours-either");
    let listed = s.adapter.list(&mine).await.unwrap();
    let mut got: Vec<_> = listed.iter().map(|i| i.backend_ref.clone()).collect();
    let mut want: Vec<_> = made.iter().map(|i| i.backend_ref.clone()).collect();
    got.sort();
    want.sort();
    assert_eq!(got, want, "three pages of two, strangers skipped");
    assert_eq!(
        s.adapter.find(&other.sandbox_id).await.unwrap(),
        Some(other.clone())
    );
    s.adapter.delete(&other.sandbox_id).await.unwrap();
    assert!(s.adapter.list(&theirs).await.unwrap().is_empty());
    assert_eq!(s.fake.sessions().len(), 5);
    let pages = s
        .fake
        .record()
        .requests
        .iter()
        .filter(|r| r.contains("/listSessions") && r.contains("skip=4"))
        .count();
    assert!(pages > 0, "the last page was asked with skip");
}

#[tokio::test]
async fn a_full_pool_refuses_new_sessions_as_capacity_but_keeps_its_own() {
    let s = setup(serde_json::json!({})).await;
    s.fake.knobs().max_sessions = 1;
    let req = create_req(&InstallationId::new());
    let first = s.adapter.create(&req).await.unwrap();
    let e = s
        .adapter
        .create(&create_req(&InstallationId::new()))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, AdapterError::Capacity(m) if m.contains("maxConcurrentSessions")),
        "{e:?}"
    );
    // A redelivered create of the session that exists is not refused.
    assert_eq!(
        s.adapter.create(&req).await.unwrap().backend_ref,
        first.backend_ref
    );
}

#[tokio::test]
async fn throttling_keeps_its_wait_and_a_refused_token_is_read_again() {
    let s = setup(serde_json::json!({})).await;
    let r = running(&s).await;
    s.fake
        .knobs()
        .fail_next
        .push_back(("/session".into(), 429, Some(7)));
    let e = s.adapter.exec(&r, &cmd(&["true"])).await.unwrap_err();
    assert!(e.is_retryable(), "{e:?}");
    assert_eq!(e.retry_after(), Some(Duration::from_secs(7)));

    let fresh = "eyJ0eXAiOiJKV1QifQ.eyJuZXciOnRydWV9.bmV3";
    s.fake.set_token(fresh);
    let e = s.adapter.exec(&r, &cmd(&["true"])).await.unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, AdapterError::Permanent(_)), "{e:?}");
    assert!(
        text.contains("tokenFile") && !text.contains(TOKEN),
        "{text}"
    );
    std::fs::write(s.key.path(), format!("{fresh}\n")).unwrap();
    assert_eq!(
        s.adapter.exec(&r, &cmd(&["true"])).await.unwrap().exit_code,
        0
    );
}

/// Files in the data directory (the fake's `/mnt/data`), not counting `keep`.
fn staged(s: &crate::Setup) -> Vec<String> {
    std::fs::read_dir(s.fake.data_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

#[tokio::test]
async fn files_travel_staged_through_the_data_directory() {
    let s = setup(serde_json::json!({})).await;
    let r = running(&s).await;
    let dir = tempfile::tempdir().unwrap();
    files_round_trip(&s.adapter, &r, &dir.path().display().to_string()).await;
    assert!(
        staged(&s).is_empty(),
        "staged copies removed: {:?}",
        staged(&s)
    );
    {
        let record = s.fake.record();
        let sent = |method: &str, what: &str| {
            record
                .requests
                .iter()
                .any(|q| q.starts_with(method) && q.contains(what))
        };
        assert!(sent("POST ", "/files?"), "a multipart upload");
        assert!(sent("GET ", "/content?"), "a content download");
    }

    // Onto a directory: the caller's mistake, named.
    let e = s
        .adapter
        .upload(&r, &dir.path().display().to_string(), None, body(&[b"x"]))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, AdapterError::BadPath(p) if p.problem == PathProblem::IsADirectory),
        "{e:?}"
    );
    let e = s
        .adapter
        .download(&r, &dir.path().display().to_string(), None)
        .await
        .err();
    assert!(
        matches!(&e, Some(AdapterError::BadPath(p)) if p.problem == PathProblem::IsADirectory),
        "{e:?}"
    );
    // Past the files API's upload limit: refused by Azure (413), nothing placed.
    s.fake.knobs().upload_limit = 10;
    let path = format!("{}/big.bin", dir.path().display());
    let big: ByteStream = futures::stream::iter(vec![Ok(Bytes::from(vec![7u8; 100]))]).boxed();
    let e = s.adapter.upload(&r, &path, None, big).await.unwrap_err();
    assert!(
        matches!(&e, AdapterError::Permanent(m) if m.contains("413")),
        "{e:?}"
    );
    assert!(!std::path::Path::new(&path).exists());
    // A file with a newline and quotes in its name lists and reads back.
    s.fake.knobs().upload_limit = 1 << 20;
    let odd = format!("{}/it's a\nfile", dir.path().display());
    s.adapter
        .upload(&r, &odd, Some(0o600), body(&[b"odd"]))
        .await
        .unwrap();
    let listed = s
        .adapter
        .list_files(&r, &dir.path().display().to_string(), 1)
        .await
        .unwrap();
    assert!(
        listed.iter().any(|e| e.path == odd && e.mode == 0o600),
        "{listed:?}"
    );
    let back = collect(s.adapter.download(&r, &odd, None).await.unwrap()).await;
    assert_eq!(back, b"odd");
    // A directory with something in it is not removed; a missing one is not listed.
    let e = s
        .adapter
        .delete_file(&r, &dir.path().display().to_string())
        .await
        .unwrap_err();
    assert!(
        matches!(&e, AdapterError::Permanent(m) if m.contains("not empty")),
        "{e:?}"
    );
    let gone = format!("{}/nothing-here", dir.path().display());
    assert!(matches!(
        s.adapter.list_files(&r, &gone, 1).await,
        Err(AdapterError::PathNotFound(_))
    ));
    assert!(matches!(
        s.adapter.delete_file(&r, &gone).await,
        Err(AdapterError::PathNotFound(_))
    ));
}

#[tokio::test]
async fn a_missing_session_or_a_strange_ref_is_not_found_without_allocating() {
    let s = setup(serde_json::json!({})).await;
    for backend_ref in ["someone-elses-session", "dly-01J00000000000000000000000-x"] {
        let nowhere = InstanceRef {
            sandbox_id: differently_core::SandboxId::new(),
            backend_ref: backend_ref.into(),
        };
        assert_eq!(
            s.adapter.exec(&nowhere, &cmd(&["true"])).await.unwrap_err(),
            AdapterError::NotFound
        );
    }
    assert!(s.fake.sessions().is_empty());
    assert!(s.fake.record().executions.is_empty());
}

#[test]
fn settings_are_checked_and_the_pool_is_always_external() {
    let base = serde_json::json!({
        "poolManagementEndpoint": "https://eastus.dynamicsessions.io/subscriptions/s/resourceGroups/g/sessionPools/p",
        "tokenSecret": "azure-token",
    });
    let with = |k: &str, v: serde_json::Value| {
        let mut s = base.clone();
        s[k] = v;
        s
    };
    assert!(registry::build("azure_sessions", &base).is_ok());
    let (field, message) = build_err("azure_sessions", with("containerType", "PythonLTS".into()));
    assert_eq!(field.as_deref(), Some("containerType"));
    assert!(message.contains("Shell"), "{message}");
    let (field, _) = build_err(
        "azure_sessions",
        with("apiVersion", "2024-02-02-preview".into()),
    );
    assert_eq!(field.as_deref(), Some("apiVersion"));
    let (field, _) = build_err("azure_sessions", with("maxExecSeconds", "soon".into()));
    assert_eq!(field.as_deref(), Some("maxExecSeconds"));
    let (field, _) = build_err(
        "azure_sessions",
        serde_json::json!({"tokenSecret": "azure-token"}),
    );
    assert_eq!(field.as_deref(), Some("poolManagementEndpoint"));
    assert_eq!(
        registry::trust_rule("azure_sessions"),
        TrustRule::ForcedExternal
    );
    assert!(registry::resolve_trust("azure_sessions", Some(Trust::Private)).is_err());
}

#[tokio::test]
async fn health_lists_one_page_and_says_when_the_token_is_refused() {
    let s = setup(serde_json::json!({})).await;
    s.adapter.health().await.unwrap();
    assert!(
        s.fake.sessions().is_empty(),
        "a health probe allocates nothing"
    );
    s.fake
        .set_token("eyJ0eXAiOiJKV1QifQ.eyJvdGhlciI6dHJ1ZX0.b3RoZXI");
    let e = s.adapter.health().await.unwrap_err();
    assert!(
        matches!(&e, AdapterError::Permanent(m) if m.contains("Session Executor") && !m.contains(TOKEN)),
        "{e:?}"
    );
    let record = s.fake.record();
    assert_eq!(record.unauthorized, 1);
    assert!(record.requests.iter().all(|r| r.contains("/listSessions")));
}
