//! What the opt-in live runs share: reading their settings from the environment, timing
//! cases, and cleaning up from a `Drop` (which cannot await).

use std::future::Future;
use std::time::Instant;

/// One case's outcome and time, printed for the record (`--nocapture`).
pub fn done(case: &str, since: Instant) {
    eprintln!("live case {case}: ok in {} ms", since.elapsed().as_millis());
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
