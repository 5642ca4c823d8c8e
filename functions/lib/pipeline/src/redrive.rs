//! Manual redrive: drain the DLQ on demand (the retry function, and later
//! `POST /v1/dlq/redrive`). Native SQS move tasks are not used: each message's
//! delivery is restarted in the table, and the stream dispatches it again.
//!
//! Per DLQ message: a `failed` delivery goes back to `pending` with a fresh
//! attempt budget (its manual retry count and attempt log kept); a `pending`
//! one whose queue message exhausted SQS's receive count is queued again (a
//! pending one whose message is a failure copy stays: its deliver is about
//! to record `failed`); a `delivered` or unknown one is just deleted. Messages not matching the
//! filters, unreadable ones, and everything in a dry run go back to the DLQ.

use std::time::Duration;

use chrono::{DateTime, Utc};
use hookline_core::model::DeliveryStatus;
use serde::{Deserialize, Serialize};

use crate::dispatch::message_for;
use crate::messages::DeliveryMessage;
use crate::ports::{Queue, Store};
use crate::recover::{retry_failed, RetryOutcome};
use crate::PipelineError;

fn default_max() -> u32 {
    100
}

/// The retry function's input (and the redrive route's body).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RedriveRequest {
    #[serde(default = "default_max")]
    pub max_messages: u32,
    #[serde(default)]
    pub endpoint_id: Option<String>,
    #[serde(default)]
    pub event_type: Option<String>,
    #[serde(default)]
    pub dry_run: bool,
}

impl Default for RedriveRequest {
    fn default() -> Self {
        Self {
            max_messages: default_max(),
            endpoint_id: None,
            event_type: None,
            dry_run: false,
        }
    }
}

/// Largest `max_messages` one call accepts.
pub const MAX_REDRIVE_MESSAGES: u32 = 10_000;

/// Compact JSON (a log field).
impl std::fmt::Display for RedriveReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&serde_json::to_string(self).map_err(|_| std::fmt::Error)?)
    }
}

/// What a redrive did (or, in a dry run, would do).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedriveReport {
    pub dry_run: bool,
    /// DLQ messages looked at.
    pub received: u32,
    /// Failed deliveries restarted with a fresh budget.
    pub redriven: u32,
    /// Pending deliveries queued again.
    pub requeued: u32,
    /// Deleted: the delivery was already delivered.
    pub already_delivered: u32,
    /// Deleted: the delivery no longer exists.
    pub missing: u32,
    /// Left in the DLQ: filters did not match.
    pub skipped: u32,
    /// Left in the DLQ: unreadable message.
    pub invalid: u32,
    /// Left in the DLQ: the delivery changed while we worked on it.
    pub conflicts: u32,
    /// Left in the DLQ: a failure copy whose delivery is not marked failed
    /// yet (deliver wrote the copy and is about to record `failed`). Deleting
    /// it now could leave a failed delivery without its DLQ copy.
    #[serde(default)]
    pub in_flight: u32,
    /// True when a long poll found no more messages to look at; false when
    /// `max_messages` or the time budget stopped the call first (call again).
    #[serde(default)]
    pub complete: bool,
}

enum Action {
    Delete,
    Keep,
}

/// How long one empty long poll waits before the DLQ counts as drained.
pub const DRAIN_WAIT: Duration = Duration::from_secs(2);

/// Drains up to `request.max_messages` DLQ messages, stopping in time to
/// answer within `budget` (the caller's own time limit, less a margin).
#[tracing::instrument(name = "redrive", skip_all, fields(dry_run = request.dry_run))]
pub async fn redrive<S: Store, Q: Queue>(
    store: &S,
    queue: &Q,
    request: &RedriveRequest,
    now: DateTime<Utc>,
    budget: Duration,
) -> Result<RedriveReport, PipelineError> {
    if request.max_messages == 0 || request.max_messages > MAX_REDRIVE_MESSAGES {
        return Err(PipelineError::invalid(
            "invalid_max_messages",
            format!("max_messages must be 1..={MAX_REDRIVE_MESSAGES}"),
        ));
    }
    let started = std::time::Instant::now();
    let mut report = RedriveReport {
        dry_run: request.dry_run,
        ..RedriveReport::default()
    };
    // Messages kept are released only at the end, so this loop never sees
    // them twice; they stay hidden a little longer than the budget.
    let visibility = budget + Duration::from_secs(60);
    let mut keep: Vec<String> = Vec::new();
    while report.received < request.max_messages {
        // A receive waits up to DRAIN_WAIT: leave room for it and the work.
        if started.elapsed() + DRAIN_WAIT * 2 > budget {
            break;
        }
        let want = (request.max_messages - report.received).min(10) as i32;
        // Long polling: a short poll samples a subset of SQS servers and can
        // answer empty while messages remain.
        let batch = queue.receive_dlq(want, visibility, DRAIN_WAIT).await?;
        if batch.is_empty() {
            report.complete = true;
            break;
        }
        let mut delete = Vec::new();
        for entry in batch {
            report.received += 1;
            let action =
                match handle_entry(store, queue, request, &entry.body, now, &mut report).await {
                    Ok(action) => action,
                    Err(err) => {
                        keep.extend(std::mem::take(&mut delete));
                        keep.push(entry.receipt_handle);
                        let _ = queue.release_dlq(&keep).await;
                        return Err(err);
                    }
                };
            match action {
                Action::Delete => delete.push(entry.receipt_handle),
                Action::Keep => keep.push(entry.receipt_handle),
            }
        }
        if !delete.is_empty() {
            queue.delete_dlq(&delete).await?;
        }
    }
    if !keep.is_empty() {
        queue.release_dlq(&keep).await?;
    }
    tracing::info!(report = %report, "redrive finished");
    Ok(report)
}

