//! Audit chains and sealed secrets, against both stores: chains per organization stay
//! contiguous and verify (also under concurrency), a tampered record is reported exactly,
//! checkpoints catch a truncated tail, and secrets never show their value.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::Utc;
use differently_core::{CreateSandboxRequest, OrgId, ProjectId, Sandbox, SandboxSpec};
use differently_store::audit::{
    self, AuditEvent, AuditFilter, NewAuditEvent, ProblemKind, VerifyReport, INSTALLATION_CHAIN,
};
use differently_store::sealed::{self, SealKey};
use differently_store::{Actor, Admission, Org, OrgStatus, Project, Quota, Store};
use serde_json::json;

use crate::{Backend, Env};

macro_rules! audit_conformance {
    ($($case:ident),+ $(,)?) => {
        mod memory {
            $(
                #[tokio::test]
                async fn $case() {
                    super::$case(&crate::Env::memory()).await;
                }
            )+
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(&crate::Env::postgres().await).await;
                }
            )+
        }
    };
}

audit_conformance!(
    chains_are_per_org_contiguous_and_verify,
    records_carry_who_what_target_outcome_and_request_id,
    list_filters_and_cursor,
    concurrent_appends_across_orgs_stay_contiguous,
    edited_record_is_reported_exactly,
    deleted_record_is_reported_exactly,
    reordered_records_are_reported_at_the_first_moved,
    truncated_tail_is_caught_by_a_checkpoint,
    checkpoints_skip_when_nothing_changed,
    deleting_tenants_keeps_their_history,
    secrets_are_sealed_fingerprinted_and_audited,
    a_guarded_append_writes_only_while_the_row_holds,
    a_staged_append_is_written_once_committed,
);

fn admin() -> Actor {
    Actor::Key("key_admin".into())
}

async fn org(s: &dyn Store, name: &str) -> Org {
    let o = Org {
        id: OrgId::new(),
        name: format!("{name}-{}", OrgId::new()),
        status: OrgStatus::Active,
        created_at: Utc::now(),
    };
    s.create_org(&o, &admin()).await.unwrap();
    o
}

async fn project(s: &dyn Store, org: &OrgId) -> Project {
    let p = Project {
        id: ProjectId::new(),
        org_id: org.clone(),
        name: format!("p-{}", ProjectId::new()),
        created_at: Utc::now(),
    };
    s.create_project(&p, &admin()).await.unwrap();
    p
}

async fn admit(s: &dyn Store, org: &OrgId, prj: &ProjectId) -> Sandbox {
    let sbx = Sandbox::queued(
        org.clone(),
        prj.clone(),
        SandboxSpec::build(&CreateSandboxRequest::default()).unwrap(),
        None,
        Utc::now(),
    );
    s.admit(Admission {
        request_id: None,
        direct: None,
        sandbox: sbx.clone(),
        request_hash: "h".into(),
        defaults: Quota::default(),
        actor: Actor::Key("key_t".into()),
    })
    .await
    .unwrap();
    sbx
}

fn exec_event(org: &OrgId, prj: &ProjectId, resource: &str) -> NewAuditEvent {
    NewAuditEvent {
        org_id: Some(org.clone()),
        project_id: Some(prj.clone()),
        actor: "key:key_t".into(),
        action: "sandbox.exec".into(),
        resource: resource.into(),
        outcome: "ok".into(),
        detail: json!({"program": "python3"}),
    }
}

/// Every chained record, in `(chain, chainSeq)` order.
async fn export(s: &dyn Store) -> Vec<AuditEvent> {
    let mut out: Vec<AuditEvent> = vec![];
    loop {
        let after = out.last().map(|r| audit::ExportCursor {
            chain: r.chain.clone(),
            chain_seq: r.chain_seq,
        });
        let page = s.export_audit(after.as_ref(), 7).await.unwrap();
        if page.is_empty() {
            return out;
        }
        out.extend(page);
    }
}

fn by_chain(recs: &[AuditEvent]) -> BTreeMap<String, Vec<i64>> {
    let mut m: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for r in recs {
        m.entry(r.chain.clone()).or_default().push(r.chain_seq);
    }
    m
}

fn assert_contiguous(recs: &[AuditEvent]) {
    for (chain, seqs) in by_chain(recs) {
        let want: Vec<i64> = (1..=seqs.len() as i64).collect();
        assert_eq!(seqs, want, "chain {chain} is not contiguous");
    }
}

async fn verify_ok(s: &dyn Store) -> VerifyReport {
    let r = s.verify_audit().await.unwrap();
    assert!(r.ok, "{r:?}");
    r
}

// ---------- tampering, per backend ----------

