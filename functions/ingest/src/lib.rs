//! The ingest function: the HTTP API behind API Gateway (payload v2).
//!
//! - [`handle`]: routes a `lambda_http::Request` to the use cases; every error
//!   is `{"error": {"code", "message"}}` with a 4xx for bad input.
//! - [`auth`]: bearer API keys (constant-time comparison of SHA-256 hashes).
//!
//! Routes: `GET /health`; `POST /v1/apps/{app_id}/events`,
//! `GET /v1/apps/{app_id}/events/{id}`; `POST|GET /v1/apps/{app_id}/endpoints`,
//! `GET|PATCH|DELETE /v1/apps/{app_id}/endpoints/{id}`,
//! `POST .../endpoints/{id}/rotate-secret`; `GET /v1/apps/{app_id}/deliveries`
//! (filters, cursor), `GET .../deliveries/{id}`, `POST .../deliveries/{id}/retry`;
//! `POST /v1/dlq/redrive`.

pub mod apigw;
pub mod auth;

use chrono::{DateTime, Utc};
use hookline_core::ids::{AppId, DeliveryId, EndpointId, EventId};
use hookline_core::model::{Delivery, DeliveryStatus, Endpoint};
use hookline_core::signing::Secret;
use hookline_pipeline::ingest::ingest;
use hookline_pipeline::ports::{DeliveryQuery, Queue, Store};
use hookline_pipeline::redrive::{redrive, RedriveRequest};
use hookline_pipeline::sender::check_endpoint_url;
use hookline_pipeline::{PipelineError, Settings};
use lambda_http::http::{Method, StatusCode};
use lambda_http::{Body, Request, RequestExt, Response};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use serde_json::json;

pub use auth::ApiKeys;

/// Everything the API needs, built once per process.
#[derive(Debug)]
pub struct Api<S, Q> {
    pub store: S,
    pub queue: Q,
    pub settings: Settings,
    pub keys: ApiKeys,
}

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }
}

/// The HTTP status of each pipeline error: the only place this mapping lives.
impl From<PipelineError> for ApiError {
    fn from(err: PipelineError) -> Self {
        match err {
            PipelineError::Invalid {
                code: "payload_too_large",
                message,
            } => Self::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", message),
            PipelineError::Invalid { code, message } => {
                Self::new(StatusCode::BAD_REQUEST, code, message)
            }
            PipelineError::NotFound(what) => Self::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("{what} not found"),
            ),
            PipelineError::Conflict(message) => {
                Self::new(StatusCode::CONFLICT, "conflict", message)
            }
            err if err.is_retryable() => {
                tracing::error!(error = %err, "retryable backend error");
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "temporarily unavailable, retry",
                )
            }
            err => {
                tracing::error!(error = %err, "backend error");
                Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error",
                )
            }
        }
    }
}

fn json_response(status: StatusCode, body: String) -> Response<Body> {
    let mut response = Response::new(Body::Text(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        "content-type",
        lambda_http::http::HeaderValue::from_static("application/json"),
    );
    response
}

fn error_response(err: ApiError) -> Response<Body> {
    json_response(
        err.status,
        json!({"error": {"code": err.code, "message": err.message}}).to_string(),
    )
}

fn parse_json<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_body", e.to_string()))
}

