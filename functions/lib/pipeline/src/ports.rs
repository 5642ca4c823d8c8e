//! The three ports of the pipeline. Each has one real implementation:
//! [`Store`] and [`Queue`] in `hookline-aws` (DynamoDB, SQS), [`Sender`] in
//! [`crate::sender`] (reqwest). Unit tests use in-memory fakes.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use hookline_core::apikey::ApiKey;
use hookline_core::catalog::EventTypeDef;
use hookline_core::ids::{ApiKeyId, AppId, DeliveryId, EndpointId, EventId, ReplayId};
use hookline_core::model::{Delivery, DeliveryStatus, Endpoint, EndpointRoute, Event, EventType};
use hookline_core::ordering::KeyHead;
use hookline_core::signing::SignedHeaders;
use hookline_core::stats::StatsDelta;

use crate::messages::DeliveryMessage;
use crate::replay::Replay;
use crate::PipelineError;

pub type Result<T> = std::result::Result<T, PipelineError>;

/// A stored `Idempotency-Key`: the response first given for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyRecord {
    pub app_id: AppId,
    pub key: String,
    /// SHA-256 of the request, to tell a replay from a reuse of the key.
    pub request_hash: String,
    /// The JSON response body first returned.
    pub response: String,
    pub created_at: DateTime<Utc>,
}

/// Everything ingest commits in one transaction.
///
/// A fan-out of up to [`FANOUT_LIST_MAX`] endpoints is only a list on the
/// event (`targets`): each delivery's id is [`DeliveryId::for_fanout`] of
/// its position, and its item is first written by its first attempt's
/// outcome (or by the reconciler, when that attempt is overdue). Until then
/// the store answers for it from the event (pending, never attempted).
/// Larger fan-outs are materialised as delivery items (`deliveries`, then
/// `fanout_remaining` chunk by chunk).
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub event: Event,
    /// The endpoints of a listed fan-out, in position order.
    pub targets: Vec<EndpointId>,
    /// Deliveries written in the same transaction (at most [`INLINE_DELIVERIES`]).
    pub deliveries: Vec<Delivery>,
    /// Endpoints whose deliveries dispatch materialises later (large fan-outs).
    pub fanout_remaining: Vec<EndpointId>,
    pub idempotency: Option<IdempotencyRecord>,
    /// A keyed event's move of its key's head, in the same transaction.
    pub key_head: Option<HeadMove>,
}

/// The head an event with an `ordering_key` writes ([`hookline_core::ordering`]):
/// on the condition that the stored head is still at `from` (0: none yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadMove {
    pub key: String,
    pub from: u64,
    pub head: KeyHead,
}

/// The largest fan-out kept as a list on the event (its item stays under
/// 4 KB of endpoint ids); larger ones get delivery items at once.
pub const FANOUT_LIST_MAX: usize = 100;

/// Deliveries written in the ingest transaction itself: 100 items at most per
/// transaction, minus the event and the idempotency record.
pub const INLINE_DELIVERIES: usize = 98;
/// Deliveries materialised per dispatch transaction (100 minus the event update).
pub const FANOUT_CHUNK: usize = 99;

/// Outcome of [`Store::commit_event`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitOutcome {
    Committed,
    /// The idempotency key was taken meanwhile: nothing was written.
    IdempotencyKeyTaken(IdempotencyRecord),
    /// Another transaction on the same items was in progress (DynamoDB's
    /// `TransactionConflict`, e.g. a concurrent request with the same
    /// idempotency key): nothing was written; look again and retry.
    Contended,
    /// The event's ordering key moved on since its head was read (another
    /// event of the key committed first): nothing was written; read the
    /// head again and plan the event after that one.
    OrderMoved,
}

/// An event as stored, with its fan-out progress.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    pub event: Event,
    /// A listed fan-out (see [`NewEvent`]): the endpoint at each position.
    pub targets: Vec<EndpointId>,
    pub fanout_remaining: Vec<EndpointId>,
    /// Bumped by each materialised chunk (optimistic concurrency).
    pub fanout_version: u32,
}

