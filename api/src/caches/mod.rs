//! Per-process copies of what the create path reads on every request and may see a second
//! late: the effective placement policies and every pool's warm classes.

pub mod policy;
pub mod warm;
