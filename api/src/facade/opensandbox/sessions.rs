//! execd's bash sessions (`POST /session`, `POST /session/{sid}/run`, `DELETE /session/{sid}`)
//! over `/v1` execs. `/v1` has no sessions, so a session's state — its working directory,
//! which is what execd keeps between runs (a plain shell variable does not survive there
//! either) — lives in the sandbox, in a file per session under [`STATE_DIR`]. Any API process
//! can therefore serve any run of a session, an API restart loses nothing, and the session
//! ends with its sandbox. Every run is one audited `/v1` exec.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use axum::body::Bytes;
use axum::extract::Path;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::Response;
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Value};

use super::commands::TAG_SESSION;
use super::error::{OsbError, OsbResult};
use super::execd::{execd_caller, stream_exec};
use super::inner::{q, Caller};
use super::lifecycle::live_sandbox;
use super::Facade;

/// Where a sandbox keeps its sessions' working directories (one file each). `/var/tmp`, not
/// `/tmp`: it survives where `/tmp` is a fresh tmpfs per command (devhost under bubblewrap).
pub const STATE_DIR: &str = "/var/tmp/.differently-sessions";

/// Sessions this process created or has seen, so a run skips the existence check.
const KNOWN_MAX: usize = 4096;

/// `POST /session`: makes the state file, starting in `cwd` when given. Args: `$1` session id,
/// `$2` cwd (may be empty).
const CREATE: &str = r#"d=/var/tmp/.differently-sessions
mkdir -p "$d" || exit 70
if [ -n "$2" ]; then cd "$2" 2>/dev/null || { echo "no such directory: $2" >&2; exit 71; }; fi
pwd > "$d/$1""#;

/// Whether the session exists. Args: `$1` session id.
const EXISTS: &str = r#"[ -f "/var/tmp/.differently-sessions/$1" ]"#;

/// `DELETE /session/{sid}`. Args: `$1` session id.
const DELETE: &str = r#"f="/var/tmp/.differently-sessions/$1"
[ -f "$f" ] || exit 1
rm -f "$f""#;

/// `POST /session/{sid}/run`: enters the session's directory (or `$2`), runs `$3` in the same
/// shell (bash where the image has it, as execd does; `sh` otherwise) so a `cd` in it counts,
/// and saves where it ended. Exit status is the command's.
const RUN: &str = r#"f="/var/tmp/.differently-sessions/$1"
if [ -n "$2" ]; then cd "$2" || exit 1; else cd "$(cat "$f" 2>/dev/null)" 2>/dev/null || true; fi
if command -v bash >/dev/null 2>&1; then s=bash; else s=sh; fi
exec "$s" -c 'eval "$1"
__differently_rc=$?
pwd > "$2" 2>/dev/null
exit $__differently_rc' differently-session "$3" "$f""#;

/// Which sessions this process knows to exist, per sandbox.
#[derive(Default)]
pub struct KnownSessions {
    inner: Mutex<HashSet<(String, String)>>,
}

impl KnownSessions {
    fn note(&self, sandbox: &str, sid: &str) {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if g.len() >= KNOWN_MAX {
            g.clear();
        }
        g.insert((sandbox.to_owned(), sid.to_owned()));
    }

    fn knows(&self, sandbox: &str, sid: &str) -> bool {
        let g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        g.contains(&(sandbox.to_owned(), sid.to_owned()))
    }

    fn forget(&self, sandbox: &str, sid: &str) {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        g.remove(&(sandbox.to_owned(), sid.to_owned()));
    }
}

/// A session id this facade could have issued: it becomes a file name inside the sandbox, so
/// nothing else (no `/`, no `..`) is ever passed on.
fn valid_session_id(sid: &str) -> bool {
    sid.len() <= 64
        && sid.starts_with("session-")
        && sid[8..]
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && sid.len() > 8
}

fn session_not_found(sid: &str) -> OsbError {
    OsbError::new(
        StatusCode::NOT_FOUND,
        "SESSION_NOT_FOUND",
        format!("session {sid} not found"),
    )
}

