//! Creates the template's tables, queues (with their redrive policies) and
//! KMS keys on moto or any AWS endpoint; idempotent, so a restart reuses them.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ProjectionType, ScalarAttributeType, StreamSpecification, StreamViewType,
    TimeToLiveSpecification,
};
use aws_sdk_sqs::types::QueueAttributeName;
use hookline_aws::clients::Clients;
use serde_json::json;
use serde_yaml_ng::Value as Yaml;

use crate::template::{referenced_resource, text, Template};
use crate::{aws_err, LocalError};

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
    /// (KMS keys are set up with the SDK's `kms` client: the functions'
    /// own KMS client speaks only the data-key operations.)
    pub async fn create(
        template: &Template,
        clients: &Clients,
        kms: &aws_sdk_kms::Client,
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
            let exists = kms.describe_key().key_id(&alias).send().await.is_ok();
            if !exists {
                let key = kms
                    .create_key()
                    .description(format!("{prefix}{logical} (local)"))
                    .send()
                    .await
                    .map_err(|e| aws_err("CreateKey", e))?;
                let key_id = key
                    .key_metadata()
                    .map(|m| m.key_id().to_owned())
                    .ok_or_else(|| LocalError::Setup("CreateKey returned no key".into()))?;
                kms.create_alias()
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
                    .ok_or_else(|| LocalError::Setup(format!("CreateQueue {logical}: no URL")))?,
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
                .ok_or_else(|| LocalError::Setup(format!("queue {logical}: no ARN")))?;
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

/// A text property the template must give (a missing one is a template error,
/// not an empty name).
fn field(v: &Yaml, name: &str) -> Result<String, LocalError> {
    v.get(name)
        .and_then(text)
        .ok_or_else(|| LocalError::Template(format!("`{name}` missing in {v:?}")))
}

fn key_schema(v: &Yaml) -> Result<Vec<KeySchemaElement>, LocalError> {
    v.as_sequence()
        .ok_or_else(|| LocalError::Template("KeySchema is not a list".into()))?
        .iter()
        .map(|k| {
            let name = field(k, "AttributeName")?;
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
                .attribute_name(field(a, "AttributeName")?)
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
                .index_name(field(g, "IndexName")?)
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
        let attr = field(ttl, "AttributeName")?;
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
