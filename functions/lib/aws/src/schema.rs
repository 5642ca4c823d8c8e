//! The single-table design.
//!
//! | item | PK | SK | GSI1 (by endpoint) | GSI2 (by status) |
//! |---|---|---|---|---|
//! | endpoint | `APP#{app}` | `EP#{endpoint}` | | |
//! | event (with its listed fan-out) | `EVD#{app}#{creation day}#{shard}` | `{event}` | | |
//! | app registered for the sweep, with its marks | `SWEPT` | `{app}` | | |
//! | delivery | `DLA#{app}#{shard}` | `{delivery}` | | `ST#{app}#failed#{shard}` / `{delivery}`, failed ones only |
//! | idempotency key | `IDEM#{app}#{key}` | `IDEM` | | |
//! | API key (hash only) | `KEY#{key id}` | `KEY` | `KEYS#{app}` / `{key id}` | |
//! | endpoint stats, per hour | `STATS#{app}#{endpoint}` | `H#{hour}` | | |
//! | endpoint's waiting gauge | `STATS#{app}#{endpoint}` | `WAITING` | | |
//! | replay of an endpoint's missed events | `RPL#{replay}` | `RPL` | | |
//! | an endpoint's replay slot (its last replay) | `RPLSLOT#{endpoint}` | `RPLSLOT` | | |
//! | event-type catalog entry | `CATALOG` | `ET#{name}` | | |
//! | the table's storage format | `FORMAT` | `FORMAT` | | |
//! | the reconciler's late-index marks | `RECONCILER` | `SWEEP` | | |
//! | how late deliver receives due messages | `QUEUE` | `LAG` | | |
//!
//! An event lists its fan-out (`targets`, up to `FANOUT_LIST_MAX` endpoints):
//! its deliveries have no item until their first attempt's outcome writes one
//! (their ids, `DeliveryId::for_fanout`, name the event and the position, so
//! a read by id falls back to the event). Accepting an event is one item.
//! Its body is stored compressed (`body_z`, raw DEFLATE) when that is
//! smaller, as text (`body`) otherwise: writes are billed per started KB.
//!
//! An app's deliveries are kept in the table itself, in
//! [`DELIVERY_SHARDS`] partitions sorted by delivery id (time): the list of
//! an app's deliveries, by endpoint, event type or time, is a query of
//! those partitions (filtered on the item's own attributes), with no index
//! copy per delivery. Only failed deliveries (what an operator looks for,
//! kept for the whole retention) have a copy in the by-status index GSI2,
//! so the list of failures is read from the index, not filtered out of
//! everything delivered; pending ones are mostly among an app's newest
//! items and are listed from its partitions (see [`status_index_key`]: a copy would
//! be written and removed again for every delivery that needs a retry).
//!
//! Events are kept by app and time in the table itself: each app's events
//! of a creation day are spread over [`EVENT_SHARDS`] partitions sorted by
//! event id (which starts with the creation time), so a replay reads only
//! its own app's days, the reconciler's sweep reads each registered app's
//! days past its marks, and no index entry is written per event
//! ([`event_key`]). An app is registered (`SWEPT` / `{app}`) when its first
//! endpoint is created, before it: only an app with endpoints has events
//! with a listed fan-out.
//!
//! GSI3 (KEYS_ONLY, sparse) holds these key spaces:
//! - the overdue index `DUE#{shard}` / `{due time}#{id}`, present only on
//!   pending delivery items (due at `next_attempt_at`) and on events with a
//!   deferred fan-out left (due at creation); finished work leaves it;
//! - the event time index `SWEEP#{shard}` / `{written time}#{app}#{event id}`
//!   on events with a listed fan-out written after their creation day's
//!   partition may have been swept (an event completed after its request
//!   stopped); the reconciler sweeps it past its mark too;
//! - running replays (`RPL#{replay}` / `RPL`) are in the overdue index, due
//!   when last advanced, so a stalled one is continued by the reconciler.
//!
//! The reconciler reads only entries due before its cutoff (and past its
//! marks): a quiet system costs [`DUE_SHARDS`] empty query pages per key
//! space and [`EVENT_SHARDS`] per day partition swept, per run.
//!
//! Retention: a pending delivery has no `expires_at` (it can never expire
//! while due); a finished one expires `retention` after it finished. An
//! event expires `retention` after creation, pushed back when one of its
//! deliveries is restarted by hand; settings refuse a retention shorter than
//! the longest retry window.
//! Deliveries are spread over their app's [`DELIVERY_SHARDS`] partitions,
//! events over their day's [`EVENT_SHARDS`] (no hot partition per app). The
//! GSI partition keys are sharded by a hash of the delivery id into
//! [`SHARDS`] so one busy endpoint or app spreads its writes; a list query
//! reads the shards and merges by the (time-ordered) delivery id. No request
//! path scans. `expires_at` (epoch seconds) is the TTL attribute; `kind` tells
//! item types apart (the stream filter uses it).

use chrono::{DateTime, Utc};
use hookline_core::apikey::ApiKey;
use hookline_core::ids::{ApiKeyId, AppId, DeliveryId, EndpointId, EventId, ReplayId};
use hookline_core::model::{Delivery, DeliveryStatus, Endpoint, Event};
use hookline_core::ordering::{KeyHead, KeyTail};
use hookline_pipeline::dispatch::StreamChange;
use hookline_pipeline::ports::{
    IdempotencyRecord, QueueLag, ReplaySlot, StoredEvent, SweepMark, SweepMarks, SweepSource,
    SweptApp,
};
use hookline_pipeline::replay::Replay;
use hookline_pipeline::PipelineError;
use serde::{Deserialize, Serialize};
use serde_dynamo::Item;

use crate::error::corrupt;

pub const PK: &str = "PK";
pub const SK: &str = "SK";
pub const GSI_BY_ENDPOINT: &str = "GSI1";
pub const GSI_BY_STATUS: &str = "GSI2";
pub const GSI_OVERDUE: &str = "GSI3";
/// Shards of the overdue index's partition key (spreads pending writes).
pub const DUE_SHARDS: u32 = 8;
/// Shards of each GSI partition key.
pub const SHARDS: u32 = 4;
/// Idempotency keys are remembered this long.
pub const IDEMPOTENCY_TTL_SECS: i64 = 24 * 3600;

pub const KIND_ENDPOINT: &str = "endpoint";
pub const KIND_EVENT: &str = "event";
pub const KIND_DELIVERY: &str = "delivery";
pub const KIND_IDEMPOTENCY: &str = "idempotency";
pub const KIND_API_KEY: &str = "api_key";
pub const KIND_REPLAY: &str = "replay";
pub const KIND_KEY_HEAD: &str = "okey";
/// The sort key of an ordering key's head.
pub const KEY_HEAD_SK: &str = "OKEY";

/// The partition of ordering key `key`'s head (an app id has no `#`, so
/// the first one after the prefix ends it).
pub fn key_head_pk(app: &AppId, key: &str) -> String {
    format!("OKEY#{app}#{key}")
}

pub fn app_pk(app: &AppId) -> String {
    format!("APP#{app}")
}
pub fn endpoint_sk(id: &EndpointId) -> String {
    format!("EP#{id}")
}
/// Partitions of each app's events of a day (see [`event_key`]): a
/// partition key takes about 1000 write units a second, so one app's
/// events (of up to 1 KB) throttle at about 8000 a second.
pub const EVENT_SHARDS: u32 = 8;

/// Where an event item is: its app's partition of its creation day and its
/// shard (`EVD#{app}#{yyyymmdd}#{shard}`), sorted by its id (which starts
/// with its creation time). Every event of an app's day is in
/// [`EVENT_SHARDS`] partitions in time order, so the reconciler's sweep
/// and replays read an app's events by time from the table itself, with
/// no index entry written per event.
pub fn event_key(app: &AppId, id: &EventId) -> (String, String) {
    (
        event_day_pk(app, id.created_at(), hash_mod(id.as_str(), EVENT_SHARDS)),
        id.as_str().to_owned(),
    )
}

/// The partition of `app`'s events created on `at`'s day (UTC) in `shard`.
pub fn event_day_pk(app: &AppId, at: DateTime<Utc>, shard: u32) -> String {
    format!("EVD#{app}#{}#{shard}", at.format("%Y%m%d"))
}

