//! The id of the HTTP request a piece of work serves. The API sets it per request (its
//! middleware, and the MCP endpoint for the `/v1` calls a tool makes); error bodies report it
//! and the store writes it into every audit record. It lives here, under both, because it is
//! the API's value that the store reads.
//!
//! The one place `core` touches tokio: a task-local is a value scoped to a future, not I/O
//! or a runtime, so the rest of `core` stays plain functions over plain data.

use std::future::Future;

tokio::task_local! {
    static REQUEST_ID: String;
}

/// Runs `f` with `id` as the current request id, for everything it awaits.
pub async fn with_request_id<F: Future>(id: String, f: F) -> F::Output {
    REQUEST_ID.scope(id, f).await
}

/// The request id of the current task, if the API set one.
pub fn current_request_id() -> Option<String> {
    REQUEST_ID.try_with(Clone::clone).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_is_set_inside_its_scope_only() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a current-thread runtime");
        assert_eq!(current_request_id(), None);
        let inside = rt.block_on(with_request_id("req_1".into(), async {
            current_request_id()
        }));
        assert_eq!(inside.as_deref(), Some("req_1"));
        assert_eq!(current_request_id(), None);
    }
}
