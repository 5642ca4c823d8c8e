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

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use hookline_pipeline::fakes::{MemoryQueue, MemoryStore};

    fn fixture(text: &str) -> Event {
        serde_json::from_str(text).expect("fixture is a DynamoDB stream event")
    }

    fn at(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(secs, 0).unwrap()
    }

    #[tokio::test]
    async fn insert_of_a_pending_delivery_queues_attempt_one_now() {
        let (store, queue) = (MemoryStore::default(), MemoryQueue::default());
        let event = fixture(include_str!("../../../events/stream-insert-delivery.json"));
        let response = handle(&store, &queue, event, at(1_796_217_600)).await;
        assert!(response.batch_item_failures.is_empty());
        let sent = queue.sent();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].0.attempt, 1);
        assert_eq!(
            sent[0].0.delivery_id.as_str(),
            "dlv_01m8vgw5r0fd5bkndpb8a897m8"
        );
        assert_eq!(sent[0].1, 0, "due now: no delay");
    }

    #[tokio::test]
    async fn modify_scheduling_a_retry_queues_the_next_attempt_with_its_delay() {
        let (store, queue) = (MemoryStore::default(), MemoryQueue::default());
        let event = fixture(include_str!("../../../events/stream-modify-delivery.json"));
        // next_attempt_at is 13:20:31Z; now is 13:20:01Z -> 30 s delay.
        let response = handle(&store, &queue, event, at(1_796_217_601)).await;
        assert!(response.batch_item_failures.is_empty());
        let sent = queue.sent();
        assert_eq!((sent[0].0.attempt, sent[0].1), (2, 30));
    }

    #[tokio::test]
    async fn undecodable_record_is_reported_not_dropped() {
        let (store, queue) = (MemoryStore::default(), MemoryQueue::default());
        let mut json: serde_json::Value =
            serde_json::from_str(include_str!("../../../events/stream-insert-delivery.json"))
                .unwrap();
        json["Records"][0]["dynamodb"]["NewImage"]["attempt_count"] =
            serde_json::json!({"S": "many"});
        let response = handle(
            &store,
            &queue,
            serde_json::from_value(json).unwrap(),
            at(1_796_217_600),
        )
        .await;
        assert_eq!(response.batch_item_failures.len(), 1);
        assert_eq!(
            response.batch_item_failures[0].item_identifier.as_deref(),
            Some("100000000000000000001")
        );
        assert!(queue.sent().is_empty());
    }
}