/// The app an event partition key names (app ids have no `#`).
pub fn app_of_event_pk(pk: &str) -> Option<AppId> {
    let (app, _) = pk.strip_prefix("EVD#")?.split_once('#')?;
    AppId::parse(app).ok()
}

/// The apps the sweep reads: one item per app (`SWEPT` / `{app}`) with
/// `registered_at` and its partitions' marks (`marks`, by shard).
pub const SWEPT_APPS_PK: &str = "SWEPT";
pub const KIND_SWEPT_APP: &str = "swept_app";

/// The start of `at`'s day (UTC): [`event_day_pk`] partitions follow one
/// another a day apart.
pub fn day_start(at: DateTime<Utc>) -> DateTime<Utc> {
    at.date_naive()
        .and_hms_opt(0, 0, 0)
        .map(|t| t.and_utc())
        .unwrap_or(at)
}

/// Partitions of each app's deliveries (see [`delivery_key`]): about 8000
/// delivery writes a second per app before one throttles.
pub const DELIVERY_SHARDS: u32 = 8;
// A listed delivery is in the delivery shard of its event's number.
const _: () = assert!(DELIVERY_SHARDS == EVENT_SHARDS);

/// Where a delivery item is: one of its app's partitions
/// (`DLA#{app}#{shard}`, by a hash of the id), sorted by its id (which
/// starts with its creation time), so the app's delivery lists are queries
/// of the table and no index copy is written per delivery.
pub fn delivery_key(app: &AppId, id: &DeliveryId) -> (String, String) {
    (
        app_deliveries_pk(app, delivery_shard(id)),
        id.as_str().to_owned(),
    )
}

/// Which of its app's partitions a delivery is in: the shard of the event
/// id its bits name ([`DeliveryId::fanout_origin`], the id itself for any
/// other delivery), so a listed fan-out's deliveries sit in the same shard
/// number as their event, in the same time order. The reconciler's sweep
/// checks a page of one event shard against one range of each app's
/// delivery partition, dense with the deliveries it asks for, instead of
/// a key each (DynamoDB bills a range by the KB read, a key by the item).
pub fn delivery_shard(id: &DeliveryId) -> u32 {
    match id.fanout_origin() {
        Some((event, _)) => hash_mod(event.as_str(), DELIVERY_SHARDS),
        None => hash_mod(id.as_str(), DELIVERY_SHARDS),
    }
}

/// The partition `shard` of an app's deliveries.
pub fn app_deliveries_pk(app: &AppId, shard: u32) -> String {
    format!("DLA#{app}#{shard}")
}

/// The storage format this build reads and writes. The table carries it
/// in its format item ([`FORMAT_PK`]); a function that finds another one
/// refuses to start ([`PipelineError::Format`]): nothing has a migration
/// path or reads older keys. Bump it with every change of an item's key
/// or shape.
pub const TABLE_FORMAT: u32 = 3;
pub const FORMAT_PK: &str = "FORMAT";
pub const FORMAT_SK: &str = "FORMAT";

#[derive(Serialize, Deserialize)]
struct FormatItem {
    #[serde(rename = "PK")]
    pk: String,
    #[serde(rename = "SK")]
    sk: String,
    kind: String,
    format: u32,
}

/// The format item of a table of `format`.
pub fn format_item(format: u32) -> Result<Item, PipelineError> {
    to_item(
        "format item",
        &FormatItem {
            pk: FORMAT_PK.to_owned(),
            sk: FORMAT_SK.to_owned(),
            kind: "format".to_owned(),
            format,
        },
    )
}

/// Whether `item` is the table's format item.
pub fn is_format_item(item: &Item) -> bool {
    matches!(item.get(PK), Some(serde_dynamo::AttributeValue::S(pk)) if pk == FORMAT_PK)
}

/// Checks a format item against [`TABLE_FORMAT`].
pub fn check_format_item(item: Item) -> Result<(), PipelineError> {
    let row: FormatItem = serde_dynamo::from_item(item).map_err(|e| corrupt("format item", e))?;
    if row.format == TABLE_FORMAT {
        Ok(())
    } else {
        Err(PipelineError::Format {
            table: row.format,
            build: TABLE_FORMAT,
        })
    }
}

/// The delivery a table key names, with its app.
pub fn delivery_of_key(pk: &str, sk: &str) -> Option<(AppId, DeliveryId)> {
    let rest = pk.strip_prefix("DLA#")?;
    let (app, _shard) = rest.rsplit_once('#')?;
    Some((AppId::parse(app).ok()?, DeliveryId::parse(sk).ok()?))
}

/// The event (and its app) a table key names.
pub fn event_id_of_key(pk: &str, sk: &str) -> Option<(AppId, EventId)> {
    Some((app_of_event_pk(pk)?, EventId::parse(sk).ok()?))
}
pub fn idempotency_pk(app: &AppId, key: &str) -> String {
    format!("IDEM#{app}#{key}")
}
pub const IDEMPOTENCY_SK: &str = "IDEM";
pub fn replay_pk(id: &ReplayId) -> String {
    format!("RPL#{id}")
}
pub const REPLAY_SK: &str = "RPL";
pub fn replay_slot_pk(endpoint: &EndpointId) -> String {
    format!("RPLSLOT#{endpoint}")
}
pub const REPLAY_SLOT_SK: &str = "RPLSLOT";

/// An endpoint's replay slot; it expires with the retention of the replay
/// it names.
pub fn replay_slot_item(
    app: &AppId,
    endpoint: &EndpointId,
    slot: &ReplaySlot,
    retention: std::time::Duration,
) -> Item {
    use serde_dynamo::AttributeValue as Value;
    std::collections::HashMap::from([
        (PK.to_owned(), Value::S(replay_slot_pk(endpoint))),
        (SK.to_owned(), Value::S(REPLAY_SLOT_SK.to_owned())),
        ("kind".to_owned(), Value::S("replay_slot".to_owned())),
        ("app_id".to_owned(), Value::S(app.to_string())),
        ("replay_id".to_owned(), Value::S(slot.replay_id.to_string())),
        ("taken_at".to_owned(), Value::S(slot.taken_at.to_rfc3339())),
        (
            "expires_at".to_owned(),
            Value::N(epoch_after(slot.taken_at, retention).to_string()),
        ),
    ])
    .into()
}

pub fn replay_slot_from_item(item: Item) -> Result<ReplaySlot, PipelineError> {
    #[derive(Deserialize)]
    struct Row {
        replay_id: String,
        taken_at: DateTime<Utc>,
    }
    let row: Row = serde_dynamo::from_item(item).map_err(|e| corrupt("replay slot", e))?;
    Ok(ReplaySlot {
        replay_id: ReplayId::parse(&row.replay_id)?,
        taken_at: row.taken_at,
    })
}
pub fn api_key_pk(id: &ApiKeyId) -> String {
    format!("KEY#{id}")
}
pub const API_KEY_SK: &str = "KEY";
pub fn api_keys_of_app(app: &AppId) -> String {
    format!("KEYS#{app}")
}

pub const KIND_STATS: &str = "stats";
pub const KIND_RATE: &str = "rate";
/// An endpoint's rate limiter: `next_slot` (the next free send slot) and
/// the `per_second` it is numbered for ([`hookline_core::rate`]); expires
/// a day after its last use.
pub fn rate_pk(endpoint: &EndpointId) -> String {
    format!("RATE#{endpoint}")
}
pub const RATE_SK: &str = "RATE";
/// An endpoint's stats partition: its hours (`H#{hour}`), then its
/// waiting gauge (`WAITING` sorts after every `H#`).
pub fn stats_pk(app: &AppId, endpoint: &EndpointId) -> String {
    format!("STATS#{app}#{endpoint}")
}
pub fn stats_hour_sk(hour: DateTime<Utc>) -> String {
    format!("H#{}", due_time(hour))
}
pub const STATS_WAITING_SK: &str = "WAITING";
/// Attribute names of an hour's counters (short: they are in every item).
pub const STATS_DELIVERED: &str = "d";
pub const STATS_FAILED: &str = "f";
pub const STATS_ATTEMPTS: &str = "a";
pub const STATS_ATTEMPTS_OK: &str = "ok";
pub const STATS_WAITING: &str = "w";
/// The attribute of latency bucket `i`.
pub fn stats_latency_attr(i: usize) -> String {
    format!("l{i}")
}

