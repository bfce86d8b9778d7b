//! The contract walk: every check in order against one instance, each a named function in
//! the module of its concern. Sandboxes made here are deleted at the end whatever happened.

use differently_core::ids::InstallationId;
use differently_core::SandboxId;

use super::files::Sample;
use super::lifecycle::Cycle;
use super::runner::Runner;
use super::support::{cleanup, dialect, Ctx, Programs, Verb, FAKE, POSIX};
use super::{exec, files, honesty, lifecycle, optional, process, stream, Dialect};
use crate::{Adapter, Capability, InstanceRef, InstanceState};

/// Every contract check; answers the dialect the exec checks found.
pub(super) async fn contract_checks(
    r: &mut Runner,
    a: &dyn Adapter,
    declared: &[Capability],
) -> Option<Dialect> {
    let has = |c: Capability| declared.contains(&c);
    let installation = InstallationId::new();
    let id = SandboxId::new();
    let mut made = vec![id.clone()];

    r.check("health", lifecycle::health(a)).await;

    // Create, twice: the same instance.
    let mut first = None;
    r.check("create", async {
        let i = lifecycle::create(a, &id, &installation).await?;
        let d = format!("backendRef {}", i.backend_ref);
        first = Some(i);
        Ok(d)
    })
    .await;
    let Some(first) = first else {
        r.fail("contract", "nothing else can run without an instance");
        cleanup(a, &made).await;
        return None;
    };
    let cx = Ctx {
        a,
        at: InstanceRef {
            sandbox_id: id.clone(),
            backend_ref: first.backend_ref.clone(),
        },
        installation,
        id,
        fidelity: a.exec_fidelity(),
    };
    r.check("create.idempotent", lifecycle::create_idempotent(&cx))
        .await;
    r.check("create.ready", lifecycle::create_ready(&cx)).await;
    r.check("find", lifecycle::find(&cx)).await;
    r.check("list", lifecycle::list(&cx)).await;

    let programs = dialect(a, &cx.at).await;
    let p = programs_of(r, programs);
    exec_checks(r, &cx, p).await;
    if has(Capability::ExecStream) {
        r.check("exec.stream", stream::bytes(&cx)).await;
        r.check("exec.stream.stderr", stream::stderr(&cx, p)).await;
        r.check("exec.stream.timeout", stream::timeout(&cx)).await;
    } else {
        r.skip("exec.stream", "not declared");
    }
    process_checks(r, &cx, p, declared).await;
    if has(Capability::Files) {
        let f = Sample::new(&cx);
        r.check("files.upload-download", files::upload_download(&cx, &f))
            .await;
        r.check("files.range", files::range(&cx, &f)).await;
        r.check("files.list", files::list(&cx, &f)).await;
        r.check("files.mkdir", files::make_dir(&cx, &f)).await;
        r.check("files.not-found", files::not_found(&cx, &f)).await;
        r.check("files.delete", files::delete(&cx, &f)).await;
    } else {
        r.skip("files", "not declared");
    }
    for (cap, cycle) in CYCLES {
        if has(cap) {
            r.check(cap.name(), lifecycle::down_and_up(&cx, &cycle))
                .await;
        } else {
            r.skip(cap.name(), "not declared");
        }
    }
    if has(Capability::Snapshots) {
        let restored = SandboxId::new();
        made.push(restored.clone());
        r.check("snapshots", optional::snapshots(&cx, &restored))
            .await;
    } else {
        r.skip("snapshots", "not declared");
    }
    if has(Capability::PortsExpose) {
        r.check("ports.expose", optional::ports_expose(&cx)).await;
    } else {
        r.skip("ports.expose", "not declared");
    }
    if has(Capability::Warm) {
        r.check("warm", optional::warm(&cx)).await;
    } else {
        r.skip("warm", "not declared");
    }
    for cap in honesty::OPTIONAL {
        if !has(cap) {
            r.check(&format!("honesty.{cap}"), honesty::refused(&cx, cap))
                .await;
        }
    }
    r.check("delete", lifecycle::delete(&cx)).await;
    made.retain(|m| m != &cx.id);
    cleanup(a, &made).await;
    programs
}

/// The programs of the dialect found; without one, a failed check and POSIX's, so the
/// exec checks still run and say what they saw.
fn programs_of(r: &mut Runner, found: Option<Dialect>) -> &'static Programs {
    match found {
        Some(Dialect::Posix) => &POSIX,
        Some(Dialect::Fake) => &FAKE,
        None => {
            r.fail("exec.programs", "neither `sh -c 'exit 7'` nor `fake-exit 7` exits 7 with stderr through `sh -c`/`fake-stderr`");
            &POSIX
        }
    }
}

/// The buffered exec checks.
async fn exec_checks(r: &mut Runner, cx: &Ctx<'_>, p: &Programs) {
    r.check("exec.stdout", exec::stdout(cx)).await;
    r.check("exec.exit-code", exec::exit_code(cx, p)).await;
    r.check("exec.stderr", exec::stderr(cx, p)).await;
    r.check("exec.env", exec::env(cx)).await;
    r.check("exec.cwd", exec::cwd(cx)).await;
    r.check("exec.stdin", exec::stdin(cx)).await;
    r.check("exec.timeout", exec::timeout(cx)).await;
    r.check("exec.not-found", exec::not_found(cx)).await;
}

/// Background processes: plain ones on `exec.stream` (with stdin only where `exec.stdin` is
/// declared, refused otherwise), terminal ones on `exec.pty`.
async fn process_checks(r: &mut Runner, cx: &Ctx<'_>, p: &Programs, declared: &[Capability]) {
    let has = |c: Capability| declared.contains(&c);
    if has(Capability::ExecStream) {
        r.check("process.output", process::output(cx, p)).await;
        r.check("process.signal", process::signal(cx)).await;
        r.check("process.timeout", process::timeout(cx)).await;
        if has(Capability::ExecStdin) {
            r.check("process.stdin", process::stdin(cx)).await;
        } else {
            r.check("honesty.exec.stdin", process::stdin_refused(cx))
                .await;
        }
    } else {
        r.skip("process", "exec.stream not declared");
    }
    if has(Capability::ExecPty) {
        r.check("process.pty", process::terminal(cx)).await;
    } else {
        r.skip("process.pty", "exec.pty not declared");
    }
}

/// The lifecycle capabilities and their round trips.
const CYCLES: [(Capability, Cycle); 2] = [
    (
        Capability::LifecyclePause,
        Cycle {
            down: Verb::Pause,
            up: Verb::Resume,
            state: InstanceState::Paused,
            down_name: "pause",
            up_name: "resume",
        },
    ),
    (
        Capability::LifecycleStop,
        Cycle {
            down: Verb::Stop,
            up: Verb::Start,
            state: InstanceState::Stopped,
            down_name: "stop",
            up_name: "start",
        },
    ),
];
