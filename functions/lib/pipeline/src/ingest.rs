//! Accepting an event: `POST /v1/apps/{app_id}/events`.
//!
//! Validates, finds the app's enabled endpoints subscribed to the type, and
//! commits the event, its deliveries and the idempotency record in one
//! transaction. Fan-outs beyond one transaction keep the rest of the endpoint
//! list on the event item; dispatch materialises it in idempotent chunks, so
//! acceptance is atomic from the caller's view: a 202 means every delivery is
//! durable (as an item or as an entry of the committed fan-out list).

use chrono::{DateTime, Utc};
use hookline_core::ids::{AppId, DeliveryId, EndpointId, EventId};
use hookline_core::model::{Delivery, Endpoint, EndpointRoute, Event, EventType};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use std::collections::HashMap;

use hookline_core::ordering::{self, KeyHead};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::ports::{
    CommitOutcome, HeadMove, IdempotencyRecord, NewEvent, Store, FANOUT_LIST_MAX, INLINE_DELIVERIES,
};
use crate::{PipelineError, Settings};

/// The request body of `POST /v1/apps/{app_id}/events`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventRequest {
    /// Dot-separated name, e.g. `order.paid`.
    pub event_type: String,
    /// Any JSON value; sent to receivers as `data`, byte for byte as sent
    /// here (kept as raw JSON text, never parsed into numbers and rewritten).
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub payload: Box<RawValue>,
    /// 1-128 visible ASCII characters: for each endpoint, the deliveries of
    /// the events with the same key are attempted in the order the events
    /// were accepted (see the README's retry policy).
    #[serde(default)]
    pub ordering_key: Option<String>,
}

/// The 202 body.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IngestResponse {
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "evt_01jx6w4m3v8k2q9r7t5y3b1n0c"))]
    pub event_id: EventId,
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub delivery_ids: Vec<DeliveryId>,
}

/// What ingest answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// The JSON body of the 202 (the stored one on a replay).
    pub body: String,
    /// True when an earlier request with the same `Idempotency-Key` answered.
    pub replayed: bool,
}

/// Longest accepted `Idempotency-Key`.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

fn validate_idempotency_key(key: &str) -> Result<(), PipelineError> {
    if key.is_empty()
        || key.len() > MAX_IDEMPOTENCY_KEY_LEN
        || !key.bytes().all(|b| (0x21..0x7f).contains(&b))
    {
        return Err(PipelineError::invalid(
            "invalid_idempotency_key",
            "Idempotency-Key must be 1-255 visible ASCII characters",
        ));
    }
    Ok(())
}

/// An event request that passed validation.
#[derive(Debug)]
pub struct ValidEvent {
    pub event_type: EventType,
    pub payload: Box<RawValue>,
    /// SHA-256 of type and payload text: an Idempotency-Key reused with
    /// another request is a conflict.
    pub request_hash: String,
    pub idempotency_key: Option<String>,
    pub ordering_key: Option<String>,
}

/// Checks one event request (type, payload size, key).
pub fn validate_event(
    settings: &Settings,
    request: EventRequest,
    idempotency_key: Option<&str>,
) -> Result<ValidEvent, PipelineError> {
    let event_type = EventType::parse(&request.event_type)?;
    let payload_text = request.payload.get();
    if payload_text.len() > settings.max_payload_bytes {
        return Err(payload_too_large(settings));
    }
    if let Some(key) = idempotency_key {
        validate_idempotency_key(key)?;
    }
    if let Some(key) = &request.ordering_key {
        hookline_core::ordering::check_ordering_key(key)?;
    }
    let mut hash = Sha256::new()
        .chain_update(event_type.as_str())
        .chain_update([0u8])
        .chain_update(payload_text.as_bytes());
    // The key is part of the request: the same Idempotency-Key with
    // another ordering key is a conflict.
    if let Some(key) = &request.ordering_key {
        hash.update([0u8]);
        hash.update(key.as_bytes());
    }
    Ok(ValidEvent {
        event_type,
        payload: request.payload,
        request_hash: hex::encode(hash.finalize()),
        idempotency_key: idempotency_key.map(str::to_owned),
        ordering_key: request.ordering_key,
    })
}

/// What ingest checks a valid event against before committing it: the
/// API's event-type catalog (payload against its type's schema, in
/// `hookline-ingest`), or [`Unchecked`] (the operational app's own events).
/// The schema validator lives with the API, so the functions that only
/// send operational events neither link nor depend on it.
pub trait PayloadCheck: Sync {
    fn check<S: Store>(
        &self,
        store: &S,
        app_id: &AppId,
        valid: &ValidEvent,
    ) -> impl std::future::Future<Output = Result<(), PipelineError>> + Send;
}

/// No check: events whose shape is ours.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unchecked;

impl PayloadCheck for Unchecked {
    async fn check<S: Store>(
        &self,
        _store: &S,
        _app_id: &AppId,
        _valid: &ValidEvent,
    ) -> Result<(), PipelineError> {
        Ok(())
    }
}