/// An endpoint as the API shows it: the secret only on create (and rotate).
#[derive(Debug, Serialize)]
pub struct EndpointView<'a> {
    pub id: &'a EndpointId,
    pub url: &'a str,
    pub description: Option<&'a str>,
    pub event_types: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<&'a str>,
    pub disabled: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disabled_reason: Option<&'a str>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl<'a> EndpointView<'a> {
    pub fn new(ep: &'a Endpoint, with_secret: bool) -> Self {
        Self {
            id: &ep.id,
            url: &ep.url,
            description: ep.description.as_deref(),
            event_types: &ep.event_types,
            secret: with_secret.then(|| ep.secret.expose()),
            disabled: ep.disabled,
            disabled_reason: ep.disabled_reason.as_deref(),
            created_at: ep.created_at,
            updated_at: ep.updated_at,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdateEndpoint {
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    event_types: Option<Vec<String>>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    disabled: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RotateSecret {
    #[serde(default)]
    secret: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateEndpoint {
    url: String,
    #[serde(default)]
    event_types: Vec<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    secret: Option<String>,
}

/// A delivery as the API shows it.
pub fn delivery_view(d: &Delivery, with_attempts: bool) -> serde_json::Value {
    let mut v = json!({
        "id": d.id,
        "event_id": d.event_id,
        "endpoint_id": d.endpoint_id,
        "event_type": d.event_type,
        "status": d.status,
        "attempt_count": d.attempt_count,
        "total_attempts": d.total_attempts,
        "manual_retries": d.manual_retries,
        "next_attempt_at": d.next_attempt_at,
        "created_at": d.created_at,
        "updated_at": d.updated_at,
        "message_id": d.message_id(),
    });
    if with_attempts {
        v["attempts"] = json!(d.attempts);
    }
    v
}

fn validate_event_types(types: &[String]) -> Result<(), ApiError> {
    if types.len() > 100 {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_event_types",
            "at most 100 event types",
        ));
    }
    for t in types {
        let name = t.strip_suffix(".*").unwrap_or(t);
        if t != "*" && hookline_core::model::EventType::parse(name).is_err() {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_event_types",
                format!("`{t}` is not an event type or `prefix.*`"),
            ));
        }
    }
    Ok(())
}

/// Routes one request. Never fails: every error becomes a JSON error response.
pub async fn handle<S: Store, Q: Queue>(
    api: &Api<S, Q>,
    request: Request,
    now: DateTime<Utc>,
    rng: &mut (dyn RngCore + Send),
) -> Response<Body> {
    match route(api, &request, now, rng).await {
        Ok(response) => response,
        Err(err) => error_response(err),
    }
}

