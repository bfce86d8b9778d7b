//! Differently on a 3-node NATS cluster with R3 streams: the node every process is connected
//! to is killed under load, and creates keep answering fast and every sandbox is placed, with
//! no duplicate instance (the short version of the cluster faults).

use std::time::{Duration, Instant};

use differently_adapters::fake::{LedgerOp, LedgerOutcome};
use differently_core::{SandboxId, SandboxStatus};

use crate::harness::{Cluster, Opts};

/// The public events stream, whose leader the event-stream tests lay out.
const PUBLIC_STREAM: &str = "DLY_PUB";

/// api, scheduler and worker on a 3-node cluster (R3), with one sandbox already running, so a
/// fault hits a warmed-up system.
async fn cluster_with_a_running_sandbox() -> Cluster {
    let c = Cluster::started(Opts {
        nats_cluster: true,
        ..Opts::default()
    })
    .await;
    let warm = c.create_ok().await;
    c.wait_status(&warm, SandboxStatus::Running, Duration::from_secs(30))
        .await;
    c
}

/// Create → running as the control plane recorded it (`startedAt − createdAt`): the waits
/// run one after another once every create is in, so the time a wait returns says when the
/// test got to it, not when the sandbox ran.
fn recorded_to_running(view: &serde_json::Value) -> Duration {
    let at = |field: &str| {
        view[field]
            .as_str()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .unwrap_or_else(|| panic!("{field} in {view}"))
    };
    (at("startedAt") - at("createdAt"))
        .to_std()
        .unwrap_or_else(|_| panic!("started before it was created: {view}"))
}

/// The failover targets (create answered within 1 s, create → running within 3 s, an open
/// event stream resumed within 3 s) are figures these tests print (run them with
/// `--nocapture`; docs/reliability.md has the measurements), not what they assert: on a busy
/// 2-core machine a wall-clock bound near a target fails for the machine, not the product.
/// They assert the mechanism that meets a target (the worker took the creates from the store,
/// every process left the lost node) and bounds far above the target that still rule out
/// the failure each guards against.
const FAR_ABOVE_TARGET: Duration = Duration::from_secs(30);

/// Makes member 0 (the node every process uses) lead the work stream and its consumer, so
/// losing it costs a raft election (4–9 s) of both before the bus delivers work again.
async fn work_led_by_node_0(c: &Cluster) {
    work_led_by(c, 0).await;
}

/// Makes member `i` lead the work stream and its consumer.
async fn work_led_by(c: &Cluster, i: usize) {
    let cluster = c.nats_cluster.as_ref().expect("cluster");
    for asset in ["DLY_WORK", "DLY_WORK/work-fake"] {
        if let Err(e) = cluster.lead(asset, i, Duration::from_secs(30)).await {
            panic!("laying out the leaders: {e}");
        }
    }
}

