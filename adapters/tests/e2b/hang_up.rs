//! A reader hanging up on a streamed exec cancels the command on envd, even while the
//! command is quiet: envd keeps a process whose client went away, so only the adapter's
//! `SendSignal` ends it.

use std::time::Duration;

use differently_adapters::{Adapter, ExecEvent};
use serde_json::json;

use crate::{cmd, running, setup};

/// Longest the call may take to end once its reader is gone (the command would run 30 s).
const ENDS_WITHIN: Duration = Duration::from_secs(25);

#[tokio::test]
async fn a_reader_hanging_up_on_a_quiet_command_kills_it_on_envd() {
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
    assert_eq!(exit.unwrap().exit_code, 137);
    let signalled = s.fake.record().signalled.clone();
    assert!(
        signalled.iter().any(|c| c.ends_with("exec sleep 30")),
        "the command was killed on envd: {signalled:?}"
    );
    let deadline = tokio::time::Instant::now() + ENDS_WITHIN;
    while s.fake.running_commands() > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "envd still runs the command"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
