//! The reconciler: whatever lost a pending delivery's queue message (a stream
//! record dropped after dispatch's retries, a purged queue, an expired
//! message, a poison record during a deploy), the delivery is queued again.
//!
//! It reads only the overdue index (pending deliveries by due time, events
//! with fan-out left by creation), entries due longer ago than
//! `WEBHOOKS_RECONCILE_AFTER`: a quiet or healthy system costs one empty
//! query page per index shard per run, never a scan.
//!
//! Per overdue delivery: read it (consistent), and if it is still pending and
//! overdue, [`Delivery::requeue`] it (due now, new version, `requeued` so the
//! stream does not queue it a second time) with one conditional write, then
//! send its queue message. The new version makes any older message that
//! still turns up stale (acked without a POST), so a slow message and the
//! reconciler's never both send. A crash between the write and the send
//! leaves the delivery overdue again one period later: it is picked up then.
//! Per overdue event: its fan-out is materialised (idempotent).
//!
//! Listed fan-outs (deliveries that exist only as a list on their event until
//! their first attempt writes them): the reconciler sweeps the event time
//! index from its mark to the cutoff, once per event. A listed delivery with
//! no item by then lost its first message: it is written pending at version
//! 1 (conditional on no item, so a racing first attempt wins) and queued; the
//! lost or late version-0 message is then stale. Once every swept event is
//! checked, the mark moves past them: each event is read once, nothing is
//! written for the ones that are fine.

use chrono::{DateTime, Utc};
use hookline_core::model::{Delivery, DeliveryStatus};
use serde::{Deserialize, Serialize};

use crate::dispatch::{materialise_fanout, message_for};
use crate::messages::INLINE_BODY_MAX;
use crate::ports::{Overdue, Queue, Store, StoredEvent};
use crate::replay::{continue_replay, Continued};
use crate::{PipelineError, Settings};

/// Overdue entries one run handles at most; the next run continues.
pub const MAX_PER_RUN: usize = 2_000;
/// Events of the time index one run checks at most; the next run continues.
pub const SWEEP_PER_RUN: usize = 20_000;

/// What one run did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconcileReport {
    /// Entries of the overdue index read.
    pub overdue: u32,
    /// Pending deliveries queued again.
    pub requeued: u32,
    /// Events whose remaining fan-out was materialised.
    pub fanouts: u32,
    /// Events with a listed fan-out checked by the sweep.
    #[serde(default)]
    pub swept: u32,
    /// Listed deliveries never attempted (first message lost): written and
    /// queued.
    #[serde(default)]
    pub listed_requeued: u32,
    /// Running replays that had stalled, advanced one step.
    #[serde(default)]
    pub replays: u32,
    /// Entries that were no longer overdue when read (picked up meanwhile).
    pub skipped: u32,
    /// Entries that failed (logged; the run fails after trying all others).
    pub errors: u32,
    /// False when [`MAX_PER_RUN`] stopped the run (the next one continues).
    pub complete: bool,
}

/// Compact JSON (a log field).
impl std::fmt::Display for ReconcileReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&serde_json::to_string(self).map_err(|_| std::fmt::Error)?)
    }
}

