//! The reconcile function: run on a schedule (`WEBHOOKS_RECONCILE_INTERVAL`,
//! the template's `Schedule` event), it queues again every pending delivery
//! whose queue message was lost (see [`hookline_pipeline::reconcile`]).
//!
//! Input: the scheduler's event (ignored; `{}` or `null` from `sam local
//! invoke`). Output: the [`ReconcileReport`] counts. An error fails the
//! invocation, and the next scheduled run starts over: every step is
//! idempotent.

use std::time::Duration;

use chrono::{DateTime, Utc};
use hookline_pipeline::ports::{Queue, Store};
use hookline_pipeline::reconcile::{reconcile, ReconcileReport};
use hookline_pipeline::{PipelineError, Settings};

/// What a run keeps of its invocation's time to save its marks and answer.
pub const ANSWER_MARGIN: Duration = Duration::from_secs(15);
/// The time budget of a run not bound by a Lambda deadline (the local
/// stack, tests): the template's 120 s timeout less [`ANSWER_MARGIN`].
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(105);

/// The reading budget of an invocation whose deadline is `deadline_ms`
/// (epoch milliseconds, the Runtime API's) at `now`.
pub fn budget_until(deadline_ms: u64, now: DateTime<Utc>) -> Duration {
    let left = i64::try_from(deadline_ms).unwrap_or(i64::MAX) - now.timestamp_millis();
    Duration::from_millis(u64::try_from(left).unwrap_or(0)).saturating_sub(ANSWER_MARGIN)
}

/// One scheduled run, reading for at most `budget`.
pub async fn handle<S: Store, Q: Queue>(
    store: &S,
    queue: &Q,
    settings: &Settings,
    _input: serde_json::Value,
    now: DateTime<Utc>,
    budget: Duration,
) -> Result<ReconcileReport, PipelineError> {
    reconcile(store, queue, settings, now, budget).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use hookline_core::ids::{AppId, DeliveryId, EndpointId, EventId};
    use hookline_core::model::{Delivery, Event, EventType};
    use hookline_pipeline::fakes::{MemoryQueue, MemoryStore};

    #[tokio::test]
    async fn the_scheduled_event_fixture_runs_a_reconciliation() {
        let (store, queue) = (MemoryStore::default(), MemoryQueue::default());
        let settings = Settings::for_tests(&[]).unwrap();
        let now = Utc::now();
        let at = now - chrono::Duration::hours(2);
        let event = Event::new(
            EventId::new(at, &mut rand::thread_rng()),
            AppId::parse("demo").unwrap(),
            EventType::parse("order.paid").unwrap(),
            &serde_json::value::RawValue::from_string("{}".into()).unwrap(),
            at,
        );
        store.insert_delivery(Delivery::new(
            DeliveryId::generate(),
            &event,
            EndpointId::generate(),
            at,
        ));
        let input: serde_json::Value =
            serde_json::from_str(include_str!("../../../events/reconcile.json")).unwrap();
        let report = handle(&store, &queue, &settings, input, now, DEFAULT_BUDGET)
            .await
            .unwrap();
        assert_eq!((report.overdue, report.requeued), (1, 1));
        assert_eq!(queue.sent().len(), 1);
    }

    #[test]
    fn the_budget_leaves_the_margin_and_never_underflows() {
        let now = Utc::now();
        let deadline = u64::try_from(now.timestamp_millis()).unwrap() + 120_000;
        assert_eq!(budget_until(deadline, now), Duration::from_secs(105));
        assert_eq!(budget_until(0, now), Duration::ZERO);
    }
}
