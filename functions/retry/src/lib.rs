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
