//! Operations on a running sandbox executed by workers: pause and resume settle once,
//! and a snapshot is ready, or deleted, only when the backend says so.

use super::*;

/// Begins operation `kind` on `s` the way the API does and publishes its work `times` times
/// (each a distinct message, as a repair re-send is); returns the operation record.
async fn operate(
    p: &Plane,
    s: &Sandbox,
    kind: WorkOp,
    times: usize,
) -> differently_store::lifecycle::OpRecord {
    operate_with(p, s, kind, true, serde_json::json!({}), times).await
}

/// [`operate`] with the operation's exclusivity and arguments.
async fn operate_with(
    p: &Plane,
    s: &Sandbox,
    kind: WorkOp,
    exclusive: bool,
    args: serde_json::Value,
    times: usize,
) -> differently_store::lifecycle::OpRecord {
    use differently_store::lifecycle::{OpBegun, OpRecord};
    let record = OpRecord::new(
        s,
        kind.as_str(),
        exclusive,
        args,
        "key:key_test".into(),
        Utc::now(),
    );
    let OpBegun::New(record) = p.store.begin_op(&record).await.expect("begin") else {
        panic!("another operation is pending on {}", s.id);
    };
    for n in 0..times {
        p.announcer
            .op(s, "fake", kind, record.id.as_str(), &format!(":{n}"))
            .await
            .expect("publish the operation");
    }
    record
}

