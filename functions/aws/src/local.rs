//! Offline stand-ins for what AWS does around the functions, driven by
//! `template.yaml` itself (no second copy of the schema):
//!
//! - [`Template`]: reads the template's tables, queues and event sources.
//! - [`LocalResources::create`]: creates the table(s) and queues (with their
//!   redrive policies) on moto or any DynamoDB/SQS endpoint.
//! - [`StreamSource`]: reads the table's stream and calls the dispatch
//!   handler with `aws_lambda_events` DynamoDB events, honouring the template's
//!   batch size, filter criteria and partial-batch responses. Against moto it
//!   re-opens a shard iterator after the last sequence number on every poll
//!   (moto's iterators go stale after a cancelled transaction).
//! - [`QueueSource`]: long-polls the queue and calls the deliver handler with
//!   SQS events; messages reported as failures stay on the queue (visible
//!   again after the visibility timeout, then to the DLQ), the rest are deleted.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use aws_lambda_events::event::dynamodb::Event as DynamoDbEvent;
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use aws_lambda_events::event::streams::DynamoDbEventResponse;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ProjectionType, ScalarAttributeType, StreamSpecification, StreamViewType,
    TimeToLiveSpecification,
};
use aws_sdk_dynamodbstreams::types::ShardIteratorType;
use aws_sdk_sqs::types::QueueAttributeName;
use serde_json::{json, Value};
use serde_yaml_ng::Value as Yaml;
use tokio::sync::Mutex;

use crate::clients::Clients;

/// Errors of the local tooling (setup problems, not pipeline errors).
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("template: {0}")]
    Template(String),
    #[error("aws: {0}")]
    Aws(String),
}

fn aws_err(op: &str, err: impl std::error::Error) -> LocalError {
    LocalError::Aws(format!(
        "{op}: {}",
        aws_sdk_dynamodb::error::DisplayErrorContext(err)
    ))
}

/// A `DynamoDB` or `SQS` event source of a function, as declared in the template.
#[derive(Debug, Clone)]
pub struct EventSource {
    pub function: String,
    /// Logical id of the table (stream) or queue it reads.
    pub resource: String,
    pub batch_size: usize,
    /// Filter patterns (OR); empty = everything.
    pub filters: Vec<Value>,
    pub report_batch_item_failures: bool,
    /// Stream sources: `MaximumRetryAttempts` (None: retry until the record
    /// expires, Lambda's -1).
    pub max_retry_attempts: Option<u32>,
    /// Stream sources: the logical id of the `OnFailure` destination queue.
    pub on_failure: Option<String>,
}

/// The parts of `template.yaml` the local stack uses.
#[derive(Debug, Clone)]
pub struct Template {
    resources: BTreeMap<String, Yaml>,
}

/// Strips CloudFormation tags (`!GetAtt X.Arn` -> its value) for reading.
fn untag(v: &Yaml) -> &Yaml {
    match v {
        Yaml::Tagged(t) => &t.value,
        other => other,
    }
}

