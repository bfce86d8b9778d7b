//! Requests to a process supervisor: answered, nobody serving, left unanswered.

use super::*;

/// A process supervisor's request subject under the harness naming.
pub(crate) fn served_subject(h: &Harness, slot: u16) -> String {
    h.naming.process_subject(slot)
}

pub(crate) async fn a_served_request_is_answered(h: Harness) {
    let subject = served_subject(&h, 1);
    let mut served = h.bus.serve(&subject).await.expect("serve");
    let other = h.bus.serve(&served_subject(&h, 2)).await.expect("serve b");
    let answering = tokio::spawn(async move {
        for n in 0..2 {
            let r = tokio::time::timeout(Duration::from_secs(5), served.next())
                .await
                .expect("a request within 5 s")
                .expect("still serving");
            let mut answer = format!("{n}:").into_bytes();
            answer.extend_from_slice(&r.payload);
            r.reply(Bytes::from(answer)).await.expect("reply");
        }
        served
    });
    for (n, ask) in ["status", "logs"].into_iter().enumerate() {
        let got = h
            .bus
            .request(&subject, Bytes::from(ask), Duration::from_secs(5))
            .await
            .expect("answered");
        assert_eq!(String::from_utf8_lossy(&got), format!("{n}:{ask}"));
    }
    // Once the server drops its stream, the subject has nobody serving it.
    drop(answering.await.expect("joined"));
    drop(other);
    let mut gone = None;
    for _ in 0..50 {
        match h
            .bus
            .request(&subject, Bytes::from("status"), Duration::from_secs(1))
            .await
        {
            Err(BusError::NoResponders(_)) => {
                gone = Some(());
                break;
            }
            other => {
                assert!(other.is_err(), "answered after the server left: {other:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    assert!(gone.is_some(), "no NoResponders after the server left");
}

pub(crate) async fn a_request_nobody_serves_is_no_responders(h: Harness) {
    let started = Instant::now();
    let e = h
        .bus
        .request(
            &served_subject(&h, 3),
            Bytes::from("status"),
            Duration::from_secs(5),
        )
        .await
        .expect_err("nobody serves it");
    assert!(matches!(e, BusError::NoResponders(_)), "{e:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "said at once, not after the timeout: {:?}",
        started.elapsed()
    );
}

pub(crate) async fn a_request_left_unanswered_times_out(h: Harness) {
    let subject = served_subject(&h, 4);
    let mut served = h.bus.serve(&subject).await.expect("serve");
    let holding = tokio::spawn(async move {
        // Takes the request and sits on it past the requester's timeout.
        let r = served.next().await.expect("a request");
        tokio::time::sleep(Duration::from_secs(2)).await;
        drop(r);
        served
    });
    let started = Instant::now();
    let e = h
        .bus
        .request(&subject, Bytes::from("status"), Duration::from_millis(300))
        .await
        .expect_err("not answered");
    assert!(matches!(e, BusError::Timeout(_)), "{e:?}");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(2),
        "{took:?}"
    );
    drop(holding);
}