/// FNV-1a of the id, modulo [`SHARDS`]: stable across processes and versions.
pub fn shard_of(id: &DeliveryId) -> u32 {
    hash_mod(id.as_str(), SHARDS)
}

/// FNV-1a of any id text, modulo `n`.
fn hash_mod(text: &str, n: u32) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for b in text.bytes() {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash % n
}

pub fn due_pk(id: &str) -> String {
    format!("DUE#{}", hash_mod(id, DUE_SHARDS))
}

pub fn due_pk_of_shard(shard: u32) -> String {
    format!("DUE#{shard}")
}

/// The event time index's partition of an event (in the overdue index
/// GSI3, apart from the due entries): every event with a listed fan-out,
/// sorted by id (time), until it expires. The reconciler sweeps it past its
/// mark, so nothing is written to leave it.
pub fn sweep_pk(event_id: &str) -> String {
    sweep_pk_of_shard(hash_mod(event_id, DUE_SHARDS))
}

pub fn sweep_pk_of_shard(shard: u32) -> String {
    format!("SWEEP#{shard}")
}

/// The sort key of an event in the event time index:
/// `{written time}#{app}#{event id}` (app ids have no `#`).
pub fn event_time_sk(written: DateTime<Utc>, app: &AppId, id: &EventId) -> String {
    format!("{}#{app}#{id}", due_time(written))
}

/// The app and the event of a time-index sort key.
pub fn parse_event_time_sk(sk: &str) -> Option<(&str, EventId)> {
    let mut parts = sk.splitn(3, '#');
    let (_, app, id) = (parts.next()?, parts.next()?, parts.next()?);
    Some((app, EventId::parse(id).ok()?))
}

/// The reconciler's sweep mark item.
pub const SWEEP_MARK_PK: &str = "RECONCILER";
pub const SWEEP_MARK_SK: &str = "SWEEP";

/// The queue lag item: `observed_at`, `lag_ms`.
pub const QUEUE_LAG_PK: &str = "QUEUE";
pub const QUEUE_LAG_SK: &str = "LAG";

pub fn queue_lag_item(lag: &QueueLag) -> Item {
    use serde_dynamo::AttributeValue as Value;
    let ms = u64::try_from(lag.lag.as_millis()).unwrap_or(u64::MAX);
    std::collections::HashMap::from([
        (PK.to_owned(), Value::S(QUEUE_LAG_PK.to_owned())),
        (SK.to_owned(), Value::S(QUEUE_LAG_SK.to_owned())),
        ("kind".to_owned(), Value::S("queue_lag".to_owned())),
        (
            "observed_at".to_owned(),
            Value::S(lag.observed_at.to_rfc3339()),
        ),
        ("lag_ms".to_owned(), Value::N(ms.to_string())),
    ])
    .into()
}

pub fn queue_lag_from_item(item: Item) -> Result<QueueLag, PipelineError> {
    #[derive(Deserialize)]
    struct Row {
        observed_at: DateTime<Utc>,
        lag_ms: u64,
    }
    let row: Row = serde_dynamo::from_item(item).map_err(|e| corrupt("queue lag item", e))?;
    Ok(QueueLag {
        observed_at: row.observed_at,
        lag: std::time::Duration::from_millis(row.lag_ms),
    })
}

/// One sweep mark as stored: `{position, reached}`.
fn mark_value(mark: &SweepMark) -> serde_dynamo::AttributeValue {
    use serde_dynamo::AttributeValue as Value;
    Value::M(std::collections::HashMap::from([
        ("position".to_owned(), Value::S(mark.position.clone())),
        ("reached".to_owned(), Value::S(mark.reached.to_rfc3339())),
    ]))
}

#[derive(Deserialize)]
struct StoredMark {
    position: String,
    reached: DateTime<Utc>,
}

impl From<StoredMark> for SweepMark {
    fn from(mark: StoredMark) -> Self {
        Self {
            position: mark.position,
            reached: mark.reached,
        }
    }
}

/// The late-write index's marks item (by source name).
pub fn late_marks_item(marks: &SweepMarks) -> Item {
    use serde_dynamo::AttributeValue as Value;
    let map = marks
        .iter()
        .map(|(source, mark)| (source.to_string(), mark_value(mark)))
        .collect();
    std::collections::HashMap::from([
        (PK.to_owned(), Value::S(SWEEP_MARK_PK.to_owned())),
        (SK.to_owned(), Value::S(SWEEP_MARK_SK.to_owned())),
        ("kind".to_owned(), Value::S("sweep_mark".to_owned())),
        ("marks".to_owned(), Value::M(map)),
    ])
    .into()
}

pub fn late_marks_from_item(item: Item) -> Result<SweepMarks, PipelineError> {
    #[derive(Deserialize)]
    struct Row {
        marks: std::collections::BTreeMap<String, StoredMark>,
    }
    let row: Row = serde_dynamo::from_item(item).map_err(|e| corrupt("sweep mark item", e))?;
    row.marks
        .into_iter()
        .map(|(source, mark)| Ok((source.parse()?, mark.into())))
        .collect()
}

/// An app's partition marks as stored on its registration: by shard.
pub fn app_marks_value(marks: &SweepMarks) -> serde_dynamo::AttributeValue {
    serde_dynamo::AttributeValue::M(
        marks
            .iter()
            .filter_map(|(source, mark)| match source {
                SweepSource::Days(_, shard) => Some((shard.to_string(), mark_value(mark))),
                SweepSource::Late(_) => None,
            })
            .collect(),
    )
}

/// An app registration (`SWEPT` / `{app}`) as the sweep reads it.
pub fn swept_app_from_item(item: Item) -> Result<SweptApp, PipelineError> {
    #[derive(Deserialize)]
    struct Row {
        #[serde(rename = "SK")]
        app: String,
        registered_at: DateTime<Utc>,
        #[serde(default)]
        marks: std::collections::BTreeMap<String, StoredMark>,
    }
    let row: Row = serde_dynamo::from_item(item).map_err(|e| corrupt("app registration", e))?;
    let app_id = AppId::parse(&row.app)?;
    let marks = row
        .marks
        .into_iter()
        .map(|(shard, mark)| {
            let shard = shard
                .parse()
                .map_err(|_| corrupt("app registration", format!("shard `{shard}`")))?;
            Ok((SweepSource::Days(app_id.clone(), shard), mark.into()))
        })
        .collect::<Result<_, PipelineError>>()?;
    Ok(SweptApp {
        app_id,
        registered_at: row.registered_at,
        marks,
    })
}

/// A fixed-width UTC time (sorts as text) for overdue-index sort keys.
pub fn due_time(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

pub fn due_sk(at: DateTime<Utc>, id: &str) -> String {
    format!("{}#{id}", due_time(at))
}

pub fn by_endpoint_pk(endpoint: &EndpointId, shard: u32) -> String {
    format!("EP#{endpoint}#{shard}")
}

pub fn by_status_pk(app: &AppId, status: DeliveryStatus, shard: u32) -> String {
    format!("ST#{app}#{status}#{shard}")
}

fn epoch_after(at: DateTime<Utc>, retention: std::time::Duration) -> i64 {
    at.timestamp() + i64::try_from(retention.as_secs()).unwrap_or(i64::MAX / 4)
}

#[derive(Serialize)]
struct EndpointItem<'a> {
    #[serde(rename = "PK")]
    pk: String,
    #[serde(rename = "SK")]
    sk: String,
    kind: &'static str,
    #[serde(flatten)]
    endpoint: &'a Endpoint,
}

