//! One function per route, each documented for the OpenAPI document with
//! `#[utoipa::path]` next to the code that serves it.

use chrono::{DateTime, Utc};
use hookline_core::apikey::ApiKey;
use hookline_core::ids::{ApiKeyId, AppId, DeliveryId, EndpointId, EventId};
use hookline_core::model::{DeliveryStatus, Endpoint, EventType};
use hookline_core::signing::Secret;
use hookline_pipeline::ingest::{ingest, EventRequest, IngestResponse};
use hookline_pipeline::ports::{DeliveryQuery, Queue, Store};
use hookline_pipeline::recover::{
    recover_endpoint, retry_failed, RecoverReport, RecoverRequest, RetryOutcome,
};
use hookline_pipeline::redrive::{redrive, RedriveReport, RedriveRequest};
use hookline_pipeline::sender::{check_endpoint_url, check_resolved_host};
use hookline_pipeline::PipelineError;
use lambda_http::http::{HeaderValue, StatusCode};
use lambda_http::{Body, Request, RequestExt, Response};
use rand::RngCore;
use serde::{Deserialize, Serialize};

use crate::auth::Scope;
use crate::routes::Params;
use crate::views::*;
use crate::{Api, ApiError};

/// One request, matched and authenticated.
#[derive(Debug)]
pub struct Call<'a> {
    pub request: &'a Request,
    pub params: Params<'a>,
    /// `None` on public routes.
    pub scope: Option<Scope>,
    pub now: DateTime<Utc>,
}

type Answer = Result<Response<Body>, ApiError>;

fn bad_request(code: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, code, message)
}

impl Call<'_> {
    fn scope(&self) -> Result<&Scope, ApiError> {
        self.scope.as_ref().ok_or_else(|| {
            ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "missing API key")
        })
    }

    /// The `{app_id}` of the path, checked against the key's scope.
    fn app(&self) -> Result<AppId, ApiError> {
        let app = AppId::parse(self.params.get("app_id")).map_err(PipelineError::from)?;
        self.scope()?.allows(&app)?;
        Ok(app)
    }

    fn id<T>(
        &self,
        name: &str,
        parse: fn(&str) -> Result<T, hookline_core::CoreError>,
    ) -> Result<T, ApiError> {
        parse(self.params.get(name)).map_err(|e| ApiError::from(PipelineError::from(e)))
    }

    fn body(&self) -> &[u8] {
        self.request.body().as_ref()
    }

    fn json<T: for<'de> Deserialize<'de>>(&self) -> Result<T, ApiError> {
        serde_json::from_slice(self.body()).map_err(|e| bad_request("invalid_body", e.to_string()))
    }

    /// The JSON body, or the default when the body is empty.
    fn json_or_default<T: for<'de> Deserialize<'de> + Default>(&self) -> Result<T, ApiError> {
        if self.body().iter().all(u8::is_ascii_whitespace) {
            Ok(T::default())
        } else {
            self.json()
        }
    }
}

/// A JSON answer.
pub fn json<T: Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    let body = serde_json::to_string(value).unwrap_or_else(|_| "{}".to_owned());
    let mut response = Response::new(Body::Text(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    response
}

fn no_content() -> Response<Body> {
    let mut response = Response::new(Body::Empty);
    *response.status_mut() = StatusCode::NO_CONTENT;
    response
}

fn validate_event_types(types: &[String]) -> Result<(), ApiError> {
    if types.len() > 100 {
        return Err(bad_request(
            "invalid_event_types",
            "at most 100 event types",
        ));
    }
    for t in types {
        let name = t.strip_suffix(".*").unwrap_or(t);
        if t != "*" && EventType::parse(name).is_err() {
            return Err(bad_request(
                "invalid_event_types",
                format!("`{t}` is not an event type or `prefix.*`"),
            ));
        }
    }
    Ok(())
}

fn validate_description(description: Option<&String>) -> Result<(), ApiError> {
    if description.is_some_and(|d| d.len() > 1024) {
        return Err(bad_request("invalid_description", "at most 1024 bytes"));
    }
    Ok(())
}

async fn check_url<S, Q>(api: &Api<S, Q>, url: &str) -> Result<(), ApiError> {
    let parsed = check_endpoint_url(url, api.settings.allow_private_endpoints)
        .map_err(|reason| bad_request("invalid_url", reason))?;
    if !api.settings.allow_private_endpoints {
        check_resolved_host(&parsed, &api.lookup)
            .await
            .map_err(|reason| bad_request("invalid_url", reason))?;
    }
    Ok(())
}

async fn endpoint_of<S: Store, Q>(api: &Api<S, Q>, call: &Call<'_>) -> Result<Endpoint, ApiError> {
    let app = call.app()?;
    let id = call.id("endpoint_id", EndpointId::parse)?;
    Ok(api
        .store
        .get_endpoint(&app, &id)
        .await?
        .ok_or(PipelineError::NotFound("endpoint"))?)
}

/// Liveness: no key needed.
#[utoipa::path(get, path = "/health", tag = "meta", security(),
    responses((status = 200, body = Health)))]