/// Waits until operation `id` is no longer pending; returns it.
async fn finished(
    p: &Plane,
    id: &differently_core::ids::OpId,
) -> differently_store::lifecycle::OpRecord {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let op = p.store.get_op(id).await.expect("read").expect("op exists");
        if op.state != differently_store::lifecycle::OpState::Pending {
            return op;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "operation {id} still pending"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A worker executes a pause and a resume as operations: the row moves, the operation is
/// recorded done, and an operation delivered three times (a lost ack, a repair re-send)
/// settles once: one `paused` event, one outcome. Deliveries of one operation are executed
/// one at a time in a process (a late duplicate once re-paused the backend after the resume,
/// and the reconciler then followed it); across processes the contract's idempotent
/// lifecycle calls and the record's state settle them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_operations_settle_once_however_often_they_are_delivered() {
    let p = plane(
        serde_json::json!({"capabilities": ["exec", "lifecycle.pause"]}),
        WorkerConfig::default(),
    )
    .await;
    let s = p.admit(serde_json::json!({})).await;
    let running = p.reaches(&s.id, Running).await;
    let pause = operate(&p, &running, WorkOp::Pause, 3).await;
    let paused = p.reaches(&s.id, Paused).await;
    assert_eq!(
        finished(&p, &pause.id).await.state,
        differently_store::lifecycle::OpState::Done
    );
    let resume = operate(&p, &paused, WorkOp::Resume, 1).await;
    let resumed_at = {
        // The running event after the pause: wait for the second `running`.
        let mut events = p.statuses(&s.id).await;
        let mut runs = 0;
        tokio::time::timeout(WAIT, async {
            while let Some(st) = events.next().await {
                if st == Running {
                    runs += 1;
                    if runs == 2 {
                        break;
                    }
                }
            }
        })
        .await
        .expect("running again");
        p.row(&s.id).await
    };
    assert_eq!(resumed_at.status, Running);
    assert_eq!(
        finished(&p, &resume.id).await.state,
        differently_store::lifecycle::OpState::Done
    );
    let mut events = p.statuses(&s.id).await;
    let mut seen = Vec::new();
    while let Ok(Some(st)) = tokio::time::timeout(Duration::from_millis(300), events.next()).await {
        seen.push(st);
    }
    assert_eq!(
        seen.iter().filter(|st| **st == Paused).count(),
        1,
        "three deliveries of one pause moved the row once: {seen:?}"
    );
    let ledger = read_ledger(&p.ledger).unwrap_or_default();
    let pauses: Vec<_> = ledger
        .iter()
        .filter(|e| {
            e.sandbox_id.as_ref() == Some(&s.id)
                && e.op == differently_adapters::fake::LedgerOp::Pause
        })
        .collect();
    assert!(
        (1..=3).contains(&pauses.len()),
        "one to three backend pauses, never more than deliveries: {pauses:?}"
    );
}

/// Records a snapshot of `running` and starts taking it, as the API does.
async fn take_snapshot(
    p: &Plane,
    running: &Sandbox,
) -> (
    differently_store::lifecycle::SnapshotRecord,
    differently_store::lifecycle::OpRecord,
) {
    use differently_store::lifecycle::{SnapshotRecord, SnapshotStatus};
    let now = Utc::now();
    let snap = SnapshotRecord {
        id: differently_core::ids::SnapshotId::new(),
        org_id: running.org_id.clone(),
        project_id: running.project_id.clone(),
        sandbox_id: running.id.clone(),
        pool: "fake".into(),
        name: None,
        status: SnapshotStatus::Creating,
        status_reason: None,
        backend_ref: None,
        created_at: now,
        updated_at: now,
    };
    p.store.insert_snapshot(&snap).await.expect("snapshot row");
    let args = serde_json::json!({ "snapshotId": snap.id });
    let record = operate_with(p, running, WorkOp::Snapshot, true, args, 1).await;
    (snap, record)
}

/// A snapshot the backend is still writing stays `creating` (so a fork of it is refused
/// until then) and its operation pending; the worker asks again until the backend says
/// ready, and only then is it `ready` and the operation done. (Against a real OpenSandbox
/// the worker marked it ready on the first answer, and an immediate fork failed for good
/// with `SNAPSHOT::NOT_READY`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_is_ready_only_when_the_backend_says_so() {
    use differently_store::lifecycle::{OpState, SnapshotStatus};
    let p = plane(
        serde_json::json!({"capabilities": ["exec", "snapshots"], "snapshotReadyAfter": 3}),
        WorkerConfig::default(),
    )
    .await;
    let s = p.admit(serde_json::json!({})).await;
    let running = p.reaches(&s.id, Running).await;
    let (snap, record) = take_snapshot(&p, &running).await;

    // Seen not ready at least once: still creating, operation pending, backend ref known.
    let deadline = tokio::time::Instant::now() + WAIT;
    let seen_creating = loop {
        let row = p
            .store
            .get_snapshot(&snap.id)
            .await
            .expect("read")
            .expect("row");
        if row.backend_ref.is_some() {
            break row;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the worker never asked"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(
        seen_creating.status,
        SnapshotStatus::Creating,
        "{seen_creating:?}"
    );
    let done = finished(&p, &record.id).await;
    assert_eq!(done.state, OpState::Done, "{done:?}");
    let ready = p
        .store
        .get_snapshot(&snap.id)
        .await
        .expect("read")
        .expect("row");
    assert_eq!(ready.status, SnapshotStatus::Ready);
    let asked = read_ledger(&p.ledger)
        .unwrap_or_default()
        .iter()
        .filter(|e| e.op == differently_adapters::fake::LedgerOp::Snapshot)
        .count();
    assert_eq!(asked, 4, "three answers not ready, then ready");
}

/// A snapshot delete the backend refuses for a while (OpenSandbox's 409 DELETE_CONFLICT
/// while a fork of it runs) is not given up after `max_deliveries`: the snapshot stays
/// `deleting` saying why, and the delete is retried until the backend confirms, when the
/// record goes. (Against a real OpenSandbox, the worker gave up after 3 tries in 3 s and the
/// snapshot stayed `deleting` with nothing re-sending it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_snapshot_delete_is_retried_until_the_backend_confirms() {
    use differently_store::lifecycle::{OpState, SnapshotStatus};
    let workers = WorkerConfig {
        max_deliveries: 1,
        ..WorkerConfig::default()
    };
    let p = plane(
        serde_json::json!({"capabilities": ["exec", "snapshots"], "refuseSnapshotDeletes": 2}),
        workers,
    )
    .await;
    let s = p.admit(serde_json::json!({})).await;
    let running = p.reaches(&s.id, Running).await;
    let (mut snap, take) = take_snapshot(&p, &running).await;
    assert_eq!(finished(&p, &take.id).await.state, OpState::Done);

    // Delete it, as the API does: `deleting`, then the (non-exclusive) operation.
    snap = p
        .store
        .get_snapshot(&snap.id)
        .await
        .expect("read")
        .expect("row");
    snap.status = SnapshotStatus::Deleting;
    p.store.update_snapshot(&snap).await.expect("deleting");
    let args = serde_json::json!({ "snapshotId": snap.id });
    let delete = operate_with(&p, &running, WorkOp::DeleteSnapshot, false, args, 1).await;

    // While refused: still deleting, and it says why.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let row = p.store.get_snapshot(&snap.id).await.expect("read");
        if let Some(row) = row.filter(|r| r.status_reason.is_some()) {
            assert_eq!(row.status, SnapshotStatus::Deleting);
            assert!(
                row.status_reason
                    .as_deref()
                    .is_some_and(|r| r.contains("in use")),
                "{row:?}"
            );
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never refused");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let done = finished(&p, &delete.id).await;
    assert_eq!(done.state, OpState::Done, "{done:?}");
    assert!(
        p.store
            .get_snapshot(&snap.id)
            .await
            .expect("read")
            .is_none(),
        "the record goes once the backend confirms"
    );
}

/// A placement and a snapshot's life are public events: `placement.decided` (pool, attempt,
/// cause `quota`) when the leader activates the sandbox, `snapshot.created` once the backend
/// says it is ready and `snapshot.deleted` once it confirms the delete, both attributed like
/// the operation that asked (its key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placement_and_a_snapshots_life_are_public_events() {
    use differently_bus_schema::EventData;
    use differently_store::lifecycle::{OpState, SnapshotStatus};
    let p = plane(
        serde_json::json!({"capabilities": ["exec", "snapshots"]}),
        WorkerConfig::default(),
    )
    .await;
    let s = p.admit(serde_json::json!({})).await;
    let running = p.reaches(&s.id, Running).await;
    let placed = p.public_until(&s.id, "placement.decided").await;
    let decided = placed.last().expect("the event");
    let EventData::PlacementDecided(d) = &decided.data else {
        panic!("{decided:?}");
    };
    assert_eq!((d.pool.as_str(), d.attempt), ("fake", 1), "{decided:?}");
    assert_eq!(decided.cause, differently_bus_schema::Cause::Quota);
    assert_eq!(
        placed
            .iter()
            .filter(|e| e.event_type().as_str() == "placement.decided")
            .count(),
        1,
        "one placement, one event"
    );

    let (mut snap, take) = take_snapshot(&p, &running).await;
    assert_eq!(finished(&p, &take.id).await.state, OpState::Done);
    let created = p.public_until(&s.id, "snapshot.created").await;
    let created = created.last().expect("the event");
    let EventData::SnapshotCreated(c) = &created.data else {
        panic!("{created:?}");
    };
    assert_eq!(c.snapshot_id, snap.id.to_string());
    assert_eq!(
        created.cause,
        differently_bus_schema::Cause::User,
        "{created:?}"
    );

    snap = p
        .store
        .get_snapshot(&snap.id)
        .await
        .expect("read")
        .expect("row");
    snap.status = SnapshotStatus::Deleting;
    p.store.update_snapshot(&snap).await.expect("deleting");
    let args = serde_json::json!({ "snapshotId": snap.id });
    let delete = operate_with(&p, &running, WorkOp::DeleteSnapshot, false, args, 1).await;
    assert_eq!(finished(&p, &delete.id).await.state, OpState::Done);
    let deleted = p.public_until(&s.id, "snapshot.deleted").await;
    let EventData::SnapshotDeleted(d) = &deleted.last().expect("the event").data else {
        panic!("{deleted:?}");
    };
    assert_eq!(d.snapshot_id, snap.id.to_string());
}
