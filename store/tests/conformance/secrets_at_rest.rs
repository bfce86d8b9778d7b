//! Secrets at rest and key lifetimes, against both stores: a sandbox that ends keeps no env
//! values, revoking a key revokes every key it made (and theirs), and, in Postgres with a
//! secrets key, env values are sealed in their row and never in its document.

use std::collections::BTreeMap;

use chrono::{TimeDelta, Utc};
use differently_core::tenancy::Scope;
use differently_core::{
    CreateSandboxRequest, KeyId, OrgId, Sandbox, SandboxId, SandboxSpec, SandboxStatus,
};
use differently_store::sealed::{self, SealKey};
use differently_store::testing::TestDb;
use differently_store::{Actor, Admission, Admitted, ApiKeyRecord, Quota, Store, Transition};
use sqlx::Row;

use crate::cases::{activated, pool, tenant};
use crate::Env;

macro_rules! at_rest_conformance {
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

at_rest_conformance!(
    ending_a_sandbox_clears_its_env_values,
    revoking_a_key_revokes_the_keys_it_made,
    a_key_made_by_a_revoked_key_is_born_revoked,
);

const VALUE: &str = "s3cret-env-value-4f1d";

fn env() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("TOKEN".to_owned(), VALUE.to_owned()),
        ("MODE".to_owned(), "fast".to_owned()),
    ])
}

async fn admit_with_env(s: &dyn Store, org: &OrgId, prj: &differently_core::ProjectId) -> Sandbox {
    let spec = SandboxSpec::build(&CreateSandboxRequest {
        env: Some(env()),
        ..Default::default()
    })
    .unwrap();
    let sbx = Sandbox::queued(org.clone(), prj.clone(), spec, None, Utc::now());
    let admitted = s
        .admit(Admission {
            request_id: None,
            direct: None,
            sandbox: sbx,
            request_hash: "h".into(),
            defaults: Quota::default(),
            actor: Actor::Key("key_test".into()),
        })
        .await
        .unwrap();
    match admitted {
        Admitted::New(x) => x,
        other => panic!("expected New, got {other:?}"),
    }
}

fn tr(id: &SandboxId, from: &[SandboxStatus], to: SandboxStatus) -> Transition {
    Transition {
        id: id.clone(),
        from: from.to_vec(),
        to,
        reason: None,
        actor: Actor::System("test"),
    }
}

async fn env_of(s: &dyn Store, id: &SandboxId) -> BTreeMap<String, String> {
    s.get_sandbox(id).await.unwrap().expect("sandbox").spec.env
}

fn names_only() -> BTreeMap<String, String> {
    env().into_keys().map(|k| (k, String::new())).collect()
}

pub async fn ending_a_sandbox_clears_its_env_values(env_: &Env) {
    let s = env_.store.as_ref();
    let (org, prj) = tenant(s).await;
    use SandboxStatus::*;

    // Deleted while queued.
    let a = admit_with_env(s, &org, &prj).await;
    assert_eq!(
        env_of(s, &a.id).await,
        env(),
        "a live sandbox keeps its values"
    );
    let done = s
        .transition(tr(&a.id, &[Queued], Terminated), Utc::now())
        .await
        .unwrap();
    assert_eq!(done.spec.env, names_only(), "the answer keeps names only");
    assert_eq!(env_of(s, &a.id).await, names_only(), "so does the row");

    // Failed after it was placed, and terminated through terminating.
    let p = pool("p", None);
    let b = admit_with_env(s, &org, &prj).await;
    activated(s, &b.id, &p, &Quota::default()).await;
    assert_eq!(env_of(s, &b.id).await, env());
    s.transition(tr(&b.id, &[Provisioning], Failed), Utc::now())
        .await
        .unwrap();
    assert_eq!(env_of(s, &b.id).await, names_only());

    let c = admit_with_env(s, &org, &prj).await;
    activated(s, &c.id, &p, &Quota::default()).await;
    s.transition(tr(&c.id, &[Provisioning], Terminating), Utc::now())
        .await
        .unwrap();
    assert_eq!(
        env_of(s, &c.id).await,
        env(),
        "terminating still holds them"
    );
    s.transition(tr(&c.id, &[Terminating], Terminated), Utc::now())
        .await
        .unwrap();
    assert_eq!(env_of(s, &c.id).await, names_only());
    // A retried delete finds the row ended and changes nothing.
    assert!(s
        .transition(tr(&c.id, &[Terminating], Terminated), Utc::now())
        .await
        .is_err());
    assert_eq!(env_of(s, &c.id).await, names_only());
}

