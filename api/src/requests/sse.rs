//! What the server-sent event streams (`/v1/events`, streamed exec) share.

use std::time::Duration;

/// Interval of `: ping` comments (SSE) or heartbeat frames on a quiet stream: short enough
/// that proxies and clients do not take a quiet stream for a dead one.
pub const HEARTBEAT: Duration = Duration::from_secs(15);
