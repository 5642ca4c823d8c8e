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
use hookline_core::model::{Delivery, Endpoint, Event, EventType};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use crate::ports::{CommitOutcome, IdempotencyRecord, NewEvent, Store, INLINE_DELIVERIES};
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

/// Accepts one event. `now` and `rng` make the ids.
pub async fn ingest<S: Store>(
    store: &S,
    settings: &Settings,
    app_id: &str,
    idempotency_key: Option<&str>,
    body: &[u8],
    now: DateTime<Utc>,
    rng: &mut (dyn RngCore + Send),
) -> Result<Accepted, PipelineError> {
    let app_id = AppId::parse(app_id)?;
    // Cheap guard before parsing: the envelope adds little to the payload.
    if body.len() > settings.max_payload_bytes.saturating_add(16 * 1024) {
        return Err(payload_too_large(settings));
    }
    let request: EventRequest = serde_json::from_slice(body).map_err(|e| {
        PipelineError::invalid(
            "invalid_body",
            format!("expected {{\"event_type\": string, \"payload\": any JSON}}: {e}"),
        )
    })?;
    let event_type = EventType::parse(&request.event_type)?;
    let payload_text = request.payload.get();
    if payload_text.len() > settings.max_payload_bytes {
        return Err(payload_too_large(settings));
    }
    let request_hash = hex::encode(
        Sha256::new()
            .chain_update(event_type.as_str())
            .chain_update([0u8])
            .chain_update(payload_text.as_bytes())
            .finalize(),
    );

    if let Some(key) = idempotency_key {
        validate_idempotency_key(key)?;
        if let Some(existing) = store.get_idempotency(&app_id, key).await? {
            return replay(existing, &request_hash);
        }
    }

    let endpoints = store.list_endpoints(&app_id).await?;
    let (mut new, response) = plan_event(
        app_id.clone(),
        event_type,
        &request.payload,
        &endpoints,
        now,
        rng,
    );
    let response_body =
        serde_json::to_string(&response).map_err(|e| PipelineError::Corrupt(e.to_string()))?;
    new.idempotency = idempotency_key.map(|key| IdempotencyRecord {
        app_id: app_id.clone(),
        key: key.to_owned(),
        request_hash: request_hash.clone(),
        response: response_body.clone(),
        created_at: now,
    });
    // A TransactionConflict (a concurrent request on the same key) is not a
    // failure: look again (the winner's answer is replayed) or commit again.
    for round in 0..COMMIT_ROUNDS {
        match store.commit_event(&new).await? {
            CommitOutcome::Committed => {
                tracing::info!(
                    event_id = %new.event.id,
                    app_id = %app_id,
                    event_type = %new.event.event_type,
                    deliveries = response.delivery_ids.len(),
                    fanout_deferred = new.fanout_remaining.len(),
                    "event accepted"
                );
                return Ok(Accepted {
                    body: response_body,
                    replayed: false,
                });
            }
            CommitOutcome::IdempotencyKeyTaken(existing) => return replay(existing, &request_hash),
            CommitOutcome::Contended => {
                tracing::info!(event_id = %new.event.id, round, "event transaction contended; retrying");
                tokio::time::sleep(std::time::Duration::from_millis(25 << round)).await;
                if let Some(key) = idempotency_key {
                    if let Some(existing) = store.get_idempotency(&app_id, key).await? {
                        return replay(existing, &request_hash);
                    }
                }
            }
        }
    }
    Err(PipelineError::store(
        "the event transaction kept conflicting with concurrent requests; retry",
        true,
    ))
}

/// Commits tried before a contended ingest gives up (retryable, 503).
const COMMIT_ROUNDS: u32 = 4;

/// The event, its deliveries (inline up to [`INLINE_DELIVERIES`], the rest as
/// a fan-out list) and the 202 body, for the `endpoints` that receive it. Pure:
/// also what a producer's own transaction uses (`hookline-aws`'s outbox).
pub fn plan_event(
    app_id: AppId,
    event_type: EventType,
    payload: &RawValue,
    endpoints: &[Endpoint],
    now: DateTime<Utc>,
    rng: &mut (dyn RngCore + Send),
) -> (NewEvent, IngestResponse) {
    let targets: Vec<EndpointId> = endpoints
        .iter()
        .filter(|e| e.receives(&event_type))
        .map(|e| e.id.clone())
        .collect();
    let event = Event::new(EventId::new(now, rng), app_id, event_type, payload, now);
    let delivery_ids: Vec<DeliveryId> = targets
        .iter()
        .map(|ep| DeliveryId::for_event_endpoint(&event.id, ep))
        .collect();
    let inline = targets.len().min(INLINE_DELIVERIES);
    let deliveries: Vec<Delivery> = targets[..inline]
        .iter()
        .zip(&delivery_ids)
        .map(|(ep, id)| Delivery::new(id.clone(), &event, ep.clone(), now))
        .collect();
    let response = IngestResponse {
        event_id: event.id.clone(),
        delivery_ids,
    };
    let new = NewEvent {
        event,
        deliveries,
        fanout_remaining: targets[inline..].to_vec(),
        idempotency: None,
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
        ingest(store, &settings(), "acme", Some("k"), BODY, Utc::now(), rng)
            .await
            .expect("accepted")
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
}
