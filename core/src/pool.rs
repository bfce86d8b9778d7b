//! What placement needs to know about a pool.

use serde::{Deserialize, Serialize};

/// Whether a pool runs on infrastructure the operator controls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Trust {
    Private,
    External,
}

/// A pool as the placement decision sees it at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolView {
    pub name: String,
    pub kind: String,
    pub trust: Trust,
    pub region: Option<String>,
    pub capabilities: Vec<String>,
    /// Concurrency cap (slots), if any.
    pub max_concurrent: Option<u32>,
    pub healthy: bool,
}

impl PoolView {
    /// Whether the pool offers every capability in `required`.
    pub fn offers_all(&self, required: &[String]) -> bool {
        required.iter().all(|c| self.capabilities.contains(c))
    }
}

/// Pool names are used in bus subjects, so they are kept to a safe alphabet.
pub fn validate_pool_name(name: &str) -> Result<(), crate::FieldError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(crate::FieldError::new(
            "name",
            "pool names are 1-63 characters of a-z, 0-9 and -, not starting with -",
        ))
    }
}