async fn route<S: Store, Q: Queue>(
    api: &Api<S, Q>,
    request: &Request,
    now: DateTime<Utc>,
    rng: &mut (dyn RngCore + Send),
) -> Result<Response<Body>, ApiError> {
    let path = request.uri().path().trim_end_matches('/').to_owned();
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let method = request.method().clone();
    if segments == ["health"] && method == Method::GET {
        return Ok(json_response(
            StatusCode::OK,
            json!({"status": "ok"}).to_string(),
        ));
    }
    let scope = api.keys.authenticate(
        request
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok()),
    )?;
    let body: &[u8] = request.body().as_ref();
    match (method, segments.as_slice()) {
        (Method::POST, ["v1", "apps", app, "events"]) => {
            scope.allows(app)?;
            let key = match request.headers().get("idempotency-key") {
                Some(v) => Some(v.to_str().map_err(|_| {
                    ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "invalid_idempotency_key",
                        "Idempotency-Key must be visible ASCII",
                    )
                })?),
                None => None,
            };
            let accepted = ingest(&api.store, &api.settings, app, key, body, now, rng).await?;
            let mut response = json_response(StatusCode::ACCEPTED, accepted.body);
            if accepted.replayed {
                response.headers_mut().insert(
                    "idempotent-replayed",
                    lambda_http::http::HeaderValue::from_static("true"),
                );
            }
            Ok(response)
        }
        (Method::POST, ["v1", "apps", app, "endpoints"]) => {
            scope.allows(app)?;
            let app = AppId::parse(app).map_err(PipelineError::from)?;
            let req: CreateEndpoint = parse_json(body)?;
            check_endpoint_url(&req.url, api.settings.allow_private_endpoints)
                .map_err(|reason| ApiError::new(StatusCode::BAD_REQUEST, "invalid_url", reason))?;
            validate_event_types(&req.event_types)?;
            if req.description.as_ref().is_some_and(|d| d.len() > 1024) {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_description",
                    "at most 1024 bytes",
                ));
            }
            let secret = match req.secret {
                Some(s) => Secret::parse(&s).map_err(PipelineError::from)?,
                None => Secret::generate(rng),
            };
            let endpoint = Endpoint {
                id: EndpointId::new(now, rng),
                app_id: app,
                url: req.url,
                description: req.description,
                event_types: req.event_types,
                secret,
                previous_secrets: vec![],
                disabled: false,
                disabled_reason: None,
                created_at: now,
                updated_at: now,
            };
            api.store.put_endpoint(&endpoint).await?;
            tracing::info!(endpoint_id = %endpoint.id, app_id = %endpoint.app_id, "endpoint created");
            Ok(json_response(
                StatusCode::CREATED,
                json!(EndpointView::new(&endpoint, true)).to_string(),
            ))
        }
        (Method::GET, ["v1", "apps", app, "endpoints"]) => {
            scope.allows(app)?;
            let app = AppId::parse(app).map_err(PipelineError::from)?;
            let endpoints = api.store.list_endpoints(&app).await?;
            let items: Vec<EndpointView> = endpoints
                .iter()
                .map(|e| EndpointView::new(e, false))
                .collect();
            Ok(json_response(
                StatusCode::OK,
                json!({"items": items}).to_string(),
            ))
        }
        (Method::GET, ["v1", "apps", app, "endpoints", id]) => {
            scope.allows(app)?;
            let app = AppId::parse(app).map_err(PipelineError::from)?;
            let id = EndpointId::parse(id).map_err(PipelineError::from)?;
            let endpoint = api
                .store
                .get_endpoint(&app, &id)
                .await?
                .ok_or(PipelineError::NotFound("endpoint"))?;
            Ok(json_response(
                StatusCode::OK,
                json!(EndpointView::new(&endpoint, false)).to_string(),
            ))
        }
        (Method::GET, ["v1", "apps", app, "deliveries"]) => {
            scope.allows(app)?;
            let app = AppId::parse(app).map_err(PipelineError::from)?;
            let params = request.query_string_parameters();
            let bad = |field: &str, why: &str| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_query",
                    format!("{field}: {why}"),
                )
            };
            let query = DeliveryQuery {
                status: params
                    .first("status")
                    .map(DeliveryStatus::parse)
                    .transpose()
                    .map_err(PipelineError::from)?,
                endpoint_id: params
                    .first("endpoint_id")
                    .map(EndpointId::parse)
                    .transpose()
                    .map_err(PipelineError::from)?,
                event_type: params.first("event_type").map(str::to_owned),
                before: params
                    .first("cursor")
                    .map(DeliveryId::parse)
                    .transpose()
                    .map_err(|_| bad("cursor", "not a cursor from next_cursor"))?,
                limit: match params.first("limit") {
                    Some(l) => l
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=500).contains(n))
                        .ok_or_else(|| bad("limit", "1..=500"))?,
                    None => 50,
                },
            };
            if let Some(ep) = &query.endpoint_id {
                api.store
                    .get_endpoint(&app, ep)
                    .await?
                    .ok_or(PipelineError::NotFound("endpoint"))?;
            }
            let page = api.store.list_deliveries(&app, &query).await?;
            let items: Vec<serde_json::Value> =
                page.items.iter().map(|d| delivery_view(d, false)).collect();
            Ok(json_response(
                StatusCode::OK,
                json!({"items": items, "next_cursor": page.next_cursor}).to_string(),
            ))
        }
        (Method::POST, ["v1", "apps", app, "deliveries", id, "retry"]) => {
            scope.allows(app)?;
            let id = DeliveryId::parse(id).map_err(PipelineError::from)?;
            let mut delivery = api
                .store
                .get_delivery(&id)
                .await?
                .filter(|d| d.app_id.as_str() == *app)
                .ok_or(PipelineError::NotFound("delivery"))?;
            let expected = delivery.attempt_count;
            if delivery.manual_retry(now).is_err() {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "not_failed",
                    format!(
                        "delivery is {}, only failed deliveries can be retried",
                        delivery.status
                    ),
                ));
            }
            if !api
                .store
                .update_delivery(&delivery, DeliveryStatus::Failed, expected)
                .await?
            {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "conflict",
                    "the delivery changed meanwhile; reload and retry",
                ));
            }
            tracing::info!(delivery_id = %delivery.id, manual_retries = delivery.manual_retries, "manual retry");
            Ok(json_response(
                StatusCode::ACCEPTED,
                delivery_view(&delivery, false).to_string(),
            ))
        }
        (Method::GET, ["v1", "apps", app, "events", id]) => {
            scope.allows(app)?;
            let id = EventId::parse(id).map_err(PipelineError::from)?;
            let stored = api
                .store
                .get_event(&id)
                .await?
                .filter(|e| e.event.app_id.as_str() == *app)
                .ok_or(PipelineError::NotFound("event"))?;
            let body: serde_json::Value =
                serde_json::from_str(&stored.event.body).unwrap_or(serde_json::Value::Null);
            Ok(json_response(
                StatusCode::OK,
                json!({
                    "id": stored.event.id,
                    "event_type": stored.event.event_type,
                    "created_at": stored.event.created_at,
                    "payload": body["data"],
                    "fanout_pending": stored.fanout_remaining.len(),
                })
                .to_string(),
            ))
        }
        (Method::PATCH, ["v1", "apps", app, "endpoints", id]) => {
            scope.allows(app)?;
            let app = AppId::parse(app).map_err(PipelineError::from)?;
            let id = EndpointId::parse(id).map_err(PipelineError::from)?;
            let req: UpdateEndpoint = parse_json(body)?;
            let mut endpoint = api
                .store
                .get_endpoint(&app, &id)
                .await?
                .ok_or(PipelineError::NotFound("endpoint"))?;
            if let Some(url) = req.url {
                check_endpoint_url(&url, api.settings.allow_private_endpoints).map_err(
                    |reason| ApiError::new(StatusCode::BAD_REQUEST, "invalid_url", reason),
                )?;
                endpoint.url = url;
            }
            if let Some(types) = req.event_types {
                validate_event_types(&types)?;
                endpoint.event_types = types;
            }
            if let Some(description) = req.description {
                if description.len() > 1024 {
                    return Err(ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "invalid_description",
                        "at most 1024 bytes",
                    ));
                }
                endpoint.description = Some(description);
            }
            if let Some(disabled) = req.disabled {
                endpoint.disabled = disabled;
                endpoint.disabled_reason = disabled.then(|| "disabled by an operator".to_owned());
            }
            endpoint.updated_at = now;
            api.store.put_endpoint(&endpoint).await?;
            Ok(json_response(
                StatusCode::OK,
                json!(EndpointView::new(&endpoint, false)).to_string(),
            ))
        }
        (Method::DELETE, ["v1", "apps", app, "endpoints", id]) => {
            scope.allows(app)?;
            let app = AppId::parse(app).map_err(PipelineError::from)?;
            let id = EndpointId::parse(id).map_err(PipelineError::from)?;
            if !api.store.delete_endpoint(&app, &id).await? {
                return Err(PipelineError::NotFound("endpoint").into());
            }
            let mut response = Response::new(Body::Empty);
            *response.status_mut() = StatusCode::NO_CONTENT;
            Ok(response)
        }
        (Method::POST, ["v1", "apps", app, "endpoints", id, "rotate-secret"]) => {
            scope.allows(app)?;
            let app = AppId::parse(app).map_err(PipelineError::from)?;
            let id = EndpointId::parse(id).map_err(PipelineError::from)?;
            let req: RotateSecret = if body.is_empty() {
                RotateSecret::default()
            } else {
                parse_json(body)?
            };
            let mut endpoint = api
                .store
                .get_endpoint(&app, &id)
                .await?
                .ok_or(PipelineError::NotFound("endpoint"))?;
            let secret = match req.secret {
                Some(s) => Secret::parse(&s).map_err(PipelineError::from)?,
                None => Secret::generate(rng),
            };
            endpoint.rotate_secret(secret, now, api.settings.rotation_overlap);
            api.store.put_endpoint(&endpoint).await?;
            tracing::info!(endpoint_id = %endpoint.id, "secret rotated");
            Ok(json_response(
                StatusCode::OK,
                json!(EndpointView::new(&endpoint, true)).to_string(),
            ))
        }
        (Method::GET, ["v1", "apps", app, "deliveries", id]) => {
            scope.allows(app)?;
            let id = DeliveryId::parse(id).map_err(PipelineError::from)?;
            let delivery = api
                .store
                .get_delivery(&id)
                .await?
                .filter(|d| d.app_id.as_str() == *app)
                .ok_or(PipelineError::NotFound("delivery"))?;
            Ok(json_response(
                StatusCode::OK,
                delivery_view(&delivery, true).to_string(),
            ))
        }
        (Method::POST, ["v1", "dlq", "redrive"]) => {
            scope.require_admin()?;
            let req: RedriveRequest = if body.is_empty() {
                RedriveRequest::default()
            } else {
                parse_json(body)?
            };
            let report = redrive(&api.store, &api.queue, &req, now).await?;
            Ok(json_response(StatusCode::OK, json!(report).to_string()))
        }
        (_, ["health"])
        | (_, ["v1", "apps", _, "events"])
        | (_, ["v1", "apps", _, "endpoints"])
        | (_, ["v1", "dlq", "redrive"]) => Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "method not allowed on this route",
        )),
        _ => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such route",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hookline_pipeline::fakes::{MemoryQueue, MemoryStore};
    use rand::SeedableRng;

    fn api() -> Api<MemoryStore, MemoryQueue> {
        Api {
            store: MemoryStore::default(),
            queue: MemoryQueue::default(),
            settings: Settings::from_lookup(|k| {
                (k == "WEBHOOKS_ALLOW_PRIVATE_ENDPOINTS").then(|| "true".to_owned())
            })
            .unwrap(),
            keys: ApiKeys::admin("local-admin-key"),
        }
    }

    async fn call(api: &Api<MemoryStore, MemoryQueue>, fixture: &str) -> (u16, serde_json::Value) {
        let request =
            lambda_http::request::from_str(fixture).expect("fixture is an API Gateway v2 event");
        let response = handle(
            api,
            request,
            Utc::now(),
            &mut rand::rngs::StdRng::seed_from_u64(1),
        )
        .await;
        let body: &[u8] = response.body().as_ref();
        (
            response.status().as_u16(),
            serde_json::from_slice(body).unwrap_or(serde_json::Value::Null),
        )
    }

    #[tokio::test]
    async fn fixtures_drive_the_api() {
        let api = api();
        assert_eq!(
            call(&api, include_str!("../../../events/api-health.json"))
                .await
                .0,
            200
        );
        let (status, endpoint) = call(
            &api,
            include_str!("../../../events/api-create-endpoint.json"),
        )
        .await;
        assert_eq!(status, 201, "{endpoint}");
        assert!(endpoint["secret"].as_str().unwrap().starts_with("whsec_"));
        let (status, list) = call(
            &api,
            include_str!("../../../events/api-list-endpoints.json"),
        )
        .await;
        assert_eq!(status, 200);
        assert!(
            list["items"][0].get("secret").is_none(),
            "secrets never in lists: {list}"
        );
        let (status, accepted) =
            call(&api, include_str!("../../../events/api-post-event.json")).await;
        assert_eq!(status, 202, "{accepted}");
        assert_eq!(accepted["delivery_ids"].as_array().unwrap().len(), 1);
        let (status, again) = call(&api, include_str!("../../../events/api-post-event.json")).await;
        assert_eq!(
            (status, &again),
            (202, &accepted),
            "same Idempotency-Key, same answer"
        );
        assert_eq!(api.store.deliveries().len(), 1);
        let (status, report) = call(&api, include_str!("../../../events/api-redrive.json")).await;
        assert_eq!(status, 200, "{report}");
        assert_eq!(report["dry_run"], true);
        let (status, missing) =
            call(&api, include_str!("../../../events/api-get-delivery.json")).await;
        assert_eq!(
            (status, missing["error"]["code"].as_str()),
            (404, Some("not_found"))
        );
    }

    #[tokio::test]
    async fn wrong_key_is_401_and_errors_never_echo_secrets() {
        let api = api();
        let fixture = include_str!("../../../events/api-post-event.json")
            .replace("local-admin-key", "wrong-key");
        let (status, body) = call(&api, &fixture).await;
        assert_eq!(status, 401);
        assert!(!body.to_string().contains("wrong-key"));
        let mut v: serde_json::Value =
            serde_json::from_str(include_str!("../../../events/api-create-endpoint.json")).unwrap();
        v["body"] =
            serde_json::json!(r#"{"url":"http://127.0.0.1:1/","secret":"whsec_notbase64!!"}"#);
        let (status, body) = call(&api, &v.to_string()).await;
        assert_eq!(status, 400);
        assert!(!body.to_string().contains("notbase64"), "{body}");
    }
}
