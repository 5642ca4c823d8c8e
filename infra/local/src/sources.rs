//! Lambda's event source mappings, offline:
//!
//! - [`StreamSource`]: reads the table's stream and calls the dispatch
//!   handler with `aws_lambda_events` DynamoDB events, honouring the template's
//!   batch size, filter criteria, partial-batch responses and retry limit.
//!   Against moto it re-opens a shard iterator after the last sequence number
//!   on every poll (moto's iterators go stale after a cancelled transaction).
//! - [`QueueSource`]: long-polls the queue and calls the deliver handler with
//!   SQS events; messages reported as failures stay on the queue (visible
//!   again after the visibility timeout, then to the DLQ), the rest are deleted.

use std::collections::HashMap;
use std::future::Future;

use aws_lambda_events::event::dynamodb::Event as DynamoDbEvent;
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use aws_lambda_events::event::streams::DynamoDbEventResponse;
use aws_sdk_dynamodbstreams::types::ShardIteratorType;
use serde_json::{json, Value};

use hookline_aws::serial::Serial;

use crate::template::{matches_pattern, EventSource};
use crate::{aws_err, LocalError};

/// Reads a table's stream like Lambda's DynamoDB event source mapping.
#[derive(Debug)]
pub struct StreamSource {
    client: aws_sdk_dynamodbstreams::Client,
    stream_arn: String,
    batch_size: usize,
    filters: Vec<Value>,
    /// Last handled sequence number per shard.
    checkpoints: HashMap<String, String>,
    serial: Serial,
    /// `MaximumRetryAttempts` of the mapping (None: forever).
    max_retries: Option<u32>,
    /// Failed invocations so far per first-failed sequence number.
    retries: HashMap<String, u32>,
    /// Metadata of batches given up on, for the on-failure destination
    /// (Lambda sends metadata only, never the records).
    dropped: Vec<Value>,
}

/// What one poll did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PollStats {
    pub records: usize,
    pub delivered: usize,
    pub failed: usize,
    /// Records given up on after `MaximumRetryAttempts` (stream sources).
    pub dropped: usize,
}

impl StreamSource {
    pub fn new(
        client: aws_sdk_dynamodbstreams::Client,
        stream_arn: String,
        source: &EventSource,
        serial: Serial,
    ) -> Self {
        Self {
            client,
            stream_arn,
            batch_size: source.batch_size.max(1),
            filters: source.filters.clone(),
            checkpoints: HashMap::new(),
            serial,
            max_retries: source.max_retry_attempts,
            retries: HashMap::new(),
            dropped: Vec::new(),
        }
    }

    /// Metadata of the batches given up on since the last call (what
    /// Lambda sends to the mapping's on-failure destination).
    pub fn take_dropped(&mut self) -> Vec<Value> {
        std::mem::take(&mut self.dropped)
    }

    /// The checkpoints as JSON (`{shard id: sequence number}`), to persist.
    pub fn checkpoints_json(&self) -> String {
        serde_json::to_string(&self.checkpoints).unwrap_or_default()
    }

    /// Restores checkpoints saved by [`Self::checkpoints_json`]; bad input is ignored.
    pub fn restore_checkpoints(&mut self, json: &str) {
        if let Ok(map) = serde_json::from_str::<HashMap<String, String>>(json) {
            self.checkpoints = map;
        }
    }