/// `/bin/sh -c SCRIPT differently-session ARGS…`: arguments travel as positional parameters,
/// never spliced into the script.
fn sh(script: &str, args: &[&str]) -> Vec<String> {
    let mut argv = vec![
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        script.to_owned(),
        "differently-session".to_owned(),
    ];
    argv.extend(args.iter().map(|a| (*a).to_owned()));
    argv
}

/// Runs `argv` as a buffered `/v1` exec: (exit code, stderr).
async fn run_buffered(
    f: &Facade,
    caller: &Caller,
    id: &str,
    argv: Vec<String>,
) -> OsbResult<(i64, String)> {
    let (_, r) =
        f.v1.json(
            caller,
            Method::POST,
            &format!("/v1/sandboxes/{}/exec", q(id)),
            Some(&json!({ "command": argv, "timeoutSeconds": 60 })),
        )
        .await?;
    Ok((
        r["exitCode"].as_i64().unwrap_or(-1),
        r["stderr"].as_str().unwrap_or("").trim().to_owned(),
    ))
}

fn runtime_error(stderr: String) -> OsbError {
    OsbError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "RUNTIME_ERROR",
        if stderr.is_empty() {
            "the session command failed".to_owned()
        } else {
            stderr
        },
    )
}

fn parse<T: serde::de::DeserializeOwned>(body: &Bytes, empty_ok: bool) -> OsbResult<T> {
    let raw: &[u8] = if empty_ok && body.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        body
    };
    crate::requests::body::read(raw).map_err(|e| OsbError::json("INVALID_REQUEST_BODY", e))
}

/// `POST /session` body (optional).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateSession {
    cwd: Option<String>,
}

/// `POST /session` → `{"session_id"}`.
pub async fn create(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> OsbResult<Json<Value>> {
    let caller = execd_caller(&f, &headers, &id)?;
    let req: CreateSession = parse(&body, true)?;
    live_sandbox(&f, &caller, &id).await?;
    let sid = format!(
        "session-{}",
        ulid::Ulid::new().to_string().to_ascii_lowercase()
    );
    let cwd = req.cwd.unwrap_or_default();
    match run_buffered(&f, &caller, &id, sh(CREATE, &[&sid, &cwd])).await? {
        (0, _) => {
            f.sessions.note(&id, &sid);
            Ok(Json(json!({ "session_id": sid })))
        }
        (71, _) => Err(OsbError::new(
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST_BODY",
            format!("cwd: no such directory: {cwd}"),
        )),
        (_, stderr) => Err(runtime_error(stderr)),
    }
}

/// `POST /session/{sid}/run` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunInSession {
    command: String,
    cwd: Option<String>,
    /// Milliseconds.
    timeout: Option<u64>,
}

/// `POST /session/{sid}/run` → the command's event stream, as `POST /command`.
pub async fn run(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path((id, sid)): Path<(String, String)>,
    body: Bytes,
) -> OsbResult<Response> {
    let caller = execd_caller(&f, &headers, &id)?;
    let req: RunInSession = parse(&body, false)?;
    if req.command.trim().is_empty() {
        return Err(OsbError::new(
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST_BODY",
            "command: required",
        ));
    }
    if !valid_session_id(&sid) {
        return Err(session_not_found(&sid));
    }
    if !f.sessions.knows(&id, &sid) {
        match run_buffered(&f, &caller, &id, sh(EXISTS, &[&sid])).await? {
            (0, _) => f.sessions.note(&id, &sid),
            (1, _) => return Err(session_not_found(&sid)),
            (_, stderr) => return Err(runtime_error(stderr)),
        }
    }
    let cwd = req.cwd.unwrap_or_default();
    let mut v1 = json!({ "command": sh(RUN, &[&sid, &cwd, &req.command]) });
    if let Some(ms) = req.timeout.filter(|ms| *ms > 0) {
        v1["timeoutSeconds"] = json!(ms.div_ceil(1000));
    }
    stream_exec(&f, &caller, &id, v1, TAG_SESSION, false).await
}