impl StoredEvent {
    /// The never-attempted delivery at `position` of the event's listed
    /// fan-out, as it stands before its first attempt.
    pub fn listed_delivery(&self, position: usize) -> Option<Delivery> {
        let endpoint = self.targets.get(position)?;
        let id = DeliveryId::for_fanout(&self.event.id, position)?;
        Some(Delivery::new(
            id,
            &self.event,
            endpoint.clone(),
            self.event.created_at,
        ))
    }

    /// Every delivery of the listed fan-out as it stands before its first
    /// attempt.
    pub fn listed_deliveries(&self) -> Vec<Delivery> {
        (0..self.targets.len())
            .filter_map(|p| self.listed_delivery(p))
            .collect()
    }
}

/// Where the reconciler's sweep reads events by time: one source per
/// partition (or index shard) it pages through, each with its own mark.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SweepSource {
    /// Shard `n` of an app's creation-day event partitions (its marks are
    /// kept with the app: [`Store::save_app_sweep_marks`]).
    Days(AppId, u32),
    /// Shard `n` of the time index of listed fan-outs written after their
    /// creation (an event completed after its request stopped), by the
    /// time they were written (marks: [`Store::save_sweep_marks`]).
    Late(u32),
}

impl std::fmt::Display for SweepSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Days(app, n) => write!(f, "days/{app}/{n}"),
            Self::Late(n) => write!(f, "late/{n}"),
        }
    }
}

impl std::str::FromStr for SweepSource {
    type Err = PipelineError;
    fn from_str(text: &str) -> Result<Self> {
        let bad = || PipelineError::Corrupt(format!("sweep source `{text}`"));
        let (kind, rest) = text.split_once('/').ok_or_else(bad)?;
        match kind {
            "days" => {
                let (app, n) = rest.rsplit_once('/').ok_or_else(bad)?;
                let app = AppId::parse(app).map_err(|_| bad())?;
                Ok(Self::Days(app, n.parse().map_err(|_| bad())?))
            }
            "late" => Ok(Self::Late(rest.parse().map_err(|_| bad())?)),
            _ => Err(bad()),
        }
    }
}

/// An app whose event partitions the sweep reads: every app that ever had
/// an endpoint (only those have events with a listed fan-out), registered
/// when its first endpoint was created, with its partitions' marks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweptApp {
    pub app_id: AppId,
    /// When its first endpoint was created: none of its listed events was
    /// written before (one written long after its creation is in the
    /// late-write index).
    pub registered_at: DateTime<Utc>,
    /// Its [`SweepSource::Days`] marks (none before its first sweep).
    pub marks: SweepMarks,
}

/// One page of the apps the sweep reads, in app id order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweptAppsPage {
    pub apps: Vec<SweptApp>,
    /// Where the next page starts.
    pub position: String,
    /// No page follows.
    pub done: bool,
}

/// Where a sweep source is checked up to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepMark {
    /// The position (opaque to the use case) up to which every event is
    /// checked: where the next page starts.
    pub position: String,
    /// The time that position stands for ([`SweepPage::reached`]): the
    /// sweep's lag is measured from the oldest one.
    pub reached: DateTime<Utc>,
}

/// The sweep's marks, per source.
pub type SweepMarks = std::collections::BTreeMap<SweepSource, SweepMark>;

/// An event as the sweep reads it: what its listed fan-out needs, never
/// its body (a page of them stays small whatever the payloads).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventHead {
    pub id: EventId,
    pub app_id: AppId,
    pub created_at: DateTime<Utc>,
    /// A listed fan-out: the endpoint at each position.
    pub targets: Vec<EndpointId>,
}

impl EventHead {
    /// The head of a stored event.
    pub fn of(stored: &StoredEvent) -> Self {
        Self {
            id: stored.event.id.clone(),
            app_id: stored.event.app_id.clone(),
            created_at: stored.event.created_at,
            targets: stored.targets.clone(),
        }
    }

    /// The ids of its listed deliveries, by position.
    pub fn listed_ids(&self) -> Vec<(usize, DeliveryId)> {
        (0..self.targets.len())
            .filter_map(|p| DeliveryId::for_fanout(&self.id, p).map(|id| (p, id)))
            .collect()
    }
}

