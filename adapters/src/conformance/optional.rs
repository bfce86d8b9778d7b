//! Optional capabilities: snapshots, exposed ports, warm instances.

use std::time::{Duration, Instant};

use differently_core::SandboxId;

use super::support::{exec, expect_eq, kind, spec, Ctx};
use crate::InstanceRef;

/// A snapshot is taken (idempotent), restored from into `restored`, and deleted twice.
pub(super) async fn snapshots(cx: &Ctx<'_>, restored: &SandboxId) -> Result<String, String> {
    let a = cx.a;
    let at = &cx.at;
    let id = &cx.id;
    let installation = &cx.installation;
    let snap_id = format!("snp_conformance{}", id.as_str().to_ascii_lowercase());
    let deadline = Instant::now() + Duration::from_secs(45);
    let info = loop {
        let s = a
            .snapshot(at, &snap_id)
            .await
            .map_err(|e| format!("snapshot: {} ({e})", kind(&e)))?;
        if s.ready {
            break s;
        }
        if Instant::now() > deadline {
            return Err("the snapshot never became ready".to_owned());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let again = a
        .snapshot(at, &snap_id)
        .await
        .map_err(|e| format!("snapshot again: {} ({e})", kind(&e)))?;
    expect_eq(
        "the same snapshot id's backendRef",
        &info.backend_ref,
        &again.backend_ref,
    )?;
    let mut req = spec(restored, installation);
    req.from_snapshot = Some(info.backend_ref.clone());
    a.create(&req)
        .await
        .map_err(|e| format!("create from the snapshot: {} ({e})", kind(&e)))?;
    a.delete(restored)
        .await
        .map_err(|e| format!("delete the restored instance: {} ({e})", kind(&e)))?;
    a.delete_snapshot(&info.backend_ref)
        .await
        .map_err(|e| format!("delete snapshot: {} ({e})", kind(&e)))?;
    a.delete_snapshot(&info.backend_ref).await.map_err(|e| {
        format!(
            "delete a deleted snapshot (must succeed): {} ({e})",
            kind(&e)
        )
    })?;
    Ok("taken (idempotent), restored from, deleted twice".to_owned())
}

/// An exposed port is an http(s) URL, not yet expired.
pub(super) async fn ports_expose(cx: &Ctx<'_>) -> Result<String, String> {
    let a = cx.a;
    let at = &cx.at;
    let e = a
        .expose_port(at, 8080, Some(Duration::from_secs(600)))
        .await
        .map_err(|e| format!("{} ({e})", kind(&e)))?;
    if !(e.url.starts_with("https://") || e.url.starts_with("http://")) {
        return Err(format!("not an http(s) URL: {}", e.url));
    }
    if e.expires_at.is_some_and(|t| t <= chrono::Utc::now()) {
        return Err("the URL has already expired".to_owned());
    }
    Ok("an http(s) URL, not expired".to_owned())
}

/// A warm instance is made with no env, found by its id, claimed twice, and runs.
pub(super) async fn warm(cx: &Ctx<'_>) -> Result<String, String> {
    let a = cx.a;
    let installation = &cx.installation;
    let warm = SandboxId::new();
    let mut req = spec(&warm, installation);
    req.env.clear();
    let made = a
        .create(&req)
        .await
        .map_err(|e| format!("create with no env: {} ({e})", kind(&e)))?;
    let outcome = async {
        expect_eq("created instance's sandbox id", &warm, &made.sandbox_id)?;
        let found = a
            .find(&warm)
            .await
            .map_err(|e| format!("find: {} ({e})", kind(&e)))?
            .ok_or("find does not return the warm instance")?;
        expect_eq("found backend ref", &made.backend_ref, &found.backend_ref)?;
        let at = InstanceRef {
            sandbox_id: warm.clone(),
            backend_ref: made.backend_ref.clone(),
        };
        a.claim(&at, 600)
            .await
            .map_err(|e| format!("claim: {} ({e})", kind(&e)))?;
        a.claim(&at, 600)
            .await
            .map_err(|e| format!("claim again (must succeed): {} ({e})", kind(&e)))?;
        let ran = exec(a, &at, vec!["true".to_owned()]).await?;
        expect_eq("exit code of `true` after the claim", 0, ran.exit_code)?;
        Ok::<_, String>(())
    }
    .await;
    let deleted = a.delete(&warm).await;
    outcome?;
    deleted.map_err(|e| format!("delete: {} ({e})", kind(&e)))?;
    Ok("made with no env, found by its id, claimed twice, runs".to_owned())
}