fn key(org: &OrgId, name: &str) -> ApiKeyRecord {
    ApiKeyRecord {
        id: KeyId::new(),
        org_id: org.clone(),
        project_id: None,
        name: name.into(),
        scopes: vec![Scope::SandboxesRead, Scope::SandboxesWrite],
        hash: format!("hash-{name}"),
        created_at: Utc::now(),
        expires_at: None,
        revoked_at: None,
        last_used_at: None,
    }
}

fn by(k: &ApiKeyRecord) -> Actor {
    Actor::Key(k.id.to_string())
}

async fn revoked_at(s: &dyn Store, k: &ApiKeyRecord) -> Option<chrono::DateTime<Utc>> {
    s.get_key(&k.id).await.unwrap().expect("key").revoked_at
}

pub async fn revoking_a_key_revokes_the_keys_it_made(env_: &Env) {
    let s = env_.store.as_ref();
    let (org, _) = tenant(s).await;
    let operator = Actor::Key("key_operator".into());
    let parent = key(&org, "parent");
    s.create_key(&parent, &operator).await.unwrap();
    let child = key(&org, "child");
    s.create_key(&child, &by(&parent)).await.unwrap();
    let grandchild = key(&org, "grandchild");
    s.create_key(&grandchild, &by(&child)).await.unwrap();
    let sibling = key(&org, "sibling");
    s.create_key(&sibling, &operator).await.unwrap();

    let at = Utc::now();
    let answer = s.revoke_key(&parent.id, at, &operator).await.unwrap();
    assert_eq!(answer.revoked_at, Some(at));
    assert_eq!(revoked_at(s, &child).await, Some(at), "the key it made");
    assert_eq!(
        revoked_at(s, &grandchild).await,
        Some(at),
        "and the keys that one made"
    );
    assert_eq!(
        revoked_at(s, &sibling).await,
        None,
        "not a key made by another"
    );

    // Each revocation is on the audit chain, naming the key whose revocation caused it.
    let tail = s.audit_tail(10).await.unwrap();
    let cascaded: Vec<_> = tail
        .iter()
        .filter(|r| r.action == "key.revoke" && r.detail["because"] == parent.id.as_str())
        .map(|r| r.resource.clone())
        .collect();
    assert_eq!(cascaded.len(), 2, "{tail:?}");
    assert!(cascaded.contains(&child.id.to_string()));
    assert!(cascaded.contains(&grandchild.id.to_string()));

    // Revoking again keeps the first time, for the key and the keys below it.
    let later = at + TimeDelta::hours(1);
    let again = s.revoke_key(&parent.id, later, &operator).await.unwrap();
    assert_eq!(again.revoked_at, Some(at));
    assert_eq!(revoked_at(s, &grandchild).await, Some(at));
}

pub async fn a_key_made_by_a_revoked_key_is_born_revoked(env_: &Env) {
    let s = env_.store.as_ref();
    let (org, _) = tenant(s).await;
    let operator = Actor::Key("key_operator".into());
    let parent = key(&org, "parent");
    s.create_key(&parent, &operator).await.unwrap();
    let at = Utc::now();
    s.revoke_key(&parent.id, at, &operator).await.unwrap();
    // Another API process may still hold the parent's record for its cache's life.
    let late = key(&org, "late");
    s.create_key(&late, &by(&parent)).await.unwrap();
    assert_eq!(revoked_at(s, &late).await, Some(at));
}