pub fn health() -> Answer {
    Ok(json(
        StatusCode::OK,
        &Health {
            status: "ok".into(),
        },
    ))
}

/// Accepts an event: one delivery per enabled, subscribed endpoint, committed
/// with the event in one transaction.
#[utoipa::path(post, path = "/v1/apps/{app_id}/events", tag = "events",
    params(AppPath, IdempotencyHeader), request_body = EventRequest,
    responses(
        (status = 202, body = IngestResponse, description = "accepted (or replayed: header `Idempotent-Replayed: true`)"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "the Idempotency-Key was used with another body"),
        (status = 413, body = ErrorBody)))]
pub async fn create_event<S: Store, Q>(
    api: &Api<S, Q>,
    call: &Call<'_>,
    rng: &mut (dyn RngCore + Send),
) -> Answer {
    let app = call.app()?;
    let key = match call.request.headers().get("idempotency-key") {
        Some(v) => Some(v.to_str().map_err(|_| {
            bad_request(
                "invalid_idempotency_key",
                "Idempotency-Key must be visible ASCII",
            )
        })?),
        None => None,
    };
    let accepted = ingest(
        &api.store,
        &api.settings,
        app.as_str(),
        key,
        call.body(),
        call.now,
        rng,
    )
    .await?;
    let mut response = Response::new(Body::Text(accepted.body));
    *response.status_mut() = StatusCode::ACCEPTED;
    let headers = response.headers_mut();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    if accepted.replayed {
        headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(response)
}

/// An accepted event and its payload.
#[utoipa::path(get, path = "/v1/apps/{app_id}/events/{event_id}", tag = "events",
    params(EventPath),
    responses((status = 200, body = EventOut), (status = 404, body = ErrorBody)))]
pub async fn get_event<S: Store, Q>(api: &Api<S, Q>, call: &Call<'_>) -> Answer {
    let app = call.app()?;
    let id = call.id("event_id", EventId::parse)?;
    let stored = api
        .store
        .get_event(&id)
        .await?
        .filter(|e| e.event.app_id == app)
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

/// Creates an endpoint; the answer carries its signing secret (only here
/// and on rotate-secret).
#[utoipa::path(post, path = "/v1/apps/{app_id}/endpoints", tag = "endpoints",
    params(AppPath), request_body = CreateEndpoint,
    responses((status = 201, body = EndpointOut), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn create_endpoint<S: Store, Q>(
    api: &Api<S, Q>,
    call: &Call<'_>,
    rng: &mut (dyn RngCore + Send),
) -> Answer {
    let app = call.app()?;
    let req: CreateEndpoint = call.json()?;
    check_url(api, &req.url).await?;
    validate_event_types(&req.event_types)?;
    validate_description(req.description.as_ref())?;
    let secret = match req.secret {
        Some(s) => Secret::parse(&s).map_err(PipelineError::from)?,
        None => Secret::generate(rng),
    };
    let endpoint = Endpoint {
        id: EndpointId::new(call.now, rng),
        app_id: app,
        url: req.url,
        description: req.description,
        event_types: req.event_types,
        secret,
        previous_secrets: vec![],
        disabled: false,
        disabled_reason: None,
        created_at: call.now,
        updated_at: call.now,
        version: 0,
    };
    api.store.put_endpoint(&endpoint).await?;
    tracing::info!(endpoint_id = %endpoint.id, app_id = %endpoint.app_id, "endpoint created");
    Ok(json(
        StatusCode::CREATED,
        &EndpointOut::new(&endpoint, true),
    ))
}

/// Every endpoint of the app (secrets never listed).
#[utoipa::path(get, path = "/v1/apps/{app_id}/endpoints", tag = "endpoints",
    params(AppPath), responses((status = 200, body = EndpointList)))]
