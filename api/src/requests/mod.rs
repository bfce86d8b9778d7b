//! What every request passes through or may use before a handler's own work: the middleware
//! (request id, trace context, limits, the envelope of refusals), rate limits, strict JSON
//! bodies and query strings (one mapping of what serde refuses), NUL refusal, pagination,
//! `Idempotency-Key`, the errors hyper answers itself, and what the SSE streams share.

pub mod bare_errors;
pub mod body;
pub(crate) mod decode;
pub mod idempotency;
pub mod middleware;
pub mod nul;
pub mod page;
pub mod query;
pub mod ratelimit;
pub mod sse;