/// Accepts one event. `now` and `rng` make the ids; `check` (the API's
/// catalog) vets the payload.
#[allow(clippy::too_many_arguments)]
pub async fn ingest<S: Store, C: PayloadCheck>(
    store: &S,
    settings: &Settings,
    check: &C,
    app_id: &str,
    idempotency_key: Option<&str>,
    body: &[u8],
    now: DateTime<Utc>,
    rng: &mut (dyn RngCore + Send),
) -> Result<Accepted, PipelineError> {
    let app_id = AppId::parse(app_id)?;
    let request: EventRequest = parse_body(
        settings,
        body,
        1,
        r#"{"event_type": string, "payload": any JSON}"#,
    )?;
    let valid = validate_event(settings, request, idempotency_key)?;
    // The payload check (a catalog read when its cache misses) and the
    // endpoint query at once: one round trip before the commit, not two.
    // A refused payload wins over a failed query (its 400 is the answer),
    // and costs the query's read.
    // No read of the key first: the commit is conditional on it, and a key
    // already taken comes back as the first answer to replay. One request
    // (and one read unit) less for every new event; a replay pays it.
    // Boxed: both futures side by side (each holding an SDK request) made
    // the caller's future big enough to overflow a debug build's stack.
    // A keyed event reads its key's head in the same round trip.
    let head = async {
        match &valid.ordering_key {
            Some(key) => store.get_key_head(&app_id, key).await.map(Some),
            None => Ok(None),
        }
    };
    let (checked, endpoints, head) = futures::future::join3(
        Box::pin(check.check(store, &app_id, &valid)),
        Box::pin(store.list_routes(&app_id)),
        Box::pin(head),
    )
    .await;
    checked?;
    let (endpoints, head) = (endpoints?, head?);
    accept(store, &app_id, &valid, &endpoints, head, now, rng)
        .await
        .map(|(accepted, _)| accepted)
}

/// Plans and commits one valid event. A keyed one is planned after its
/// key's `head` (as read) and committed on the condition that the head has
/// not moved; if it has (another event of the key committed first), the
/// head is read again and the event planned after that one. Returns the
/// key's head as this commit left it (`None`: unkeyed, or a replay).
async fn accept<S: Store>(
    store: &S,
    app_id: &AppId,
    valid: &ValidEvent,
    endpoints: &[EndpointRoute],
    mut head: Option<KeyHead>,
    now: DateTime<Utc>,
    rng: &mut (dyn RngCore + Send),
) -> Result<(Accepted, Option<KeyHead>), PipelineError> {
    for round in 0..COMMIT_ROUNDS {
        let planned = plan(app_id, valid, endpoints, head.as_ref(), now, rng)?;
        let moved_to = planned.new.key_head.as_ref().map(|m| m.head.clone());
        match commit(store, app_id, planned).await? {
            Some(accepted) => {
                let left = moved_to.filter(|_| !accepted.replayed);
                return Ok((accepted, left));
            }
            None => {
                let key = valid
                    .ordering_key
                    .as_deref()
                    .expect("only a keyed event's order moves");
                tracing::info!(app_id = %app_id, round, "the ordering key moved on meanwhile; planning after its new head");
                head = Some(store.get_key_head(app_id, key).await?);
            }
        }
    }
    Err(PipelineError::store(
        "the ordering key kept moving under concurrent requests; retry",
        true,
    ))
}

/// Parses a request body holding up to `events` payloads: a cheap size
/// guard first (each event's envelope adds little to its payload), then
/// JSON into `T`; a body of another shape is a 400 naming the expected one.
fn parse_body<T: serde::de::DeserializeOwned>(
    settings: &Settings,
    body: &[u8],
    events: usize,
    shape: &str,
) -> Result<T, PipelineError> {
    let envelope = settings.max_payload_bytes.saturating_add(16 * 1024);
    if body.len() > envelope.saturating_mul(events) {
        return Err(payload_too_large(settings));
    }
    serde_json::from_slice(body)
        .map_err(|e| PipelineError::invalid("invalid_body", format!("expected {shape}: {e}")))
}

/// An event ready to commit: its items, its answer, its key's hash.
struct Planned {
    new: NewEvent,
    deliveries: usize,
    body: String,
    request_hash: String,
}

/// Plans `valid` for `endpoints` at `now`; a keyed one (with its key's
/// `head`) is accepted after the key's latest event and ordered after it.
fn plan(
    app_id: &AppId,
    valid: &ValidEvent,
    endpoints: &[EndpointRoute],
    head: Option<&KeyHead>,
    now: DateTime<Utc>,
    rng: &mut (dyn RngCore + Send),
) -> Result<Planned, PipelineError> {
    let accepted_at = head.map_or(now, |h| ordering::accepted_at(h, now));
    let (mut new, response) = plan_event(
        app_id.clone(),
        valid.event_type.clone(),
        &valid.payload,
        endpoints,
        accepted_at,
        rng,
    );
    if let (Some(key), Some(head)) = (&valid.ordering_key, head) {
        order_event(&mut new, &response.delivery_ids, key, head)?;
    }
    let body =
        serde_json::to_string(&response).map_err(|e| PipelineError::Corrupt(e.to_string()))?;
    new.idempotency = valid.idempotency_key.clone().map(|key| IdempotencyRecord {
        app_id: app_id.clone(),
        key,
        request_hash: valid.request_hash.clone(),
        response: body.clone(),
        created_at: now,
    });
    Ok(Planned {
        new,
        deliveries: response.delivery_ids.len(),
        body,
        request_hash: valid.request_hash.clone(),
    })
}

