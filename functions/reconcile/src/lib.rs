//! The reconcile function: run on a schedule (`WEBHOOKS_RECONCILE_INTERVAL`,
//! the template's `Schedule` event), it queues again every pending delivery
//! whose queue message was lost (see [`hookline_pipeline::reconcile`]).
//!
//! Input: the scheduler's event (ignored; `{}` or `null` from `sam local
//! invoke`). Output: the [`ReconcileReport`] counts. An error fails the
//! invocation, and the next scheduled run starts over: every step is
//! idempotent.

use chrono::{DateTime, Utc};
use hookline_pipeline::ports::{Queue, Store};
use hookline_pipeline::reconcile::{reconcile, ReconcileReport};
use hookline_pipeline::{PipelineError, Settings};

/// One scheduled run.
pub async fn handle<S: Store, Q: Queue>(
    store: &S,
    queue: &Q,
    settings: &Settings,
    _input: serde_json::Value,
    now: DateTime<Utc>,
) -> Result<ReconcileReport, PipelineError> {
    reconcile(store, queue, settings, now).await
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
        let report = handle(&store, &queue, &settings, input, now).await.unwrap();
        assert_eq!((report.overdue, report.requeued), (1, 1));
        assert_eq!(queue.sent().len(), 1);
    }
}
