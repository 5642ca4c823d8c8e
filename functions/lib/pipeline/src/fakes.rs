//! In-memory ports for unit tests. They keep the conditional semantics of the
//! real ones (version and state guards) so handler logic is tested honestly;
//! the AWS implementations are tested against moto in `tests/`.

use hookline_core::sync::lock;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use hookline_core::apikey::ApiKey;
use hookline_core::catalog::EventTypeDef;
use hookline_core::ids::{ApiKeyId, AppId, DeliveryId, EndpointId, EventId, ReplayId};
use hookline_core::model::{Delivery, DeliveryStatus, Endpoint, EndpointRoute, EventType};
use hookline_core::stats::StatsDelta;

use crate::messages::DeliveryMessage;
use crate::ports::*;
use crate::replay::Replay;

/// Appends a line of measured figures to `target/test-figures/<name>.txt`
/// (the suite's RELIABILITY.md is written from them by `tests/run`).
pub fn record_figure(name: &str, line: &str) {
    use std::io::Write;
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../target"))
        .join("test-figures");
    let _ = std::fs::create_dir_all(&dir);
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{name}.txt")))
    {
        let _ = writeln!(f, "{line}");
    }
}

#[derive(Debug, Default)]
struct StoreState {
    endpoints: HashMap<EndpointId, Endpoint>,
    events: HashMap<EventId, StoredEvent>,
    /// Restart times passed to `extend_event_retention`.
    retained: HashMap<EventId, DateTime<Utc>>,
    /// The next this-many commits answer `Contended` (DynamoDB's
    /// TransactionConflict, which moto never produces).
    contended_commits: u32,
    /// The next this-many delivery reads fail (a throttled or broken store).
    failing_delivery_reads: u32,
    failing_route_reads: u32,
    /// Delivery item reads so far: (consistent, eventually consistent).
    item_reads: (u32, u32),
    deliveries: HashMap<DeliveryId, Delivery>,
    /// Every event by (app, shard, id): an app's day partitions' order,
    /// for the sweep and replays.
    event_order: std::collections::BTreeSet<(AppId, u32, EventId)>,
    /// The apps the sweep reads: when each was registered, its marks.
    swept_apps: std::collections::BTreeMap<AppId, (DateTime<Utc>, SweepMarks)>,
    /// The reconciler's marks of the late-write index.
    sweep_marks: SweepMarks,
    /// Event items read by sweep pages and replay windows.
    event_items_read: u64,
    /// Each endpoint's replay slot.
    replay_slots: HashMap<EndpointId, ReplaySlot>,
    /// The recorded queue lag and how many times it was written.
    queue_lag: Option<QueueLag>,
    queue_lag_writes: u32,
    /// The late-write index: (written time, event id), by time.
    late_index: std::collections::BTreeSet<(DateTime<Utc>, EventId)>,
    /// Events the sweep reads as unreadable items (poison).
    poison_events: std::collections::HashSet<EventId>,
    /// How long each sweep or overdue page takes (a slow table, on tokio's
    /// clock: a paused test clock advances by it).
    page_delay: Duration,
    /// Sweep and overdue pages read so far.
    pages_read: u32,
    /// The table's stream as dispatch would see it, when recorded
    /// ([`MemoryStore::record_stream`]): what each write's new image decodes to.
    stream: Option<Vec<crate::dispatch::RecordChange>>,
    idempotency: HashMap<(AppId, String), IdempotencyRecord>,
    api_keys: HashMap<ApiKeyId, ApiKey>,
    /// Per endpoint: its hours' counts and its waiting gauge.
    stats: HashMap<EndpointId, (std::collections::BTreeMap<DateTime<Utc>, StatsDelta>, i64)>,
    replays: HashMap<ReplayId, Replay>,
    limiters: HashMap<EndpointId, hookline_core::rate::Limiter>,
    /// Calls to `reserve_send_slots` (each one limiter write).
    limiter_writes: u32,
    catalog: std::collections::BTreeMap<String, EventTypeDef>,
    /// Each ordering key's head.
    key_heads: HashMap<(AppId, String), hookline_core::ordering::KeyHead>,
    /// Successors registered on a pending delivery (kept apart from the
    /// delivery, as the item's `wake` attribute outlives whole writes).
    wakes: HashMap<DeliveryId, DeliveryId>,
    /// A head another request commits right after the next head read
    /// (its version moved on under the reader).
    racing_head: Option<hookline_core::ordering::KeyHead>,
}

impl StoreState {
    /// Appends to the stream, when it is recorded.
    fn streamed(&mut self, insert: bool, change: crate::dispatch::StreamChange) {
        if let Some(stream) = &mut self.stream {
            let sequence = stream.len().to_string();
            stream.push(crate::dispatch::RecordChange {
                sequence,
                insert,
                // The in-memory store keeps no clock: writes are never late.
                written_at: None,
                change: Ok(change),
            });
        }
    }

    /// A delivery item written: a pending one not re-queued by the
    /// reconciler is a stream record dispatch queues.
    fn delivery_streamed(&mut self, insert: bool, d: &Delivery) {
        if d.status == DeliveryStatus::Pending && !d.requeued && d.blocked_by.is_none() {
            self.streamed(
                insert,
                crate::dispatch::StreamChange::PendingDelivery(Box::new(d.clone())),
            );
        } else if d.status != DeliveryStatus::Pending {
            if let Some(successor) = self.wakes.get(&d.id).cloned() {
                self.streamed(
                    insert,
                    crate::dispatch::StreamChange::Wake {
                        app: d.app_id.clone(),
                        successor,
                        predecessor: d.id.clone(),
                    },
                );
            }
        }
    }

    fn put_event(&mut self, e: StoredEvent) {
        self.event_order
            .insert(order_key(&e.event.app_id, &e.event.id));
        self.events.insert(e.event.id.clone(), e);
    }

    fn register_app(&mut self, app: &AppId, at: DateTime<Utc>) {
        self.swept_apps
            .entry(app.clone())
            .or_insert_with(|| (at, SweepMarks::new()));
    }
}

