//! The event stream: replay from a sequence, the final-status filter, typed reading, and
//! the positions of a stream and of a durable consumer.

use super::*;

/// A reader of `Naming::final_event_filter` gets a sandbox's final change and none of the
/// others, nor an earlier version's subject without a phase; the sandbox is read off every
/// one of them.
pub(crate) async fn the_final_filter_reads_only_final_status_changes(h: Harness) {
    use differently_core::{OrgId, ProjectId, SandboxId, SandboxStatus};
    let (org, project, sandbox) = (OrgId::new(), ProjectId::new(), SandboxId::new());
    let subject = |status| h.naming.event_subject(&org, &project, &sandbox, status);
    let mut ends = h.events(&h.naming.final_event_filter(), Some(0)).await;
    for (i, status) in [
        SandboxStatus::Provisioning,
        SandboxStatus::Running,
        SandboxStatus::Terminating,
        SandboxStatus::Terminated,
    ]
    .into_iter()
    .enumerate()
    {
        let s = subject(status);
        assert_eq!(h.naming.event_subject_sandbox(&s), Some(sandbox.clone()));
        h.publish(&s, &format!("s{i}"), status.as_str()).await;
    }
    let earlier = format!("t.evt.{org}.{project}.{sandbox}");
    h.publish(&earlier, "earlier", "terminated").await;
    h.publish(&subject(SandboxStatus::Failed), "failed", "failed")
        .await;
    let first = event(&mut ends).await;
    let second = event(&mut ends).await;
    assert_eq!(
        (first.payload.as_ref(), second.payload.as_ref()),
        (&b"terminated"[..], &b"failed"[..])
    );
    let extra = tokio::time::timeout(Duration::from_millis(300), ends.next()).await;
    assert!(extra.is_err(), "unexpected event {extra:?}");
    let mut all = h.events("t.evt.>", Some(0)).await;
    for _ in 0..6 {
        event(&mut all).await;
    }
}

