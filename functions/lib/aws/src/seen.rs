//! [`DynamoSeenStore`]: the receiver kit's [`SeenStore`] on DynamoDB, for
//! receivers that run on Lambda (no shared memory between instances).
//!
//! One item per message id: `PK = SEEN#{id}`, `state` (`in_progress` |
//! `processed`), `expires_at` (TTL attribute). A claim is a conditional put
//! that succeeds only if no live item exists, so two concurrent copies can
//! never both claim.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::error::DisplayErrorContext;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType, TimeToLiveSpecification,
};
use aws_sdk_dynamodb::Client;
use hookline_verify::{Claim, SeenStore, SeenStoreError};

/// The DynamoDB seen store.
#[derive(Debug, Clone)]
pub struct DynamoSeenStore {
    client: Client,
    table: String,
    serial: crate::serial::Serial,
}

fn err(op: &str, e: impl std::error::Error + Send + Sync + 'static) -> SeenStoreError {
    SeenStoreError(format!("{op}: {}", DisplayErrorContext(e)).into())
}

fn epoch_in(d: Duration) -> i64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|n| n.as_secs())
        .unwrap_or(0);
    i64::try_from(now + d.as_secs()).unwrap_or(i64::MAX)
}

impl DynamoSeenStore {
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self {
            client,
            table: table.into(),
            serial: Default::default(),
        }
    }

    /// Serialises calls (moto only: it is not safe under concurrent writes).
    pub fn serialized(mut self, serial: crate::serial::Serial) -> Self {
        self.serial = serial;
        self
    }

    /// Creates the table (`PK` string key, TTL on `expires_at`) if missing.
    pub async fn create_table(client: &Client, table: &str) -> Result<(), SeenStoreError> {
        if client
            .describe_table()
            .table_name(table)
            .send()
            .await
            .is_ok()
        {
            return Ok(());
        }
        let build = |e: aws_sdk_dynamodb::error::BuildError| SeenStoreError(e.to_string().into());
        client
            .create_table()
            .table_name(table)
            .billing_mode(BillingMode::PayPerRequest)
            .attribute_definitions(
                AttributeDefinition::builder()
                    .attribute_name("PK")
                    .attribute_type(ScalarAttributeType::S)
                    .build()
                    .map_err(build)?,
            )
            .key_schema(
                KeySchemaElement::builder()
                    .attribute_name("PK")
                    .key_type(KeyType::Hash)
                    .build()
                    .map_err(build)?,
            )
            .send()
            .await
            .map_err(|e| err("CreateTable", e))?;
        client
            .update_time_to_live()
            .table_name(table)
            .time_to_live_specification(
                TimeToLiveSpecification::builder()
                    .attribute_name("expires_at")
                    .enabled(true)
                    .build()
                    .map_err(build)?,
            )
            .send()
            .await
            .map_err(|e| err("UpdateTimeToLive", e))?;
        Ok(())
    }

    fn key(id: &str) -> HashMap<String, AttributeValue> {
        HashMap::from([("PK".to_owned(), AttributeValue::S(format!("SEEN#{id}")))])
    }

    async fn guard(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        self.serial.guard().await
    }
}

impl SeenStore for DynamoSeenStore {
    async fn claim(&self, id: &str, lease: Duration) -> Result<Claim, SeenStoreError> {
        let _g = self.guard().await;
        let mut item = Self::key(id);
        item.insert("state".into(), AttributeValue::S("in_progress".into()));
        item.insert(
            "expires_at".into(),
            AttributeValue::N(epoch_in(lease).to_string()),
        );
        let put = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(PK) OR expires_at < :now")
            .expression_attribute_values(
                ":now",
                AttributeValue::N(epoch_in(Duration::ZERO).to_string()),
            )
            .send()
            .await;
        match put {
            Ok(_) => Ok(Claim::Claimed),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_conditional_check_failed_exception()) =>
            {
                let existing = self
                    .client
                    .get_item()
                    .table_name(&self.table)
                    .set_key(Some(Self::key(id)))
                    .consistent_read(true)
                    .send()
                    .await
                    .map_err(|e| err("GetItem", e))?;
                let state = existing
                    .item
                    .as_ref()
                    .and_then(|i| i.get("state"))
                    .and_then(|s| s.as_s().ok())
                    .cloned();
                Ok(if state.as_deref() == Some("processed") {
                    Claim::AlreadyProcessed
                } else {
                    Claim::InProgress
                })
            }
            Err(e) => Err(err("PutItem", e)),
        }
    }

    async fn mark_processed(&self, id: &str, ttl: Duration) -> Result<(), SeenStoreError> {
        let _g = self.guard().await;
        let mut item = Self::key(id);
        item.insert("state".into(), AttributeValue::S("processed".into()));
        item.insert(
            "expires_at".into(),
            AttributeValue::N(epoch_in(ttl).to_string()),
        );
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| err("PutItem", e))?;
        Ok(())
    }

    async fn release(&self, id: &str) -> Result<(), SeenStoreError> {
        let _g = self.guard().await;
        let result = self
            .client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(id)))
            .condition_expression("#s = :in_progress")
            .expression_attribute_names("#s", "state")
            .expression_attribute_values(":in_progress", AttributeValue::S("in_progress".into()))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_conditional_check_failed_exception()) =>
            {
                Ok(())
            }
            Err(e) => Err(err("DeleteItem", e)),
        }
    }
}
