//! The event stream: resuming from `Last-Event-ID` without gaps or repeats, the event that
//! starts a sandbox (its wait and first exec), and every exec's `started` before `finished`.

use std::time::{Duration, Instant};

use differently_core::{SandboxId, SandboxStatus};
use serde_json::{json, Value};

use crate::harness::{Cluster, Opts};

use super::{cluster, post, running, SseEvent, SseParser};

/// Reads events from `/v1/events` until `until` holds for the ones read so far or the time is
/// up; returns them.
pub async fn read_events(
    c: &Cluster,
    query: &str,
    last_id: Option<u64>,
    until: impl Fn(&[SseEvent]) -> bool,
) -> Vec<SseEvent> {
    let mut r = c.req(reqwest::Method::GET, &format!("/v1/events{query}"));
    if let Some(id) = last_id {
        r = r.header("last-event-id", id.to_string());
    }
    let mut resp = r.send().await.expect("events");
    assert_eq!(resp.status(), 200);
    let mut parser = SseParser::default();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !until(&got) && Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_millis(500), resp.chunk()).await {
            Ok(Ok(Some(chunk))) => got.extend(parser.push(&chunk)),
            Ok(_) => break,
            Err(_) => {}
        }
    }
    got
}
fn statuses(evs: &[SseEvent]) -> Vec<String> {
    evs.iter()
        .map(|e| {
            let v: Value = serde_json::from_str(&e.data).expect("event json");
            v["status"].as_str().unwrap_or_default().to_owned()
        })
        .collect()
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_resume_from_last_event_id_without_gaps_or_repeats() {
    let c = cluster(Opts::default()).await;
    let id = running(&c, json!({"capabilities": ["lifecycle.stop"]})).await;
    let q = format!("?sandboxId={id}");
    // Everything so far, from the start of the stream.
    let first = read_events(&c, &q, Some(0), |evs| {
        statuses(evs).contains(&"running".to_owned())
    })
    .await;
    // Placed in its admission: it was never committed `queued`, so no event says it was.
    assert_eq!(statuses(&first), vec!["provisioning", "running"]);
    let last: u64 = first
        .last()
        .unwrap()
        .id
        .as_deref()
        .unwrap()
        .parse()
        .unwrap();

    // Changes while nobody listens.
    for op in ["pause", "resume", "stop", "start"] {
        let (s, b) = post(&c, &format!("/v1/sandboxes/{id}/{op}"), json!({})).await;
        assert_eq!(s, 200, "{op}: {b}");
    }
    let (s, _) = c.delete(&id).await;
    assert_eq!(s, 202);
    c.wait_status(&id, SandboxStatus::Terminated, Duration::from_secs(30))
        .await;

    // Resuming misses nothing and repeats nothing.
    let rest = read_events(&c, &q, Some(last), |evs| {
        statuses(evs).contains(&"terminated".to_owned())
    })
    .await;
    assert_eq!(
        statuses(&rest),
        vec![
            "paused",
            "running",
            "stopped",
            "running",
            "terminating",
            "terminated"
        ]
    );
    let ids: Vec<u64> = first
        .iter()
        .chain(&rest)
        .map(|e| e.id.as_deref().unwrap().parse().unwrap())
        .collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "ids strictly increase: {ids:?}"
    );
    // Another tenant's filter sees none of it; a bad id is a 400.
    let (s, _) = c
        .call(
            &c.key,
            reqwest::Method::GET,
            "/v1/events?sandboxId=nope",
            None,
        )
        .await;
    assert_eq!(s, 400);
}
/// The status event that starts a sandbox carries its client view and where it runs: a wait it
/// ends answers with the row as committed, and this replica's first data-plane call on it
/// needs no read. Shown by pointing the stored rows at a pool this replica does not have,
/// behind the API's back: only a call that reads its row notices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_that_starts_a_sandbox_answers_its_wait_and_serves_the_first_exec() {
    // Creates take 400 ms on the backend, so the wait below is registered before the start.
    let c = Cluster::started(Opts {
        latency_ms: 400,
        ..Opts::default()
    })
    .await;
    let (s, created) = c.create(json!({})).await;
    assert_eq!(s, 202, "{created}");
    let waited_on = SandboxId::parse(created["id"].as_str().expect("id")).expect("sandbox id");
    let answered = c
        .wait_status(&waited_on, SandboxStatus::Running, Duration::from_secs(30))
        .await;
    assert_eq!(
        answered,
        c.get(&waited_on).await,
        "the event's view is the row's"
    );

    // Started while nobody here waited on it: polled with plain reads.
    let (s, created) = c.create(json!({})).await;
    assert_eq!(s, 202, "{created}");
    let polled = SandboxId::parse(created["id"].as_str().expect("id")).expect("sandbox id");
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.get(&polled).await["status"] != "running" {
        assert!(Instant::now() < deadline, "{polled} never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let moved = sqlx::query(
        "UPDATE sandboxes SET doc = jsonb_set(doc, '{pool}', '\"elsewhere\"') WHERE id = ANY($1)",
    )
    .bind(vec![waited_on.to_string(), polled.to_string()])
    .execute(c.db.store().pool())
    .await
    .expect("point the rows elsewhere")
    .rows_affected();
    assert_eq!(moved, 2);
    let exec = |id: &SandboxId| {
        let path = format!("/v1/sandboxes/{id}/exec");
        let c = &c;
        async move {
            post(
                c,
                &path,
                json!({"command": ["echo", "hi"], "timeoutSeconds": 10}),
            )
            .await
        }
    };
    let (s, out) = exec(&waited_on).await;
    assert_eq!((s, out["stdout"].as_str()), (200, Some("hi\n")), "{out}");
    let (s, out) = exec(&polled).await;
    assert_eq!(
        (s, out["error"]["code"].as_str()),
        (503, Some("provider_unavailable")),
        "this call read its row: {out}"
    );
}
/// An exec's two public events are sent together (neither waits for the other's
/// acknowledgement), yet the public stream holds `started` before `finished` for every exec,
/// as `docs/events.md` promises.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_exec_stores_started_before_finished() {
    use differently_bus::Bus;
    use differently_bus_schema::public::{EventData, PublicEvent};
    use futures::StreamExt;

    let c = cluster(Opts::default()).await;
    let id = running(&c, json!({"capabilities": ["files"]})).await;
    let path = format!("/v1/sandboxes/{id}/exec");
    const EXECS: usize = 20;
    for _ in 0..EXECS {
        let (s, r) = post(&c, &path, json!({"command": ["echo", "hi"]})).await;
        assert_eq!(s, 200, "{r}");
    }
    let bus = differently_bus::jetstream::connect(&c._nats.url(), 1)
        .await
        .expect("connect to the test's nats-server");
    let naming = differently_bus_schema::Naming::default();
    let mut events = bus
        .events(
            &naming.public_stream().name,
            &format!("{}.pub.>", naming.prefix()),
            Some(0),
        )
        .await
        .expect("read the public stream");
    let mut order: Vec<(String, &str)> = Vec::new();
    let until = Instant::now() + Duration::from_secs(20);
    while order.len() < 2 * EXECS {
        let left = until.saturating_duration_since(Instant::now());
        let Ok(Some(ev)) = tokio::time::timeout(left, events.next()).await else {
            panic!("only {} exec events in the stream: {order:?}", order.len());
        };
        let ev = ev.expect("public event");
        match PublicEvent::decode(&ev.payload).expect("decodes").data {
            EventData::ExecStarted(s) => order.push((s.exec_id, "started")),
            EventData::ExecFinished(f) => order.push((f.exec_id, "finished")),
            _ => {}
        }
    }
    let mut execs: Vec<&String> = order.iter().map(|(id, _)| id).collect();
    execs.sort();
    execs.dedup();
    assert_eq!(execs.len(), EXECS, "{order:?}");
    for exec in execs {
        let at = |kind: &str| order.iter().position(|(id, k)| id == exec && *k == kind);
        let (started, finished) = (at("started"), at("finished"));
        assert!(
            started.is_some() && started < finished,
            "{exec}: started at {started:?}, finished at {finished:?}"
        );
    }
}
