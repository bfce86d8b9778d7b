//! The process's audit keys, installed once from server configuration. Process-global
//! because one server has one configuration and every store transaction signs with it; kept
//! apart from the key type so the crypto stays free of process state.

use super::{AuditKey, AuditKeyring};

static PROCESS_KEY: std::sync::OnceLock<AuditKey> = std::sync::OnceLock::new();
static PROCESS_PREVIOUS_KEYS: std::sync::OnceLock<Vec<AuditKey>> = std::sync::OnceLock::new();

/// Installs retired keys that `verify` still accepts (key rotation). Fails if already set.
pub fn set_process_previous_keys(keys: Vec<AuditKey>) -> Result<(), Vec<AuditKey>> {
    PROCESS_PREVIOUS_KEYS.set(keys)
}

/// The process's signing key and its retired keys.
pub fn process_keyring() -> AuditKeyring {
    AuditKeyring::new(process_key().clone())
        .with_previous(PROCESS_PREVIOUS_KEYS.get().cloned().unwrap_or_default())
}

/// Installs the process's audit key (from server configuration) before the store writes.
/// The key is process-wide because one server has one configuration and the audit helpers
/// are shared by every transaction. Fails if a key was already installed or generated.
pub fn set_process_key(key: AuditKey) -> Result<(), AuditKey> {
    PROCESS_KEY.set(key)
}

/// Whether a key was installed or generated already.
pub fn process_key_is_set() -> bool {
    PROCESS_KEY.get().is_some()
}

/// The process's audit key; without a configured one, a random key for this process only
/// (logged once, never shown): fine for `dev` and tests, unverifiable after a restart.
pub fn process_key() -> &'static AuditKey {
    PROCESS_KEY.get_or_init(|| {
        tracing::warn!(
            "no audit key configured: using a random key for this process only; records it \
             writes cannot be verified after it exits (set DIFFERENTLY_AUDIT_KEY)"
        );
        match AuditKey::random() {
            Ok(k) => k,
            // Without randomness nothing secure can run; a fixed key would be worse.
            Err(e) => panic!("cannot create an audit key: {e}"),
        }
    })
}
