//! The homes of the two users E2B templates have, `/home/user` (the default user's) and
//! `/root`, where envd starts commands and resolves relative paths: E2B templates have them,
//! other images and devhost sandboxes may not, so the facade makes them with `/v1`'s
//! directory call. (`commands.run(…, user="root")` is common on E2B: package installs.)
//!
//! Create answers without waiting for it: the SDK spends longer building its sandbox object
//! than the call takes, so the home is there by its first request. Each API process remembers
//! the sandboxes whose home it made or is making ([`Homes`]); a command or file call that
//! relies on the home waits for a make under way here, and in a sandbox this process knows
//! nothing of (created through another API process, or through `/v1`) makes it first: once
//! per sandbox and process, a directory call that answers "already there" when another
//! process made it. Best effort throughout: a sandbox whose home cannot be made still works
//! with absolute paths.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::http::{Method, StatusCode};
use serde_json::json;
use tokio::sync::watch;

use crate::facade::opensandbox::inner::{q, Caller};

use super::Facade;

/// Longest a request waits for a make of the homes under way (a slow backend's directory
/// call); after it the request goes on, as it would on another API process.
const READY_WAIT: Duration = Duration::from_secs(10);

/// Sandboxes remembered at most, per process; past it the memory starts again (costing a
/// sandbox one more directory call).
const KNOWN_MAX: usize = 100_000;

/// The homes this process made (or tried to) and is making, by sandbox id.
#[derive(Default)]
pub struct Homes {
    pending: Mutex<HashMap<String, watch::Receiver<bool>>>,
    known: Mutex<HashSet<String>>,
}

impl Homes {
    /// Starts making `sandbox`'s homes, in the background.
    pub fn begin(f: &Arc<Facade>, caller: Caller, sandbox: &str) {
        let (done, rx) = watch::channel(false);
        lock(&f.homes.pending).insert(sandbox.to_owned(), rx);
        let (f, sandbox) = (f.clone(), sandbox.to_owned());
        tokio::spawn(async move {
            make(&f, &caller, &sandbox).await;
            f.homes.remember(&sandbox);
            lock(&f.homes.pending).remove(&sandbox);
            let _ = done.send(true);
        });
    }

    /// Returns once `sandbox`'s homes have been made by this process: at once when they were,
    /// after a make under way here (at most [`READY_WAIT`]), or after making it now.
    pub async fn ensure(&self, f: &Facade, caller: &Caller, sandbox: &str) {
        let pending = lock(&self.pending).get(sandbox).cloned();
        if let Some(mut rx) = pending {
            let _ = tokio::time::timeout(READY_WAIT, rx.wait_for(|done| *done)).await;
            return;
        }
        if lock(&self.known).contains(sandbox) {
            return;
        }
        make(f, caller, sandbox).await;
        self.remember(sandbox);
    }

    fn remember(&self, sandbox: &str) {
        let mut known = lock(&self.known);
        if known.len() >= KNOWN_MAX {
            known.clear();
        }
        known.insert(sandbox.to_owned());
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The default user's home (`/home/` and [`super::envd::DEFAULT_USER`]), compared on every
/// `Start` and filesystem call, so a constant rather than a string built each time.
pub const DEFAULT_HOME: &str = "/home/user";

/// `root`'s home, the other one [`make`] makes.
pub const ROOT_HOME: &str = "/root";

/// The homes [`make`] makes.
pub const MADE: [&str; 2] = [DEFAULT_HOME, ROOT_HOME];

/// Whether `home` is one the facade makes (so a call relying on it waits for [`Homes`]).
pub fn is_made(home: &str) -> bool {
    MADE.contains(&home)
}

/// Makes the [`MADE`] homes in `sandbox` (`POST …/files/directories` each, at once; for a
/// key without `files:write`, one `mkdir -p` through `/v1` exec, as its commands run);
/// failures are logged, not raised.
pub async fn make(f: &Facade, caller: &Caller, sandbox: &str) {
    let uri = format!("/v1/sandboxes/{}/files/directories", q(sandbox));
    let one = |home: &'static str| {
        let body = json!({ "path": home });
        let uri = &uri;
        async move { f.json(caller, Method::POST, uri, Some(&body), &[]).await }
    };
    let (user, root) = tokio::join!(one(DEFAULT_HOME), one(ROOT_HOME));
    let refused = |r: &Result<_, super::InnerError>| {
        matches!(r, Err(super::InnerError::Answer(StatusCode::FORBIDDEN, _)))
    };
    let made = if refused(&user) || refused(&root) {
        let uri = format!("/v1/sandboxes/{}/exec", q(sandbox));
        let body = json!({ "command": ["mkdir", "-p", DEFAULT_HOME, ROOT_HOME] });
        vec![f.json(caller, Method::POST, &uri, Some(&body), &[]).await]
    } else {
        vec![user, root]
    };
    for e in made.into_iter().filter_map(Result::err) {
        let why = match e {
            super::InnerError::Answer(status, b) => {
                format!("{status}: {}", String::from_utf8_lossy(&b))
            }
            super::InnerError::Facade(e) => e.message,
        };
        tracing::debug!(sandbox, error = %why, "e2b facade: no home directory");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_made_homes_are_the_default_users_and_roots() {
        assert_eq!(
            DEFAULT_HOME,
            format!("/home/{}", super::super::envd::DEFAULT_USER)
        );
        assert!(is_made("/home/user") && is_made("/root"));
        assert!(!is_made("/home/alice"));
    }

    #[test]
    fn the_memory_is_bounded() {
        let homes = Homes::default();
        for i in 0..KNOWN_MAX + 5 {
            homes.remember(&format!("sbx_{i}"));
        }
        assert!(lock(&homes.known).len() <= KNOWN_MAX);
        assert!(lock(&homes.known).contains(&format!("sbx_{}", KNOWN_MAX + 4)));
    }
}