/// Orders planned event `new` (whose deliveries are `delivery_ids`, in
/// its endpoints' order) under ordering key `key`, after the key's `head`:
/// each of its deliveries waits for the key's latest one to its endpoint,
/// and the key's head moves on in the event's transaction. A keyed event
/// goes to at most [`FANOUT_LIST_MAX`] endpoints (a listed fan-out: the
/// key's head and the event's waits stay small items, and the whole event
/// is one transaction), else 400 `too_many_endpoints_for_ordering`. Pure:
/// also what a producer's own transaction uses (`hookline-aws`'s outbox).
pub fn order_event(
    new: &mut NewEvent,
    delivery_ids: &[DeliveryId],
    key: &str,
    head: &KeyHead,
) -> Result<(), PipelineError> {
    if !new.deliveries.is_empty() || !new.fanout_remaining.is_empty() {
        return Err(PipelineError::invalid(
            "too_many_endpoints_for_ordering",
            format!(
                "an event with an ordering_key goes to at most {FANOUT_LIST_MAX} endpoints; this one goes to {}",
                delivery_ids.len()
            ),
        ));
    }
    let pairs: Vec<(EndpointId, DeliveryId)> = new
        .targets
        .iter()
        .cloned()
        .zip(delivery_ids.iter().cloned())
        .collect();
    let planned = ordering::plan(head, &new.event.id, &pairs, new.event.created_at);
    new.event.ordering_key = Some(key.to_owned());
    new.event.after = planned.after;
    new.key_head = Some(HeadMove {
        key: key.to_owned(),
        from: head.version,
        head: planned.head,
    });
    Ok(())
}

/// Commits one planned event (its own transaction: all of it or nothing).
/// A TransactionConflict (a concurrent request on the same key) is not a
/// failure: look again (the winner's answer is replayed) or commit again.
/// `None`: its ordering key moved on (plan it again).
async fn commit<S: Store>(
    store: &S,
    app_id: &AppId,
    planned: Planned,
) -> Result<Option<Accepted>, PipelineError> {
    let new = &planned.new;
    for round in 0..COMMIT_ROUNDS {
        match store.commit_event(new).await? {
            CommitOutcome::OrderMoved => return Ok(None),
            CommitOutcome::Committed => {
                tracing::info!(
                    event_id = %new.event.id,
                    app_id = %app_id,
                    event_type = %new.event.event_type,
                    deliveries = planned.deliveries,
                    fanout_deferred = new.fanout_remaining.len(),
                    "event accepted"
                );
                return Ok(Some(Accepted {
                    body: planned.body,
                    replayed: false,
                }));
            }
            CommitOutcome::IdempotencyKeyTaken(existing) => {
                return replay(existing, &planned.request_hash).map(Some)
            }
            // Committed again: a key taken meanwhile is answered by the
            // store (which first completes the event its record names, if
            // that request stopped before writing it).
            CommitOutcome::Contended => {
                tracing::info!(event_id = %new.event.id, round, "event transaction contended; retrying");
                tokio::time::sleep(std::time::Duration::from_millis(25 << round)).await;
            }
        }
    }
    Err(PipelineError::store(
        "the event transaction kept conflicting with concurrent requests; retry",
        true,
    ))
}

/// The body of `POST /v1/apps/{app_id}/endpoints/{endpoint_id}/test`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestEventRequest {
    /// The type to send (the endpoint must subscribe to it).
    pub event_type: String,
    /// Any JSON, kept byte for byte; absent: the type's example from the
    /// event-type catalog.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    #[serde(default)]
    pub payload: Option<Box<RawValue>>,
}

/// Sends a test event to one endpoint only: a real event of `app`
/// (validated, checked against its type's schema, signed and delivered
/// like any other, with a delivery log), listing `endpoint` alone, marked
/// `test` so a replay never hands it to the app's other endpoints. Without
/// a payload, the type's catalog example is sent.
#[allow(clippy::too_many_arguments)]
pub async fn send_test_event<S: Store, C: PayloadCheck>(
    store: &S,
    settings: &Settings,
    check: &C,
    endpoint: &Endpoint,
    body: &[u8],
    now: DateTime<Utc>,
    rng: &mut (dyn RngCore + Send),
) -> Result<IngestResponse, PipelineError> {
    let request: TestEventRequest = parse_body(
        settings,
        body,
        1,
        r#"{"event_type": string, "payload"?: any JSON}"#,
    )?;
    let event_type = EventType::parse(&request.event_type)?;
    // What the endpoint takes first: no catalog read for a refusal.
    let route = EndpointRoute::from(endpoint);
    if endpoint.disabled {
        return Err(PipelineError::Conflict(
            "the endpoint is disabled: enable it to send it a test event".into(),
        ));
    }
    if !route.receives(&event_type) {
        return Err(PipelineError::invalid(
            "not_subscribed",
            format!("the endpoint does not subscribe to {event_type}"),
        ));
    }
    let payload = match request.payload {
        Some(payload) => payload,
        None => {
            let example = store
                .get_event_type(&event_type)
                .await?
                .and_then(|def| def.example)
                .ok_or_else(|| {
                    PipelineError::invalid(
                        "payload_required",
                        format!("no payload given and {event_type} has no example in the catalog"),
                    )
                })?;
            serde_json::value::to_raw_value(&example)
                .map_err(|e| PipelineError::Corrupt(format!("catalog example: {e}")))?
        }
    };
    let valid = validate_event(
        settings,
        EventRequest {
            event_type: event_type.to_string(),
            payload,
            ordering_key: None,
        },
        None,
    )?;
    check.check(store, &endpoint.app_id, &valid).await?;
    let (mut new, response) = plan_event(
        endpoint.app_id.clone(),
        valid.event_type,
        &valid.payload,
        std::slice::from_ref(&route),
        now,
        rng,
    );
    // One endpoint: a listed fan-out, with no delivery item (nor a digest
    // of the body) made yet, so the body may still change.
    debug_assert!(new.deliveries.is_empty());
    new.event.mark_test();
    match store.commit_event(&new).await? {
        CommitOutcome::Committed => {
            tracing::info!(event_id = %new.event.id, app_id = %endpoint.app_id, endpoint_id = %endpoint.id, event_type = %new.event.event_type, "test event accepted");
            Ok(response)
        }
        // No key, so no key conflict; a contended commit is retried by the caller.
        CommitOutcome::IdempotencyKeyTaken(_)
        | CommitOutcome::Contended
        | CommitOutcome::OrderMoved => Err(PipelineError::store(
            "the test event's commit was contended; retry",
            true,
        )),
    }
}

