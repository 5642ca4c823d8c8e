//! The retry function: drains the DLQ on demand (manual redrive).
//!
//! Input: `{"max_messages": 100, "endpoint_id": "ep_...", "event_type": "...", "dry_run": false}`
//! (every field optional). Output: the [`RedriveReport`] counts.

use chrono::{DateTime, Utc};
use hookline_pipeline::ports::{Queue, Store};
use hookline_pipeline::redrive::{redrive, RedriveReport, RedriveRequest};
use hookline_pipeline::PipelineError;

/// Parses the input (an empty or `null` payload means the defaults) and redrives.
pub async fn handle<S: Store, Q: Queue>(
    store: &S,
    queue: &Q,
    input: serde_json::Value,
    now: DateTime<Utc>,
) -> Result<RedriveReport, PipelineError> {
    let request: RedriveRequest = if input.is_null() {
        RedriveRequest::default()
    } else {
        serde_json::from_value(input)
            .map_err(|e| PipelineError::invalid("invalid_input", e.to_string()))?
    };
    redrive(store, queue, &request, now).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use hookline_pipeline::fakes::{MemoryQueue, MemoryStore};

    #[tokio::test]
    async fn fixtures_parse_and_unknown_fields_are_rejected() {
        let (store, queue) = (MemoryStore::default(), MemoryQueue::default());
        queue.push_dlq("garbage".into());
        let input: serde_json::Value =
            serde_json::from_str(include_str!("../../../events/retry-dry-run.json")).unwrap();
        let report = handle(&store, &queue, input, Utc::now()).await.unwrap();
        assert_eq!(
            (report.received, report.invalid, report.dry_run),
            (1, 1, true)
        );
        let input: serde_json::Value =
            serde_json::from_str(include_str!("../../../events/retry.json")).unwrap();
        let report = handle(&store, &queue, input, Utc::now()).await.unwrap();
        assert_eq!(report.invalid, 1, "an unreadable message stays in the DLQ");
        let report = handle(&store, &queue, serde_json::Value::Null, Utc::now())
            .await
            .unwrap();
        assert!(!report.dry_run);
        let err = handle(
            &store,
            &queue,
            serde_json::json!({"max_mesages": 1}),
            Utc::now(),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("max_mesages"), "{err}");
        assert!(handle(
            &store,
            &queue,
            serde_json::json!({"max_messages": 0}),
            Utc::now()
        )
        .await
        .is_err());
    }
}
