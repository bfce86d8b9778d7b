//! What is specific to agent-sandbox: settings, claims on a warm pool (instant) and cold
//! claims with env, the controller's refusals, labels and the TTL backstop, Kubernetes' error
//! answers, the runtime's quirks (no shell, its own timeout, text output, paths under its base
//! directory decoded twice) and where the token goes. The contract itself is the conformance
//! kit's (`conformance.rs`).

use std::time::Duration;

use differently_adapters::agent_sandbox::{AgentSandboxAdapter, AgentSandboxConfig};
use differently_adapters::registry;
use differently_adapters::{Adapter, AdapterError, Capability, InstanceState, VerifiedStatus};
use differently_core::ids::InstallationId;
use differently_core::pool::Trust;
use serde_json::json;

use crate::fake_k8s::FakeCluster;
use crate::support::cases::{self as shared, body, build_err, collect, field_of};
use crate::{at, cmd, create_req, running, settings, setup, NS, POOL, TOKEN};

fn claim_gets(fake: &FakeCluster, name: &str) -> usize {
    let path = format!("/sandboxclaims/{name}?");
    fake.record()
        .requests
        .iter()
        .filter(|r| r.starts_with("GET ") && r.contains(&path))
        .count()
}

#[test]
fn settings_are_checked_naming_the_field_and_trust_must_be_declared() {
    let (field, _) = build_err("agent_sandbox", json!({"tokenSecret": "k"}));
    assert_eq!(field.as_deref(), Some("apiServerURL"));
    let base = json!({"apiServerURL": "https://k8s:6443", "tokenSecret": "k"});
    let with = |extra: serde_json::Value| crate::support::merged(base.clone(), extra);
    let (field, _) = build_err("agent_sandbox", with(json!({"namespace": "Bad_NS"})));
    assert_eq!(field.as_deref(), Some("namespace"));
    let (field, msg) = build_err("agent_sandbox", with(json!({"mode": "sandbox"})));
    assert_eq!(field.as_deref(), Some("podTemplate"), "{msg}");
    let (field, _) = build_err("agent_sandbox", with(json!({"runtime": {"port": "x"}})));
    assert_eq!(field.as_deref(), Some("runtime"));
    let (field, _) = build_err("agent_sandbox", with(json!({"unknownKey": 1})));
    assert_eq!(field.as_deref(), Some("unknownKey"));
    let a = registry::build("agent_sandbox", &base).unwrap();
    assert_eq!(a.capabilities(), [Capability::Exec, Capability::Files]);
    assert_eq!(a.verification().status, VerifiedStatus::FakeOnly);
    assert!(a.verification().basis.contains("Kubernetes"));
    assert_eq!(
        registry::resolve_trust("agent_sandbox", None).map_err(|e| e.field),
        Err("trust".to_owned())
    );
    assert_eq!(
        registry::resolve_trust("agent_sandbox", Some(Trust::Private)),
        Ok(Trust::Private)
    );
}

#[tokio::test]
async fn a_claim_without_env_adopts_a_warm_pod_at_once_and_the_pool_refills() {
    let s = setup(json!({})).await;
    let mut req = create_req(&InstallationId::new());
    req.env.clear();
    let inst = s.adapter.create(&req).await.unwrap();
    let name = inst
        .sandbox_id
        .as_str()
        .to_ascii_lowercase()
        .replace('_', "-");
    // The pod is one of the pool's, not one named after the claim.
    assert!(inst.backend_ref.starts_with("python-pool-"), "{inst:?}");
    assert_eq!(
        claim_gets(&s.fake, &name),
        2,
        "one look-up before the create, one Ready read"
    );
    let pods = s.fake.objects("sandboxes", NS);
    let adopted = &pods[&inst.backend_ref];
    assert!(adopted["metadata"]["labels"]
        .get(crate::fake_k8s::WARM_LABEL)
        .is_none());
    assert_eq!(
        adopted["spec"]["podTemplate"]["metadata"]["labels"]["differently-sandbox-id"],
        inst.sandbox_id.as_str()
    );
    let r = s
        .adapter
        .exec(&at(&inst), &cmd(&["sh", "-c", "echo $FROM_TEMPLATE"]))
        .await
        .unwrap();
    assert_eq!(r.stdout, "yes\n");
    for _ in 0..4 {
        s.fake.tick();
    }
    let pool = &s.fake.objects("sandboxwarmpools", NS)[POOL];
    assert_eq!(pool["status"]["readyReplicas"], 2, "{pool}");
}

