//! [`DynamoStore`]: the pipeline's [`Store`] on one DynamoDB table.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::{
    AttributeValue, CancellationReason, ReturnValue, ReturnValuesOnConditionCheckFailure,
    TransactWriteItem, Update,
};
use aws_sdk_dynamodb::Client;
use chrono::{DateTime, Utc};
use hookline_core::apikey::ApiKey;
use hookline_core::catalog::EventTypeDef;
use hookline_core::ids::{ApiKeyId, AppId, DeliveryId, EndpointId, EventId, ReplayId};
use hookline_core::model::{Delivery, DeliveryStatus, Endpoint, EndpointRoute, EventType};
use hookline_core::stats::StatsDelta;
use hookline_pipeline::ports::{
    CommitOutcome, DeliveryPage, DeliveryQuery, EndpointHours, EventHead, EventWindow,
    IdempotencyRecord, NewEvent, Overdue, OverduePage, QueueLag, ReplaySlot, Result, Store,
    StoredEvent, SweepMarks, SweepPage, SweepSource, SweptAppsPage,
};
use hookline_pipeline::replay::Replay;
use hookline_pipeline::PipelineError;
use serde_dynamo::Item;

use crate::clients::Clients;
use crate::dynamo_http::{DynamoHttp, Put, Query};
use crate::error::{condition_failed, corrupt, direct_error, store_error};
use crate::outbox;
use crate::schema::{self, KeyedEvent, *};
use crate::sealing::{Place, SecretSealer};

/// The DynamoDB store. Cheap to clone.
#[derive(Debug, Clone)]
pub struct DynamoStore {
    /// The SDK's client, for the rest (built on first use).
    client: crate::lazy::Lazy<Client>,
    /// The operations every delivery makes (GetItem, PutItem, the routes'
    /// Query), without the SDK orchestrator ([`crate::dynamo_http`]).
    http: DynamoHttp,
    table: String,
    retention: Duration,
    /// Held across every call when set (moto loses writes under concurrency).
    serial: crate::serial::Serial,
    /// Seals endpoint secrets at rest (KMS envelope encryption) when set.
    sealer: Option<Arc<SecretSealer>>,
    /// Set once this process found the table at [`schema::TABLE_FORMAT`]
    /// (see [`Self::check_format`]).
    format_checked: Arc<tokio::sync::OnceCell<()>>,
}

fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

/// `value` as the direct client's attribute value.
fn direct_value<T: serde::Serialize>(value: &T) -> Result<serde_dynamo::AttributeValue> {
    serde_dynamo::to_attribute_value(value).map_err(|e| corrupt("attribute", e))
}

fn av<T: serde::Serialize>(value: &T) -> Result<AttributeValue> {
    serde_dynamo::to_attribute_value(value).map_err(|e| corrupt("attribute", e))
}

/// Day partitions a replay call reads per event shard at most (a wider
/// window goes on from the replay's position).
const REPLAY_DAYS_PER_CALL: usize = 10;

/// Entries one overdue-index page holds at most (KEYS_ONLY entries of
/// about 150 bytes: well inside a 1 MB query page). The reconciler handles
/// a page's entries before it reads the next.
const OVERDUE_PAGE_LIMIT: i32 = 1000;
/// Time-index entries one late-events page reads at most (their events
/// are then read by key, 100 per BatchGetItem).
const LATE_PAGE_LIMIT: i32 = 500;
/// What the sweep reads of an event: its id, app, creation and listed
/// fan-out; never the body.
const HEAD_PROJECTION: &str = "#sk, app_id, created_at, targets";

/// The head of an event item read with [`HEAD_PROJECTION`]; `None`:
/// unreadable.
fn event_head(item: Item) -> std::result::Result<EventHead, String> {
    #[derive(serde::Deserialize)]
    struct Row {
        #[serde(rename = "SK")]
        id: EventId,
        app_id: AppId,
        created_at: DateTime<Utc>,
        #[serde(default)]
        targets: Vec<EndpointId>,
    }
    let key = text_of(&item, SK).unwrap_or("?").to_owned();
    match serde_dynamo::from_item::<_, Row>(item) {
        Ok(row) => Ok(EventHead {
            id: row.id,
            app_id: row.app_id,
            created_at: row.created_at,
            targets: row.targets,
        }),
        Err(err) => Err(format!("{key}: {err}")),
    }
}

/// The time a due or time-index sort key starts with.
fn time_of_sort_key(sk: &str) -> Option<DateTime<Utc>> {
    let text = sk.split('#').next()?;
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// From this many deliveries in one of its app's partitions, the
/// reconciler's check of swept deliveries reads their range of the
/// partition (a query, charged by the bytes read: about four delivery items
/// per unit) instead of each key (a unit each).
const RANGE_READ_MIN: usize = 4;
/// A range read stops after this many items per delivery asked (others in
/// the range: a large fan-out's deliveries); the rest are read by key.
const RANGE_READ_ITEMS_PER_ID: usize = 4;

/// How a read sees the table: every write acknowledged before it, or
/// (half the read units) possibly not those of about the last second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    Consistent,
    Eventual,
}

/// Items one list source reads at most per request (a filtered list
/// whose matches are rare answers fewer than asked, with a cursor).
const LIST_READ_BUDGET: usize = 2000;

/// One partition a delivery list reads: the table's (`index` none) or an
/// index's, with equality filters on the items' attributes (`PK`: a prefix).
struct ListSource {
    index: Option<&'static str>,
    key: String,
    filter: Vec<(&'static str, String)>,
}

/// The partitions a delivery list reads: the by-status index for failed
/// deliveries of any endpoint, else the app's own (filtered by endpoint,
/// status, event type).
fn list_sources(app: &AppId, q: &DeliveryQuery) -> Vec<ListSource> {
    let mut common = Vec::new();
    if let Some(t) = &q.event_type {
        common.push(("event_type", t.clone()));
    }
    let app_partitions = |filter: Vec<(&'static str, String)>| {
        (0..DELIVERY_SHARDS)
            .map(move |shard| ListSource {
                index: None,
                key: app_deliveries_pk(app, shard),
                filter: filter.clone(),
            })
            .collect()
    };
    match (&q.endpoint_id, q.status) {
        // Every failed one has an index copy.
        (None, Some(DeliveryStatus::Failed)) => (0..SHARDS)
            .map(|shard| ListSource {
                index: Some(GSI_BY_STATUS),
                key: by_status_pk(app, DeliveryStatus::Failed, shard),
                filter: common.clone(),
            })
            .collect(),
        (endpoint, status) => {
            let mut own = common;
            own.extend(status.map(|st| ("status", st.as_str().to_owned())));
            own.extend(
                endpoint
                    .iter()
                    .map(|ep| ("endpoint_id", ep.as_str().to_owned())),
            );
            app_partitions(own)
        }
    }
}

/// `item`'s string attribute `name`.
fn text_of<'a>(item: &'a Item, name: &str) -> Option<&'a str> {
    match item.get(name) {
        Some(serde_dynamo::AttributeValue::S(text)) => Some(text),
        _ => None,
    }
}

fn into_sdk(item: Item) -> HashMap<String, AttributeValue> {
    item.into()
}

impl DynamoStore {
    /// The store of `table` on `clients`' DynamoDB clients.
    pub fn new(clients: &Clients, table: impl Into<String>, retention: Duration) -> Self {
        Self {
            client: clients.dynamodb.clone(),
            http: clients.dynamodb_http.clone(),
            table: table.into(),
            retention,
            serial: Default::default(),
            sealer: None,
            format_checked: Default::default(),
        }
    }

    /// Seals endpoint secrets with `sealer` before they reach the table, and
    /// opens them on every read.
    pub fn sealed_with(mut self, sealer: Arc<SecretSealer>) -> Self {
        self.sealer = Some(sealer);
        self
    }

    /// An endpoint item with its secrets sealed (when a sealer is set).
    async fn endpoint_to_sdk(
        &self,
        endpoint: &Endpoint,
    ) -> Result<HashMap<String, AttributeValue>> {
        let mut item = into_sdk(schema::endpoint_item(endpoint)?);
        if let Some(sealer) = &self.sealer {
            let (pk, sk) = (app_pk(&endpoint.app_id), endpoint_sk(&endpoint.id));
            let (pk, sk) = (pk.as_str(), sk.as_str());
            map_secrets(&mut item, |plain, field| async move {
                let place = Place {
                    pk,
                    sk,
                    field: &field,
                };
                sealer.seal(&plain, place).await
            })
            .await?;
        }
        Ok(item)
    }

    /// An endpoint from its item, its secrets opened.
    async fn endpoint_from_sdk(
        &self,
        mut item: HashMap<String, AttributeValue>,
    ) -> Result<Endpoint> {
        // The table key is the sealed values' associated data: the item
        // must be where it was written.
        let key = |name: &str| {
            item.get(name)
                .and_then(|v| v.as_s().ok())
                .cloned()
                .ok_or_else(|| corrupt("endpoint item", format!("no {name}")))
        };
        let (pk, sk) = (key(PK)?, key(SK)?);
        match &self.sealer {
            Some(sealer) => {
                let (pk, sk) = (pk.as_str(), sk.as_str());
                map_secrets(&mut item, |stored, field| async move {
                    let place = Place {
                        pk,
                        sk,
                        field: &field,
                    };
                    sealer.open(&stored, place).await
                })
                .await?;
            }
            None => {
                if item
                    .get("secret")
                    .and_then(|v| v.as_s().ok())
                    .is_some_and(|s| crate::sealing::is_sealed(s))
                {
                    return Err(PipelineError::Corrupt(
                        "endpoint secrets are sealed but this store has no KMS key to open them"
                            .into(),
                    ));
                }
            }
        }
        schema::endpoint_from_item(Item::from(item))
    }

    /// Serialises every call through `lock` (share one lock per moto server).
    pub fn serialized(mut self, serial: crate::serial::Serial) -> Self {
        self.serial = serial;
        self
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    pub fn client(&self) -> &Client {
        self.client.get()
    }

    async fn guard(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        self.serial.guard().await
    }

    /// [`Self::guard`] for a write: the table's format is checked first
    /// (once per process, usually already by the first read, which carries
    /// the format item: [`Self::get_items`]), so this build never writes
    /// into a table of another format.
    async fn write_guard(&self) -> Result<Option<tokio::sync::MutexGuard<'_, ()>>> {
        self.check_format().await?;
        Ok(self.guard().await)
    }

    /// Starts the format check beside whatever the function reads first
    /// (a no-op once checked): for a function whose first requests are
    /// queries, which cannot carry the format item. Its writes wait for
    /// the check ([`Self::write_guard`]); a failed check is found again by
    /// the first write, which fails with it.
    pub fn check_format_in_background(&self) {
        if self.format_checked.get().is_some() {
            return;
        }
        let store = self.clone();
        tokio::spawn(async move {
            if let Err(err) = store.check_format().await {
                tracing::debug!(error = %err, "format check (its first write reports it)");
            }
        });
    }

