//! The reconciler: whatever lost a pending delivery's queue message (a stream
//! record dropped after dispatch's retries, a purged queue, an expired
//! message, a poison record during a deploy), the delivery is queued again.
//!
//! Two independent parts, each paging through its sources in parallel
//! until it has read everything before the cutoff (`now -
//! WEBHOOKS_RECONCILE_AFTER`) or the run's time budget ends; the next run
//! goes on. Nothing caps a run below what DynamoDB serves, and no page is
//! held longer than it takes to check it (heads and keys only, never a
//! body of the window), so memory stays bounded whatever the payloads.
//!
//! - **Overdue index** ([`Store::overdue_page`]): pending deliveries due
//!   longer ago than the cutoff, events with fan-out left, stalled
//!   replays. Per overdue delivery: read it (consistent), and if it is
//!   still pending and overdue, [`Delivery::requeue`] it (due now, new
//!   version, `requeued` so the stream does not queue it a second time)
//!   with one conditional write, then send its queue message. The new
//!   version makes any older message that still turns up stale (acked
//!   without a POST), so a slow message and the reconciler's never both
//!   send. A crash between the write and the send leaves the delivery
//!   overdue again one period later: it is picked up then. Handled entries
//!   leave the range (due now), so the index needs no mark.
//! - **Sweep of listed fan-outs** ([`Store::sweep_page`]): deliveries that
//!   exist only as a list on their event until their first attempt writes
//!   them. Each source is read from its mark to the cutoff, once per
//!   event. A listed delivery with no item by then lost its first message:
//!   it is written pending at version 1 (conditional on no item, so a
//!   racing first attempt wins) and queued; the lost or late version-0
//!   message is then stale. A source's mark moves past a page once every
//!   event of it is checked; marks are saved during the run (a run cut
//!   short keeps its progress) and at its end.
//!
//! One bad item never stops the rest: an unreadable item (poison) is
//! logged, counted and stepped over; a failure that retrying may fix stops
//! only its own source (or entry) until the next run, and fails the run at
//! its end (the invocation error raises the alarm). The run's figures are
//! metrics (EMF, [`crate::metrics::emit_reconcile`]): the sweep's lag and
//! the overdue backlog, with alarms in the template.
//!
//! Retention: the sweep never re-sends a delivery of an event within
//! [`RETENTION_MARGIN`] of the retention (a delivered delivery's item may
//! have been removed by its TTL, and receivers no longer remember its id):
//! such deliveries are counted as `expired` and logged at ERROR.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use hookline_core::ids::{AppId, DeliveryId};
use hookline_core::model::{Delivery, DeliveryStatus};
use hookline_core::sync::lock;
use serde::{Deserialize, Serialize};

use crate::dispatch::{materialise_fanout, message_for};
use crate::messages::INLINE_BODY_MAX;
use crate::ports::{
    EventHead, Overdue, Queue, Store, SweepMark, SweepMarks, SweepSource, SweptApp,
};
use crate::replay::{continue_replay, Continued};
use crate::{PipelineError, Settings};

/// Late-write index shards read at once. Each request in flight holds its
/// own connection (on AWS a TLS handshake each, on a fraction of a vCPU),
/// so a few at a time; each reads about 1,000 events of 1 KB per page
/// (DynamoDB's 1 MB per query page), some 10,000 events a second per
/// source on AWS (SCALE.md).
pub const SWEEP_SOURCES_AT_ONCE: usize = 4;
/// Apps swept at once, each with all its event shards at once: 64 queries
/// in flight. A quiet app costs one empty page per shard (~10 ms), so
/// 10,000 apps are swept in some 15 s; a busy one reads its 8 shards at
/// some 80,000 events a second, above the 8,000 a second its partitions
/// take (SCALE.md).
pub const APPS_AT_ONCE: usize = 8;
/// Overdue-index shards read at once (same reason).
pub const OVERDUE_SHARDS_AT_ONCE: usize = 4;
/// Entries of one overdue page handled at once: each is 3-4 requests in a
/// row (read, retention, conditional write, send), ~20 ms on AWS, so 8 at
/// once per shard re-queue some 1,600 deliveries a second over 4 shards:
/// a queue purge of 100,000 waiting retries is recovered within one run.
pub const ENTRIES_AT_ONCE: usize = 8;
/// How often a long run saves its sweep marks (a run cut short by its
/// timeout keeps what it checked).
pub const MARKS_SAVED_EVERY: Duration = Duration::from_secs(20);
/// The sweep leaves alone the deliveries of events this close to the end
/// of their retention: a finished delivery's item may be gone with its
/// TTL (DynamoDB removes expired items within days, never before), and a
/// re-sent message would be a month-old duplicate receivers no longer
/// recognise.
pub const RETENTION_MARGIN: chrono::TimeDelta = chrono::TimeDelta::hours(1);
/// A recorded queue lag older than this is ignored: deliver records one
/// every 30 s while its backlog lasts, so an older one means the backlog
/// drained (or deliver stopped receiving, when a copy is what it needs).
pub const QUEUE_LAG_FRESH: chrono::TimeDelta = chrono::TimeDelta::minutes(5);

