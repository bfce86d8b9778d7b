//! Other products' APIs served over Differently's own: each facade maps its wire format onto
//! the `/v1` handlers (dispatched in process, so auth, tenancy, quotas, placement and audit are
//! the very same code) and never reaches the store or a backend by another path.
//!
//! A module tree of this crate rather than a crate of its own: a facade is one more client of
//! the `/v1` router, called in process, and shares what the API keeps crate-private: the data
//! plane's walk and its terminal sessions (the OpenSandbox PTY opens through
//! [`crate::routes::pty`]), the principal and delegated keys of [`crate::auth`], and the request
//! id the audit records carry. A crate apart would have to make those public to every crate,
//! or serve the facade over HTTP, paying a hop per call.

pub mod e2b;
pub mod opensandbox;
