//! The dispatch function: DynamoDB stream -> SQS.
//!
//! [`handle`] is the batch wrapper (partial failures by sequence number); the
//! per-record work is [`hookline_pipeline::dispatch`].

use aws_lambda_events::event::dynamodb::Event;
use aws_lambda_events::event::streams::{DynamoDbBatchItemFailure, DynamoDbEventResponse};
use chrono::{DateTime, Utc};
use hookline_aws::schema::decode_stream_image;
use hookline_core::model::Delivery;
use hookline_pipeline::dispatch::{materialise_fanout, queue_pending, StreamChange};
use hookline_pipeline::ports::{Queue, Store};

/// Handles one batch of stream records. A record that fails is reported (with
/// everything after it, as Lambda checkpoints at the first failure); the rest
/// is done. Handling is idempotent, so re-delivered records are harmless.
pub async fn handle<S: Store, Q: Queue>(
    store: &S,
    queue: &Q,
    event: Event,
    now: DateTime<Utc>,
) -> DynamoDbEventResponse {
    let mut failed_seqs: Vec<String> = Vec::new();
    let mut pending: Vec<(String, Delivery)> = Vec::new();
    for record in event.records {
        let seq = record.change.sequence_number.clone().unwrap_or_default();
        if record.event_name == "REMOVE" {
            continue;
        }
        match decode_stream_image(record.change.new_image) {
            Ok(StreamChange::PendingDelivery(d)) => pending.push((seq, *d)),
            Ok(StreamChange::EventFanout(event_id)) => {
                if let Err(err) = materialise_fanout(store, &event_id, now).await {
                    tracing::error!(event_id = %event_id, sequence_number = %seq, error = %err, "fan-out failed");
                    failed_seqs.push(seq);
                }
            }
            Ok(StreamChange::Ignored) => {}
            Err(err) => {
                tracing::error!(sequence_number = %seq, error = %err, "undecodable stream record");
                failed_seqs.push(seq);
            }
        }
    }
    let refs: Vec<&Delivery> = pending.iter().map(|(_, d)| d).collect();
    match queue_pending(queue, &refs, now).await {
        Ok(failed_ids) => {
            for (seq, d) in &pending {
                if failed_ids.contains(&d.id) {
                    failed_seqs.push(seq.clone());
                }
            }
        }
        Err(err) => {
            tracing::error!(error = %err, deliveries = pending.len(), "queueing failed");
            failed_seqs.extend(pending.iter().map(|(seq, _)| seq.clone()));
        }
    }
    tracing::info!(
        queued = pending.len(),
        failures = failed_seqs.len(),
        "dispatch batch done"
    );
    let mut response = DynamoDbEventResponse::default();
    for seq in failed_seqs {
        let mut failure = DynamoDbBatchItemFailure::default();
        failure.item_identifier = Some(seq);
        response.batch_item_failures.push(failure);
    }
    response
}
