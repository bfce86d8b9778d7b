//! The fan-out: one process leads it at a time from a cursor kept in Postgres; it takes
//! over from the durable consumer of earlier versions and notices a stream made anew.

use std::time::Duration;

use tokio::sync::watch;

use crate::world::*;

/// One process leads the fan-out at a time. When it stops, another takes over from the
/// cursor the first saved: the events published after are delivered, and none twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_takes_the_fan_out_over_when_the_first_stops() {
    let w = world().await;
    let (o, p) = w.tenant().await;
    w.hook(&o, &p, "handover", &[]).await;
    let (stop_first, first_stopped) = watch::channel(false);
    w.start_until(fast_config(), first_stopped);
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(w.status_event(&p, 1).await.id);
    }
    eventually("the first process delivers three events", || async {
        w.ids_at("handover").len() >= 3
    })
    .await;
    // The second stands by while the first leads.
    let (stop_second, second_stopped) = watch::channel(false);
    w.start_until(fast_config(), second_stopped);
    let store = w.store();
    let last = w
        .announcer
        .bus()
        .last_sequence(&w.public_stream())
        .await
        .unwrap();
    eventually("the cursor saved through the third event", || async {
        store.fan_out_cursor().await.unwrap() >= Some(last)
    })
    .await;
    let _ = stop_first.send(true);
    for _ in 0..3 {
        ids.push(w.status_event(&p, 2).await.id);
    }
    eventually("the second process delivers the next three", || async {
        w.ids_at("handover").len() >= 6
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    ids.sort();
    assert_eq!(w.ids_at("handover"), ids, "each event once");
    let _ = stop_second.send(true);
}

/// The first fan-out of this version starts where the durable consumer that earlier
/// versions shared had acked through, and removes that consumer: an event it acked is not
/// delivered again, one it held unacked and one published later are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fan_out_takes_over_from_the_durable_consumer_of_earlier_versions() {
    let w = world().await;
    let (o, p) = w.tenant().await;
    w.hook(&o, &p, "upgrade", &[]).await;
    let stream = w.public_stream();
    let bus = w.announcer.bus().clone();
    let legacy = differently_bus_schema::ConsumerDef {
        stream: stream.clone(),
        durable: differently_bus_schema::naming::WEBHOOK_CONSUMER.to_owned(),
        filter: format!("{}.pub.>", w.announcer.naming().prefix()),
        ack_wait: Duration::from_secs(30),
    };
    let mut pull = bus.pull(&legacy).await.unwrap();
    let acked = w.status_event(&p, 1).await;
    let held = w.status_event(&p, 2).await;
    let first = pull.next(Duration::from_secs(5)).await.unwrap().unwrap();
    first.acker.ack().await.unwrap();
    let second = pull.next(Duration::from_secs(5)).await.unwrap().unwrap();
    drop(second);
    drop(pull);
    eventually(
        "the old consumer's ack floor is the first event",
        || async {
            bus.consumer_ack_floor(&stream, &legacy.durable)
                .await
                .unwrap()
                == Some(1)
        },
    )
    .await;
    w.start(fast_config());
    let later = w.status_event(&p, 3).await;
    eventually("the held and the later event delivered", || async {
        w.ids_at("upgrade").len() >= 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut want = vec![held.id.clone(), later.id.clone()];
    want.sort();
    assert_eq!(
        w.ids_at("upgrade"),
        want,
        "not the acked one ({})",
        acked.id
    );
    assert_eq!(
        bus.consumer_ack_floor(&stream, &legacy.durable)
            .await
            .unwrap(),
        None,
        "the old durable consumer is removed"
    );
    let _ = w.stop.send(true);
}

/// A saved cursor beyond the stream's last sequence (the stream was made anew, a server
/// that lost its store) would wait for sequences that come only much later: the fan-out
/// reads the stream from its start instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_beyond_the_streams_end_reads_it_from_its_start() {
    let w = world().await;
    let (o, p) = w.tenant().await;
    w.hook(&o, &p, "anew", &[]).await;
    let store = w.store();
    store.save_fan_out_cursor(1_000_000).await.unwrap();
    let e = w.status_event(&p, 1).await;
    w.start(fast_config());
    eventually("the event delivered", || async {
        !w.ids_at("anew").is_empty()
    })
    .await;
    assert_eq!(w.ids_at("anew"), vec![e.id.clone()]);
    let cursor = store.fan_out_cursor().await.unwrap();
    assert!(
        cursor.is_some_and(|c| c < 1_000_000),
        "the cursor starts again: {cursor:?}"
    );
    let _ = w.stop.send(true);
}

/// The public stream made anew under a leading fan-out (a NATS server that lost its store:
/// the stream comes back empty and its sequences start again). The fan-out's reader would
/// wait for sequences past what it had read; the fan-out notices the stream ends before
/// that and reads the new stream from its start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_made_anew_under_the_fan_out_is_read_from_its_start() {
    let w = world().await;
    let (o, p) = w.tenant().await;
    w.hook(&o, &p, "amnesia", &[]).await;
    w.start(fast_config());
    let mut ids = Vec::new();
    for version in 1..=3 {
        ids.push(w.status_event(&p, version).await.id);
    }
    eventually("three events delivered", || async {
        w.ids_at("amnesia").len() >= 3
    })
    .await;
    let admin = differently_bus::jetstream::connect(&w._nats.url(), 1)
        .await
        .unwrap();
    admin
        .context()
        .delete_stream(w.public_stream())
        .await
        .unwrap();
    w.announcer
        .bus()
        .ensure_streams(w.announcer.naming())
        .await
        .unwrap();
    let on_the_new_stream = w.status_event(&p, 4).await;
    assert_eq!(
        w.announcer
            .bus()
            .last_sequence(&w.public_stream())
            .await
            .unwrap(),
        1,
        "the new stream starts again"
    );
    ids.push(on_the_new_stream.id.clone());
    eventually("the event on the new stream delivered", || async {
        w.ids_at("amnesia").len() >= 4
    })
    .await;
    ids.sort();
    assert_eq!(w.ids_at("amnesia"), ids);
    let _ = w.stop.send(true);
}
