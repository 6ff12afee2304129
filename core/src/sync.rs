//! Locking that survives a panic elsewhere.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex` even if a thread panicked while holding it: the data
/// behind Tally's locks (status, records, slots, counters) stays usable, and
/// one job's panic must not turn every later admin request into another.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