/// One reconciler run at `now`.
#[tracing::instrument(name = "reconcile", skip_all)]
pub async fn reconcile<S: Store, Q: Queue>(
    store: &S,
    queue: &Q,
    settings: &Settings,
    now: DateTime<Utc>,
) -> Result<ReconcileReport, PipelineError> {
    let after = chrono::Duration::from_std(settings.reconcile_after)
        .expect("WEBHOOKS_RECONCILE_AFTER is validated at init to a few minutes");
    let cutoff = now - after;
    // Both reads at once (a cold run waits for one round trip, not two).
    let (entries, sweep) = futures::join!(
        store.overdue(cutoff, MAX_PER_RUN),
        store.sweep_events(cutoff, SWEEP_PER_RUN)
    );
    let entries = entries?;
    let mut report = ReconcileReport {
        overdue: u32::try_from(entries.len()).unwrap_or(u32::MAX),
        complete: entries.len() < MAX_PER_RUN,
        ..ReconcileReport::default()
    };
    // One bad entry (a corrupt item, a throttled call) must not stop the
    // others: each is tried; the run fails at the end if any did (the
    // invocation error raises the alarm; the next run tries again).
    let mut first_error: Option<PipelineError> = None;
    for entry in entries {
        let outcome = match &entry {
            Overdue::Delivery(app, id) => match store.get_delivery(app, id).await {
                Ok(Some(delivery)) => requeue_if_overdue(store, queue, delivery, cutoff, now)
                    .await
                    .map(|requeued| {
                        if requeued {
                            report.requeued += 1;
                        } else {
                            report.skipped += 1;
                        }
                    }),
                Ok(None) => {
                    report.skipped += 1;
                    Ok(())
                }
                Err(err) => Err(err),
            },
            Overdue::Event(id) => materialise_fanout(store, id, now).await.map(|written| {
                tracing::warn!(event_id = %id, deliveries = written, "overdue fan-out materialised by the reconciler");
                report.fanouts += 1;
            }),
            Overdue::Replay(id) => continue_replay(store, id, now).await.map(|step| {
                if step == Continued::Advanced {
                    tracing::warn!(replay_id = %id, "stalled replay continued by the reconciler");
                    report.replays += 1;
                } else {
                    report.skipped += 1;
                }
            }),
        };
        if let Err(err) = outcome {
            tracing::error!(entry = %entry, error = %hookline_core::error::Chain(&err), "reconciling an overdue entry failed");
            report.errors += 1;
            first_error.get_or_insert(err);
        }
    }
    let swept = match sweep {
        Ok(sweep) => sweep_listed(store, queue, sweep, now, &mut report).await,
        Err(err) => Err(err),
    };
    match swept {
        Ok(()) => {}
        Err(err) => {
            tracing::error!(error = %hookline_core::error::Chain(&err), "sweeping listed fan-outs failed");
            report.errors += 1;
            first_error.get_or_insert(err);
        }
    }
    if report.requeued > 0 || report.fanouts > 0 || report.listed_requeued > 0 || report.replays > 0
    {
        tracing::warn!(report = %report, "reconciler found lost work");
    } else {
        tracing::info!(report = %report, "reconciler run");
    }
    match first_error {
        Some(err) => Err(err),
        None => Ok(report),
    }
}

/// Checks the listed fan-outs of a sweep (events created before the cutoff
/// since the last mark); moves the mark only if every one was checked.
async fn sweep_listed<S: Store, Q: Queue>(
    store: &S,
    queue: &Q,
    sweep: crate::ports::Sweep,
    now: DateTime<Utc>,
    report: &mut ReconcileReport,
) -> Result<(), PipelineError> {
    report.swept = u32::try_from(sweep.events.len()).unwrap_or(u32::MAX);
    report.complete &= sweep.complete;
    let listed: Vec<(&StoredEvent, Delivery)> = sweep
        .events
        .iter()
        .flat_map(|e| e.listed_deliveries().into_iter().map(move |d| (e, d)))
        .collect();
    let deliveries: Vec<_> = listed.iter().map(|(_, d)| d.clone()).collect();
    let written: std::collections::HashSet<_> = store
        .delivery_items_among(&deliveries)
        .await?
        .into_iter()
        .collect();
    for (stored, mut delivery) in listed {
        if written.contains(&delivery.id) {
            continue;
        }
        let expected = delivery.version;
        delivery.requeue(now)?;
        debug_assert_eq!(expected, 0, "a listed delivery starts at version 0");
        store
            .extend_event_retention(&delivery.event_id, now)
            .await?;
        if !store.create_delivery(&delivery).await? {
            // Its first attempt wrote it meanwhile.
            continue;
        }
        let Some((mut message, delay)) = message_for(&delivery, now) else {
            continue;
        };
        if stored.event.body.len() <= INLINE_BODY_MAX {
            message.body = Some(stored.event.body.clone());
        }
        if !queue.send_deliveries(&[(message, delay)]).await?.is_empty() {
            // Written pending: the overdue index has it from now on.
            return Err(PipelineError::queue(
                format!("re-queue of {} refused", delivery.id),
                true,
            ));
        }
        report.listed_requeued += 1;
        tracing::warn!(
            delivery_id = %delivery.id,
            event_id = %delivery.event_id,
            endpoint_id = %delivery.endpoint_id,
            "lost first message: listed delivery written and re-queued"
        );
    }
    if sweep.moved {
        store.commit_sweep(&sweep.mark).await?;
    }
    Ok(())
}