#[derive(Serialize)]
struct EventItem<'a> {
    #[serde(rename = "PK")]
    pk: String,
    #[serde(rename = "SK")]
    sk: String,
    kind: &'static str,
    #[serde(flatten)]
    event: &'a Event,
    /// A listed fan-out: the endpoint at each position.
    #[serde(skip_serializing_if = "<[EndpointId]>::is_empty")]
    targets: &'a [EndpointId],
    /// Present (true) only with `targets`: the stream filter's hook.
    #[serde(skip_serializing_if = "Option::is_none")]
    listed: Option<bool>,
    /// A deferred fan-out (absent, with its version, when there is none:
    /// smaller items; a missing list reads as empty).
    #[serde(skip_serializing_if = "Option::is_none")]
    fanout_remaining: Option<&'a [EndpointId]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fanout_version: Option<u32>,
    /// Present (true) only while fan-out remains: the stream filter's hook.
    #[serde(skip_serializing_if = "Option::is_none")]
    fanout: Option<bool>,
    /// The overdue index, while fan-out remains.
    #[serde(rename = "GSI3PK", skip_serializing_if = "Option::is_none")]
    gsi3pk: Option<String>,
    #[serde(rename = "GSI3SK", skip_serializing_if = "Option::is_none")]
    gsi3sk: Option<String>,
    expires_at: i64,
}

#[derive(Serialize, Deserialize)]
struct KeyHeadItem {
    #[serde(rename = "PK")]
    pk: String,
    #[serde(rename = "SK")]
    sk: String,
    kind: String,
    version: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last_at: Option<DateTime<Utc>>,
    #[serde(default)]
    tails: std::collections::BTreeMap<EndpointId, KeyTail>,
    expires_at: i64,
}

/// The item of ordering key `key`'s head: it expires two retentions after
/// the key's latest event (a key's deliveries may wait past their event's
/// own retention, which their waits extend; a key used again after that
/// starts afresh).
pub fn key_head_item(
    app: &AppId,
    key: &str,
    head: &KeyHead,
    retention: std::time::Duration,
) -> Result<Item, PipelineError> {
    let last = head.last_at.unwrap_or_else(Utc::now);
    to_item(
        "key head",
        &KeyHeadItem {
            pk: key_head_pk(app, key),
            sk: KEY_HEAD_SK.to_owned(),
            kind: KIND_KEY_HEAD.to_owned(),
            version: head.version,
            last_at: head.last_at,
            tails: head.tails.clone(),
            expires_at: epoch_after(last, retention.saturating_mul(2)),
        },
    )
}

pub fn key_head_from_item(item: Item) -> Result<KeyHead, PipelineError> {
    let row: KeyHeadItem =
        serde_dynamo::from_item(item).map_err(|e| corrupt("key head item", e))?;
    Ok(KeyHead {
        version: row.version,
        last_at: row.last_at,
        tails: row.tails,
    })
}

#[derive(Serialize)]
struct DeliveryItem<'a> {
    #[serde(rename = "PK")]
    pk: String,
    #[serde(rename = "SK")]
    sk: String,
    kind: &'static str,
    /// The by-status index, failed ones only (see [`status_index_key`]).
    #[serde(rename = "GSI2PK", skip_serializing_if = "Option::is_none")]
    gsi2pk: Option<String>,
    #[serde(rename = "GSI2SK", skip_serializing_if = "Option::is_none")]
    gsi2sk: Option<&'a str>,
    #[serde(flatten)]
    delivery: &'a Delivery,
    /// The overdue index, while pending.
    #[serde(rename = "GSI3PK", skip_serializing_if = "Option::is_none")]
    gsi3pk: Option<String>,
    #[serde(rename = "GSI3SK", skip_serializing_if = "Option::is_none")]
    gsi3sk: Option<String>,
    /// TTL: only once finished (a pending delivery never expires).
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at: Option<i64>,
}

#[derive(Serialize, Deserialize)]
struct IdempotencyItem {
    #[serde(rename = "PK")]
    pk: String,
    #[serde(rename = "SK")]
    sk: String,
    kind: String,
    app_id: AppId,
    key: String,
    request_hash: String,
    response: String,
    created_at: DateTime<Utc>,
    expires_at: i64,
    /// The event this key accepted, when the record is written before the
    /// event (not in one transaction): enough to complete that event if its
    /// request stopped between the two writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    event: Option<KeyedEvent>,
}

/// What an idempotency record remembers of its event (see
/// [`idempotency_item_for`]): with the payload of a request that has the
/// same hash, the event can be rebuilt exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyedEvent {
    pub id: EventId,
    pub created_at: DateTime<Utc>,
    #[serde(default)]
    pub targets: Vec<EndpointId>,
}

#[derive(Deserialize, Default)]
struct FanoutFields {
    #[serde(default)]
    targets: Vec<EndpointId>,
    #[serde(default)]
    fanout_remaining: Vec<EndpointId>,
    #[serde(default)]
    fanout_version: u32,
}

#[derive(Deserialize)]
struct KindOnly {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    fanout: Option<bool>,
    #[serde(default)]
    listed: Option<bool>,
    #[serde(default, rename = "id")]
    id: Option<String>,
    #[serde(default)]
    running: Option<bool>,
    #[serde(default)]
    app_id: Option<String>,
    /// A delivery's registered successor ([`hookline_pipeline::deliver`]'s gate).
    #[serde(default)]
    wake: Option<String>,
}

#[derive(Serialize)]
struct ReplayItem<'a> {
    #[serde(rename = "PK")]
    pk: String,
    #[serde(rename = "SK")]
    sk: &'static str,
    kind: &'static str,
    #[serde(flatten)]
    replay: &'a Replay,
    /// Present (true) only while running: the stream filter's hook.
    #[serde(skip_serializing_if = "Option::is_none")]
    running: Option<bool>,
    /// The overdue index, while running (due when last advanced).
    #[serde(rename = "GSI3PK", skip_serializing_if = "Option::is_none")]
    gsi3pk: Option<String>,
    #[serde(rename = "GSI3SK", skip_serializing_if = "Option::is_none")]
    gsi3sk: Option<String>,
    expires_at: i64,
}

/// The item of a replay: running ones are in the overdue index and carry
/// `running` (dispatch's stream filter); every one expires `retention`
/// after its last step.
pub fn replay_item(replay: &Replay, retention: std::time::Duration) -> Result<Item, PipelineError> {
    let running = !replay.complete;
    to_item(
        "replay",
        &ReplayItem {
            pk: replay_pk(&replay.id),
            sk: REPLAY_SK,
            kind: KIND_REPLAY,
            replay,
            running: running.then_some(true),
            gsi3pk: running.then(|| due_pk(replay.id.as_str())),
            gsi3sk: running.then(|| due_sk(replay.updated_at, replay.id.as_str())),
            expires_at: epoch_after(replay.updated_at, retention),
        },
    )
}

pub fn replay_from_item(item: Item) -> Result<Replay, PipelineError> {
    serde_dynamo::from_item(item).map_err(|e| corrupt("replay item", e))
}

fn to_item<T: Serialize>(what: &str, value: &T) -> Result<Item, PipelineError> {
    serde_dynamo::to_item(value).map_err(|e| corrupt(what, e))
}

pub fn endpoint_item(endpoint: &Endpoint) -> Result<Item, PipelineError> {
    to_item(
        "endpoint",
        &EndpointItem {
            pk: app_pk(&endpoint.app_id),
            sk: endpoint_sk(&endpoint.id),
            kind: KIND_ENDPOINT,
            endpoint,
        },
    )
}

/// The item of `event`, at [`event_key`]. A listed fan-out written later
/// than its creation (`indexed_at`: an event completed after its request
/// stopped) also gets an entry in the event time index at that time: the
/// reconciler's sweep, which reads the table by creation time, may have
/// passed its creation already.
pub fn event_item(
    event: &Event,
    targets: &[EndpointId],
    fanout_remaining: &[EndpointId],
    fanout_version: u32,
    retention: std::time::Duration,
    indexed_at: DateTime<Utc>,
) -> Result<Item, PipelineError> {
    let listed = !targets.is_empty();
    let deferred = !fanout_remaining.is_empty();
    // The overdue index: due at creation for a deferred fan-out; the event
    // time index for a listed one written late. Any other event is in the
    // table's day partitions only.
    let (gsi3pk, gsi3sk) = if deferred {
        (
            Some(due_pk(event.id.as_str())),
            Some(due_sk(event.created_at, event.id.as_str())),
        )
    } else if listed && indexed_at > event.created_at {
        (
            Some(sweep_pk(event.id.as_str())),
            Some(event_time_sk(indexed_at, &event.app_id, &event.id)),
        )
    } else {
        (None, None)
    };
    let (pk, sk) = event_key(&event.app_id, &event.id);
    let mut item = to_item(
        "event",
        &EventItem {
            pk,
            sk,
            kind: KIND_EVENT,
            event,
            targets,
            listed: listed.then_some(true),
            fanout_remaining: deferred.then_some(fanout_remaining),
            fanout_version: deferred.then_some(fanout_version),
            fanout: deferred.then_some(true),
            gsi3pk,
            gsi3sk,
            expires_at: epoch_after(event.created_at, retention),
        },
    )?;
    compress_body(&mut item);
    Ok(item)
}

