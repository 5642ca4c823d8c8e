//! The source article's `OrdersService`, on DynamoDB: the order row and the
//! webhook intent go into **one** `TransactWriteItems`. If the transaction
//! commits, the webhook is registered; if it fails (here: the order id exists
//! already), neither exists. They never drift apart.
//!
//! - [`OrdersService::create_order`]: order + `order.created` webhook, atomically.
//! - [`create_orders_table`]: the example's own table (key `order_id`).

use std::time::Duration;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, Put, ScalarAttributeType,
    TransactWriteItem,
};
use aws_sdk_dynamodb::Client;
use chrono::{DateTime, Utc};
use hookline_aws::outbox;
use hookline_aws::DynamoStore;
use hookline_core::ids::AppId;
use hookline_pipeline::ingest::IngestResponse;
use hookline_pipeline::ports::Store;
use serde::{Deserialize, Serialize};

/// An order, the producer's business data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Order {
    pub order_id: String,
    pub customer: String,
    pub total_cents: u64,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, thiserror::Error)]
pub enum OrderError {
    #[error("order {0} already exists")]
    AlreadyExists(String),
    #[error("webhook: {0}")]
    Webhook(#[from] hookline_pipeline::PipelineError),
    #[error("dynamodb: {0}")]
    Store(String),
}

/// Creates orders and their `order.created` webhooks together.
#[derive(Debug, Clone)]
pub struct OrdersService {
    pub client: Client,
    pub orders_table: String,
    pub webhooks: DynamoStore,
    pub app_id: AppId,
    pub retention: Duration,
}

impl OrdersService {
    /// The article's `createOrder`: one transaction holds the order (which
    /// must not exist yet) and the event with its deliveries.
    pub async fn create_order(&self, order: &Order) -> Result<IngestResponse, OrderError> {
        // Endpoints change rarely: a real service would cache this list.
        let endpoints = self.webhooks.list_routes(&self.app_id).await?;
        let (webhook_items, accepted) = outbox::event_items(
            self.webhooks.table(),
            self.app_id.clone(),
            "order.created",
            &serde_json::value::to_raw_value(order)
                .map_err(|e| OrderError::Store(e.to_string()))?,
            &endpoints,
            order.created_at,
            self.retention,
        )?;
        let order_item =
            serde_dynamo::to_item(order).map_err(|e| OrderError::Store(e.to_string()))?;
        let put_order = Put::builder()
            .table_name(&self.orders_table)
            .set_item(Some(order_item))
            .condition_expression("attribute_not_exists(order_id)")
            .build()
            .map_err(|e| OrderError::Store(e.to_string()))?;
        let mut items = vec![TransactWriteItem::builder().put(put_order).build()];
        items.extend(webhook_items);
        match self
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            .send()
            .await
        {
            Ok(_) => Ok(accepted),
            Err(err) => {
                // The order's put is the first item of the transaction.
                let order_exists = hookline_aws::error::cancellation_reasons(&err)
                    .and_then(|reasons| reasons.first())
                    .is_some_and(hookline_aws::error::condition_failed);
                if order_exists {
                    Err(OrderError::AlreadyExists(order.order_id.clone()))
                } else {
                    Err(OrderError::Store(
                        aws_sdk_dynamodb::error::DisplayErrorContext(err).to_string(),
                    ))
                }
            }
        }
    }
}

/// Creates the example's orders table (idempotent).
pub async fn create_orders_table(client: &Client, name: &str) -> Result<(), OrderError> {
    if client
        .describe_table()
        .table_name(name)
        .send()
        .await
        .is_ok()
    {
        return Ok(());
    }
    let err = |e: &dyn std::fmt::Display| OrderError::Store(e.to_string());
    client
        .create_table()
        .table_name(name)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("order_id")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .map_err(|e| err(&e))?,
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("order_id")
                .key_type(KeyType::Hash)
                .build()
                .map_err(|e| err(&e))?,
        )
        .send()
        .await
        .map_err(|e| err(&aws_sdk_dynamodb::error::DisplayErrorContext(e)))?;
    Ok(())
}
