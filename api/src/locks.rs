//! A poison-tolerant lock: the mutexes of this crate guard plain data (maps, buffers, a
//! pending event), which a panic while holding one leaves consistent, so a poisoned lock is
//! used as it is rather than failing every later request.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking over a poisoned lock's data.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
