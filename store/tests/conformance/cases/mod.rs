//! The cases, each written once over `&Env`, one file per concern; the helpers they share
//! are here. `main.rs` lists them (`conformance!(cases; …)`), found here through the
//! re-exports below.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use differently_core::resources::ResourcesRequest;
use differently_core::tenancy::{SandboxLimit, Scope};
use differently_core::KeyId;
use differently_core::{
    CreateSandboxRequest, OrgId, ProjectId, Sandbox, SandboxId, SandboxSpec, SandboxStatus,
};
use differently_store::{
    Activation, Actor, Admission, Admitted, ApiKeyRecord, Org, OrgStatus, PoolSlot, Project, Quota,
    QuotaScope, SandboxFilter, Store, StoreError, Transition, Usage,
};
use SandboxStatus::*;

use crate::Env;

mod activation;
mod admission;
mod sweeps;
mod tenancy;
mod transitions;

pub use activation::*;
pub use admission::*;
pub use sweeps::*;
pub use tenancy::*;
pub use transitions::*;

// ---------- helpers ----------

fn store(env: &Env) -> &dyn Store {
    env.store.as_ref()
}

pub(crate) async fn tenant(s: &dyn Store) -> (OrgId, ProjectId) {
    let org = Org {
        id: OrgId::new(),
        name: "acme".into(),
        status: OrgStatus::Active,
        created_at: Utc::now(),
    };
    let prj = project(s, &org).await;
    (org.id, prj)
}

async fn project(s: &dyn Store, org: &Org) -> ProjectId {
    let p = Project {
        id: ProjectId::new(),
        org_id: org.id.clone(),
        name: "default".into(),
        created_at: Utc::now(),
    };
    s.ensure_tenant(org, &p).await.unwrap();
    p.id
}

async fn another_project(s: &dyn Store, org: &OrgId) -> ProjectId {
    let org = Org {
        id: org.clone(),
        name: "acme".into(),
        status: OrgStatus::Active,
        created_at: Utc::now(),
    };
    project(s, &org).await
}

fn spec_with(cpu: u32, labels: &[(&str, &str)]) -> SandboxSpec {
    let req = CreateSandboxRequest {
        resources: Some(ResourcesRequest {
            cpu: Some(cpu),
            ..Default::default()
        }),
        labels: Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        ),
        ..Default::default()
    };
    SandboxSpec::build(&req).unwrap()
}

fn new_sandbox(org: &OrgId, prj: &ProjectId, key: Option<&str>) -> Sandbox {
    Sandbox::queued(
        org.clone(),
        prj.clone(),
        SandboxSpec::build(&CreateSandboxRequest::default()).unwrap(),
        key.map(str::to_owned),
        Utc::now(),
    )
}

fn admission(sandbox: Sandbox, hash: &str, max_queued: Option<u32>) -> Admission {
    Admission {
        request_id: None,
        direct: None,
        sandbox,
        request_hash: hash.into(),
        defaults: Quota {
            max_queued,
            ..Default::default()
        },
        actor: Actor::Key("key_test".into()),
    }
}

async fn admit_spec(s: &dyn Store, org: &OrgId, prj: &ProjectId, spec: SandboxSpec) -> Sandbox {
    let sbx = Sandbox::queued(org.clone(), prj.clone(), spec, None, Utc::now());
    match s.admit(admission(sbx, "h", None)).await.unwrap() {
        Admitted::New(x) => x,
        other => panic!("expected New, got {other:?}"),
    }
}

pub(crate) async fn admit(s: &dyn Store, org: &OrgId, prj: &ProjectId) -> Sandbox {
    admit_spec(s, org, prj, spec_with(1, &[])).await
}

pub(crate) fn pool(name: &str, cap: Option<u32>) -> PoolSlot {
    PoolSlot {
        name: name.into(),
        max_concurrent: cap,
    }
}

pub(crate) fn tr(id: &SandboxId, from: &[SandboxStatus], to: SandboxStatus) -> Transition {
    Transition {
        id: id.clone(),
        from: from.to_vec(),
        to,
        reason: None,
        actor: Actor::System("test"),
    }
}

pub(crate) async fn activated(s: &dyn Store, id: &SandboxId, p: &PoolSlot, q: &Quota) -> Sandbox {
    match s.activate(id, p, q, Utc::now()).await.unwrap() {
        Activation::Activated(x) => x,
        other => panic!("expected Activated, got {other:?}"),
    }
}

async fn waiting(s: &dyn Store, id: &SandboxId, p: &PoolSlot, q: &Quota) -> Sandbox {
    match s.activate(id, p, q, Utc::now()).await.unwrap() {
        Activation::Waiting(x, wall) => {
            // The typed wall and the reason a person reads always agree.
            let reason = x.status_reason.clone().unwrap_or_default();
            let want = if reason.starts_with("waiting: org") {
                differently_store::Wall::Org
            } else if reason.starts_with("waiting: project") {
                differently_store::Wall::Project
            } else {
                assert!(reason.starts_with("waiting: pool"), "{reason}");
                differently_store::Wall::Pool
            };
            assert_eq!(wall, want, "{reason}");
            x
        }
        other => panic!("expected Waiting, got {other:?}"),
    }
}

/// Drives an activated sandbox to `terminated`, releasing its capacity.
async fn terminate(s: &dyn Store, id: &SandboxId) {
    let now = Utc::now();
    s.transition(tr(id, &[Provisioning, Running], Terminating), now)
        .await
        .unwrap();
    s.transition(tr(id, &[Terminating], Terminated), now)
        .await
        .unwrap();
}