/// Shards of the in-memory event order and overdue index (as the
/// DynamoDB store's `EVENT_SHARDS` and `DUE_SHARDS`).
pub const MEMORY_SHARDS: u32 = 8;
/// An event's place in its app's day partitions.
fn order_key(app: &AppId, id: &EventId) -> (AppId, u32, EventId) {
    (
        app.clone(),
        memory_shard(id.as_str(), MEMORY_SHARDS),
        id.clone(),
    )
}

/// Apps per page of the sweep's app registry (DynamoDB's 1 MB page of
/// small items).
pub const SWEPT_APPS_PAGE: usize = 1000;
/// A page of the in-memory store reads at most this many bytes of items
/// (DynamoDB's 1 MB per query page, counted on the item before projection).
pub const PAGE_BYTES: usize = 1 << 20;
/// An overdue page holds at most this many entries (the DynamoDB store's
/// query limit on the KEYS_ONLY index).
pub const OVERDUE_PAGE_ENTRIES: usize = 1000;

/// FNV-1a of `text` modulo `n` (the DynamoDB store's sharding hash).
fn memory_shard(text: &str, n: u32) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for b in text.bytes() {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash % n
}

/// An item's size as DynamoDB bills its read: the body and about 200 bytes
/// of keys and attributes.
fn event_item_bytes(e: &StoredEvent) -> usize {
    e.event.body.len() + 200 + 30 * e.targets.len()
}

/// A fixed-width sort key of an overdue entry (due time, then id).
fn due_position(due: DateTime<Utc>, id: &str) -> String {
    format!("{}#{id}", due.format("%Y-%m-%dT%H:%M:%S%.6fZ"))
}

/// An in-memory [`Store`].
#[derive(Debug, Default)]
pub struct MemoryStore {
    state: Mutex<StoreState>,
}

impl MemoryStore {
    /// The late-write index's one page: entries written in `[floor,
    /// cutoff)` after `position` (a written time, RFC 3339).
    async fn late_page(
        &self,
        position: &str,
        floor: DateTime<Utc>,
        cutoff: DateTime<Utc>,
    ) -> Result<SweepPage> {
        self.page_taken().await;
        let s = lock(&self.state);
        let after = DateTime::parse_from_rfc3339(position)
            .map(|t| t.with_timezone(&Utc))
            .unwrap_or(floor)
            .max(floor);
        let mut page = SweepPage {
            // Never back (a queue backlog may move the cutoff back).
            position: after.max(cutoff).to_rfc3339(),
            reached: cutoff,
            done: true,
            ..SweepPage::default()
        };
        for (written, id) in &s.late_index {
            if *written < after || *written >= cutoff {
                continue;
            }
            if let Some(event) = s.events.get(id).filter(|e| !e.targets.is_empty()) {
                page.events.push(EventHead::of(event));
            }
        }
        Ok(page)
    }

    /// Counts a page and waits its delay (see [`Self::slow_pages`]).
    async fn page_taken(&self) {
        let delay = {
            let mut s = lock(&self.state);
            s.pages_read += 1;
            s.page_delay
        };
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
    }

    pub fn insert_delivery(&self, d: Delivery) {
        lock(&self.state).deliveries.insert(d.id.clone(), d);
    }

    /// Seeds an event; its app is registered for the sweep (as creating
    /// its first endpoint does) at the event's creation if it is not yet.
    pub fn insert_event(&self, e: StoredEvent) {
        let mut s = lock(&self.state);
        s.register_app(&e.event.app_id, e.event.created_at);
        s.put_event(e);
    }

    /// Registers `app` for the sweep at `at`, as creating its first
    /// endpoint does (for events committed without one).
    pub fn register_app(&self, app: &AppId, at: DateTime<Utc>) {
        lock(&self.state).register_app(app, at);
    }

    /// How many times the queue lag was recorded.
    pub fn queue_lag_writes(&self) -> u32 {
        lock(&self.state).queue_lag_writes
    }

    /// Event items read by sweep pages and replay windows so far.
    pub fn event_items_read(&self) -> u64 {
        lock(&self.state).event_items_read
    }

    /// Every delivery as the store answers for it: the written ones, and
    /// the never-attempted ones of listed fan-outs (from their events).
    pub fn deliveries(&self) -> Vec<Delivery> {
        let s = lock(&self.state);
        let mut all: Vec<Delivery> = s.deliveries.values().cloned().collect();
        for event in s.events.values() {
            all.extend(
                event
                    .listed_deliveries()
                    .into_iter()
                    .filter(|d| !s.deliveries.contains_key(&d.id)),
            );
        }
        all
    }

    /// The deliveries that have an item (written by an attempt, a
    /// materialised fan-out or the reconciler).
    pub fn delivery_items(&self) -> Vec<Delivery> {
        lock(&self.state).deliveries.values().cloned().collect()
    }

    pub fn events(&self) -> Vec<StoredEvent> {
        lock(&self.state).events.values().cloned().collect()
    }

    /// Delivery item reads so far: (consistent, eventually consistent).
    pub fn item_reads(&self) -> (u32, u32) {
        lock(&self.state).item_reads
    }

    /// A delivery's item (the in-memory store is always consistent).
    fn read_item(&self, app: &AppId, id: &DeliveryId) -> Result<Option<Delivery>> {
        let mut s = lock(&self.state);
        if s.failing_delivery_reads > 0 {
            s.failing_delivery_reads -= 1;
            return Err(crate::PipelineError::store("injected read failure", true));
        }
        Ok(s.deliveries.get(id).filter(|d| &d.app_id == app).cloned())
    }

    /// The next `n` delivery reads fail with a retryable store error.
    pub fn fail_next_delivery_reads(&self, n: u32) {
        lock(&self.state).failing_delivery_reads = n;
    }

    /// The next `n` endpoint-route queries fail with a retryable store error.
    pub fn fail_next_route_reads(&self, n: u32) {
        lock(&self.state).failing_route_reads = n;
    }