#[tokio::test]
async fn a_claim_with_env_cold_starts_from_the_template_and_commands_see_it() {
    let s = setup(json!({})).await;
    let r = running(&s).await;
    let name = r.sandbox_id.as_str().to_ascii_lowercase().replace('_', "-");
    assert_eq!(
        r.backend_ref, name,
        "a cold sandbox is named like its claim"
    );
    assert!(
        claim_gets(&s.fake, &name) > 2,
        "cold starts are polled until Ready"
    );
    let claim = &s.fake.objects("sandboxclaims", NS)[&name];
    assert_eq!(claim["spec"]["warmPoolRef"]["name"], POOL);
    assert_eq!(
        claim["spec"]["env"],
        json!([{"name": "SANDBOX_VAR", "value": "from-create"}])
    );
    assert_eq!(
        claim["metadata"]["labels"]["differently-sandbox-id"],
        r.sandbox_id.as_str()
    );
    assert_eq!(claim["spec"]["lifecycle"]["shutdownPolicy"], "Delete");
    shared::exec_sees_env_and_cwd(&s.adapter, &r, 4).await;
    let out = s
        .adapter
        .exec(&r, &cmd(&["sh", "-c", "echo $FROM_TEMPLATE"]))
        .await
        .unwrap();
    assert_eq!(
        out.stdout, "yes\n",
        "the template's env is kept beside the claim's"
    );
}

#[tokio::test]
async fn the_controllers_refusals_are_permanent_and_say_why() {
    let s = setup(json!({})).await;
    s.fake.add_template_and_pool(NS, "locked", 1, None, &[]);
    let mut req = create_req(&InstallationId::new());
    req.template = Some("locked".into());
    let e = s.adapter.create(&req).await.unwrap_err();
    assert!(
        matches!(&e, AdapterError::Permanent(m) if m.contains("EnvVarsInjectionRejected")),
        "{e:?}"
    );
    let mut req = create_req(&InstallationId::new());
    req.template = Some("no-such-pool".into());
    let e = s.adapter.create(&req).await.unwrap_err();
    assert!(
        matches!(&e, AdapterError::Permanent(m) if m.contains("WarmPoolNotFound")),
        "{e:?}"
    );
    let mut req = create_req(&InstallationId::new());
    req.template = Some("Not A Pool".into());
    let e = s.adapter.create(&req).await.unwrap_err();
    assert_eq!(field_of(&e), Some("template"), "{e:?}");
    s.fake.knobs().pod_fails = true;
    let e = s
        .adapter
        .create(&create_req(&InstallationId::new()))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, AdapterError::Permanent(m) if m.contains("PodFailed")),
        "{e:?}"
    );
}

