//! Locking shared in-process state.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, taking the data even if a panicking holder poisoned it: the
/// state these mutexes guard (caches, counters, test recordings) stays
/// consistent at every await-free step, so a panic elsewhere must not turn
/// every later caller into a second panic.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