    /// Puts `item` if it is new (`expected`: `None`) or its attribute still
    /// holds the value expected; `Ok(false)`: nothing written.
    async fn put_if(
        &self,
        item: HashMap<String, AttributeValue>,
        expected: Option<(&str, AttributeValue)>,
    ) -> Result<bool> {
        let _g = self.write_guard().await?;
        let request = self
            .client()
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item));
        let request = match expected {
            None => request.condition_expression("attribute_not_exists(PK)"),
            Some((name, value)) => request
                .condition_expression(format!("{name} = :expected"))
                .expression_attribute_values(":expected", value),
        };
        condition_to_bool(request.send().await, "PutItem")
    }

    /// Writes an item that must not exist yet (create-only).
    async fn put_new(&self, item: Item) -> Result<()> {
        let _g = self.write_guard().await?;
        self.http
            .put_item(&Put::new(&self.table, &item).condition("attribute_not_exists(PK)"))
            .await
            .map_err(direct_error)
    }

    fn key(pk: String, sk: &str) -> HashMap<String, AttributeValue> {
        HashMap::from([(PK.to_owned(), s(pk)), (SK.to_owned(), s(sk))])
    }

    /// Deletes the item at `key` if `condition` holds; `Ok(false)` when it
    /// does not (missing, or not the caller's).
    async fn delete_if(
        &self,
        key: HashMap<String, AttributeValue>,
        condition: &str,
        value: Option<(&str, &str)>,
    ) -> Result<bool> {
        let _g = self.write_guard().await?;
        let mut request = self
            .client()
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(key))
            .condition_expression(condition);
        if let Some((name, v)) = value {
            request = request.expression_attribute_values(name, s(v));
        }
        condition_to_bool(request.send().await, "DeleteItem")
    }

    /// Writes the event item unless it exists (then it is this very event,
    /// written by a request with the same key and payload: see
    /// [`Self::commit_keyed`]).
    async fn put_event_once(&self, new: &NewEvent, indexed_at: DateTime<Utc>) -> Result<()> {
        let item = schema::event_item(
            &new.event,
            &new.targets,
            &new.fanout_remaining,
            0,
            self.retention,
            indexed_at,
        )?;
        self.put_absent(item).await.map(|_| ())
    }

    /// Writes an item unless one exists at its key; `Ok(false)`: one did.
    async fn put_absent(&self, item: Item) -> Result<bool> {
        self.check_format().await?;
        self.put_absent_unchecked(item).await
    }

    /// [`Self::put_absent`] without the format check (the check's own write).
    async fn put_absent_unchecked(&self, item: Item) -> Result<bool> {
        let _g = self.guard().await;
        let result = self
            .http
            .put_item(&Put::new(&self.table, &item).condition("attribute_not_exists(PK)"))
            .await;
        direct_condition_to_bool(result)
    }

    /// A keyed event with no delivery items: the key's record first (it
    /// claims the key and names the event), then the event; two conditional
    /// puts instead of a transaction. The event is accepted (202) only once
    /// its item is written. If a request stops between the two writes, its
    /// client (having no 202) sends it again: the key is taken by a record
    /// with the same request hash whose event is missing, so this request
    /// writes that very event (same id, time, fan-out; the payload is the
    /// same bytes, the hash says so) before the answer is replayed. A
    /// concurrent duplicate does the same; the event's put is conditional,
    /// so it is written once.
    async fn commit_keyed(
        &self,
        new: &NewEvent,
        record: &IdempotencyRecord,
    ) -> Result<CommitOutcome> {
        let claim = schema::idempotency_item_for(record, &new.event, &new.targets)?;
        let claimed = {
            let _g = self.write_guard().await?;
            let result = self
                .http
                .put_item(
                    &Put::new(&self.table, &claim)
                        // An expired record (TTL deletion lags by up to days)
                        // may be taken over at once.
                        .condition("attribute_not_exists(PK) OR expires_at <= :now")
                        .value(
                            ":now",
                            serde_dynamo::AttributeValue::N(
                                record.created_at.timestamp().to_string(),
                            ),
                        ),
                )
                .await;
            match result {
                Err(err) if err.is_transaction_conflict() => return Ok(CommitOutcome::Contended),
                other => direct_condition_to_bool(other)?,
            }
        };
        if claimed {
            self.put_event_once(new, new.event.created_at).await?;
            return Ok(CommitOutcome::Committed);
        }
        self.key_taken(new, record).await
    }

    /// The answer to a request whose Idempotency-Key is taken: the record
    /// found. If it is this very request's (same hash) and names an event
    /// that is missing (its request stopped between the record and the
    /// event), that event is written first, whichever path this request
    /// took (the app's fan-out may have grown past a listed one since):
    /// a 202 always names a written event.
    async fn key_taken(&self, new: &NewEvent, record: &IdempotencyRecord) -> Result<CommitOutcome> {
        let Some(item) = self
            .get(idempotency_pk(&record.app_id, &record.key), IDEMPOTENCY_SK)
            .await?
        else {
            // Gone between the two calls (expired and deleted): try again.
            return Ok(CommitOutcome::Contended);
        };
        let Some(existing) = schema::idempotency_from_item(item.clone(), record.created_at)? else {
            return Ok(CommitOutcome::Contended);
        };
        if existing.request_hash == record.request_hash {
            if let Some(keyed) = schema::keyed_event_of(item)? {
                self.complete_keyed_event(new, keyed).await?;
            }
        }
        Ok(CommitOutcome::IdempotencyKeyTaken(existing))
    }

    /// Writes the event a key's record names if it is missing, from the
    /// record (id, time, fan-out) and `new`'s payload (same request hash).
    async fn complete_keyed_event(&self, new: &NewEvent, keyed: KeyedEvent) -> Result<()> {
        let (pk, sk) = event_key(&new.event.app_id, &keyed.id);
        if self.get(pk, &sk).await?.is_some() {
            return Ok(());
        }
        let payload = hookline_core::model::body_data(&new.event.body)
            .ok_or_else(|| corrupt("event body", "no data member"))?;
        let event = hookline_core::model::Event::new(
            keyed.id,
            new.event.app_id.clone(),
            new.event.event_type.clone(),
            &payload,
            keyed.created_at,
        );
        tracing::warn!(
            event_id = %event.id,
            app_id = %event.app_id,
            "an accepted key's event was missing (its request stopped between the two writes): written now"
        );
        let completed = NewEvent {
            event,
            targets: keyed.targets,
            deliveries: Vec::new(),
            fanout_remaining: Vec::new(),
            idempotency: None,
            key_head: None,
        };
        // Indexed now, not at its creation: the reconciler's sweep may have
        // passed that time already.
        self.put_event_once(&completed, Utc::now()).await
    }

    /// One step of a deferred fan-out on the event's item at `version`,
    /// with the deliveries it writes: one transaction; `Ok(false)` when the
    /// event is not at that version.
    async fn materialise_at(
        &self,
        app: &AppId,
        event_id: &EventId,
        version: u32,
        deliveries: &[Delivery],
        remaining: &[EndpointId],
    ) -> Result<bool> {
        let (pk, sk) = event_key(app, event_id);
        let mut update = Update::builder()
            .table_name(&self.table)
            .set_key(Some(Self::key(pk, &sk)))
            .condition_expression("fanout_version = :v")
            .expression_attribute_values(":v", AttributeValue::N(version.to_string()))
            .expression_attribute_values(":next", AttributeValue::N((version + 1).to_string()))
            .expression_attribute_values(":rest", av(&remaining)?)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::None);
        update = if remaining.is_empty() {
            update.update_expression(
                "SET fanout_version = :next, fanout_remaining = :rest REMOVE fanout, GSI3PK, GSI3SK",
            )
        } else {
            update.update_expression("SET fanout_version = :next, fanout_remaining = :rest")
        };
        let mut items = vec![TransactWriteItem::builder()
            .update(update.build().map_err(|e| corrupt("update", e))?)
            .build()];
        for d in deliveries {
            items.push(outbox::put_new(
                &self.table,
                schema::delivery_item(d, self.retention)?,
            )?);
        }
        match self.transact(items).await {
            Ok(()) => Ok(true),
            Err(TransactFailure::Conditions(reasons))
                if reasons.first().is_some_and(condition_failed) =>
            {
                Ok(false)
            }
            Err(TransactFailure::Conditions(reasons)) => Err(PipelineError::store(
                format!("fan-out transaction cancelled: {reasons:?}"),
                true,
            )),
            Err(TransactFailure::Contended) => Err(PipelineError::store(
                "fan-out transaction conflicted with another; retry",
                true,
            )),
            Err(TransactFailure::Other(err)) => Err(err),
        }
    }

    /// Up to `limit` events of one event shard created in `[from, below)`
    /// (ids; `from` inclusive) with ids after `after` (exclusive; `""`: none
    /// read yet), oldest first, day partition after day partition, at most
    /// `max_days` of them. With them, where to go on from (exclusive), or
    /// `None` once every event below `below` is read.
    #[allow(clippy::too_many_arguments)]
    async fn events_by_time(
        &self,
        app: &AppId,
        shard: u32,
        after: &str,
        from: &EventId,
        below: &EventId,
        limit: usize,
        max_days: usize,
    ) -> Result<(Vec<Item>, Option<String>)> {
        let low = if after > from.as_str() {
            after.to_owned()
        } else {
            from.as_str().to_owned()
        };
        let mut out = Vec::new();
        if low.as_str() >= below.as_str() {
            return Ok((out, None));
        }
        let first_day = EventId::parse(&low)
            .map(|id| id.created_at())
            .unwrap_or_else(|_| from.created_at());
        let mut day = day_start(first_day);
        let mut days = 0;
        while day < below.created_at() {
            if out.len() >= limit || days >= max_days {
                // A time floor is never an id (ids carry version bits), so
                // going on after it misses nothing.
                let next = match out.last().and_then(|item: &Item| item.get(SK)) {
                    Some(serde_dynamo::AttributeValue::S(last)) if out.len() >= limit => {
                        last.clone()
                    }
                    _ => EventId::time_floor(day).as_str().to_owned(),
                };
                return Ok((out, Some(next)));
            }
            let pk = event_day_pk(app, day, shard);
            let query = Query::new(&self.table, "PK = :pk AND SK BETWEEN :low AND :below")
                .eventually_consistent()
                .value(":pk", serde_dynamo::AttributeValue::S(pk))
                .value(":low", serde_dynamo::AttributeValue::S(low.clone()));
            let page = self
                .sorted_range(
                    query,
                    SK,
                    after,
                    below.as_str(),
                    limit - out.len(),
                    |item, _| Some(item.clone()),
                )
                .await?;
            out.extend(page);
            if out.len() >= limit {
                let last = match out.last().and_then(|item| item.get(SK)) {
                    Some(serde_dynamo::AttributeValue::S(last)) => last.clone(),
                    _ => return Err(corrupt("event item", "no sort key")),
                };
                return Ok((out, Some(last)));
            }
            day += chrono::TimeDelta::days(1);
            days += 1;
        }
        Ok((out, None))
    }

    /// A delivery of `app` by id: its item, or (`listed`), for a delivery
    /// of a listed fan-out never attempted yet, as its event lists it.
    async fn read_delivery(
        &self,
        app: &AppId,
        id: &DeliveryId,
        listed: bool,
        read: Read,
    ) -> Result<Option<Delivery>> {
        self.read_delivery_along(app, id, listed, read, None).await
    }

    /// [`Self::read_delivery`], with the item at `along`'s key read in the
    /// same first request (put in `along`'s slot: found or not).
    async fn read_delivery_along(
        &self,
        app: &AppId,
        id: &DeliveryId,
        listed: bool,
        read: Read,
        mut along: Option<(&(String, String), &mut Option<Item>)>,
    ) -> Result<Option<Delivery>> {
        // Its item and (for a listed delivery, which has no item before its
        // first attempt) the event that lists it: one request.
        let mut keys = vec![delivery_key(app, id)];
        if let Some((event_id, _)) = id.fanout_origin().filter(|_| listed) {
            keys.push(event_key(app, &event_id));
        }
        if let Some((key, _)) = &along {
            keys.push((*key).clone());
        }
        // Boxed: a deep handler's state machine must not overflow a
        // thread's stack.
        let items = Box::pin(self.get_items(&keys, read)).await?;
        let (mut current, mut event) = (None, None);
        for item in items {
            if let Some((key, slot)) = along.as_mut() {
                if text_of(&item, PK) == Some(key.0.as_str())
                    && text_of(&item, SK) == Some(key.1.as_str())
                {
                    **slot = Some(item);
                    continue;
                }
            }
            match text_of(&item, PK) {
                Some(pk) if pk.starts_with("DLA#") => current = Some(item),
                _ => event = Some(item),
            }
        }
        if let Some(item) = current {
            return schema::delivery_from_item(item).map(Some);
        }
        let Some((_, position)) = id.fanout_origin().filter(|_| listed) else {
            return Ok(None);
        };
        Ok(event
            .map(schema::event_from_item)
            .transpose()?
            .and_then(|e| e.listed_delivery(position))
            .filter(|d| &d.id == id && &d.app_id == app))
    }

    /// The items at `keys`: one GetItem for one key, else a BatchGetItem.
    /// The first time a process reads, the table's format item rides along
    /// ([`Self::items_checking_format`]).
    async fn get_items(&self, keys: &[(String, String)], read: Read) -> Result<Vec<Item>> {
        if self.format_checked.get().is_none() {
            return Box::pin(self.items_checking_format(keys, read)).await;
        }
        self.get_items_unchecked(keys, read).await
    }

    async fn get_items_unchecked(
        &self,
        keys: &[(String, String)],
        read: Read,
    ) -> Result<Vec<Item>> {
        match (keys, read) {
            ([(pk, sk)], Read::Consistent) => Ok(self
                .get_unchecked(pk.clone(), sk)
                .await?
                .into_iter()
                .collect()),
            ([(pk, sk)], Read::Eventual) => {
                let _g = self.guard().await;
                Ok(self
                    .http
                    .get_item_eventually(&self.table, pk, sk)
                    .await
                    .map_err(direct_error)?
                    .into_iter()
                    .collect())
            }
            (keys, read) => {
                self.batch_get(keys.to_vec(), read == Read::Consistent, None)
                    .await
            }
        }
    }

    /// Which of `ids` (all in partition `pk`) have an item there, read as
    /// the one range of the partition they span (eventually consistent,
    /// keys only, pushed to `found`). The range may hold other deliveries
    /// (a large fan-out's, created meanwhile); once it has read
    /// [`RANGE_READ_ITEMS_PER_ID`] items per id asked, the ids not found
    /// yet are returned unread (for a read by key), so a range never costs
    /// much more than reading each key would.
    async fn delivery_items_in_range(
        &self,
        pk: &str,
        ids: &[&DeliveryId],
        found: &mut Vec<DeliveryId>,
    ) -> Result<Vec<DeliveryId>> {
        let wanted: std::collections::HashSet<&str> = ids.iter().map(|id| id.as_str()).collect();
        let low = ids
            .iter()
            .map(|id| id.as_str())
            .min()
            .expect("a group is never empty");
        let high = ids
            .iter()
            .map(|id| id.as_str())
            .max()
            .expect("a group is never empty");
        let budget = ids.len() * RANGE_READ_ITEMS_PER_ID;
        let mut query = Query::new(&self.table, "PK = :pk AND SK BETWEEN :low AND :high")
            .eventually_consistent()
            .value(":pk", serde_dynamo::AttributeValue::S(pk.to_owned()))
            .value(":low", serde_dynamo::AttributeValue::S(low.to_owned()))
            .value(":high", serde_dynamo::AttributeValue::S(high.to_owned()))
            .projection("#sk")
            .name("#sk", SK);
        let (mut read, mut seen) = (0, std::collections::HashSet::new());
        loop {
            query.limit = Some(i32::try_from(budget - read).unwrap_or(i32::MAX));
            let page = {
                let _g = self.guard().await;
                self.http.query(&query).await.map_err(direct_error)?
            };
            read += page.items.len();
            for item in &page.items {
                if let Some(serde_dynamo::AttributeValue::S(sk)) = item.get(SK) {
                    if wanted.contains(sk.as_str()) && seen.insert(sk.clone()) {
                        found.push(
                            DeliveryId::parse(sk).map_err(|e| corrupt("delivery item key", e))?,
                        );
                    }
                }
            }
            match page.last_evaluated_key {
                Some(key) if !key.is_empty() => {
                    if read >= budget {
                        // Too many others in the range: the rest by key.
                        return Ok(ids
                            .iter()
                            .filter(|id| !seen.contains(id.as_str()))
                            .map(|id| (*id).clone())
                            .collect());
                    }
                    query.exclusive_start_key = Some(key);
                }
                _ => return Ok(Vec::new()),
            }
        }
    }

    /// Checks once per process that the table holds this build's storage
    /// format ([`schema::TABLE_FORMAT`]); the first process to use a new
    /// table writes its format item. Another format is
    /// [`PipelineError::Format`]: the function fails its cold start naming
    /// both, whatever it was about to do.
    pub async fn check_format(&self) -> Result<()> {
        self.format_checked
            .get_or_try_init(|| async {
                if let Some(item) = self.get_unchecked(FORMAT_PK.to_owned(), FORMAT_SK).await? {
                    return schema::check_format_item(item);
                }
                if self
                    .put_absent_unchecked(schema::format_item(TABLE_FORMAT)?)
                    .await?
                {
                    tracing::info!(
                        format = TABLE_FORMAT,
                        "a new table: its format item written"
                    );
                    return Ok(());
                }
                // Another process wrote it meanwhile.
                let item = self
                    .get_unchecked(FORMAT_PK.to_owned(), FORMAT_SK)
                    .await?
                    .ok_or_else(|| {
                        PipelineError::store("the table's format item vanished", true)
                    })?;
                schema::check_format_item(item)
            })
            .await
            .copied()
    }

    /// The items at `keys`. The first time a process asks, the table's
    /// format item is read in the same request (consistently, as all of
    /// it) and checked: one round trip on one connection, where reading it
    /// alongside would open a second connection on every cold start.
    async fn items_checking_format(
        &self,
        keys: &[(String, String)],
        read: Read,
    ) -> Result<Vec<Item>> {
        if self.format_checked.get().is_some() {
            return self.get_items_unchecked(keys, read).await;
        }
        let mut with_format = keys.to_vec();
        with_format.push((FORMAT_PK.to_owned(), FORMAT_SK.to_owned()));
        let mut items = self
            .get_items_unchecked(&with_format, Read::Consistent)
            .await?;
        match items.iter().position(schema::is_format_item) {
            Some(at) => {
                schema::check_format_item(items.swap_remove(at))?;
                // Another read of this process may have set it meanwhile.
                let _ = self.format_checked.set(());
            }
            // A table no process has used yet: written (or, in a race,
            // read) once.
            None => self.check_format().await?,
        }
        Ok(items)
    }

    /// Registers `app` for the reconciler's sweep at `at` (kept if it is
    /// registered already): done before its first endpoint is written.
    pub async fn register_app(&self, app: &AppId, at: DateTime<Utc>) -> Result<()> {
        use serde_dynamo::AttributeValue as Value;
        let register = crate::dynamo_http::Update::new(
            &self.table,
            SWEPT_APPS_PK,
            app.as_str(),
            "SET registered_at = if_not_exists(registered_at, :at), kind = :kind".to_owned(),
        )
        .value(":at", Value::S(at.to_rfc3339()))
        .value(":kind", Value::S(KIND_SWEPT_APP.to_owned()));
        let _g = self.write_guard().await?;
        self.http.update_item(&register).await.map_err(direct_error)
    }

    /// One page of an app's event shard `shard`'s day partitions (see
    /// [`Store::sweep_page`]): one query of the day the position is in,
    /// heads only; past a day's last page, the next day's start.
    async fn sweep_days_page(
        &self,
        app: &AppId,
        shard: u32,
        position: &str,
        floor: DateTime<Utc>,
        cutoff: DateTime<Utc>,
    ) -> Result<SweepPage> {
        use serde_dynamo::AttributeValue as Value;
        let floor_id = EventId::time_floor(floor);
        let below = EventId::time_floor(cutoff);
        let low = if position > floor_id.as_str() {
            position.to_owned()
        } else {
            floor_id.as_str().to_owned()
        };
        let mut page = SweepPage::default();
        if low.as_str() >= below.as_str() {
            // Past the cutoff (a queue backlog moved it back): the mark
            // stays where it is.
            page.position = low;
            page.reached = cutoff;
            page.done = true;
            return Ok(page);
        }
        let from = EventId::parse(&low)
            .map(|id| id.created_at())
            .unwrap_or(floor);
        let day = day_start(from);
        let query = Query::new(&self.table, "PK = :pk AND SK BETWEEN :low AND :below")
            .eventually_consistent()
            .value(":pk", Value::S(event_day_pk(app, day, shard)))
            .value(":low", Value::S(low.clone()))
            .value(":below", Value::S(below.as_str().to_owned()))
            .projection(HEAD_PROJECTION)
            .name("#sk", SK)
            .filter("attribute_exists(listed)");
        let answer = {
            let _g = self.guard().await;
            self.http.query(&query).await.map_err(direct_error)?
        };
        for item in answer.items {
            // BETWEEN includes both ends: time floors are never ids, and
            // the position was read before.
            if text_of(&item, SK).is_some_and(|sk| sk == low || sk >= below.as_str()) {
                continue;
            }
            match event_head(item) {
                Ok(head) => page.events.push(head),
                Err(key) => page.unreadable.push(key),
            }
        }
        let next_day = day + chrono::TimeDelta::days(1);
        match answer.last_evaluated_key.filter(|k| !k.is_empty()) {
            Some(key) => {
                let last = text_of(&key, SK)
                    .ok_or_else(|| corrupt("query page", "no sort key in its last key"))?;
                page.position = last.to_owned();
                page.reached = EventId::parse(last).map_or(from, |id| id.created_at());
            }
            None if next_day < cutoff => {
                page.position = EventId::time_floor(next_day).as_str().to_owned();
                page.reached = next_day;
            }
            None => {
                page.position = below.as_str().to_owned();
                page.reached = cutoff;
                page.done = true;
            }
        }
        Ok(page)
    }

    /// One page of time-index shard `shard` (listed fan-outs written after
    /// their creation), by written time: its entries, then their events'
    /// heads by key.
    async fn sweep_late_page(
        &self,
        shard: u32,
        position: &str,
        floor: DateTime<Utc>,
        cutoff: DateTime<Utc>,
    ) -> Result<SweepPage> {
        let floor_key = due_time(floor);
        let below = format!("{}#", due_time(cutoff));
        let low = if position > floor_key.as_str() {
            position.to_owned()
        } else {
            floor_key
        };
        if low >= below {
            // Past the cutoff (a queue backlog moved it back): the mark
            // stays where it is.
            return Ok(SweepPage {
                position: low,
                reached: cutoff,
                done: true,
                ..SweepPage::default()
            });
        }
        let answer = self
            .gsi3_page(sweep_pk_of_shard(shard), &low, &below, LATE_PAGE_LIMIT)
            .await?;
        let mut page = SweepPage {
            position: low.clone(),
            ..SweepPage::default()
        };
        let mut keys = Vec::new();
        for item in &answer.items {
            let Some(sk) = text_of(item, "GSI3SK") else {
                continue;
            };
            if sk == low || sk >= below.as_str() {
                continue;
            }
            page.position = sk.to_owned();
            match (text_of(item, PK), text_of(item, SK)) {
                (Some(pk), Some(table_sk)) => keys.push((pk.to_owned(), table_sk.to_owned())),
                _ => page.unreadable.push(sk.to_owned()),
            }
        }
        // Eventually consistent: written a reconcile period ago at least.
        for item in self
            .batch_get(keys, false, Some("SK, app_id, created_at, targets"))
            .await?
        {
            match event_head(item) {
                Ok(head) if !head.targets.is_empty() => page.events.push(head),
                Ok(_) => {}
                Err(key) => page.unreadable.push(key),
            }
        }
        match answer.last_evaluated_key.filter(|k| !k.is_empty()) {
            Some(key) => {
                if let Some(sk) = text_of(&key, "GSI3SK") {
                    page.position = sk.to_owned();
                }
                page.reached = time_of_sort_key(&page.position).unwrap_or(floor);
            }
            None => {
                page.position = due_time(cutoff);
                page.reached = cutoff;
                page.done = true;
            }
        }
        Ok(page)
    }

    /// After a conditional write of `wanted` answered "condition failed":
    /// whether the item holds exactly `wanted` now. The clients retry a
    /// request that timed out or met a 5xx, and such a retry can meet its
    /// own earlier try's write; versions never repeat and the state is
    /// compared whole, so equal means this write (or an identical one)
    /// applied. A lost race reads as lost. One consistent read, only when
    /// a condition failed.
    async fn delivery_holds(&self, wanted: &Delivery) -> Result<bool> {
        let (pk, sk) = delivery_key(&wanted.app_id, &wanted.id);
        let Some(item) = self.get(pk, &sk).await? else {
            return Ok(false);
        };
        let held = schema::delivery_from_item(item)? == *wanted;
        if held {
            tracing::info!(delivery_id = %wanted.id, version = wanted.version, "a conditional write met its own earlier try: applied");
        }
        Ok(held)
    }

    /// One page of GSI3 partition `pk`: entries with sort keys from `low`
    /// (inclusive; `""`: the first) to `below`, at most `limit`.
    async fn gsi3_page(
        &self,
        pk: String,
        low: &str,
        below: &str,
        limit: i32,
    ) -> Result<crate::dynamo_http::QueryPage> {
        use serde_dynamo::AttributeValue as Value;
        let mut query = if low.is_empty() {
            Query::new(&self.table, "GSI3PK = :pk AND GSI3SK < :below")
        } else {
            Query::new(
                &self.table,
                "GSI3PK = :pk AND GSI3SK BETWEEN :low AND :below",
            )
            .value(":low", Value::S(low.to_owned()))
        }
        .index(GSI_OVERDUE)
        .value(":pk", Value::S(pk))
        .value(":below", Value::S(below.to_owned()));
        query.limit = Some(limit);
        let _g = self.guard().await;
        self.http.query(&query).await.map_err(direct_error)
    }

    /// The item at (`pk`, `sk`), read consistently (the first read of a
    /// process carries the format item: [`Self::get_items`]).
    async fn get(&self, pk: String, sk: &str) -> Result<Option<Item>> {
        if self.format_checked.get().is_none() {
            let items = self
                .get_items(&[(pk, sk.to_owned())], Read::Consistent)
                .await?;
            return Ok(items.into_iter().next());
        }
        self.get_unchecked(pk, sk).await
    }

    async fn get_unchecked(&self, pk: String, sk: &str) -> Result<Option<Item>> {
        let _g = self.guard().await;
        self.http
            .get_item(&self.table, &pk, sk)
            .await
            .map_err(direct_error)
    }

    /// The items at `keys` that exist, in any order: BatchGetItem by 100,
    /// unprocessed keys (throttling) asked again a few times. `projection`:
    /// only these attributes.
    async fn batch_get(
        &self,
        keys: Vec<(String, String)>,
        consistent: bool,
        projection: Option<&str>,
    ) -> Result<Vec<Item>> {
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(crate::dynamo_http::BATCH_GET_MAX) {
            let mut pending = chunk.to_vec();
            // Unprocessed keys (throttling) are asked again, a few times.
            for round in 0..4u32 {
                if pending.is_empty() {
                    break;
                }
                if round > 0 {
                    tokio::time::sleep(Duration::from_millis(20 << round)).await;
                }
                let _g = self.guard().await;
                let page = self
                    .http
                    .batch_get_item(&self.table, &pending, consistent, projection)
                    .await
                    .map_err(direct_error)?;
                out.extend(page.items);
                pending = page.unprocessed;
            }
            if !pending.is_empty() {
                return Err(PipelineError::store(
                    "BatchGetItem left keys unprocessed (throttled); retry",
                    true,
                ));
            }
        }
        Ok(out)
    }

    /// Every item a base-table query finds, page after page: `build` sets
    /// its key condition and options on a query of the table.
    async fn query_all(
        &self,
        build: impl Fn(
            aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder,
        ) -> aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder,
    ) -> Result<Vec<HashMap<String, AttributeValue>>> {
        let mut out = Vec::new();
        let mut start: Option<HashMap<String, AttributeValue>> = None;
        loop {
            let _g = self.guard().await;
            let page = build(self.client().query().table_name(&self.table))
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| store_error("Query", e))?;
            out.extend(page.items.unwrap_or_default());
            match page.last_evaluated_key {
                Some(key) if !key.is_empty() => start = Some(key),
                _ => return Ok(out),
            }
        }
    }

    /// The query of an app's endpoint items.
    fn endpoints_of(
        query: aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder,
        app: &AppId,
    ) -> aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder {
        query
            .key_condition_expression("PK = :pk AND begins_with(SK, :ep)")
            .expression_attribute_values(":pk", s(app_pk(app)))
            .expression_attribute_values(":ep", s("EP#"))
    }

    /// Up to `limit` items of `query` (its key condition, with `:below`
    /// bound here, and options) with `sort` keys after `after` (exclusive;
    /// `""`: none read yet) and below `below`, in key order, each as `keep`
    /// reads it (`None`: skipped), page after page. The reconciler's reads:
    /// on the direct client.
    async fn sorted_range<T>(
        &self,
        query: Query<'_>,
        sort: &str,
        after: &str,
        below: &str,
        limit: usize,
        keep: impl Fn(&Item, &str) -> Option<T>,
    ) -> Result<Vec<T>> {
        let mut out = Vec::new();
        let mut query = query.value(":below", serde_dynamo::AttributeValue::S(below.to_owned()));
        while out.len() < limit {
            query.limit = Some(
                i32::try_from(limit - out.len() + 1)
                    .unwrap_or(1000)
                    .clamp(1, 1000),
            );
            let page = {
                let _g = self.guard().await;
                self.http.query(&query).await.map_err(direct_error)?
            };
            for item in &page.items {
                // A query on `sort` only finds items that have it.
                let key = text_of(item, sort)
                    .ok_or_else(|| corrupt("query page", format!("an item without {sort}")))?;
                // BETWEEN includes both ends: `after` was read before,
                // `below` is excluded.
                if key == after || key >= below || out.len() >= limit {
                    continue;
                }
                if let Some(entry) = keep(item, key) {
                    out.push(entry);
                }
            }
            match page.last_evaluated_key {
                Some(key) if !key.is_empty() => query.exclusive_start_key = Some(key),
                _ => break,
            }
        }
        Ok(out)
    }

    /// Up to `wanted` deliveries of one list source, newest first, with
    /// ids in `[lowest, below)` and matching its filter, reading at most
    /// [`LIST_READ_BUDGET`] items; with the id down to which the source
    /// was read when it was not read to its end (everything at or above
    /// that id is known).
    async fn list_source(
        &self,
        source: &ListSource,
        lowest: Option<&DeliveryId>,
        below: Option<&DeliveryId>,
        wanted: usize,
    ) -> Result<(Vec<Delivery>, Option<String>)> {
        let (pk_attr, sk_attr) = match source.index {
            None => (PK, SK),
            Some(GSI_BY_ENDPOINT) => ("GSI1PK", "GSI1SK"),
            Some(_) => ("GSI2PK", "GSI2SK"),
        };
        let mut found = Vec::new();
        let mut read = 0usize;
        let mut start: Option<HashMap<String, AttributeValue>> = None;
        loop {
            // Without a filter every item read is a match: read what is
            // wanted (and one to know more follow); with one, read ahead.
            let left = wanted.saturating_sub(found.len()) + 1;
            let page = if source.filter.is_empty() {
                left
            } else {
                (left * 4).max(100)
            }
            .min(LIST_READ_BUDGET.saturating_sub(read))
            .max(1);
            let mut q = self
                .client()
                .query()
                .table_name(&self.table)
                .scan_index_forward(false)
                .limit(i32::try_from(page).unwrap_or(1000))
                .set_exclusive_start_key(start.take())
                .expression_attribute_names("#pk", pk_attr)
                .expression_attribute_values(":pk", s(source.key.as_str()));
            if let Some(index) = source.index {
                q = q.index_name(index);
            }
            q = match (lowest, below) {
                (Some(lo), Some(hi)) => q
                    .key_condition_expression("#pk = :pk AND #sk BETWEEN :lo AND :hi")
                    .expression_attribute_names("#sk", sk_attr)
                    .expression_attribute_values(":lo", s(lo.as_str()))
                    .expression_attribute_values(":hi", s(hi.as_str())),
                (Some(lo), None) => q
                    .key_condition_expression("#pk = :pk AND #sk >= :lo")
                    .expression_attribute_names("#sk", sk_attr)
                    .expression_attribute_values(":lo", s(lo.as_str())),
                (None, Some(hi)) => q
                    .key_condition_expression("#pk = :pk AND #sk < :hi")
                    .expression_attribute_names("#sk", sk_attr)
                    .expression_attribute_values(":hi", s(hi.as_str())),
                (None, None) => q.key_condition_expression("#pk = :pk"),
            };
            if !source.filter.is_empty() {
                let mut terms = Vec::new();
                for (attr, value) in &source.filter {
                    let (name, val) = (format!("#f_{attr}"), format!(":f_{attr}"));
                    terms.push(format!("{name} = {val}"));
                    q = q
                        .expression_attribute_names(&name, *attr)
                        .expression_attribute_values(&val, s(value.as_str()));
                }
                q = q.filter_expression(terms.join(" AND "));
            }
            let out = {
                let _g = self.guard().await;
                q.send().await.map_err(|e| store_error("Query", e))?
            };
            read += usize::try_from(out.scanned_count).unwrap_or(0);
            for item in out.items.unwrap_or_default() {
                let delivery = schema::delivery_from_item(Item::from(item))?;
                // BETWEEN includes `hi` (a cursor): it was listed before.
                if below.is_none_or(|hi| delivery.id < *hi) {
                    found.push(delivery);
                }
            }
            let next = out.last_evaluated_key.filter(|k| !k.is_empty());
            match next {
                None => return Ok((found, None)),
                Some(key) if found.len() > wanted || read >= LIST_READ_BUDGET => {
                    let floor = key
                        .get(sk_attr)
                        .and_then(|v| v.as_s().ok())
                        .cloned()
                        .ok_or_else(|| corrupt("query page", "no sort key in its last key"))?;
                    return Ok((found, Some(floor)));
                }
                Some(key) => start = Some(key),
            }
        }
    }

    async fn transact(
        &self,
        items: Vec<TransactWriteItem>,
    ) -> std::result::Result<(), TransactFailure> {
        self.transact_with(items, None).await
    }

    /// [`Self::transact`], idempotent under `token` (a retry of a request
    /// that applied succeeds instead of failing its conditions).
    async fn transact_once(
        &self,
        items: Vec<TransactWriteItem>,
        token: &str,
    ) -> std::result::Result<(), TransactFailure> {
        self.transact_with(items, Some(token)).await
    }

    async fn transact_with(
        &self,
        items: Vec<TransactWriteItem>,
        token: Option<&str>,
    ) -> std::result::Result<(), TransactFailure> {
        let _g = self.write_guard().await.map_err(TransactFailure::Other)?;
        match self
            .client()
            .transact_write_items()
            .set_transact_items(Some(items))
            .set_client_request_token(token.map(str::to_owned))
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(err) => {
                if let Some(reasons) = crate::error::cancellation_reasons(&err) {
                    let reasons = reasons.to_vec();
                    if reasons.iter().any(condition_failed) {
                        return Err(TransactFailure::Conditions(reasons));
                    }
                    if reasons
                        .iter()
                        .any(|r| r.code() == Some("TransactionConflict"))
                    {
                        return Err(TransactFailure::Contended);
                    }
                }
                Err(TransactFailure::Other(store_error(
                    "TransactWriteItems",
                    err,
                )))
            }
        }
    }
}