/// Most events in one batch request.
pub const MAX_BATCH_EVENTS: usize = 100;

/// The request body of `POST /v1/apps/{app_id}/events/batch`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    /// 1 to 100 events; each is accepted or refused on its own.
    pub events: Vec<BatchEvent>,
}

/// One event of a batch: an event request with its own optional key.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchEvent {
    pub event_type: String,
    /// Any JSON value, kept byte for byte.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub payload: Box<RawValue>,
    /// As the `Idempotency-Key` header of a single event (1-255 visible ASCII).
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// As a single event's: the batch's events with the same key are
    /// accepted in the batch's order.
    #[serde(default)]
    pub ordering_key: Option<String>,
}

/// Accepts a batch of events of one app: each event is validated and
/// committed on its own (its own transaction: all of an event or none of
/// it, never a partial event), so one bad or conflicting event does not
/// refuse the others. The endpoints are read once for the whole batch.
/// Results are in request order.
pub async fn ingest_batch<S: Store, C: PayloadCheck>(
    store: &S,
    settings: &Settings,
    check: &C,
    app_id: &str,
    body: &[u8],
    now: DateTime<Utc>,
    rng: &mut (dyn RngCore + Send),
) -> Result<Vec<Result<Accepted, PipelineError>>, PipelineError> {
    use futures::StreamExt;
    let app_id = AppId::parse(app_id)?;
    let request: BatchRequest = parse_body(
        settings,
        body,
        MAX_BATCH_EVENTS,
        r#"{"events": [{"event_type", "payload", "idempotency_key"?, "ordering_key"?}]}"#,
    )?;
    if request.events.is_empty() || request.events.len() > MAX_BATCH_EVENTS {
        return Err(PipelineError::invalid(
            "invalid_batch",
            format!("a batch holds 1 to {MAX_BATCH_EVENTS} events"),
        ));
    }
    // Validate each; keys already taken are found by the commits (replays).
    let mut results: Vec<Option<Result<Accepted, PipelineError>>> = Vec::new();
    let mut to_plan: Vec<(usize, ValidEvent)> = Vec::new();
    for (index, item) in request.events.into_iter().enumerate() {
        let request = EventRequest {
            event_type: item.event_type,
            payload: item.payload,
            ordering_key: item.ordering_key,
        };
        let checked = match validate_event(settings, request, item.idempotency_key.as_deref()) {
            Ok(valid) => check.check(store, &app_id, &valid).await.map(|()| valid),
            Err(err) => Err(err),
        };
        match checked {
            Ok(valid) => {
                to_plan.push((index, valid));
                results.push(None);
            }
            Err(err) if err.is_retryable() => return Err(err),
            Err(err) => results.push(Some(Err(err))),
        }
    }
    // One read of the endpoints. Unkeyed events commit side by side; the
    // events of one ordering key commit one after another, in the batch's
    // order (each after the one before it), beside the others.
    if !to_plan.is_empty() {
        let endpoints = store.list_routes(&app_id).await?;
        let mut lanes: Vec<Vec<(usize, ValidEvent)>> = Vec::new();
        let mut lane_of_key: HashMap<String, usize> = HashMap::new();
        for (index, valid) in to_plan {
            match valid.ordering_key.clone() {
                Some(key) => {
                    let lane = *lane_of_key.entry(key).or_insert_with(|| {
                        lanes.push(Vec::new());
                        lanes.len() - 1
                    });
                    lanes[lane].push((index, valid));
                }
                None => lanes.push(vec![(index, valid)]),
            }
        }
        // Each lane its own generator, seeded from the caller's.
        let seeded: Vec<(Vec<(usize, ValidEvent)>, StdRng)> = lanes
            .into_iter()
            .map(|lane| (lane, StdRng::seed_from_u64(rng.next_u64())))
            .collect();
        let (app, endpoints) = (&app_id, &endpoints);
        let committed: Vec<Vec<(usize, Result<Accepted, PipelineError>)>> =
            futures::stream::iter(seeded)
                .map(|(lane, mut lane_rng)| async move {
                    let mut head = None;
                    let mut outcomes = Vec::with_capacity(lane.len());
                    for (index, valid) in lane {
                        let outcome = async {
                            let read = match (&valid.ordering_key, head.take()) {
                                (Some(_), Some(known)) => Some(known),
                                (Some(key), None) => Some(store.get_key_head(app, key).await?),
                                (None, _) => None,
                            };
                            accept(store, app, &valid, endpoints, read, now, &mut lane_rng).await
                        }
                        .await;
                        outcomes.push((
                            index,
                            outcome.map(|(accepted, left)| {
                                head = left;
                                accepted
                            }),
                        ));
                    }
                    outcomes
                })
                .buffered(BATCH_COMMIT_CONCURRENCY)
                .collect()
                .await;
        for (index, outcome) in committed.into_iter().flatten() {
            results[index] = Some(outcome);
        }
    }
    Ok(results
        .into_iter()
        .map(|r| r.expect("every batch event has an outcome"))
        .collect())
}

