//! The instance's life: health, create (idempotent, ready), find, list, pause and stop
//! round trips, and delete (idempotent, gone everywhere).

use std::time::{Duration, Instant};

use differently_core::ids::InstallationId;
use differently_core::SandboxId;

use super::support::{cmd, exec, expect_eq, expect_kind, kind, spec, verb, Ctx, Verb};
use crate::{Adapter, Instance, InstanceState};

/// The backend answers its health probe.
pub(super) async fn health(a: &dyn Adapter) -> Result<String, String> {
    a.health()
        .await
        .map(|()| "answers".to_owned())
        .map_err(|e| format!("{} ({e})", kind(&e)))
}

/// Creates the instance the other checks use; it must be running or pending.
pub(super) async fn create(
    a: &dyn Adapter,
    id: &SandboxId,
    installation: &InstallationId,
) -> Result<Instance, String> {
    let i = a
        .create(&spec(id, installation))
        .await
        .map_err(|e| format!("{} ({e})", kind(&e)))?;
    expect_eq("sandboxId", id, &i.sandbox_id)?;
    if !matches!(i.state, InstanceState::Running | InstanceState::Pending) {
        return Err(format!(
            "a new instance is {:?}, not running or pending",
            i.state
        ));
    }
    Ok(i)
}

/// A second create of the same id answers the same instance.
pub(super) async fn create_idempotent(cx: &Ctx<'_>) -> Result<String, String> {
    let a = cx.a;
    let id = &cx.id;
    let installation = &cx.installation;
    let again = a
        .create(&spec(id, installation))
        .await
        .map_err(|e| format!("{} ({e})", kind(&e)))?;
    expect_eq(
        "the second create's backendRef",
        &cx.at.backend_ref,
        &again.backend_ref,
    )?;
    Ok("a second create answers the same instance".to_owned())
}

/// A pending instance becomes running.
pub(super) async fn create_ready(cx: &Ctx<'_>) -> Result<String, String> {
    let a = cx.a;
    let id = &cx.id;
    let deadline = Instant::now() + Duration::from_secs(50);
    loop {
        match a.find(id).await {
            Ok(Some(i)) if i.state == InstanceState::Running => return Ok("running".to_owned()),
            Ok(Some(i)) if i.state == InstanceState::Pending && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(250)).await
            }
            Ok(other) => return Err(format!("expected a running instance, found {other:?}")),
            Err(e) => return Err(format!("find: {} ({e})", kind(&e))),
        }
    }
}

/// The instance is found; an unknown id is none.
pub(super) async fn find(cx: &Ctx<'_>) -> Result<String, String> {
    let a = cx.a;
    let id = &cx.id;
    let got = a
        .find(id)
        .await
        .map_err(|e| format!("{} ({e})", kind(&e)))?;
    let got = got.ok_or("the instance just created is not found")?;
    expect_eq("backendRef", &cx.at.backend_ref, &got.backend_ref)?;
    let missing = a
        .find(&SandboxId::new())
        .await
        .map_err(|e| format!("find of an unknown id: {} ({e})", kind(&e)))?;
    expect_eq("find of an unknown id", None, missing)?;
    Ok("finds it; an unknown id is none".to_owned())
}

/// Listing is per installation.
pub(super) async fn list(cx: &Ctx<'_>) -> Result<String, String> {
    let a = cx.a;
    let id = &cx.id;
    let installation = &cx.installation;
    let mine = a
        .list(installation)
        .await
        .map_err(|e| format!("{} ({e})", kind(&e)))?;
    if !mine.iter().any(|i| i.sandbox_id == *id) {
        return Err(format!("list of its installation lacks it: {mine:?}"));
    }
    let other = a
        .list(&InstallationId::new())
        .await
        .map_err(|e| format!("{} ({e})", kind(&e)))?;
    if other.iter().any(|i| i.sandbox_id == *id) {
        return Err("list of another installation has it".to_owned());
    }
    Ok(format!(
        "{} instance(s) of this installation; none of another",
        mine.len()
    ))
}

/// A way down and back up (pause and resume, stop and start), and the state between.
#[derive(Clone, Copy)]
pub(super) struct Cycle {
    pub(super) down: Verb,
    pub(super) up: Verb,
    pub(super) state: InstanceState,
    pub(super) down_name: &'static str,
    pub(super) up_name: &'static str,
}

/// Down and up again, each twice (idempotent), with the state after each and an exec after.
pub(super) async fn down_and_up(cx: &Ctx<'_>, cycle: &Cycle) -> Result<String, String> {
    let Cycle {
        down,
        up,
        state,
        down_name,
        up_name,
    } = *cycle;
    let a = cx.a;
    let at = &cx.at;
    let id = &cx.id;
    verb(a, at, down)
        .await
        .map_err(|e| format!("{down_name}: {} ({e})", kind(&e)))?;
    verb(a, at, down)
        .await
        .map_err(|e| format!("{down_name} again (must be idempotent): {} ({e})", kind(&e)))?;
    let s = a
        .find(id)
        .await
        .map_err(|e| format!("find: {e}"))?
        .map(|i| i.state);
    expect_eq(&format!("state after {down_name}"), Some(state), s)?;
    verb(a, at, up)
        .await
        .map_err(|e| format!("{up_name}: {} ({e})", kind(&e)))?;
    verb(a, at, up)
        .await
        .map_err(|e| format!("{up_name} again (must be idempotent): {} ({e})", kind(&e)))?;
    let s = a
        .find(id)
        .await
        .map_err(|e| format!("find: {e}"))?
        .map(|i| i.state);
    expect_eq(
        &format!("state after {up_name}"),
        Some(InstanceState::Running),
        s,
    )?;
    expect_eq(
        &format!("exec after {up_name}"),
        0,
        exec(a, at, cmd(&["true"]).command).await?.exit_code,
    )?;
    Ok(format!(
        "{down_name} → {state:?} → {up_name} → running, each idempotent"
    ))
}

/// Delete, twice; then it is gone everywhere.
pub(super) async fn delete(cx: &Ctx<'_>) -> Result<String, String> {
    let a = cx.a;
    let at = &cx.at;
    let id = &cx.id;
    let installation = &cx.installation;
    a.delete(id)
        .await
        .map_err(|e| format!("{} ({e})", kind(&e)))?;
    a.delete(id)
        .await
        .map_err(|e| format!("delete again (must succeed): {} ({e})", kind(&e)))?;
    let found = a
        .find(id)
        .await
        .map_err(|e| format!("find: {} ({e})", kind(&e)))?;
    expect_eq("find after delete", None, found)?;
    let listed = a
        .list(installation)
        .await
        .map_err(|e| format!("list: {} ({e})", kind(&e)))?;
    if listed.iter().any(|i| i.sandbox_id == *id) {
        return Err("list still has the deleted instance".to_owned());
    }
    expect_kind(
        "exec after delete",
        "not_found",
        a.exec(at, &cmd(&["true"])).await,
    )?;
    Ok("gone from find and list; exec is not_found; delete is idempotent".to_owned())
}
