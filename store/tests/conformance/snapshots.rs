//! Conformance of the snapshot listings: a sandbox's own snapshots page by id with a cursor,
//! the same from memory and Postgres.

use chrono::Utc;
use differently_core::{OrgId, ProjectId, SandboxId};
use differently_store::lifecycle::{SnapshotRecord, SnapshotStatus};

use crate::Env;

fn snapshot(org: &OrgId, prj: &ProjectId, sandbox: &SandboxId) -> SnapshotRecord {
    let now = Utc::now();
    SnapshotRecord {
        id: differently_core::ids::SnapshotId::new(),
        org_id: org.clone(),
        project_id: prj.clone(),
        sandbox_id: sandbox.clone(),
        pool: "fake".into(),
        name: None,
        status: SnapshotStatus::Ready,
        status_reason: None,
        backend_ref: None,
        created_at: now,
        updated_at: now,
    }
}

pub async fn a_sandboxs_snapshots_page_by_id(env: &Env) {
    let (org, prj) = crate::cases::tenant(env.store.as_ref()).await;
    let (mine, other) = (SandboxId::new(), SandboxId::new());
    let mut ids = Vec::new();
    for i in 0..5 {
        let s = snapshot(&org, &prj, &mine);
        env.store.insert_snapshot(&s).await.unwrap();
        ids.push(s.id.clone());
        if i % 2 == 0 {
            // Another sandbox's snapshots, interleaved, never show up.
            let o = snapshot(&org, &prj, &other);
            env.store.insert_snapshot(&o).await.unwrap();
        }
    }
    ids.sort();
    let page = |after: Option<differently_core::ids::SnapshotId>, limit| {
        let (store, mine) = (env.store.clone(), mine.clone());
        async move {
            store
                .list_sandbox_snapshots(&mine, after.as_ref(), limit)
                .await
                .unwrap()
                .into_iter()
                .map(|s| s.id)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(page(None, 100).await, ids);
    assert_eq!(page(None, 2).await, ids[..2]);
    assert_eq!(page(Some(ids[1].clone()), 2).await, ids[2..4]);
    assert_eq!(page(Some(ids[4].clone()), 2).await, Vec::new());
    assert_eq!(
        env.store
            .list_sandbox_snapshots(&SandboxId::new(), None, 10)
            .await
            .unwrap()
            .len(),
        0
    );
}

conformance!(snapshots; a_sandboxs_snapshots_page_by_id);