#[tokio::test]
async fn create_is_idempotent_lists_by_label_renews_and_deletes() {
    let s = setup(json!({})).await;
    let installation = InstallationId::new();
    let req = create_req(&installation);
    let first = s.adapter.create(&req).await.unwrap();
    let again = s.adapter.create(&req).await.unwrap();
    assert_eq!(first.backend_ref, again.backend_ref);
    assert_eq!(s.fake.objects("sandboxclaims", NS).len(), 1);
    let listed = s.adapter.list(&installation).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].state, InstanceState::Running);
    assert!(s
        .adapter
        .list(&InstallationId::new())
        .await
        .unwrap()
        .is_empty());

    s.adapter
        .renew(&at(&first), Duration::from_secs(3600))
        .await
        .unwrap();
    let (res, _, patch) = s.fake.record().patches.last().cloned().unwrap();
    assert_eq!(res, "sandboxclaims");
    let when = patch["spec"]["lifecycle"]["shutdownTime"]
        .as_str()
        .unwrap()
        .to_owned();
    let t = chrono::DateTime::parse_from_rfc3339(&when).unwrap();
    let ahead = t.with_timezone(&chrono::Utc) - chrono::Utc::now();
    assert!((3500..=3600).contains(&ahead.num_seconds()), "{when}");

    s.adapter.delete(&req.sandbox_id).await.unwrap();
    // The claim's finalizer holds it a little while; it already reads as gone.
    assert!(s.adapter.find(&req.sandbox_id).await.unwrap().is_none());
    s.adapter.delete(&req.sandbox_id).await.unwrap();
    for _ in 0..3 {
        s.fake.tick();
    }
    assert!(s.fake.objects("sandboxclaims", NS).is_empty());
    assert!(
        !s.fake
            .objects("sandboxes", NS)
            .contains_key(&first.backend_ref),
        "cascaded"
    );
    let e = s
        .adapter
        .exec(&at(&first), &cmd(&["true"]))
        .await
        .unwrap_err();
    assert_eq!(e, AdapterError::NotFound);
}

#[tokio::test]
async fn a_name_taken_by_an_object_without_our_label_is_refused() {
    let s = setup(json!({})).await;
    let req = create_req(&InstallationId::new());
    let name = req
        .sandbox_id
        .as_str()
        .to_ascii_lowercase()
        .replace('_', "-");
    {
        let mut w = s.fake.world();
        let v = json!({"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
            "metadata": {"name": name, "labels": {"app": "someone-else"}},
            "spec": {"warmPoolRef": {"name": POOL}}});
        w.insert("sandboxclaims", NS, v, None);
    }
    let e = s.adapter.create(&req).await.unwrap_err();
    assert!(
        matches!(&e, AdapterError::Permanent(m) if m.contains("taken")),
        "{e:?}"
    );
}

#[tokio::test]
async fn lists_follow_continue_tokens() {
    let s = setup(json!({})).await;
    s.fake.knobs().max_page = 2;
    let installation = InstallationId::new();
    for _ in 0..3 {
        let mut req = create_req(&installation);
        req.env.clear();
        s.adapter.create(&req).await.unwrap();
    }
    assert_eq!(s.adapter.list(&installation).await.unwrap().len(), 3);
    let pages = s
        .fake
        .record()
        .requests
        .iter()
        .filter(|r| {
            r.starts_with("GET ") && r.contains("/sandboxclaims?") && r.contains("continue=")
        })
        .count();
    assert!(pages >= 1, "the second page was asked for");
}

#[tokio::test]
async fn kubernetes_errors_map_and_the_token_stays_with_the_api_server() {
    let s = setup(json!({})).await;
    let r = running(&s).await;
    assert_eq!(
        s.fake.record().auth_on_runtime,
        0,
        "the runtime never sees the token"
    );

    s.fake
        .knobs()
        .fail_next
        .push_back(("/sandboxclaims".into(), 403));
    let e = s.adapter.find(&r.sandbox_id).await.unwrap_err();
    assert!(
        matches!(&e, AdapterError::Permanent(m) if m.contains("RBAC")),
        "{e:?}"
    );
    s.fake
        .knobs()
        .fail_next
        .push_back(("/sandboxclaims".into(), 429));
    let e = s.adapter.find(&r.sandbox_id).await.unwrap_err();
    assert!(
        e.is_retryable() && e.retry_after() == Some(Duration::from_secs(1)),
        "{e:?}"
    );

    s.fake.set_token("rotated-token-value");
    let e = s.adapter.health().await.unwrap_err();
    assert!(
        matches!(&e, AdapterError::Permanent(m) if m.contains("bearer token")),
        "{e:?}"
    );
    assert!(!format!("{e:?}").contains(TOKEN));
    std::fs::write(s.key.path(), "rotated-token-value\n").unwrap();
    s.adapter.health().await.unwrap();

    // An API server that does not serve the resources: the CRDs are missing.
    let v = settings(
        &s.fake,
        &s.key,
        json!({"apiServerURL": format!("{}/elsewhere", s.fake.api_url())}),
    );
    let other =
        AgentSandboxAdapter::new(serde_json::from_value::<AgentSandboxConfig>(v).unwrap()).unwrap();
    let e = other.health().await.unwrap_err();
    assert!(
        matches!(&e, AdapterError::Permanent(m) if m.contains("CRDs")),
        "{e:?}"
    );
}

