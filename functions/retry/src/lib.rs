//! The retry function: drains the DLQ on demand (manual redrive).
//!
//! Input: `{"max_messages": 100, "endpoint_id": "ep_...", "event_type": "...", "dry_run": false}`
//! (every field optional). Output: the [`RedriveReport`] counts.

use std::time::Duration;

use chrono::{DateTime, Utc};
use hookline_pipeline::ports::{Queue, Store};
use hookline_pipeline::redrive::{redrive, RedriveReport, RedriveRequest};
use hookline_pipeline::PipelineError;

/// Time left before the invocation's deadline (epoch milliseconds), less a
/// margin to release kept messages and answer; the redrive stops within it.
pub fn budget(deadline_ms: u64, now: DateTime<Utc>) -> Duration {
    let left_ms = i64::try_from(deadline_ms)
        .unwrap_or(i64::MAX)
        .saturating_sub(now.timestamp_millis());
    Duration::from_millis(u64::try_from(left_ms).unwrap_or(0)).saturating_sub(MARGIN)
}

/// Kept back from the invocation's time for releasing messages and answering.
const MARGIN: Duration = Duration::from_secs(10);

/// Parses the input (an empty or `null` payload means the defaults) and redrives.
pub async fn handle<S: Store, Q: Queue>(
    store: &S,
    queue: &Q,
    input: serde_json::Value,
    now: DateTime<Utc>,
    budget: Duration,
) -> Result<RedriveReport, PipelineError> {
    let request: RedriveRequest = if input.is_null() {
        RedriveRequest::default()
    } else {
        serde_json::from_value(input)
            .map_err(|e| PipelineError::invalid("invalid_input", e.to_string()))?
    };
    redrive(store, queue, &request, now, budget).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use hookline_pipeline::fakes::{MemoryQueue, MemoryStore};

    #[test]
    fn budget_leaves_a_margin_before_the_deadline() {
        let now = Utc::now();
        let deadline = u64::try_from(now.timestamp_millis()).unwrap() + 300_000;
        assert_eq!(budget(deadline, now), Duration::from_secs(290));
        assert_eq!(budget(0, now), Duration::ZERO);
    }

    #[tokio::test]
    async fn fixtures_parse_and_unknown_fields_are_rejected() {
        let (store, queue) = (MemoryStore::default(), MemoryQueue::default());
        queue.push_dlq("garbage".into());
        let input: serde_json::Value =
            serde_json::from_str(include_str!("../../../events/retry-dry-run.json")).unwrap();
        let report = handle(&store, &queue, input, Utc::now(), Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(
            (report.received, report.invalid, report.dry_run),
            (1, 1, true)
        );
        let input: serde_json::Value =
            serde_json::from_str(include_str!("../../../events/retry.json")).unwrap();
        let report = handle(&store, &queue, input, Utc::now(), Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(report.invalid, 1, "an unreadable message stays in the DLQ");
        let report = handle(
            &store,
            &queue,
            serde_json::Value::Null,
            Utc::now(),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
        assert!(!report.dry_run);
        let err = handle(
            &store,
            &queue,
            serde_json::json!({"max_mesages": 1}),
            Utc::now(),
            Duration::from_secs(60),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("max_mesages"), "{err}");
        assert!(handle(
            &store,
            &queue,
            serde_json::json!({"max_messages": 0}),
            Utc::now(),
            Duration::from_secs(60),
        )
        .await
        .is_err());
    }
}
