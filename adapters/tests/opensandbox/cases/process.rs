//! Background processes on OpenSandbox: the default `process` (execd's streamed command), so a
//! signal ends one by cancelling its stream, and that cancel must reach execd: real execd keeps
//! a command running when its client goes away, so the adapter interrupts it.

use std::collections::BTreeMap;
use std::time::Duration;

use differently_adapters::go_ahead::GoAhead;
use differently_adapters::process::{ProcessInput, ProcessSpec};
use differently_adapters::Adapter;
use differently_core::process::ProcessSignal;
use serde_json::json;

use crate::fake_server::{FakeRuntime, Variant};
use crate::{running, setup};

/// `TERM` to a quiet `sleep` answers 143 and leaves no command running on execd.
#[tokio::test]
async fn a_signalled_process_leaves_no_command_running() {
    let s = setup(Variant::Real, FakeRuntime::Docker, json!({})).await;
    let r = running(&s).await;
    let spec = ProcessSpec {
        command: vec!["sleep".into(), "30".into()],
        env: BTreeMap::new(),
        cwd: None,
        timeout: None,
        pty: None,
        stdin: false,
    };
    let (input, input_rx) = tokio::sync::mpsc::channel(4);
    let (out, mut out_rx) = tokio::sync::mpsc::channel(16);
    let interrupts = s.fake.record().interrupts;
    let call = s.adapter.process(&r, &spec, input_rx, out, GoAhead::now());
    let drive = async {
        // Only once execd runs it, so the cancel has something to stop.
        while s.fake.commands_running() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        input
            .send(ProcessInput::Signal(ProcessSignal::Term))
            .await
            .expect("the process takes input");
        while out_rx.recv().await.is_some() {}
    };
    let (exit, ()) =
        tokio::time::timeout(Duration::from_secs(20), async { tokio::join!(call, drive) })
            .await
            .expect("the process ends soon after TERM");
    assert_eq!(exit.expect("an exit").exit_code, 143);
    let mut stopped = false;
    for _ in 0..100 {
        if s.fake.commands_running() == 0 {
            stopped = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(stopped, "the signalled process's command was left running");
    assert!(
        s.fake.record().interrupts > interrupts,
        "the adapter interrupted the command on execd"
    );
}