#[tokio::test]
async fn the_runtimes_quirks_are_answered() {
    let s = setup(json!({})).await;
    let r = running(&s).await;
    let timed_out =
        shared::exec_timeout_is_124_and_a_missing_cwd_names_the_field(&s.adapter, &r).await;
    assert_eq!(timed_out.stdout, "");
    // The runtime splits with shlex and runs without a shell: quoting must survive it.
    let tricky = "it's \"quoted\" $HOME `x` \\ end";
    let out = s
        .adapter
        .exec(&r, &cmd(&["printf", "%s", tricky]))
        .await
        .unwrap();
    assert_eq!(out.stdout, tricky);
    let mut req = cmd(&["cat"]);
    req.stdin = Some("to stdin".into());
    assert_eq!(s.adapter.exec(&r, &req).await.unwrap().stdout, "to stdin");
    let killed = s
        .adapter
        .exec(&r, &cmd(&["sh", "-c", "kill -TERM $$"]))
        .await
        .unwrap();
    assert_eq!(killed.exit_code, 128 + 15);
    let e = s
        .adapter
        .exec(&r, &cmd(&["printf", "\\377"]))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, AdapterError::Permanent(m) if m.contains("UTF-8")),
        "{e:?}"
    );
    // The runtime's own timeout is shorter than the request's: still a timeout.
    s.fake.knobs().exec_timeout_secs = 1;
    let mut slow = cmd(&["sleep", "5"]);
    slow.timeout_seconds = Some(20);
    assert_eq!(s.adapter.exec(&r, &slow).await.unwrap().exit_code, 124);
    let recorded = s.fake.record().executes.clone();
    assert!(
        recorded.iter().all(|c| c.starts_with("sh -c '")),
        "{recorded:?}"
    );
}

#[tokio::test]
async fn files_round_trip_and_paths_survive_double_decoding() {
    let s = setup(json!({})).await;
    let r = running(&s).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    shared::files_round_trip(&s.adapter, &r, &d).await;
    let odd = format!("{d}/100%25 done+a b.txt");
    s.adapter
        .upload(&r, &odd, None, body(&[b"x"]))
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(&odd).unwrap(),
        b"x",
        "written at exactly that name"
    );
    assert_eq!(
        collect(s.adapter.download(&r, &odd, None).await.unwrap()).await,
        b"x"
    );
    let e = s.adapter.delete_file(&r, &d).await.unwrap_err();
    assert_eq!(
        field_of(&e),
        Some("path"),
        "a directory that is not empty: {e:?}"
    );
    assert!(matches!(
        s.adapter.list_files(&r, &format!("{d}/nope"), 1).await,
        Err(AdapterError::PathNotFound(_))
    ));
}