pub async fn list_endpoints<S: Store, Q>(api: &Api<S, Q>, call: &Call<'_>) -> Answer {
    let app = call.app()?;
    let endpoints = api.store.list_endpoints(&app).await?;
    Ok(json(
        StatusCode::OK,
        &EndpointList {
            items: endpoints
                .iter()
                .map(|e| EndpointOut::new(e, false))
                .collect(),
        },
    ))
}

#[utoipa::path(get, path = "/v1/apps/{app_id}/endpoints/{endpoint_id}", tag = "endpoints",
    params(EndpointPath),
    responses((status = 200, body = EndpointOut), (status = 404, body = ErrorBody)))]
pub async fn get_endpoint<S: Store, Q>(api: &Api<S, Q>, call: &Call<'_>) -> Answer {
    let endpoint = endpoint_of(api, call).await?;
    Ok(json(StatusCode::OK, &EndpointOut::new(&endpoint, false)))
}

/// Changes an endpoint's URL, filters, description or enabled state.
#[utoipa::path(patch, path = "/v1/apps/{app_id}/endpoints/{endpoint_id}", tag = "endpoints",
    params(EndpointPath), request_body = UpdateEndpoint,
    responses((status = 200, body = EndpointOut), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
pub async fn update_endpoint<S: Store, Q>(api: &Api<S, Q>, call: &Call<'_>) -> Answer {
    let req: UpdateEndpoint = call.json()?;
    if let Some(url) = &req.url {
        check_url(api, url).await?;
    }
    if let Some(types) = &req.event_types {
        validate_event_types(types)?;
    }
    validate_description(req.description.as_ref())?;
    let endpoint = change_endpoint(api, call, |endpoint| {
        if let Some(url) = &req.url {
            endpoint.url.clone_from(url);
        }
        if let Some(types) = &req.event_types {
            endpoint.event_types.clone_from(types);
        }
        if let Some(description) = &req.description {
            endpoint.description = Some(description.clone());
        }
        if let Some(disabled) = req.disabled {
            endpoint.disabled = disabled;
            endpoint.disabled_reason = disabled.then(|| "disabled by an operator".to_owned());
        }
    })
    .await?;
    tracing::info!(endpoint_id = %endpoint.id, disabled = endpoint.disabled, "endpoint updated");
    Ok(json(StatusCode::OK, &EndpointOut::new(&endpoint, false)))
}

/// Times a change is re-applied to a freshly read endpoint when a concurrent
/// write (a rotation, a PATCH, an auto-disable) moved its version meanwhile.
const ENDPOINT_WRITE_ROUNDS: usize = 5;

/// Read, change, write conditionally on the version read; on a conflict
/// read again and re-apply `change` (so two concurrent PATCHes of different
/// fields both land, a PATCH never writes back a rotated-away secret, and a
/// deleted endpoint is not resurrected: 404).
async fn change_endpoint<S: Store, Q>(
    api: &Api<S, Q>,
    call: &Call<'_>,
    mut change: impl FnMut(&mut Endpoint),
) -> Result<Endpoint, ApiError> {
    for _ in 0..ENDPOINT_WRITE_ROUNDS {
        let mut endpoint = endpoint_of(api, call).await?;
        let expected = endpoint.version;
        change(&mut endpoint);
        endpoint.version = expected + 1;
        endpoint.updated_at = call.now;
        if api.store.update_endpoint(&endpoint, expected).await? {
            return Ok(endpoint);
        }
        tracing::info!(endpoint_id = %endpoint.id, "endpoint changed meanwhile; applying again");
    }
    Err(ApiError::new(
        StatusCode::CONFLICT,
        "conflict",
        "the endpoint kept changing meanwhile; retry",
    ))
}

/// Deletes an endpoint; its pending deliveries fail ("endpoint deleted").
#[utoipa::path(delete, path = "/v1/apps/{app_id}/endpoints/{endpoint_id}", tag = "endpoints",
    params(EndpointPath),
    responses((status = 204), (status = 404, body = ErrorBody)))]
