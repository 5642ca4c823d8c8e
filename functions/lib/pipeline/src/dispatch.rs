//! Stream -> queue: every new event with a listed fan-out becomes one SQS
//! message per delivery (its first attempt, body from the stream image: no
//! table read or write); every pending delivery written to the table (retry
//! scheduled, manual retry) becomes one SQS message delayed until it is due;
//! every event with fan-out left gets its next deliveries materialised.
//!
//! Decisions use the record's new image only (moto's old images are wrong and
//! AWS sends none for some writes). Sending twice is harmless: deliver acks a
//! message whose attempt number no longer matches the stored delivery.

use chrono::{DateTime, Utc};
use hookline_core::ids::{AppId, DeliveryId, EventId, ReplayId};
use hookline_core::model::{Delivery, DeliveryStatus, Event};

use std::collections::HashMap;

use crate::messages::{delay_seconds, DeliveryMessage, INLINE_BODY_MAX};
use crate::ports::{Queue, Store, StoredEvent, FANOUT_CHUNK};
use crate::replay::continue_replay;
use crate::PipelineError;

/// What a stream record's new image asks of dispatch.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamChange {
    /// A delivery in `pending`: queue its next attempt.
    PendingDelivery(Box<Delivery>),
    /// An event (of this app) whose fan-out list is not empty.
    EventFanout(AppId, EventId),
    /// A new event with a listed fan-out (acted on for inserts only).
    ListedFanout(Box<StoredEvent>),
    /// A replay still running: its next step ([`crate::replay`]).
    RunningReplay(ReplayId),
    /// A delivery that ended with a successor of its ordering key
    /// registered on it ([`crate::deliver`]'s gate): wake that one.
    Wake {
        app: AppId,
        successor: DeliveryId,
        predecessor: DeliveryId,
    },
    /// Anything else (endpoints, terminal deliveries, removals).
    Ignored,
}

/// How long after its creation an event's write counts as late (see
/// [`dispatch_changes`]): the sweep's cutoff is `reconcile_after` back,
/// the stream's write time is rounded down to the minute, and clocks
/// differ; a minute for each, so an event that may be below the sweep's
/// mark is always indexed (indexing one too many costs a write).
pub fn late_after(reconcile_after: std::time::Duration) -> chrono::TimeDelta {
    chrono::TimeDelta::from_std(reconcile_after)
        .unwrap_or(chrono::TimeDelta::MAX)
        .checked_sub(&chrono::TimeDelta::minutes(2))
        .unwrap_or(chrono::TimeDelta::zero())
        .max(chrono::TimeDelta::zero())
}

/// One stream record as dispatch acts on it: its new image decoded.
#[derive(Debug)]
pub struct RecordChange {
    /// Its sequence number (for logs).
    pub sequence: String,
    /// An INSERT (a listed fan-out's first attempts are sent on insert only).
    pub insert: bool,
    /// When the stream says the write happened (DynamoDB Streams'
    /// `ApproximateCreationDateTime`, rounded down to the minute).
    pub written_at: Option<DateTime<Utc>>,
    pub change: Result<StreamChange, PipelineError>,
}

/// Runs a batch's records in order; the index of the first that failed
/// (the caller reports it and every later one: Lambda retries the batch
/// from there, so nothing after a failure is acted on now). Consecutive
/// pending deliveries are queued together (SendMessageBatch by 10) before
/// anything that follows them. Handling is idempotent, so a re-delivered
/// record is harmless.
pub async fn dispatch_changes<S: Store, Q: Queue>(
    store: &S,
    queue: &Q,
    changes: Vec<RecordChange>,
    late_after: chrono::TimeDelta,
    now: DateTime<Utc>,
) -> Option<usize> {
    let mut run = Run::default();
    for (index, record) in changes.into_iter().enumerate() {
        let seq = record.sequence;
        match record.change {
            Ok(StreamChange::PendingDelivery(d)) => run.deliveries.push((index, *d)),
            // Only the insert: a later change of the event (its retention
            // pushed back) must not send the first attempts again.
            Ok(StreamChange::ListedFanout(stored)) if record.insert => {
                // Written so late that the sweep may have passed its
                // creation (a producer's transaction retried, a slow
                // clock): indexed by its write before its first attempts
                // are queued, so a lost one is still found.
                if let Some(written) = record
                    .written_at
                    .filter(|w| *w - stored.event.created_at >= late_after)
                {
                    if let Err(err) = store
                        .index_late_event(&crate::ports::EventHead::of(&stored), written)
                        .await
                    {
                        if let Some(failed) = flush(store, queue, &mut run, now).await {
                            return Some(failed);
                        }
                        tracing::error!(event_id = %stored.event.id, sequence_number = %seq, error = %hookline_core::error::Chain(&err), "indexing a late event failed");
                        return Some(index);
                    }
                    tracing::warn!(event_id = %stored.event.id, created_at = %stored.event.created_at, written_at = %written, "an event written long after its creation: in the late-write index");
                }
                for delivery in stored.listed_deliveries() {
                    run.deliveries.push((index, delivery));
                }
                run.events.push(stored.event);
            }
            Ok(StreamChange::ListedFanout(_) | StreamChange::Ignored) => {}
            Ok(StreamChange::EventFanout(app_id, event_id)) => {
                if let Some(failed) = flush(store, queue, &mut run, now).await {
                    return Some(failed);
                }
                if let Err(err) = materialise_fanout(store, &app_id, &event_id, now).await {
                    tracing::error!(event_id = %event_id, sequence_number = %seq, error = %hookline_core::error::Chain(&err), "fan-out failed");
                    return Some(index);
                }
            }
            Ok(StreamChange::Wake {
                app,
                successor,
                predecessor,
            }) => {
                if let Some(failed) = flush(store, queue, &mut run, now).await {
                    return Some(failed);
                }
                if let Err(err) = wake(store, queue, &app, &successor, &predecessor, now).await {
                    tracing::error!(delivery_id = %successor, predecessor = %predecessor, sequence_number = %seq, error = %hookline_core::error::Chain(&err), "waking a delivery failed");
                    return Some(index);
                }
            }
            Ok(StreamChange::RunningReplay(replay_id)) => {
                if let Some(failed) = flush(store, queue, &mut run, now).await {
                    return Some(failed);
                }
                if let Err(err) = continue_replay(store, &replay_id, now).await {
                    tracing::error!(replay_id = %replay_id, sequence_number = %seq, error = %hookline_core::error::Chain(&err), "replay step failed");
                    return Some(index);
                }
            }
            Err(err) => {
                if let Some(failed) = flush(store, queue, &mut run, now).await {
                    return Some(failed);
                }
                tracing::error!(sequence_number = %seq, error = %hookline_core::error::Chain(&err), "undecodable stream record");
                return Some(index);
            }
        }
    }
    flush(store, queue, &mut run, now).await
}