/// Event transactions of one batch in flight at once.
const BATCH_COMMIT_CONCURRENCY: usize = 8;

/// Commits tried before a contended ingest gives up (retryable, 503).
const COMMIT_ROUNDS: u32 = 4;

/// The event with its fan-out listed (up to [`FANOUT_LIST_MAX`] endpoints), or
/// with its deliveries (inline up to [`INLINE_DELIVERIES`], the rest as
/// a fan-out list) and the 202 body, for the `endpoints` that receive it. Pure:
/// also what a producer's own transaction uses (`hookline-aws`'s outbox).
pub fn plan_event(
    app_id: AppId,
    event_type: EventType,
    payload: &RawValue,
    endpoints: &[EndpointRoute],
    now: DateTime<Utc>,
    rng: &mut (dyn RngCore + Send),
) -> (NewEvent, IngestResponse) {
    let targets: Vec<EndpointId> = endpoints
        .iter()
        .filter(|e| e.receives(&event_type))
        .map(|e| e.id.clone())
        .collect();
    let event = Event::new(
        EventId::new_fanout_base(now, rng),
        app_id,
        event_type,
        payload,
        now,
    );
    // The usual case: the fan-out is a list on the event, nothing more.
    // Larger ones: delivery items, inline up to INLINE_DELIVERIES, the rest
    // materialised by dispatch.
    let listed = targets.len() <= FANOUT_LIST_MAX;
    let delivery_ids: Vec<DeliveryId> = if listed {
        (0..targets.len())
            .map(|position| {
                DeliveryId::for_fanout(&event.id, position)
                    .expect("a fan-out base id has room for FANOUT_LIST_MAX positions")
            })
            .collect()
    } else {
        targets
            .iter()
            .map(|ep| DeliveryId::for_event_endpoint(&event.id, ep))
            .collect()
    };
    let (targets, deliveries, fanout_remaining) = if listed {
        (targets, Vec::new(), Vec::new())
    } else {
        let inline = targets.len().min(INLINE_DELIVERIES);
        let deliveries: Vec<Delivery> = targets[..inline]
            .iter()
            .zip(&delivery_ids)
            .map(|(ep, id)| Delivery::new(id.clone(), &event, ep.clone(), now))
            .collect();
        (Vec::new(), deliveries, targets[inline..].to_vec())
    };
    let response = IngestResponse {
        event_id: event.id.clone(),
        delivery_ids,
    };
    let new = NewEvent {
        event,
        targets,
        deliveries,
        fanout_remaining,
        idempotency: None,
        key_head: None,
    };
    (new, response)
}

fn replay(existing: IdempotencyRecord, request_hash: &str) -> Result<Accepted, PipelineError> {
    if existing.request_hash != request_hash {
        return Err(PipelineError::Conflict(
            "Idempotency-Key was already used with a different request".into(),
        ));
    }
    Ok(Accepted {
        body: existing.response,
        replayed: true,
    })
}

