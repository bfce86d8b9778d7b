//! A reader hanging up on a streamed exec cancels the command on Runloop, even while the
//! command is quiet (its output tails send nothing then): the adapter kills the execution
//! through the API (`…/executions/{id}/kill`).

use std::time::Duration;

use differently_adapters::{Adapter, ExecEvent};
use serde_json::json;

use crate::{cmd, running, setup};

/// Longest the call may take to end once its reader is gone (the command would run 30 s).
const ENDS_WITHIN: Duration = Duration::from_secs(25);

#[tokio::test]
async fn a_reader_hanging_up_on_a_quiet_command_kills_it_through_the_api() {
    let s = setup(json!({})).await;
    let r = running(&s).await;
    let (tx, mut rx) = tokio::sync::mpsc::channel(4);
    let req = cmd(&["sh", "-c", "echo started; exec sleep 30"]);
    let run = s.adapter.exec_stream(&r, &req, tx);
    let hang_up = async {
        // Once it runs (and then says nothing more), the reader goes away.
        match rx.recv().await {
            Some(ExecEvent::Stdout(b)) => assert!(b.starts_with(b"started"), "{b:?}"),
            other => panic!("expected the command's first line, got {other:?}"),
        }
        drop(rx);
    };
    let (exit, ()) = tokio::time::timeout(ENDS_WITHIN, async { tokio::join!(run, hang_up) })
        .await
        .expect("the call ended once its reader went away");
    // Runloop's exec answers a cancelled command as an error, not an exit code.
    let e = exit.expect_err("a cancelled exec");
    assert!(e.to_string().contains("cancelled"), "{e}");
    let killed = s.fake.record().killed.clone();
    assert!(
        killed.iter().any(|c| c.contains("exec sleep 30")),
        "the execution was killed through the API: {killed:?}"
    );
    let deadline = tokio::time::Instant::now() + ENDS_WITHIN;
    while s.fake.executions_running() > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "Runloop still runs the command"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