/// Wakes `successor`, which waits for `predecessor` (ended): due now,
/// written as re-queued and its message sent here (one stream hop less
/// than letting its item's change queue it: a key's waiting deliveries go
/// one after another at the pace of these hops). `false` when it does not
/// wait (any more) for that one: woken already (a record seen again sends
/// the message again if the delivery still stands as woken: the first
/// send may have failed), or not blocked yet (its deliver reads the
/// predecessor again after blocking it).
pub async fn wake<S: Store, Q: Queue>(
    store: &S,
    queue: &Q,
    app: &AppId,
    successor: &DeliveryId,
    predecessor: &DeliveryId,
    now: DateTime<Utc>,
) -> Result<bool, PipelineError> {
    let Some(mut delivery) = store.get_delivery_item(app, successor).await? else {
        return Ok(false);
    };
    let expected = delivery.version;
    if delivery.unblock(predecessor, now) {
        if !store.update_delivery(&delivery, expected).await? {
            return Ok(false);
        }
    } else if !delivery.woken_by(predecessor) {
        return Ok(false);
    }
    let Some(pair) = message_for(&delivery, now) else {
        return Ok(false);
    };
    if !queue.send_deliveries(&[pair]).await?.is_empty() {
        return Err(PipelineError::queue(
            "the queue refused a woken delivery's message",
            true,
        ));
    }
    tracing::info!(delivery_id = %successor, predecessor = %predecessor, "its predecessor ended: the delivery goes");
    Ok(true)
}

/// Consecutive records' deliveries to queue together, with the events whose
/// bodies their stream images carried.
#[derive(Default)]
struct Run {
    deliveries: Vec<(usize, Delivery)>,
    events: Vec<Event>,
}

/// Queues a run of pending deliveries; the record index of the first one
/// not accepted, if any.
async fn flush<S: Store, Q: Queue>(
    store: &S,
    queue: &Q,
    run: &mut Run,
    now: DateTime<Utc>,
) -> Option<usize> {
    let Run {
        deliveries: batch,
        events,
    } = std::mem::take(run);
    if batch.is_empty() {
        return None;
    }
    let refs: Vec<&Delivery> = batch.iter().map(|(_, d)| d).collect();
    let known: Vec<&Event> = events.iter().collect();
    match queue_pending(store, queue, &refs, &known, now).await {
        Ok(failed_ids) => {
            batch
                .iter()
                .find(|(_, d)| failed_ids.contains(&d.id))
                .map(|(index, d)| {
                    tracing::error!(delivery_id = %d.id, "queue refused a delivery message");
                    *index
                })
        }
        Err(err) => {
            tracing::error!(error = %hookline_core::error::Chain(&err), deliveries = batch.len(), "queueing failed");
            batch.first().map(|(index, _)| *index)
        }
    }
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
        app_id: delivery.app_id.clone(),
        endpoint_id: delivery.endpoint_id.clone(),
        event_type: delivery.event_type.to_string(),
        version: Some(delivery.version),
        failure: None,
        body: None,
        created_at: (delivery.version == 0).then_some(delivery.created_at),
        ordering_key: delivery.ordering_key.clone(),
        after: delivery.after.clone(),
        rechecks: 0,
    };
    Some((message, delay_seconds(not_before, now)))
}