/// The raw row of a sandbox: its document as text and its sealed env.
async fn raw(db: &TestDb, id: &SandboxId) -> (String, Option<Vec<u8>>) {
    let row = sqlx::query("SELECT doc::text AS doc, env_sealed FROM sandboxes WHERE id = $1")
        .bind(id.as_str())
        .fetch_one(db.store().pool())
        .await
        .unwrap();
    (row.get("doc"), row.get("env_sealed"))
}

fn holds(bytes: &[u8], needle: &str) -> bool {
    bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
}

fn ensure_seal_key() {
    let _ = sealed::set_process_key(SealKey::random().unwrap());
    assert!(sealed::process_key().is_some());
}

/// With a secrets key, a row's document holds env names only and its `env_sealed` a blob
/// that holds no value either; every read opens it, a blob moved onto another row does not
/// open, an ended sandbox keeps no blob, and start-up seals rows written in plaintext.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_values_are_sealed_in_postgres_under_the_secrets_key() {
    ensure_seal_key();
    let db = TestDb::new().await;
    let store = db.store();
    let s: &dyn Store = &store;
    let (org, prj) = tenant(s).await;

    let a = admit_with_env(s, &org, &prj).await;
    let (doc, blob) = raw(&db, &a.id).await;
    assert!(!doc.contains(VALUE), "the document holds a value: {doc}");
    assert!(doc.contains("TOKEN"), "the document keeps the names: {doc}");
    let blob = blob.expect("a sealed env");
    assert!(
        !holds(&blob, VALUE),
        "the blob holds the value in the clear"
    );
    assert_eq!(env_of(s, &a.id).await, env(), "reads open it");

    // Placing it rewrites the row: still sealed, still readable (the worker's read).
    let p = pool("p", None);
    let placed = activated(s, &a.id, &p, &Quota::default()).await;
    assert_eq!(placed.spec.env, env());
    let (doc, blob) = raw(&db, &a.id).await;
    assert!(!doc.contains(VALUE));
    assert!(blob.is_some_and(|b| !holds(&b, VALUE)));

    // A blob copied onto another row does not open there.
    let b = admit_with_env(s, &org, &prj).await;
    sqlx::query("UPDATE sandboxes SET env_sealed = (SELECT env_sealed FROM sandboxes WHERE id = $1) WHERE id = $2")
        .bind(a.id.as_str())
        .bind(b.id.as_str())
        .execute(store.pool())
        .await
        .unwrap();
    let err = s.get_sandbox(&b.id).await.unwrap_err().to_string();
    assert!(!err.contains(VALUE), "{err}");

    // Ended: no blob, no value.
    s.transition(
        tr(&a.id, &[SandboxStatus::Provisioning], SandboxStatus::Failed),
        Utc::now(),
    )
    .await
    .unwrap();
    let (doc, blob) = raw(&db, &a.id).await;
    assert!(!doc.contains(VALUE));
    assert_eq!(blob, None);

    // A row written in plaintext (before a key was configured) is sealed at start-up.
    let c = admit_with_env(s, &org, &prj).await;
    let plain = serde_json::to_value(s.get_sandbox(&c.id).await.unwrap().unwrap()).unwrap();
    sqlx::query("UPDATE sandboxes SET doc = $2, env_sealed = NULL WHERE id = $1")
        .bind(c.id.as_str())
        .bind(&plain)
        .execute(store.pool())
        .await
        .unwrap();
    assert!(
        raw(&db, &c.id).await.0.contains(VALUE),
        "the setup wrote plaintext"
    );
    assert_eq!(
        env_of(s, &c.id).await,
        env(),
        "a plaintext row reads as before"
    );
    store.migrate().await.unwrap();
    let (doc, blob) = raw(&db, &c.id).await;
    assert!(
        !doc.contains(VALUE),
        "start-up left the value in the document"
    );
    assert!(blob.is_some_and(|b| !holds(&b, VALUE)));
    assert_eq!(env_of(s, &c.id).await, env());
}