enum TransactFailure {
    /// Cancelled because of the conditions at these positions.
    Conditions(Vec<CancellationReason>),
    /// Cancelled because another transaction held one of the items.
    Contended,
    Other(PipelineError),
}

impl Store for DynamoStore {
    async fn list_endpoints(&self, app: &AppId) -> Result<Vec<Endpoint>> {
        let items = self
            .query_all(|q| Self::endpoints_of(q, app).consistent_read(true))
            .await?;
        if let Some(sealer) = &self.sealer {
            sealer
                .prefetch(items.iter().flat_map(stored_secrets))
                .await?;
        }
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            out.push(self.endpoint_from_sdk(item).await?);
        }
        Ok(out)
    }

    async fn list_routes(&self, app: &AppId) -> Result<Vec<EndpointRoute>> {
        use serde_dynamo::AttributeValue as Value;
        // Every ingest request asks: on the direct client (the SDK's
        // `endpoints_of` query, projected to what routing reads).
        let query = Query::new(&self.table, "PK = :pk AND begins_with(SK, :ep)")
            .value(":pk", Value::S(app_pk(app)))
            .value(":ep", Value::S("EP#".into()))
            .projection("#id, #types, #disabled")
            .name("#id", "id")
            .name("#types", "event_types")
            .name("#disabled", "disabled");
        let items = {
            let _g = self.guard().await;
            self.http.query_all(&query).await.map_err(direct_error)?
        };
        items
            .into_iter()
            .map(|item| serde_dynamo::from_item(item).map_err(|e| corrupt("endpoint item", e)))
            .collect()
    }

    async fn get_endpoint(&self, app: &AppId, id: &EndpointId) -> Result<Option<Endpoint>> {
        match self.get(app_pk(app), &endpoint_sk(id)).await? {
            Some(item) => Ok(Some(self.endpoint_from_sdk(into_sdk(item)).await?)),
            None => Ok(None),
        }
    }

    async fn put_endpoint(&self, endpoint: &Endpoint, max_per_app: u32) -> Result<bool> {
        let item = self.endpoint_to_sdk(endpoint).await?;
        // The app's registration counts its endpoints (and registers it for
        // the sweep with its first): the count and the endpoint in one
        // transaction, so concurrent creations never pass the limit.
        let count = Update::builder()
            .table_name(&self.table)
            .set_key(Some(Self::key(
                SWEPT_APPS_PK.to_owned(),
                endpoint.app_id.as_str(),
            )))
            .update_expression(
                "SET registered_at = if_not_exists(registered_at, :at), kind = :kind ADD endpoints :one",
            )
            .condition_expression("attribute_not_exists(endpoints) OR endpoints < :max")
            .expression_attribute_values(":at", s(endpoint.created_at.to_rfc3339()))
            .expression_attribute_values(":kind", s(KIND_SWEPT_APP))
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
            .expression_attribute_values(":max", AttributeValue::N(max_per_app.to_string()))
            .build()
            .map_err(|e| corrupt("update", e))?;
        let put = aws_sdk_dynamodb::types::Put::builder()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(PK)")
            .build()
            .map_err(|e| corrupt("put", e))?;
        let items = vec![
            TransactWriteItem::builder().update(count).build(),
            TransactWriteItem::builder().put(put).build(),
        ];
        // The endpoint's id names the request: a retry of one that applied
        // is answered as applied (DynamoDB keeps tokens 10 minutes).
        match self.transact_once(items, endpoint.id.as_str()).await {
            Ok(()) => Ok(true),
            Err(TransactFailure::Conditions(reasons))
                if reasons.first().is_some_and(condition_failed) =>
            {
                Ok(false)
            }
            Err(TransactFailure::Conditions(_)) => Err(corrupt(
                "endpoint",
                format!("{} exists already", endpoint.id),
            )),
            Err(TransactFailure::Contended) => Err(PipelineError::store(
                "the app's endpoints changed meanwhile; retry",
                true,
            )),
            Err(TransactFailure::Other(err)) => Err(err),
        }
    }

    async fn update_endpoint(&self, endpoint: &Endpoint, expected_version: u64) -> Result<bool> {
        let item = self.endpoint_to_sdk(endpoint).await?;
        let _g = self.write_guard().await?;
        let request = self
            .client()
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item));
        let result = versioned(request, expected_version).send().await;
        condition_to_bool(result, "PutItem")
    }

    async fn get_event_type(&self, name: &EventType) -> Result<Option<EventTypeDef>> {
        self.get(CATALOG_PK.to_owned(), &event_type_sk(name.as_str()))
            .await?
            .map(schema::event_type_from_item)
            .transpose()
    }

    async fn put_event_type(&self, def: &EventTypeDef) -> Result<()> {
        let item = into_sdk(schema::event_type_item(def)?);
        let _g = self.write_guard().await?;
        self.client()
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| corrupt("put", e))?;
        Ok(())
    }

    async fn delete_event_type(&self, name: &EventType) -> Result<bool> {
        self.delete_if(
            Self::key(CATALOG_PK.to_owned(), &event_type_sk(name.as_str())),
            "attribute_exists(PK)",
            None,
        )
        .await
    }

    async fn list_event_types(
        &self,
        after: Option<&EventType>,
        limit: usize,
    ) -> Result<(Vec<EventTypeDef>, bool)> {
        let mut out = Vec::new();
        let mut start = after.map(|a| Self::key(CATALOG_PK.to_owned(), &event_type_sk(a.as_str())));
        // One more than asked: whether a next page exists.
        while out.len() <= limit {
            let _g = self.guard().await;
            let page = self
                .client()
                .query()
                .table_name(&self.table)
                .key_condition_expression("PK = :pk AND begins_with(SK, :et)")
                .expression_attribute_values(":pk", s(CATALOG_PK))
                .expression_attribute_values(":et", s("ET#"))
                .limit(
                    i32::try_from(limit + 1 - out.len())
                        .unwrap_or(101)
                        .clamp(1, 101),
                )
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| store_error("Query", e))?;
            for item in page.items.unwrap_or_default() {
                out.push(schema::event_type_from_item(Item::from(item))?);
            }
            match page.last_evaluated_key {
                Some(key) if !key.is_empty() => start = Some(key),
                _ => break,
            }
        }
        let more = out.len() > limit;
        out.truncate(limit);
        Ok((out, more))
    }

    async fn event_type_names(&self) -> Result<Vec<String>> {
        let items = self
            .query_all(|q| {
                q.key_condition_expression("PK = :pk AND begins_with(SK, :et)")
                    .expression_attribute_values(":pk", s(CATALOG_PK))
                    .expression_attribute_values(":et", s("ET#"))
                    .projection_expression("SK")
            })
            .await?;
        items
            .iter()
            .map(|item| {
                item.get(SK)
                    .and_then(|v| v.as_s().ok())
                    .and_then(|sk| sk.strip_prefix("ET#"))
                    .map(str::to_owned)
                    .ok_or_else(|| corrupt("event type item", "no ET# sort key"))
            })
            .collect()
    }

    async fn reserve_send_slots(
        &self,
        id: &EndpointId,
        per_second: u32,
        count: u32,
        likely_busy: bool,
        now: DateTime<Utc>,
    ) -> Result<i64> {
        let current = hookline_core::rate::slot_of(now, per_second);
        let count = i64::from(count.max(1));
        let n = |v: i64| AttributeValue::N(v.to_string());
        let expires = n((now + chrono::TimeDelta::days(1)).timestamp());
        // Two conditional updates cover every state, the likely one first:
        // one write per call unless the guess was wrong or a race was lost.
        let mut busy = likely_busy;
        for _ in 0..6 {
            if busy {
                // Busy: take the next free slots.
                let taken = {
                    let _g = self.write_guard().await?;
                    self.client()
                        .update_item()
                        .table_name(&self.table)
                        .set_key(Some(Self::key(rate_pk(id), RATE_SK)))
                        .update_expression("SET expires_at = :exp ADD next_slot :count")
                        .condition_expression("per_second = :rate AND next_slot >= :now")
                        .expression_attribute_values(":exp", expires.clone())
                        .expression_attribute_values(":count", n(count))
                        .expression_attribute_values(":rate", n(i64::from(per_second)))
                        .expression_attribute_values(":now", n(current))
                        .return_values(ReturnValue::UpdatedNew)
                        .send()
                        .await
                };
                match taken {
                    Ok(out) => {
                        let next = out
                            .attributes
                            .as_ref()
                            .and_then(|a| a.get("next_slot"))
                            .and_then(|v| v.as_n().ok())
                            .and_then(|v| v.parse::<i64>().ok())
                            .ok_or_else(|| corrupt("rate limiter", "no next_slot returned"))?;
                        return Ok(next - count);
                    }
                    Err(err) if crate::error::is_condition_failure(&err) => {}
                    Err(err) => return Err(store_error("UpdateItem", err)),
                }
            } else {
                // Idle, new, or numbered for another rate: from the slot of now.
                let started = {
                    let _g = self.write_guard().await?;
                    self.client()
                        .update_item()
                        .table_name(&self.table)
                        .set_key(Some(Self::key(rate_pk(id), RATE_SK)))
                        .update_expression(
                            "SET kind = :kind, next_slot = :next, per_second = :rate, expires_at = :exp",
                        )
                        .condition_expression(
                            "attribute_not_exists(next_slot) OR next_slot < :now OR per_second <> :rate",
                        )
                        .expression_attribute_values(":kind", s(KIND_RATE))
                        .expression_attribute_values(":next", n(current + count))
                        .expression_attribute_values(":rate", n(i64::from(per_second)))
                        .expression_attribute_values(":now", n(current))
                        .expression_attribute_values(":exp", expires.clone())
                        .send()
                        .await
                };
                if condition_to_bool(started, "UpdateItem")? {
                    return Ok(current);
                }
            }
            busy = !busy;
        }
        Err(PipelineError::store(
            "rate limiter: lost three races in a row",
            true,
        ))
    }

    async fn add_endpoint_stats(
        &self,
        app: &AppId,
        id: &EndpointId,
        hour: DateTime<Utc>,
        delta: &StatsDelta,
    ) -> Result<()> {
        let pk = stats_pk(app, id);
        let mut counters: Vec<(String, u64)> = [
            (STATS_DELIVERED, delta.delivered),
            (STATS_FAILED, delta.failed),
            (STATS_ATTEMPTS, delta.attempts),
            (STATS_ATTEMPTS_OK, delta.attempts_ok),
        ]
        .into_iter()
        .map(|(name, n)| (name.to_owned(), n))
        .collect();
        counters.extend(
            delta
                .latency
                .iter()
                .map(|(bucket, n)| (stats_latency_attr(*bucket), *n)),
        );
        counters.retain(|(_, n)| *n > 0);
        let retention =
            chrono::Duration::from_std(self.retention).map_err(|e| corrupt("retention", e))?;
        // One counter update per item; ADD creates what is missing. Every
        // deliver invocation makes one: on the direct client.
        fn update<'a>(
            table: &'a str,
            pk: &'a str,
            sk: &'a str,
            adds: Vec<(String, i64)>,
            expires: DateTime<Utc>,
        ) -> crate::dynamo_http::Update<'a> {
            use serde_dynamo::AttributeValue as Value;
            let mut expression = String::from("SET kind = :kind, expires_at = :exp ADD ");
            for i in 0..adds.len() {
                if i > 0 {
                    expression.push_str(", ");
                }
                expression.push_str(&format!("#c{i} :c{i}"));
            }
            let mut update = crate::dynamo_http::Update::new(table, pk, sk, expression)
                .value(":kind", Value::S(KIND_STATS.to_owned()))
                .value(":exp", Value::N(expires.timestamp().to_string()));
            for (i, (name, n)) in adds.into_iter().enumerate() {
                update = update
                    .name(format!("#c{i}"), name)
                    .value(format!(":c{i}"), Value::N(n.to_string()));
            }
            update
        }
        if !counters.is_empty() {
            let adds = counters
                .into_iter()
                .map(|(name, n)| {
                    Ok((
                        name,
                        i64::try_from(n).map_err(|e| corrupt("stats count", e))?,
                    ))
                })
                .collect::<Result<Vec<_>>>()?;
            let sk = stats_hour_sk(hour);
            let request = update(&self.table, &pk, &sk, adds, hour + retention);
            let _g = self.write_guard().await?;
            self.http
                .update_item(&request)
                .await
                .map_err(direct_error)?;
        }
        if delta.waiting != 0 {
            let request = update(
                &self.table,
                &pk,
                STATS_WAITING_SK,
                vec![(STATS_WAITING.to_owned(), delta.waiting)],
                Utc::now() + retention,
            );
            let _g = self.write_guard().await?;
            self.http
                .update_item(&request)
                .await
                .map_err(direct_error)?;
        }
        Ok(())
    }

    async fn endpoint_stats(
        &self,
        app: &AppId,
        id: &EndpointId,
        since: DateTime<Utc>,
    ) -> Result<EndpointHours> {
        let from = stats_hour_sk(hookline_core::stats::hour_of(since));
        let count = |item: &HashMap<String, AttributeValue>, name: &str| -> Result<i64> {
            match item.get(name) {
                None => Ok(0),
                Some(v) => v
                    .as_n()
                    .ok()
                    .and_then(|n| n.parse::<i64>().ok())
                    .ok_or_else(|| corrupt("stats counter", format!("{name} is not a number"))),
            }
        };
        let unsigned = |n: i64| u64::try_from(n.max(0)).expect("non-negative");
        let mut hours = Vec::new();
        let mut waiting = 0;
        let items = self
            .query_all(|q| {
                q.key_condition_expression("PK = :pk AND SK >= :from")
                    .expression_attribute_values(":pk", s(stats_pk(app, id)))
                    .expression_attribute_values(":from", s(from.clone()))
            })
            .await?;
        for item in items {
            let sk = item.get(SK).and_then(|v| v.as_s().ok()).map(String::as_str);
            if sk == Some(STATS_WAITING_SK) {
                waiting = count(&item, STATS_WAITING)?;
                continue;
            }
            let at = sk
                .and_then(|sk| sk.strip_prefix("H#"))
                .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                .map(|t| t.with_timezone(&Utc))
                .ok_or_else(|| corrupt("stats hour", format!("sort key {sk:?}")))?;
            let mut hour = StatsDelta {
                delivered: unsigned(count(&item, STATS_DELIVERED)?),
                failed: unsigned(count(&item, STATS_FAILED)?),
                attempts: unsigned(count(&item, STATS_ATTEMPTS)?),
                attempts_ok: unsigned(count(&item, STATS_ATTEMPTS_OK)?),
                ..StatsDelta::default()
            };
            for bucket in 0..hookline_core::stats::LATENCY_BUCKETS {
                let n = unsigned(count(&item, &stats_latency_attr(bucket))?);
                if n > 0 {
                    hour.latency.insert(bucket, n);
                }
            }
            hours.push((at, hour));
        }
        Ok((hours, waiting))
    }

    async fn disable_endpoint(
        &self,
        app: &AppId,
        id: &EndpointId,
        reason: &str,
        expected_version: u64,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        let _g = self.write_guard().await?;
        let result = self
            .client()
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(app_pk(app), &endpoint_sk(id))))
            .update_expression(
                "SET disabled = :t, disabled_reason = :r, updated_at = :now ADD version :one",
            )
            .condition_expression(VERSION_CONDITION)
            .expression_attribute_values(
                ":expected_version",
                AttributeValue::N(expected_version.to_string()),
            )
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
            .expression_attribute_values(":t", AttributeValue::Bool(true))
            .expression_attribute_values(":r", s(reason))
            .expression_attribute_values(":now", av(&now)?)
            .send()
            .await;
        // A deleted endpoint stays deleted; a changed one is not judged
        // from its earlier state.
        condition_to_bool(result, "UpdateItem")
    }

    async fn set_failing_since(
        &self,
        app: &AppId,
        id: &EndpointId,
        since: Option<DateTime<Utc>>,
        expected_version: u64,
    ) -> Result<bool> {
        let request = self
            .client()
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(app_pk(app), &endpoint_sk(id))))
            .expression_attribute_values(":one", AttributeValue::N("1".into()));
        let request = match since {
            Some(at) => request
                .update_expression("SET failing_since = :since ADD version :one")
                .expression_attribute_values(":since", av(&at)?),
            None => request.update_expression("REMOVE failing_since ADD version :one"),
        };
        let request = request
            .condition_expression(VERSION_CONDITION)
            .expression_attribute_values(
                ":expected_version",
                AttributeValue::N(expected_version.to_string()),
            );
        let _g = self.write_guard().await?;
        condition_to_bool(request.send().await, "UpdateItem")
    }

    async fn set_circuit(
        &self,
        app: &AppId,
        id: &EndpointId,
        version: u64,
        circuit: Option<&hookline_core::circuit::Circuit>,
        expected: Option<DateTime<Utc>>,
    ) -> Result<bool> {
        let request = self
            .client()
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(app_pk(app), &endpoint_sk(id))));
        let request = match circuit {
            Some(c) => request
                .update_expression(
                    "SET circuit = :circuit REMOVE unanswered_count, unanswered_since",
                )
                .expression_attribute_values(":circuit", av(c)?),
            None => request.update_expression("REMOVE circuit, unanswered_count, unanswered_since"),
        };
        // A deleted endpoint stays deleted; a PATCH since, or another
        // deliver's change, wins.
        let request =
            request.expression_attribute_values(":version", AttributeValue::N(version.to_string()));
        let request = match expected {
            Some(until) => request
                .condition_expression(
                    "attribute_exists(PK) AND version = :version AND circuit.open_until = :expected",
                )
                .expression_attribute_values(":expected", av(&until)?),
            None => request.condition_expression(
                "attribute_exists(PK) AND version = :version AND attribute_not_exists(circuit)",
            ),
        };
        let _g = self.write_guard().await?;
        condition_to_bool(request.send().await, "UpdateItem")
    }

    async fn add_unanswered(
        &self,
        app: &AppId,
        id: &EndpointId,
        version: u64,
        now: DateTime<Utc>,
        run_from: DateTime<Utc>,
    ) -> Result<Option<u32>> {
        let ms = |t: DateTime<Utc>| AttributeValue::N(t.timestamp_millis().to_string());
        let key = Self::key(app_pk(app), &endpoint_sk(id));
        // The run goes on (one request), or, begun too long ago or never,
        // starts over with this one (a second).
        let attempts = [
            (
                "SET unanswered_since = if_not_exists(unanswered_since, :now) ADD unanswered_count :one",
                "attribute_exists(PK) AND version = :version AND attribute_not_exists(circuit) \
                 AND (attribute_not_exists(unanswered_since) OR unanswered_since >= :from)",
            ),
            (
                "SET unanswered_since = :now, unanswered_count = :one",
                "attribute_exists(PK) AND version = :version AND attribute_not_exists(circuit)",
            ),
        ];
        for (i, (update, condition)) in attempts.into_iter().enumerate() {
            let request = self
                .client()
                .update_item()
                .table_name(&self.table)
                .set_key(Some(key.clone()))
                .update_expression(update)
                .condition_expression(condition)
                .expression_attribute_values(":now", ms(now))
                .expression_attribute_values(":one", AttributeValue::N("1".into()))
                .expression_attribute_values(":version", AttributeValue::N(version.to_string()))
                // ALL_NEW, not UPDATED_NEW: moto's UPDATED_NEW left the
                // ADDed count out of this update (seen in the moto test).
                .return_values(ReturnValue::AllNew);
            let request = if i == 0 {
                request.expression_attribute_values(":from", ms(run_from))
            } else {
                request
            };
            let written = {
                let _g = self.write_guard().await?;
                request.send().await
            };
            match written {
                Ok(out) => {
                    let count = out
                        .attributes
                        .as_ref()
                        .and_then(|a| a.get("unanswered_count"))
                        .and_then(|v| v.as_n().ok())
                        .and_then(|v| v.parse::<u32>().ok())
                        .ok_or_else(|| corrupt("endpoint item", "no unanswered_count returned"))?;
                    return Ok(Some(count));
                }
                Err(err) if crate::error::is_condition_failure(&err) => {}
                Err(err) => return Err(store_error("UpdateItem", err)),
            }
        }
        Ok(None)
    }

    async fn take_turn(
        &self,
        app: &AppId,
        id: &EndpointId,
        now: DateTime<Utc>,
        gap: std::time::Duration,
    ) -> Result<Option<DateTime<Utc>>> {
        let ms = |v: i64| AttributeValue::N(v.to_string());
        let (now_ms, gap_ms) = (
            now.timestamp_millis(),
            i64::try_from(gap.as_millis()).map_err(|e| corrupt("turn gap", e))?,
        );
        let key = Self::key(app_pk(app), &endpoint_sk(id));
        // Busy: the next free turn, moved on (one request); idle or new:
        // now's (another). A race lost to the other case tries again.
        for _ in 0..3 {
            let busy = {
                let _g = self.write_guard().await?;
                self.client()
                    .update_item()
                    .table_name(&self.table)
                    .set_key(Some(key.clone()))
                    .update_expression("ADD turn_next :gap")
                    .condition_expression("attribute_exists(PK) AND turn_next >= :now")
                    .expression_attribute_values(":gap", ms(gap_ms))
                    .expression_attribute_values(":now", ms(now_ms))
                    .return_values(ReturnValue::AllNew)
                    .send()
                    .await
            };
            match busy {
                Ok(out) => {
                    let next = out
                        .attributes
                        .as_ref()
                        .and_then(|a| a.get("turn_next"))
                        .and_then(|v| v.as_n().ok())
                        .and_then(|v| v.parse::<i64>().ok())
                        .ok_or_else(|| corrupt("endpoint item", "no turn_next returned"))?;
                    let turn = DateTime::from_timestamp_millis(next - gap_ms)
                        .ok_or_else(|| corrupt("endpoint item", "turn_next out of range"))?;
                    return Ok(Some(turn));
                }
                Err(err) if crate::error::is_condition_failure(&err) => {}
                Err(err) => return Err(store_error("UpdateItem", err)),
            }
            let idle = {
                let _g = self.write_guard().await?;
                self.client()
                    .update_item()
                    .table_name(&self.table)
                    .set_key(Some(key.clone()))
                    .update_expression("SET turn_next = :next")
                    .condition_expression(
                        "attribute_exists(PK) AND (attribute_not_exists(turn_next) OR turn_next < :now)",
                    )
                    .expression_attribute_values(":next", ms(now_ms + gap_ms))
                    .expression_attribute_values(":now", ms(now_ms))
                    .send()
                    .await
            };
            match idle {
                Ok(_) => {
                    let turn = DateTime::from_timestamp_millis(now_ms)
                        .ok_or_else(|| corrupt("turn", "now out of range"))?;
                    return Ok(Some(turn));
                }
                Err(err) if crate::error::is_condition_failure(&err) => {}
                Err(err) => return Err(store_error("UpdateItem", err)),
            }
        }
        // Both conditions failing three times over: the endpoint is gone.
        Ok(None)
    }

    async fn clear_unanswered(&self, app: &AppId, id: &EndpointId) -> Result<()> {
        let request = self
            .client()
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(app_pk(app), &endpoint_sk(id))))
            .update_expression("REMOVE unanswered_count, unanswered_since")
            .condition_expression("attribute_exists(unanswered_count)");
        let _g = self.write_guard().await?;
        // Already clear: nothing to do.
        condition_to_bool(request.send().await, "UpdateItem").map(|_| ())
    }

    async fn get_idempotency(&self, app: &AppId, key: &str) -> Result<Option<IdempotencyRecord>> {
        match self.get(idempotency_pk(app, key), IDEMPOTENCY_SK).await? {
            Some(item) => schema::idempotency_from_item(item, Utc::now()),
            None => Ok(None),
        }
    }

    async fn commit_event(&self, new: &NewEvent) -> Result<CommitOutcome> {
        // A keyed event moves its key's head in the same transaction.
        let ordered = new.key_head.is_some();
        if new.deliveries.is_empty() && new.fanout_remaining.is_empty() && !ordered {
            // One event item: conditional puts, not a transaction (which
            // costs every item twice).
            return match &new.idempotency {
                None => {
                    self.put_event_once(new, new.event.created_at).await?;
                    Ok(CommitOutcome::Committed)
                }
                Some(record) => self.commit_keyed(new, record).await,
            };
        }
        let items = outbox::transact_items(&self.table, new, self.retention)?;
        let idem_position = items.len() - 1;
        match self.transact(items).await {
            Ok(()) => Ok(CommitOutcome::Committed),
            Err(TransactFailure::Conditions(reasons)) => {
                let idem_failed = new.idempotency.is_some()
                    && reasons.get(idem_position).is_some_and(condition_failed);
                let head_moved = ordered
                    && reasons
                        .get(outbox::KEY_HEAD_POSITION)
                        .is_some_and(condition_failed);
                if head_moved && !idem_failed {
                    return Ok(CommitOutcome::OrderMoved);
                }
                if let (true, Some(record)) = (idem_failed, &new.idempotency) {
                    // Taken: by a concurrent request, or by this one
                    // earlier (which may have stopped before its event).
                    self.key_taken(new, record).await
                } else {
                    Err(PipelineError::store(
                        format!("event transaction cancelled: {reasons:?}"),
                        false,
                    ))
                }
            }
            Err(TransactFailure::Contended) => Ok(CommitOutcome::Contended),
            Err(TransactFailure::Other(err)) => Err(err),
        }
    }

    async fn get_events(&self, ids: &[(AppId, EventId)]) -> Result<Vec<StoredEvent>> {
        let keys = ids.iter().map(|(app, id)| event_key(app, id)).collect();
        self.batch_get(keys, true, None)
            .await?
            .into_iter()
            .map(schema::event_from_item)
            .collect()
    }

    async fn get_event(&self, app: &AppId, id: &EventId) -> Result<Option<StoredEvent>> {
        let (pk, sk) = event_key(app, id);
        self.get(pk, &sk)
            .await?
            .map(schema::event_from_item)
            .transpose()
    }

    async fn materialise_fanout(
        &self,
        app: &AppId,
        event_id: &EventId,
        version: u32,
        deliveries: &[Delivery],
        remaining: &[EndpointId],
    ) -> Result<bool> {
        self.materialise_at(app, event_id, version, deliveries, remaining)
            .await
    }

    async fn list_deliveries(&self, app: &AppId, q: &DeliveryQuery) -> Result<DeliveryPage> {
        let limit = q.limit.clamp(1, 500);
        let sources = list_sources(app, q);
        let (lowest, below) = (q.lowest_id(), q.below_id());
        if let (Some(lo), Some(hi)) = (&lowest, &below) {
            // A cursor below the window's start: nothing is left (and a
            // key condition `BETWEEN lo AND hi` with lo > hi is refused).
            if lo >= hi {
                return Ok(DeliveryPage::default());
            }
        }
        // Every source at once, each up to one more than asked (to know
        // whether more follow).
        let pages = futures::future::try_join_all(
            sources
                .iter()
                .map(|source| self.list_source(source, lowest.as_ref(), below.as_ref(), limit)),
        )
        .await?;
        // A source read only part way is known down to its floor: the
        // merge keeps what every source has been read past.
        let floor = pages.iter().filter_map(|(_, floor)| floor.clone()).max();
        let mut rows: Vec<Delivery> = pages
            .into_iter()
            .flat_map(|(rows, _)| rows)
            .filter(|d| floor.as_deref().is_none_or(|f| d.id.as_str() >= f))
            .collect();
        // Newest first.
        rows.sort_by(|a, b| b.id.cmp(&a.id));
        let next_cursor = if rows.len() > limit {
            rows.truncate(limit);
            rows.last().map(|d| d.id.clone())
        } else {
            floor
                .map(|f| DeliveryId::parse(&f))
                .transpose()
                .map_err(|e| corrupt("delivery list", e))?
        };
        // Post-filters keep the page's window (so the cursor stays exact).
        rows.retain(|d| {
            &d.app_id == app
                && q.status.is_none_or(|st| d.status == st)
                && q.endpoint_id.as_ref().is_none_or(|ep| &d.endpoint_id == ep)
                && q.event_type
                    .as_deref()
                    .is_none_or(|t| d.event_type.as_str() == t)
        });
        Ok(DeliveryPage {
            items: rows,
            next_cursor,
        })
    }

    async fn delete_endpoint(&self, app: &AppId, id: &EndpointId) -> Result<bool> {
        let delete = aws_sdk_dynamodb::types::Delete::builder()
            .table_name(&self.table)
            .set_key(Some(Self::key(app_pk(app), &endpoint_sk(id))))
            .condition_expression("attribute_exists(PK)")
            .build()
            .map_err(|e| corrupt("delete", e))?;
        let count = Update::builder()
            .table_name(&self.table)
            .set_key(Some(Self::key(SWEPT_APPS_PK.to_owned(), app.as_str())))
            .update_expression("ADD endpoints :minus_one")
            .condition_expression("attribute_exists(PK)")
            .expression_attribute_values(":minus_one", AttributeValue::N("-1".into()))
            .build()
            .map_err(|e| corrupt("update", e))?;
        let items = vec![
            TransactWriteItem::builder().delete(delete).build(),
            TransactWriteItem::builder().update(count).build(),
        ];
        match self.transact_once(items, &format!("del-{id}")).await {
            Ok(()) => Ok(true),
            Err(TransactFailure::Conditions(reasons))
                if reasons.first().is_some_and(condition_failed) =>
            {
                Ok(false)
            }
            Err(TransactFailure::Conditions(_)) => Err(corrupt(
                "app registration",
                format!("{app} has an endpoint but no registration"),
            )),
            Err(TransactFailure::Contended) => Err(PipelineError::store(
                "the app's endpoints changed meanwhile; retry",
                true,
            )),
            Err(TransactFailure::Other(err)) => Err(err),
        }
    }

    async fn get_delivery(&self, app: &AppId, id: &DeliveryId) -> Result<Option<Delivery>> {
        self.read_delivery(app, id, true, Read::Consistent).await
    }

    async fn get_delivery_item(&self, app: &AppId, id: &DeliveryId) -> Result<Option<Delivery>> {
        self.read_delivery(app, id, false, Read::Consistent).await
    }

    async fn peek_delivery_item(&self, app: &AppId, id: &DeliveryId) -> Result<Option<Delivery>> {
        self.read_delivery(app, id, false, Read::Eventual).await
    }

    async fn get_key_head(
        &self,
        app: &AppId,
        key: &str,
    ) -> Result<hookline_core::ordering::KeyHead> {
        self.get(schema::key_head_pk(app, key), schema::KEY_HEAD_SK)
            .await?
            .map(schema::key_head_from_item)
            .transpose()
            .map(Option::unwrap_or_default)
    }

    async fn event_exists(&self, app: &AppId, id: &EventId) -> Result<bool> {
        let (pk, sk) = event_key(app, id);
        Ok(!self
            .batch_get(vec![(pk, sk)], false, Some("PK"))
            .await?
            .is_empty())
    }

    async fn register_successor(
        &self,
        app: &AppId,
        predecessor: &DeliveryId,
        successor: &DeliveryId,
    ) -> Result<bool> {
        use serde_dynamo::AttributeValue as Value;
        let (pk, sk) = delivery_key(app, predecessor);
        let update = crate::dynamo_http::Update::new(&self.table, &pk, &sk, "SET wake = :successor".to_owned())
            .condition(
                "attribute_exists(PK) AND #status = :pending AND version > :zero AND attribute_not_exists(released)",
            )
            .name("#status", "status")
            .value(":successor", Value::S(successor.as_str().to_owned()))
            .value(
                ":pending",
                Value::S(DeliveryStatus::Pending.as_str().to_owned()),
            )
            .value(":zero", Value::N("0".into()));
        let _g = self.write_guard().await?;
        direct_condition_to_bool(self.http.update_item(&update).await)
    }

    async fn peek_delivery_item_and_endpoint(
        &self,
        app: &AppId,
        id: &DeliveryId,
        endpoint: &EndpointId,
    ) -> Result<(Option<Delivery>, Option<Endpoint>)> {
        let key = (app_pk(app), endpoint_sk(endpoint));
        let mut found = None;
        let delivery = self
            .read_delivery_along(app, id, false, Read::Eventual, Some((&key, &mut found)))
            .await?;
        let endpoint = match found {
            Some(item) => Some(self.endpoint_from_sdk(into_sdk(item)).await?),
            // Not there, or created within the last second (its event can
            // be on its way already): a deleted endpoint fails the
            // delivery, so that is asked consistently.
            None => self.get_endpoint(app, endpoint).await?,
        };
        Ok((delivery, endpoint))
    }

    async fn update_delivery(&self, d: &Delivery, expected_version: u64) -> Result<bool> {
        if expected_version == 0 {
            // The first write of a listed delivery creates its item; an item
            // at version 0 (materialised) is replaced whole. Either way, only
            // from version 0.
            let item = schema::delivery_item(d, self.retention)?;
            let _g = self.write_guard().await?;
            let result = self
                .http
                .put_item(
                    &Put::new(&self.table, &item)
                        .condition("attribute_not_exists(PK) OR version = :expected_version")
                        .value(
                            ":expected_version",
                            serde_dynamo::AttributeValue::N("0".into()),
                        ),
                )
                .await;
            drop(_g);
            if direct_condition_to_bool(result)? {
                return Ok(true);
            }
            return self.delivery_holds(d).await;
        }
        use serde_dynamo::AttributeValue as Value;
        let (pk, sk) = delivery_key(&d.app_id, &d.id);
        let mut set = vec![
            "#status = :status",
            "attempt_count = :count",
            "total_attempts = :total",
            "manual_retries = :manual",
            "attempts = :attempts",
            "updated_at = :updated",
            "version = :version",
        ];
        let mut remove = Vec::new();
        let mut values: Vec<(&str, Value)> = vec![
            (":status", Value::S(d.status.as_str().to_owned())),
            (":count", Value::N(d.attempt_count.to_string())),
            (":total", Value::N(d.total_attempts.to_string())),
            (":manual", Value::N(d.manual_retries.to_string())),
            (":attempts", direct_value(&d.attempts)?),
            (":updated", direct_value(&d.updated_at)?),
            (":version", Value::N(d.version.to_string())),
            (":expected_version", Value::N(expected_version.to_string())),
        ];
        // In the by-status index if failed.
        match schema::status_index_key(d) {
            Some(gsi2) => {
                set.extend(["GSI2PK = :gsi2", "GSI2SK = :gsi2sk"]);
                values.push((":gsi2", Value::S(gsi2)));
                values.push((":gsi2sk", Value::S(d.id.as_str().to_owned())));
            }
            None => remove.extend(["GSI2PK", "GSI2SK"]),
        }
        match d.next_attempt_at {
            Some(at) => {
                set.push("next_attempt_at = :next");
                values.push((":next", direct_value(&at)?));
            }
            None => remove.push("next_attempt_at"),
        }
        // Pending: in the overdue index and never expiring; finished: out of
        // the index, expiring a retention after it finished.
        match schema::delivery_due(d) {
            Some(at) => {
                set.extend(["GSI3PK = :gsi3pk", "GSI3SK = :gsi3sk"]);
                values.push((":gsi3pk", Value::S(due_pk(d.id.as_str()))));
                values.push((":gsi3sk", Value::S(due_sk(at, d.id.as_str()))));
                remove.push("expires_at");
            }
            None => {
                remove.extend(["GSI3PK", "GSI3SK"]);
            }
        }
        if let Some(expiry) = schema::delivery_expiry(d, self.retention) {
            set.push("expires_at = :expires");
            values.push((":expires", Value::N(expiry.to_string())));
        }
        if d.requeued {
            set.push("requeued = :requeued");
            values.push((":requeued", Value::Bool(true)));
        } else {
            remove.push("requeued");
        }
        match d.throttled_until {
            Some(slot) => {
                set.push("throttled_until = :slot");
                values.push((":slot", direct_value(&slot)?));
            }
            None => remove.push("throttled_until"),
        }
        match d.held_until_deadline {
            Some(deadline) => {
                set.push("held_until_deadline = :held");
                values.push((":held", direct_value(&deadline)?));
            }
            None => remove.push("held_until_deadline"),
        }
        match d.turn_at {
            Some(turn) => {
                set.push("turn_at = :turn");
                values.push((":turn", direct_value(&turn)?));
            }
            None => remove.push("turn_at"),
        }
        match &d.blocked_by {
            Some(predecessor) => {
                set.push("blocked_by = :blocked");
                values.push((":blocked", Value::S(predecessor.as_str().to_owned())));
            }
            None => remove.push("blocked_by"),
        }
        // Never cleared: a successor registered on it goes once it ended.
        if d.released {
            set.push("released = :released");
            values.push((":released", Value::Bool(true)));
        }
        let mut expression = format!("SET {}", set.join(", "));
        if !remove.is_empty() {
            expression.push_str(&format!(" REMOVE {}", remove.join(", ")));
        }
        // Each retry's outcome: on the direct client.
        let mut update = crate::dynamo_http::Update::new(&self.table, &pk, &sk, expression)
            .condition(VERSION_CONDITION)
            .name("#status", "status");
        for (name, value) in values {
            update = update.value(name, value);
        }
        let written = {
            let _g = self.write_guard().await?;
            direct_condition_to_bool(self.http.update_item(&update).await)?
        };
        if written {
            return Ok(true);
        }
        self.delivery_holds(d).await
    }

    async fn extend_event_retention(
        &self,
        app: &AppId,
        id: &EventId,
        restarted_at: DateTime<Utc>,
    ) -> Result<()> {
        let until = schema::event_expiry_after(restarted_at, self.retention);
        let (pk, sk) = event_key(app, id);
        let _g = self.write_guard().await?;
        let result = self
            .client()
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(pk, &sk)))
            .update_expression("SET expires_at = :until")
            .condition_expression("attribute_exists(PK) AND expires_at < :until")
            .expression_attribute_values(":until", AttributeValue::N(until.to_string()))
            .send()
            .await;
        // Not extended: already kept long enough, or not there (a gone
        // event makes deliver fail the delivery visibly: "event not
        // found").
        condition_to_bool(result, "UpdateItem").map(|_| ())
    }

    async fn record_queue_lag(&self, lag: &QueueLag) -> Result<()> {
        let item = schema::queue_lag_item(lag);
        let _g = self.write_guard().await?;
        self.http
            .put_item(&Put::new(&self.table, &item))
            .await
            .map_err(direct_error)
    }

    async fn queue_lag(&self) -> Result<Option<QueueLag>> {
        self.get(QUEUE_LAG_PK.to_owned(), QUEUE_LAG_SK)
            .await?
            .map(schema::queue_lag_from_item)
            .transpose()
    }

    fn overdue_shards(&self) -> u32 {
        DUE_SHARDS
    }

    async fn overdue_page(
        &self,
        shard: u32,
        cutoff: DateTime<Utc>,
        position: &str,
    ) -> Result<OverduePage> {
        // `#` sorts after every digit: all entries due strictly before cutoff.
        let below = format!("{}#", due_time(cutoff));
        let page = self
            .gsi3_page(due_pk_of_shard(shard), position, &below, OVERDUE_PAGE_LIMIT)
            .await?;
        let mut out = OverduePage {
            position: position.to_owned(),
            ..OverduePage::default()
        };
        for item in &page.items {
            let Some(sk) = text_of(item, "GSI3SK") else {
                out.unreadable += 1;
                continue;
            };
            // BETWEEN includes both ends: the position was read before.
            if sk == position || sk >= below.as_str() {
                continue;
            }
            out.position = sk.to_owned();
            let entry = (|| {
                let due = time_of_sort_key(sk)?;
                let pk = text_of(item, PK)?;
                let table_sk = text_of(item, SK)?;
                let what = if let Some((app, id)) = schema::delivery_of_key(pk, table_sk) {
                    Overdue::Delivery(app, id)
                } else if let Some((app, id)) = event_id_of_key(pk, table_sk) {
                    Overdue::Event(app, id)
                } else {
                    Overdue::Replay(ReplayId::parse(pk.strip_prefix("RPL#")?).ok()?)
                };
                Some((due, what))
            })();
            match entry {
                Some(entry) => out.entries.push(entry),
                None => {
                    tracing::error!(
                        shard,
                        sort_key = sk,
                        pk = text_of(item, PK),
                        "unreadable entry in the overdue index stepped over"
                    );
                    out.unreadable += 1;
                }
            }
        }
        match page.last_evaluated_key.filter(|k| !k.is_empty()) {
            Some(key) => {
                if let Some(sk) = text_of(&key, "GSI3SK") {
                    out.position = sk.to_owned();
                }
            }
            None => out.done = true,
        }
        Ok(out)
    }

    fn event_shards(&self) -> u32 {
        EVENT_SHARDS
    }

    fn late_shards(&self) -> u32 {
        DUE_SHARDS
    }

    async fn swept_apps(&self, position: &str) -> Result<SweptAppsPage> {
        use serde_dynamo::AttributeValue as Value;
        let query = if position.is_empty() {
            Query::new(&self.table, "PK = :pk")
        } else {
            Query::new(&self.table, "PK = :pk AND SK > :after")
                .value(":after", Value::S(position.to_owned()))
        }
        .eventually_consistent()
        .value(":pk", Value::S(SWEPT_APPS_PK.to_owned()));
        let answer = {
            let _g = self.guard().await;
            self.http.query(&query).await.map_err(direct_error)?
        };
        let mut page = SweptAppsPage::default();
        for item in answer.items {
            let Some(sk) = text_of(&item, SK).map(str::to_owned) else {
                tracing::error!("an app registration without a sort key stepped over");
                continue;
            };
            page.position.clone_from(&sk);
            match schema::swept_app_from_item(item) {
                Ok(app) => page.apps.push(app),
                Err(err) => {
                    tracing::error!(key = %sk, error = %hookline_core::error::Chain(&err), "an unreadable app registration stepped over by the sweep");
                }
            }
        }
        page.done = answer
            .last_evaluated_key
            .filter(|k| !k.is_empty())
            .is_none();
        Ok(page)
    }

    async fn save_app_sweep_marks(&self, app: &AppId, marks: &SweepMarks) -> Result<()> {
        let update = crate::dynamo_http::Update::new(
            &self.table,
            SWEPT_APPS_PK,
            app.as_str(),
            "SET marks = :marks".to_owned(),
        )
        .condition("attribute_exists(PK)")
        .value(":marks", schema::app_marks_value(marks));
        let _g = self.write_guard().await?;
        match direct_condition_to_bool(self.http.update_item(&update).await)? {
            true => Ok(()),
            false => Err(corrupt(
                "app registration",
                format!("{app} is not registered"),
            )),
        }
    }

    async fn sweep_page(
        &self,
        source: &SweepSource,
        position: &str,
        floor: DateTime<Utc>,
        cutoff: DateTime<Utc>,
    ) -> Result<SweepPage> {
        match source {
            SweepSource::Days(app, shard) => {
                self.sweep_days_page(app, *shard, position, floor, cutoff)
                    .await
            }
            SweepSource::Late(shard) => self.sweep_late_page(*shard, position, floor, cutoff).await,
        }
    }

    async fn index_late_event(&self, event: &EventHead, written_at: DateTime<Utc>) -> Result<()> {
        use serde_dynamo::AttributeValue as Value;
        let (pk, sk) = event_key(&event.app_id, &event.id);
        let update = crate::dynamo_http::Update::new(
            &self.table,
            &pk,
            &sk,
            "SET GSI3PK = :index, GSI3SK = :at".to_owned(),
        )
        // A deferred fan-out's overdue entry (or an entry already written)
        // stays.
        .condition("attribute_exists(PK) AND attribute_not_exists(GSI3PK)")
        .value(":index", Value::S(sweep_pk(event.id.as_str())))
        .value(
            ":at",
            Value::S(event_time_sk(written_at, &event.app_id, &event.id)),
        );
        let _g = self.write_guard().await?;
        direct_condition_to_bool(self.http.update_item(&update).await).map(|_| ())
    }

    async fn sweep_marks(&self) -> Result<SweepMarks> {
        match self.get(SWEEP_MARK_PK.to_owned(), SWEEP_MARK_SK).await? {
            Some(item) => schema::late_marks_from_item(item),
            None => Ok(SweepMarks::new()),
        }
    }

    async fn save_sweep_marks(&self, marks: &SweepMarks) -> Result<()> {
        let item = schema::late_marks_item(marks);
        let _g = self.write_guard().await?;
        self.http
            .put_item(&Put::new(&self.table, &item))
            .await
            .map_err(direct_error)
    }

    async fn delivery_items_among(
        &self,
        deliveries: &[(AppId, DeliveryId)],
    ) -> Result<Vec<DeliveryId>> {
        if deliveries.is_empty() {
            return Ok(Vec::new());
        }
        // Grouped by their app's partition: where a partition holds many of
        // them, one range of it is read (a query is charged by the bytes it
        // reads, a few items per unit, where a read by key is a unit each);
        // the others by key.
        let mut groups: std::collections::BTreeMap<String, Vec<&DeliveryId>> =
            std::collections::BTreeMap::new();
        let mut keys = Vec::new();
        for (app, id) in deliveries {
            let (pk, _) = delivery_key(app, id);
            groups.entry(pk).or_default().push(id);
        }
        let mut found = Vec::new();
        for (pk, ids) in groups {
            if ids.len() < RANGE_READ_MIN {
                keys.extend(ids.iter().map(|id| (pk.clone(), id.to_string())));
                continue;
            }
            let unread = self.delivery_items_in_range(&pk, &ids, &mut found).await?;
            keys.extend(unread.iter().map(|id| (pk.clone(), id.to_string())));
        }
        let items = if keys.is_empty() {
            Vec::new()
        } else {
            self.batch_get(keys, false, Some("PK, SK")).await?
        };
        found.extend(items.iter().filter_map(|item| {
            let pk = item.get(PK).and_then(|v| match v {
                serde_dynamo::AttributeValue::S(v) => Some(v.as_str()),
                _ => None,
            })?;
            let sk = item.get(SK).and_then(|v| match v {
                serde_dynamo::AttributeValue::S(v) => Some(v.as_str()),
                _ => None,
            })?;
            schema::delivery_of_key(pk, sk).map(|(_, id)| id)
        }));
        Ok(found)
    }

    async fn create_delivery(&self, delivery: &Delivery) -> Result<bool> {
        if self
            .put_absent(schema::delivery_item(delivery, self.retention)?)
            .await?
        {
            return Ok(true);
        }
        self.delivery_holds(delivery).await
    }

    async fn events_in_window(
        &self,
        app: &AppId,
        since: DateTime<Utc>,
        until: DateTime<Utc>,
        position: &str,
        limit: usize,
    ) -> Result<EventWindow> {
        // Every event is in its creation day's partitions, sorted by id
        // (time), whenever it was written. The position holds a mark per
        // event shard.
        let mut marks: Vec<String> = if position.is_empty() {
            Vec::new()
        } else {
            serde_json::from_str(position).map_err(|e| corrupt("replay position", e))?
        };
        marks.resize(EVENT_SHARDS as usize, String::new());
        let per_partition = limit.div_ceil(EVENT_SHARDS as usize).max(1);
        // Nothing is kept longer than the retention (an event's TTL; a
        // manual restart extends it, but a replay is for what was missed):
        // the day partitions are read from then at the earliest, ten days per
        // call at most (the replay goes on from its position).
        let kept =
            chrono::TimeDelta::from_std(self.retention).map_err(|e| corrupt("retention", e))?;
        let from = EventId::time_floor(since.max(Utc::now() - kept - chrono::TimeDelta::days(1)));
        let below_id = EventId::time_floor(until);
        let days = marks.iter().enumerate().map(|(shard, after)| {
            let (from, below_id) = (&from, &below_id);
            async move {
                self.events_by_time(
                    app,
                    shard as u32,
                    after,
                    from,
                    below_id,
                    per_partition,
                    REPLAY_DAYS_PER_CALL,
                )
                .await
            }
        });
        let by_day = futures::future::try_join_all(days).await?;
        let mut complete = true;
        let mut events = Vec::new();
        for (mark, (found, next_mark)) in marks.iter_mut().zip(by_day) {
            match next_mark {
                Some(next) => {
                    complete = false;
                    *mark = next;
                }
                None => *mark = below_id.as_str().to_owned(),
            }
            for item in found {
                let stored = schema::event_from_item(item)?;
                let created = stored.event.created_at;
                if created >= since && created < until {
                    events.push(stored);
                }
            }
        }
        let position = serde_json::to_string(&marks).map_err(|e| corrupt("replay position", e))?;
        Ok(EventWindow {
            events,
            position,
            complete,
        })
    }

    async fn replay_slot(&self, _app: &AppId, endpoint: &EndpointId) -> Result<Option<ReplaySlot>> {
        self.get(replay_slot_pk(endpoint), REPLAY_SLOT_SK)
            .await?
            .map(schema::replay_slot_from_item)
            .transpose()
    }

    async fn take_replay_slot(
        &self,
        app: &AppId,
        endpoint: &EndpointId,
        replay: &ReplayId,
        held_by: Option<&ReplayId>,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        let slot = ReplaySlot {
            replay_id: replay.clone(),
            taken_at: now,
        };
        let item = into_sdk(schema::replay_slot_item(
            app,
            endpoint,
            &slot,
            self.retention,
        ));
        let held_by = held_by.map(|held| ("replay_id", s(held.as_str())));
        if self.put_if(item, held_by).await? {
            return Ok(true);
        }
        // This very write, applied by a try whose answer was lost?
        Ok(self.replay_slot(app, endpoint).await?.as_ref() == Some(&slot))
    }

    async fn get_replay(&self, id: &ReplayId) -> Result<Option<Replay>> {
        self.get(replay_pk(id), REPLAY_SK)
            .await?
            .map(schema::replay_from_item)
            .transpose()
    }

    async fn put_replay(&self, replay: &Replay, expected_version: Option<u64>) -> Result<bool> {
        let item = into_sdk(schema::replay_item(replay, self.retention)?);
        let expected = expected_version.map(|v| ("version", AttributeValue::N(v.to_string())));
        if self.put_if(item, expected).await? {
            return Ok(true);
        }
        // This very write, applied by a try whose answer was lost?
        Ok(self.get_replay(&replay.id).await?.as_ref() == Some(replay))
    }

    async fn put_api_key(&self, key: &ApiKey) -> Result<()> {
        self.put_new(schema::api_key_item(key)?).await
    }

    async fn get_api_key(&self, id: &ApiKeyId) -> Result<Option<ApiKey>> {
        self.get(api_key_pk(id), API_KEY_SK)
            .await?
            .map(schema::api_key_from_item)
            .transpose()
    }

    async fn list_api_keys(&self, app: &AppId) -> Result<Vec<ApiKey>> {
        let mut keys = Vec::new();
        let mut start = None;
        loop {
            let _g = self.guard().await;
            let out = self
                .client()
                .query()
                .table_name(&self.table)
                .index_name(GSI_BY_ENDPOINT)
                .key_condition_expression("GSI1PK = :pk")
                .expression_attribute_values(":pk", s(api_keys_of_app(app)))
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| store_error("Query", e))?;
            for item in out.items.unwrap_or_default() {
                keys.push(schema::api_key_from_item(Item::from(item))?);
            }
            start = out.last_evaluated_key;
            if start.is_none() {
                break;
            }
        }
        Ok(keys)
    }

    async fn delete_api_key(&self, app: &AppId, id: &ApiKeyId) -> Result<bool> {
        self.delete_if(
            Self::key(api_key_pk(id), API_KEY_SK),
            "app_id = :app",
            Some((":app", app.as_str())),
        )
        .await
    }
}