#[tracing::instrument(skip_all, fields(delivery_id = %delivery.id))]
async fn requeue_if_overdue<S: Store, Q: Queue>(
    store: &S,
    queue: &Q,
    mut delivery: Delivery,
    cutoff: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<bool, PipelineError> {
    let due = delivery.next_attempt_at.unwrap_or(delivery.updated_at);
    if delivery.status != DeliveryStatus::Pending || due >= cutoff {
        return Ok(false);
    }
    let expected = delivery.version;
    delivery.requeue(now)?;
    // Rare path: make sure the event outlives this late attempt too.
    store
        .extend_event_retention(&delivery.event_id, now)
        .await?;
    if !store.update_delivery(&delivery, expected).await? {
        return Ok(false);
    }
    let Some(pair) = message_for(&delivery, now) else {
        return Ok(false);
    };
    let refused = queue.send_deliveries(&[pair]).await?;
    if !refused.is_empty() {
        // Overdue again one period from now: the next run tries again.
        return Err(PipelineError::queue(
            format!("re-queue of {} refused", delivery.id),
            true,
        ));
    }
    tracing::warn!(
        delivery_id = %delivery.id,
        endpoint_id = %delivery.endpoint_id,
        overdue_since = %due,
        version = delivery.version,
        "lost queue message: delivery re-queued"
    );
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::{MemoryQueue, MemoryStore};
    use crate::ports::{CommitOutcome, StoredEvent};
    use hookline_core::ids::{AppId, DeliveryId, EndpointId, EventId};
    use hookline_core::model::EndpointRoute;
    use hookline_core::model::{Event, EventType};
    use serde_json::value::RawValue;

    fn settings() -> Settings {
        Settings::for_tests(&[("WEBHOOKS_RECONCILE_AFTER", "15m")]).unwrap()
    }

    async fn run_at(
        store: &MemoryStore,
        queue: &MemoryQueue,
        at: DateTime<Utc>,
    ) -> ReconcileReport {
        reconcile(store, queue, &settings(), at)
            .await
            .expect("a reconciler run")
    }

    fn event(at: DateTime<Utc>) -> Event {
        Event::new(
            EventId::new(at, &mut rand::thread_rng()),
            AppId::parse("acme").unwrap(),
            EventType::parse("order.paid").unwrap(),
            &RawValue::from_string("{}".into()).unwrap(),
            at,
        )
    }

    #[tokio::test]
    async fn requeues_only_overdue_pending_deliveries_once_and_outdates_old_messages() {
        let now = Utc::now();
        let (store, queue) = (MemoryStore::default(), MemoryQueue::default());
        let old = event(now - chrono::Duration::hours(1));
        let lost = Delivery::new(
            DeliveryId::generate(),
            &old,
            EndpointId::generate(),
            old.created_at,
        );
        let mut fresh = Delivery::new(
            DeliveryId::generate(),
            &old,
            EndpointId::generate(),
            old.created_at,
        );
        fresh.next_attempt_at = Some(now - chrono::Duration::minutes(5)); // not overdue yet
        let mut later = Delivery::new(
            DeliveryId::generate(),
            &old,
            EndpointId::generate(),
            old.created_at,
        );
        later.next_attempt_at = Some(now + chrono::Duration::hours(2)); // a long backoff
        for d in [&lost, &fresh, &later] {
            store.insert_delivery(d.clone());
        }
        let (old_message, _) = message_for(&lost, now).unwrap();

        let report = run_at(&store, &queue, now).await;
        assert_eq!(
            (report.overdue, report.requeued, report.complete),
            (1, 1, true)
        );
        let sent = queue.sent();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].0.delivery_id, lost.id);
        assert_eq!(sent[0].1, 0, "due now");
        let stored = store
            .deliveries()
            .into_iter()
            .find(|d| d.id == lost.id)
            .unwrap();
        assert!(stored.requeued && stored.version == lost.version + 1);
        assert_eq!(sent[0].0.version, Some(stored.version));
        assert_ne!(
            old_message.version, sent[0].0.version,
            "an old message turning up is stale"
        );
        assert_eq!(store.retained_from(&lost.event_id), Some(now));

        // Idempotent: the next run (the message not handled yet, but due
        // only now) queues nothing more.
        let again = run_at(&store, &queue, now + chrono::Duration::minutes(5)).await;
        assert_eq!((again.overdue, again.requeued), (0, 0));
        // Lost again: one period later it is queued again (and `fresh`,
        // overdue by then, with it; `later` is not due).
        let third = run_at(&store, &queue, now + chrono::Duration::minutes(16)).await;
        assert_eq!(third.requeued, 2);
        crate::fakes::record_figure(
            "races",
            "reconciler vs a late original message (fakes): re-queue bumps the version, the original is stale; overdue only after WEBHOOKS_RECONCILE_AFTER; long backoffs untouched",
        );
    }

    /// An overdue event whose item is gone (a bad entry) fails the run, but
    /// only after every other entry was handled.
    #[tokio::test]
    async fn one_bad_entry_does_not_block_the_others() {
        let now = Utc::now();
        let (store, queue) = (MemoryStore::default(), MemoryQueue::default());
        let old = event(now - chrono::Duration::hours(1));
        store.insert_delivery(Delivery::new(
            DeliveryId::generate(),
            &old,
            EndpointId::generate(),
            old.created_at,
        ));
        store.fail_next_delivery_reads(1);
        let second = Delivery::new(
            DeliveryId::generate(),
            &old,
            EndpointId::generate(),
            old.created_at,
        );
        store.insert_delivery(second);
        let err = reconcile(&store, &queue, &settings(), now)
            .await
            .unwrap_err();
        assert!(err.is_retryable(), "{err}");
        assert_eq!(queue.sent().len(), 1, "the good entry was still re-queued");
    }

    /// A listed fan-out of three: one delivery attempted (it has an item),
    /// two whose first messages were lost. Once older than the cutoff, the
    /// sweep writes and queues exactly those two (version 1, so the lost
    /// version-0 messages are stale), and moves its mark: the next run reads
    /// nothing again. An event newer than the cutoff waits for a later run.
    #[tokio::test]
    async fn sweeps_listed_fanouts_once_and_requeues_only_never_attempted_deliveries() {
        let now = Utc::now();
        let (store, queue) = (MemoryStore::default(), MemoryQueue::default());
        let routes: Vec<EndpointRoute> = (0..3)
            .map(|_| EndpointRoute {
                id: EndpointId::generate(),
                event_types: vec![],
                disabled: false,
            })
            .collect();
        let payload = RawValue::from_string(r#"{"n":1}"#.into()).unwrap();
        let plan = |at| {
            crate::ingest::plan_event(
                AppId::parse("acme").unwrap(),
                EventType::parse("order.paid").unwrap(),
                &payload,
                &routes,
                at,
                &mut <rand::rngs::StdRng as rand::SeedableRng>::from_entropy(),
            )
        };
        let (old, accepted) = plan(now - chrono::Duration::hours(1));
        let (recent, _) = plan(now - chrono::Duration::minutes(5));
        for new in [&old, &recent] {
            assert_eq!(
                store.commit_event(new).await.unwrap(),
                CommitOutcome::Committed
            );
        }
        assert!(
            store.delivery_items().is_empty(),
            "a listed fan-out writes no delivery"
        );
        // The first delivery was attempted and delivered.
        let mut done = store
            .get_delivery(&old.event.app_id, &accepted.delivery_ids[0])
            .await
            .unwrap()
            .expect("a listed delivery is found by id");
        assert_eq!((done.status, done.version), (DeliveryStatus::Pending, 0));
        done.status = DeliveryStatus::Delivered;
        done.version = 1;
        assert!(store.update_delivery(&done, 0).await.unwrap());

        let report = run_at(&store, &queue, now).await;
        assert_eq!((report.swept, report.listed_requeued), (1, 2));
        let sent = queue.sent();
        let ids: Vec<_> = sent.iter().map(|(m, _)| m.delivery_id.clone()).collect();
        assert_eq!(ids, accepted.delivery_ids[1..]);
        for (message, delay) in &sent {
            assert_eq!((message.version, *delay), (Some(1), 0));
            assert_eq!(message.body.as_deref(), Some(old.event.body.as_str()));
            let stored = store
                .get_delivery(&message.app_id, &message.delivery_id)
                .await
                .unwrap()
                .unwrap();
            assert!(stored.requeued && stored.version == 1);
        }
        assert_eq!(store.delivery_items().len(), 3);

        // The mark moved: the same events are not read again; the recent
        // one is swept once it is old enough (its deliveries lost too).
        let again = run_at(&store, &queue, now + chrono::Duration::minutes(1)).await;
        assert_eq!((again.swept, again.listed_requeued), (0, 0));
        let later = run_at(&store, &queue, now + chrono::Duration::minutes(11)).await;
        assert_eq!((later.swept, later.listed_requeued), (1, 3));
        crate::fakes::record_figure(
            "races",
            "listed fan-out swept by the reconciler (fakes): of 3 deliveries 1 attempted, 2 first messages lost -> 2 written at version 1 and queued, the lost version-0 messages stale; each event read by one sweep only",
        );
    }

    #[tokio::test]
    async fn materialises_an_overdue_fanout() {
        let now = Utc::now();
        let (store, queue) = (MemoryStore::default(), MemoryQueue::default());
        let e = event(now - chrono::Duration::hours(1));
        let targets = vec![EndpointId::generate(), EndpointId::generate()];
        store.insert_event(StoredEvent {
            targets: vec![],
            event: e.clone(),
            fanout_remaining: targets,
            fanout_version: 0,
        });
        let report = run_at(&store, &queue, now).await;
        assert_eq!(report.fanouts, 1);
        assert_eq!(store.deliveries().len(), 2);
        // The new deliveries are due at once (dispatch queues them from the
        // stream; if that is lost too, the next run finds them overdue).
        let later = run_at(&store, &queue, now + chrono::Duration::minutes(16)).await;
        assert_eq!((later.fanouts, later.requeued), (0, 2));
    }
}
