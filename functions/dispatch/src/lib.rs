//! The dispatch function: DynamoDB stream -> SQS.
//!
//! [`handle`] is the batch wrapper (partial failures by sequence number) and
//! decodes the records' images; the per-record work, in order, is
//! [`hookline_pipeline::dispatch::dispatch_changes`].

use aws_lambda_events::event::dynamodb::Event;
use aws_lambda_events::event::streams::{DynamoDbBatchItemFailure, DynamoDbEventResponse};
use chrono::{DateTime, Utc};
use hookline_aws::schema::decode_stream_image;
use hookline_pipeline::dispatch::{dispatch_changes, RecordChange, StreamChange};
use hookline_pipeline::ports::{Queue, Store};

/// Handles one batch of stream records, in order (`late_after`:
/// [`hookline_pipeline::dispatch::late_after`] of the settings). At the first record that
/// fails, it stops and reports that record and every one after it: Lambda
/// retries the batch from the lowest reported sequence number, so records
/// after a failure must not be acted on now (they would be queued again on
/// every retry, up to the mapping's 50, and POSTed in bursts). Handling is
/// idempotent, so a re-delivered record is harmless.
#[tracing::instrument(name = "dispatch", skip_all, fields(records = event.records.len()))]
pub async fn handle<S: Store, Q: Queue>(
    store: &S,
    queue: &Q,
    event: Event,
    late_after: chrono::TimeDelta,
    now: DateTime<Utc>,
) -> DynamoDbEventResponse {
    let seqs: Vec<String> = event
        .records
        .iter()
        .map(|r| r.change.sequence_number.clone().unwrap_or_default())
        .collect();
    let first_failure = handle_in_order(store, queue, event, late_after, now).await;
    let mut response = DynamoDbEventResponse::default();
    if let Some(first) = first_failure {
        for seq in &seqs[first..] {
            let mut failure = DynamoDbBatchItemFailure::default();
            failure.item_identifier = Some(seq.clone());
            response.batch_item_failures.push(failure);
        }
    }
    tracing::info!(
        records = seqs.len(),
        failures = response.batch_item_failures.len(),
        "dispatch batch done"
    );
    response
}

