//! [`Lazy`]: an SDK client built the first time it is used.
//!
//! A function's first invocation pays for every client it builds: an SDK
//! client is its service's runtime components, endpoint resolver and
//! interceptors (about 0.1 ms each, BENCHMARKS.md), and the hot requests go
//! through [`crate::dynamo_http`] instead. So the SDK's clients are built
//! only by the first request that needs one: an ingest answering its first
//! event, or a deliver acking its first batch, builds none.

use std::fmt;
use std::sync::{Arc, OnceLock};

/// A value built on first use by a shared constructor; clones share it.
pub struct Lazy<T> {
    cell: Arc<OnceLock<T>>,
    make: Arc<dyn Fn() -> T + Send + Sync>,
}

impl<T> Lazy<T> {
    /// Built by `make` the first time [`Self::get`] is called (once, even
    /// when called from several tasks at once).
    pub fn new(make: impl Fn() -> T + Send + Sync + 'static) -> Self {
        Self {
            cell: Arc::new(OnceLock::new()),
            make: Arc::new(make),
        }
    }

    /// The value, built now if it was not yet.
    pub fn get(&self) -> &T {
        self.cell.get_or_init(|| (self.make)())
    }

    /// Whether it has been built (tests, the cold-start benchmark).
    pub fn is_built(&self) -> bool {
        self.cell.get().is_some()
    }
}

impl<T: Clone + Send + Sync + 'static> Lazy<T> {
    /// One already built.
    pub fn ready(value: T) -> Self {
        let cell = Arc::new(OnceLock::new());
        let _ = cell.set(value.clone());
        Self {
            cell,
            // Never called: the cell is set.
            make: Arc::new(move || value.clone()),
        }
    }
}

impl<T: Clone + Send + Sync + 'static> From<T> for Lazy<T> {
    fn from(value: T) -> Self {
        Self::ready(value)
    }
}

/// Like `std::sync::LazyLock`: using it builds it.
impl<T> std::ops::Deref for Lazy<T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.get()
    }
}

impl<T> Clone for Lazy<T> {
    fn clone(&self) -> Self {
        Self {
            cell: Arc::clone(&self.cell),
            make: Arc::clone(&self.make),
        }
    }
}

impl<T: fmt::Debug> fmt::Debug for Lazy<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.cell.get() {
            Some(value) => f.debug_tuple("Lazy").field(value).finish(),
            None => f.write_str("Lazy(not built)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn built_once_on_first_use_and_shared_by_clones() {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&calls);
        let lazy = Lazy::new(move || counted.fetch_add(1, Ordering::SeqCst) + 10);
        let clone = lazy.clone();
        assert!(!lazy.is_built());
        assert_eq!(format!("{lazy:?}"), "Lazy(not built)");
        assert_eq!(calls.load(Ordering::SeqCst), 0, "nothing built before use");
        assert_eq!(*clone.get(), 10);
        assert!(lazy.is_built(), "a clone's first use builds it for all");
        assert_eq!((*lazy.get(), *clone.get()), (10, 10));
        assert_eq!(calls.load(Ordering::SeqCst), 1, "built once");

        let ready = Lazy::ready(String::from("built"));
        assert!(ready.is_built());
        assert_eq!(ready.get(), "built");
    }

    #[test]
    fn concurrent_first_uses_build_once() {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&calls);
        let lazy = Lazy::new(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(5));
            7
        });
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let lazy = lazy.clone();
                std::thread::spawn(move || *lazy.get())
            })
            .collect();
        for handle in handles {
            assert_eq!(handle.join().expect("no panic"), 7);
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