/// One page of a sweep source: one read request's worth (DynamoDB's 1 MB
/// of items read per query page).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SweepPage {
    /// The events with a listed fan-out read, oldest first.
    pub events: Vec<EventHead>,
    /// The keys of items that could not be read (poison): stepped over.
    pub unreadable: Vec<String>,
    /// Where the next page starts (the mark once this page is checked).
    pub position: String,
    /// The creation (or, for [`SweepSource::Late`], writing) time the
    /// source is read up to: the sweep's lag is measured from it.
    pub reached: DateTime<Utc>,
    /// Every event before the cutoff is read: `position` is the cutoff.
    pub done: bool,
}

/// One page of an overdue-index shard.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OverduePage {
    /// The entries, oldest first, with the time each was due.
    pub entries: Vec<(DateTime<Utc>, Overdue)>,
    /// Index entries that could not be read (logged by the store).
    pub unreadable: u32,
    /// Where the next page starts.
    pub position: String,
    /// No entry due before the cutoff follows.
    pub done: bool,
}

/// An entry of the overdue index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Overdue {
    /// A pending delivery (of this app) due a while ago.
    Delivery(AppId, DeliveryId),
    /// An event (of this app) with fan-out left to materialise.
    Event(AppId, EventId),
    /// A running replay not advanced for a while.
    Replay(ReplayId),
}

impl std::fmt::Display for Overdue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Delivery(_, id) => write!(f, "{id}"),
            Self::Event(_, id) => write!(f, "{id}"),
            Self::Replay(id) => write!(f, "{id}"),
        }
    }
}

/// Which replay an endpoint's replay slot names (one running replay per
/// endpoint: [`crate::replay::start_replay`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplaySlot {
    pub replay_id: ReplayId,
    pub taken_at: DateTime<Utc>,
}

/// How late deliver receives due messages (the delivery queue's backlog
/// as deliver last saw it): the reconciler leaves alone what may still be
/// waiting in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLag {
    pub observed_at: DateTime<Utc>,
    /// The latest a due message was received, past its due time, over the
    /// reporting process's last period.
    pub lag: Duration,
}

/// One page of an app's events in a time window, from the event time
/// indexes ([`Store::events_in_window`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EventWindow {
    /// The app's events created in the window, in no particular order.
    pub events: Vec<StoredEvent>,
    /// Where the next page starts (opaque).
    pub position: String,
    /// No page follows.
    pub complete: bool,
}

/// Filters of a delivery list (newest first).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeliveryQuery {
    pub status: Option<DeliveryStatus>,
    pub endpoint_id: Option<EndpointId>,
    pub event_type: Option<String>,
    /// Only deliveries created before this one (the cursor).
    pub before: Option<DeliveryId>,
    /// Only deliveries created at or after this time.
    pub created_after: Option<DateTime<Utc>>,
    /// Only deliveries created before this time.
    pub created_before: Option<DateTime<Utc>>,
    pub limit: usize,
}

impl DeliveryQuery {
    /// The smallest delivery id the query admits (inclusive): ids are
    /// time-ordered, so a time range is a sort-key range.
    pub fn lowest_id(&self) -> Option<DeliveryId> {
        self.created_after.map(DeliveryId::time_floor)
    }

