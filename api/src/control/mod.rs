//! The control plane as the API drives it: changes of a sandbox through the pool's workers
//! ([`mutation`]), what a request publishes once it has committed ([`after_commit`]), the
//! event hub that wakes the requests waiting on a sandbox ([`event_hub`]), the placement
//! decision at admission ([`placement_decision`]) and a sandbox's pool ([`sandbox_pool`]).

pub mod after_commit;
pub mod event_hub;
pub mod mutation;
pub mod placement_decision;
pub mod sandbox_pool;