fn payload_too_large(settings: &Settings) -> PipelineError {
    PipelineError::invalid(
        "payload_too_large",
        format!("payload exceeds {} bytes", settings.max_payload_bytes),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::MemoryStore;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn settings() -> Settings {
        Settings::for_tests(&[]).unwrap()
    }

    const BODY: &[u8] = br#"{"event_type":"order.paid","payload":{"n":1}}"#;

    /// `BODY` for app `acme` with Idempotency-Key `k`, now.
    async fn ingest_k(store: &MemoryStore, rng: &mut StdRng) -> Accepted {
        ingest(
            store,
            &settings(),
            &Unchecked,
            "acme",
            Some("k"),
            BODY,
            Utc::now(),
            rng,
        )
        .await
        .expect("accepted")
    }

    /// A payload check that refuses every payload, counting its calls.
    struct Refusing(std::sync::atomic::AtomicU32);

    impl PayloadCheck for Refusing {
        async fn check<S: Store>(
            &self,
            _store: &S,
            _app_id: &AppId,
            _valid: &ValidEvent,
        ) -> Result<(), PipelineError> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Err(PipelineError::invalid("payload_schema_mismatch", "refused"))
        }
    }

    /// The payload check and the endpoint query run together: a refused
    /// payload is the answer even when the query failed, a failed query is
    /// a retryable error, and neither commits anything.
    #[tokio::test]
    async fn a_refused_payload_wins_over_a_failed_endpoint_query() {
        let store = MemoryStore::default();
        let mut rng = StdRng::seed_from_u64(7);
        let refusing = Refusing(0.into());
        // `BODY` for app `acme` without a key, vetted by `check`.
        async fn send<C: PayloadCheck>(
            store: &MemoryStore,
            check: &C,
            rng: &mut StdRng,
        ) -> Result<Accepted, PipelineError> {
            ingest(
                store,
                &settings(),
                check,
                "acme",
                None,
                BODY,
                Utc::now(),
                rng,
            )
            .await
        }
        store.fail_next_route_reads(1);
        let err = send(&store, &refusing, &mut rng)
            .await
            .expect_err("refused");
        assert!(!err.is_retryable(), "{err:?}");
        assert!(err.to_string().contains("refused"), "{err}");
        assert_eq!(refusing.0.load(std::sync::atomic::Ordering::Relaxed), 1);
        // The query ran alongside the check (its injected failure is spent):
        // one round trip before the commit, not two.
        send(&store, &Unchecked, &mut rng).await.expect("accepted");
        assert_eq!(store.events().len(), 1);

        store.fail_next_route_reads(1);
        let err = send(&store, &Unchecked, &mut rng)
            .await
            .expect_err("query failed");
        assert!(err.is_retryable(), "{err:?}");
        assert_eq!(store.events().len(), 1, "nothing committed");
    }

    /// DynamoDB answers TransactionConflict when a concurrent request holds
    /// the same idempotency key: retried, never a 500.
    #[tokio::test]
    async fn a_contended_commit_is_retried() {
        let store = MemoryStore::default();
        store.contend_next_commits(2);
        let mut rng = StdRng::seed_from_u64(1);
        let accepted = ingest(
            &store,
            &settings(),
            &Unchecked,
            "acme",
            Some("k1"),
            BODY,
            Utc::now(),
            &mut rng,
        )
        .await
        .unwrap();
        assert!(!accepted.replayed);
        // Contended every time: a retryable error (503 at the edge).
        store.contend_next_commits(10);
        let err = ingest(
            &store,
            &settings(),
            &Unchecked,
            "acme",
            Some("k2"),
            BODY,
            Utc::now(),
            &mut rng,
        )
        .await
        .unwrap_err();
        assert!(err.is_retryable(), "{err}");
    }

    /// The concurrent request with the same key committed first: the
    /// contended one replays its answer.
    #[tokio::test]
    async fn a_contended_commit_replays_the_winner() {
        let store = MemoryStore::default();
        let mut rng = StdRng::seed_from_u64(2);
        let winner = ingest_k(&store, &mut rng).await;
        // The loser read no record before the winner committed, then met
        // the conflict: simulate by contending its first commit.
        store.contend_next_commits(1);
        let loser = ingest_k(&store, &mut rng).await;
        assert!(loser.replayed);
        assert_eq!(loser.body, winner.body);
        crate::fakes::record_figure(
            "races",
            "concurrent duplicate meets TransactionConflict (fakes): the winner's answer replayed, 1 event written, 0 5xx",
        );
    }

    #[tokio::test]
    async fn payload_text_is_kept_and_hashed_as_sent() {
        let store = MemoryStore::default();
        let mut rng = StdRng::seed_from_u64(3);
        let body =
            br#"{"event_type":"a.b","payload": {"x":1.10, "big":123456789012345678901234567890} }"#;
        ingest(
            &store,
            &settings(),
            &Unchecked,
            "acme",
            Some("k"),
            body,
            Utc::now(),
            &mut rng,
        )
        .await
        .unwrap();
        // Same value, other bytes: a different request for the same key.
        let other =
            br#"{"event_type":"a.b","payload":{"x":1.1,"big":123456789012345678901234567890}}"#;
        let err = ingest(
            &store,
            &settings(),
            &Unchecked,
            "acme",
            Some("k"),
            other,
            Utc::now(),
            &mut rng,
        )
        .await
        .unwrap_err();
        assert!(matches!(err, PipelineError::Conflict(_)), "{err}");
    }

    #[tokio::test]
    async fn a_batch_answers_each_event_on_its_own() {
        let store = MemoryStore::default();
        let mut rng = StdRng::seed_from_u64(4);
        // The key `k` answered before: replayed inside the batch.
        let earlier = ingest_k(&store, &mut rng).await;
        let big = "x".repeat(settings().max_payload_bytes + 1);
        let body = serde_json::json!({"events": [
            {"event_type": "order.paid", "payload": {"n": 1}},
            {"event_type": "order paid", "payload": {}},
            {"event_type": "order.paid", "payload": {"n": 1}, "idempotency_key": "k"},
            {"event_type": "order.paid", "payload": {"n": 2}, "idempotency_key": "k"},
            {"event_type": "order.paid", "payload": {"big": big}},
            {"event_type": "order.paid", "payload": {"n": 3}, "idempotency_key": "k3"},
        ]})
        .to_string();
        let results = batch(&store, body.as_bytes(), &mut rng).await;
        assert_eq!(results.len(), 6);
        assert!(matches!(&results[0], Ok(a) if !a.replayed));
        assert!(matches!(
            &results[1],
            Err(PipelineError::Invalid {
                code: "invalid_input",
                ..
            })
        ));
        assert!(matches!(&results[2], Ok(a) if a.replayed && a.body == earlier.body));
        assert!(matches!(&results[3], Err(PipelineError::Conflict(_))));
        assert!(matches!(
            &results[4],
            Err(PipelineError::Invalid {
                code: "payload_too_large",
                ..
            })
        ));
        assert!(matches!(&results[5], Ok(a) if !a.replayed));
        // The first ingest plus the two new events, nothing of the refused ones.
        assert_eq!(store.events().len(), 3);
        // The batch's own key answers again the same way.
        let again = ingest_batch(
            &store,
            &settings(),
            &Unchecked,
            "acme",
            br#"{"events":[{"event_type":"order.paid","payload":{"n":3},"idempotency_key":"k3"}]}"#,
            Utc::now(),
            &mut rng,
        )
        .await
        .unwrap();
        assert!(matches!(&again[0], Ok(a) if a.replayed));
        assert_eq!(store.events().len(), 3);
    }

    #[tokio::test]
    async fn a_batch_must_hold_1_to_100_events() {
        let store = MemoryStore::default();
        let mut rng = StdRng::seed_from_u64(5);
        let one = r#"{"event_type":"a.b","payload":1}"#;
        for (body, code) in [
            (r#"{"events":[]}"#.to_owned(), "invalid_batch"),
            (
                format!(r#"{{"events":[{}]}}"#, vec![one; 101].join(",")),
                "invalid_batch",
            ),
            (
                r#"[{"event_type":"a.b","payload":1}]"#.to_owned(),
                "invalid_body",
            ),
            (
                r#"{"events":[{"event_type":"a.b"}]}"#.to_owned(),
                "invalid_body",
            ),
        ] {
            let err = ingest_batch(
                &store,
                &settings(),
                &Unchecked,
                "acme",
                body.as_bytes(),
                Utc::now(),
                &mut rng,
            )
            .await
            .unwrap_err();
            assert!(
                matches!(err, PipelineError::Invalid { code: c, .. } if c == code),
                "{err}"
            );
        }
        let hundred = format!(r#"{{"events":[{}]}}"#, vec![one; 100].join(","));
        let results = ingest_batch(
            &store,
            &settings(),
            &Unchecked,
            "acme",
            hundred.as_bytes(),
            Utc::now(),
            &mut rng,
        )
        .await
        .unwrap();
        assert!(results.iter().all(Result::is_ok));
        assert_eq!(store.events().len(), 100);
    }

    /// A batch request's results (the request itself accepted).
    async fn batch(
        store: &MemoryStore,
        body: &[u8],
        rng: &mut StdRng,
    ) -> Vec<Result<Accepted, PipelineError>> {
        ingest_batch(
            store,
            &settings(),
            &Unchecked,
            "acme",
            body,
            Utc::now(),
            rng,
        )
        .await
        .expect("a batch of valid shape")
    }

    /// `{"n": n}` with ordering key `key` (and Idempotency-Key `idem`).
    async fn keyed(
        store: &MemoryStore,
        key: &str,
        n: u32,
        idem: Option<&str>,
        now: DateTime<Utc>,
        rng: &mut StdRng,
    ) -> IngestResponse {
        let body = format!(
            r#"{{"event_type":"order.paid","payload":{{"n":{n}}},"ordering_key":"{key}"}}"#
        );
        let accepted = ingest(
            store,
            &settings(),
            &Unchecked,
            "acme",
            idem,
            body.as_bytes(),
            now,
            rng,
        )
        .await
        .expect("accepted");
        serde_json::from_str(&accepted.body).unwrap()
    }

    fn event_of(store: &MemoryStore, id: &EventId) -> Event {
        store
            .events()
            .into_iter()
            .find(|e| &e.event.id == id)
            .unwrap()
            .event
    }

    async fn with_endpoint(store: &MemoryStore) -> EndpointId {
        let ep = Endpoint::new(
            EndpointId::generate(),
            AppId::parse("acme").unwrap(),
            "https://example.com/hook",
            hookline_core::signing::Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
                .unwrap(),
            Utc::now(),
        );
        store
            .put_endpoint(&ep, crate::settings::MAX_ENDPOINTS_PER_APP_CEILING)
            .await
            .unwrap();
        ep.id
    }

    /// A key's events are accepted one after another, each after the key's
    /// latest (a millisecond later even from a clock behind), and each
    /// delivery waits for the key's previous one to the endpoint.
    #[tokio::test]
    async fn a_keys_events_are_ordered_at_commit_even_behind_another_clock() {
        let store = MemoryStore::default();
        let endpoint = with_endpoint(&store).await;
        let mut rng = StdRng::seed_from_u64(36);
        let now = Utc::now();
        let first = keyed(&store, "order_1", 1, None, now, &mut rng).await;
        // This instance's clock is a second behind the first's.
        let second = keyed(
            &store,
            "order_1",
            2,
            None,
            now - chrono::TimeDelta::seconds(1),
            &mut rng,
        )
        .await;
        let (a, b) = (
            event_of(&store, &first.event_id),
            event_of(&store, &second.event_id),
        );
        assert_eq!(
            b.created_at,
            a.created_at + chrono::TimeDelta::milliseconds(1)
        );
        assert!(b.id > a.id, "a key's event ids sort in its order");
        assert!(a.after.is_empty());
        assert_eq!(
            b.after
                .get(&endpoint)
                .map(|t| (t.delivery.clone(), t.event.clone())),
            Some((first.delivery_ids[0].clone(), a.id.clone()))
        );
        assert_eq!(b.ordering_key.as_deref(), Some("order_1"));
        // Another key starts its own order.
        let other = keyed(&store, "order_2", 3, None, now, &mut rng).await;
        assert!(event_of(&store, &other.event_id).after.is_empty());
        let app = AppId::parse("acme").unwrap();
        assert_eq!(store.key_head(&app, "order_1").unwrap().version, 2);
    }

    /// Two requests with the same key race: the one whose head moved under
    /// it reads the head again and is ordered after the winner; a retried
    /// request with the same Idempotency-Key keeps its place.
    #[tokio::test]
    async fn a_request_that_lost_the_race_for_its_key_goes_after_the_winner() {
        let store = MemoryStore::default();
        let endpoint = with_endpoint(&store).await;
        let mut rng = StdRng::seed_from_u64(37);
        let now = Utc::now();
        let first = keyed(&store, "k", 1, Some("idem-1"), now, &mut rng).await;
        let app = AppId::parse("acme").unwrap();
        let head = store.key_head(&app, "k").unwrap();
        // The winner: committed between this request's head read and its commit.
        let winner = hookline_core::ordering::plan(
            &head,
            &EventId::generate(),
            &[(endpoint.clone(), DeliveryId::generate())],
            now + chrono::TimeDelta::milliseconds(5),
        );
        store.race_next_head_read(winner.head.clone());
        let loser = keyed(&store, "k", 2, None, now, &mut rng).await;
        let lost = event_of(&store, &loser.event_id);
        assert_eq!(lost.after.get(&endpoint), winner.head.tails.get(&endpoint));
        assert!(lost.created_at > winner.accepted_at);
        assert_eq!(store.key_head(&app, "k").unwrap().version, 3);
        // The first request again: its answer, its place.
        let again = keyed(&store, "k", 1, Some("idem-1"), now, &mut rng).await;
        assert_eq!(again, first);
        assert_eq!(
            store.key_head(&app, "k").unwrap().version,
            3,
            "a replay moves nothing"
        );
        // The same Idempotency-Key with another ordering key is another request.
        let body = br#"{"event_type":"order.paid","payload":{"n":1},"ordering_key":"other"}"#;
        let err = ingest(
            &store,
            &settings(),
            &Unchecked,
            "acme",
            Some("idem-1"),
            body,
            now,
            &mut rng,
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("Idempotency-Key"), "{err}");
    }

    /// A batch's events of one key are accepted in the batch's order, each
    /// after the one before it; other keys and unkeyed events beside them.
    #[tokio::test]
    async fn a_batchs_events_of_one_key_keep_the_batchs_order() {
        let store = MemoryStore::default();
        let endpoint = with_endpoint(&store).await;
        let mut rng = StdRng::seed_from_u64(38);
        let events: Vec<String> = (0..12)
            .map(|n| {
                let key = match n % 3 {
                    0 => r#","ordering_key":"a""#,
                    1 => r#","ordering_key":"b""#,
                    _ => "",
                };
                format!(r#"{{"event_type":"order.paid","payload":{{"n":{n}}}{key}}}"#)
            })
            .collect();
        let body = format!(r#"{{"events":[{}]}}"#, events.join(","));
        let results = batch(&store, body.as_bytes(), &mut rng).await;
        let answers: Vec<IngestResponse> = results
            .into_iter()
            .map(|r| serde_json::from_str(&r.unwrap().body).unwrap())
            .collect();
        for key in [0, 1] {
            let chain: Vec<&IngestResponse> = answers.iter().skip(key).step_by(3).collect();
            for pair in chain.windows(2) {
                let later = event_of(&store, &pair[1].event_id);
                assert_eq!(
                    later.after.get(&endpoint).map(|t| t.delivery.clone()),
                    Some(pair[0].delivery_ids[0].clone())
                );
                assert!(later.created_at > event_of(&store, &pair[0].event_id).created_at);
            }
        }
        assert!(answers
            .iter()
            .skip(2)
            .step_by(3)
            .all(|a| event_of(&store, &a.event_id).after.is_empty()));
        // A bad key is that event's own 400.
        let bad =
            br#"{"events":[{"event_type":"order.paid","payload":{},"ordering_key":"has space"}]}"#;
        let results = ingest_batch(
            &store,
            &settings(),
            &Unchecked,
            "acme",
            bad,
            Utc::now(),
            &mut rng,
        )
        .await
        .unwrap();
        assert!(results[0]
            .as_ref()
            .unwrap_err()
            .to_string()
            .contains("ordering_key"));
    }

    /// A keyed event goes to at most 100 endpoints (a listed fan-out):
    /// past that, 400 naming the limit, nothing written.
    #[tokio::test]
    async fn a_keyed_event_to_more_than_100_endpoints_is_refused() {
        let store = MemoryStore::default();
        for _ in 0..=FANOUT_LIST_MAX {
            with_endpoint(&store).await;
        }
        let mut rng = StdRng::seed_from_u64(39);
        let body = br#"{"event_type":"order.paid","payload":{},"ordering_key":"k"}"#;
        let err = ingest(
            &store,
            &settings(),
            &Unchecked,
            "acme",
            None,
            body,
            Utc::now(),
            &mut rng,
        )
        .await
        .unwrap_err();
        assert!(!err.is_retryable());
        assert!(err.to_string().contains("at most 100 endpoints"), "{err}");
        assert!(store.events().is_empty());
        assert!(store
            .key_head(&AppId::parse("acme").unwrap(), "k")
            .is_none());
    }
}
