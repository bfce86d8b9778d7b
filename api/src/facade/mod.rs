//! Other products' APIs served over Differently's own: each facade maps its wire format onto
//! the `/v1` handlers (dispatched in process, so auth, tenancy, quotas, placement and audit are
//! the very same code) and never reaches the store or a backend by another path.

pub mod e2b;
pub mod opensandbox;
