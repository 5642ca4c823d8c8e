//! Stream -> queue: every pending delivery written to the table (insert, retry
//! scheduled, manual retry) becomes one SQS message delayed until it is due;
//! every event with fan-out left gets its next deliveries materialised.
//!
//! Decisions use the record's new image only (moto's old images are wrong and
//! AWS sends none for some writes). Sending twice is harmless: deliver acks a
//! message whose attempt number no longer matches the stored delivery.

use chrono::{DateTime, Utc};
use hookline_core::ids::{DeliveryId, EventId};
use hookline_core::model::{Delivery, DeliveryStatus};

use crate::messages::{delay_seconds, DeliveryMessage};
use crate::ports::{Queue, Store, FANOUT_CHUNK};
use crate::PipelineError;

/// What a stream record's new image asks of dispatch.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamChange {
    /// A delivery in `pending`: queue its next attempt.
    PendingDelivery(Box<Delivery>),
    /// An event whose fan-out list is not empty.
    EventFanout(EventId),
    /// Anything else (endpoints, terminal deliveries, removals).
    Ignored,
}

/// The queue message for a pending delivery's next attempt, and its delay.
pub fn message_for(delivery: &Delivery, now: DateTime<Utc>) -> Option<(DeliveryMessage, i32)> {
    if delivery.status != DeliveryStatus::Pending {
        return None;
    }
    let not_before = delivery.next_attempt_at.unwrap_or(now);
    let message = DeliveryMessage {
        delivery_id: delivery.id.clone(),
        attempt: delivery.next_attempt_number(),
        not_before,
        app_id: delivery.app_id.to_string(),
        endpoint_id: delivery.endpoint_id.clone(),
        event_type: delivery.event_type.to_string(),
        version: Some(delivery.version),
        failure: None,
    };
    Some((message, delay_seconds(not_before, now)))
}

/// Queues the next attempt of each pending delivery (SendMessageBatch by 10).
/// Returns the ids whose message was not accepted (to report as failures).
pub async fn queue_pending<Q: Queue>(
    queue: &Q,
    deliveries: &[&Delivery],
    now: DateTime<Utc>,
) -> Result<Vec<DeliveryId>, PipelineError> {
    let messages: Vec<(DeliveryMessage, i32)> = deliveries
        .iter()
        .filter_map(|d| message_for(d, now))
        .collect();
    if messages.is_empty() {
        return Ok(Vec::new());
    }
    let failed = queue.send_deliveries(&messages).await?;
    for (message, delay) in &messages {
        tracing::debug!(delivery_id = %message.delivery_id, attempt = message.attempt, delay_seconds = delay, "queued");
    }
    Ok(failed
        .into_iter()
        .filter_map(|i| messages.get(i).map(|(m, _)| m.delivery_id.clone()))
        .collect())
}

/// Materialises the remaining fan-out of an event, chunk by chunk, each chunk
/// in one transaction guarded by the event's fan-out version. Idempotent: a
/// repeated or concurrent run finds the version moved on and stops.
#[tracing::instrument(name = "fanout", skip_all, fields(event_id = %event_id))]
pub async fn materialise_fanout<S: Store>(
    store: &S,
    event_id: &EventId,
    now: DateTime<Utc>,
) -> Result<usize, PipelineError> {
    let mut written = 0;
    loop {
        let Some(stored) = store.get_event(event_id).await? else {
            tracing::warn!(event_id = %event_id, "fan-out of a missing event ignored");
            return Ok(written);
        };
        if stored.fanout_remaining.is_empty() {
            return Ok(written);
        }
        let cut = stored.fanout_remaining.len().min(FANOUT_CHUNK);
        let (chunk, rest) = stored.fanout_remaining.split_at(cut);
        let deliveries: Vec<Delivery> = chunk
            .iter()
            .map(|ep| {
                Delivery::new(
                    DeliveryId::for_event_endpoint(event_id, ep),
                    &stored.event,
                    ep.clone(),
                    now,
                )
            })
            .collect();
        if !store
            .materialise_fanout(event_id, stored.fanout_version, &deliveries, rest)
            .await?
        {
            tracing::info!(event_id = %event_id, "fan-out chunk already materialised elsewhere");
            return Ok(written);
        }
        written += deliveries.len();
        tracing::info!(event_id = %event_id, chunk = deliveries.len(), remaining = rest.len(), "fan-out chunk materialised");
    }
}