#[tracing::instrument(name = "dlq_entry", skip_all)]
async fn handle_entry<S: Store, Q: Queue>(
    store: &S,
    queue: &Q,
    request: &RedriveRequest,
    body: &str,
    now: DateTime<Utc>,
    report: &mut RedriveReport,
) -> Result<Action, PipelineError> {
    let Ok(message) = serde_json::from_str::<DeliveryMessage>(body) else {
        report.invalid += 1;
        return Ok(Action::Keep);
    };
    let endpoint_matches = request
        .endpoint_id
        .as_deref()
        .is_none_or(|e| e == message.endpoint_id.as_str());
    let type_matches = request
        .event_type
        .as_deref()
        .is_none_or(|t| t == message.event_type);
    if !endpoint_matches || !type_matches {
        report.skipped += 1;
        return Ok(Action::Keep);
    }
    let Some(delivery) = store
        .get_delivery(&message.app_id, &message.delivery_id)
        .await?
    else {
        report.missing += 1;
        return Ok(if request.dry_run {
            Action::Keep
        } else {
            Action::Delete
        });
    };
    match delivery.status {
        DeliveryStatus::Delivered => {
            report.already_delivered += 1;
            Ok(if request.dry_run {
                Action::Keep
            } else {
                Action::Delete
            })
        }
        DeliveryStatus::Failed => {
            if request.dry_run {
                report.redriven += 1;
                return Ok(Action::Keep);
            }
            match retry_failed(store, delivery, now).await? {
                RetryOutcome::Retried(d) => {
                    tracing::info!(delivery_id = %d.id, manual_retries = d.manual_retries, "delivery redriven");
                    report.redriven += 1;
                    Ok(Action::Delete)
                }
                RetryOutcome::NotFailed(_) | RetryOutcome::Changed => {
                    report.conflicts += 1;
                    Ok(Action::Keep)
                }
            }
        }
        DeliveryStatus::Pending if message.failure.is_some() => {
            // A failure copy of a delivery still pending: the deliver that
            // sent it has not recorded `failed` yet (or crashed first, and
            // its queue message will be tried again). Re-queueing and
            // deleting now would leave a failed delivery with no copy.
            report.in_flight += 1;
            Ok(Action::Keep)
        }
        DeliveryStatus::Pending => {
            // SQS moved the queue message here after maxReceiveCount
            // receives: the delivery lost its message; queue it again.
            if request.dry_run {
                report.requeued += 1;
                return Ok(Action::Keep);
            }
            if let Some(pair) = message_for(&delivery, now) {
                let failed = queue.send_deliveries(&[pair]).await?;
                if !failed.is_empty() {
                    return Err(PipelineError::queue("re-queue refused", true));
                }
            }
            report.requeued += 1;
            Ok(Action::Delete)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::{MemoryQueue, MemoryStore};
    use hookline_core::ids::{AppId, DeliveryId, EndpointId, EventId};
    use hookline_core::model::{Attempt, Delivery, Event, EventType};
    use serde_json::value::RawValue;

    fn pending(now: DateTime<Utc>) -> Delivery {
        let event = Event::new(
            EventId::new(now, &mut rand::thread_rng()),
            AppId::parse("acme").unwrap(),
            EventType::parse("order.paid").unwrap(),
            &RawValue::from_string("{}".into()).unwrap(),
            now,
        );
        Delivery::new(DeliveryId::generate(), &event, EndpointId::generate(), now)
    }

    fn failure_copy(d: &Delivery, now: DateTime<Utc>) -> String {
        let (mut m, _) = message_for(d, now).unwrap();
        m.failure = Some("HTTP 500".into());
        m.to_json()
    }

    const BUDGET: Duration = Duration::from_secs(60);

    /// Deliver sent the DLQ copy and has not recorded `failed` yet when the
    /// redrive reads the copy. Before the fix the redrive re-queued the
    /// pending delivery and deleted the copy; deliver then wrote `failed`:
    /// a failed delivery with no DLQ copy, the re-queued message stale.
    #[tokio::test]
    async fn a_failure_copy_of_a_delivery_not_yet_failed_stays_in_the_dlq() {
        let now = Utc::now();
        let (store, queue) = (MemoryStore::default(), MemoryQueue::default());
        let mut d = pending(now);
        store.insert_delivery(d.clone());
        queue.push_dlq(failure_copy(&d, now));
        let report = redrive(&store, &queue, &RedriveRequest::default(), now, BUDGET)
            .await
            .unwrap();
        assert_eq!((report.in_flight, report.requeued), (1, 0), "{report:?}");
        assert_eq!(queue.dlq_bodies().len(), 1, "the copy is kept");
        assert!(queue.sent().is_empty());
        // Deliver now records `failed`; the next redrive restarts it.
        let expected = d.version;
        d.fail_now(Attempt::new(1, now, Some(500), Duration::ZERO, None, None))
            .unwrap();
        assert!(store.update_delivery(&d, expected).await.unwrap());
        let report = redrive(&store, &queue, &RedriveRequest::default(), now, BUDGET)
            .await
            .unwrap();
        assert_eq!(report.redriven, 1, "{report:?}");
        assert!(queue.dlq_bodies().is_empty());
        assert_eq!(store.deliveries()[0].status, DeliveryStatus::Pending);
        assert_eq!(store.retained_from(&d.event_id), Some(now), "event kept");
        crate::fakes::record_figure(
            "races",
            "redrive reads a failure copy before deliver records `failed` (fakes): copy kept (in_flight 1), then redriven once failed: 0 failed deliveries without a DLQ copy",
        );
    }

    /// A message SQS moved to the DLQ after maxReceiveCount (no failure
    /// note) means the delivery lost its queue message: queue it again.
    #[tokio::test]
    async fn a_pending_delivery_whose_message_sqs_moved_is_requeued() {
        let now = Utc::now();
        let (store, queue) = (MemoryStore::default(), MemoryQueue::default());
        let d = pending(now);
        store.insert_delivery(d.clone());
        queue.push_dlq(message_for(&d, now).unwrap().0.to_json());
        let report = redrive(&store, &queue, &RedriveRequest::default(), now, BUDGET)
            .await
            .unwrap();
        assert_eq!((report.requeued, report.complete), (1, true));
        assert!(queue.dlq_bodies().is_empty());
        assert_eq!(queue.sent()[0].0.version, Some(d.version));
    }

    /// A short poll can answer empty while messages wait (SQS samples some
    /// servers). Before the fix the redrive stopped there, reporting 0.
    #[tokio::test]
    async fn long_polls_so_an_empty_sample_does_not_end_the_redrive() {
        let now = Utc::now();
        let (store, queue) = (MemoryStore::default(), MemoryQueue::default());
        let mut d = pending(now);
        let copy = failure_copy(&d, now);
        d.fail_now(Attempt::new(1, now, Some(500), Duration::ZERO, None, None))
            .unwrap();
        store.insert_delivery(d.clone());
        queue.push_dlq(copy);
        queue.empty_short_polls(3);
        let report = redrive(&store, &queue, &RedriveRequest::default(), now, BUDGET)
            .await
            .unwrap();
        assert_eq!((report.received, report.redriven), (1, 1), "{report:?}");
        crate::fakes::record_figure(
            "races",
            "redrive after 3 empty short-poll samples (fakes): long polling received 1/1 and redrove it",
        );
    }

    /// No time left: nothing is received, and the report says so.
    #[tokio::test]
    async fn stops_within_its_time_budget_and_says_it_is_not_complete() {
        let now = Utc::now();
        let (store, queue) = (MemoryStore::default(), MemoryQueue::default());
        queue.push_dlq("garbage".into());
        let report = redrive(
            &store,
            &queue,
            &RedriveRequest::default(),
            now,
            Duration::from_secs(1),
        )
        .await
        .unwrap();
        assert_eq!((report.received, report.complete), (0, false));
        assert_eq!(queue.dlq_bodies().len(), 1);
    }
}