/// `DELETE /session/{sid}`.
pub async fn delete(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path((id, sid)): Path<(String, String)>,
) -> OsbResult<StatusCode> {
    let caller = execd_caller(&f, &headers, &id)?;
    if !valid_session_id(&sid) {
        return Err(session_not_found(&sid));
    }
    live_sandbox(&f, &caller, &id).await?;
    f.sessions.forget(&id, &sid);
    match run_buffered(&f, &caller, &id, sh(DELETE, &[&sid])).await? {
        (0, _) => Ok(StatusCode::OK),
        (1, _) => Err(session_not_found(&sid)),
        (_, stderr) => Err(runtime_error(stderr)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_issued_session_ids_reach_the_sandbox() {
        assert!(valid_session_id("session-01jabc0123"));
        for bad in [
            "session-",
            "session-../../etc/passwd",
            "session-A1",
            "x-01jabc",
            "../session-1",
            &format!("session-{}", "1".repeat(60)),
        ] {
            assert!(!valid_session_id(bad), "{bad}");
        }
    }

    #[test]
    fn arguments_are_positional_never_spliced() {
        let argv = sh(RUN, &["session-1", "", "echo '$(rm -rf /)'"]);
        assert_eq!(argv[..2], ["/bin/sh", "-c"]);
        assert_eq!(argv[2], RUN);
        assert_eq!(argv[3], "differently-session");
        assert_eq!(argv[4..], ["session-1", "", "echo '$(rm -rf /)'"]);
        assert!(CREATE.contains(STATE_DIR) && RUN.contains(STATE_DIR));
        assert!(EXISTS.contains(STATE_DIR) && DELETE.contains(STATE_DIR));
    }

    #[test]
    fn the_scripts_keep_a_sessions_directory_between_runs() {
        // The real scripts under the machine's /bin/sh, with the state directory redirected
        // into a temporary one, so what the sandbox runs is what is tested.
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path().join("state");
        let work = tmp.path().join("work");
        std::fs::create_dir_all(work.join("sub")).unwrap();
        let run = |script: &str, args: &[&str]| {
            let script = script.replace(STATE_DIR, state.to_str().unwrap());
            let out = std::process::Command::new("/bin/sh")
                .arg("-c")
                .arg(&script)
                .arg("differently-session")
                .args(args)
                .current_dir(&work)
                .output()
                .unwrap();
            (
                out.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&out.stdout).trim().to_owned(),
            )
        };
        let sid = "session-1";
        assert_eq!(run(EXISTS, &[sid]).0, 1);
        assert_eq!(run(CREATE, &[sid, "/nonexistent-dir-x"]).0, 71);
        assert_eq!(run(CREATE, &[sid, work.to_str().unwrap()]).0, 0);
        assert_eq!(run(EXISTS, &[sid]).0, 0);
        assert_eq!(run(RUN, &[sid, "", "cd sub && echo in"]), (0, "in".into()));
        let (code, pwd) = run(RUN, &[sid, "", "pwd"]);
        assert_eq!((code, pwd.ends_with("/work/sub")), (0, true), "{pwd}");
        assert_eq!(run(RUN, &[sid, "", "exit 4"]).0, 4);
        let (_, pwd) = run(RUN, &[sid, "", "pwd"]);
        assert!(
            pwd.ends_with("/work/sub"),
            "an exit keeps the directory: {pwd}"
        );
        let (_, pwd) = run(RUN, &[sid, work.to_str().unwrap(), "pwd"]);
        assert!(pwd.ends_with("/work"), "a run's cwd overrides: {pwd}");
        assert_eq!(run(DELETE, &[sid]).0, 0);
        assert_eq!(run(DELETE, &[sid]).0, 1);
        assert_eq!(run(EXISTS, &[sid]).0, 1);
    }
}
