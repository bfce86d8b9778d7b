//! What the opt-in live runs share: reading their settings from the environment (and failing,
//! naming the variables, when they are not set), timing cases, and cleaning up from a `Drop`
//! (which cannot await).

use std::future::Future;
use std::time::{Duration, Instant};

use differently_adapters::Adapter;
use differently_core::SandboxId;

/// One case's outcome and time, printed for the record (`--nocapture`).
pub fn done(case: &str, since: Instant) {
    eprintln!("live case {case}: ok in {} ms", since.elapsed().as_millis());
}

/// The values of the environment variables `vars`, in their order. A live run asked for
/// (`--ignored`) without them fails naming each one missing and the `optional` ones it also
/// reads: it must never pass having run nothing.
pub fn required<const N: usize>(vars: [&str; N], optional: &[&str], run: &str) -> [String; N] {
    let missing: Vec<&str> = vars
        .iter()
        .copied()
        .filter(|v| std::env::var(v).is_err())
        .collect();
    let optional = if optional.is_empty() {
        String::new()
    } else {
        format!(" (and optionally {})", optional.join(", "))
    };
    assert!(
        missing.is_empty(),
        "set {}{optional} to run the live {run} test",
        missing.join(", ")
    );
    vars.map(|v| std::env::var(v).unwrap_or_default())
}

/// The adapter of a live run whose provider takes an API key: the key by the name of
/// `key_var` (which must be set), `readySeconds` at `ready_seconds`, and each `(variable,
/// setting)` pair's variable, when set, as that setting; `new` builds it from its config.
pub fn keyed_adapter<C, A, E>(
    run: &str,
    key_var: &str,
    ready_seconds: u64,
    optional: &[(&str, &str)],
    new: impl FnOnce(C) -> Result<A, E>,
) -> A
where
    C: serde::de::DeserializeOwned,
    E: std::fmt::Debug,
{
    let names: Vec<&str> = optional.iter().map(|(var, _)| *var).collect();
    required([key_var], &names, run);
    let settings = with_keys_from(
        serde_json::json!({"apiKeyEnv": key_var, "timeouts": {"readySeconds": ready_seconds}}),
        optional,
    );
    super::built(settings, new)
}

/// `settings` with the JSON object in environment variable `var` (when set) merged over it;
/// malformed JSON fails the test, naming the variable's role.
pub fn with_settings_from(mut settings: serde_json::Value, var: &str) -> serde_json::Value {
    if let Ok(extra) = std::env::var(var) {
        let extra: serde_json::Value = serde_json::from_str(&extra).expect("settings JSON");
        for (k, v) in extra.as_object().expect("settings object") {
            settings[k] = v.clone();
        }
    }
    settings
}

/// `settings` with each `(variable, key)` pair's variable, when set, as the key's string.
pub fn with_keys_from(
    mut settings: serde_json::Value,
    pairs: &[(&str, &str)],
) -> serde_json::Value {
    for (var, key) in pairs {
        if let Ok(val) = std::env::var(var) {
            settings[*key] = serde_json::Value::String(val);
        }
    }
    settings
}

/// Runs `work` to its end on a runtime of its own, from synchronous code such as `Drop`
/// (the test's runtime may be the one panicking); `false` when it panicked.
pub fn block_on_aside<F: Future + Send>(work: F) -> bool {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(work);
            })
            .join()
            .is_ok()
    })
}

/// Deletes what a live run made (its sandboxes, then a snapshot) when dropped, so an
/// assertion failing half way does not leave a billed sandbox behind.
pub struct Cleanup<'a, A: Adapter> {
    adapter: &'a A,
    /// The sandboxes to delete, in order.
    pub sandboxes: Vec<SandboxId>,
    /// A snapshot (its backend ref) to delete after them.
    pub snapshot: Option<String>,
    attempts: u32,
    by_hand: String,
}

impl<'a, A: Adapter> Cleanup<'a, A> {
    /// A guard over `sandboxes`; `by_hand` says what to delete by hand if cleaning up fails.
    pub fn new(adapter: &'a A, sandboxes: Vec<SandboxId>, by_hand: impl Into<String>) -> Self {
        Cleanup {
            adapter,
            sandboxes,
            snapshot: None,
            attempts: 1,
            by_hand: by_hand.into(),
        }
    }

    /// Tries each delete up to `attempts` times, 3 s apart, while the provider answers with a
    /// retryable error (a sandbox still settling refuses deletion for a while).
    pub fn retrying(mut self, attempts: u32) -> Self {
        self.attempts = attempts.max(1);
        self
    }
}

impl<A: Adapter> Drop for Cleanup<'_, A> {
    fn drop(&mut self) {
        let adapter = self.adapter;
        let (attempts, by_hand) = (self.attempts, self.by_hand.as_str());
        let sandboxes = std::mem::take(&mut self.sandboxes);
        let snapshot = self.snapshot.take();
        let done = block_on_aside(async {
            for sandbox in &sandboxes {
                for attempt in 1..=attempts {
                    match adapter.delete(sandbox).await {
                        Ok(()) => break,
                        Err(e) if e.is_retryable() && attempt < attempts => {
                            tokio::time::sleep(Duration::from_secs(3)).await
                        }
                        Err(e) => {
                            eprintln!("cleanup: delete {sandbox} failed: {e}; {by_hand}");
                            break;
                        }
                    }
                }
            }
            if let Some(s) = snapshot {
                if let Err(e) = adapter.delete_snapshot(&s).await {
                    eprintln!("cleanup: snapshot delete failed: {e}; {by_hand}");
                }
            }
        });
        if !done {
            eprintln!("cleanup panicked; {by_hand}");
        }
    }
}
