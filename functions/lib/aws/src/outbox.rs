//! The transactional outbox for producers that keep their own data in
//! DynamoDB (the source article's `OrdersService`): the webhook items of an
//! event, to append to **your own** `TransactWriteItems`, so the business
//! write and the webhook intent commit or fail together.
//!
//! ```ignore
//! let endpoints = store.list_routes(&app).await?;              // or a cached copy
//! // `payload`: your JSON text as a `RawValue`; receivers get it byte for byte.
//! let (items, accepted) = outbox::event_items(&table, app, event_type, &payload,
//!                                              &endpoints, Utc::now(), retention)?;
//! client.transact_write_items()
//!     .transact_items(put_order)                                 // your row + conditions
//!     .set_transact_items(Some([vec![put_order], items].concat()))
//!     .send().await?;                                            // all or nothing
//! ```
//! An event to up to `FANOUT_LIST_MAX` endpoints is one item (its fan-out
//! listed on it); a larger one adds its first delivery items and keeps the
//! rest as a fan-out list on the event item, which the dispatch function
//! materialises after commit, exactly as for events sent through the API.
//!
//! An event with an `ordering_key` ([`keyed_event_items`]) is ordered after
//! the key's head, read first (`Store::get_key_head`); its items move the
//! head on, on the condition that no other event of the key committed
//! meanwhile. If yours did not ([`key_moved`]), read the head again and
//! build the items again.

use std::time::Duration;

use aws_sdk_dynamodb::types::{Put, TransactWriteItem};
use chrono::{DateTime, Utc};
use hookline_core::ids::AppId;
use hookline_core::model::{EndpointRoute, EventType};
use hookline_core::ordering::KeyHead;
use hookline_pipeline::ingest::{order_event, plan_event, IngestResponse};
use hookline_pipeline::ports::{HeadMove, NewEvent, Result};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_dynamo::Item;
use serde_json::value::RawValue;

use crate::schema;

/// Wraps a conditional put (never overwrites) as a transaction item.
pub(crate) fn put_new(table: &str, item: Item) -> Result<TransactWriteItem> {
    Ok(TransactWriteItem::builder()
        .put(put_if_absent(table, item)?)
        .build())
}

/// Where a keyed event's head move is among its transaction's items (right
/// after the event): a cancellation reason there means the key moved on.
pub const KEY_HEAD_POSITION: usize = 1;

/// The transaction items of `new`: the event, its key's head move (at
/// [`KEY_HEAD_POSITION`], when it has an ordering key), its inline
/// deliveries, and its idempotency record last (when there is one).
pub fn transact_items(
    table: &str,
    new: &NewEvent,
    retention: Duration,
) -> Result<Vec<TransactWriteItem>> {
    let mut items = Vec::with_capacity(new.deliveries.len() + 3);
    items.push(put_new(
        table,
        schema::event_item(
            &new.event,
            &new.targets,
            &new.fanout_remaining,
            0,
            retention,
            new.event.created_at,
        )?,
    )?);
    if let Some(moved) = &new.key_head {
        items.push(head_move(table, &new.event.app_id, moved, retention)?);
    }
    for d in &new.deliveries {
        items.push(put_new(table, schema::delivery_item(d, retention)?)?);
    }
    if let Some(record) = &new.idempotency {
        // An expired record (TTL deletion lags by up to days) may be taken
        // over at once.
        let put = aws_sdk_dynamodb::types::Put::builder()
            .table_name(table)
            .set_item(Some(schema::idempotency_item(record)?.into()))
            .condition_expression("attribute_not_exists(PK) OR expires_at <= :now")
            .expression_attribute_values(
                ":now",
                aws_sdk_dynamodb::types::AttributeValue::N(
                    record.created_at.timestamp().to_string(),
                ),
            )
            .build()
            .map_err(|e| crate::error::corrupt("put", e))?;
        items.push(TransactWriteItem::builder().put(put).build());
    }
    Ok(items)
}

/// Plans an event for `endpoints` (enabled, subscribed ones receive it) and
/// returns the items to append to the producer's transaction plus the ids.
/// At most `INLINE_DELIVERIES + 1` items: leave room for your own writes
/// (a transaction holds 100) or pass fewer endpoints per event.
pub fn event_items(
    table: &str,
    app_id: AppId,
    event_type: &str,
    payload: &RawValue,
    endpoints: &[EndpointRoute],
    now: DateTime<Utc>,
    retention: Duration,
) -> Result<(Vec<TransactWriteItem>, IngestResponse)> {
    let event_type = EventType::parse(event_type)?;
    let mut rng = StdRng::from_entropy();
    let (new, response) = plan_event(app_id, event_type, payload, endpoints, now, &mut rng);
    Ok((transact_items(table, &new, retention)?, response))
}

/// The put of a key's new head, on the condition that the stored one is
/// still at the version its event was planned after.
fn head_move(
    table: &str,
    app: &AppId,
    moved: &HeadMove,
    retention: Duration,
) -> Result<TransactWriteItem> {
    let item = schema::key_head_item(app, &moved.key, &moved.head, retention)?;
    let put = Put::builder().table_name(table).set_item(Some(item.into()));
    let put = if moved.from == 0 {
        put.condition_expression("attribute_not_exists(PK)")
    } else {
        put.condition_expression("version = :from")
            .expression_attribute_values(
                ":from",
                aws_sdk_dynamodb::types::AttributeValue::N(moved.from.to_string()),
            )
    };
    let put = put.build().map_err(|e| crate::error::corrupt("put", e))?;
    Ok(TransactWriteItem::builder().put(put).build())
}

/// [`event_items`] for an event with `ordering_key`, ordered after the
/// key's `head` as read (`Store::get_key_head`): one more item, the head's
/// move, at [`KEY_HEAD_POSITION`] among these items. A transaction
/// cancelled with [`key_moved`] wrote nothing: read the head again and
/// build the items again.
#[allow(clippy::too_many_arguments)]
pub fn keyed_event_items(
    table: &str,
    app_id: AppId,
    event_type: &str,
    payload: &RawValue,
    ordering_key: &str,
    head: &KeyHead,
    endpoints: &[EndpointRoute],
    now: DateTime<Utc>,
    retention: Duration,
) -> Result<(Vec<TransactWriteItem>, IngestResponse)> {
    let event_type = EventType::parse(event_type)?;
    hookline_core::ordering::check_ordering_key(ordering_key)?;
    let mut rng = StdRng::from_entropy();
    let accepted_at = hookline_core::ordering::accepted_at(head, now);
    let (mut new, response) = plan_event(
        app_id,
        event_type,
        payload,
        endpoints,
        accepted_at,
        &mut rng,
    );
    order_event(&mut new, &response.delivery_ids, ordering_key, head)?;
    Ok((transact_items(table, &new, retention)?, response))
}

/// Whether a transaction holding [`keyed_event_items`] from position
/// `offset` (the items of yours before them) was cancelled because the
/// key's head moved on.
pub fn key_moved(reasons: &[aws_sdk_dynamodb::types::CancellationReason], offset: usize) -> bool {
    reasons
        .get(offset + KEY_HEAD_POSITION)
        .is_some_and(crate::error::condition_failed)
}

/// Builds a `Put` of `item` that refuses to overwrite (also the store's create-only items).
pub(crate) fn put_if_absent(table: &str, item: Item) -> Result<Put> {
    Put::builder()
        .table_name(table)
        .set_item(Some(item.into()))
        .condition_expression("attribute_not_exists(PK)")
        .build()
        .map_err(|e| crate::error::corrupt("put", e))
}
