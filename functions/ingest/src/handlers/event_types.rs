//! `/v1/event-types`: the event-type catalog (admin key to change it, any
//! key to read it). A type's schema is checked at ingest for every app's
//! events of that type; endpoint subscriptions are checked against the
//! catalog once it is not empty.

use crate::catalog::{check_definition, EventTypeRequest};
use hookline_core::model::EventType;
use hookline_pipeline::ports::Store;
use hookline_pipeline::PipelineError;
use lambda_http::http::StatusCode;

use crate::call::{Answer, Call};
use crate::error::ApiError;
use crate::respond::{json, no_content};
use crate::views::{ErrorBody, EventTypeList, EventTypeOut, EventTypePath, EventTypeQuery};
use crate::Api;

/// Creates or replaces a catalog type (admin key only): 201 when new, 200
/// when replaced. The schema must compile and the example match it.
#[utoipa::path(put, path = "/v1/event-types/{name}", tag = "event types",
    params(EventTypePath), request_body(content = EventTypeRequest, description = "all fields optional"),
    responses((status = 200, body = EventTypeOut, description = "replaced"),
        (status = 201, body = EventTypeOut, description = "created"),
        (status = 400, body = ErrorBody, description = "`invalid_schema`, `example_schema_mismatch`, `invalid_description`, `invalid_event_type`"),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn put_event_type<S: Store, Q>(api: &Api<S, Q>, call: Call<'_>) -> Answer {
    let path: EventTypePath = call.path()?;
    let request: EventTypeRequest = call.json_or_default()?;
    let existing = api.store.get_event_type(&path.name).await?;
    let created_at = existing.as_ref().map_or(call.now, |e| e.created_at);
    let def = check_definition(&path.name, request, created_at, call.now)?;
    api.store.put_event_type(&def).await?;
    api.catalog.forget(&path.name);
    tracing::info!(event_type = %def.name, schema = def.schema.is_some(), "catalog type written");
    let status = if existing.is_some() {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok(json(status, &EventTypeOut::from(def)))
}

/// One catalog type.
#[utoipa::path(get, path = "/v1/event-types/{name}", tag = "event types",
    params(EventTypePath),
    responses((status = 200, body = EventTypeOut), (status = 404, body = ErrorBody)))]
pub async fn get_event_type<S: Store, Q>(api: &Api<S, Q>, call: Call<'_>) -> Answer {
    let path: EventTypePath = call.path()?;
    let def = api
        .store
        .get_event_type(&path.name)
        .await?
        .ok_or(PipelineError::NotFound("event type"))?;
    Ok(json(StatusCode::OK, &EventTypeOut::from(def)))
}

/// Removes a catalog type (admin key only). Events of that type are then
/// accepted without a schema check; endpoints subscribed to it keep it.
#[utoipa::path(delete, path = "/v1/event-types/{name}", tag = "event types",
    params(EventTypePath),
    responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn delete_event_type<S: Store, Q>(api: &Api<S, Q>, call: Call<'_>) -> Answer {
    let path: EventTypePath = call.path()?;
    if !api.store.delete_event_type(&path.name).await? {
        return Err(PipelineError::NotFound("event type").into());
    }
    api.catalog.forget(&path.name);
    tracing::info!(event_type = %path.name, "catalog type deleted");
    Ok(no_content())
}

/// The catalog by name, a page at a time.
#[utoipa::path(get, path = "/v1/event-types", tag = "event types",
    params(EventTypeQuery),
    responses((status = 200, body = EventTypeList), (status = 400, body = ErrorBody)))]
pub async fn list_event_types<S: Store, Q>(api: &Api<S, Q>, call: Call<'_>) -> Answer {
    let query: EventTypeQuery = call.query()?;
    let limit = match &query.limit {
        None => 50,
        Some(l) => l
            .parse::<usize>()
            .ok()
            .filter(|l| (1..=100).contains(l))
            .ok_or_else(|| ApiError::bad_request("invalid_query", "limit: 1..=100"))?,
    };
    let after = query
        .cursor
        .as_deref()
        .map(EventType::parse)
        .transpose()
        .map_err(|_| ApiError::bad_request("invalid_cursor", "not a cursor of this list"))?;
    let (page, more) = api.store.list_event_types(after.as_ref(), limit).await?;
    let next_cursor = more
        .then(|| page.last().map(|d| d.name.to_string()))
        .flatten();
    Ok(json(
        StatusCode::OK,
        &EventTypeList {
            items: page.into_iter().map(EventTypeOut::from).collect(),
            next_cursor,
        },
    ))
}