/// What one run did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReconcileReport {
    /// Entries of the overdue index read (due before the cutoff).
    pub overdue: u32,
    /// Pending deliveries queued again.
    pub requeued: u32,
    /// Events whose remaining fan-out was materialised.
    pub fanouts: u32,
    /// Events with a listed fan-out checked by the sweep.
    pub swept: u32,
    /// Listed deliveries never attempted (first message lost): written and
    /// queued.
    pub listed_requeued: u32,
    /// Running replays that had stalled, advanced one step.
    pub replays: u32,
    /// Entries that were no longer overdue when read (picked up meanwhile).
    pub skipped: u32,
    /// Unreadable items and entries stepped over (logged).
    pub poison: u32,
    /// Listed deliveries with no item whose event is within
    /// [`RETENTION_MARGIN`] of its retention: not re-sent (logged).
    pub expired: u32,
    /// Entries or sources that failed (logged; the run fails after trying
    /// all others, and the next run goes on from there).
    pub errors: u32,
    /// Everything before the cutoff was read within the time budget.
    pub complete: bool,
    /// Age of the oldest event not yet swept (the cutoff's age when the
    /// sweep caught up).
    pub sweep_lag_seconds: i64,
    /// How long ago the oldest overdue entry read was due (0: none).
    pub overdue_oldest_seconds: i64,
    /// How late deliver receives due messages (a fresh record; 0: none):
    /// the cutoff is this much further back.
    pub queue_lag_seconds: i64,
}

/// Compact JSON (a log field).
impl std::fmt::Display for ReconcileReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&serde_json::to_string(self).map_err(|_| std::fmt::Error)?)
    }
}

impl ReconcileReport {
    fn add(&mut self, other: &Self) {
        self.overdue += other.overdue;
        self.requeued += other.requeued;
        self.fanouts += other.fanouts;
        self.swept += other.swept;
        self.listed_requeued += other.listed_requeued;
        self.replays += other.replays;
        self.skipped += other.skipped;
        self.poison += other.poison;
        self.expired += other.expired;
        self.errors += other.errors;
        self.overdue_oldest_seconds = self
            .overdue_oldest_seconds
            .max(other.overdue_oldest_seconds);
    }
}

/// What one source (or shard) of a run came to.
#[derive(Default)]
struct Part {
    report: ReconcileReport,
    error: Option<PipelineError>,
    /// Read to the cutoff.
    done: bool,
    /// How far it was read (sweep sources).
    reached: Option<DateTime<Utc>>,
}

impl Part {
    fn failed(&mut self, err: PipelineError) {
        self.report.errors += 1;
        self.error.get_or_insert(err);
    }
}