/// The last sequence of a stream, and a durable consumer's ack floor: absent before it
/// exists, below the first unacked message, and absent again once deleted.
pub(crate) async fn positions_of_a_stream_and_of_a_durable_consumer(h: Harness) {
    let stream = h.naming.work_stream().name;
    assert_eq!(h.bus.last_sequence(&stream).await.expect("last"), 0);
    let def = h.consumer("pos");
    let floor = || async {
        h.bus
            .consumer_ack_floor(&stream, &def.durable)
            .await
            .expect("floor")
    };
    assert_eq!(floor().await, None);
    let mut pull = h.pull("pos").await;
    for i in 0..3 {
        h.publish(&h.work("pos"), &format!("p{i}"), "x").await;
    }
    assert_eq!(h.bus.last_sequence(&stream).await.expect("last"), 3);
    let first = next(&mut pull, Duration::from_secs(2))
        .await
        .expect("first");
    first.acker.ack().await.expect("ack");
    let _second = next(&mut pull, Duration::from_secs(2))
        .await
        .expect("second");
    let mut acked = None;
    for _ in 0..50 {
        acked = floor().await;
        if acked == Some(1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        acked,
        Some(1),
        "acked through the first, not the held second"
    );
    drop(pull);
    h.bus
        .delete_consumer(&stream, &def.durable)
        .await
        .expect("delete");
    h.bus
        .delete_consumer(&stream, &def.durable)
        .await
        .expect("deleting what is gone is nothing");
    assert_eq!(floor().await, None);
}

pub(crate) async fn events_replay_after_a_sequence_then_follow(h: Harness) {
    let org1 = |n: u32| format!("t.evt.org1.proj1.sbx{n}");
    let org2 = "t.evt.org2.proj9.sbx9".to_owned();
    h.publish(&org1(1), "e1", "e1").await;
    h.publish(&org2, "x1", "x1").await;
    h.publish(&org1(2), "e2", "e2").await;
    h.publish(&org1(3), "e3", "e3").await;
    h.publish(&org2, "x2", "x2").await;

    let filter = "t.evt.org1.>";
    let mut from_start = h.events(filter, Some(0)).await;
    let first = event(&mut from_start).await;
    assert_eq!(first.payload, "e1");
    assert_eq!(first.subject, org1(1));

    let mut resumed = h.events(filter, Some(first.seq)).await;
    let mut live_only = h.events(filter, None).await;
    let e2 = event(&mut resumed).await;
    let e3 = event(&mut resumed).await;
    assert_eq!(
        (e2.payload.as_ref(), e3.payload.as_ref()),
        (&b"e2"[..], &b"e3"[..])
    );
    assert!(
        first.seq < e2.seq && e2.seq < e3.seq,
        "{first:?} {e2:?} {e3:?}"
    );

    h.publish(&org2, "x3", "x3").await;
    h.publish(&org1(4), "e4", "e4").await;
    let e4 = event(&mut resumed).await;
    assert_eq!(e4.payload, "e4");
    assert!(e4.seq > e3.seq);
    let live = event(&mut live_only).await;
    assert_eq!((live.seq, live.payload), (e4.seq, e4.payload));
    // Nothing else arrives for org1.
    let extra = tokio::time::timeout(Duration::from_millis(300), resumed.next()).await;
    assert!(extra.is_err(), "unexpected event {extra:?}");
}

pub(crate) async fn typed_events_skip_what_does_not_decode(h: Harness) {
    let subject = "t.evt.org1.proj1.sbx1";
    let mut env = Envelope::new(
        SandboxId::new(),
        4,
        StatusChanged {
            org_id: differently_core::OrgId::new(),
            project_id: differently_core::ProjectId::new(),
            status: differently_core::SandboxStatus::Running,
            status_reason: None,
            pool: Some("p".into()),
            at: chrono::Utc::now(),
            backend_ref: None,
            view: None,
            audit_head: None,
            origin: None,
            warm: false,
        },
    );
    env.published_at = None;
    let good = String::from_utf8(env.encode().expect("encode")).expect("utf-8");
    h.publish(subject, "junk", "junk").await;
    h.publish(subject, "good", &good).await;
    let stream = h.naming.events_stream().name;
    let mut events = h
        .bus
        .events_typed::<StatusChanged>(&stream, "t.evt.org1.>", Some(0))
        .await
        .expect("typed events");
    let first = tokio::time::timeout(Duration::from_secs(5), events.next())
        .await
        .expect("an event within 5 s")
        .expect("open")
        .expect("event");
    assert_eq!(first.env, env, "the junk event is skipped");
    assert_eq!(first.subject, subject);
    assert!(first.seq >= 2, "seq {}", first.seq);
}

/// A server that lost its store gets the events stream back empty from the next publisher,
/// its sequences starting again at 1. A reader from "now" and a reader resuming from a
/// sequence had both gone past the new stream's first events: each must read the new stream
/// from its start (within the 5 s stream check), not wait for sequences past where it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_event_readers_follow_a_stream_made_anew() {
    let h = Harness::jetstream().await;
    let subject = "t.evt.org1.prj1.sbx1.live";
    for i in 0..3 {
        h.publish(subject, &format!("old{i}"), &format!("old{i}"))
            .await;
    }
    let mut resumed = h.events("t.evt.>", Some(0)).await;
    for i in 0..3 {
        assert_eq!(event(&mut resumed).await.payload, format!("old{i}"));
    }
    let mut from_now = h.events("t.evt.>", None).await;
    h.publish(subject, "old3", "old3").await;
    assert_eq!(event(&mut resumed).await.seq, 4);
    assert_eq!(event(&mut from_now).await.seq, 4);

    let url = h.server.as_ref().expect("a nats-server").url();
    let admin = jetstream::connect(&url, 1).await.expect("admin connection");
    let stream = h.naming.events_stream().name;
    admin
        .context()
        .delete_stream(&stream)
        .await
        .expect("delete the events stream");
    h.bus.ensure_streams(&h.naming).await.expect("made anew");
    for i in 0..2 {
        h.publish(subject, &format!("new{i}"), &format!("new{i}"))
            .await;
    }
    assert_eq!(h.bus.last_sequence(&stream).await.expect("last"), 2);
    for (name, reader) in [("resumed", &mut resumed), ("from now", &mut from_now)] {
        let mut got = Vec::new();
        while got.len() < 2 {
            let ev = tokio::time::timeout(Duration::from_secs(30), reader.next())
                .await
                .unwrap_or_else(|_| {
                    panic!("{name}: the new stream's events within 30 s, got {got:?}")
                })
                .expect("open")
                .expect("event");
            got.push((ev.seq, String::from_utf8_lossy(&ev.payload).into_owned()));
        }
        assert_eq!(
            got,
            [(1, "new0".to_owned()), (2, "new1".to_owned())],
            "{name}"
        );
    }
}