pub async fn delete_endpoint<S: Store, Q>(api: &Api<S, Q>, call: &Call<'_>) -> Answer {
    let app = call.app()?;
    let id = call.id("endpoint_id", EndpointId::parse)?;
    if !api.store.delete_endpoint(&app, &id).await? {
        return Err(PipelineError::NotFound("endpoint").into());
    }
    tracing::info!(endpoint_id = %id, "endpoint deleted");
    Ok(no_content())
}

/// Starts signing with a new secret; earlier ones keep signing alongside it
/// for the rotation overlap.
#[utoipa::path(post, path = "/v1/apps/{app_id}/endpoints/{endpoint_id}/rotate-secret",
    tag = "endpoints", params(EndpointPath), request_body(content = RotateSecret, description = "optional"),
    responses((status = 200, body = EndpointOut), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
pub async fn rotate_secret<S: Store, Q>(
    api: &Api<S, Q>,
    call: &Call<'_>,
    rng: &mut (dyn RngCore + Send),
) -> Answer {
    let req: RotateSecret = call.json_or_default()?;
    let secret = match req.secret {
        Some(s) => Secret::parse(&s).map_err(PipelineError::from)?,
        None => Secret::generate(rng),
    };
    let overlap = api.settings.rotation_overlap;
    let endpoint = change_endpoint(api, call, |endpoint| {
        endpoint.rotate_secret(secret.clone(), call.now, overlap);
    })
    .await?;
    tracing::info!(endpoint_id = %endpoint.id, "secret rotated");
    Ok(json(StatusCode::OK, &EndpointOut::new(&endpoint, true)))
}

/// Bulk recover: every failed delivery of the endpoint created in
/// `[since, until)` starts again with a fresh attempt budget.
#[utoipa::path(post, path = "/v1/apps/{app_id}/endpoints/{endpoint_id}/recover",
    tag = "deliveries", params(EndpointPath), request_body = RecoverRequest,
    responses((status = 202, body = RecoverReport), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
pub async fn recover<S: Store, Q>(api: &Api<S, Q>, call: &Call<'_>) -> Answer {
    let req: RecoverRequest = call.json()?;
    let endpoint = endpoint_of(api, call).await?;
    let report =
        recover_endpoint(&api.store, &endpoint.app_id, &endpoint.id, &req, call.now).await?;
    Ok(json(StatusCode::ACCEPTED, &report))
}

fn parse_time(field: &str, value: Option<&String>) -> Result<Option<DateTime<Utc>>, ApiError> {
    value
        .map(|v| {
            DateTime::parse_from_rfc3339(v)
                .map(|t| t.with_timezone(&Utc))
                .map_err(|_| bad_request("invalid_query", format!("{field}: not an RFC 3339 time")))
        })
        .transpose()
}

fn delivery_query(filters: &DeliveryFilters) -> Result<DeliveryQuery, ApiError> {
    let query = DeliveryQuery {
        status: filters
            .status
            .as_deref()
            .map(DeliveryStatus::parse)
            .transpose()
            .map_err(PipelineError::from)?,
        endpoint_id: filters
            .endpoint_id
            .as_deref()
            .map(EndpointId::parse)
            .transpose()
            .map_err(PipelineError::from)?,
        event_type: filters.event_type.clone(),
        before: filters
            .cursor
            .as_deref()
            .map(DeliveryId::parse)
            .transpose()
            .map_err(|_| bad_request("invalid_query", "cursor: not a next_cursor value"))?,
        created_after: parse_time("created_after", filters.created_after.as_ref())?,
        created_before: parse_time("created_before", filters.created_before.as_ref())?,
        limit: match &filters.limit {
            Some(l) => l
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=500).contains(n))
                .ok_or_else(|| bad_request("invalid_query", "limit: 1..=500"))?,
            None => 50,
        },
    };
    if let (Some(a), Some(b)) = (query.created_after, query.created_before) {
        if a >= b {
            return Err(bad_request(
                "invalid_query",
                "created_after must be before created_before",
            ));
        }
    }
    Ok(query)
}