#[tokio::test]
async fn file_paths_must_lie_under_the_runtimes_base_directory() {
    let base = tempfile::tempdir().unwrap();
    let b = base.path().display().to_string();
    let s = setup(json!({})).await;
    // An adapter told the runtime's base directory, which the fake's runtimes now use.
    let token = crate::key_file(TOKEN);
    let v = settings(
        &s.fake,
        &token,
        json!({"runtime": {"routerURL": s.fake.router_url(), "baseDir": &b}}),
    );
    let adapter =
        AgentSandboxAdapter::new(serde_json::from_value::<AgentSandboxConfig>(v).unwrap()).unwrap();
    s.fake.knobs().base_dir = b.clone();
    let r = at(&adapter
        .create(&create_req(&InstallationId::new()))
        .await
        .unwrap());
    let before = s.fake.record().requests.len();
    let e = adapter
        .upload(&r, "/etc/differently-test", None, body(&[b"x"]))
        .await
        .unwrap_err();
    assert_eq!(field_of(&e), Some("path"), "{e:?}");
    assert_eq!(
        s.fake.record().requests.len(),
        before,
        "refused before any request"
    );
    let inside = format!("{b}/sub/f.txt");
    adapter
        .upload(&r, &inside, Some(0o600), body(&[b"in", b"side"]))
        .await
        .unwrap();
    assert_eq!(std::fs::read(&inside).unwrap(), b"inside");
    let listed = adapter.list_files(&r, &b, 2).await.unwrap();
    let f = listed.iter().find(|e| e.path == inside).unwrap();
    assert_eq!((f.size, f.mode), (6, 0o600));
    // Commands run in the base directory by default, as the runtime runs them.
    let pwd = adapter.exec(&r, &cmd(&["pwd"])).await.unwrap();
    assert_eq!(
        pwd.stdout.trim_end(),
        std::fs::canonicalize(&b).unwrap().display().to_string()
    );
}

#[tokio::test]
async fn sandbox_mode_makes_a_sandbox_from_the_pool_template_with_the_backstop() {
    let fake = FakeCluster::start(TOKEN).await;
    let token = crate::key_file(TOKEN);
    let template = json!({"metadata": {"annotations": {"team": "a"}},
        "spec": {"containers": [{"name": "runtime", "image": "python-runtime-sandbox:1",
                                 "env": [{"name": "SANDBOX_VAR", "value": "from-template"}]}]}});
    let v = settings(
        &fake,
        &token,
        json!({"mode": "sandbox", "warmPool": null, "podTemplate": template,
               "runtime": {"urlPattern": fake.direct_pattern(), "baseDir": "/"}}),
    );
    let adapter =
        AgentSandboxAdapter::new(serde_json::from_value::<AgentSandboxConfig>(v).unwrap()).unwrap();
    let mut req = create_req(&InstallationId::new());
    req.template = Some("python-runtime-sandbox:2".into());
    let inst = adapter.create(&req).await.unwrap();
    let sbx = &fake.objects("sandboxes", NS)[&inst.backend_ref];
    let pod = &sbx["spec"]["podTemplate"];
    assert_eq!(
        pod["spec"]["containers"][0]["image"],
        "python-runtime-sandbox:2"
    );
    assert_eq!(
        pod["metadata"]["annotations"]["team"], "a",
        "the template's metadata is kept"
    );
    assert_eq!(
        pod["metadata"]["labels"]["differently-sandbox-id"],
        req.sandbox_id.as_str()
    );
    assert_eq!(sbx["spec"]["shutdownPolicy"], "Delete");
    assert!(sbx["spec"]["shutdownTime"].is_string());
    // The request's env wins over the template's.
    let out = adapter
        .exec(&at(&inst), &cmd(&["sh", "-c", "echo $SANDBOX_VAR"]))
        .await
        .unwrap();
    assert_eq!(out.stdout, "from-create\n");
    adapter
        .renew(&at(&inst), Duration::from_secs(60))
        .await
        .unwrap();
    let (res, _, patch) = fake.record().patches.last().cloned().unwrap();
    assert_eq!(res, "sandboxes");
    assert!(patch["spec"]["shutdownTime"].is_string(), "{patch}");
    adapter.delete(&req.sandbox_id).await.unwrap();
    assert!(
        fake.objects("sandboxes", NS).is_empty(),
        "a Sandbox goes at once"
    );
}

#[tokio::test]
async fn a_create_while_the_previous_claim_is_still_deleting_is_transient() {
    let s = setup(json!({})).await;
    let req = create_req(&InstallationId::new());
    s.adapter.create(&req).await.unwrap();
    s.fake.knobs().claim_delete_ticks = 50;
    s.adapter.delete(&req.sandbox_id).await.unwrap();
    let e = s.adapter.create(&req).await.unwrap_err();
    assert!(
        matches!(&e, AdapterError::Transient(m) if m.contains("still being deleted")),
        "{e:?}"
    );
}
