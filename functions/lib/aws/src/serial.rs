//! One DynamoDB call at a time, when asked for (`WEBHOOKS_SERIALIZE_DYNAMODB`:
//! moto loses writes under concurrent transactions). Shared by the store, the
//! seen store and the local stream poller through one [`Serial`].

use std::sync::Arc;

use tokio::sync::{Mutex, MutexGuard};

/// An optional process-wide lock around DynamoDB calls.
#[derive(Debug, Clone, Default)]
pub struct Serial(Option<Arc<Mutex<()>>>);

impl Serial {
    /// Calls run one at a time.
    pub fn one_at_a_time() -> Self {
        Self(Some(Arc::new(Mutex::new(()))))
    }

    /// Held for the duration of one call (no-op when not serialised).
    pub async fn guard(&self) -> Option<MutexGuard<'_, ()>> {
        match &self.0 {
            Some(lock) => Some(lock.lock().await),
            None => None,
        }
    }
}
