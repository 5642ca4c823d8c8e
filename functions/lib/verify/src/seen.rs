//! Receiver idempotency (the seed's "Idempotência no receiver"): process each
//! message id once, even when the sender delivers it again.
//!
//! The protocol is claim -> process -> mark, so that two concurrent copies of
//! one message cannot both be processed:
//! 1. [`SeenStore::claim`] atomically records "in progress" with a short lease.
//!    A second claim while the lease runs answers [`Claim::InProgress`]; after
//!    the id was marked processed it answers [`Claim::AlreadyProcessed`].
//! 2. On success [`SeenStore::mark_processed`] keeps the id for a long TTL
//!    (default 7 days, longer than the sender's retry window).
//! 3. On failure [`SeenStore::release`] forgets the claim so the sender's retry
//!    is processed; if the process dies instead, the lease expires.

use std::collections::HashMap;
use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// Default retention of processed ids.
pub const DEFAULT_PROCESSED_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// Default lease of an in-progress claim.
pub const DEFAULT_CLAIM_LEASE: Duration = Duration::from_secs(60);

/// The answer to a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// This caller owns the id now and must process it, then mark or release it.
    Claimed,
    /// The id was processed before: answer 2xx without processing again.
    AlreadyProcessed,
    /// Another copy is being processed right now: answer a retryable status
    /// (e.g. 409 or 503) so the sender tries again later.
    InProgress,
}

/// A store of seen message ids failed (network, throttling, ...).
#[derive(Debug, thiserror::Error)]
#[error("seen store: {0}")]
pub struct SeenStoreError(#[source] pub Box<dyn StdError + Send + Sync>);

/// Where a receiver remembers which message ids it processed.
pub trait SeenStore: Send + Sync {
    /// Atomically claims `id` for `lease` unless it is processed or claimed.
    fn claim(
        &self,
        id: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<Claim, SeenStoreError>> + Send;
    /// Records `id` as processed for `ttl`.
    fn mark_processed(
        &self,
        id: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<(), SeenStoreError>> + Send;
    /// Drops an in-progress claim (processing failed; let a retry in).
    fn release(&self, id: &str) -> impl Future<Output = Result<(), SeenStoreError>> + Send;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EntryState {
    InProgress,
    Processed,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    state: EntryState,
    expires_at: SystemTime,
}

type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// In-memory [`SeenStore`] for tests and single-instance services. Expired ids
/// are dropped lazily and swept when the map grows.
pub struct MemorySeenStore {
    entries: Mutex<HashMap<String, Entry>>,
    clock: Clock,
}

impl fmt::Debug for MemorySeenStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemorySeenStore")
            .field("len", &self.len())
            .finish()
    }
}

impl Default for MemorySeenStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemorySeenStore {
    /// A store on the system clock.
    pub fn new() -> Self {
        Self::with_clock(SystemTime::now)
    }

    /// A store on an injected clock (tests).
    pub fn with_clock(clock: impl Fn() -> SystemTime + Send + Sync + 'static) -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
            clock: Arc::new(clock),
        }
    }

    /// Number of live (unexpired) entries.
    pub fn len(&self) -> usize {
        let now = (self.clock)();
        self.lock().values().filter(|e| e.expires_at > now).count()
    }

    /// True when no live entry exists.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        // A poisoned lock only means another thread panicked mid-update of a
        // plain map; its data is still consistent enough to use.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn claim_now(&self, id: &str, lease: Duration) -> Claim {
        let now = (self.clock)();
        let mut entries = self.lock();
        if entries.len() >= 4096 && entries.len().is_power_of_two() {
            entries.retain(|_, e| e.expires_at > now);
        }
        match entries.get(id) {
            Some(e) if e.expires_at > now && e.state == EntryState::Processed => {
                Claim::AlreadyProcessed
            }
            Some(e) if e.expires_at > now => Claim::InProgress,
            _ => {
                entries.insert(
                    id.to_owned(),
                    Entry {
                        state: EntryState::InProgress,
                        expires_at: now + lease,
                    },
                );
                Claim::Claimed
            }
        }
    }
}

impl SeenStore for MemorySeenStore {
    async fn claim(&self, id: &str, lease: Duration) -> Result<Claim, SeenStoreError> {
        Ok(self.claim_now(id, lease))
    }

    async fn mark_processed(&self, id: &str, ttl: Duration) -> Result<(), SeenStoreError> {
        let now = (self.clock)();
        self.lock().insert(
            id.to_owned(),
            Entry {
                state: EntryState::Processed,
                expires_at: now + ttl,
            },
        );
        Ok(())
    }

    async fn release(&self, id: &str) -> Result<(), SeenStoreError> {
        let mut entries = self.lock();
        if matches!(entries.get(id), Some(e) if e.state == EntryState::InProgress) {
            entries.remove(id);
        }
        Ok(())
    }
}

/// What [`process_once`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Processed<T> {
    /// The processing function ran and succeeded (answer 2xx).
    Done(T),
    /// Seen before; nothing ran (answer 2xx).
    Duplicate,
    /// Another copy is in progress; nothing ran (answer a retryable status).
    InProgress,
}

