//! Signed webhooks: public events delivered to tenants' HTTPS endpoints.
//!
//! The path of an event: the public stream (`dly.pub.>`) → the fan-out
//! ([`engine::Deliverer::fan_out`]), run by one process at a time, which reads the stream in
//! order, writes one delivery row per matching webhook and only then moves its saved cursor
//! → the dispatcher ([`engine::Deliverer`]), which claims due rows under a
//! lease, re-checks the URL's resolved addresses ([`url_policy`]), POSTs the event signed as
//! Standard Webhooks does ([`signing`]), and records the attempt, its back-off
//! ([`schedule`]) or the webhook's automatic disabling. Postgres holds every attempt, so a
//! crash loses nothing; `docs/webhooks.md` states the guarantees.

pub mod engine;
pub mod schedule;
pub mod signing;
pub mod url_policy;

pub use engine::{Deliverer, DeliveryConfig};
pub use schedule::Backoff;
pub use signing::Secret;
pub use url_policy::{UrlError, UrlPolicy};

/// What the API needs to know about webhooks: where they may point and how long a rotated
/// secret keeps signing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiSettings {
    pub url_policy: UrlPolicy,
    /// How long the secret replaced by a rotation still signs deliveries (next to the new one).
    pub rotation_overlap: std::time::Duration,
}

/// The default overlap of a rotation: a day, long enough to roll the new secret out to
/// every receiver.
pub const DEFAULT_ROTATION_OVERLAP: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

impl Default for ApiSettings {
    fn default() -> Self {
        ApiSettings {
            url_policy: UrlPolicy::default(),
            rotation_overlap: DEFAULT_ROTATION_OVERLAP,
        }
    }
}
