//! The pool a sandbox runs in, as this replica has it configured, and what its adapter can
//! do: an operation the adapter does not implement is a 501, never a silent degrade.

use std::sync::Arc;

use differently_adapters::pools::Pool;
use differently_core::{ErrorCode, Sandbox};
use serde_json::json;

use crate::error::{ApiError, ApiResult};
use crate::AppState;

/// The sandbox's pool, or 409 if it has none yet (queued) and 503 if this replica does not
/// know it.
pub(crate) fn pool_of(state: &AppState, sandbox: &Sandbox) -> ApiResult<Arc<Pool>> {
    let Some(name) = &sandbox.pool else {
        return Err(status_conflict(sandbox, "the sandbox has no backend yet"));
    };
    named_pool(state, name)
}

/// The pool `name` as this replica has it configured.
pub(crate) fn named_pool(state: &AppState, name: &str) -> ApiResult<Arc<Pool>> {
    state.pools.get(name).ok_or_else(|| {
        ApiError::new(
            ErrorCode::ProviderUnavailable,
            "the sandbox's pool is not configured on this replica",
        )
    })
}

/// 501 unless the pool's adapter implements `capability`.
pub(crate) fn require_capability(pool: &Pool, capability: &str) -> ApiResult<()> {
    if pool.adapter.capabilities().iter().any(|c| c == capability) {
        Ok(())
    } else {
        Err(ApiError::new(
            ErrorCode::UnsupportedOperation,
            format!(
                "the sandbox's pool ({}) does not support {capability}",
                pool.adapter.kind()
            ),
        )
        .with_details(json!({ "capability": capability })))
    }
}

pub(crate) fn status_conflict(sandbox: &Sandbox, message: &str) -> ApiError {
    ApiError::new(
        ErrorCode::Conflict,
        format!("{message} (the sandbox is {})", sandbox.status),
    )
    .with_details(json!({ "status": sandbox.status }))
}

/// The pool's name as its work subject uses it.
pub(crate) fn pool_name(pool: &Pool) -> String {
    pool.view().name
}
