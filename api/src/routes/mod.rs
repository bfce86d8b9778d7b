//! One module per `/v1` resource, each with its own `router()`. Route modules depend on the
//! crate's support modules (`access`, `data_plane`, `mutation`, …), never on each other.

use axum::Router;

use crate::AppState;

pub mod audit;
pub mod event_credentials;
pub mod event_schemas;
pub mod events;
pub mod exec;
pub mod files;
pub mod keys;
pub mod lifecycle;
pub mod orgs;
pub mod placement;
pub mod policies;
pub mod pools;
pub mod ports;
pub mod processes;
pub mod projects;
pub mod pty;
pub mod queue;
pub mod quotas;
pub mod sandboxes;
pub mod secrets;
pub mod snapshots;
pub mod trust;
pub mod warm;
pub mod webhooks;

/// Every resource's routes.
pub fn router() -> Router<AppState> {
    Router::new()
        .merge(sandboxes::router())
        .merge(exec::router())
        .merge(processes::router())
        .merge(files::router())
        .merge(lifecycle::router())
        .merge(snapshots::router())
        .merge(ports::router())
        .merge(pty::router())
        .merge(events::router())
        .merge(event_schemas::router())
        .merge(event_credentials::router())
        .merge(orgs::router())
        .merge(projects::router())
        .merge(keys::router())
        .merge(quotas::router())
        .merge(audit::router())
        .merge(secrets::router())
        .merge(placement::router())
        .merge(policies::router())
        .merge(pools::router())
        .merge(warm::router())
        .merge(trust::router())
        .merge(queue::router())
        .merge(webhooks::router())
}
