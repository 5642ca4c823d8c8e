//! The source article's `OrdersService`, on DynamoDB: the order row and the
//! webhook intent go into **one** `TransactWriteItems`. If the transaction
//! commits, the webhook is registered; if it fails (here: the order id exists
//! already), neither exists. They never drift apart.
//!
//! - [`OrdersService::create_order`]: order + `order.created` webhook, atomically.
//! - [`OrdersService::pay_order`]: the order marked paid + `order.paid`,
//!   atomically. Both events have the order id as their `ordering_key`:
//!   every endpoint gets an order's `order.created` before its `order.paid`.
//! - [`create_orders_table`]: the example's own table (key `order_id`).

use std::time::Duration;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType, Put,
    ScalarAttributeType, TransactWriteItem, Update,
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
    /// Created again, or paid while missing: the order's condition failed.
    #[error("order {0} already exists, or does not exist")]
    Conflict(String),
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
        let order_item =
            serde_dynamo::to_item(order).map_err(|e| OrderError::Store(e.to_string()))?;
        let put_order = Put::builder()
            .table_name(&self.orders_table)
            .set_item(Some(order_item))
            .condition_expression("attribute_not_exists(order_id)")
            .build()
            .map_err(|e| OrderError::Store(e.to_string()))?;
        let write = TransactWriteItem::builder().put(put_order).build();
        self.commit_with_event(
            write,
            &order.order_id,
            "order.created",
            order,
            order.created_at,
        )
        .await
    }

    /// Marks an existing order paid and sends `order.paid`, in one
    /// transaction.
    pub async fn pay_order(
        &self,
        order_id: &str,
        paid_at: DateTime<Utc>,
    ) -> Result<IngestResponse, OrderError> {
        let update = Update::builder()
            .table_name(&self.orders_table)
            .key("order_id", AttributeValue::S(order_id.to_owned()))
            .update_expression("SET paid_at = :at")
            .condition_expression("attribute_exists(order_id)")
            .expression_attribute_values(":at", AttributeValue::S(paid_at.to_rfc3339()))
            .build()
            .map_err(|e| OrderError::Store(e.to_string()))?;
        let write = TransactWriteItem::builder().update(update).build();
        let payload = serde_json::json!({"order_id": order_id, "paid_at": paid_at});
        self.commit_with_event(write, order_id, "order.paid", &payload, paid_at)
            .await
    }

    /// Commits `write` (the order's, first; its condition failing means the
    /// order is not in the state it must be) with an event of `event_type`
    /// keyed by the order id. If another event of the order committed
    /// between the key's read and this commit, reads the key again and
    /// commits again (a few times).
    async fn commit_with_event<P: Serialize>(
        &self,
        write: TransactWriteItem,
        order_id: &str,
        event_type: &str,
        payload: &P,
        at: DateTime<Utc>,
    ) -> Result<IngestResponse, OrderError> {
        // Endpoints change rarely: a real service would cache this list.
        let endpoints = self.webhooks.list_routes(&self.app_id).await?;
        let payload = serde_json::value::to_raw_value(payload)
            .map_err(|e| OrderError::Store(e.to_string()))?;
        for _ in 0..COMMIT_ROUNDS {
            let head = self.webhooks.get_key_head(&self.app_id, order_id).await?;
            let (webhook_items, accepted) = outbox::keyed_event_items(
                self.webhooks.table(),
                self.app_id.clone(),
                event_type,
                &payload,
                order_id,
                &head,
                &endpoints,
                at,
                self.retention,
            )?;
            let mut items = vec![write.clone()];
            items.extend(webhook_items);
            let err = match self
                .client
                .transact_write_items()
                .set_transact_items(Some(items))
                .send()
                .await
            {
                Ok(_) => return Ok(accepted),
                Err(err) => err,
            };
            let reasons = hookline_aws::error::cancellation_reasons(&err).unwrap_or_default();
            // The order's write is the first item; the webhook's from 1.
            if reasons
                .first()
                .is_some_and(hookline_aws::error::condition_failed)
            {
                return Err(OrderError::Conflict(order_id.to_owned()));
            }
            if !outbox::key_moved(reasons, 1) {
                return Err(OrderError::Store(
                    aws_sdk_dynamodb::error::DisplayErrorContext(err).to_string(),
                ));
            }
        }
        Err(OrderError::Store(format!(
            "the order {order_id}'s events kept racing; try again"
        )))
    }
}

/// Commits tried before an order's write gives up on a racing key.
const COMMIT_ROUNDS: usize = 4;

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