/// One reconciler run at `now`, reading for at most `budget` (the
/// function's remaining time, less a margin to save and answer).
#[tracing::instrument(name = "reconcile", skip_all)]
pub async fn reconcile<S: Store, Q: Queue>(
    store: &S,
    queue: &Q,
    settings: &Settings,
    now: DateTime<Utc>,
    budget: Duration,
) -> Result<ReconcileReport, PipelineError> {
    let after = chrono::Duration::from_std(settings.reconcile_after)
        .expect("WEBHOOKS_RECONCILE_AFTER is validated at init to a few minutes");
    let retention = chrono::Duration::from_std(settings.retention)
        .expect("WEBHOOKS_RETENTION is validated at init to days");
    let floor = now - retention + RETENTION_MARGIN;
    let queue_lag = fresh_queue_lag(store, now).await.min(retention);
    // A message due before the cutoff and still waiting in a backlog is
    // not lost: with deliver receiving due messages `queue_lag` late, the
    // cutoff moves back as far (no copy of every waiting message).
    let cutoff = now - after - queue_lag;
    let deadline = tokio::time::Instant::now() + budget;
    // Independent: a failing or slow part never holds the other back.
    let (overdue, sweep) = futures::join!(
        reconcile_overdue(store, queue, cutoff, now, deadline),
        sweep_listed(
            store,
            queue,
            Window {
                floor,
                cutoff,
                now,
                deadline
            },
            after
        ),
    );
    let mut report = ReconcileReport {
        complete: true,
        ..ReconcileReport::default()
    };
    let mut first_error = None;
    let mut oldest_reached = cutoff;
    for part in overdue.into_iter().chain(sweep) {
        report.add(&part.report);
        report.complete &= part.done;
        if let Some(reached) = part.reached {
            oldest_reached = oldest_reached.min(reached);
        }
        if let Some(err) = part.error {
            first_error.get_or_insert(err);
        }
    }
    report.sweep_lag_seconds = (now - oldest_reached).num_seconds().max(0);
    report.queue_lag_seconds = queue_lag.num_seconds();
    crate::metrics::emit_reconcile(settings.emf_metrics, &report, after.num_seconds());
    if !report.complete {
        tracing::warn!(
            lag_seconds = report.sweep_lag_seconds,
            overdue_oldest_seconds = report.overdue_oldest_seconds,
            report = %report,
            "the reconciler could not catch up within its time budget: the next run goes on"
        );
    } else if report.requeued > 0
        || report.fanouts > 0
        || report.listed_requeued > 0
        || report.replays > 0
        || report.poison > 0
        || report.expired > 0
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

/// The queue lag deliver recorded, if fresh ([`QUEUE_LAG_FRESH`]); zero
/// otherwise, or when it cannot be read (it is advisory).
async fn fresh_queue_lag<S: Store>(store: &S, now: DateTime<Utc>) -> chrono::Duration {
    match store.queue_lag().await {
        Ok(Some(lag)) if now - lag.observed_at < QUEUE_LAG_FRESH => {
            chrono::Duration::from_std(lag.lag).unwrap_or(chrono::Duration::MAX)
        }
        Ok(_) => chrono::Duration::zero(),
        Err(err) => {
            tracing::warn!(error = %hookline_core::error::Chain(&err), "reading the queue lag failed; the cutoff ignores it");
            chrono::Duration::zero()
        }
    }
}

/// Every overdue-index shard, a few at a time, page after page.
async fn reconcile_overdue<S: Store, Q: Queue>(
    store: &S,
    queue: &Q,
    cutoff: DateTime<Utc>,
    now: DateTime<Utc>,
    deadline: tokio::time::Instant,
) -> Vec<Part> {
    futures::stream::iter(0..store.overdue_shards())
        .map(|shard| overdue_shard(store, queue, shard, cutoff, now, deadline))
        .buffer_unordered(OVERDUE_SHARDS_AT_ONCE)
        .collect()
        .await
}

#[tracing::instrument(skip_all, fields(shard))]
async fn overdue_shard<S: Store, Q: Queue>(
    store: &S,
    queue: &Q,
    shard: u32,
    cutoff: DateTime<Utc>,
    now: DateTime<Utc>,
    deadline: tokio::time::Instant,
) -> Part {
    let mut part = Part::default();
    let mut position = String::new();
    loop {
        if tokio::time::Instant::now() >= deadline {
            return part;
        }
        let page = match store.overdue_page(shard, cutoff, &position).await {
            Ok(page) => page,
            Err(err) => {
                tracing::error!(shard, error = %hookline_core::error::Chain(&err), "reading the overdue index failed");
                part.failed(err);
                return part;
            }
        };
        part.report.poison += page.unreadable;
        part.report.overdue += u32::try_from(page.entries.len()).unwrap_or(u32::MAX);
        if let Some((due, _)) = page.entries.first() {
            part.report.overdue_oldest_seconds = part
                .report
                .overdue_oldest_seconds
                .max((now - *due).num_seconds());
        }
        let outcomes: Vec<(Overdue, Result<Handled, PipelineError>)> =
            futures::stream::iter(page.entries)
                .map(|(_, entry)| async move {
                    let outcome = handle_overdue(store, queue, &entry, cutoff, now).await;
                    (entry, outcome)
                })
                .buffer_unordered(ENTRIES_AT_ONCE)
                .collect()
                .await;
        for (entry, outcome) in outcomes {
            match outcome {
                Ok(Handled::Requeued) => part.report.requeued += 1,
                Ok(Handled::Fanout) => part.report.fanouts += 1,
                Ok(Handled::Replay) => part.report.replays += 1,
                Ok(Handled::Skipped) => part.report.skipped += 1,
                Err(err) if err.is_retryable() => {
                    tracing::error!(entry = %entry, error = %hookline_core::error::Chain(&err), "reconciling an overdue entry failed");
                    part.failed(err);
                }
                // Retrying cannot fix it: stepped over (it stays in the
                // index and is counted again by every run).
                Err(err) => {
                    tracing::error!(entry = %entry, error = %hookline_core::error::Chain(&err), "an overdue entry that cannot be reconciled was stepped over");
                    part.report.poison += 1;
                }
            }
        }
        if page.done {
            part.done = true;
            return part;
        }
        position = page.position;
    }
}

/// What became of one overdue entry.
enum Handled {
    Requeued,
    Fanout,
    Replay,
    Skipped,
}

async fn handle_overdue<S: Store, Q: Queue>(
    store: &S,
    queue: &Q,
    entry: &Overdue,
    cutoff: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<Handled, PipelineError> {
    match entry {
        Overdue::Delivery(app, id) => match store.get_delivery(app, id).await? {
            Some(delivery) => Ok(
                if requeue_if_overdue(store, queue, delivery, cutoff, now).await? {
                    Handled::Requeued
                } else {
                    Handled::Skipped
                },
            ),
            None => Ok(Handled::Skipped),
        },
        Overdue::Event(app, id) => {
            let written = materialise_fanout(store, app, id, now).await?;
            tracing::warn!(event_id = %id, deliveries = written, "overdue fan-out materialised by the reconciler");
            Ok(Handled::Fanout)
        }
        Overdue::Replay(id) => Ok(match continue_replay(store, id, now).await? {
            Continued::Advanced => {
                tracing::warn!(replay_id = %id, "stalled replay continued by the reconciler");
                Handled::Replay
            }
            _ => Handled::Skipped,
        }),
    }
}

/// The bounds of one run's sweep.
#[derive(Clone, Copy)]
struct Window {
    /// Retention's end (plus [`RETENTION_MARGIN`]): nothing older is read
    /// or re-sent.
    floor: DateTime<Utc>,
    cutoff: DateTime<Utc>,
    now: DateTime<Utc>,
    deadline: tokio::time::Instant,
}

/// Where a set of sweep marks is kept.
#[derive(Clone, Copy)]
enum MarksHome<'a> {
    /// The late-write index's marks (one item).
    LateIndex,
    /// An app's partitions' marks (on its registration).
    App(&'a AppId),
}

impl MarksHome<'_> {
    async fn save<S: Store>(self, store: &S, marks: &SweepMarks) -> Result<(), PipelineError> {
        match self {
            Self::LateIndex => store.save_sweep_marks(marks).await,
            Self::App(app) => store.save_app_sweep_marks(app, marks).await,
        }
    }
}

/// The late-write index and every app's event partitions, independently.
async fn sweep_listed<S: Store, Q: Queue>(
    store: &S,
    queue: &Q,
    window: Window,
    after: chrono::Duration,
) -> Vec<Part> {
    let (late, apps) = futures::join!(
        sweep_late_index(store, queue, window),
        sweep_apps(store, queue, window, after),
    );
    late.into_iter().chain(apps).collect()
}

/// A part that could not start: it counts as read up to the floor (the
/// lag alarm fires) and fails the run.
fn failed_start(window: Window, what: &str, err: PipelineError) -> Vec<Part> {
    tracing::error!(error = %hookline_core::error::Chain(&err), "{what} failed");
    let mut part = Part {
        reached: Some(window.floor),
        ..Part::default()
    };
    part.failed(err);
    vec![part]
}

async fn sweep_late_index<S: Store, Q: Queue>(store: &S, queue: &Q, window: Window) -> Vec<Part> {
    let committed = match store.sweep_marks().await {
        Ok(marks) => marks,
        Err(err) => return failed_start(window, "reading the sweep marks", err),
    };
    let sources = (0..store.late_shards()).map(SweepSource::Late).collect();
    sweep_sources(
        store,
        queue,
        MarksHome::LateIndex,
        sources,
        committed,
        window.floor,
        window,
        SWEEP_SOURCES_AT_ONCE,
    )
    .await
}

/// Every registered app's partitions, the apps furthest behind first,
/// [`APPS_AT_ONCE`] at a time. The registry is read whole (one small item
/// per app that ever had an endpoint: a page holds some 5,000).
async fn sweep_apps<S: Store, Q: Queue>(
    store: &S,
    queue: &Q,
    window: Window,
    after: chrono::Duration,
) -> Vec<Part> {
    let mut apps = Vec::new();
    let mut position = String::new();
    loop {
        match store.swept_apps(&position).await {
            Ok(page) => {
                apps.extend(page.apps);
                if page.done {
                    break;
                }
                position = page.position;
            }
            Err(err) => return failed_start(window, "reading the swept apps", err),
        }
    }
    // No listed event of an app was written before its registration
    // (written long after its creation, it is in the late-write index).
    let start_of = |app: &SweptApp| (app.registered_at - after).max(window.floor);
    apps.sort_by_key(|app| {
        app.marks
            .values()
            .map(|m| m.reached)
            .min()
            .unwrap_or_else(|| start_of(app))
    });
    let shards = store.event_shards();
    futures::stream::iter(apps)
        .map(|app| async move {
            let start = start_of(&app);
            let sources = (0..shards)
                .map(|n| SweepSource::Days(app.app_id.clone(), n))
                .collect();
            sweep_sources(
                store,
                queue,
                MarksHome::App(&app.app_id),
                sources,
                app.marks.clone(),
                start,
                window,
                shards as usize,
            )
            .await
        })
        .buffer_unordered(APPS_AT_ONCE)
        .flat_map(futures::stream::iter)
        .collect()
        .await
}

/// `sources` sharing the marks kept at `home`, `at_once` at a time, each
/// from its committed mark (from `start` when it has none) to the cutoff;
/// the marks are saved during the run and at its end.
#[allow(clippy::too_many_arguments)]
async fn sweep_sources<S: Store, Q: Queue>(
    store: &S,
    queue: &Q,
    home: MarksHome<'_>,
    sources: Vec<SweepSource>,
    committed: SweepMarks,
    start: DateTime<Utc>,
    window: Window,
    at_once: usize,
) -> Vec<Part> {
    let marks = Mutex::new(committed.clone());
    let saved = Mutex::new(tokio::time::Instant::now());
    let mut parts: Vec<Part> = futures::stream::iter(sources)
        .map(|source| {
            let mark = committed.get(&source).cloned().unwrap_or(SweepMark {
                position: String::new(),
                reached: start,
            });
            sweep_source(
                store, queue, home, source, mark, start, window, &marks, &saved,
            )
        })
        .buffer_unordered(at_once)
        .collect()
        .await;
    let last = lock(&marks).clone();
    if last != committed {
        if let Err(err) = home.save(store, &last).await {
            tracing::error!(error = %hookline_core::error::Chain(&err), "saving the sweep marks failed");
            let mut part = Part {
                done: true,
                ..Part::default()
            };
            part.failed(err);
            parts.push(part);
        }
    }
    parts
}

#[allow(clippy::too_many_arguments)]
#[tracing::instrument(skip_all, fields(source = %source))]
async fn sweep_source<S: Store, Q: Queue>(
    store: &S,
    queue: &Q,
    home: MarksHome<'_>,
    source: SweepSource,
    mark: SweepMark,
    start: DateTime<Utc>,
    window: Window,
    marks: &Mutex<SweepMarks>,
    saved: &Mutex<tokio::time::Instant>,
) -> Part {
    // A mark older than the start: nothing before it is read.
    let read_from = start.max(window.floor);
    let mut part = Part {
        reached: Some(mark.reached.max(read_from)),
        ..Part::default()
    };
    let mut position = mark.position;
    loop {
        if tokio::time::Instant::now() >= window.deadline {
            return part;
        }
        let page = match store
            .sweep_page(&source, &position, read_from, window.cutoff)
            .await
        {
            Ok(page) => page,
            Err(err) => {
                tracing::error!(error = %hookline_core::error::Chain(&err), "reading a sweep page failed");
                part.failed(err);
                return part;
            }
        };
        for key in &page.unreadable {
            tracing::error!(key = %key, "an unreadable event item stepped over by the sweep");
        }
        part.report.poison += u32::try_from(page.unreadable.len()).unwrap_or(u32::MAX);
        if let Err(err) = check_listed(
            store,
            queue,
            &page.events,
            window.floor,
            window.now,
            &mut part.report,
        )
        .await
        {
            // The mark stays before this page: the next run checks it again.
            tracing::error!(error = %hookline_core::error::Chain(&err), "checking a sweep page failed");
            part.failed(err);
            return part;
        }
        position = page.position;
        part.reached = Some(page.reached);
        let snapshot = {
            let mut marks = lock(marks);
            marks.insert(
                source.clone(),
                SweepMark {
                    position: position.clone(),
                    reached: page.reached,
                },
            );
            let mut saved = lock(saved);
            (saved.elapsed() >= MARKS_SAVED_EVERY).then(|| {
                *saved = tokio::time::Instant::now();
                marks.clone()
            })
        };
        if let Some(snapshot) = snapshot {
            // Progress kept if the run is cut short; a failure here is
            // only progress lost (the run's last save tries again).
            if let Err(err) = home.save(store, &snapshot).await {
                tracing::warn!(error = %hookline_core::error::Chain(&err), "saving the sweep marks during the run failed");
            }
        }
        if page.done {
            part.done = true;
            return part;
        }
    }
}

/// Checks one page's listed fan-outs: each listed delivery with no item is
/// written and queued (see the module doc). A failure retrying may fix is
/// returned (the page is checked again next run); one it cannot is counted
/// as poison and stepped over.
async fn check_listed<S: Store, Q: Queue>(
    store: &S,
    queue: &Q,
    events: &[EventHead],
    floor: DateTime<Utc>,
    now: DateTime<Utc>,
    report: &mut ReconcileReport,
) -> Result<(), PipelineError> {
    let asked: Vec<(AppId, DeliveryId)> = events
        .iter()
        .flat_map(|e| {
            e.listed_ids()
                .into_iter()
                .map(|(_, id)| (e.app_id.clone(), id))
        })
        .collect();
    if asked.is_empty() {
        return Ok(());
    }
    let written: HashSet<DeliveryId> = store
        .delivery_items_among(&asked)
        .await?
        .into_iter()
        .collect();
    drop(asked);
    for head in events {
        report.swept += 1;
        let missing: Vec<usize> = head
            .listed_ids()
            .into_iter()
            .filter(|(_, id)| !written.contains(id))
            .map(|(position, _)| position)
            .collect();
        if missing.is_empty() {
            continue;
        }
        if head.created_at < floor {
            tracing::error!(
                event_id = %head.id,
                app_id = %head.app_id,
                deliveries = missing.len(),
                "listed deliveries with no item at the end of their event's retention: not re-sent (their items may have expired)"
            );
            report.expired += u32::try_from(missing.len()).unwrap_or(u32::MAX);
            continue;
        }
        match requeue_listed(store, queue, head, &missing, now).await {
            Ok(requeued) => report.listed_requeued += requeued,
            Err(err) if err.is_retryable() => return Err(err),
            Err(err) => {
                tracing::error!(event_id = %head.id, error = %hookline_core::error::Chain(&err), "a listed fan-out that cannot be recovered was stepped over");
                report.poison += 1;
            }
        }
    }
    Ok(())
}

/// Writes and queues the listed deliveries at `missing` positions of
/// `head`'s event (read whole, this once: its body for the messages).
async fn requeue_listed<S: Store, Q: Queue>(
    store: &S,
    queue: &Q,
    head: &EventHead,
    missing: &[usize],
    now: DateTime<Utc>,
) -> Result<u32, PipelineError> {
    let Some(stored) = store.get_event(&head.app_id, &head.id).await? else {
        return Err(PipelineError::Corrupt(format!(
            "event {} listed by the sweep is gone",
            head.id
        )));
    };
    let mut requeued = 0;
    for &position in missing {
        let Some(mut delivery) = stored.listed_delivery(position) else {
            continue;
        };
        let expected = delivery.version;
        delivery.requeue(now)?;
        debug_assert_eq!(expected, 0, "a listed delivery starts at version 0");
        store
            .extend_event_retention(&delivery.app_id, &delivery.event_id, now)
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
        requeued += 1;
        tracing::warn!(
            delivery_id = %delivery.id,
            event_id = %delivery.event_id,
            endpoint_id = %delivery.endpoint_id,
            "lost first message: listed delivery written and re-queued"
        );
    }
    Ok(requeued)
}

/// An overdue delivery blocked behind its ordering key's previous one
/// (its wake may have been lost): if that one is still pending, it waits
/// on, registered on it again and due when it is (no message, no
/// attempt); `false` when it no longer waits (its predecessor ended, is
/// gone, or has no record yet): re-queued, its deliver's gate decides.
async fn still_waits<S: Store>(
    store: &S,
    delivery: &mut Delivery,
    now: DateTime<Utc>,
) -> Result<bool, PipelineError> {
    let Some(predecessor) = delivery
        .blocked_by
        .clone()
        .filter(|_| delivery.waits_for().is_some())
    else {
        return Ok(false);
    };
    let app = delivery.app_id.clone();
    let Some(found) = store.get_delivery_item(&app, &predecessor).await? else {
        return Ok(false);
    };
    if found.released || found.status != DeliveryStatus::Pending || found.version == 0 {
        return Ok(false);
    }
    if !store
        .register_successor(&app, &predecessor, &delivery.id)
        .await?
    {
        return Ok(false);
    }
    // Still blocked by it meanwhile: an end of it from now on wakes this
    // one whatever this write does (a wake first makes it fail).
    let expected = delivery.version;
    delivery.block(&predecessor, found.next_attempt_at, now)?;
    if store.update_delivery(delivery, expected).await? {
        // Its event is kept as long as it waits.
        store
            .extend_event_retention(&app, &delivery.event_id, now)
            .await?;
        tracing::info!(delivery_id = %delivery.id, predecessor = %predecessor, "overdue, still waiting for its ordering key's previous delivery: registered again");
    }
    Ok(true)
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
    if still_waits(store, &mut delivery, now).await? {
        return Ok(false);
    }
    let expected = delivery.version;
    delivery.requeue(now)?;
    // Rare path: make sure the event outlives this late attempt too.
    store
        .extend_event_retention(&delivery.app_id, &delivery.event_id, now)
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
    use hookline_core::sync::lock;
    use serde_json::value::RawValue;

    const BUDGET: Duration = Duration::from_secs(60);

    fn settings() -> Settings {
        Settings::for_tests(&[("WEBHOOKS_RECONCILE_AFTER", "15m")]).unwrap()
    }

    async fn run_at(
        store: &MemoryStore,
        queue: &MemoryQueue,
        at: DateTime<Utc>,
    ) -> ReconcileReport {
        reconcile(store, queue, &settings(), at, BUDGET)
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

    /// An overdue delivery blocked behind its ordering key's previous one
    /// (its wake lost): while that one is pending it waits on, registered
    /// again and due when that one is (no message); once it has ended, it
    /// is re-queued like any lost delivery.
    #[tokio::test]
    async fn a_blocked_delivery_waits_on_while_its_predecessor_is_pending() {
        let now = Utc::now();
        let (store, queue) = (MemoryStore::default(), MemoryQueue::default());
        store.record_stream();
        let old = event(now - chrono::Duration::hours(1));
        let endpoint = EndpointId::generate();
        let mut predecessor = Delivery::new(
            DeliveryId::generate(),
            &old,
            endpoint.clone(),
            old.created_at,
        );
        predecessor.version = 3;
        predecessor.next_attempt_at = Some(now + chrono::Duration::minutes(10));
        let mut blocked = Delivery::new(DeliveryId::generate(), &old, endpoint, old.created_at);
        blocked.after = Some(hookline_core::ordering::KeyTail {
            delivery: predecessor.id.clone(),
            event: old.id.clone(),
        });
        blocked
            .block(&predecessor.id, Some(old.created_at), old.created_at)
            .unwrap();
        store.insert_delivery(predecessor.clone());
        store.insert_delivery(blocked.clone());

        let report = run_at(&store, &queue, now).await;
        assert_eq!((report.overdue, report.requeued), (1, 0));
        assert!(queue.sent().is_empty(), "no message while it waits");
        let stored = |id: &DeliveryId| {
            store
                .deliveries()
                .into_iter()
                .find(|d| &d.id == id)
                .unwrap()
        };
        let waiting = stored(&blocked.id);
        assert_eq!(waiting.blocked_by.as_ref(), Some(&predecessor.id));
        assert_eq!(waiting.next_attempt_at, predecessor.next_attempt_at);
        // Registered again: the predecessor's end wakes it.
        store.take_stream();
        let mut ended = predecessor.clone();
        ended.status = DeliveryStatus::Delivered;
        ended.released = true;
        ended.version += 1;
        assert!(store
            .update_delivery(&ended, predecessor.version)
            .await
            .unwrap());
        assert!(store.take_stream().iter().any(|r| matches!(
            &r.change,
            Ok(crate::dispatch::StreamChange::Wake { successor, .. }) if successor == &blocked.id
        )));
        // That wake lost too: the next overdue run re-queues it.
        let report = run_at(&store, &queue, now + chrono::Duration::hours(1)).await;
        assert_eq!(report.requeued, 1);
        assert_eq!(queue.sent()[0].0.delivery_id, blocked.id);
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

    /// Window (e): a backlog older than `WEBHOOKS_RECONCILE_AFTER`. While
    /// deliver reports receiving due messages 30 minutes late, a retry due
    /// 20 minutes ago and a listed first attempt of 20 minutes ago may still
    /// be waiting in the queue: no copy of either is queued. Once the
    /// report is stale (the backlog drained), both are recovered.
    #[tokio::test]
    async fn a_queue_backlog_deliver_reports_is_not_copied() {
        let now = Utc::now();
        let (store, queue) = (MemoryStore::default(), MemoryQueue::default());
        let then = now - chrono::Duration::minutes(20);
        let old = event(then);
        let mut waiting = Delivery::new(DeliveryId::generate(), &old, EndpointId::generate(), then);
        waiting.next_attempt_at = Some(then);
        store.insert_delivery(waiting.clone());
        let listed = Event::new(
            EventId::new_fanout_base(then, &mut rand::thread_rng()),
            AppId::parse("acme").unwrap(),
            EventType::parse("order.paid").unwrap(),
            &RawValue::from_string("{}".into()).unwrap(),
            then,
        );
        store.insert_event(StoredEvent {
            event: listed.clone(),
            targets: vec![EndpointId::generate()],
            fanout_remaining: vec![],
            fanout_version: 0,
        });
        store
            .record_queue_lag(&crate::ports::QueueLag {
                observed_at: now - chrono::Duration::minutes(1),
                lag: Duration::from_secs(30 * 60),
            })
            .await
            .unwrap();
        let report = run_at(&store, &queue, now).await;
        assert_eq!(
            (
                report.requeued,
                report.listed_requeued,
                report.queue_lag_seconds
            ),
            (0, 0, 1800),
            "{report}"
        );
        assert!(queue.sent().is_empty(), "no copy of a waiting message");
        // Ten minutes on, deliver has not reported for nine: drained.
        let later = run_at(&store, &queue, now + chrono::Duration::minutes(10)).await;
        assert_eq!(
            (
                later.requeued,
                later.listed_requeued,
                later.queue_lag_seconds
            ),
            (1, 1, 0),
            "{later}"
        );
        crate::fakes::record_figure(
            "scale",
            "window (e): a queue backlog 30 min old that deliver reports: the reconciler queues no copy of a retry or a first attempt waiting in it (was: a copy of every waiting message each run); recovered once the report is stale",
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
        let err = reconcile(&store, &queue, &settings(), now, BUDGET)
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
        store.register_app(
            &AppId::parse("acme").unwrap(),
            now - chrono::Duration::hours(1),
        );
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

    /// `events` events of `body_bytes` each, every one listing one endpoint,
    /// created a second apart from `from`; none of their first messages
    /// arrived (no delivery item).
    async fn lost_listed_events(
        store: &MemoryStore,
        from: DateTime<Utc>,
        events: usize,
        body_bytes: usize,
    ) -> Vec<crate::ports::NewEvent> {
        let routes = vec![EndpointRoute {
            id: EndpointId::generate(),
            event_types: vec![],
            disabled: false,
        }];
        let payload =
            RawValue::from_string(format!("{{\"pad\":\"{}\"}}", "x".repeat(body_bytes))).unwrap();
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(7);
        store.register_app(&AppId::parse("acme").unwrap(), from);
        let mut out = Vec::new();
        for i in 0..events {
            let (new, _) = crate::ingest::plan_event(
                AppId::parse("acme").unwrap(),
                EventType::parse("order.paid").unwrap(),
                &payload,
                &routes,
                from + chrono::Duration::seconds(i as i64),
                &mut rng,
            );
            assert_eq!(
                store.commit_event(&new).await.unwrap(),
                CommitOutcome::Committed
            );
            out.push(new);
        }
        out
    }

    /// Past the old per-run cap (20,000 events a run): 24,000 events of a
    /// listed fan-out in one window, every first message lost, read page by
    /// page (DynamoDB's 1 MB) over the shards: one run recovers them all
    /// and moves every mark to the cutoff; the next run reads nothing again.
    #[tokio::test]
    async fn one_run_sweeps_a_window_far_past_any_fixed_cap() {
        let now = Utc::now();
        let (store, queue) = (MemoryStore::default(), MemoryQueue::default());
        lost_listed_events(&store, now - chrono::Duration::hours(8), 24_000, 600).await;
        let report = run_at(&store, &queue, now).await;
        assert_eq!(
            (report.swept, report.listed_requeued, report.complete),
            (24_000, 24_000, true)
        );
        assert_eq!(queue.sent().len(), 24_000);
        assert!(
            store.pages_read() > 2 * crate::fakes::MEMORY_SHARDS,
            "read in pages: {}",
            store.pages_read()
        );
        assert_eq!(report.sweep_lag_seconds, 15 * 60, "caught up to the cutoff");
        let marks = store.committed_sweep_marks();
        // One app's shards and the late-write index.
        assert_eq!(marks.len(), crate::fakes::MEMORY_SHARDS as usize + 1);
        let again = run_at(&store, &queue, now + chrono::Duration::minutes(5)).await;
        assert_eq!((again.swept, again.listed_requeued), (0, 0));
        crate::fakes::record_figure(
            "scale",
            "reconciler sweep (fakes, 1 MB pages): 24,000 lost first messages in one window (past the old 20,000-a-run cap) recovered in one run; the next run reads nothing",
        );
    }

    /// A run out of time stops between pages, keeps what it checked (its
    /// marks), says it is behind with its lag, and the next run goes on
    /// from there: nothing is checked twice, nothing is missed.
    #[tokio::test(start_paused = true)]
    async fn a_run_out_of_time_keeps_its_progress_and_the_next_goes_on() {
        let now = Utc::now();
        let (store, queue) = (MemoryStore::default(), MemoryQueue::default());
        lost_listed_events(&store, now - chrono::Duration::hours(8), 16_000, 600).await;
        store.slow_pages(Duration::from_secs(1));
        let settings = settings();
        let first = reconcile(&store, &queue, &settings, now, Duration::from_millis(1500))
            .await
            .unwrap();
        assert!(!first.complete);
        assert!(first.listed_requeued > 0 && first.listed_requeued < 16_000);
        // The window runs from 8 h to 3.6 h ago.
        assert!(
            first.sweep_lag_seconds > 4 * 3600,
            "the oldest unswept event's age: {}",
            first.sweep_lag_seconds
        );
        let mut total = first.listed_requeued;
        for run in 1..=20 {
            let report = reconcile(
                &store,
                &queue,
                &settings,
                // Runs close together: none finds the re-queued ones
                // overdue (nothing delivers them here).
                now + chrono::Duration::seconds(run * 10),
                Duration::from_millis(1500),
            )
            .await
            .unwrap();
            total += report.listed_requeued;
            if report.complete {
                break;
            }
        }
        assert_eq!(total, 16_000, "each lost message recovered exactly once");
        assert_eq!(queue.sent().len(), 16_000);
    }

    /// A poison item (unreadable, or its event failing to read) is logged,
    /// counted and stepped over: the mark moves past it, every other lost
    /// message is recovered, and the run does not fail.
    #[tokio::test]
    async fn a_poison_item_is_stepped_over_and_the_rest_recovered() {
        let now = Utc::now();
        let (store, queue) = (MemoryStore::default(), MemoryQueue::default());
        let events = lost_listed_events(&store, now - chrono::Duration::hours(2), 50, 10).await;
        store.poison_event(&events[10].event.id);
        store.poison_event(&events[30].event.id);
        let report = run_at(&store, &queue, now).await;
        assert_eq!((report.poison, report.listed_requeued), (2, 48));
        assert!(report.complete);
        let again = run_at(&store, &queue, now + chrono::Duration::minutes(5)).await;
        assert_eq!((again.poison, again.swept), (0, 0), "never read again");
    }

    /// Never re-send what retention may have expired: an event older than
    /// the retention (less the margin) is not swept, whatever the mark
    /// says (a first run, or a mark left behind), while a younger one is.
    #[tokio::test]
    async fn events_near_the_end_of_retention_are_never_resent() {
        let now = Utc::now();
        let (store, queue) = (MemoryStore::default(), MemoryQueue::default());
        let retention = settings().retention;
        let old =
            now - chrono::Duration::from_std(retention).unwrap() + chrono::Duration::minutes(30);
        lost_listed_events(&store, old, 3, 10).await;
        lost_listed_events(&store, now - chrono::Duration::days(2), 2, 10).await;
        let report = run_at(&store, &queue, now).await;
        assert_eq!((report.swept, report.listed_requeued), (2, 2));
        assert!(queue
            .sent()
            .iter()
            .all(|(m, _)| m.delivery_id.created_at() > old + chrono::Duration::hours(1)));
    }

    /// A failure retrying may fix stops only its own part: the overdue
    /// entries are re-queued while the sweep fails, and the run reports
    /// the failure (the next run goes on).
    #[tokio::test]
    async fn a_failing_part_does_not_hold_back_the_other() {
        let now = Utc::now();
        let (store, queue) = (MemoryStore::default(), MemoryQueue::default());
        let old = event(now - chrono::Duration::hours(1));
        store.insert_delivery(Delivery::new(
            DeliveryId::generate(),
            &old,
            EndpointId::generate(),
            old.created_at,
        ));
        let events = lost_listed_events(&store, now - chrono::Duration::hours(2), 1, 10).await;
        // The sweep's re-queue is refused by the queue.
        queue.refuse(&DeliveryId::for_fanout(&events[0].event.id, 0).unwrap());
        let err = reconcile(&store, &queue, &settings(), now, BUDGET)
            .await
            .unwrap_err();
        assert!(err.is_retryable(), "{err}");
        assert_eq!(queue.sent().len(), 1, "the overdue delivery was re-queued");
    }

    /// Window (b): an event committed long after its creation (a
    /// producer's transaction retried, a slow clock), after the sweep of
    /// its day had passed it, whose first message is then lost. Dispatch
    /// sees from the stream that it was written late and indexes it by its
    /// write: the next sweep finds it. Without that index it was never
    /// swept again.
    #[tokio::test]
    async fn an_event_written_after_the_sweep_passed_its_creation_is_still_recovered() {
        let t0 = Utc::now() - chrono::Duration::hours(2);
        let (store, queue) = (MemoryStore::default(), MemoryQueue::default());
        store.record_stream();
        // The sweep passes t0 (nothing there yet).
        let first = run_at(&store, &queue, t0 + chrono::Duration::minutes(30)).await;
        assert_eq!(first.swept, 0);
        // Now the event created at t0 is written, 40 minutes late.
        let written = t0 + chrono::Duration::minutes(40);
        lost_listed_events(&store, t0, 1, 10).await;
        let records: Vec<crate::dispatch::RecordChange> = store
            .take_stream()
            .into_iter()
            .map(|mut r| {
                r.written_at = Some(written);
                r
            })
            .collect();
        let late_after = crate::dispatch::late_after(settings().reconcile_after);
        assert_eq!(
            crate::dispatch::dispatch_changes(&store, &queue, records, late_after, written).await,
            None
        );
        // Its first message is lost.
        lock(&queue.sent).clear();
        let later = run_at(&store, &queue, written + chrono::Duration::minutes(20)).await;
        assert_eq!(later.listed_requeued, 1, "{later}");
        assert_eq!(queue.sent().len(), 1);
    }
}
