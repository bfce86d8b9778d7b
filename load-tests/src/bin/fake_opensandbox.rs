//! `differently-fake-opensandbox`: the adapter tests' fake OpenSandbox server
//! (`adapters/tests/opensandbox/fake_server.rs`, the real 1.1.1 server's behaviour with the
//! Docker runtime) as a process of its own, so the fault suite can run it inside a network
//! namespace and cut the link to it (S14). Every create and delete it serves is appended to
//! `--ledger` as a fake-adapter ledger line: the suite's ground truth for that backend.
//!
//! It listens only on loopback or a private (RFC 1918) address, the kind the suite gives its
//! own namespaces; anything else is refused. When both listeners are up it writes
//! `{"api": "http://IP:PORT/v1", "execd": "http://IP:PORT"}` to `--ready`.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// The adapters' test HTTP scaffolding, which the fake server (included below) uses as
/// `crate::support::http`.
#[allow(dead_code, clippy::unwrap_used, clippy::expect_used)]
#[path = "../../../adapters/tests/support/http.rs"]
mod support_http;
mod support {
    pub(crate) use super::support_http as http;
}
/// The fake's `/pty` (its `fake_server` names it as `crate::fake_pty`).
#[allow(dead_code, clippy::all)]
#[path = "../../../adapters/tests/opensandbox/fake_pty.rs"]
mod fake_pty;
#[allow(dead_code, clippy::unwrap_used, clippy::expect_used)]
#[path = "../../../adapters/tests/opensandbox/fake_server.rs"]
mod fake_server;
#[allow(dead_code)]
#[path = "../../../adapters/tests/opensandbox/fake_versions.rs"]
mod fake_versions;

use fake_server::{FakeRuntime, FakeServer, Variant};

/// A fake OpenSandbox server (the fault suite's out-of-process backend).
#[derive(Parser)]
#[command(name = "differently-fake-opensandbox")]
struct Args {
    /// Address to listen on: loopback, or a private address of a namespace the suite made.
    #[arg(long)]
    listen: IpAddr,
    /// The API key the server accepts is read from this environment variable.
    #[arg(long, default_value = "FAKE_OPENSANDBOX_API_KEY")]
    key_env: String,
    /// Ledger file (JSON lines, appended).
    #[arg(long)]
    ledger: PathBuf,
    /// Where to write the listeners' URLs once they are up.
    #[arg(long)]
    ready: PathBuf,
}

/// Loopback, or 10/8, 172.16/12, 192.168/16 (where the suite's namespaces live).
fn allowed(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback() || v4.is_private(),
        IpAddr::V6(v6) => v6.is_loopback(),
    }
}

fn main() -> ExitCode {
    let a = Args::parse();
    if !allowed(a.listen) {
        eprintln!(
            "refusing to listen on {}: only loopback or a private namespace address",
            a.listen
        );
        return ExitCode::from(2);
    }
    let key = match std::env::var(&a.key_env) {
        Ok(k) if !k.is_empty() => k,
        _ => {
            eprintln!("set {} to the API key the server accepts", a.key_env);
            return ExitCode::from(2);
        }
    };
    let ledger = match std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&a.ledger)
    {
        Ok(f) => f,
        Err(e) => {
            eprintln!("cannot open {}: {e}", a.ledger.display());
            return ExitCode::FAILURE;
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async move {
        let fake = FakeServer::start_on(a.listen, Variant::Real, FakeRuntime::Docker, &key).await;
        fake.set_ledger(ledger);
        let ready = serde_json::json!({"api": fake.api_url(), "execd": fake.execd_origin()});
        // Written whole under a temporary name, then renamed: a reader never sees half.
        let tmp = a.ready.with_extension("tmp");
        if let Err(e) =
            std::fs::write(&tmp, ready.to_string()).and_then(|()| std::fs::rename(&tmp, &a.ready))
        {
            eprintln!("cannot write {}: {e}", a.ready.display());
            return ExitCode::FAILURE;
        }
        eprintln!("fake opensandbox: serving {ready}");
        // Serve until killed (the suite stops it with SIGKILL, like every process it owns).
        std::future::pending::<()>().await;
        ExitCode::SUCCESS
    })
}