/// Decodes the records (new images only) and runs them in order
/// ([`dispatch_changes`]); the index of the first that failed.
async fn handle_in_order<S: Store, Q: Queue>(
    store: &S,
    queue: &Q,
    event: Event,
    late_after: chrono::TimeDelta,
    now: DateTime<Utc>,
) -> Option<usize> {
    let changes = event
        .records
        .into_iter()
        .map(|record| RecordChange {
            sequence: record.change.sequence_number.clone().unwrap_or_default(),
            insert: record.event_name == "INSERT",
            // Absent from a record, it reads as the epoch: unknown.
            written_at: Some(record.change.approximate_creation_date_time)
                .filter(|t| t.timestamp() > 0),
            change: if record.event_name == "REMOVE" {
                Ok(StreamChange::Ignored)
            } else {
                let old = record.change.old_image;
                decode_stream_image(record.change.new_image, Some(old).filter(|o| !o.is_empty()))
            },
        })
        .collect();
    dispatch_changes(store, queue, changes, late_after, now).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use hookline_pipeline::fakes::{MemoryQueue, MemoryStore};

    fn fixture(text: &str) -> Event {
        serde_json::from_str(text).expect("fixture is a DynamoDB stream event")
    }

    /// The INSERT fixture as JSON, to vary.
    fn insert_json() -> serde_json::Value {
        serde_json::from_str(include_str!("../../../events/stream-insert-delivery.json"))
            .expect("fixture is JSON")
    }

    /// The default `WEBHOOKS_RECONCILE_AFTER`'s.
    const LATE: chrono::TimeDelta = chrono::TimeDelta::minutes(13);

    fn at(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(secs, 0).unwrap()
    }

    /// `handle` on a stream event given as JSON, at a fixed time.
    async fn handle_json(
        store: &MemoryStore,
        queue: &MemoryQueue,
        json: serde_json::Value,
    ) -> DynamoDbEventResponse {
        let event = serde_json::from_value(json).expect("a DynamoDB stream event");
        handle(store, queue, event, LATE, at(1_796_217_600)).await
    }

    #[tokio::test]
    async fn insert_of_a_pending_delivery_queues_attempt_one_now() {
        let (store, queue) = (MemoryStore::default(), MemoryQueue::default());
        let event = fixture(include_str!("../../../events/stream-insert-delivery.json"));
        let response = handle(&store, &queue, event, LATE, at(1_796_217_600)).await;
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

    /// A new event with a listed fan-out: one first-attempt message per
    /// endpoint, body from the image (the store is empty: nothing read), ids
    /// naming the event; the same event modified later (its retention
    /// pushed back) sends nothing again.
    #[tokio::test]
    async fn insert_of_a_listed_event_queues_each_first_attempt_with_its_body() {
        let (store, queue) = (MemoryStore::default(), MemoryQueue::default());
        let json: serde_json::Value =
            serde_json::from_str(include_str!("../../../events/stream-insert-event.json"))
                .expect("fixture is JSON");
        let response = handle_json(&store, &queue, json.clone()).await;
        assert!(response.batch_item_failures.is_empty());
        let body = json["Records"][0]["dynamodb"]["NewImage"]["body"]["S"]
            .as_str()
            .unwrap()
            .to_owned();
        let sent = queue.sent();
        let ids: Vec<String> = sent
            .iter()
            .map(|(m, _)| m.delivery_id.to_string())
            .collect();
        assert_eq!(
            ids,
            [
                "dlv_01m8vgw5r0fe7bg2yq1bg70001",
                "dlv_01m8vgw5r0fe7bg2yq1bg70002"
            ]
        );
        for (message, delay) in &sent {
            assert_eq!((message.attempt, message.version, *delay), (1, Some(0), 0));
            assert_eq!(message.body.as_deref(), Some(body.as_str()));
            let (event, _) = message.delivery_id.fanout_origin().unwrap();
            assert_eq!(event.as_str(), "evt_01m8vgw5r0fe7bg2yq1bg70000");
        }
        assert!(store.delivery_items().is_empty(), "dispatch writes nothing");
        // The deliver fixture of a first attempt is the first of them.
        let deliver: serde_json::Value = serde_json::from_str(include_str!(
            "../../../events/sqs-deliver-first-attempt.json"
        ))
        .expect("fixture is JSON");
        let carried: serde_json::Value =
            serde_json::from_str(deliver["Records"][0]["body"].as_str().expect("a body"))
                .expect("the body is a message");
        assert_eq!(carried, serde_json::to_value(&sent[0].0).expect("JSON"));

        let queue = MemoryQueue::default();
        let mut modify = json;
        modify["Records"][0]["eventName"] = serde_json::json!("MODIFY");
        let response = handle_json(&store, &queue, modify).await;
        assert!(response.batch_item_failures.is_empty());
        assert!(
            queue.sent().is_empty(),
            "a change of the event sends nothing"
        );
    }

    #[tokio::test]
    async fn modify_scheduling_a_retry_queues_the_next_attempt_with_its_delay() {
        let (store, queue) = (MemoryStore::default(), MemoryQueue::default());
        let event = fixture(include_str!("../../../events/stream-modify-delivery.json"));
        // next_attempt_at is 13:20:31Z; now is 13:20:01Z -> 30 s delay.
        let response = handle(&store, &queue, event, LATE, at(1_796_217_601)).await;
        assert!(response.batch_item_failures.is_empty());
        let sent = queue.sent();
        assert_eq!((sent[0].0.attempt, sent[0].1), (2, 30));
    }

    /// Three records; the second is poison. Before the fix the third was
    /// queued anyway, and again on every stream retry (up to 50), all due at
    /// the same time: a burst of duplicate POSTs.
    #[tokio::test]
    async fn stops_at_the_first_failure_and_reports_it_with_everything_after() {
        let (store, queue) = (MemoryStore::default(), MemoryQueue::default());
        let mut json: serde_json::Value = insert_json();
        let record = json["Records"][0].clone();
        let ids = [
            "dlv_01m8vgw5r0fd5bkndpb8a897m1",
            "dlv_01m8vgw5r0fd5bkndpb8a897m2",
            "dlv_01m8vgw5r0fd5bkndpb8a897m3",
        ];
        let records: Vec<serde_json::Value> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let mut r = record.clone();
                r["dynamodb"]["NewImage"]["id"] = serde_json::json!({ "S": id });
                r["dynamodb"]["SequenceNumber"] = serde_json::json!(format!("{}", 500 + i));
                r
            })
            .collect();
        json["Records"] = serde_json::Value::Array(records);
        // The second record is poison (undecodable): it fails on every retry.
        json["Records"][1]["dynamodb"]["NewImage"]["attempt_count"] =
            serde_json::json!({"S": "many"});
        let response = handle_json(&store, &queue, json).await;
        let reported: Vec<_> = response
            .batch_item_failures
            .iter()
            .map(|f| f.item_identifier.clone().unwrap())
            .collect();
        assert_eq!(reported, ["501", "502"]);
        let sent: Vec<_> = queue
            .sent()
            .iter()
            .map(|(m, _)| m.delivery_id.to_string())
            .collect();
        assert_eq!(sent, [ids[0]], "nothing after the failure is queued");
        hookline_pipeline::fakes::record_figure(
            "races",
            "dispatch batch with a poison record in the middle (fakes): the poison and every later record reported, 0 records after it queued (was: queued again on each of 50 retries)",
        );

        // A refused message is reported from there on, too.
        let queue = MemoryQueue::default();
        let mut json: serde_json::Value = insert_json();
        json["Records"][0]["dynamodb"]["SequenceNumber"] = serde_json::json!("700");
        queue.refuse(
            &hookline_core::ids::DeliveryId::parse("dlv_01m8vgw5r0fd5bkndpb8a897m8").unwrap(),
        );
        let response = handle_json(&store, &queue, json).await;
        assert_eq!(response.batch_item_failures.len(), 1);
        assert!(queue.sent().is_empty());
    }

    #[tokio::test]
    async fn undecodable_record_is_reported_not_dropped() {
        let (store, queue) = (MemoryStore::default(), MemoryQueue::default());
        let mut json: serde_json::Value = insert_json();
        json["Records"][0]["dynamodb"]["NewImage"]["attempt_count"] =
            serde_json::json!({"S": "many"});
        let response = handle_json(&store, &queue, json).await;
        assert_eq!(response.batch_item_failures.len(), 1);
        assert_eq!(
            response.batch_item_failures[0].item_identifier.as_deref(),
            Some("100000000000000000001")
        );
        assert!(queue.sent().is_empty());
    }
}
