//! `/v1/apps/{app_id}/events`: ingestion and reading an accepted event.

use hookline_pipeline::ingest::{ingest, EventRequest, IngestResponse};
use hookline_pipeline::ports::Store;
use hookline_pipeline::PipelineError;
use lambda_http::http::{HeaderValue, StatusCode};
use lambda_http::Body;

use crate::call::{Answer, Call};
use crate::respond::{json, with_type};
use crate::views::{AppPath, ErrorBody, EventOut, EventPath, IdempotencyHeader};
use crate::Api;

/// Accepts an event: one delivery per enabled, subscribed endpoint, committed
/// with the event in one transaction.
#[utoipa::path(post, path = "/v1/apps/{app_id}/events", tag = "events",
    params(AppPath, IdempotencyHeader), request_body = EventRequest,
    responses(
        (status = 202, body = IngestResponse, description = "accepted (or replayed: header `Idempotent-Replayed: true`)"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "the Idempotency-Key was used with another body"),
        (status = 413, body = ErrorBody)))]
pub async fn create_event<S: Store, Q>(api: &Api<S, Q>, call: Call<'_>) -> Answer {
    let path: AppPath = call.path()?;
    let key = call.header("Idempotency-Key", "invalid_idempotency_key")?;
    let accepted = ingest(
        &api.store,
        &api.settings,
        path.app_id.as_str(),
        key,
        call.body(),
        call.now,
        call.rng,
    )
    .await?;
    let mut response = with_type(
        StatusCode::ACCEPTED,
        Body::Text(accepted.body),
        "application/json",
    );
    if accepted.replayed {
        response
            .headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(response)
}

/// An accepted event and its payload.
#[utoipa::path(get, path = "/v1/apps/{app_id}/events/{event_id}", tag = "events",
    params(EventPath),
    responses((status = 200, body = EventOut), (status = 404, body = ErrorBody)))]
pub async fn get_event<S: Store, Q>(api: &Api<S, Q>, call: Call<'_>) -> Answer {
    let path: EventPath = call.path()?;
    let stored = api
        .store
        .get_event(&path.event_id)
        .await?
        .filter(|e| e.event.app_id == path.app_id)
        .ok_or(PipelineError::NotFound("event"))?;
    let payload = hookline_core::model::body_data(&stored.event.body).ok_or_else(|| {
        PipelineError::Corrupt(format!("event {} has no rendered body", stored.event.id))
    })?;
    Ok(json(
        StatusCode::OK,
        &EventOut {
            id: stored.event.id.to_string(),
            event_type: stored.event.event_type.to_string(),
            created_at: stored.event.created_at,
            payload,
            fanout_pending: stored.fanout_remaining.len(),
        },
    ))
}