/// Deliveries, newest first, through the GSIs (never a scan).
#[utoipa::path(get, path = "/v1/apps/{app_id}/deliveries", tag = "deliveries",
    params(AppPath, DeliveryFilters),
    responses((status = 200, body = DeliveryList), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "no such endpoint")))]
pub async fn list_deliveries<S: Store, Q>(api: &Api<S, Q>, call: &Call<'_>) -> Answer {
    let app = call.app()?;
    let pairs: serde_json::Map<String, serde_json::Value> = call
        .request
        .query_string_parameters()
        .iter()
        .map(|(k, v)| (k.to_owned(), serde_json::Value::String(v.to_owned())))
        .collect();
    let filters: DeliveryFilters = serde_json::from_value(serde_json::Value::Object(pairs))
        .map_err(|e| bad_request("invalid_query", e.to_string()))?;
    let query = delivery_query(&filters)?;
    if let Some(ep) = &query.endpoint_id {
        api.store
            .get_endpoint(&app, ep)
            .await?
            .ok_or(PipelineError::NotFound("endpoint"))?;
    }
    let page = api.store.list_deliveries(&app, &query).await?;
    Ok(json(
        StatusCode::OK,
        &DeliveryList {
            items: page
                .items
                .iter()
                .map(|d| DeliveryOut::new(d, false))
                .collect(),
            next_cursor: page.next_cursor.map(|c| c.to_string()),
        },
    ))
}

async fn delivery_of<S: Store, Q>(
    api: &Api<S, Q>,
    call: &Call<'_>,
) -> Result<hookline_core::model::Delivery, ApiError> {
    let app = call.app()?;
    let id = call.id("delivery_id", DeliveryId::parse)?;
    Ok(api
        .store
        .get_delivery(&id)
        .await?
        .filter(|d| d.app_id == app)
        .ok_or(PipelineError::NotFound("delivery"))?)
}

/// A delivery with its attempt log.
#[utoipa::path(get, path = "/v1/apps/{app_id}/deliveries/{delivery_id}", tag = "deliveries",
    params(DeliveryPath),
    responses((status = 200, body = DeliveryOut), (status = 404, body = ErrorBody)))]
pub async fn get_delivery<S: Store, Q>(api: &Api<S, Q>, call: &Call<'_>) -> Answer {
    let delivery = delivery_of(api, call).await?;
    Ok(json(StatusCode::OK, &DeliveryOut::new(&delivery, true)))
}

/// A failed delivery starts again with a fresh attempt budget.
#[utoipa::path(post, path = "/v1/apps/{app_id}/deliveries/{delivery_id}/retry",
    tag = "deliveries", params(DeliveryPath),
    responses((status = 202, body = DeliveryOut),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "not failed (`not_failed`) or changed meanwhile")))]
pub async fn retry_delivery<S: Store, Q>(api: &Api<S, Q>, call: &Call<'_>) -> Answer {
    let delivery = delivery_of(api, call).await?;
    match retry_failed(&api.store, delivery, call.now).await? {
        RetryOutcome::Retried(d) => Ok(json(StatusCode::ACCEPTED, &DeliveryOut::new(&d, false))),
        RetryOutcome::NotFailed(status) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_failed",
            format!("delivery is {status}, only failed deliveries can be retried"),
        )),
        RetryOutcome::Changed => Err(ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            "the delivery changed meanwhile; reload and retry",
        )),
    }
}

/// Creates an app-scoped API key (admin key only). The key is in this
/// answer only; the table keeps its SHA-256.
#[utoipa::path(post, path = "/v1/apps/{app_id}/api-keys", tag = "api keys",
    params(AppPath), request_body(content = CreateApiKey, description = "optional"),
    responses((status = 201, body = ApiKeyOut), (status = 403, body = ErrorBody)))]