fn text(v: &Yaml) -> Option<String> {
    match untag(v) {
        Yaml::String(s) => Some(s.clone()),
        Yaml::Number(n) => Some(n.to_string()),
        Yaml::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The logical id a `!GetAtt X.Attr` / `!Ref X` points at.
fn referenced_resource(v: &Yaml) -> Option<String> {
    match v {
        Yaml::Tagged(t) => {
            text(&t.value).map(|s| s.split('.').next().unwrap_or_default().to_owned())
        }
        Yaml::Mapping(m) => m
            .get("Fn::GetAtt")
            .or_else(|| m.get("Ref"))
            .and_then(|inner| match inner {
                Yaml::Sequence(seq) => seq.first().and_then(text),
                other => text(other).map(|s| s.split('.').next().unwrap_or_default().to_owned()),
            }),
        _ => None,
    }
}

impl Template {
    pub fn load(path: &Path) -> Result<Self, LocalError> {
        let raw = std::fs::read_to_string(path)
            .map_err(|e| LocalError::Template(format!("{}: {e}", path.display())))?;
        Self::parse(&raw)
    }

    pub fn parse(raw: &str) -> Result<Self, LocalError> {
        let doc: Yaml =
            serde_yaml_ng::from_str(raw).map_err(|e| LocalError::Template(e.to_string()))?;
        let resources = doc
            .get("Resources")
            .and_then(Yaml::as_mapping)
            .ok_or_else(|| LocalError::Template("no Resources".into()))?
            .iter()
            .filter_map(|(k, v)| Some((k.as_str()?.to_owned(), v.clone())))
            .collect();
        Ok(Self { resources })
    }

    fn of_type<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = (&'a String, &'a Yaml)> + 'a {
        self.resources
            .iter()
            .filter(move |(_, r)| r.get("Type").and_then(Yaml::as_str) == Some(kind))
    }

    /// Logical ids of the DynamoDB tables.
    pub fn tables(&self) -> Vec<String> {
        self.of_type("AWS::DynamoDB::Table")
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Logical ids of the KMS keys.
    pub fn kms_keys(&self) -> Vec<String> {
        self.of_type("AWS::KMS::Key")
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Logical ids of the SQS queues.
    pub fn queues(&self) -> Vec<String> {
        self.of_type("AWS::SQS::Queue")
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Every `DynamoDB`/`SQS` event source of every function.
    pub fn event_sources(&self) -> Vec<EventSource> {
        let mut out = Vec::new();
        for (name, resource) in self.of_type("AWS::Serverless::Function") {
            let Some(events) = resource
                .get("Properties")
                .and_then(|p| p.get("Events"))
                .and_then(Yaml::as_mapping)
            else {
                continue;
            };
            for (_, event) in events {
                let kind = event.get("Type").and_then(Yaml::as_str).unwrap_or_default();
                let Some(props) = event.get("Properties") else {
                    continue;
                };
                let target = match kind {
                    "DynamoDB" => props.get("Stream"),
                    "SQS" => props.get("Queue"),
                    _ => None,
                };
                let Some(resource) = target.and_then(referenced_resource) else {
                    continue;
                };
                let batch_size = props
                    .get("BatchSize")
                    .and_then(text)
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(10);
                let filters = props
                    .get("FilterCriteria")
                    .and_then(|f| f.get("Filters"))
                    .and_then(Yaml::as_sequence)
                    .map(|filters| {
                        filters
                            .iter()
                            .filter_map(|f| f.get("Pattern").and_then(text))
                            .filter_map(|p| serde_json::from_str(&p).ok())
                            .collect()
                    })
                    .unwrap_or_default();
                let report_batch_item_failures = props
                    .get("FunctionResponseTypes")
                    .and_then(Yaml::as_sequence)
                    .is_some_and(|s| {
                        s.iter()
                            .any(|t| t.as_str() == Some("ReportBatchItemFailures"))
                    });
                let max_retry_attempts = props
                    .get("MaximumRetryAttempts")
                    .and_then(text)
                    .and_then(|s| s.parse::<u32>().ok());
                let on_failure = props
                    .get("DestinationConfig")
                    .and_then(|d| d.get("OnFailure"))
                    .and_then(|o| o.get("Destination"))
                    .and_then(referenced_resource);
                out.push(EventSource {
                    function: name.clone(),
                    resource,
                    batch_size,
                    filters,
                    report_batch_item_failures,
                    max_retry_attempts,
                    on_failure,
                });
            }
        }
        out
    }

    /// The event source of `function` (by logical id).
    pub fn event_source(&self, function: &str) -> Option<EventSource> {
        self.event_sources()
            .into_iter()
            .find(|s| s.function == function)
    }

    fn properties(&self, logical_id: &str) -> Option<&Yaml> {
        self.resources
            .get(logical_id)
            .and_then(|r| r.get("Properties"))
    }
}

/// Does `record` (Lambda event JSON) match the Lambda/EventBridge `pattern`?
/// Supports the subset the template uses: nested objects, and arrays of
/// allowed exact values.
pub fn matches_pattern(pattern: &Value, record: &Value) -> bool {
    match pattern {
        Value::Object(fields) => fields
            .iter()
            .all(|(k, p)| record.get(k).is_some_and(|r| matches_pattern(p, r))),
        Value::Array(allowed) => allowed.iter().any(|a| a == record),
        other => other == record,
    }
}

/// Names of the local resources: `{prefix}{LogicalId}`.
#[derive(Debug, Clone)]
pub struct LocalResources {
    pub tables: HashMap<String, String>,
    pub stream_arns: HashMap<String, String>,
    pub queue_urls: HashMap<String, String>,
    pub queue_arns: HashMap<String, String>,
    /// KMS keys by logical id, as their alias (`alias/{prefix}{LogicalId}`).
    pub kms_keys: HashMap<String, String>,
}

impl LocalResources {
    /// Creates every table and queue of the template (idempotent: existing
    /// ones are reused), wiring redrive policies to the created DLQs.
    pub async fn create(
        template: &Template,
        clients: &Clients,
        prefix: &str,
    ) -> Result<Self, LocalError> {
        let mut out = Self {
            tables: HashMap::new(),
            stream_arns: HashMap::new(),
            queue_urls: HashMap::new(),
            queue_arns: HashMap::new(),
            kms_keys: HashMap::new(),
        };
        for logical in template.kms_keys() {
            // The alias makes setup idempotent (a restart reuses the key).
            let alias = format!("alias/{prefix}{logical}");
            let exists = clients
                .kms
                .describe_key()
                .key_id(&alias)
                .send()
                .await
                .is_ok();
            if !exists {
                let key = clients
                    .kms
                    .create_key()
                    .description(format!("{prefix}{logical} (local)"))
                    .send()
                    .await
                    .map_err(|e| aws_err("CreateKey", e))?;
                let key_id = key
                    .key_metadata()
                    .map(|m| m.key_id().to_owned())
                    .ok_or_else(|| LocalError::Aws("CreateKey returned no key".into()))?;
                clients
                    .kms
                    .create_alias()
                    .alias_name(&alias)
                    .target_key_id(key_id)
                    .send()
                    .await
                    .map_err(|e| aws_err("CreateAlias", e))?;
            }
            out.kms_keys.insert(logical, alias);
        }
        for logical in template.tables() {
            let name = format!("{prefix}{logical}");
            let props = template
                .properties(&logical)
                .ok_or_else(|| LocalError::Template(format!("{logical}: no Properties")))?;
            create_table(clients, &name, props).await?;
            let described = clients
                .dynamodb
                .describe_table()
                .table_name(&name)
                .send()
                .await
                .map_err(|e| aws_err("DescribeTable", e))?;
            if let Some(arn) = described.table().and_then(|t| t.latest_stream_arn()) {
                out.stream_arns.insert(logical.clone(), arn.to_owned());
            }
            out.tables.insert(logical, name);
        }
        for logical in template.queues() {
            let name = format!("{prefix}{logical}");
            let props = template.properties(&logical);
            let mut req = clients.sqs.create_queue().queue_name(&name);
            for (key, attr) in [
                ("VisibilityTimeout", QueueAttributeName::VisibilityTimeout),
                (
                    "MessageRetentionPeriod",
                    QueueAttributeName::MessageRetentionPeriod,
                ),
            ] {
                if let Some(v) = props.and_then(|p| p.get(key)).and_then(text) {
                    req = req.attributes(attr, v);
                }
            }
            // An existing queue is reused as it is (a restart keeps its settings and messages).
            let existing = clients
                .sqs
                .get_queue_url()
                .queue_name(&name)
                .send()
                .await
                .ok()
                .and_then(|o| o.queue_url);
            let url = match existing {
                Some(url) => url,
                None => req
                    .send()
                    .await
                    .map_err(|e| aws_err("CreateQueue", e))?
                    .queue_url
                    .unwrap_or_default(),
            };
            let attrs = clients
                .sqs
                .get_queue_attributes()
                .queue_url(&url)
                .attribute_names(QueueAttributeName::QueueArn)
                .send()
                .await
                .map_err(|e| aws_err("GetQueueAttributes", e))?;
            let arn = attrs
                .attributes()
                .and_then(|a| a.get(&QueueAttributeName::QueueArn))
                .cloned()
                .unwrap_or_default();
            out.queue_urls.insert(logical.clone(), url);
            out.queue_arns.insert(logical, arn);
        }
        for logical in template.queues() {
            let Some(policy) = template
                .properties(&logical)
                .and_then(|p| p.get("RedrivePolicy"))
            else {
                continue;
            };
            let target = policy
                .get("deadLetterTargetArn")
                .and_then(referenced_resource)
                .and_then(|dlq| out.queue_arns.get(&dlq).cloned());
            let max = policy
                .get("maxReceiveCount")
                .and_then(text)
                .unwrap_or_else(|| "5".into());
            if let (Some(arn), Some(url)) = (target, out.queue_urls.get(&logical)) {
                let value = json!({"deadLetterTargetArn": arn, "maxReceiveCount": max.parse::<u32>().unwrap_or(5)}).to_string();
                clients
                    .sqs
                    .set_queue_attributes()
                    .queue_url(url)
                    .attributes(QueueAttributeName::RedrivePolicy, value)
                    .send()
                    .await
                    .map_err(|e| aws_err("SetQueueAttributes", e))?;
            }
        }
        Ok(out)
    }
}

fn key_schema(v: &Yaml) -> Result<Vec<KeySchemaElement>, LocalError> {
    v.as_sequence()
        .ok_or_else(|| LocalError::Template("KeySchema is not a list".into()))?
        .iter()
        .map(|k| {
            let name = k.get("AttributeName").and_then(text).unwrap_or_default();
            let kind = match k.get("KeyType").and_then(text).as_deref() {
                Some("RANGE") => KeyType::Range,
                _ => KeyType::Hash,
            };
            KeySchemaElement::builder()
                .attribute_name(name)
                .key_type(kind)
                .build()
                .map_err(|e| LocalError::Template(e.to_string()))
        })
        .collect()
}

async fn create_table(clients: &Clients, name: &str, props: &Yaml) -> Result<(), LocalError> {
    let exists = clients
        .dynamodb
        .describe_table()
        .table_name(name)
        .send()
        .await
        .is_ok();
    if exists {
        return Ok(());
    }
    let mut req = clients
        .dynamodb
        .create_table()
        .table_name(name)
        .billing_mode(BillingMode::PayPerRequest);
    for a in props
        .get("AttributeDefinitions")
        .and_then(Yaml::as_sequence)
        .into_iter()
        .flatten()
    {
        let kind = match a.get("AttributeType").and_then(text).as_deref() {
            Some("N") => ScalarAttributeType::N,
            Some("B") => ScalarAttributeType::B,
            _ => ScalarAttributeType::S,
        };
        req = req.attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(a.get("AttributeName").and_then(text).unwrap_or_default())
                .attribute_type(kind)
                .build()
                .map_err(|e| LocalError::Template(e.to_string()))?,
        );
    }
    req = req.set_key_schema(Some(key_schema(
        props.get("KeySchema").unwrap_or(&Yaml::Null),
    )?));
    for g in props
        .get("GlobalSecondaryIndexes")
        .and_then(Yaml::as_sequence)
        .into_iter()
        .flatten()
    {
        let projection = match g
            .get("Projection")
            .and_then(|p| p.get("ProjectionType"))
            .and_then(text)
            .as_deref()
        {
            Some("KEYS_ONLY") => ProjectionType::KeysOnly,
            Some("INCLUDE") => ProjectionType::Include,
            _ => ProjectionType::All,
        };
        req = req.global_secondary_indexes(
            GlobalSecondaryIndex::builder()
                .index_name(g.get("IndexName").and_then(text).unwrap_or_default())
                .set_key_schema(Some(key_schema(g.get("KeySchema").unwrap_or(&Yaml::Null))?))
                .projection(Projection::builder().projection_type(projection).build())
                .build()
                .map_err(|e| LocalError::Template(e.to_string()))?,
        );
    }
    if let Some(view) = props
        .get("StreamSpecification")
        .and_then(|s| s.get("StreamViewType"))
        .and_then(text)
    {
        req = req.stream_specification(
            StreamSpecification::builder()
                .stream_enabled(true)
                .stream_view_type(StreamViewType::from(view.as_str()))
                .build()
                .map_err(|e| LocalError::Template(e.to_string()))?,
        );
    }
    req.send().await.map_err(|e| aws_err("CreateTable", e))?;
    if let Some(ttl) = props.get("TimeToLiveSpecification") {
        let attr = ttl.get("AttributeName").and_then(text).unwrap_or_default();
        clients
            .dynamodb
            .update_time_to_live()
            .table_name(name)
            .time_to_live_specification(
                TimeToLiveSpecification::builder()
                    .attribute_name(attr)
                    .enabled(true)
                    .build()
                    .map_err(|e| LocalError::Template(e.to_string()))?,
            )
            .send()
            .await
            .map_err(|e| aws_err("UpdateTimeToLive", e))?;
    }
    Ok(())
}

/// Reads a table's stream like Lambda's DynamoDB event source mapping.
#[derive(Debug)]
pub struct StreamSource {
    client: aws_sdk_dynamodbstreams::Client,
    stream_arn: String,
    batch_size: usize,
    filters: Vec<Value>,
    /// Last handled sequence number per shard.
    checkpoints: HashMap<String, String>,
    serial: Option<Arc<Mutex<()>>>,
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
        serial: Option<Arc<Mutex<()>>>,
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
            let _g = lock(&self.serial).await;
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
                .map_err(|e| LocalError::Aws(format!("building the DynamoDB event: {e}")))?;
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
        let _g = lock(&self.serial).await;
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

async fn lock(serial: &Option<Arc<Mutex<()>>>) -> Option<tokio::sync::MutexGuard<'_, ()>> {
    match serial {
        Some(l) => Some(l.lock().await),
        None => None,
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
            .map_err(|e| LocalError::Aws(format!("building the SQS event: {e}")))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_project_template() {
        let t = Template::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../template.yaml"))
            .unwrap();
        assert!(t.tables().contains(&"Table".to_string()));
        assert!(t.queues().contains(&"DeliveryQueue".to_string()));
        let dispatch = t.event_source("DispatchFunction").unwrap();
        assert_eq!(dispatch.resource, "Table");
        assert_eq!(dispatch.batch_size, 100);
        assert_eq!(dispatch.filters.len(), 2);
        assert!(dispatch.report_batch_item_failures);
        assert_eq!(dispatch.max_retry_attempts, Some(50));
        assert_eq!(dispatch.on_failure.as_deref(), Some("DispatchFailureQueue"));
        assert_eq!(t.kms_keys(), ["SecretsKey"]);
        let deliver = t.event_source("DeliverFunction").unwrap();
        assert_eq!(deliver.resource, "DeliveryQueue");
        assert_eq!(deliver.batch_size, 10);
    }

    #[test]
    fn filter_patterns() {
        let pattern: Value = serde_json::from_str(
            r#"{"dynamodb":{"NewImage":{"kind":{"S":["delivery"]},"status":{"S":["pending"]}}}}"#,
        )
        .unwrap();
        let rec = |kind: &str, status: &str| json!({"dynamodb": {"NewImage": {"kind": {"S": kind}, "status": {"S": status}}}});
        assert!(matches_pattern(&pattern, &rec("delivery", "pending")));
        assert!(!matches_pattern(&pattern, &rec("delivery", "failed")));
        assert!(!matches_pattern(&pattern, &rec("endpoint", "pending")));
        assert!(!matches_pattern(&pattern, &json!({"dynamodb": {}})));
    }
}
