//! The rows a process remembers for the data plane: they serve execs only while they hold, and
//! a delete of one that moved goes by a fresh read.

use std::time::Duration;

use differently_adapters::fake::LedgerOp;
use differently_core::SandboxStatus;
use serde_json::json;

use crate::harness::{Cluster, Opts};

use super::{post, running};

/// The second exec on a sandbox uses the row the first one read (its audit record guarded on
/// that row); once the sandbox moves on, a call is refused however recently its row was read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remembered_row_serves_execs_only_while_it_holds() {
    // The fake pool only, so its ledger witnesses every exec that reached a backend.
    let c = Cluster::started(Opts::default()).await;
    let id = running(&c, json!({})).await;
    let path = format!("/v1/sandboxes/{id}/exec");
    let exec = |n: &str| {
        post(
            &c,
            &path,
            json!({"command": ["echo", n], "timeoutSeconds": 10}),
        )
    };
    for n in ["1", "2", "3"] {
        let (s, out) = exec(n).await;
        assert_eq!(
            (s, out["stdout"].as_str()),
            (200, Some(&*format!("{n}\n"))),
            "{out}"
        );
    }
    let (s, _) = c.delete(&id).await;
    assert_eq!(s, 202);
    // At once: the deletion's event may not have reached the API yet; the guard refuses.
    let (s, refused) = exec("4").await;
    assert_eq!(s, 409, "{refused}");
    let execs = c
        .ledger()
        .iter()
        .filter(|e| e.op == LedgerOp::Exec && e.sandbox_id.as_ref() == Some(&id))
        .count();
    assert_eq!(execs, 3, "the refused exec never reached the backend");
    let items = crate::audit::records_of(&c, &id, "sandbox.exec").await;
    assert_eq!(items.len(), 3, "one record per exec that ran: {items:?}");
    let report = crate::audit::verify(&c).await;
    assert_eq!(report["ok"], true, "{report}");
}
/// A delete first tries the row this process remembers running, without reading it; a row that
/// moved behind that memory is refused by the change's compare-and-set and deleted from a
/// fresh read, so the record says where it really came from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_of_a_remembered_row_that_moved_deletes_it_from_a_fresh_read() {
    let c = Cluster::started(Opts::default()).await;
    let id = running(&c, json!({})).await;
    let (s, out) = post(
        &c,
        &format!("/v1/sandboxes/{id}/exec"),
        json!({"command": ["echo", "hi"], "timeoutSeconds": 10}),
    )
    .await;
    assert_eq!(s, 200, "{out}");
    // Stopped behind the API's back: no event tells it, so it still remembers `running`.
    let moved = sqlx::query(
        "UPDATE sandboxes SET status = 'stopped', status_version = status_version + 1,
             doc = jsonb_set(jsonb_set(doc, '{status}', '\"stopped\"'),
                             '{statusVersion}', to_jsonb(status_version + 1))
         WHERE id = $1 AND status = 'running'",
    )
    .bind(id.to_string())
    .execute(c.db.store().pool())
    .await
    .expect("stop the row")
    .rows_affected();
    assert_eq!(moved, 1);
    let (s, body) = c.delete(&id).await;
    assert_eq!(
        (s, body["status"].as_str()),
        (202, Some("terminating")),
        "{body}"
    );
    let done = c
        .wait_status(&id, SandboxStatus::Terminated, Duration::from_secs(30))
        .await;
    // The worker deleted from the work message alone and kept the reason it carried.
    assert_eq!(done["statusReason"], "deleted", "{done}");
    let items = crate::audit::records_of(&c, &id, "sandbox.terminating").await;
    assert_eq!(items.len(), 1, "{items:?}");
    assert_eq!(items[0]["detail"]["from"], "stopped", "{items:?}");
    let report = crate::audit::verify(&c).await;
    assert_eq!(report["ok"], true, "{report}");
}
