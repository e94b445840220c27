//! Locking that survives a poisoned mutex: a thread that panicked while holding a lock
//! is a bug, but every request after it must still be served (counters, maps of held
//! requests); the data is used as the panicking thread left it.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, recovering it if a holder panicked.
pub fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