    /// The next `n` commits meet a TransactionConflict.
    /// Right after the next read of a key's head, `head` is committed by
    /// "another request" (the reader's commit then finds it moved).
    pub fn race_next_head_read(&self, head: hookline_core::ordering::KeyHead) {
        lock(&self.state).racing_head = Some(head);
    }

    /// The stored head of `key`.
    pub fn key_head(&self, app: &AppId, key: &str) -> Option<hookline_core::ordering::KeyHead> {
        lock(&self.state)
            .key_heads
            .get(&(app.clone(), key.to_owned()))
            .cloned()
    }

    pub fn contend_next_commits(&self, n: u32) {
        lock(&self.state).contended_commits = n;
    }

    /// When an event's retention was last pushed back (by a restart).
    pub fn retained_from(&self, id: &EventId) -> Option<DateTime<Utc>> {
        lock(&self.state).retained.get(id).copied()
    }

    pub fn endpoint(&self, id: &EndpointId) -> Option<Endpoint> {
        lock(&self.state).endpoints.get(id).cloned()
    }

    /// The sweep reads `id`'s item as unreadable (poison), and reading the
    /// event whole fails as corrupt.
    pub fn poison_event(&self, id: &EventId) {
        lock(&self.state).poison_events.insert(id.clone());
    }

    /// Every sweep and overdue page takes `delay` from now on.
    pub fn slow_pages(&self, delay: Duration) {
        lock(&self.state).page_delay = delay;
    }

    /// Records the table's stream from now on (see [`Self::take_stream`]).
    pub fn record_stream(&self) {
        lock(&self.state).stream.get_or_insert_with(Vec::new);
    }