/// Why [`process_once`] failed. Either way the id is not marked processed, so
/// answer 5xx and let the sender retry.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError<E> {
    #[error(transparent)]
    Store(#[from] SeenStoreError),
    #[error("processing failed: {0}")]
    Handler(E),
}

/// Claims `id`, runs `process`, then marks the id processed for `ttl` (success)
/// or releases the claim (failure).
pub async fn process_once<S, F, Fut, T, E>(
    store: &S,
    id: &str,
    lease: Duration,
    ttl: Duration,
    process: F,
) -> Result<Processed<T>, ProcessError<E>>
where
    S: SeenStore + ?Sized,
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    match store.claim(id, lease).await? {
        Claim::AlreadyProcessed => return Ok(Processed::Duplicate),
        Claim::InProgress => return Ok(Processed::InProgress),
        Claim::Claimed => {}
    }
    match process().await {
        Ok(value) => {
            store.mark_processed(id, ttl).await?;
            Ok(Processed::Done(value))
        }
        Err(err) => {
            store.release(id).await?;
            Err(ProcessError::Handler(err))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

    fn fake_clock() -> (Arc<AtomicU64>, MemorySeenStore) {
        let secs = Arc::new(AtomicU64::new(1_700_000_000));
        let c = secs.clone();
        let store = MemorySeenStore::with_clock(move || {
            SystemTime::UNIX_EPOCH + Duration::from_secs(c.load(Ordering::SeqCst))
        });
        (secs, store)
    }

    #[tokio::test]
    async fn duplicate_is_processed_once() {
        let store = MemorySeenStore::new();
        let runs = AtomicUsize::new(0);
        for expected in [
            Processed::Done(()),
            Processed::Duplicate,
            Processed::Duplicate,
        ] {
            let got = process_once(
                &store,
                "msg_1",
                DEFAULT_CLAIM_LEASE,
                DEFAULT_PROCESSED_TTL,
                || async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, String>(())
                },
            )
            .await
            .unwrap();
            assert_eq!(got, expected);
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn failed_processing_is_not_marked_and_retry_succeeds_once() {
        let store = MemorySeenStore::new();
        let err = process_once(
            &store,
            "msg_1",
            DEFAULT_CLAIM_LEASE,
            DEFAULT_PROCESSED_TTL,
            || async { Err::<(), _>("db down") },
        )
        .await;
        assert!(matches!(err, Err(ProcessError::Handler("db down"))));
        let ok = process_once(
            &store,
            "msg_1",
            DEFAULT_CLAIM_LEASE,
            DEFAULT_PROCESSED_TTL,
            || async { Ok::<_, &str>(7) },
        )
        .await
        .unwrap();
        assert_eq!(ok, Processed::Done(7));
    }

    #[tokio::test]
    async fn concurrent_copy_sees_in_progress_until_lease_expires() {
        let (clock, store) = fake_clock();
        assert_eq!(
            store.claim("m", Duration::from_secs(30)).await.unwrap(),
            Claim::Claimed
        );
        assert_eq!(
            store.claim("m", Duration::from_secs(30)).await.unwrap(),
            Claim::InProgress
        );
        clock.fetch_add(31, Ordering::SeqCst);
        // The first holder died: the lease expired, a retry may claim.
        assert_eq!(
            store.claim("m", Duration::from_secs(30)).await.unwrap(),
            Claim::Claimed
        );
        store
            .mark_processed("m", Duration::from_secs(100))
            .await
            .unwrap();
        assert_eq!(
            store.claim("m", Duration::from_secs(30)).await.unwrap(),
            Claim::AlreadyProcessed
        );
        clock.fetch_add(101, Ordering::SeqCst);
        // Past the TTL the id is forgotten.
        assert_eq!(
            store.claim("m", Duration::from_secs(30)).await.unwrap(),
            Claim::Claimed
        );
        assert_eq!(store.len(), 1);
    }

    #[tokio::test]
    async fn release_does_not_forget_processed_ids() {
        let store = MemorySeenStore::new();
        store
            .mark_processed("m", DEFAULT_PROCESSED_TTL)
            .await
            .unwrap();
        store.release("m").await.unwrap();
        assert_eq!(
            store.claim("m", DEFAULT_CLAIM_LEASE).await.unwrap(),
            Claim::AlreadyProcessed
        );
    }

    #[tokio::test]
    async fn many_concurrent_duplicates_process_once() {
        let store = Arc::new(MemorySeenStore::new());
        let runs = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..32 {
            let store = store.clone();
            let runs = runs.clone();
            tasks.push(tokio::spawn(async move {
                process_once(
                    &*store,
                    "msg_c",
                    DEFAULT_CLAIM_LEASE,
                    DEFAULT_PROCESSED_TTL,
                    || async {
                        runs.fetch_add(1, Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        Ok::<_, String>(())
                    },
                )
                .await
                .unwrap()
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}