/// The work stream's leader dies while every process stays connected to another member:
/// no client moves, only the election is in the way, and the worker does not wait for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_work_streams_leader_does_not_wait_for_the_election() {
    let mut c = cluster_with_a_running_sandbox().await;
    work_led_by(&c, 1).await;
    c.nats_cluster.as_mut().expect("cluster").nodes[1].stop();
    let mut ids = Vec::new();
    for _ in 0..10 {
        let (status, body) = c.create(serde_json::json!({})).await;
        assert_eq!(status, 202, "{body}");
        ids.push(
            body["id"]
                .as_str()
                .expect("id")
                .parse::<SandboxId>()
                .expect("id"),
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut to_running = Duration::ZERO;
    for id in &ids {
        let view = c
            .wait_status(id, SandboxStatus::Running, Duration::from_secs(60))
            .await;
        to_running = to_running.max(recorded_to_running(&view));
    }
    println!("work stream's leader killed: slowest create → running {to_running:?}");
    assert!(
        to_running < FAR_ABOVE_TARGET,
        "create → running took {to_running:?} while the work stream elected a leader\n{}",
        c.log("worker")
    );
}

/// Node 0 leads the work stream and its consumer when it dies, so no work is delivered over
/// the bus until NATS has elected new leaders (4–9 s, compiled into nats-server). Creates
/// still run within a few seconds: the worker finds the placed creates in Postgres
/// (`worker.scan_after_ms`, 1 s) and makes them itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_node_every_process_uses_loses_nothing_and_stalls_briefly() {
    let mut c = cluster_with_a_running_sandbox().await;
    work_led_by_node_0(&c).await;

    let killed_at = Instant::now();
    c.nats_cluster.as_mut().expect("cluster").nodes[0].stop();
    let mut created: Vec<(SandboxId, Instant)> = vec![];
    let mut slowest = Duration::ZERO;
    // 20 creates over ~2 s while the cluster elects new leaders and clients move over.
    for _ in 0..20 {
        let started = Instant::now();
        let (status, body) = c.create(serde_json::json!({})).await;
        slowest = slowest.max(started.elapsed());
        assert_eq!(status, 202, "{body}");
        let id: SandboxId = body["id"]
            .as_str()
            .expect("id")
            .parse()
            .expect("sandbox id");
        created.push((id, started));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut to_running = Duration::ZERO;
    for (id, _) in &created {
        let view = c
            .wait_status(id, SandboxStatus::Running, Duration::from_secs(60))
            .await;
        to_running = to_running.max(recorded_to_running(&view));
    }
    println!(
        "node killed: slowest create answer {slowest:?}, slowest create → running {to_running:?}, \
         all placed {:?} after the kill",
        killed_at.elapsed()
    );
    // A create waiting on the bus would wait out the client's ack timeout on every retry.
    assert!(
        slowest < Duration::from_secs(10),
        "a create took {slowest:?} after the node died"
    );
    // The ledger is the backend's truth: one instance per sandbox, however often work was
    // redelivered around the failover.
    let ledger = c.ledger();
    for (id, _) in &created {
        let creates = ledger
            .iter()
            .filter(|e| {
                e.sandbox_id.as_ref() == Some(id)
                    && e.op == LedgerOp::Create
                    && e.outcome == LedgerOutcome::Created
            })
            .count();
        assert_eq!(creates, 1, "sandbox {id} has {creates} instances");
    }
    // Without the scan the floor is the election (at least 4 s after the kill for the first
    // create); the worker said it took creates the bus had not delivered.
    assert!(
        c.log("worker").contains("was not delivered by the bus"),
        "the worker never took a create from the store:\n{}",
        c.log("worker")
    );
    assert!(
        to_running < FAR_ABOVE_TARGET,
        "create → running took {to_running:?} across the failover\n{}",
        c.log("worker")
    );
}

/// Once failed in CI with a create `provisioning` for over 60 s: the leader's repair pass
/// re-sent rows one after another, each publish waiting out the client's 5 s ack timeout while
/// the work stream's leader (the hung node) was being replaced, and the worker's pull request,
/// lost with the hung consumer leader, was only re-made after 10 s. Now every leader publish
/// is bounded (1 s) and a pass re-sends its rows at once, pull requests last a second, and a
/// reconnect gives a hung member 1 s, not 5 s. What remains is NATS electing new stream and
/// consumer leaders when the hung node led them (several seconds, not ours to shorten), and
/// the worker's scan of the store does not wait for it. The hung node leads the work stream
/// and its consumer here, so that is what is tested.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_node_is_left_within_seconds_and_work_goes_on() {
    let c = cluster_with_a_running_sandbox().await;
    work_led_by_node_0(&c).await;
    let pid = c.nats_cluster.as_ref().expect("cluster").nodes[0]
        .pid()
        .expect("node 0 runs");
    let stop = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid}");
    };
    // Hung, not dead: its sockets stay open, so only the clients' pings can tell.
    stop("-STOP");
    let hung_at = Instant::now();
    let mut created: Vec<(SandboxId, Instant)> = vec![];
    let mut slowest = Duration::ZERO;
    for _ in 0..10 {
        let started = Instant::now();
        let (status, body) = c.create(serde_json::json!({})).await;
        slowest = slowest.max(started.elapsed());
        assert_eq!(status, 202, "{body}");
        created.push((
            body["id"]
                .as_str()
                .expect("id")
                .parse()
                .expect("sandbox id"),
            started,
        ));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut to_running = Duration::ZERO;
    for (id, _) in &created {
        let view = c
            .wait_status(id, SandboxStatus::Running, Duration::from_secs(60))
            .await;
        to_running = to_running.max(recorded_to_running(&view));
    }
    let placed_after = hung_at.elapsed();
    stop("-CONT");
    println!(
        "node hung: slowest create answer {slowest:?}, slowest create → running {to_running:?}, \
         all placed {placed_after:?} after the hang"
    );
    // Every process left the hung node: its log says the connection was lost.
    for name in ["api", "scheduler", "worker"] {
        assert!(
            c.log(name).contains("lost the NATS connection"),
            "{name} never left the hung node:\n{}",
            c.log(name)
        );
    }
    // A create held by the hung node would wait out the 5 s ack timeout, again and again.
    assert!(
        slowest < Duration::from_secs(10),
        "a create took {slowest:?}"
    );
    // Leaving the hung node takes the clients' two missed pings (about 1–2.5 s); the work
    // stream's election (4–9 s) is not waited for: the worker takes the creates from the
    // store. Before that, a create stayed `provisioning` for over 60 s.
    assert!(
        to_running < FAR_ABOVE_TARGET,
        "create → running took {to_running:?} with a hung node"
    );
}