    /// Reads everything new on every shard and hands it to `handler` in
    /// batches. On a reported failure the checkpoint stays before the first
    /// failed record, which is read again on the next poll.
    pub async fn poll<F, Fut>(&mut self, handler: F) -> Result<PollStats, LocalError>
    where
        F: Fn(DynamoDbEvent) -> Fut,
        Fut: Future<Output = DynamoDbEventResponse>,
    {
        let mut stats = PollStats::default();
        let shards: Vec<String> = {
            let _g = self.serial.guard().await;
            let described = self
                .client
                .describe_stream()
                .stream_arn(&self.stream_arn)
                .send()
                .await
                .map_err(|e| aws_err("DescribeStream", e))?;
            described
                .stream_description()
                .map(|d| {
                    d.shards()
                        .iter()
                        .filter_map(|s| s.shard_id().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default()
        };
        for shard in shards {
            let records = self.read_shard(&shard).await?;
            if records.is_empty() {
                continue;
            }
            stats.records += records.len();
            let mut last_done: Option<String> = None;
            let matching: Vec<(String, Value)> = records
                .into_iter()
                .filter_map(|(seq, rec)| {
                    last_done = Some(seq.clone());
                    let keep = self.filters.is_empty()
                        || self.filters.iter().any(|f| matches_pattern(f, &rec));
                    keep.then_some((seq, rec))
                })
                .collect();
            let mut failed_at: Option<String> = None;
            let mut checkpoint = self.checkpoints.get(&shard).cloned();
            for chunk in matching.chunks(self.batch_size) {
                let event: DynamoDbEvent = serde_json::from_value(
                    json!({"Records": chunk.iter().map(|(_, r)| r.clone()).collect::<Vec<_>>()}),
                )
                .map_err(|e| LocalError::Setup(format!("building the DynamoDB event: {e}")))?;
                let response = handler(event).await;
                let failed: Vec<String> = response
                    .batch_item_failures
                    .iter()
                    .filter_map(|f| f.item_identifier.clone())
                    .collect();
                if let Some(first) = chunk.iter().position(|(seq, _)| failed.contains(seq)) {
                    stats.delivered += first;
                    let seq = chunk[first].0.clone();
                    let invocations = {
                        let n = self.retries.entry(seq.clone()).or_insert(0);
                        *n += 1;
                        *n
                    };
                    if self.max_retries.is_some_and(|max| invocations > max) {
                        // Lambda gives up on the retried batch (the failed
                        // record and the rest of its batch), sends metadata
                        // only to the on-failure destination, and the shard
                        // moves on. Deliveries in it are left to the
                        // reconciler.
                        self.retries.remove(&seq);
                        let skipped = &chunk[first..];
                        stats.dropped += skipped.len();
                        self.dropped.push(json!({
                            "requestContext": {
                                "condition": "RetryAttemptsExhausted",
                                "approximateInvokeCount": invocations,
                            },
                            "version": "1.0",
                            "timestamp": chrono::Utc::now().to_rfc3339(),
                            "DDBStreamBatchInfo": {
                                "shardId": shard,
                                "startSequenceNumber": seq,
                                "endSequenceNumber": skipped.last().map(|(s, _)| s.clone()),
                                "batchSize": skipped.len(),
                                "streamArn": self.stream_arn,
                            },
                        }));
                        checkpoint = chunk.last().map(|(s, _)| s.clone());
                        continue;
                    }
                    stats.failed += chunk.len() - first;
                    failed_at = Some(seq);
                    if first > 0 {
                        checkpoint = Some(chunk[first - 1].0.clone());
                    }
                    break;
                }
                stats.delivered += chunk.len();
                checkpoint = chunk.last().map(|(s, _)| s.clone());
            }
            match failed_at {
                // Everything read (filtered-out records included) is done.
                None => {
                    if let Some(seq) = last_done {
                        self.checkpoints.insert(shard, seq);
                    }
                }
                Some(_) => {
                    if let Some(seq) = checkpoint {
                        self.checkpoints.insert(shard, seq);
                    }
                }
            }
        }
        Ok(stats)
    }

    async fn read_shard(&self, shard: &str) -> Result<Vec<(String, Value)>, LocalError> {
        let _g = self.serial.guard().await;
        let mut req = self
            .client
            .get_shard_iterator()
            .stream_arn(&self.stream_arn)
            .shard_id(shard);
        req = match self.checkpoints.get(shard) {
            Some(seq) => req
                .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                .sequence_number(seq),
            None => req.shard_iterator_type(ShardIteratorType::TrimHorizon),
        };
        let iterator = req
            .send()
            .await
            .map_err(|e| aws_err("GetShardIterator", e))?
            .shard_iterator
            .unwrap_or_default();
        let out = self
            .client
            .get_records()
            .shard_iterator(iterator)
            .limit(1000)
            .send()
            .await
            .map_err(|e| aws_err("GetRecords", e))?;
        Ok(out
            .records
            .unwrap_or_default()
            .into_iter()
            .filter_map(|r| {
                let change = r.dynamodb?;
                let seq = change.sequence_number.clone()?;
                let image = |m: Option<HashMap<String, aws_sdk_dynamodbstreams::types::AttributeValue>>| {
                    serde_json::to_value(serde_dynamo::Item::from(m.unwrap_or_default())).unwrap_or(Value::Null)
                };
                let created = change.approximate_creation_date_time.map(|t| t.secs()).unwrap_or(0);
                let record = json!({
                    "eventID": r.event_id.unwrap_or_default(),
                    "eventName": r.event_name.map(|n| n.as_str().to_owned()).unwrap_or_default(),
                    "eventVersion": "1.1",
                    "eventSource": "aws:dynamodb",
                    "awsRegion": r.aws_region.unwrap_or_else(|| "us-east-1".into()),
                    "eventSourceARN": self.stream_arn,
                    "dynamodb": {
                        "ApproximateCreationDateTime": created,
                        "Keys": image(change.keys),
                        "NewImage": image(change.new_image),
                        "OldImage": image(change.old_image),
                        "SequenceNumber": seq,
                        "SizeBytes": change.size_bytes.unwrap_or(0),
                        "StreamViewType": change.stream_view_type.map(|v| v.as_str().to_owned()).unwrap_or_else(|| "NEW_AND_OLD_IMAGES".into()),
                    }
                });
                Some((seq, record))
            })
            .collect())
    }
}

/// Reads a queue like Lambda's SQS event source mapping.
#[derive(Debug, Clone)]
pub struct QueueSource {
    client: aws_sdk_sqs::Client,
    queue_url: String,
    queue_arn: String,
    batch_size: usize,
}

impl QueueSource {
    pub fn new(
        client: aws_sdk_sqs::Client,
        queue_url: String,
        queue_arn: String,
        source: &EventSource,
    ) -> Self {
        Self {
            client,
            queue_url,
            queue_arn,
            batch_size: source.batch_size.clamp(1, 10),
        }
    }

    /// Receives up to one batch (waiting up to `wait_secs`).
    pub async fn receive(
        &self,
        wait_secs: i32,
    ) -> Result<Vec<aws_sdk_sqs::types::Message>, LocalError> {
        let out = self
            .client
            .receive_message()
            .queue_url(&self.queue_url)
            .max_number_of_messages(self.batch_size as i32)
            .wait_time_seconds(wait_secs)
            .message_system_attribute_names(aws_sdk_sqs::types::MessageSystemAttributeName::All)
            .send()
            .await
            .map_err(|e| aws_err("ReceiveMessage", e))?;
        Ok(out.messages.unwrap_or_default())
    }

    /// The Lambda SQS event (JSON) for received messages.
    pub fn event_json(&self, messages: &[aws_sdk_sqs::types::Message]) -> Value {
        let records: Vec<Value> = messages
            .iter()
            .map(|m| {
                let attributes: HashMap<String, String> = m
                    .attributes()
                    .map(|a| {
                        a.iter()
                            .map(|(k, v)| (k.as_str().to_owned(), v.clone()))
                            .collect()
                    })
                    .unwrap_or_default();
                json!({
                    "messageId": m.message_id(),
                    "receiptHandle": m.receipt_handle(),
                    "body": m.body(),
                    "md5OfBody": m.md5_of_body(),
                    "attributes": attributes,
                    "messageAttributes": {},
                    "eventSource": "aws:sqs",
                    "eventSourceARN": self.queue_arn,
                    "awsRegion": "us-east-1",
                })
            })
            .collect();
        json!({"Records": records})
    }

    /// Deletes handled messages (what Lambda does after a successful batch).
    pub async fn delete(
        &self,
        messages: &[&aws_sdk_sqs::types::Message],
    ) -> Result<(), LocalError> {
        for chunk in messages.chunks(10) {
            let entries = chunk
                .iter()
                .enumerate()
                .filter_map(|(i, m)| {
                    aws_sdk_sqs::types::DeleteMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(m.receipt_handle().unwrap_or_default())
                        .build()
                        .ok()
                })
                .collect::<Vec<_>>();
            self.client
                .delete_message_batch()
                .queue_url(&self.queue_url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| aws_err("DeleteMessageBatch", e))?;
        }
        Ok(())
    }

    /// One receive (waiting up to `wait_secs` for messages) and one handler
    /// call; messages not reported as failures are deleted.
    pub async fn poll<F, Fut>(&self, wait_secs: i32, handler: F) -> Result<PollStats, LocalError>
    where
        F: FnOnce(SqsEvent) -> Fut,
        Fut: Future<Output = SqsBatchResponse>,
    {
        let messages = self.receive(wait_secs).await?;
        if messages.is_empty() {
            return Ok(PollStats::default());
        }
        let event: SqsEvent = serde_json::from_value(self.event_json(&messages))
            .map_err(|e| LocalError::Setup(format!("building the SQS event: {e}")))?;
        let response = handler(event).await;
        let failed: Vec<&str> = response
            .batch_item_failures
            .iter()
            .map(|f| f.item_identifier.as_str())
            .collect();
        let done: Vec<&aws_sdk_sqs::types::Message> = messages
            .iter()
            .filter(|m| !failed.contains(&m.message_id().unwrap_or_default()))
            .collect();
        self.delete(&done).await?;
        Ok(PollStats {
            records: messages.len(),
            delivered: done.len(),
            failed: messages.len() - done.len(),
            dropped: 0,
        })
    }
}