/// The attribute holding an event body compressed: raw DEFLATE (RFC 1951)
/// of its UTF-8 bytes, instead of `body`.
pub const BODY_DEFLATE: &str = "body_z";
/// Bodies shorter than this stay text (too short to gain).
const COMPRESS_BODY_FROM: usize = 200;
/// The most an event body inflates to: a corrupt or hostile `body_z` is
/// refused past it instead of filling the function's memory. Far above
/// any body an item can hold (400 KB, compressed) for a sane payload limit.
pub const MAX_INFLATED_BODY: usize = 8 << 20;

/// Stores the body compressed when that makes the item smaller (JSON
/// payloads shrink 2-4x): DynamoDB bills writes per started KB of item, so
/// a typical 0.5-3 KB payload costs 1-2 write units less per event, and
/// every read of it less too. The body stays byte for byte what receivers
/// get: [`inflate_body`] restores it exactly.
fn compress_body(item: &mut Item) {
    let Some(serde_dynamo::AttributeValue::S(body)) = item.get("body") else {
        return;
    };
    if body.len() < COMPRESS_BODY_FROM {
        return;
    }
    // Level 1: about 20 us for a 0.9 KB order payload against 29 us at
    // level 6, for a result 2% larger (measured on this machine kind).
    let packed = miniz_oxide::deflate::compress_to_vec(body.as_bytes(), 1);
    // Its attribute name is 2 bytes longer.
    if packed.len() + 2 < body.len() {
        item.remove("body");
        item.insert(
            BODY_DEFLATE.to_owned(),
            serde_dynamo::AttributeValue::B(packed),
        );
    }
}

/// Restores a compressed body as `body` (items written uncompressed, by
/// this version or an older one, are left as they are).
fn inflate_body(item: &mut Item) -> Result<(), PipelineError> {
    match item.remove(BODY_DEFLATE) {
        None => Ok(()),
        Some(serde_dynamo::AttributeValue::B(packed)) => {
            let bytes =
                miniz_oxide::inflate::decompress_to_vec_with_limit(&packed, MAX_INFLATED_BODY)
                    .map_err(|e| {
                        corrupt("event body", format!("does not inflate: {:?}", e.status))
                    })?;
            let body = String::from_utf8(bytes)
                .map_err(|e| corrupt("event body", format!("not UTF-8: {e}")))?;
            item.insert("body".to_owned(), serde_dynamo::AttributeValue::S(body));
            Ok(())
        }
        Some(_) => Err(corrupt("event body", "body_z is not binary")),
    }
}

pub fn delivery_item(
    delivery: &Delivery,
    retention: std::time::Duration,
) -> Result<Item, PipelineError> {
    let (pk, sk) = delivery_key(&delivery.app_id, &delivery.id);
    let indexed = status_index_key(delivery);
    to_item(
        "delivery",
        &DeliveryItem {
            pk,
            sk,
            kind: KIND_DELIVERY,
            gsi2sk: indexed.as_ref().map(|_| delivery.id.as_str()),
            gsi2pk: indexed,
            delivery,
            gsi3pk: delivery_due(delivery).map(|_| due_pk(delivery.id.as_str())),
            gsi3sk: delivery_due(delivery).map(|at| due_sk(at, delivery.id.as_str())),
            expires_at: delivery_expiry(delivery, retention),
        },
    )
}

/// A delivery's partition in the by-status index (GSI2), sorted by its id:
/// only failed deliveries are there. They are what an operator looks for,
/// rare among everything delivered and kept for the whole retention, so
/// the index finds them without reading past the rest. A pending
/// delivery has no copy: it is listed from its app's partitions
/// (filtered), where it is mostly among the newest (within a retry window
/// of its creation; one restarted by hand keeps its place by creation
/// time, a few list pages down), and a copy would cost two index writes
/// for every delivery that needs a retry (in, then out).
pub fn status_index_key(delivery: &Delivery) -> Option<String> {
    (delivery.status == DeliveryStatus::Failed)
        .then(|| by_status_pk(&delivery.app_id, delivery.status, shard_of(&delivery.id)))
}

/// When a delivery is due, for the overdue index: pending ones only.
pub fn delivery_due(delivery: &Delivery) -> Option<DateTime<Utc>> {
    (delivery.status == DeliveryStatus::Pending)
        .then(|| delivery.next_attempt_at.unwrap_or(delivery.updated_at))
}

/// The TTL of a delivery: none while pending; `retention` after it finished.
pub fn delivery_expiry(delivery: &Delivery, retention: std::time::Duration) -> Option<i64> {
    (delivery.status != DeliveryStatus::Pending)
        .then(|| epoch_after(delivery.updated_at, retention))
}

/// The TTL of an event restarted at `at`.
pub fn event_expiry_after(at: DateTime<Utc>, retention: std::time::Duration) -> i64 {
    epoch_after(at, retention)
}

pub fn idempotency_item(record: &IdempotencyRecord) -> Result<Item, PipelineError> {
    idempotency_item_with(record, None)
}

/// The idempotency record of `event`, written before the event itself (two
/// conditional puts instead of one transaction): it names the event.
pub fn idempotency_item_for(
    record: &IdempotencyRecord,
    event: &Event,
    targets: &[EndpointId],
) -> Result<Item, PipelineError> {
    idempotency_item_with(
        record,
        Some(KeyedEvent {
            id: event.id.clone(),
            created_at: event.created_at,
            targets: targets.to_vec(),
        }),
    )
}

/// The event a stored idempotency record names, if it names one.
pub fn keyed_event_of(item: Item) -> Result<Option<KeyedEvent>, PipelineError> {
    let row: IdempotencyItem =
        serde_dynamo::from_item(item).map_err(|e| corrupt("idempotency item", e))?;
    Ok(row.event)
}

fn idempotency_item_with(
    record: &IdempotencyRecord,
    event: Option<KeyedEvent>,
) -> Result<Item, PipelineError> {
    to_item(
        "idempotency record",
        &IdempotencyItem {
            pk: idempotency_pk(&record.app_id, &record.key),
            sk: IDEMPOTENCY_SK.into(),
            kind: KIND_IDEMPOTENCY.into(),
            app_id: record.app_id.clone(),
            key: record.key.clone(),
            request_hash: record.request_hash.clone(),
            response: record.response.clone(),
            created_at: record.created_at,
            expires_at: record.created_at.timestamp() + IDEMPOTENCY_TTL_SECS,
            event,
        },
    )
}

#[derive(Serialize)]
struct ApiKeyItem<'a> {
    #[serde(rename = "PK")]
    pk: String,
    #[serde(rename = "SK")]
    sk: &'static str,
    kind: &'static str,
    #[serde(rename = "GSI1PK")]
    gsi1pk: String,
    #[serde(rename = "GSI1SK")]
    gsi1sk: &'a str,
    #[serde(flatten)]
    key: &'a ApiKey,
    /// TTL: a portal session's record goes a day after its end (the API
    /// refuses it from its end on; TTL deletion lags).
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at: Option<i64>,
}

pub fn api_key_item(key: &ApiKey) -> Result<Item, PipelineError> {
    to_item(
        "API key",
        &ApiKeyItem {
            pk: api_key_pk(&key.id),
            sk: API_KEY_SK,
            kind: KIND_API_KEY,
            gsi1pk: api_keys_of_app(&key.app_id),
            gsi1sk: key.id.as_str(),
            key,
            expires_at: key
                .portal_until
                .map(|until| (until + chrono::Duration::days(1)).timestamp()),
        },
    )
}