/// Once failed about 1 run in 4: the API's readers of the R3 events stream were made again
/// after asking for the stream's info, which went unanswered (timed out on every retry) for
/// over a minute after the node died, so the open stream delivered nothing. A reader made
/// again now creates its consumer by stream name from the sequence it reached, each attempt
/// bounded, and the client's idle heartbeat on it is 1 s, so a reader on the dead node is
/// noticed within seconds even by a process that was not connected to it. And a status event
/// that could not be stored while the events stream elected a new leader (the worker's
/// `running`, published right after the kill) is re-sent until it is: no repair re-sends
/// status events from Postgres, and an open stream learns of a change only through one.
///
/// Two layouts, because they differ by the one thing we cannot shorten: when the lost node
/// led the public events stream (and the meta group), no event can be stored, and no reader
/// made again, until NATS elects new leaders (its raft election timeout, 4–9 s, is compiled
/// into nats-server); when another node leads them, only the clients move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_stream_open_across_a_node_loss_keeps_delivering() {
    event_stream_across_the_loss_of_node_0(EventsLeader::Another).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_stream_open_across_the_loss_of_its_streams_leader_keeps_delivering() {
    event_stream_across_the_loss_of_node_0(EventsLeader::TheLostNode).await;
}

/// Who leads the public events stream when node 0 (the node every process uses) dies.
#[derive(Debug, Clone, Copy)]
enum EventsLeader {
    Another,
    TheLostNode,
}

async fn event_stream_across_the_loss_of_node_0(layout: EventsLeader) {
    let mut c = cluster_with_a_running_sandbox().await;
    let leader = match layout {
        EventsLeader::Another => 1,
        EventsLeader::TheLostNode => 0,
    };
    let cluster = c.nats_cluster.as_ref().expect("cluster");
    if let Err(e) = cluster
        .lead(PUBLIC_STREAM, leader, Duration::from_secs(30))
        .await
    {
        panic!("laying out the events stream's leader: {e}");
    }
    // The meta group, through which a reader's consumer is made again, cannot be moved
    // without the system account; who leads it is reported with the figures.
    let meta = cluster.meta_leader();
    // The stream is opened now, then node 0 dies.
    let (tell, wanted) = tokio::sync::watch::channel(String::new());
    let reader = {
        let req = c.req(reqwest::Method::GET, "/v1/events");
        tokio::spawn(async move {
            let mut resp = req.send().await.expect("events");
            assert_eq!(resp.status(), 200);
            let mut parser = crate::dataplane::SseParser::default();
            let mut got = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline {
                match tokio::time::timeout(Duration::from_millis(200), resp.chunk()).await {
                    Ok(Ok(Some(chunk))) => {
                        for ev in parser.push(&chunk) {
                            got.push((Instant::now(), ev));
                        }
                    }
                    Ok(_) => break,
                    Err(_) => {}
                }
                let want = wanted.borrow().clone();
                if !want.is_empty()
                    && got
                        .iter()
                        .any(|(_, e)| e.data.contains(&want) && e.data.contains("\"running\""))
                {
                    break;
                }
            }
            got
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.nats_cluster.as_mut().expect("cluster").nodes[0].stop();
    let started = Instant::now();
    let (status, body) = c.create(serde_json::json!({})).await;
    assert_eq!(status, 202, "{body}");
    let id: SandboxId = body["id"]
        .as_str()
        .expect("id")
        .parse()
        .expect("sandbox id");
    let _ = tell.send(id.to_string());
    c.wait_status(&id, SandboxStatus::Running, Duration::from_secs(60))
        .await;
    let running_after = started.elapsed();
    let got = reader.await.expect("reader");
    let seen = got
        .iter()
        .find(|(_, e)| e.data.contains(id.as_str()) && e.data.contains("\"running\""))
        .map(|(at, _)| at.duration_since(started));
    println!(
        "event stream across a node loss ({layout:?} leads the events stream, {meta:?} the meta \
         group): running after {running_after:?}, event seen after {seen:?}"
    );
    // Delivered at all is the behaviour; how soon is the figure printed above (the reader
    // gives up after 60 s, far above the 4–9 s election that bounds the slower layout).
    if seen.is_none() {
        panic!(
            "the open stream never delivered {id}'s running event; it saw {} events\n--- api ---\n{}\n--- worker ---\n{}",
            got.len(),
            c.log("api"),
            c.log("worker")
        );
    }
}