/// Every stored secret of an endpoint item (current and previous secrets,
/// custom header values).
fn stored_secrets(item: &HashMap<String, AttributeValue>) -> Vec<&str> {
    let mut out: Vec<&str> = item
        .get("secret")
        .and_then(|v| v.as_s().ok())
        .map(String::as_str)
        .into_iter()
        .collect();
    if let Some(AttributeValue::L(previous)) = item.get("previous_secrets") {
        out.extend(previous.iter().filter_map(|p| {
            p.as_m()
                .ok()
                .and_then(|m| m.get("secret"))
                .and_then(|v| v.as_s().ok())
                .map(String::as_str)
        }));
    }
    if let Some(AttributeValue::M(headers)) = item.get("headers") {
        out.extend(
            headers
                .values()
                .filter_map(|v| v.as_s().ok().map(String::as_str)),
        );
    }
    out
}

/// Rewrites every secret of an endpoint item (`secret`, `secret` of each
/// `previous_secrets` entry, each custom header value) through `f` (seal or
/// open).
/// Applies `f` (seal or open) to every secret value of an endpoint item,
/// with the field it is in: `secret`, `previous_secrets`, `headers.{name}`.
async fn map_secrets<F, Fut>(item: &mut HashMap<String, AttributeValue>, f: F) -> Result<()>
where
    F: Fn(String, String) -> Fut,
    Fut: std::future::Future<Output = Result<String>>,
{
    if let Some(AttributeValue::S(secret)) = item.get_mut("secret") {
        *secret = f(std::mem::take(secret), "secret".to_owned()).await?;
    }
    if let Some(AttributeValue::L(previous)) = item.get_mut("previous_secrets") {
        for entry in previous.iter_mut() {
            if let AttributeValue::M(fields) = entry {
                if let Some(AttributeValue::S(secret)) = fields.get_mut("secret") {
                    *secret = f(std::mem::take(secret), "previous_secrets".to_owned()).await?;
                }
            }
        }
    }
    if let Some(AttributeValue::M(headers)) = item.get_mut("headers") {
        for (name, value) in headers.iter_mut() {
            if let AttributeValue::S(text) = value {
                *text = f(std::mem::take(text), format!("headers.{name}")).await?;
            }
        }
    }
    Ok(())
}