/// Runs `sql` on the Postgres database with the append-only triggers disabled, as a
/// database superuser could.
async fn tamper_sql(env: &Env, sql: &str) {
    let Backend::Postgres(db) = &env.backend else {
        unreachable!("postgres only")
    };
    let mut tx = db.store().pool().begin().await.unwrap();
    sqlx::raw_sql(&format!(
        "ALTER TABLE audit_events DISABLE TRIGGER USER;
         ALTER TABLE audit_checkpoints DISABLE TRIGGER USER;
         {sql};
         ALTER TABLE audit_events ENABLE TRIGGER USER;
         ALTER TABLE audit_checkpoints ENABLE TRIGGER USER;"
    ))
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
}

/// Four records about one resource, alone in their chain (an org's chains are shards keyed by
/// resource; the resource is picked off the org's and the project's own shards). Returns the
/// org, the chain, the resource and the records.
async fn four_records(s: &dyn Store) -> (OrgId, String, String, Vec<AuditEvent>) {
    let o = org(s, "t").await;
    let p = project(s, &o.id).await;
    let taken = [
        audit::chain_of(Some(&o.id), o.id.as_str()),
        audit::chain_of(Some(&o.id), p.id.as_str()),
    ];
    let resource = (0..)
        .map(|i| format!("sbx{i}"))
        .find(|r| !taken.contains(&audit::chain_of(Some(&o.id), r)))
        .unwrap();
    let chain = audit::chain_of(Some(&o.id), &resource);
    for _ in 0..4 {
        s.append_audit(exec_event(&o.id, &p.id, &resource))
            .await
            .unwrap();
    }
    let recs: Vec<AuditEvent> = export(s)
        .await
        .into_iter()
        .filter(|r| r.chain == chain)
        .collect();
    assert_eq!(recs.len(), 4);
    (o.id, chain, resource, recs)
}

// ---------- cases ----------

pub async fn chains_are_per_org_contiguous_and_verify(env: &Env) {
    let s = env.store.as_ref();
    let a = org(s, "a").await;
    let b = org(s, "b").await;
    let pa = project(s, &a.id).await;
    let pb = project(s, &b.id).await;
    admit(s, &a.id, &pa.id).await;
    admit(s, &b.id, &pb.id).await;
    admit(s, &a.id, &pa.id).await;
    let recs = export(s).await;
    assert_contiguous(&recs);
    let chains = by_chain(&recs);
    let of_org = |recs: &[AuditEvent], o: &OrgId| {
        recs.iter()
            .filter(|r| r.chain.starts_with(&format!("{o}/")))
            .count()
    };
    assert_eq!(of_org(&recs, &a.id), 4, "create org, project, 2 admits");
    assert_eq!(of_org(&recs, &b.id), 3);
    // Each record is in its resource's shard of its org.
    for r in &recs {
        let org = r.org_id.as_deref().map(|o| OrgId::parse(o).unwrap());
        assert_eq!(r.chain, audit::chain_of(org.as_ref(), &r.resource));
    }
    // Each record links to the one before it in its own chain.
    for w in recs.windows(2) {
        if w[0].chain == w[1].chain {
            assert_eq!(w[1].prev_hash, w[0].hash);
        }
    }
    assert_eq!(recs[0].prev_hash, audit::GENESIS_HASH);
    let r = verify_ok(s).await;
    assert_eq!(r.records, recs.len() as u64);
    assert_eq!(r.chains, chains.len() as u64);
    // A second handle (another replica) continues the same chains.
    let again = env.reopen().await;
    admit(again.as_ref(), &a.id, &pa.id).await;
    let recs = export(s).await;
    assert_contiguous(&recs);
    assert_eq!(of_org(&recs, &a.id), 5);
    verify_ok(s).await;
}

