//! Locking shared by every layer.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Lock a std mutex, ignoring poisoning (the data is plain values, and a
/// panicking holder leaves them as consistent as any other early return).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