pub fn api_key_from_item(item: Item) -> Result<ApiKey, PipelineError> {
    serde_dynamo::from_item(item).map_err(|e| corrupt("API key item", e))
}

pub fn endpoint_from_item(item: Item) -> Result<Endpoint, PipelineError> {
    serde_dynamo::from_item(item).map_err(|e| corrupt("endpoint item", e))
}

pub fn delivery_from_item(item: Item) -> Result<Delivery, PipelineError> {
    serde_dynamo::from_item(item).map_err(|e| corrupt("delivery item", e))
}

pub fn event_from_item(mut item: Item) -> Result<StoredEvent, PipelineError> {
    inflate_body(&mut item)?;
    let fanout: FanoutFields =
        serde_dynamo::from_item(item.clone()).map_err(|e| corrupt("event item", e))?;
    let event: Event = serde_dynamo::from_item(item).map_err(|e| corrupt("event item", e))?;
    Ok(StoredEvent {
        event,
        targets: fanout.targets,
        fanout_remaining: fanout.fanout_remaining,
        fanout_version: fanout.fanout_version,
    })
}

/// Reads an idempotency record; `None` once expired (TTL deletion lags).
pub fn idempotency_from_item(
    item: Item,
    now: DateTime<Utc>,
) -> Result<Option<IdempotencyRecord>, PipelineError> {
    let row: IdempotencyItem =
        serde_dynamo::from_item(item).map_err(|e| corrupt("idempotency item", e))?;
    if row.expires_at <= now.timestamp() {
        return Ok(None);
    }
    Ok(Some(IdempotencyRecord {
        app_id: row.app_id,
        key: row.key,
        request_hash: row.request_hash,
        response: row.response,
        created_at: row.created_at,
    }))
}

/// Whether a delivery's old image (a MODIFY's) has the new one's version.
fn same_version(new: &Item, old: Option<&Item>) -> bool {
    let version = |item: &Item| match item.get("version") {
        Some(serde_dynamo::AttributeValue::N(n)) => Some(n.clone()),
        _ => None,
    };
    old.is_some_and(|old| version(old).is_some() && version(old) == version(new))
}

