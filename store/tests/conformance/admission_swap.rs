//! Lone admissions decided in one statement (`admission_swap`, migration 0019) racing across
//! processes with the lane and with terminations, against one org's quotas.

use std::sync::Arc;

use chrono::Utc;
use differently_core::SandboxStatus::{Provisioning, Queued, Terminated};
use differently_core::{CreateSandboxRequest, Sandbox, SandboxSpec};
use differently_store::audit::AuditStore;
use differently_store::postgres::PgStore;
use differently_store::testing::TestDb;
use differently_store::{
    Actor, Admission, AdmissionStore, Admitted, DirectPlacement, Quota, QuotaScope, StoreError,
    TransitionStore, UsageStore,
};

use crate::cases::{admit, pool, tenant, tr};

/// Three API processes create 36 sandboxes of one org at once, each placed in its admission
/// when nothing waits. The org's limits hold whatever interleaves (at least the first and
/// at most 4 placed, at most 6 queued, the rest refused as over quota), every record is
/// chained once, and the counters match the rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lone_admissions_racing_across_processes_keep_the_quotas_and_the_chains() {
    let db = TestDb::new().await;
    let apis: Vec<Arc<PgStore>> = vec![
        Arc::new(db.store()),
        Arc::new(PgStore::connect(db.url(), 4).await.unwrap()),
        Arc::new(PgStore::connect(db.url(), 4).await.unwrap()),
    ];
    let first = apis[0].clone();
    let (org, prj) = tenant(first.as_ref()).await;
    // Sandboxes until every chain of the org likely has a head (a chain's first record
    // takes the lane), ended before the race.
    for _ in 0..24 {
        let id = admit(first.as_ref(), &org, &prj).await.id;
        first
            .transition(tr(&id, &[Queued], Terminated), Utc::now())
            .await
            .unwrap();
    }
    let limits = Quota {
        max_active: Some(4),
        max_queued: Some(6),
        ..Quota::default()
    };
    first
        .put_quota(
            &QuotaScope::Org(org.clone()),
            &limits,
            &Actor::System("test"),
        )
        .await
        .unwrap();
    let spec = SandboxSpec::build(&CreateSandboxRequest::default()).unwrap();
    let mut creates = Vec::new();
    for i in 0..36 {
        let api = apis[i % apis.len()].clone();
        let a = Admission {
            request_id: None,
            direct: Some(DirectPlacement {
                pool: pool("p", None),
                explanation: serde_json::json!({ "pool": "p" }),
                warm_class: None,
                claim_call: false,
            }),
            sandbox: Sandbox::queued(
                org.clone(),
                prj.clone(),
                spec.clone(),
                Some(format!("k{i}")),
                Utc::now(),
            ),
            request_hash: "h".into(),
            defaults: Quota::default(),
            actor: Actor::System("test"),
        };
        creates.push(tokio::spawn(async move { api.admit(a).await }));
    }
    let (mut placed, mut queued, mut refused) = (0, 0, 0);
    for c in creates {
        match c.await.unwrap() {
            Ok(Admitted::New(s)) if s.status == Provisioning => placed += 1,
            Ok(Admitted::New(s)) if s.status == Queued => queued += 1,
            Err(StoreError::QuotaExceeded(_)) => refused += 1,
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    assert!((1..=4).contains(&placed), "placed {placed}");
    assert_eq!(placed + queued + refused, 36);
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT status, count(*) FROM sandboxes WHERE org_id = $1 GROUP BY status")
            .bind(org.as_str())
            .fetch_all(first.pool())
            .await
            .unwrap();
    let count = |s: &str| rows.iter().find(|r| r.0 == s).map_or(0, |r| r.1);
    assert_eq!(count("provisioning"), placed);
    assert_eq!(count("queued"), queued);
    assert!(queued <= 6, "queued {queued} over the org's queue limit");
    let swaps: u64 = apis.iter().map(|a| a.admission_swaps().done).sum();
    assert!(swaps > 0, "no admission was decided in one statement");
    let report = first.verify_audit().await.unwrap();
    assert!(report.ok, "{report:?}");
    assert_eq!(
        first.reconcile_usage().await.unwrap(),
        vec![],
        "counters drifted"
    );
    eprintln!(
        "placed {placed}, queued {queued}, refused {refused}; one-statement: {:?}",
        apis.iter().map(|a| a.admission_swaps()).collect::<Vec<_>>()
    );
}
