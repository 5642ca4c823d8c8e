//! `/v1/apps/{app_id}/events`: ingestion and reading an accepted event.

use hookline_pipeline::ingest::{ingest, ingest_batch, BatchRequest, EventRequest, IngestResponse};
use hookline_pipeline::ports::Store;
use hookline_pipeline::PipelineError;
use lambda_http::http::{HeaderValue, StatusCode};
use lambda_http::Body;

use crate::call::{Answer, Call};
use crate::error::ApiError;
use crate::respond::{json, with_type};
use crate::views::{
    AppPath, BatchItemOut, BatchResponse, ErrorBody, ErrorDetail, EventOut, EventPath,
    IdempotencyHeader,
};
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
        &api.catalog,
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

/// Accepts up to 100 events in one request, each with its own optional
/// `idempotency_key`. Each event is all-or-nothing on its own (one
/// transaction per event); the answer lists every event's result in order.
#[utoipa::path(post, path = "/v1/apps/{app_id}/events/batch", tag = "events",
    params(AppPath), request_body = BatchRequest,
    responses(
        (status = 200, body = BatchResponse, description = "one result per event, in order"),
        (status = 400, body = ErrorBody, description = "not a batch, or not 1-100 events"),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 413, body = ErrorBody)))]
pub async fn create_event_batch<S: Store, Q>(api: &Api<S, Q>, call: Call<'_>) -> Answer {
    let path: AppPath = call.path()?;
    let results = ingest_batch(
        &api.store,
        &api.settings,
        &api.catalog,
        path.app_id.as_str(),
        call.body(),
        call.now,
        call.rng,
    )
    .await?;
    let mut items = Vec::with_capacity(results.len());
    for result in results {
        items.push(match result {
            Ok(accepted) => {
                let response: IngestResponse = serde_json::from_str(&accepted.body)
                    .map_err(|e| PipelineError::Corrupt(format!("stored answer: {e}")))?;
                BatchItemOut {
                    status: StatusCode::ACCEPTED.as_u16(),
                    event_id: Some(response.event_id.to_string()),
                    delivery_ids: Some(
                        response
                            .delivery_ids
                            .iter()
                            .map(ToString::to_string)
                            .collect(),
                    ),
                    replayed: accepted.replayed,
                    error: None,
                }
            }
            Err(err) => {
                let refused = ApiError::from(err);
                BatchItemOut {
                    status: refused.status.as_u16(),
                    event_id: None,
                    delivery_ids: None,
                    replayed: false,
                    error: Some(ErrorDetail {
                        code: refused.code.to_owned(),
                        message: refused.message,
                        location: refused.location,
                    }),
                }
            }
        });
    }
    Ok(json(StatusCode::OK, &BatchResponse { items }))
}

/// An accepted event and its payload.
#[utoipa::path(get, path = "/v1/apps/{app_id}/events/{event_id}", tag = "events",
    params(EventPath),
    responses((status = 200, body = EventOut), (status = 404, body = ErrorBody)))]
pub async fn get_event<S: Store, Q>(api: &Api<S, Q>, call: Call<'_>) -> Answer {
    let path: EventPath = call.path()?;
    let stored = api
        .store
        .get_event(&path.app_id, &path.event_id)
        .await?
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
            ordering_key: stored.event.ordering_key.clone(),
        },
    ))
}