/// What a stream record's new image asks of dispatch. Decided from the new
/// image (and, for a delivery, whether the old one had its version); an undecodable delivery image is an error (reported, retried,
/// then sent to the on-failure destination), never silently ignored.
pub fn decode_stream_image(image: Item, old: Option<Item>) -> Result<StreamChange, PipelineError> {
    let head: KindOnly =
        serde_dynamo::from_item(image.clone()).map_err(|e| corrupt("stream image", e))?;
    match head.kind.as_str() {
        // A change of a delivery that is not a change of its state (its
        // version stands): a successor registered on it (`wake`). Queued
        // again it would be sent twice.
        KIND_DELIVERY if same_version(&image, old.as_ref()) => Ok(StreamChange::Ignored),
        KIND_DELIVERY => {
            let delivery = delivery_from_item(image)?;
            let pending = delivery.status == DeliveryStatus::Pending;
            // A re-queue by the reconciler: it sent the message itself; a
            // blocked one is queued when its predecessor's end wakes it.
            Ok(match head.wake {
                _ if pending && !delivery.requeued && delivery.blocked_by.is_none() => {
                    StreamChange::PendingDelivery(Box::new(delivery))
                }
                Some(successor) if !pending => StreamChange::Wake {
                    successor: DeliveryId::parse(&successor)?,
                    app: delivery.app_id,
                    predecessor: delivery.id,
                },
                _ => StreamChange::Ignored,
            })
        }
        KIND_EVENT if head.listed == Some(true) => Ok(StreamChange::ListedFanout(Box::new(
            event_from_item(image)?,
        ))),
        KIND_REPLAY if head.running == Some(true) => {
            let id = head.id.ok_or_else(|| corrupt("replay image", "no id"))?;
            Ok(StreamChange::RunningReplay(ReplayId::parse(&id)?))
        }
        KIND_EVENT if head.fanout == Some(true) => {
            let id = head.id.ok_or_else(|| corrupt("event image", "no id"))?;
            let app = head
                .app_id
                .ok_or_else(|| corrupt("event image", "no app id"))?;
            Ok(StreamChange::EventFanout(
                AppId::parse(&app)?,
                EventId::parse(&id)?,
            ))
        }
        _ => Ok(StreamChange::Ignored),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hookline_core::model::EventType;
    use hookline_core::signing::Secret;
    use std::time::Duration;

    fn sample() -> (Event, Delivery, Endpoint) {
        let now = Utc::now();
        let app = AppId::parse("shop").unwrap();
        let event = Event::new(
            EventId::generate(),
            app.clone(),
            EventType::parse("order.paid").unwrap(),
            &serde_json::value::RawValue::from_string(r#"{"a": [1, 2.5, null, "x"]}"#.into())
                .unwrap(),
            now,
        );
        let ep = Endpoint {
            description: Some("d".into()),
            event_types: vec!["order.*".into()],
            ..Endpoint::new(
                EndpointId::generate(),
                app,
                "https://example.com/h",
                Secret::generate(&mut rand::thread_rng()),
                now,
            )
        };
        let d = Delivery::new(
            DeliveryId::for_event_endpoint(&event.id, &ep.id),
            &event,
            ep.id.clone(),
            now,
        );
        (event, d, ep)
    }

    #[test]
    fn items_round_trip() {
        let (event, delivery, endpoint) = sample();
        let item = delivery_item(&delivery, Duration::from_secs(86400)).unwrap();
        assert_eq!(delivery_from_item(item.clone()).unwrap(), delivery);
        let item = endpoint_item(&endpoint).unwrap();
        assert_eq!(endpoint_from_item(item).unwrap(), endpoint);
        let rest = vec![EndpointId::generate()];
        let item = event_item(
            &event,
            &[],
            &rest,
            3,
            Duration::from_secs(86400),
            event.created_at,
        )
        .unwrap();
        let stored = event_from_item(item.clone()).unwrap();
        assert_eq!(stored.event, event);
        assert_eq!(stored.fanout_remaining, rest);
        assert_eq!(stored.fanout_version, 3);
        assert_eq!(
            decode_stream_image(item, None).unwrap(),
            StreamChange::EventFanout(event.app_id.clone(), event.id.clone())
        );
    }

    /// Events are in their creation day's partitions, sorted by id; only a
    /// deferred fan-out or a listed one written late is indexed.
    #[test]
    fn deliveries_live_in_their_apps_partitions_and_only_undelivered_ones_are_indexed() {
        let (_, mut delivery, _) = sample();
        let retention = Duration::from_secs(86400);
        let (pk, sk) = delivery_key(&delivery.app_id, &delivery.id);
        assert_eq!(pk, format!("DLA#shop#{}", delivery_shard(&delivery.id)));
        assert_eq!(sk, delivery.id.as_str());
        assert_eq!(
            delivery_of_key(&pk, &sk),
            Some((delivery.app_id.clone(), delivery.id.clone()))
        );
        assert_eq!(delivery_of_key("DLV#x", delivery.id.as_str()), None);
        assert_eq!(
            delivery_of_key("EVD#20261202#1", delivery.id.as_str()),
            None
        );
        // Every app partition is used.
        let shards: std::collections::BTreeSet<u32> = (0..400)
            .map(|_| delivery_shard(&DeliveryId::generate()))
            .collect();
        assert_eq!(shards.len(), DELIVERY_SHARDS as usize);

        let has = |item: &Item, attr: &str| item.contains_key(attr);
        // Pending: the overdue index only (listed from the app's
        // partitions), no TTL.
        let item = delivery_item(&delivery, retention).unwrap();
        assert_eq!(
            item.get("PK"),
            Some(&serde_dynamo::AttributeValue::S(pk.clone()))
        );
        assert!(has(&item, "GSI3PK") && has(&item, "GSI3SK"));
        for attr in ["GSI1PK", "GSI2PK", "GSI2SK", "expires_at"] {
            assert!(!has(&item, attr), "{attr}");
        }
        // Failed: the by-status index only.
        delivery.status = DeliveryStatus::Failed;
        let item = delivery_item(&delivery, retention).unwrap();
        assert!(has(&item, "GSI2PK") && !has(&item, "GSI3PK") && has(&item, "expires_at"));
        // Delivered: no index copy at all.
        delivery.status = DeliveryStatus::Delivered;
        let item = delivery_item(&delivery, retention).unwrap();
        for attr in ["GSI1PK", "GSI2PK", "GSI2SK", "GSI3PK"] {
            assert!(!has(&item, attr), "{attr}");
        }
        assert_eq!(delivery_from_item(item).unwrap(), delivery);
    }

    /// A keyed delivery's stream images: a blocked one is not queued (its
    /// predecessor's end wakes it); an ended one with a successor
    /// registered (`wake`) asks dispatch to wake that one. A key's head
    /// reads back as written.
    #[test]
    fn ordering_items_and_their_stream_images() {
        let (_, mut delivery, endpoint) = sample();
        let retention = Duration::from_secs(86400);
        let predecessor = DeliveryId::generate();
        delivery.ordering_key = Some("order_42".into());
        delivery
            .block(&predecessor, None, Utc::now())
            .expect("pending");
        let item = delivery_item(&delivery, retention).unwrap();
        assert_eq!(
            decode_stream_image(item.clone(), None).unwrap(),
            StreamChange::Ignored
        );
        assert_eq!(delivery_from_item(item).unwrap(), delivery);
        delivery.unblock(&predecessor, Utc::now());
        delivery.requeued = false;
        let pending = delivery_item(&delivery, retention).unwrap();
        assert!(matches!(
            decode_stream_image(pending.clone(), None).unwrap(),
            StreamChange::PendingDelivery(_)
        ));
        // A successor registering on it (`wake` set, its version standing)
        // is not a new state to queue: it would be sent twice.
        let mut registered = pending.clone();
        registered.insert(
            "wake".into(),
            serde_dynamo::AttributeValue::S(DeliveryId::generate().as_str().to_owned()),
        );
        assert_eq!(
            decode_stream_image(registered, Some(pending.clone())).unwrap(),
            StreamChange::Ignored
        );
        delivery.status = DeliveryStatus::Delivered;
        let successor = DeliveryId::generate();
        let mut ended = delivery_item(&delivery, retention).unwrap();
        assert_eq!(
            decode_stream_image(ended.clone(), None).unwrap(),
            StreamChange::Ignored
        );
        ended.insert(
            "wake".into(),
            serde_dynamo::AttributeValue::S(successor.as_str().to_owned()),
        );
        assert_eq!(
            decode_stream_image(ended, None).unwrap(),
            StreamChange::Wake {
                app: delivery.app_id.clone(),
                successor,
                predecessor: delivery.id.clone(),
            }
        );
        let head = KeyHead {
            version: 3,
            last_at: Some(Utc::now()),
            tails: [(
                endpoint.id.clone(),
                KeyTail {
                    delivery: delivery.id.clone(),
                    event: delivery.event_id.clone(),
                },
            )]
            .into(),
        };
        let item = key_head_item(&delivery.app_id, "a#b c", &head, retention).unwrap();
        assert_eq!(
            item.get("PK"),
            Some(&serde_dynamo::AttributeValue::S("OKEY#shop#a#b c".into()))
        );
        assert_eq!(key_head_from_item(item).unwrap(), head);
    }

    /// The format item names its format; another one is refused with both
    /// numbers in the message.
    #[test]
    fn a_table_of_another_format_is_refused_naming_both() {
        let ours = format_item(TABLE_FORMAT).unwrap();
        assert!(is_format_item(&ours));
        check_format_item(ours).unwrap();
        let other = format_item(TABLE_FORMAT + 1).unwrap();
        let err = check_format_item(other).unwrap_err();
        assert!(!err.is_retryable());
        let text = err.to_string();
        assert!(
            text.contains(&format!("format {}", TABLE_FORMAT + 1))
                && text.contains(&format!("format {TABLE_FORMAT} only")),
            "{text}"
        );
    }

    /// An app's registration carries its marks by shard, read back as its
    /// sources; the late-write index's marks by source name.
    #[test]
    fn sweep_marks_round_trip_on_their_items() {
        use chrono::TimeZone;
        let app = AppId::parse("acme").unwrap();
        let at = Utc.with_ymd_and_hms(2026, 12, 4, 10, 0, 0).unwrap();
        let mark = |n: u32| SweepMark {
            position: format!("p{n}"),
            reached: at + chrono::TimeDelta::minutes(i64::from(n)),
        };
        let days: SweepMarks = (0..EVENT_SHARDS)
            .map(|n| (SweepSource::Days(app.clone(), n), mark(n)))
            .collect();
        let item: Item = std::collections::HashMap::from([
            (
                PK.to_owned(),
                serde_dynamo::AttributeValue::S(SWEPT_APPS_PK.into()),
            ),
            (
                SK.to_owned(),
                serde_dynamo::AttributeValue::S("acme".into()),
            ),
            (
                "registered_at".to_owned(),
                serde_dynamo::AttributeValue::S(at.to_rfc3339()),
            ),
            ("marks".to_owned(), app_marks_value(&days)),
        ])
        .into();
        let swept = swept_app_from_item(item).unwrap();
        assert_eq!((swept.app_id, swept.registered_at), (app, at));
        assert_eq!(swept.marks, days);
        let late: SweepMarks = (0..DUE_SHARDS)
            .map(|n| (SweepSource::Late(n), mark(n)))
            .collect();
        assert_eq!(late_marks_from_item(late_marks_item(&late)).unwrap(), late);
        let lag = QueueLag {
            observed_at: at,
            lag: Duration::from_millis(1_234_567),
        };
        assert_eq!(queue_lag_from_item(queue_lag_item(&lag)).unwrap(), lag);
    }

    #[test]
    fn events_live_in_day_partitions_and_are_indexed_only_when_needed() {
        use chrono::TimeZone;
        let at = Utc.with_ymd_and_hms(2026, 12, 4, 23, 59, 59).unwrap();
        let mut rng = rand::thread_rng();
        let ids: Vec<EventId> = (0..400).map(|_| EventId::new(at, &mut rng)).collect();
        let mut shards = std::collections::BTreeSet::new();
        let app = AppId::parse("acme.eu").unwrap();
        for id in &ids {
            let (pk, sk) = event_key(&app, id);
            assert!(pk.starts_with("EVD#acme.eu#20261204#"), "{pk}");
            assert_eq!(sk, id.as_str());
            shards.insert(pk.clone());
            assert_eq!(event_id_of_key(&pk, &sk), Some((app.clone(), id.clone())));
            assert_eq!(event_id_of_key(&format!("EVT#{id}"), "EVT"), None);
        }
        assert_eq!(shards.len(), EVENT_SHARDS as usize, "every shard used");
        let next_day = EventId::new(at + chrono::TimeDelta::seconds(1), &mut rng);
        assert!(event_key(&app, &next_day)
            .0
            .starts_with("EVD#acme.eu#20261205#"));
        // Another app's events are in other partitions.
        let other = AppId::parse("acme").unwrap();
        assert!(!shards.contains(&event_key(&other, &ids[0]).0));
        assert_eq!(
            day_start(at),
            Utc.with_ymd_and_hms(2026, 12, 4, 0, 0, 0).unwrap()
        );
        // In a partition, ids sort by time: time floors bound a time range.
        assert!(EventId::time_floor(at).as_str() <= ids[0].as_str());
        assert!(
            ids[0].as_str() < EventId::time_floor(at + chrono::TimeDelta::milliseconds(1)).as_str()
        );

        // The stream fixture of `events/` is an event item of this shape.
        let fixture: serde_json::Value =
            serde_json::from_str(include_str!("../../../../events/stream-insert-event.json"))
                .unwrap();
        let keys = &fixture["Records"][0]["dynamodb"]["Keys"];
        let id = EventId::parse(keys["SK"]["S"].as_str().unwrap()).unwrap();
        let demo = AppId::parse("demo").unwrap();
        assert_eq!(keys["PK"]["S"].as_str().unwrap(), event_key(&demo, &id).0);

        let (event, _, endpoint) = sample();
        let day = Duration::from_secs(86400);
        let targets = [endpoint.id.clone()];
        let gsi3 = |item: &Item| item.get("GSI3PK").cloned();
        let listed = event_item(&event, &targets, &[], 0, day, event.created_at).unwrap();
        assert_eq!(gsi3(&listed), None, "a listed fan-out written at once");
        let s = |v: &str| Some(serde_dynamo::AttributeValue::S(v.to_owned()));
        assert_eq!(
            listed.get(PK).cloned(),
            s(&event_key(&event.app_id, &event.id).0)
        );
        let late = event_item(
            &event,
            &targets,
            &[],
            0,
            day,
            event.created_at + chrono::TimeDelta::hours(2),
        )
        .unwrap();
        assert_eq!(gsi3(&late), s(&sweep_pk(event.id.as_str())), "written late");
        let none = event_item(&event, &[], &[], 0, day, event.created_at).unwrap();
        assert_eq!(gsi3(&none), None, "no fan-out listed");
        let deferred = event_item(&event, &[], &targets, 0, day, event.created_at).unwrap();
        assert_eq!(gsi3(&deferred), s(&due_pk(event.id.as_str())));
    }

    #[test]
    fn stream_decoding() {
        let (event, mut delivery, endpoint) = sample();
        let item = delivery_item(&delivery, Duration::from_secs(1)).unwrap();
        assert!(matches!(
            decode_stream_image(item, None).unwrap(),
            StreamChange::PendingDelivery(_)
        ));
        delivery.status = DeliveryStatus::Delivered;
        let item = delivery_item(&delivery, Duration::from_secs(1)).unwrap();
        assert_eq!(
            decode_stream_image(item, None).unwrap(),
            StreamChange::Ignored
        );
        assert_eq!(
            decode_stream_image(endpoint_item(&endpoint).unwrap(), None).unwrap(),
            StreamChange::Ignored
        );
        let item = event_item(
            &event,
            &[],
            &[],
            0,
            Duration::from_secs(1),
            event.created_at,
        )
        .unwrap();
        assert_eq!(
            decode_stream_image(item, None).unwrap(),
            StreamChange::Ignored
        );
        let mut bad = delivery_item(&delivery, Duration::from_secs(1)).unwrap();
        bad.remove("status");
        assert!(decode_stream_image(bad, None).is_err());
    }

    #[test]
    fn event_bodies_are_stored_compressed_and_restored_byte_for_byte() {
        use serde_dynamo::AttributeValue;
        let now = Utc::now();
        let app = AppId::parse("shop").unwrap();
        // A payload with what JSON text may carry: escapes, non-ASCII,
        // big numbers and odd spacing; long enough to compress.
        let payload = format!(
            r#"{{"id":12345678901234567890123, "price": 0.100000000000000000000000000001,"esc":"caf\u00e9 \"q\" é ✓","items":[{}]}}"#,
            (0..40)
                .map(|i| format!(r#"{{"sku":"SKU-{i:04}","qty":{i},"name":"item {i}"}}"#))
                .collect::<Vec<_>>()
                .join(",")
        );
        let event = Event::new(
            EventId::generate(),
            app,
            EventType::parse("order.paid").unwrap(),
            &serde_json::value::RawValue::from_string(payload).unwrap(),
            now,
        );
        let targets = vec![EndpointId::generate()];
        let day = Duration::from_secs(86400);
        let item = event_item(&event, &targets, &[], 0, day, now).unwrap();
        assert!(!item.contains_key("body"), "stored compressed");
        let Some(AttributeValue::B(packed)) = item.get(BODY_DEFLATE) else {
            panic!("no {BODY_DEFLATE}");
        };
        assert!(
            packed.len() * 3 < event.body.len(),
            "{} vs {}",
            packed.len(),
            event.body.len()
        );
        let stored = event_from_item(item.clone()).unwrap();
        assert_eq!(stored.event.body, event.body, "byte for byte");
        assert_eq!(stored.event, event);
        // The stream image (dispatch) reads it the same way.
        let StreamChange::ListedFanout(listed) = decode_stream_image(item.clone(), None).unwrap()
        else {
            panic!("not a listed fan-out");
        };
        assert_eq!(listed.event.body, event.body);

        // An item written before compression (or with a short body) reads as before.
        let mut old = item.clone();
        old.remove(BODY_DEFLATE);
        old.insert("body".into(), AttributeValue::S(event.body.clone()));
        assert_eq!(event_from_item(old).unwrap().event, event);
        let (short, _, _) = sample();
        let item = event_item(&short, &[], &[], 0, day, now).unwrap();
        assert!(item.contains_key("body") && !item.contains_key(BODY_DEFLATE));
        assert_eq!(event_from_item(item).unwrap().event, short);

        // Corrupt, wrongly typed or bomb-like bodies are errors, never panics.
        let bomb = miniz_oxide::deflate::compress_to_vec(&vec![b'a'; MAX_INFLATED_BODY + 1], 6);
        let bad_values = [
            AttributeValue::B(vec![0xff; 64]),
            AttributeValue::B(miniz_oxide::deflate::compress_to_vec(&[0xc3, 0x28], 6)),
            AttributeValue::B(bomb),
            AttributeValue::S("text".into()),
        ];
        for bad in bad_values {
            let mut corrupt_item = item_with(&event, bad);
            corrupt_item.remove("body");
            assert!(
                matches!(
                    event_from_item(corrupt_item),
                    Err(PipelineError::Corrupt(_))
                ),
                "accepted"
            );
        }
    }

    fn item_with(event: &Event, body_z: serde_dynamo::AttributeValue) -> Item {
        let mut item = event_item(
            event,
            &[],
            &[],
            0,
            Duration::from_secs(60),
            event.created_at,
        )
        .unwrap();
        item.insert(BODY_DEFLATE.into(), body_z);
        item
    }

    #[test]
    fn shards_are_spread() {
        let mut counts = [0; SHARDS as usize];
        for _ in 0..4000 {
            counts[shard_of(&DeliveryId::generate()) as usize] += 1;
        }
        assert!(counts.iter().all(|&c| c > 800), "{counts:?}");
    }
}

pub const KIND_EVENT_TYPE: &str = "event_type";
/// The catalog's partition: every type under it, sorted by name (a small,
/// rarely written set; ingest caches what it reads).
pub const CATALOG_PK: &str = "CATALOG";
pub fn event_type_sk(name: &str) -> String {
    format!("ET#{name}")
}

/// A catalog type as stored: schema and example as JSON text (any JSON,
/// however deep, kept exactly; DynamoDB maps nest at most 32 levels).
#[derive(Serialize, Deserialize)]
struct EventTypeItem {
    #[serde(rename = "PK")]
    pk: String,
    #[serde(rename = "SK")]
    sk: String,
    kind: String,
    name: hookline_core::model::EventType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    schema_json: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    example_json: Option<String>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

pub fn event_type_item(def: &hookline_core::catalog::EventTypeDef) -> Result<Item, PipelineError> {
    let text = |v: &Option<serde_json::Value>| {
        v.as_ref()
            .map(serde_json::to_string)
            .transpose()
            .map_err(|e| corrupt("event type", e))
    };
    to_item(
        "event type",
        &EventTypeItem {
            pk: CATALOG_PK.to_owned(),
            sk: event_type_sk(def.name.as_str()),
            kind: KIND_EVENT_TYPE.to_owned(),
            name: def.name.clone(),
            description: def.description.clone(),
            schema_json: text(&def.schema)?,
            example_json: text(&def.example)?,
            created_at: def.created_at,
            updated_at: def.updated_at,
        },
    )
}

pub fn event_type_from_item(
    item: Item,
) -> Result<hookline_core::catalog::EventTypeDef, PipelineError> {
    let stored: EventTypeItem =
        serde_dynamo::from_item(item).map_err(|e| corrupt("event type item", e))?;
    let value = |t: Option<String>| {
        t.map(|t| serde_json::from_str(&t))
            .transpose()
            .map_err(|e| corrupt("event type item", e))
    };
    Ok(hookline_core::catalog::EventTypeDef {
        name: stored.name,
        description: stored.description,
        schema: value(stored.schema_json)?,
        example: value(stored.example_json)?,
        created_at: stored.created_at,
        updated_at: stored.updated_at,
    })
}