    /// The id every admitted delivery sorts below (exclusive): the cursor or
    /// the end of the time range, whichever is lower.
    pub fn below_id(&self) -> Option<DeliveryId> {
        let until = self.created_before.map(DeliveryId::time_floor);
        match (self.before.clone(), until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether `id` is inside the query's id range.
    pub fn admits_id(&self, id: &DeliveryId) -> bool {
        self.lowest_id().is_none_or(|lo| *id >= lo) && self.below_id().is_none_or(|hi| *id < hi)
    }
}

/// A page of deliveries; `next_cursor` is set when more may follow.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeliveryPage {
    pub items: Vec<Delivery>,
    pub next_cursor: Option<DeliveryId>,
}

/// The persistent state: endpoints, events, deliveries, idempotency keys.
/// An endpoint's stats hours (start, counts; oldest first) and its
/// waiting gauge.
pub type EndpointHours = (Vec<(DateTime<Utc>, StatsDelta)>, i64);

pub trait Store: Send + Sync {
    /// Every endpoint of an app (enabled or not), secrets opened.
    fn list_endpoints(&self, app: &AppId) -> impl Future<Output = Result<Vec<Endpoint>>> + Send;
    /// Every endpoint of an app as fan-out sees it (consistent read): never
    /// opens a secret.
    fn list_routes(&self, app: &AppId) -> impl Future<Output = Result<Vec<EndpointRoute>>> + Send;
    fn get_endpoint(
        &self,
        app: &AppId,
        id: &EndpointId,
    ) -> impl Future<Output = Result<Option<Endpoint>>> + Send;
    /// Creates an endpoint (never overwrites one: its id is new) if its app
    /// has fewer than `max_per_app` endpoints; `Ok(false)`: it has that
    /// many, nothing written. The count and the endpoint change together
    /// (concurrent creations never pass the limit), and the app is
    /// registered for the reconciler's sweep ([`SweptApp`]) with its first.
    fn put_endpoint(
        &self,
        endpoint: &Endpoint,
        max_per_app: u32,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// One type of the event-type catalog.
    fn get_event_type(
        &self,
        name: &EventType,
    ) -> impl Future<Output = Result<Option<EventTypeDef>>> + Send;
    /// Creates or replaces a catalog type.
    fn put_event_type(&self, def: &EventTypeDef) -> impl Future<Output = Result<()>> + Send;
    /// Deletes a catalog type: whether it existed.
    fn delete_event_type(&self, name: &EventType) -> impl Future<Output = Result<bool>> + Send;
    /// Up to `limit` catalog types by name, after `after`; and whether more follow.
    fn list_event_types(
        &self,
        after: Option<&EventType>,
        limit: usize,
    ) -> impl Future<Output = Result<(Vec<EventTypeDef>, bool)>> + Send;
    /// Every catalog type's name, sorted (what endpoint subscriptions are
    /// checked against).
    fn event_type_names(&self) -> impl Future<Output = Result<Vec<String>>> + Send;
    /// Writes a changed endpoint if it still exists at `expected_version`
    /// (the caller bumped `endpoint.version`). `Ok(false)`: it was deleted or
    /// changed meanwhile (a rotation, a PATCH, an auto-disable): nothing
    /// written, so no lost update and no resurrected endpoint.
    fn update_endpoint(
        &self,
        endpoint: &Endpoint,
        expected_version: u64,
    ) -> impl Future<Output = Result<bool>> + Send;
    /// Takes the next `count` send slots of endpoint `id`'s rate limiter
    /// ([`hookline_core::rate::reserve`], atomic across every deliver
    /// instance): the first slot's number. `likely_busy` is the caller's
    /// guess of the limiter's state ([`hookline_core::rate::is_busy`] on
    /// what it last saw): a store that must choose between writes tries the
    /// matching one first. A wrong guess costs a write, never a slot.
    fn reserve_send_slots(
        &self,
        id: &EndpointId,
        per_second: u32,
        count: u32,
        likely_busy: bool,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<i64>> + Send;

    /// Adds `delta` to endpoint `id`'s counts of the hour starting at
    /// `hour` ([`hookline_core::stats`]), and its `waiting` to the
    /// endpoint's gauge of deliveries waiting for a retry. Counters, not
    /// records: never read to decide a delivery.
    fn add_endpoint_stats(
        &self,
        app: &AppId,
        id: &EndpointId,
        hour: DateTime<Utc>,
        delta: &StatsDelta,
    ) -> impl Future<Output = Result<()>> + Send;
    /// Endpoint `id`'s counts of every hour from the one holding `since`
    /// on (oldest first, with the hour's start), and its waiting gauge.
    fn endpoint_stats(
        &self,
        app: &AppId,
        id: &EndpointId,
        since: DateTime<Utc>,
    ) -> impl Future<Output = Result<EndpointHours>> + Send;
    /// Disables an endpoint with a reason (e.g. it answered 410 Gone),
    /// bumping its version, if it is still at `expected_version` (the
    /// version the caller judged it at). `Ok(false)`: it changed (re-enabled,
    /// a new URL) or is gone; nothing written.
    fn disable_endpoint(
        &self,
        app: &AppId,
        id: &EndpointId,
        reason: &str,
        expected_version: u64,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Records when an endpoint's attempts started failing (`None`: it
    /// answered 2xx again), bumping its version, if it is still at
    /// `expected_version`. `Ok(false)`: it changed or is gone; nothing
    /// written. Touches no secret.
    fn set_failing_since(
        &self,
        app: &AppId,
        id: &EndpointId,
        since: Option<DateTime<Utc>>,
        expected_version: u64,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Sets an endpoint's circuit (`None`: closes it) if it is still at the
    /// version judged (no PATCH since: another URL is judged afresh) and
    /// its circuit is still the one judged: open until `expected` (`None`:
    /// closed); ends its run of unanswered requests. Its version is not
    /// bumped ([`hookline_core::model::Endpoint::circuit`]). `Ok(false)`:
    /// another writer came first, or the endpoint is gone; nothing written.
    fn set_circuit(
        &self,
        app: &AppId,
        id: &EndpointId,
        version: u64,
        circuit: Option<&hookline_core::circuit::Circuit>,
        expected: Option<DateTime<Utc>>,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Adds one request that got no answer at `now` to the endpoint's run
    /// of them ([`hookline_core::circuit`]); a run begun before
    /// `run_from` starts over with it. Returns the run's length, or `None`
    /// (nothing written) when the endpoint's circuit is open, it is no
    /// longer at the version judged (a PATCH since), or it is gone.
    fn add_unanswered(
        &self,
        app: &AppId,
        id: &EndpointId,
        version: u64,
        now: DateTime<Utc>,
        run_from: DateTime<Utc>,
    ) -> impl Future<Output = Result<Option<u32>>> + Send;

    /// Takes the next turn of a slow endpoint's requests
    /// ([`hookline_core::circuit::SLOW_SHARE`]): `now` when its turns are
    /// idle (the next free one passed), else the next free one; the next
    /// free turn moves `gap` on. `None` when the endpoint is gone.
    fn take_turn(
        &self,
        app: &AppId,
        id: &EndpointId,
        now: DateTime<Utc>,
        gap: std::time::Duration,
    ) -> impl Future<Output = Result<Option<DateTime<Utc>>>> + Send;

    /// Ends the endpoint's run of unanswered requests (it answered); no
    /// write when it has none.
    fn clear_unanswered(
        &self,
        app: &AppId,
        id: &EndpointId,
    ) -> impl Future<Output = Result<()>> + Send;

    fn get_idempotency(
        &self,
        app: &AppId,
        key: &str,
    ) -> impl Future<Output = Result<Option<IdempotencyRecord>>> + Send;
    /// Event + inline deliveries + idempotency record, in one transaction.
    fn commit_event(&self, new: &NewEvent) -> impl Future<Output = Result<CommitOutcome>> + Send;
    /// An event of `app` (consistent read).
    fn get_event(
        &self,
        app: &AppId,
        id: &EventId,
    ) -> impl Future<Output = Result<Option<StoredEvent>>> + Send;
    /// The events of `ids` (app, event) that exist, in any order
    /// (consistent reads, batched): the bodies dispatch puts in queue
    /// messages.
    fn get_events(
        &self,
        ids: &[(AppId, EventId)],
    ) -> impl Future<Output = Result<Vec<StoredEvent>>> + Send;
    /// Writes `deliveries` and sets the event's remaining fan-out to
    /// `remaining`, in one transaction, if the event is still at `version`.
    /// `Ok(false)`: the version moved on (another run did it); nothing written.
    fn materialise_fanout(
        &self,
        app: &AppId,
        event_id: &EventId,
        version: u32,
        deliveries: &[Delivery],
        remaining: &[EndpointId],
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Lists an app's deliveries through the GSIs (never a scan).
    fn list_deliveries(
        &self,
        app: &AppId,
        query: &DeliveryQuery,
    ) -> impl Future<Output = Result<DeliveryPage>> + Send;

    /// Deletes an endpoint (its deliveries stay; pending ones fail as "endpoint deleted").
    fn delete_endpoint(
        &self,
        app: &AppId,
        id: &EndpointId,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// A delivery of `app` by id: its item, or, for a delivery of a listed
    /// fan-out never attempted yet, as its event lists it (pending, version
    /// 0). A delivery of another app is not found.
    fn get_delivery(
        &self,
        app: &AppId,
        id: &DeliveryId,
    ) -> impl Future<Output = Result<Option<Delivery>>> + Send;
    /// A delivery's item only (consistent read): `None` for a listed
    /// delivery never written yet (see [`crate::messages::DeliveryMessage::listed_delivery`]).
    fn get_delivery_item(
        &self,
        app: &AppId,
        id: &DeliveryId,
    ) -> impl Future<Output = Result<Option<Delivery>>> + Send;
    /// The head of ordering key `key` of `app` (consistent read; the
    /// default head when the key has none).
    fn get_key_head(&self, app: &AppId, key: &str) -> impl Future<Output = Result<KeyHead>> + Send;
    /// Asks pending delivery `predecessor` (its item written by an attempt
    /// or a hold: version above 0) to wake `successor` when it ends: one
    /// conditional write. `false`: it has ended (or was released once)
    /// already, or has no item yet.
    fn register_successor(
        &self,
        app: &AppId,
        predecessor: &DeliveryId,
        successor: &DeliveryId,
    ) -> impl Future<Output = Result<bool>> + Send;
    /// Whether an event of `app` is still stored (its key only, read
    /// eventually consistently: an event exists long before anything asks).
    fn event_exists(&self, app: &AppId, id: &EventId) -> impl Future<Output = Result<bool>> + Send;
    /// [`Store::get_delivery_item`], read eventually consistently (half
    /// the read units): a write of about the last second may not show yet.
    /// For a listed delivery's first attempt only, where a missed write
    /// costs at most a second POST of the same message (the outcome's
    /// write is conditional on version 0, so the record stays right) —
    /// never where a version is compared (a later attempt).
    fn peek_delivery_item(
        &self,
        app: &AppId,
        id: &DeliveryId,
    ) -> impl Future<Output = Result<Option<Delivery>>> + Send {
        self.get_delivery_item(app, id)
    }
    /// [`Store::peek_delivery_item`] and the delivery's endpoint, in one
    /// request where the store can. The endpoint may be read eventually
    /// consistently too (deliver caches endpoints longer than that), but an
    /// endpoint not found must be asked again consistently: one created a
    /// moment ago may already have events on their way.
    fn peek_delivery_item_and_endpoint(
        &self,
        app: &AppId,
        id: &DeliveryId,
        endpoint: &EndpointId,
    ) -> impl Future<Output = Result<(Option<Delivery>, Option<Endpoint>)>> + Send {
        async move {
            let item = self.peek_delivery_item(app, id).await?;
            Ok((item, self.get_endpoint(app, endpoint).await?))
        }
    }
    /// Writes the delivery's new state if it is still at `expected_version`
    /// (version 0: also if it has no item yet, a listed delivery's first write)
    /// (versions never repeat, see [`Delivery::version`]). `Ok(false)` when it
    /// is not (another writer won; nothing written). A pending delivery never
    /// expires (no TTL while pending) and is listed in the overdue index; a
    /// finished one leaves the index and expires after the retention.
    fn update_delivery(
        &self,
        delivery: &Delivery,
        expected_version: u64,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Keeps an event (whose body deliver reads) for a whole retention period
    /// from `restarted_at` (never shortens it): a delivery restarted late in
    /// the event's retention must not outlive it.
    fn extend_event_retention(
        &self,
        app: &AppId,
        id: &EventId,
        restarted_at: DateTime<Utc>,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Records how late deliver receives due messages (one small item,
    /// overwritten).
    fn record_queue_lag(&self, lag: &QueueLag) -> impl Future<Output = Result<()>> + Send;
    /// The last recorded queue lag (none recorded yet: `None`).
    fn queue_lag(&self) -> impl Future<Output = Result<Option<QueueLag>>> + Send;

    /// Shards of the overdue index (read in parallel by the reconciler).
    fn overdue_shards(&self) -> u32;
    /// One page of overdue-index shard `shard`: entries due before
    /// `cutoff` after `position` (`""`: from the oldest), oldest first:
    /// pending deliveries (by `next_attempt_at`), events whose fan-out is
    /// not fully materialised (by creation), running replays (by their
    /// last step). Reads only the index of pending work, never the table.
    fn overdue_page(
        &self,
        shard: u32,
        cutoff: DateTime<Utc>,
        position: &str,
    ) -> impl Future<Output = Result<OverduePage>> + Send;

    /// Shards of each app's event partitions ([`SweepSource::Days`]).
    fn event_shards(&self) -> u32;
    /// Shards of the late-write index ([`SweepSource::Late`]).
    fn late_shards(&self) -> u32;
    /// One page of the apps the sweep reads, after `position` (`""`: from
    /// the first), with their marks.
    fn swept_apps(&self, position: &str) -> impl Future<Output = Result<SweptAppsPage>> + Send;
    /// Records that every event of `app` up to each of `marks` is checked.
    fn save_app_sweep_marks(
        &self,
        app: &AppId,
        marks: &SweepMarks,
    ) -> impl Future<Output = Result<()>> + Send;
    /// One page of `source`: events with a listed fan-out after
    /// `position` (`""`, or a position older than `floor`: from `floor`)
    /// and before `cutoff`, heads only, read by time (never a scan).
    fn sweep_page(
        &self,
        source: &SweepSource,
        position: &str,
        floor: DateTime<Utc>,
        cutoff: DateTime<Utc>,
    ) -> impl Future<Output = Result<SweepPage>> + Send;
    /// Puts an event with a listed fan-out into the late-write index
    /// ([`SweepSource::Late`]) at `written_at`: it was written so long
    /// after its creation that the sweep of its day partition may have
    /// passed it. Nothing is written if it is indexed already.
    fn index_late_event(
        &self,
        event: &EventHead,
        written_at: DateTime<Utc>,
    ) -> impl Future<Output = Result<()>> + Send;
    /// The committed marks of the late-write index (none before the first
    /// sweep).
    fn sweep_marks(&self) -> impl Future<Output = Result<SweepMarks>> + Send;
    /// Records that every late-written event up to each mark is checked.
    fn save_sweep_marks(&self, marks: &SweepMarks) -> impl Future<Output = Result<()>> + Send;
    /// The ids of those among `deliveries` (app, id) that have a delivery
    /// item (eventually consistent reads, batched).
    fn delivery_items_among(
        &self,
        deliveries: &[(AppId, DeliveryId)],
    ) -> impl Future<Output = Result<Vec<DeliveryId>>> + Send;
    /// Writes a delivery item if the delivery has none yet. `Ok(false)`: it
    /// has one (its attempt wrote it meanwhile); nothing written.
    fn create_delivery(&self, delivery: &Delivery) -> impl Future<Output = Result<bool>> + Send;

    /// About `limit` events of `app` created in `[since, until)` from
    /// `position` (`""`: the start of the window), read by time (never a
    /// scan of the table). An event whose large fan-out is still being
    /// materialised may be among them: [`crate::replay::wants`] leaves its
    /// remaining endpoints to the fan-out.
    fn events_in_window(
        &self,
        app: &AppId,
        since: DateTime<Utc>,
        until: DateTime<Utc>,
        position: &str,
        limit: usize,
    ) -> impl Future<Output = Result<EventWindow>> + Send;
    /// The replay slot of `endpoint`: the last replay started for it
    /// (consistent read).
    fn replay_slot(
        &self,
        app: &AppId,
        endpoint: &EndpointId,
    ) -> impl Future<Output = Result<Option<ReplaySlot>>> + Send;
    /// Gives `endpoint`'s replay slot to `replay` (at `now`) if `held_by`
    /// still holds it (`None`: if no replay ever did). `Ok(false)`: not
    /// taken (another start got there first).
    fn take_replay_slot(
        &self,
        app: &AppId,
        endpoint: &EndpointId,
        replay: &ReplayId,
        held_by: Option<&ReplayId>,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<bool>> + Send;
    /// A replay by id (consistent read).
    fn get_replay(&self, id: &ReplayId) -> impl Future<Output = Result<Option<Replay>>> + Send;
    /// Stores a replay: a new one (`expected_version` `None`: only if its id
    /// is free) or its next step, only if still at `expected_version`.
    /// `Ok(false)`: nothing written. A running replay is in the overdue
    /// index (due at `updated_at`) and each write of one is a stream record
    /// dispatch continues it from.
    fn put_replay(
        &self,
        replay: &Replay,
        expected_version: Option<u64>,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Stores a new app-scoped API key record (only its hash).
    fn put_api_key(&self, key: &ApiKey) -> impl Future<Output = Result<()>> + Send;
    fn get_api_key(&self, id: &ApiKeyId) -> impl Future<Output = Result<Option<ApiKey>>> + Send;
    /// An app's API keys, oldest first.
    fn list_api_keys(&self, app: &AppId) -> impl Future<Output = Result<Vec<ApiKey>>> + Send;
    /// Revokes a key of `app`; `Ok(false)` when there is no such key.
    fn delete_api_key(
        &self,
        app: &AppId,
        id: &ApiKeyId,
    ) -> impl Future<Output = Result<bool>> + Send;
}

/// A message received from the DLQ.
#[derive(Debug, Clone)]
pub struct DlqEntry {
    pub receipt_handle: String,
    pub body: String,
}

/// The delivery queue and its DLQ.
pub trait Queue: Send + Sync {
    /// Sends `(message, delay_seconds)` pairs (batched by 10). Returns the
    /// indices of the messages that were not accepted.
    fn send_deliveries(
        &self,
        messages: &[(DeliveryMessage, i32)],
    ) -> impl Future<Output = Result<Vec<usize>>> + Send;
    /// Puts a copy of a failed delivery in the DLQ.
    fn send_to_dlq(&self, message: &DeliveryMessage) -> impl Future<Output = Result<()>> + Send;
    /// Receives up to 10 DLQ messages, hidden for `visibility` meanwhile.
    /// Waits up to `wait` for a message (long polling: every SQS server is
    /// asked, so an empty answer means empty, unlike a short poll's sample).
    fn receive_dlq(
        &self,
        max: i32,
        visibility: Duration,
        wait: Duration,
    ) -> impl Future<Output = Result<Vec<DlqEntry>>> + Send;
    fn delete_dlq(&self, receipt_handles: &[String]) -> impl Future<Output = Result<()>> + Send;
    /// Makes received DLQ messages visible again at once.
    fn release_dlq(&self, receipt_handles: &[String]) -> impl Future<Output = Result<()>> + Send;
    /// Approximate number of messages in the DLQ.
    fn dlq_depth(&self) -> impl Future<Output = Result<u64>> + Send;
}

/// One signed POST.
#[derive(Debug, Clone, Copy)]
pub struct OutgoingRequest<'a> {
    pub url: &'a str,
    pub headers: &'a SignedHeaders,
    /// The endpoint's own headers (checked: never one hookline sets).
    pub custom_headers: &'a std::collections::BTreeMap<String, String>,
    pub body: &'a [u8],
    pub timeout: Duration,
}

/// What came of a POST: a status, or an error without one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SendResult {
    pub status: Option<u16>,
    pub retry_after: Option<String>,
    /// The first bytes of the response body.
    pub body_prefix: Option<Vec<u8>>,
    pub error: Option<String>,
    pub latency: Duration,
    /// The address was refused by the private-address guard: not retryable.
    pub blocked: bool,
}

/// Sends webhooks.
pub trait Sender: Send + Sync {
    fn send(&self, request: OutgoingRequest<'_>) -> impl Future<Output = SendResult> + Send;
}