/// `Ok(true)` on success, `Ok(false)` when the write's condition failed.
fn condition_to_bool<T, E, R>(
    result: std::result::Result<T, aws_sdk_dynamodb::error::SdkError<E, R>>,
    op: &str,
) -> Result<bool>
where
    E: aws_sdk_dynamodb::error::ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    match result {
        Ok(_) => Ok(true),
        Err(err) if crate::error::is_condition_failure(&err) => Ok(false),
        Err(err) => Err(store_error(op, err)),
    }
}

/// A direct client's conditional write: `Ok(false)` when its condition
/// failed.
fn direct_condition_to_bool(
    result: std::result::Result<(), crate::aws_json::AwsJsonError>,
) -> Result<bool> {
    match result {
        Ok(()) => Ok(true),
        Err(err) if err.is_condition_failure() => Ok(false),
        Err(err) => Err(direct_error(err)),
    }
}

/// The optimistic-concurrency condition on `version`.
const VERSION_CONDITION: &str = "attribute_exists(PK) AND version = :expected_version";

fn versioned(
    request: aws_sdk_dynamodb::operation::put_item::builders::PutItemFluentBuilder,
    expected: u64,
) -> aws_sdk_dynamodb::operation::put_item::builders::PutItemFluentBuilder {
    request
        .condition_expression(VERSION_CONDITION)
        .expression_attribute_values(":expected_version", AttributeValue::N(expected.to_string()))
}