    /// The stream records since the last call, oldest first.
    pub fn take_stream(&self) -> Vec<crate::dispatch::RecordChange> {
        lock(&self.state)
            .stream
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// What DynamoDB's TTL does, for long simulations: removes every event
    /// created before `before` whose deliveries have all finished, with
    /// their delivery items (an event never outlives its pending work).
    /// Returns how many events were removed.
    pub fn expire_finished_before(&self, before: DateTime<Utc>) -> usize {
        let mut s = lock(&self.state);
        // A delivery item of any kind (a replay's, a materialised fan-out's)
        // keeps its event while it is pending (its retention is extended).
        let busy: std::collections::HashSet<EventId> = s
            .deliveries
            .values()
            .filter(|d| d.status == DeliveryStatus::Pending)
            .map(|d| d.event_id.clone())
            .collect();
        let old: Vec<EventId> = s
            .events
            .values()
            .filter(|e| e.event.created_at < before && e.fanout_remaining.is_empty())
            .filter(|e| !busy.contains(&e.event.id))
            .filter(|e| {
                e.listed_deliveries().iter().all(|d| {
                    s.deliveries
                        .get(&d.id)
                        .is_some_and(|d| d.status != DeliveryStatus::Pending)
                })
            })
            .map(|e| e.event.id.clone())
            .collect();
        for id in &old {
            if let Some(e) = s.events.remove(id) {
                for d in e.listed_deliveries() {
                    s.deliveries.remove(&d.id);
                }
                s.event_order.remove(&order_key(&e.event.app_id, id));
            }
        }
        old.len()
    }

    /// Sweep and overdue pages read so far.
    pub fn pages_read(&self) -> u32 {
        lock(&self.state).pages_read
    }

    /// The committed sweep marks: the late-write index's and every app's.
    pub fn committed_sweep_marks(&self) -> SweepMarks {
        let s = lock(&self.state);
        let mut all = s.sweep_marks.clone();
        for (_, marks) in s.swept_apps.values() {
            all.extend(marks.clone());
        }
        all
    }

    /// How many times a rate limiter was written.
    pub fn limiter_writes(&self) -> u32 {
        lock(&self.state).limiter_writes
    }
}

/// Idempotency records live this long (as in the DynamoDB store).
const IDEMPOTENCY_TTL: chrono::Duration = chrono::Duration::hours(24);

impl Store for MemoryStore {
    async fn list_endpoints(&self, app: &AppId) -> Result<Vec<Endpoint>> {
        Ok(lock(&self.state)
            .endpoints
            .values()
            .filter(|e| &e.app_id == app)
            .cloned()
            .collect())
    }
    async fn list_routes(&self, app: &AppId) -> Result<Vec<EndpointRoute>> {
        let mut s = lock(&self.state);
        if s.failing_route_reads > 0 {
            s.failing_route_reads -= 1;
            return Err(crate::PipelineError::store("injected read failure", true));
        }
        Ok(s.endpoints
            .values()
            .filter(|e| &e.app_id == app)
            .map(EndpointRoute::from)
            .collect())
    }
    async fn get_endpoint(&self, app: &AppId, id: &EndpointId) -> Result<Option<Endpoint>> {
        Ok(lock(&self.state)
            .endpoints
            .get(id)
            .filter(|e| &e.app_id == app)
            .cloned())
    }
    async fn put_endpoint(&self, endpoint: &Endpoint, max_per_app: u32) -> Result<bool> {
        let mut s = lock(&self.state);
        if s.endpoints.contains_key(&endpoint.id) {
            return Err(crate::PipelineError::store("endpoint exists", false));
        }
        let of_app = s
            .endpoints
            .values()
            .filter(|e| e.app_id == endpoint.app_id)
            .count();
        if of_app >= max_per_app as usize {
            return Ok(false);
        }
        s.register_app(&endpoint.app_id, endpoint.created_at);
        s.endpoints.insert(endpoint.id.clone(), endpoint.clone());
        Ok(true)
    }
    async fn update_endpoint(&self, endpoint: &Endpoint, expected_version: u64) -> Result<bool> {
        let mut s = lock(&self.state);
        match s.endpoints.get_mut(&endpoint.id) {
            Some(e) if e.version == expected_version => {
                *e = endpoint.clone();
                Ok(true)
            }
            _ => Ok(false),
        }
    }
    async fn get_event_type(&self, name: &EventType) -> Result<Option<EventTypeDef>> {
        Ok(lock(&self.state).catalog.get(name.as_str()).cloned())
    }
    async fn put_event_type(&self, def: &EventTypeDef) -> Result<()> {
        lock(&self.state)
            .catalog
            .insert(def.name.to_string(), def.clone());
        Ok(())
    }
    async fn delete_event_type(&self, name: &EventType) -> Result<bool> {
        Ok(lock(&self.state).catalog.remove(name.as_str()).is_some())
    }
    async fn list_event_types(
        &self,
        after: Option<&EventType>,
        limit: usize,
    ) -> Result<(Vec<EventTypeDef>, bool)> {
        let s = lock(&self.state);
        let mut page: Vec<EventTypeDef> = s
            .catalog
            .values()
            .filter(|d| after.is_none_or(|a| d.name.as_str() > a.as_str()))
            .take(limit + 1)
            .cloned()
            .collect();
        let more = page.len() > limit;
        page.truncate(limit);
        Ok((page, more))
    }
    async fn event_type_names(&self) -> Result<Vec<String>> {
        Ok(lock(&self.state).catalog.keys().cloned().collect())
    }
    async fn reserve_send_slots(
        &self,
        id: &EndpointId,
        per_second: u32,
        count: u32,
        _likely_busy: bool,
        now: DateTime<Utc>,
    ) -> Result<i64> {
        let mut s = lock(&self.state);
        s.limiter_writes += 1;
        let state = s.limiters.get(id).copied();
        let (slot, next) = hookline_core::rate::reserve(state, per_second, count, now);
        s.limiters.insert(id.clone(), next);
        Ok(slot)
    }
    async fn add_endpoint_stats(
        &self,
        _app: &AppId,
        id: &EndpointId,
        hour: DateTime<Utc>,
        delta: &StatsDelta,
    ) -> Result<()> {
        let mut s = lock(&self.state);
        let (hours, waiting) = s.stats.entry(id.clone()).or_default();
        hours.entry(hour).or_default().merge(delta);
        *waiting += delta.waiting;
        Ok(())
    }
    async fn endpoint_stats(
        &self,
        _app: &AppId,
        id: &EndpointId,
        since: DateTime<Utc>,
    ) -> Result<EndpointHours> {
        let s = lock(&self.state);
        Ok(s.stats.get(id).map_or((Vec::new(), 0), |(hours, waiting)| {
            let from = hookline_core::stats::hour_of(since);
            (
                hours.range(from..).map(|(h, d)| (*h, d.clone())).collect(),
                *waiting,
            )
        }))
    }
    async fn disable_endpoint(
        &self,
        _app: &AppId,
        id: &EndpointId,
        reason: &str,
        expected_version: u64,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        match lock(&self.state).endpoints.get_mut(id) {
            Some(e) if e.version == expected_version => {
                e.disabled = true;
                e.disabled_reason = Some(reason.to_owned());
                e.updated_at = now;
                e.version += 1;
                Ok(true)
            }
            _ => Ok(false),
        }
    }
    async fn set_failing_since(
        &self,
        app: &AppId,
        id: &EndpointId,
        since: Option<DateTime<Utc>>,
        expected_version: u64,
    ) -> Result<bool> {
        let mut s = lock(&self.state);
        match s.endpoints.get_mut(id) {
            Some(e) if &e.app_id == app && e.version == expected_version => {
                e.failing_since = since;
                e.version += 1;
                Ok(true)
            }
            _ => Ok(false),
        }
    }
    async fn set_circuit(
        &self,
        app: &AppId,
        id: &EndpointId,
        version: u64,
        circuit: Option<&hookline_core::circuit::Circuit>,
        expected: Option<DateTime<Utc>>,
    ) -> Result<bool> {
        let mut s = lock(&self.state);
        match s.endpoints.get_mut(id) {
            Some(e)
                if &e.app_id == app
                    && e.version == version
                    && e.circuit.as_ref().map(|c| c.open_until) == expected =>
            {
                e.circuit = circuit.cloned();
                e.unanswered_count = 0;
                e.unanswered_since = None;
                Ok(true)
            }
            _ => Ok(false),
        }
    }
    async fn add_unanswered(
        &self,
        app: &AppId,
        id: &EndpointId,
        version: u64,
        now: DateTime<Utc>,
        run_from: DateTime<Utc>,
    ) -> Result<Option<u32>> {
        let mut s = lock(&self.state);
        match s.endpoints.get_mut(id) {
            Some(e) if &e.app_id == app && e.version == version && e.circuit.is_none() => {
                match e.unanswered_since {
                    Some(since) if since >= run_from => e.unanswered_count += 1,
                    _ => {
                        e.unanswered_since = Some(now);
                        e.unanswered_count = 1;
                    }
                }
                Ok(Some(e.unanswered_count))
            }
            _ => Ok(None),
        }
    }
    async fn take_turn(
        &self,
        app: &AppId,
        id: &EndpointId,
        now: DateTime<Utc>,
        gap: Duration,
    ) -> Result<Option<DateTime<Utc>>> {
        let gap = chrono::TimeDelta::from_std(gap).expect("a turn gap is seconds");
        let mut s = lock(&self.state);
        Ok(s.endpoints
            .get_mut(id)
            .filter(|e| &e.app_id == app)
            .map(|e| {
                let turn = e.turn_next.filter(|next| *next >= now).unwrap_or(now);
                e.turn_next = Some(turn + gap);
                turn
            }))
    }
    async fn clear_unanswered(&self, app: &AppId, id: &EndpointId) -> Result<()> {
        if let Some(e) = lock(&self.state)
            .endpoints
            .get_mut(id)
            .filter(|e| &e.app_id == app)
        {
            e.unanswered_count = 0;
            e.unanswered_since = None;
        }
        Ok(())
    }
    async fn get_idempotency(&self, app: &AppId, key: &str) -> Result<Option<IdempotencyRecord>> {
        Ok(lock(&self.state)
            .idempotency
            .get(&(app.clone(), key.to_owned()))
            .filter(|r| r.created_at + IDEMPOTENCY_TTL > Utc::now())
            .cloned())
    }
    async fn commit_event(&self, new: &NewEvent) -> Result<CommitOutcome> {
        let mut s = lock(&self.state);
        if s.contended_commits > 0 {
            s.contended_commits -= 1;
            return Ok(CommitOutcome::Contended);
        }
        if let Some(r) = &new.idempotency {
            if let Some(existing) = s.idempotency.get(&(r.app_id.clone(), r.key.clone())) {
                if existing.created_at + IDEMPOTENCY_TTL > r.created_at {
                    return Ok(CommitOutcome::IdempotencyKeyTaken(existing.clone()));
                }
            }
        }
        if let Some(moved) = &new.key_head {
            let at = (new.event.app_id.clone(), moved.key.clone());
            if s.key_heads.get(&at).map_or(0, |h| h.version) != moved.from {
                return Ok(CommitOutcome::OrderMoved);
            }
            s.key_heads.insert(at, moved.head.clone());
        }
        if let Some(r) = &new.idempotency {
            s.idempotency
                .insert((r.app_id.clone(), r.key.clone()), r.clone());
        }
        let stored = StoredEvent {
            event: new.event.clone(),
            targets: new.targets.clone(),
            fanout_remaining: new.fanout_remaining.clone(),
            fanout_version: 0,
        };
        if !stored.targets.is_empty() {
            s.streamed(
                true,
                crate::dispatch::StreamChange::ListedFanout(Box::new(stored.clone())),
            );
        } else if !stored.fanout_remaining.is_empty() {
            s.streamed(
                true,
                crate::dispatch::StreamChange::EventFanout(
                    stored.event.app_id.clone(),
                    stored.event.id.clone(),
                ),
            );
        }
        s.put_event(stored);
        for d in &new.deliveries {
            s.deliveries.insert(d.id.clone(), d.clone());
            s.delivery_streamed(true, d);
        }
        Ok(CommitOutcome::Committed)
    }
    async fn get_event(&self, app: &AppId, id: &EventId) -> Result<Option<StoredEvent>> {
        let s = lock(&self.state);
        if s.poison_events.contains(id) {
            return Err(crate::PipelineError::Corrupt(format!("event {id}: poison")));
        }
        Ok(s.events.get(id).filter(|e| &e.event.app_id == app).cloned())
    }
    async fn get_events(&self, ids: &[(AppId, EventId)]) -> Result<Vec<StoredEvent>> {
        let state = lock(&self.state);
        Ok(ids
            .iter()
            .filter_map(|(app, id)| state.events.get(id).filter(|e| &e.event.app_id == app))
            .cloned()
            .collect())
    }
    async fn materialise_fanout(
        &self,
        app: &AppId,
        event_id: &EventId,
        version: u32,
        deliveries: &[Delivery],
        remaining: &[EndpointId],
    ) -> Result<bool> {
        let mut s = lock(&self.state);
        let Some(event) = s
            .events
            .get_mut(event_id)
            .filter(|e| &e.event.app_id == app)
        else {
            return Ok(false);
        };
        if event.fanout_version != version {
            return Ok(false);
        }
        event.fanout_version += 1;
        event.fanout_remaining = remaining.to_vec();
        for d in deliveries {
            if !s.deliveries.contains_key(&d.id) {
                s.deliveries.insert(d.id.clone(), d.clone());
                s.delivery_streamed(true, d);
            }
        }
        if !remaining.is_empty() {
            s.streamed(
                false,
                crate::dispatch::StreamChange::EventFanout(app.clone(), event_id.clone()),
            );
        }
        Ok(true)
    }
    async fn list_deliveries(&self, app: &AppId, q: &DeliveryQuery) -> Result<DeliveryPage> {
        let s = lock(&self.state);
        let mut items: Vec<Delivery> = s
            .deliveries
            .values()
            .filter(|d| &d.app_id == app)
            .filter(|d| q.status.is_none_or(|st| d.status == st))
            .filter(|d| q.endpoint_id.as_ref().is_none_or(|e| &d.endpoint_id == e))
            .filter(|d| {
                q.event_type
                    .as_deref()
                    .is_none_or(|t| d.event_type.as_str() == t)
            })
            .filter(|d| q.admits_id(&d.id))
            .cloned()
            .collect();
        items.sort_by(|a, b| b.id.cmp(&a.id));
        let more = items.len() > q.limit;
        items.truncate(q.limit);
        let next_cursor = if more {
            items.last().map(|d| d.id.clone())
        } else {
            None
        };
        Ok(DeliveryPage { items, next_cursor })
    }
    async fn delete_endpoint(&self, app: &AppId, id: &EndpointId) -> Result<bool> {
        let mut s = lock(&self.state);
        let found = s.endpoints.get(id).is_some_and(|e| &e.app_id == app);
        if found {
            s.endpoints.remove(id);
        }
        Ok(found)
    }
    async fn get_delivery_item(&self, app: &AppId, id: &DeliveryId) -> Result<Option<Delivery>> {
        lock(&self.state).item_reads.0 += 1;
        self.read_item(app, id)
    }
    async fn get_key_head(
        &self,
        app: &AppId,
        key: &str,
    ) -> Result<hookline_core::ordering::KeyHead> {
        let mut s = lock(&self.state);
        let at = (app.clone(), key.to_owned());
        let read = s.key_heads.get(&at).cloned().unwrap_or_default();
        if let Some(racing) = s.racing_head.take() {
            s.key_heads.insert(at, racing);
        }
        Ok(read)
    }
    async fn register_successor(
        &self,
        app: &AppId,
        predecessor: &DeliveryId,
        successor: &DeliveryId,
    ) -> Result<bool> {
        let mut s = lock(&self.state);
        let pending = s.deliveries.get(predecessor).is_some_and(|p| {
            &p.app_id == app && p.version > 0 && p.status == DeliveryStatus::Pending && !p.released
        });
        if pending {
            s.wakes.insert(predecessor.clone(), successor.clone());
        }
        Ok(pending)
    }
    async fn event_exists(&self, app: &AppId, id: &EventId) -> Result<bool> {
        let s = lock(&self.state);
        Ok(s.events.get(id).is_some_and(|e| &e.event.app_id == app))
    }
    async fn peek_delivery_item(&self, app: &AppId, id: &DeliveryId) -> Result<Option<Delivery>> {
        lock(&self.state).item_reads.1 += 1;
        self.read_item(app, id)
    }
    async fn get_delivery(&self, app: &AppId, id: &DeliveryId) -> Result<Option<Delivery>> {
        let mut s = lock(&self.state);
        if s.failing_delivery_reads > 0 {
            s.failing_delivery_reads -= 1;
            return Err(crate::PipelineError::store("injected read failure", true));
        }
        if let Some(d) = s.deliveries.get(id) {
            return Ok(Some(d.clone()).filter(|d| &d.app_id == app));
        }
        Ok(id.fanout_origin().and_then(|(event, position)| {
            s.events
                .get(&event)
                .and_then(|e| e.listed_delivery(position))
                .filter(|d| &d.id == id && &d.app_id == app)
        }))
    }
    async fn update_delivery(&self, delivery: &Delivery, expected_version: u64) -> Result<bool> {
        let mut s = lock(&self.state);
        match s.deliveries.get_mut(&delivery.id) {
            Some(d) if d.version == expected_version => {
                *d = delivery.clone();
                s.delivery_streamed(false, delivery);
                Ok(true)
            }
            None if expected_version == 0 => {
                s.deliveries.insert(delivery.id.clone(), delivery.clone());
                s.delivery_streamed(true, delivery);
                Ok(true)
            }
            _ => Ok(false),
        }
    }
    async fn extend_event_retention(
        &self,
        _app: &AppId,
        id: &EventId,
        restarted_at: DateTime<Utc>,
    ) -> Result<()> {
        lock(&self.state).retained.insert(id.clone(), restarted_at);
        Ok(())
    }
    async fn record_queue_lag(&self, lag: &QueueLag) -> Result<()> {
        let mut s = lock(&self.state);
        s.queue_lag = Some(*lag);
        s.queue_lag_writes += 1;
        Ok(())
    }
    async fn queue_lag(&self) -> Result<Option<QueueLag>> {
        Ok(lock(&self.state).queue_lag)
    }
    fn overdue_shards(&self) -> u32 {
        MEMORY_SHARDS
    }
    async fn overdue_page(
        &self,
        shard: u32,
        cutoff: DateTime<Utc>,
        position: &str,
    ) -> Result<OverduePage> {
        self.page_taken().await;
        let s = lock(&self.state);
        let mine = |id: &str| memory_shard(id, MEMORY_SHARDS) == shard;
        let mut due: Vec<(String, DateTime<Utc>, Overdue)> = s
            .deliveries
            .values()
            .filter(|d| d.status == DeliveryStatus::Pending && mine(d.id.as_str()))
            .map(|d| {
                let at = d.next_attempt_at.unwrap_or(d.updated_at);
                (
                    due_position(at, d.id.as_str()),
                    at,
                    Overdue::Delivery(d.app_id.clone(), d.id.clone()),
                )
            })
            .chain(
                s.events
                    .values()
                    .filter(|e| !e.fanout_remaining.is_empty() && mine(e.event.id.as_str()))
                    .map(|e| {
                        (
                            due_position(e.event.created_at, e.event.id.as_str()),
                            e.event.created_at,
                            Overdue::Event(e.event.app_id.clone(), e.event.id.clone()),
                        )
                    }),
            )
            .chain(
                s.replays
                    .values()
                    .filter(|r| !r.complete && mine(r.id.as_str()))
                    .map(|r| {
                        (
                            due_position(r.updated_at, r.id.as_str()),
                            r.updated_at,
                            Overdue::Replay(r.id.clone()),
                        )
                    }),
            )
            .filter(|(key, at, _)| *at < cutoff && key.as_str() > position)
            .collect();
        due.sort_by(|a, b| a.0.cmp(&b.0));
        let done = due.len() <= OVERDUE_PAGE_ENTRIES;
        due.truncate(OVERDUE_PAGE_ENTRIES);
        let position = due
            .last()
            .map_or_else(|| position.to_owned(), |(key, _, _)| key.clone());
        Ok(OverduePage {
            entries: due.into_iter().map(|(_, at, o)| (at, o)).collect(),
            unreadable: 0,
            position,
            done,
        })
    }
    fn event_shards(&self) -> u32 {
        MEMORY_SHARDS
    }
    fn late_shards(&self) -> u32 {
        1
    }
    async fn swept_apps(&self, position: &str) -> Result<SweptAppsPage> {
        self.page_taken().await;
        let s = lock(&self.state);
        let mut page = SweptAppsPage::default();
        for (app, (registered_at, marks)) in s
            .swept_apps
            .iter()
            .filter(|(app, _)| position.is_empty() || app.as_str() > position)
        {
            if page.apps.len() == SWEPT_APPS_PAGE {
                return Ok(page);
            }
            page.position = app.to_string();
            page.apps.push(SweptApp {
                app_id: app.clone(),
                registered_at: *registered_at,
                marks: marks.clone(),
            });
        }
        page.done = true;
        Ok(page)
    }
    async fn save_app_sweep_marks(&self, app: &AppId, marks: &SweepMarks) -> Result<()> {
        let mut s = lock(&self.state);
        let Some(entry) = s.swept_apps.get_mut(app) else {
            return Err(crate::PipelineError::Corrupt(format!(
                "sweep marks of an unregistered app {app}"
            )));
        };
        entry.1 = marks.clone();
        Ok(())
    }
    async fn index_late_event(&self, event: &EventHead, written_at: DateTime<Utc>) -> Result<()> {
        let mut s = lock(&self.state);
        if !s.late_index.iter().any(|(_, id)| *id == event.id) {
            s.late_index.insert((written_at, event.id.clone()));
        }
        Ok(())
    }
    async fn sweep_page(
        &self,
        source: &SweepSource,
        position: &str,
        floor: DateTime<Utc>,
        cutoff: DateTime<Utc>,
    ) -> Result<SweepPage> {
        let (app, shard) = match source {
            SweepSource::Days(app, shard) => (app.clone(), *shard),
            SweepSource::Late(0) => return self.late_page(position, floor, cutoff).await,
            SweepSource::Late(_) => {
                return Err(crate::PipelineError::Corrupt(format!(
                    "no sweep source {source} in memory"
                )))
            }
        };
        self.page_taken().await;
        let mut s = lock(&self.state);
        let s = &mut *s;
        let floor_id = EventId::time_floor(floor);
        let below = EventId::time_floor(cutoff);
        let after = match (!position.is_empty())
            .then(|| EventId::parse(position))
            .transpose()?
        {
            Some(id) if id > floor_id => id,
            _ => floor_id,
        };
        let mut page = SweepPage::default();
        if after >= below {
            // Past the cutoff (a queue backlog moved it back): the mark
            // stays where it is.
            page.position = after.to_string();
            page.reached = cutoff;
            page.done = true;
            return Ok(page);
        }
        let mut read = 0;
        let mut last = None;
        for (_, _, id) in s.event_order.range((
            std::ops::Bound::Excluded((app.clone(), shard, after)),
            std::ops::Bound::Excluded((app.clone(), shard, below.clone())),
        )) {
            if read >= PAGE_BYTES {
                break;
            }
            let Some(event) = s.events.get(id) else {
                continue;
            };
            s.event_items_read += 1;
            read += event_item_bytes(event);
            last = Some(event);
            if s.poison_events.contains(id) {
                page.unreadable.push(id.to_string());
            } else if !event.targets.is_empty() {
                page.events.push(EventHead::of(event));
            }
        }
        match last {
            Some(event) if read >= PAGE_BYTES => {
                page.position = event.event.id.to_string();
                page.reached = event.event.created_at;
            }
            _ => {
                page.position = below.to_string();
                page.reached = cutoff;
                page.done = true;
            }
        }
        Ok(page)
    }
    async fn sweep_marks(&self) -> Result<SweepMarks> {
        Ok(lock(&self.state).sweep_marks.clone())
    }
    async fn save_sweep_marks(&self, marks: &SweepMarks) -> Result<()> {
        lock(&self.state).sweep_marks = marks.clone();
        Ok(())
    }
    async fn delivery_items_among(
        &self,
        deliveries: &[(AppId, DeliveryId)],
    ) -> Result<Vec<DeliveryId>> {
        let s = lock(&self.state);
        Ok(deliveries
            .iter()
            .filter(|(app, id)| s.deliveries.get(id).is_some_and(|d| &d.app_id == app))
            .map(|(_, id)| id.clone())
            .collect())
    }
    async fn create_delivery(&self, delivery: &Delivery) -> Result<bool> {
        let mut s = lock(&self.state);
        if s.deliveries.contains_key(&delivery.id) {
            return Ok(false);
        }
        s.deliveries.insert(delivery.id.clone(), delivery.clone());
        s.delivery_streamed(true, delivery);
        Ok(true)
    }
    async fn events_in_window(
        &self,
        app: &AppId,
        since: DateTime<Utc>,
        until: DateTime<Utc>,
        position: &str,
        limit: usize,
    ) -> Result<EventWindow> {
        let mut s = lock(&self.state);
        let s = &mut *s;
        let after = (!position.is_empty())
            .then(|| EventId::parse(position))
            .transpose()?;
        // The app's partitions only, as the DynamoDB store reads them.
        let mut events: Vec<StoredEvent> = s
            .event_order
            .iter()
            .filter(|(owner, _, _)| owner == app)
            .filter_map(|(_, _, id)| s.events.get(id))
            .filter(|e| e.fanout_remaining.is_empty())
            .filter(|e| e.event.created_at >= since && e.event.created_at < until)
            .filter(|e| after.as_ref().is_none_or(|a| e.event.id > *a))
            .cloned()
            .collect();
        events.sort_by(|a, b| a.event.id.cmp(&b.event.id));
        let complete = events.len() <= limit;
        events.truncate(limit);
        s.event_items_read += events.len() as u64;
        let position = events
            .last()
            .map_or_else(|| position.to_owned(), |e| e.event.id.to_string());
        Ok(EventWindow {
            events,
            position,
            complete,
        })
    }
    async fn replay_slot(&self, _app: &AppId, endpoint: &EndpointId) -> Result<Option<ReplaySlot>> {
        Ok(lock(&self.state).replay_slots.get(endpoint).cloned())
    }
    async fn take_replay_slot(
        &self,
        _app: &AppId,
        endpoint: &EndpointId,
        replay: &ReplayId,
        held_by: Option<&ReplayId>,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        let mut s = lock(&self.state);
        if s.replay_slots.get(endpoint).map(|slot| &slot.replay_id) != held_by {
            return Ok(false);
        }
        s.replay_slots.insert(
            endpoint.clone(),
            ReplaySlot {
                replay_id: replay.clone(),
                taken_at: now,
            },
        );
        Ok(true)
    }
    async fn get_replay(&self, id: &ReplayId) -> Result<Option<Replay>> {
        Ok(lock(&self.state).replays.get(id).cloned())
    }
    async fn put_replay(&self, replay: &Replay, expected_version: Option<u64>) -> Result<bool> {
        let mut s = lock(&self.state);
        let current = s.replays.get(&replay.id).map(|r| r.version);
        if current != expected_version {
            return Ok(false);
        }
        s.replays.insert(replay.id.clone(), replay.clone());
        if !replay.complete {
            s.streamed(
                expected_version.is_none(),
                crate::dispatch::StreamChange::RunningReplay(replay.id.clone()),
            );
        }
        Ok(true)
    }
    async fn put_api_key(&self, key: &ApiKey) -> Result<()> {
        lock(&self.state)
            .api_keys
            .insert(key.id.clone(), key.clone());
        Ok(())
    }
    async fn get_api_key(&self, id: &ApiKeyId) -> Result<Option<ApiKey>> {
        Ok(lock(&self.state).api_keys.get(id).cloned())
    }
    async fn list_api_keys(&self, app: &AppId) -> Result<Vec<ApiKey>> {
        let mut keys: Vec<ApiKey> = lock(&self.state)
            .api_keys
            .values()
            .filter(|k| &k.app_id == app)
            .cloned()
            .collect();
        keys.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(keys)
    }
    async fn delete_api_key(&self, app: &AppId, id: &ApiKeyId) -> Result<bool> {
        let mut s = lock(&self.state);
        let found = s.api_keys.get(id).is_some_and(|k| &k.app_id == app);
        if found {
            s.api_keys.remove(id);
        }
        Ok(found)
    }
}

/// An in-memory [`Queue`]: records sends, serves a DLQ.
#[derive(Debug, Default)]
pub struct MemoryQueue {
    pub sent: Mutex<Vec<(DeliveryMessage, i32)>>,
    pub dlq: Mutex<Vec<(String, String)>>,
    next_receipt: Mutex<u64>,
    /// Messages for these deliveries are refused (a partial batch failure).
    refused: Mutex<std::collections::HashSet<DeliveryId>>,
    /// Short polls (no wait) answer empty this many times even when messages
    /// wait: SQS's short poll samples only some of its servers.
    empty_short_polls: Mutex<u32>,
}

impl MemoryQueue {
    pub fn sent(&self) -> Vec<(DeliveryMessage, i32)> {
        lock(&self.sent).clone()
    }
    pub fn dlq_bodies(&self) -> Vec<String> {
        lock(&self.dlq).iter().map(|(_, b)| b.clone()).collect()
    }
    /// Refuses the next messages for `id`.
    pub fn refuse(&self, id: &DeliveryId) {
        lock(&self.refused).insert(id.clone());
    }
    /// The next `n` short polls of the DLQ answer empty.
    pub fn empty_short_polls(&self, n: u32) {
        *lock(&self.empty_short_polls) = n;
    }
    pub fn push_dlq(&self, body: String) {
        let mut n = lock(&self.next_receipt);
        *n += 1;
        lock(&self.dlq).push((format!("r{n}"), body));
    }
}

impl Queue for MemoryQueue {
    async fn send_deliveries(&self, messages: &[(DeliveryMessage, i32)]) -> Result<Vec<usize>> {
        let refused = lock(&self.refused).clone();
        let mut failed = Vec::new();
        for (i, m) in messages.iter().enumerate() {
            if refused.contains(&m.0.delivery_id) {
                failed.push(i);
            } else {
                lock(&self.sent).push(m.clone());
            }
        }
        Ok(failed)
    }
    async fn send_to_dlq(&self, message: &DeliveryMessage) -> Result<()> {
        self.push_dlq(message.to_json());
        Ok(())
    }
    async fn receive_dlq(
        &self,
        max: i32,
        _visibility: Duration,
        wait: Duration,
    ) -> Result<Vec<DlqEntry>> {
        if wait.is_zero() {
            let mut empty = lock(&self.empty_short_polls);
            if *empty > 0 {
                *empty -= 1;
                return Ok(Vec::new());
            }
        }
        // A received message is hidden by prefixing its receipt handle with `h`
        // until it is deleted or released.
        let mut dlq = lock(&self.dlq);
        let mut out = Vec::new();
        for (receipt, body) in dlq.iter_mut() {
            if out.len() >= usize::try_from(max).unwrap_or(0) {
                break;
            }
            if !receipt.starts_with('h') {
                receipt.insert(0, 'h');
                out.push(DlqEntry {
                    receipt_handle: receipt.clone(),
                    body: body.clone(),
                });
            }
        }
        Ok(out)
    }
    async fn delete_dlq(&self, receipt_handles: &[String]) -> Result<()> {
        lock(&self.dlq).retain(|(r, _)| !receipt_handles.contains(r));
        Ok(())
    }
    async fn release_dlq(&self, receipt_handles: &[String]) -> Result<()> {
        for (r, _) in lock(&self.dlq).iter_mut() {
            if receipt_handles.contains(r) {
                r.remove(0);
            }
        }
        Ok(())
    }
    async fn dlq_depth(&self) -> Result<u64> {
        Ok(lock(&self.dlq).len() as u64)
    }
}

/// A request the [`ScriptedSender`] saw: URL, headers (the endpoint's own,
/// then the signed ones), body.
pub type SentRequest = (String, Vec<(String, String)>, Vec<u8>);

/// A [`Sender`] answering from a script (then the fallback), recording requests.
#[derive(Debug)]
pub struct ScriptedSender {
    script: Mutex<Vec<SendResult>>,
    fallback: SendResult,
    pub requests: Mutex<Vec<SentRequest>>,
}

impl ScriptedSender {
    pub fn new(script: Vec<SendResult>, fallback: SendResult) -> Self {
        Self {
            script: Mutex::new(script.into_iter().rev().collect()),
            fallback,
            requests: Mutex::new(Vec::new()),
        }
    }

    /// Answers `status` with no body.
    pub fn status(status: u16) -> SendResult {
        SendResult {
            status: Some(status),
            body_prefix: Some(Vec::new()),
            latency: Duration::from_millis(5),
            ..SendResult::default()
        }
    }
}

impl Sender for ScriptedSender {
    async fn send(&self, request: OutgoingRequest<'_>) -> SendResult {
        lock(&self.requests).push((
            request.url.to_owned(),
            request
                .custom_headers
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .chain(
                    request
                        .headers
                        .iter()
                        .map(|(k, v)| (k.to_owned(), v.to_owned())),
                )
                .collect(),
            request.body.to_vec(),
        ));
        lock(&self.script)
            .pop()
            .unwrap_or_else(|| self.fallback.clone())
    }
}