async fn get(s: &dyn Store, id: &SandboxId) -> Sandbox {
    s.get_sandbox(id).await.unwrap().expect("sandbox exists")
}

async fn audit_len(s: &dyn Store) -> usize {
    s.audit_tail(10_000).await.unwrap().len()
}

fn ids(v: &[Sandbox]) -> Vec<SandboxId> {
    v.iter().map(|s| s.id.clone()).collect()
}

// ---------- tenancy ----------

const ADMIN: &str = "key_admin";

fn admin() -> Actor {
    Actor::Key(ADMIN.into())
}

fn new_org(name: &str) -> Org {
    Org {
        id: OrgId::new(),
        name: name.into(),
        status: OrgStatus::Active,
        created_at: Utc::now(),
    }
}

async fn create_org(s: &dyn Store, name: &str) -> Org {
    let org = new_org(name);
    s.create_org(&org, &admin()).await.unwrap();
    org
}

fn new_project(org: &OrgId, name: &str) -> Project {
    Project {
        id: ProjectId::new(),
        org_id: org.clone(),
        name: name.into(),
        created_at: Utc::now(),
    }
}

async fn create_project(s: &dyn Store, org: &OrgId, name: &str) -> Project {
    let p = new_project(org, name);
    s.create_project(&p, &admin()).await.unwrap();
    p
}

fn new_key(org: &OrgId, project: Option<&ProjectId>, hash: &str) -> ApiKeyRecord {
    ApiKeyRecord {
        id: KeyId::new(),
        org_id: org.clone(),
        project_id: project.cloned(),
        name: "deploy key".into(),
        scopes: vec![Scope::SandboxesRead, Scope::SandboxesWrite],
        hash: hash.into(),
        created_at: Utc::now(),
        expires_at: Some(Utc::now() + TimeDelta::days(30)),
        revoked_at: None,
        last_used_at: None,
    }
}

fn already_exists(r: Result<impl std::fmt::Debug, StoreError>) -> String {
    match r {
        Err(StoreError::AlreadyExists(m)) => m,
        other => panic!("expected AlreadyExists, got {other:?}"),
    }
}

fn has_dependents(r: Result<impl std::fmt::Debug, StoreError>) -> String {
    match r {
        Err(StoreError::HasDependents(m)) => m,
        other => panic!("expected HasDependents, got {other:?}"),
    }
}

fn quota_exceeded(r: Result<Admitted, StoreError>) -> String {
    match r {
        Err(StoreError::QuotaExceeded(m)) => m,
        other => panic!("expected QuotaExceeded, got {other:?}"),
    }
}

/// A refusal of a sandbox that could never fit: (the request field, the message).
fn never_fits(r: Result<Admitted, StoreError>) -> (String, String) {
    match r {
        Err(StoreError::NeverFits(f)) => (f.field, f.message),
        other => panic!("expected NeverFits, got {other:?}"),
    }
}

fn defaults(q: Quota, sandbox: Sandbox) -> Admission {
    Admission {
        request_id: None,
        direct: None,
        sandbox,
        request_hash: "h".into(),
        defaults: q,
        actor: admin(),
    }
}

fn sandbox_of_cpu(org: &OrgId, prj: &ProjectId, cpu: u32) -> Sandbox {
    Sandbox::queued(
        org.clone(),
        prj.clone(),
        spec_with(cpu, &[]),
        None,
        Utc::now(),
    )
}

fn org_ids(v: &[Org]) -> Vec<OrgId> {
    v.iter().map(|o| o.id.clone()).collect()
}

fn snapshot_of(sbx: &Sandbox) -> differently_store::lifecycle::SnapshotRecord {
    let now = Utc::now();
    differently_store::lifecycle::SnapshotRecord {
        id: differently_core::ids::SnapshotId::new(),
        org_id: sbx.org_id.clone(),
        project_id: sbx.project_id.clone(),
        sandbox_id: sbx.id.clone(),
        pool: "p".into(),
        name: None,
        status: differently_store::lifecycle::SnapshotStatus::Ready,
        status_reason: None,
        backend_ref: Some("snap-1".into()),
        created_at: now,
        updated_at: now,
    }
}

fn outcome_kind(r: &Result<Admitted, StoreError>) -> String {
    match r {
        Ok(Admitted::New(_)) => "new".into(),
        Ok(Admitted::Replayed(x)) => format!("replayed {}", x.id),
        Err(StoreError::QuotaExceeded(m)) => format!("quota: {m}"),
        Err(e) => format!("{e:?}"),
    }
}

// ---------- direct placement (admission that also activates) ----------

fn direct(sandbox: Sandbox, max_active: u32, pool_name: &str, cap: Option<u32>) -> Admission {
    let mut a = admission(sandbox, "h", None);
    a.defaults.max_active = Some(max_active);
    a.direct = Some(differently_store::DirectPlacement {
        pool: pool(pool_name, cap),
        explanation: serde_json::json!({ "by": "test", "pool": pool_name }),
        warm_class: None,
        claim_call: false,
    });
    a
}

fn new_of(r: Result<Admitted, StoreError>) -> Sandbox {
    match r {
        Ok(Admitted::New(x)) => x,
        other => panic!("expected New, got {other:?}"),
    }
}
