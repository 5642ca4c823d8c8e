//! Send slots for rate-limited endpoints, gathered per process: the
//! attempts of one deliver invocation that reach the same limited endpoint
//! together take consecutive slots in one limiter write
//! ([`Store::reserve_send_slots`]), and the limiter's last seen state picks
//! which conditional write to try first. Throughput and fairness are the
//! limiter's ([`hookline_core::rate`]); this only saves writes.

use std::collections::HashMap;
use std::sync::Mutex;

use chrono::{DateTime, Utc};
use hookline_core::ids::EndpointId;
use hookline_core::rate::{self, Limiter};
use tokio::sync::oneshot;

use crate::ports::Store;
use crate::PipelineError;

type Key = (EndpointId, u32);
type Waiter = oneshot::Sender<Result<i64, String>>;

/// How many times a gathering request yields before it writes, so the
/// attempts of the same batch that are ready can join it. Yielding costs
/// no wall time when nothing else is ready.
const GATHER_YIELDS: usize = 3;

#[derive(Debug, Default)]
struct State {
    /// Per (endpoint, rate): the requests waiting for the one gathering.
    gathering: HashMap<Key, Vec<Waiter>>,
    /// Per endpoint: the limiter as this process last saw it.
    seen: HashMap<EndpointId, Limiter>,
}

/// See the module docs. One per deliver process.
#[derive(Debug, Default)]
pub struct Pacer {
    state: Mutex<State>,
}

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Removes a gathering that ends without writing (its future dropped), so
/// its waiters get an error instead of waiting forever.
struct Gathering<'a> {
    pacer: &'a Pacer,
    key: Key,
    open: bool,
}

impl Gathering<'_> {
    fn close(&mut self) -> Vec<Waiter> {
        self.open = false;
        lock(&self.pacer.state)
            .gathering
            .remove(&self.key)
            .expect("a gathering is removed only by the request that opened it")
    }
}

impl Drop for Gathering<'_> {
    fn drop(&mut self) {
        if self.open {
            lock(&self.pacer.state).gathering.remove(&self.key);
        }
    }
}

impl Pacer {
    /// Takes one send slot of endpoint `id` under `per_second`: its number.
    /// Joins a write another attempt of this process is about to make, or
    /// makes one for every attempt that joined it meanwhile.
    pub async fn take_slot<S: Store>(
        &self,
        store: &S,
        id: &EndpointId,
        per_second: u32,
        now: DateTime<Utc>,
    ) -> Result<i64, PipelineError> {
        let key = (id.clone(), per_second);
        let joined = {
            let mut state = lock(&self.state);
            match state.gathering.get_mut(&key) {
                Some(waiters) => {
                    let (tx, rx) = oneshot::channel();
                    waiters.push(tx);
                    Some(rx)
                }
                None => {
                    state.gathering.insert(key.clone(), Vec::new());
                    None
                }
            }
        };
        if let Some(rx) = joined {
            return match rx.await {
                Ok(Ok(slot)) => Ok(slot),
                Ok(Err(message)) => Err(PipelineError::store(message, true)),
                Err(_) => Err(PipelineError::store(
                    "rate limiter: the gathered write was abandoned",
                    true,
                )),
            };
        }
        let mut gathering = Gathering {
            pacer: self,
            key,
            open: true,
        };
        for _ in 0..GATHER_YIELDS {
            tokio::task::yield_now().await;
        }
        let waiters = gathering.close();
        let count = u32::try_from(waiters.len() + 1).unwrap_or(u32::MAX);
        let likely_busy = lock(&self.state)
            .seen
            .get(id)
            .is_some_and(|&seen| rate::is_busy(seen, per_second, now));
        let reserved = store
            .reserve_send_slots(id, per_second, count, likely_busy, now)
            .await;
        match reserved {
            Ok(first) => {
                lock(&self.state).seen.insert(
                    id.clone(),
                    Limiter {
                        next: first + i64::from(count),
                        per_second,
                    },
                );
                for (slot, waiter) in (first + 1..).zip(waiters) {
                    // A waiter gone (its attempt dropped) just leaves its
                    // slot unused.
                    let _ = waiter.send(Ok(slot));
                }
                Ok(first)
            }
            Err(err) => {
                let message = format!("rate limiter: {}", hookline_core::error::Chain(&err));
                for waiter in waiters {
                    let _ = waiter.send(Err(message.clone()));
                }
                Err(err)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::MemoryStore;

    fn at_ms(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(1_800_000_000_000 + ms).expect("in range")
    }

    /// Ten attempts ready together take ten distinct consecutive slots in
    /// one write; a later lone attempt queues behind them.
    #[tokio::test]
    async fn concurrent_attempts_share_one_limiter_write() {
        let store = MemoryStore::default();
        let pacer = Pacer::default();
        let id = EndpointId::generate();
        let now = at_ms(0);
        let slots: Vec<i64> =
            futures::future::join_all((0..10).map(|_| pacer.take_slot(&store, &id, 5, now)))
                .await
                .into_iter()
                .collect::<Result<_, _>>()
                .expect("slots");
        let mut sorted = slots.clone();
        sorted.sort_unstable();
        let first = rate::slot_of(now, 5);
        assert_eq!(sorted, (first..first + 10).collect::<Vec<_>>());
        assert_eq!(store.limiter_writes(), 1);
        let next = pacer.take_slot(&store, &id, 5, now).await.expect("slot");
        assert_eq!(next, first + 10);
        assert_eq!(store.limiter_writes(), 2);
        // Another endpoint has its own limiter.
        let other = pacer
            .take_slot(&store, &EndpointId::generate(), 5, now)
            .await
            .expect("slot");
        assert_eq!(other, first);
    }

    /// A gathering whose future is dropped before it writes is removed: the
    /// next attempt gathers afresh instead of waiting on it.
    #[tokio::test]
    async fn an_abandoned_gathering_does_not_block_the_next() {
        let store = MemoryStore::default();
        let pacer = Pacer::default();
        let id = EndpointId::generate();
        {
            let fut = pacer.take_slot(&store, &id, 5, at_ms(0));
            futures::pin_mut!(fut);
            // One poll: registered as gathering, then yields.
            assert!(futures::poll!(fut.as_mut()).is_pending());
        }
        let slot = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            pacer.take_slot(&store, &id, 5, at_ms(0)),
        )
        .await
        .expect("not blocked")
        .expect("slot");
        assert_eq!(slot, rate::slot_of(at_ms(0), 5));
    }
}