pub async fn records_carry_who_what_target_outcome_and_request_id(env: &Env) {
    let s = env.store.as_ref();
    let o = org(s, "w").await;
    let p = project(s, &o.id).await;
    let sbx =
        differently_core::request_id::with_request_id("req_123".into(), admit(s, &o.id, &p.id))
            .await;
    let mut denied = exec_event(&o.id, &p.id, sbx.id.as_str());
    denied.outcome = "exit:2".into();
    let rec = s.append_audit(denied).await.unwrap();
    assert_eq!(rec.request_id, None, "no request id outside a request");
    let recs = s
        .list_audit(&AuditFilter {
            org_id: Some(o.id.clone()),
            resource: Some(sbx.id.to_string()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(recs.len(), 2);
    let admitted = &recs[0];
    assert_eq!(admitted.action, "sandbox.admit");
    assert_eq!(admitted.actor, "key:key_t");
    assert_eq!(admitted.org_id.as_deref(), Some(o.id.as_str()));
    assert_eq!(admitted.project_id.as_deref(), Some(p.id.as_str()));
    assert_eq!(admitted.outcome, "ok");
    assert_eq!(admitted.request_id.as_deref(), Some("req_123"));
    assert_eq!(recs[1].outcome, "exit:2");
    assert_eq!(recs[1].detail, json!({"program": "python3"}));
    // The project of a project's own record is the project.
    let created = s
        .list_audit(&AuditFilter {
            action: Some("project.create".into()),
            resource: Some(p.id.to_string()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(created[0].project_id.as_deref(), Some(p.id.as_str()));
    verify_ok(s).await;
}

pub async fn list_filters_and_cursor(env: &Env) {
    let s = env.store.as_ref();
    let a = org(s, "la").await;
    let b = org(s, "lb").await;
    let pa = project(s, &a.id).await;
    let pa2 = project(s, &a.id).await;
    for i in 0..5 {
        let p = if i % 2 == 0 { &pa } else { &pa2 };
        s.append_audit(exec_event(&a.id, &p.id, &format!("r{i}")))
            .await
            .unwrap();
    }
    project(s, &b.id).await;
    let only_a = AuditFilter {
        org_id: Some(a.id.clone()),
        ..Default::default()
    };
    let all_a = s.list_audit(&only_a).await.unwrap();
    assert_eq!(all_a.len(), 8, "org, 2 projects, 5 execs");
    assert!(all_a
        .iter()
        .all(|r| r.org_id.as_deref() == Some(a.id.as_str())));
    // Pages of 3 by cursor give the same records in order.
    let mut paged = vec![];
    let mut after = None;
    loop {
        let page = s
            .list_audit(&AuditFilter {
                after,
                limit: 3,
                ..only_a.clone()
            })
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        after = Some(last.seq);
        paged.extend(page);
    }
    assert_eq!(paged, all_a);
    let execs_pa = s
        .list_audit(&AuditFilter {
            project_id: Some(pa.id.clone()),
            action: Some("sandbox.exec".into()),
            ..only_a.clone()
        })
        .await
        .unwrap();
    assert_eq!(
        execs_pa
            .iter()
            .map(|r| r.resource.as_str())
            .collect::<Vec<_>>(),
        ["r0", "r2", "r4"]
    );
    let none = s
        .list_audit(&AuditFilter {
            since: Some(Utc::now() + chrono::TimeDelta::hours(1)),
            ..only_a
        })
        .await
        .unwrap();
    assert!(none.is_empty());
}

pub async fn concurrent_appends_across_orgs_stay_contiguous(env: &Env) {
    let s = env.store.clone();
    let mut orgs = vec![];
    for i in 0..6 {
        let o = org(s.as_ref(), &format!("c{i}")).await;
        let p = project(s.as_ref(), &o.id).await;
        orgs.push((o.id, p.id));
    }
    let orgs = Arc::new(orgs);
    let mut tasks = vec![];
    for t in 0..12 {
        // Half the writers use another handle, as another replica would.
        let store: Arc<dyn Store> = if t % 2 == 0 {
            s.clone()
        } else {
            env.reopen().await
        };
        let orgs = orgs.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..10 {
                let (o, p) = &orgs[(t + i) % orgs.len()];
                if i % 3 == 0 {
                    admit(store.as_ref(), o, p).await;
                } else {
                    store
                        .append_audit(exec_event(o, p, &format!("t{t}-{i}")))
                        .await
                        .unwrap();
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let recs = export(s.as_ref()).await;
    assert_contiguous(&recs);
    let r = verify_ok(s.as_ref()).await;
    assert_eq!(r.records, 6 * 2 + 12 * 10);
}

pub async fn edited_record_is_reported_exactly(env: &Env) {
    let s = env.store.as_ref();
    let (_, chain, _, recs) = four_records(s).await;
    let target = recs[2].clone();
    match &env.backend {
        Backend::Memory(m) => m.tamper_audit(|all| {
            let r = all.iter_mut().find(|r| r.seq == target.seq).unwrap();
            r.detail = json!({"program": "rm"});
        }),
        Backend::Postgres(_) => {
            tamper_sql(
                env,
                &format!(
                    r#"UPDATE audit_events SET detail = '{{"program": "rm"}}' WHERE seq = {}"#,
                    target.seq
                ),
            )
            .await
        }
    }
    let r = s.verify_audit().await.unwrap();
    assert!(!r.ok);
    let bad = r.first_bad.clone().unwrap();
    assert_eq!(bad.kind, ProblemKind::HashMismatch);
    assert_eq!(bad.chain, chain);
    assert_eq!((bad.chain_seq, bad.seq), (3, Some(target.seq)));
    assert_eq!(r.problems.len(), 1, "{r:?}");
}

pub async fn deleted_record_is_reported_exactly(env: &Env) {
    let s = env.store.as_ref();
    let (_, chain, _, recs) = four_records(s).await;
    let target = recs[1].clone();
    match &env.backend {
        Backend::Memory(m) => m.tamper_audit(|all| all.retain(|r| r.seq != target.seq)),
        Backend::Postgres(_) => {
            tamper_sql(
                env,
                &format!("DELETE FROM audit_events WHERE seq = {}", target.seq),
            )
            .await
        }
    }
    let r = s.verify_audit().await.unwrap();
    let bad = r.first_bad.clone().unwrap();
    assert_eq!(bad.kind, ProblemKind::Missing);
    assert_eq!((bad.chain.as_str(), bad.chain_seq), (chain.as_str(), 2));
    assert_eq!(r.problems.len(), 1, "{r:?}");
}

pub async fn reordered_records_are_reported_at_the_first_moved(env: &Env) {
    let s = env.store.as_ref();
    let (_, chain, _, recs) = four_records(s).await;
    let (x, y) = (recs[1].clone(), recs[2].clone());
    match &env.backend {
        Backend::Memory(m) => m.tamper_audit(|all| {
            for r in all.iter_mut() {
                if r.seq == x.seq {
                    r.chain_seq = y.chain_seq;
                } else if r.seq == y.seq {
                    r.chain_seq = x.chain_seq;
                }
            }
        }),
        Backend::Postgres(_) => {
            tamper_sql(
                env,
                &format!(
                    "UPDATE audit_events SET chain_seq = 1000000 WHERE seq = {x};
                     UPDATE audit_events SET chain_seq = {xs} WHERE seq = {y};
                     UPDATE audit_events SET chain_seq = {ys} WHERE seq = {x}",
                    x = x.seq,
                    y = y.seq,
                    xs = x.chain_seq,
                    ys = y.chain_seq
                ),
            )
            .await
        }
    }
    let r = s.verify_audit().await.unwrap();
    let bad = r.first_bad.unwrap();
    assert_eq!(bad.chain, chain);
    // Position 2 now holds the record written third.
    assert_eq!((bad.chain_seq, bad.seq), (2, Some(y.seq)));
}

pub async fn truncated_tail_is_caught_by_a_checkpoint(env: &Env) {
    let s = env.store.as_ref();
    let (_, chain, _, recs) = four_records(s).await;
    let cp = s
        .write_audit_checkpoint()
        .await
        .unwrap()
        .expect("a checkpoint");
    assert!(cp
        .heads
        .iter()
        .any(|h| h.chain == chain && h.chain_seq == 4));
    verify_ok(s).await;
    let last = recs[3].clone();
    match &env.backend {
        Backend::Memory(m) => m.tamper_audit(|all| all.retain(|r| r.seq != last.seq)),
        Backend::Postgres(_) => {
            tamper_sql(
                env,
                &format!("DELETE FROM audit_events WHERE seq = {}", last.seq),
            )
            .await
        }
    }
    let bad = s.verify_audit().await.unwrap().first_bad.unwrap();
    assert_eq!(bad.kind, ProblemKind::Truncated);
    assert_eq!((bad.chain.as_str(), bad.chain_seq), (chain.as_str(), 4));
}

pub async fn checkpoints_skip_when_nothing_changed(env: &Env) {
    let s = env.store.as_ref();
    let o = org(s, "k").await;
    let first = s.write_audit_checkpoint().await.unwrap().expect("first");
    assert_eq!(first.seq, 1);
    assert!(s.write_audit_checkpoint().await.unwrap().is_none());
    project(s, &o.id).await;
    let second = s.write_audit_checkpoint().await.unwrap().expect("second");
    assert_eq!(second.seq, 2);
    assert_eq!(second.prev_hash, first.hash);
    assert_eq!(s.audit_checkpoints().await.unwrap(), vec![first, second]);
    let r = verify_ok(s).await;
    assert_eq!(r.checkpoints, 2);
}

pub async fn deleting_tenants_keeps_their_history(env: &Env) {
    let s = env.store.as_ref();
    let o = org(s, "gone").await;
    let p = project(s, &o.id).await;
    s.delete_project(&p.id, &admin()).await.unwrap();
    s.delete_org(&o.id, &admin()).await.unwrap();
    let recs = s
        .list_audit(&AuditFilter {
            org_id: Some(o.id.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    let actions: Vec<&str> = recs.iter().map(|r| r.action.as_str()).collect();
    assert_eq!(
        actions,
        [
            "org.create",
            "project.create",
            "project.delete",
            "org.delete"
        ]
    );
    verify_ok(s).await;
}

/// The sealing key is process-wide; every test in this process shares one.
fn ensure_seal_key() {
    let _ = sealed::set_process_key(SealKey::random().unwrap());
}

pub async fn secrets_are_sealed_fingerprinted_and_audited(env: &Env) {
    ensure_seal_key();
    let s = env.store.as_ref();
    let name = format!("opensandbox-{}", OrgId::new().as_str().to_lowercase());
    let first = s.put_secret(&name, b"api-key-1", &admin()).await.unwrap();
    assert_eq!(first.fingerprint, sealed::fingerprint(b"api-key-1"));
    assert_eq!(first.updated_by, "key:key_admin");
    assert_eq!(
        s.open_secret(&name).await.unwrap().as_deref(),
        Some(&b"api-key-1"[..])
    );
    // Replaced at runtime: the next read sees the new value.
    let second = s.put_secret(&name, b"api-key-2", &admin()).await.unwrap();
    assert_ne!(second.fingerprint, first.fingerprint);
    assert_eq!(second.created_at, first.created_at);
    assert_eq!(
        s.open_secret(&name).await.unwrap().as_deref(),
        Some(&b"api-key-2"[..])
    );
    assert!(s.open_secret("absent").await.unwrap().is_none());
    let listed = s.list_secrets().await.unwrap();
    assert!(listed.contains(&second));
    // Audited on the installation chain with fingerprints, never the value.
    let recs = s
        .list_audit(&AuditFilter {
            action: Some("secret.put".into()),
            resource: Some(name.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(recs.len(), 2);
    assert!(recs.iter().all(|r| r.chain == INSTALLATION_CHAIN));
    assert_eq!(recs[1].detail["oldFingerprint"], json!(first.fingerprint));
    let text = serde_json::to_string(&recs).unwrap();
    assert!(!text.contains("api-key"), "{text}");
    verify_ok(s).await;
    // A blob swapped in from another secret's row does not open.
    if let Backend::Postgres(db) = &env.backend {
        let other = format!("{name}-other");
        s.put_secret(&other, b"other-value", &admin())
            .await
            .unwrap();
        let stored: Vec<u8> = sqlx::query_scalar("SELECT sealed FROM secrets WHERE name = $1")
            .bind(&name)
            .fetch_one(db.store().pool())
            .await
            .unwrap();
        assert!(!stored.windows(9).any(|w| w == b"api-key-2"));
        sqlx::query("UPDATE secrets SET sealed = (SELECT sealed FROM secrets WHERE name = $2) WHERE name = $1")
            .bind(&name)
            .bind(&other)
            .execute(db.store().pool())
            .await
            .unwrap();
        let err = s.open_secret(&name).await.unwrap_err().to_string();
        assert!(err.contains("does not open"), "{err}");
        assert!(!err.contains("other-value"));
    }
}

// ---------- Postgres only ----------

/// The database itself refuses to rewrite history, whatever the server does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refuses_update_delete_and_truncate_of_audit_rows() {
    let env = Env::postgres().await;
    let s = env.store.as_ref();
    org(s, "ro").await;
    s.write_audit_checkpoint()
        .await
        .unwrap()
        .expect("checkpoint");
    let Backend::Postgres(db) = &env.backend else {
        unreachable!()
    };
    for sql in [
        "UPDATE audit_events SET action = 'x'",
        "DELETE FROM audit_events",
        "TRUNCATE audit_events",
        "UPDATE audit_checkpoints SET hash = 'x'",
        "DELETE FROM audit_checkpoints",
        "TRUNCATE audit_checkpoints",
    ] {
        let err = sqlx::raw_sql(sql)
            .execute(db.store().pool())
            .await
            .expect_err(sql)
            .to_string();
        assert!(err.contains("append-only"), "{sql}: {err}");
    }
    verify_ok(s).await;
}

/// If the audit record cannot be written, the change it records does not happen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_fails_the_action_when_its_audit_record_fails() {
    let env = Env::postgres().await;
    let s = env.store.as_ref();
    let Backend::Postgres(db) = &env.backend else {
        unreachable!()
    };
    sqlx::raw_sql(
        "ALTER TABLE audit_events ADD CONSTRAINT refuse_all CHECK (action = 'never') NOT VALID",
    )
    .execute(db.store().pool())
    .await
    .unwrap();
    let o = Org {
        id: OrgId::new(),
        name: "fail-closed".into(),
        status: OrgStatus::Active,
        created_at: Utc::now(),
    };
    assert!(s.create_org(&o, &admin()).await.is_err());
    assert!(s.get_org(&o.id).await.unwrap().is_none());
}

/// A chain whose head row is missing (written before migration 0007, or lost) continues from
/// its newest record, and the chain still verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_chain_continues_without_its_head_row() {
    let env = Env::postgres().await;
    let s = env.store.as_ref();
    let (org_id, chain_id, resource, before) = four_records(s).await;
    tamper_sql(
        &env,
        &format!("DELETE FROM audit_heads WHERE chain = '{chain_id}'"),
    )
    .await;
    let p = s.list_projects(&org_id, None, 10).await.unwrap().remove(0);
    s.append_audit(exec_event(&org_id, &p.id, &resource))
        .await
        .unwrap();
    let chain: Vec<AuditEvent> = export(s)
        .await
        .into_iter()
        .filter(|r| r.chain == chain_id)
        .collect();
    assert_eq!(chain.len(), before.len() + 1, "the new exec record");
    let seqs: Vec<i64> = chain.iter().map(|r| r.chain_seq).collect();
    assert_eq!(seqs, (1..=chain.len() as i64).collect::<Vec<_>>());
    verify_ok(s).await;
}

/// A head row that lags its chain (someone rewound it) cannot fork the chain: the next
/// append collides with the record already at that position, and the action fails closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stale_head_row_fails_the_append() {
    let env = Env::postgres().await;
    let s = env.store.as_ref();
    let (org_id, chain_id, resource, before) = four_records(s).await;
    tamper_sql(
        &env,
        &format!(
            "UPDATE audit_heads SET chain_seq = 2, hash = '{}' WHERE chain = '{chain_id}'",
            before[1].hash
        ),
    )
    .await;
    let p = s.list_projects(&org_id, None, 10).await.unwrap().remove(0);
    let err = s
        .append_audit(exec_event(&org_id, &p.id, &resource))
        .await
        .expect_err("a stale head must not fork the chain");
    assert!(err.to_string().contains("audit_events_chain_idx"), "{err}");
    verify_ok(s).await;
}

/// Standalone appends (`append_audit`) of one chain from two handles, each with its own idea
/// of the chain's head, some with fractional numbers (which take the locking path): every
/// record lands exactly once, in a gapless chain that verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_standalone_appends_race_on_one_chain() {
    let env = Env::postgres().await;
    let s = env.store.clone();
    let o = org(s.as_ref(), "race").await;
    let p = project(s.as_ref(), &o.id).await;
    let other = env.reopen().await;
    let mut tasks = vec![];
    for t in 0..6 {
        let store = if t % 2 == 0 { s.clone() } else { other.clone() };
        let (o, p) = (o.id.clone(), p.id.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..20 {
                let mut e = exec_event(&o, &p, "sbx-hot");
                if i % 5 == 0 {
                    e.detail = json!({"program": "python3", "load": 0.25});
                }
                let rec = store.append_audit(e).await.unwrap();
                assert_eq!(rec.chain, audit::chain_of(Some(&o), "sbx-hot"));
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let chain = audit::chain_of(Some(&o.id), "sbx-hot");
    let recs: Vec<AuditEvent> = export(s.as_ref())
        .await
        .into_iter()
        .filter(|r| r.chain == chain)
        .collect();
    let hot = recs.iter().filter(|r| r.resource == "sbx-hot").count();
    assert_eq!(hot, 6 * 20);
    let seqs: Vec<i64> = recs.iter().map(|r| r.chain_seq).collect();
    assert_eq!(seqs, (1..=recs.len() as i64).collect::<Vec<_>>());
    verify_ok(s.as_ref()).await;
}

pub async fn a_guarded_append_writes_only_while_the_row_holds(env: &Env) {
    use differently_core::SandboxStatus;
    use differently_store::audit::RowGuard;
    use differently_store::{PoolSlot, Transition};

    let s = env.store.as_ref();
    let o = org(s, "guarded").await;
    let p = project(s, &o.id).await;
    let sbx = admit(s, &o.id, &p.id).await;
    let pool = PoolSlot {
        name: "p".into(),
        max_concurrent: None,
    };
    s.activate(&sbx.id, &pool, &Quota::default(), Utc::now())
        .await
        .unwrap();
    let running = s.mark_running(&sbx.id, "ref-1", Utc::now()).await.unwrap();
    let guard = RowGuard {
        sandbox: running.id.clone(),
        status: SandboxStatus::Running,
        status_version: running.status_version,
    };
    let count = |recs: Vec<AuditEvent>| recs.iter().filter(|r| r.action == "sandbox.exec").count();
    let execs = || async {
        count(
            s.list_audit(&AuditFilter {
                resource: Some(sbx.id.to_string()),
                ..Default::default()
            })
            .await
            .unwrap(),
        )
    };
    // Holds: written, on both paths (a fractional number takes Postgres's locking path).
    let mut fractional = exec_event(&o.id, &p.id, sbx.id.as_str());
    fractional.detail = json!({"program": "python3", "ratio": 0.5});
    for e in [
        exec_event(&o.id, &p.id, sbx.id.as_str()),
        fractional.clone(),
    ] {
        let rec = s.append_audit_if(e, &guard).await.unwrap();
        assert_eq!(rec.map(|r| r.action), Some("sandbox.exec".to_owned()));
    }
    assert_eq!(execs().await, 2);
    // Not at that version, or no such row: nothing written.
    let stale = RowGuard {
        status_version: running.status_version - 1,
        ..guard.clone()
    };
    let missing = RowGuard {
        sandbox: differently_core::SandboxId::new(),
        ..guard.clone()
    };
    for g in [&stale, &missing] {
        for e in [
            exec_event(&o.id, &p.id, sbx.id.as_str()),
            fractional.clone(),
        ] {
            assert_eq!(s.append_audit_if(e, g).await.unwrap(), None, "{g:?}");
        }
    }
    // The row moves on (deleted): the guard taken while it ran no longer holds.
    s.transition(
        Transition {
            id: sbx.id.clone(),
            from: vec![SandboxStatus::Running],
            to: SandboxStatus::Terminating,
            reason: None,
            actor: Actor::System("test"),
        },
        Utc::now(),
    )
    .await
    .unwrap();
    for e in [exec_event(&o.id, &p.id, sbx.id.as_str()), fractional] {
        assert_eq!(s.append_audit_if(e, &guard).await.unwrap(), None);
    }
    assert_eq!(execs().await, 2, "refused appends wrote nothing");
    verify_ok(s).await;
}

/// A running sandbox for the staged-append cases, and a guard on it.
async fn running_guarded(
    s: &dyn Store,
    name: &str,
) -> (Org, Project, Sandbox, differently_store::audit::RowGuard) {
    use differently_core::SandboxStatus;
    use differently_store::audit::RowGuard;
    use differently_store::PoolSlot;

    let o = org(s, name).await;
    let p = project(s, &o.id).await;
    let sbx = admit(s, &o.id, &p.id).await;
    let pool = PoolSlot {
        name: "p".into(),
        max_concurrent: None,
    };
    s.activate(&sbx.id, &pool, &Quota::default(), Utc::now())
        .await
        .unwrap();
    let running = s.mark_running(&sbx.id, "ref-1", Utc::now()).await.unwrap();
    let guard = RowGuard {
        sandbox: running.id.clone(),
        status: SandboxStatus::Running,
        status_version: running.status_version,
    };
    (o, p, running, guard)
}

/// The data plane's split append (`stage_audit_if`): written in the chain's order once
/// committed, refused (nothing written) when the row moved, on both paths.
pub async fn a_staged_append_is_written_once_committed(env: &Env) {
    let s = env.store.as_ref();
    let (o, p, sbx, guard) = running_guarded(s, "staged").await;
    let mut fractional = exec_event(&o.id, &p.id, sbx.id.as_str());
    fractional.detail = json!({"program": "python3", "ratio": 0.5});
    let mut committed = vec![];
    for e in [
        exec_event(&o.id, &p.id, sbx.id.as_str()),
        fractional.clone(),
    ] {
        let staged = s
            .stage_audit_if(e, &guard)
            .await
            .unwrap()
            .expect("the row holds");
        let want = staged.record().clone();
        let rec = staged.commit().await.unwrap();
        assert_eq!(rec, want, "the record committed is the one staged");
        committed.push(rec);
    }
    assert_eq!(
        committed[1].chain_seq,
        committed[0].chain_seq + 1,
        "staged records take consecutive places"
    );
    let stale = differently_store::audit::RowGuard {
        status_version: guard.status_version - 1,
        ..guard.clone()
    };
    for e in [exec_event(&o.id, &p.id, sbx.id.as_str()), fractional] {
        assert!(s.stage_audit_if(e, &stale).await.unwrap().is_none());
    }
    let listed = exec_records(s, &sbx.id).await;
    assert_eq!(listed, committed);
    verify_ok(s).await;
}

/// A staged record dropped before its commit (the call it covered never answered) writes
/// nothing and does not hold the chain up: the next append takes its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_staged_append_dropped_uncommitted_writes_nothing() {
    let env = Env::postgres().await;
    let s = env.store.as_ref();
    let (o, p, sbx, guard) = running_guarded(s, "dropped").await;
    let staged = s
        .stage_audit_if(exec_event(&o.id, &p.id, sbx.id.as_str()), &guard)
        .await
        .unwrap()
        .expect("the row holds");
    let place = staged.record().chain_seq;
    drop(staged);
    let next = s
        .append_audit(exec_event(&o.id, &p.id, sbx.id.as_str()))
        .await
        .unwrap();
    assert_eq!(next.chain_seq, place, "the dropped record left no gap");
    let execs = exec_records(s, &sbx.id).await;
    assert_eq!(execs, vec![next]);
    verify_ok(s).await;
}

/// While a staged record commits, an append to the same chain from another process waits
/// for it and lands after it; a commit that fails (its connection killed) is an error, and
/// the record is not there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_staged_append_keeps_its_place_and_fails_closed() {
    let env = Env::postgres().await;
    let s = env.store.clone();
    let Backend::Postgres(db) = &env.backend else {
        unreachable!()
    };
    let (o, p, sbx, guard) = running_guarded(s.as_ref(), "place").await;
    let staged = s
        .stage_audit_if(exec_event(&o.id, &p.id, sbx.id.as_str()), &guard)
        .await
        .unwrap()
        .expect("the row holds");
    let other = env.reopen().await;
    let (o2, p2, id2) = (o.id.clone(), p.id.clone(), sbx.id.to_string());
    let racing = tokio::spawn(async move { other.append_audit(exec_event(&o2, &p2, &id2)).await });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(
        !racing.is_finished(),
        "the other append waits for the commit"
    );
    let first = staged.commit().await.unwrap();
    let second = racing.await.unwrap().unwrap();
    assert_eq!(second.chain_seq, first.chain_seq + 1);
    assert_eq!(second.prev_hash, first.hash);

    // A commit that cannot complete fails, and writes nothing.
    let staged = s
        .stage_audit_if(exec_event(&o.id, &p.id, sbx.id.as_str()), &guard)
        .await
        .unwrap()
        .expect("the row holds");
    let lost = staged.record().clone();
    // The staged transaction, not the one begun ahead for the next append (its only
    // statement so far is its BEGIN).
    let killed: Vec<(bool,)> = sqlx::query_as(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND state = 'idle in transaction'
           AND query NOT ILIKE 'BEGIN%'",
    )
    .fetch_all(db.store().pool())
    .await
    .unwrap();
    assert_eq!(
        killed,
        vec![(true,)],
        "exactly the staged transaction is open"
    );
    assert!(staged.commit().await.is_err(), "a lost commit is an error");
    let hashes: Vec<String> = export(s.as_ref())
        .await
        .into_iter()
        .map(|r| r.hash)
        .collect();
    assert!(!hashes.contains(&lost.hash), "the lost record is not there");
    verify_ok(s.as_ref()).await;
}

/// The backends idle in a transaction whose only statement is its `BEGIN`: the transaction
/// the store begins ahead of the next staged append.
async fn begun_ahead(db: &differently_store::postgres::PgStore) -> Vec<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity
         WHERE datname = current_database() AND state = 'idle in transaction'
           AND query ILIKE 'BEGIN%'",
    )
    .fetch_all(db.pool())
    .await
    .unwrap()
}

/// Waits up to 2 s for `begun_ahead` to show exactly one transaction.
async fn one_begun_ahead(db: &differently_store::postgres::PgStore) -> i32 {
    for _ in 0..200 {
        if let [pid] = begun_ahead(db).await[..] {
            return pid;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("no transaction was begun ahead of the next staged append");
}

/// A staged append leaves a transaction begun for the next one, which takes it (its swap is
/// its only round trip before the call); one whose session ended while it waited is replaced
/// without failing the append; and a quiet process gives it back within a few seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_staged_append_takes_the_transaction_begun_ahead() {
    let env = Env::postgres().await;
    let s = env.store.as_ref();
    let Backend::Postgres(db) = &env.backend else {
        unreachable!()
    };
    let db = db.store();
    let (o, p, sbx, guard) = running_guarded(s, "ahead").await;
    let stage = || async {
        s.stage_audit_if(exec_event(&o.id, &p.id, sbx.id.as_str()), &guard)
            .await
            .unwrap()
            .expect("the row holds")
    };
    let first = stage().await.commit().await.unwrap();

    let parked = one_begun_ahead(&db).await;
    let staged = stage().await;
    let holder: Vec<i32> = sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity
         WHERE datname = current_database() AND state = 'idle in transaction'
           AND query NOT ILIKE 'BEGIN%'",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert_eq!(
        holder,
        vec![parked],
        "the staged append took the transaction begun ahead"
    );
    let second = staged.commit().await.unwrap();
    assert_eq!(second.chain_seq, first.chain_seq + 1);

    // Its session ends while it waits (a database restart would do the same).
    let parked = one_begun_ahead(&db).await;
    let (ended,): (bool,) = sqlx::query_as("SELECT pg_terminate_backend($1)")
        .bind(parked)
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert!(ended);
    let third = stage().await.commit().await.unwrap();
    assert_eq!(
        third.chain_seq,
        second.chain_seq + 1,
        "the append still succeeded"
    );

    // A quiet process keeps no transaction open.
    one_begun_ahead(&db).await;
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert_eq!(
        begun_ahead(&db).await,
        Vec::<i32>::new(),
        "given back after a quiet second"
    );
    let execs = exec_records(s, &sbx.id).await;
    assert_eq!(execs, vec![first, second, third]);
    verify_ok(s).await;
}

/// The `sandbox.exec` records of sandbox `id`, in order.
async fn exec_records(
    s: &dyn differently_store::Store,
    id: &differently_core::SandboxId,
) -> Vec<differently_store::audit::AuditEvent> {
    s.list_audit(&AuditFilter {
        resource: Some(id.to_string()),
        action: Some("sandbox.exec".into()),
        ..Default::default()
    })
    .await
    .unwrap()
}