/// Queues the next attempt of each pending delivery (SendMessageBatch by 10).
/// Each message carries its event's body when it is small enough
/// ([`INLINE_BODY_MAX`]): from `known` events (a stream image's), else one
/// batched, consistent read of the run's other events here, instead of one
/// read per attempt in deliver (a fan-out to N endpoints reads its event
/// once). If that read fails, the messages go without bodies and deliver
/// reads the events, as it always could: a throttled read never holds
/// delivery up. Returns the ids whose message was not accepted (to report as
/// failures).
pub async fn queue_pending<S: Store, Q: Queue>(
    store: &S,
    queue: &Q,
    deliveries: &[&Delivery],
    known: &[&Event],
    now: DateTime<Utc>,
) -> Result<Vec<DeliveryId>, PipelineError> {
    let mut messages: Vec<(DeliveryMessage, i32)> = Vec::new();
    let mut events: Vec<(AppId, EventId)> = Vec::new();
    for delivery in deliveries {
        if let Some(pair) = message_for(delivery, now) {
            messages.push(pair);
            events.push((delivery.app_id.clone(), delivery.event_id.clone()));
        }
    }
    if messages.is_empty() {
        return Ok(Vec::new());
    }
    let mut bodies: HashMap<EventId, &str> = known
        .iter()
        .map(|e| (e.id.clone(), e.body.as_str()))
        .collect();
    let mut wanted: Vec<(AppId, EventId)> = events
        .iter()
        .filter(|(_, id)| !bodies.contains_key(id))
        .cloned()
        .collect();
    wanted.sort();
    wanted.dedup();
    let found = if wanted.is_empty() {
        Vec::new()
    } else {
        match store.get_events(&wanted).await {
            Ok(found) => found,
            Err(err) => {
                tracing::warn!(error = %hookline_core::error::Chain(&err), events = wanted.len(), "reading event bodies failed; messages sent without them");
                Vec::new()
            }
        }
    };
    for stored in &found {
        bodies.insert(stored.event.id.clone(), stored.event.body.as_str());
    }
    for ((message, _), (_, event)) in messages.iter_mut().zip(&events) {
        message.body = bodies
            .get(event)
            .filter(|b| b.len() <= INLINE_BODY_MAX)
            .map(|b| (*b).to_owned());
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
    app: &AppId,
    event_id: &EventId,
    now: DateTime<Utc>,
) -> Result<usize, PipelineError> {
    let mut written = 0;
    loop {
        let Some(stored) = store.get_event(app, event_id).await? else {
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
            .materialise_fanout(app, event_id, stored.fanout_version, &deliveries, rest)
            .await?
        {
            tracing::info!(event_id = %event_id, "fan-out chunk already materialised elsewhere");
            return Ok(written);
        }
        written += deliveries.len();
        tracing::info!(event_id = %event_id, chunk = deliveries.len(), remaining = rest.len(), "fan-out chunk materialised");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::{MemoryQueue, MemoryStore};
    use crate::ports::StoredEvent;
    use hookline_core::ids::{AppId, EndpointId};
    use hookline_core::model::{Event, EventType};
    use serde_json::value::RawValue;

    fn event_with(payload: &str, now: DateTime<Utc>) -> Event {
        Event::new(
            EventId::generate(),
            AppId::parse("shop").unwrap(),
            EventType::parse("order.paid").unwrap(),
            &RawValue::from_string(payload.to_owned()).unwrap(),
            now,
        )
    }

    /// Messages carry their event's body (read once for the whole run),
    /// except a body over the inline limit or an event that is gone.
    #[tokio::test]
    async fn messages_carry_small_bodies_read_once_per_event() {
        let now = Utc::now();
        let store = MemoryStore::default();
        let small = event_with(r#"{"amount": 10.50, "id": 12345678901234567890123}"#, now);
        let big = event_with(&format!(r#""{}""#, "x".repeat(INLINE_BODY_MAX)), now);
        let gone = event_with("{}", now);
        for event in [&small, &big] {
            store.insert_event(StoredEvent {
                event: event.clone(),
                targets: vec![],
                fanout_remaining: vec![],
                fanout_version: 0,
            });
        }
        let deliveries: Vec<Delivery> = [&small, &small, &big, &gone]
            .iter()
            .map(|event| {
                let endpoint = EndpointId::generate();
                Delivery::new(
                    DeliveryId::for_event_endpoint(&event.id, &endpoint),
                    event,
                    endpoint,
                    now,
                )
            })
            .collect();
        let queue = MemoryQueue::default();
        let refs: Vec<&Delivery> = deliveries.iter().collect();
        assert!(queue_pending(&store, &queue, &refs, &[], now)
            .await
            .unwrap()
            .is_empty());
        let bodies: Vec<Option<String>> = queue.sent().into_iter().map(|(m, _)| m.body).collect();
        assert_eq!(
            bodies,
            [
                Some(small.body.clone()),
                Some(small.body.clone()),
                None,
                None
            ]
        );
    }
}