pub async fn create_api_key<S: Store, Q>(
    api: &Api<S, Q>,
    call: &Call<'_>,
    rng: &mut (dyn RngCore + Send),
) -> Answer {
    call.scope()?.require_admin()?;
    let app = call.app()?;
    let req: CreateApiKey = call.json_or_default()?;
    let name = req.name.unwrap_or_default();
    if name.len() > 200 {
        return Err(bad_request("invalid_name", "at most 200 bytes"));
    }
    let (record, key) = ApiKey::generate(app, name, call.now, rng);
    api.store.put_api_key(&record).await?;
    tracing::info!(key_id = %record.id, app_id = %record.app_id, "API key created");
    Ok(json(
        StatusCode::CREATED,
        &ApiKeyOut::new(&record, Some(key)),
    ))
}

/// The app's API keys (never the keys themselves; admin key only).
#[utoipa::path(get, path = "/v1/apps/{app_id}/api-keys", tag = "api keys",
    params(AppPath),
    responses((status = 200, body = ApiKeyList), (status = 403, body = ErrorBody)))]
pub async fn list_api_keys<S: Store, Q>(api: &Api<S, Q>, call: &Call<'_>) -> Answer {
    call.scope()?.require_admin()?;
    let app = call.app()?;
    let keys = api.store.list_api_keys(&app).await?;
    Ok(json(
        StatusCode::OK,
        &ApiKeyList {
            items: keys.iter().map(|k| ApiKeyOut::new(k, None)).collect(),
        },
    ))
}

/// Revokes an API key at once (admin key only).
#[utoipa::path(delete, path = "/v1/apps/{app_id}/api-keys/{key_id}", tag = "api keys",
    params(ApiKeyPath),
    responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn delete_api_key<S: Store, Q>(api: &Api<S, Q>, call: &Call<'_>) -> Answer {
    call.scope()?.require_admin()?;
    let app = call.app()?;
    let id = call.id("key_id", ApiKeyId::parse)?;
    if !api.store.delete_api_key(&app, &id).await? {
        return Err(PipelineError::NotFound("API key").into());
    }
    tracing::info!(key_id = %id, app_id = %app, "API key revoked");
    Ok(no_content())
}

/// How many messages wait in the dead-letter queue (admin key only).
#[utoipa::path(get, path = "/v1/dlq", tag = "dlq",
    responses((status = 200, body = DlqStatus), (status = 403, body = ErrorBody)))]
pub async fn dlq_status<S, Q: Queue>(api: &Api<S, Q>, call: &Call<'_>) -> Answer {
    call.scope()?.require_admin()?;
    let depth = api.queue.dlq_depth().await?;
    Ok(json(StatusCode::OK, &DlqStatus { depth }))
}

/// A redrive through the API answers within API Gateway's 30 s limit; it
/// reports `complete: false` when there is more to do (call again, or run
/// the retry function, which has minutes).
const REDRIVE_BUDGET: std::time::Duration = std::time::Duration::from_secs(20);

/// Drains the DLQ: failed deliveries start again (the retry function's
/// logic; admin key only).
#[utoipa::path(post, path = "/v1/dlq/redrive", tag = "dlq",
    request_body(content = RedriveRequest, description = "optional"),
    responses((status = 200, body = RedriveReport), (status = 400, body = ErrorBody),
        (status = 403, body = ErrorBody)))]
pub async fn dlq_redrive<S: Store, Q: Queue>(api: &Api<S, Q>, call: &Call<'_>) -> Answer {
    call.scope()?.require_admin()?;
    let req: RedriveRequest = call.json_or_default()?;
    let report = redrive(&api.store, &api.queue, &req, call.now, REDRIVE_BUDGET).await?;
    Ok(json(StatusCode::OK, &report))
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "meta", security(),
    responses((status = 200, description = "the OpenAPI 3.1 document", content_type = "application/json")))]
pub fn openapi() -> Answer {
    let mut response = Response::new(Body::Text(crate::openapi::document().to_owned()));
    response
        .headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    Ok(response)
}

/// The delivery dashboard (a static page; it asks for an API key).
#[utoipa::path(get, path = "/dashboard", tag = "meta", security(),
    responses((status = 200, description = "HTML", content_type = "text/html")))]
pub fn dashboard() -> Answer {
    Ok(crate::dashboard::page())
}
