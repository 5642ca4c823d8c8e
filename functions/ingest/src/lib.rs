//! The HTTP API function (API Gateway HTTP API, payload v2): event ingestion
//! and the operator API in one Lambda, so one warm pool serves both and one
//! IAM policy covers the table and queues; management traffic is small next
//! to ingestion, and both share the same validation, auth and error shape.
//!
//! - [`handle`]: matches a request against [`routes::ROUTES`], authenticates
//!   it, and calls the route's handler; every error is
//!   `{"error": {"code", "message"}}` with a 4xx for bad input.
//! - [`routes`]: the route table (method, path template, operation).
//! - [`handlers`]: one function per route, documented with `#[utoipa::path]`.
//! - [`views`]: request and response shapes, with their OpenAPI schemas.
//! - [`openapi`]: the generated OpenAPI 3.1 document (`GET /openapi.json`).
//! - [`dashboard`]: the embedded delivery dashboard (`GET /dashboard`).
//! - [`auth`]: the admin key and app-scoped keys (stored hashed, compared in
//!   constant time) and what each may touch.
//! - [`apigw`]: API Gateway event helpers for the local stack and tests.

pub mod apigw;
pub mod auth;
pub mod dashboard;
pub mod handlers;
pub mod openapi;
pub mod routes;
pub mod views;

use chrono::{DateTime, Utc};
use hookline_pipeline::ports::{Queue, Store};
use hookline_pipeline::{PipelineError, Settings};
use lambda_http::http::StatusCode;
use lambda_http::{Body, Request, Response};
use rand::RngCore;

pub use auth::ApiKeys;
use handlers::Call;
use routes::{match_route, Miss, Op};
use views::{ErrorBody, ErrorDetail};

/// Everything the API needs, built once per process.
#[derive(Debug)]
pub struct Api<S, Q> {
    pub store: S,
    pub queue: Q,
    pub settings: Settings,
    pub keys: ApiKeys,
    /// How endpoint host names are looked up at registration (SSRF check).
    pub lookup: hookline_pipeline::sender::Lookup,
}

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
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

fn error_response(err: ApiError) -> Response<Body> {
    handlers::json(
        err.status,
        &ErrorBody {
            error: ErrorDetail {
                code: err.code.to_owned(),
                message: err.message,
            },
        },
    )
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
    let path = request.uri().path();
    let (route, params) = match_route(request.method(), path).map_err(|miss| match miss {
        Miss::NotFound => ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route"),
        Miss::MethodNotAllowed => ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "method not allowed on this route",
        ),
    })?;
    let scope = if route.authenticated {
        let header = request
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        Some(api.keys.authenticate(header, &api.store).await?)
    } else {
        None
    };
    let call = Call {
        request,
        params,
        scope,
        now,
    };
    match route.op {
        Op::Health => handlers::health(),
        Op::OpenApi => handlers::openapi(),
        Op::Dashboard => handlers::dashboard(),
        Op::CreateEvent => handlers::create_event(api, &call, rng).await,
        Op::GetEvent => handlers::get_event(api, &call).await,
        Op::CreateEndpoint => handlers::create_endpoint(api, &call, rng).await,
        Op::ListEndpoints => handlers::list_endpoints(api, &call).await,
        Op::GetEndpoint => handlers::get_endpoint(api, &call).await,
        Op::UpdateEndpoint => handlers::update_endpoint(api, &call).await,
        Op::DeleteEndpoint => handlers::delete_endpoint(api, &call).await,
        Op::RotateSecret => handlers::rotate_secret(api, &call, rng).await,
        Op::RecoverEndpoint => handlers::recover(api, &call).await,
        Op::ListDeliveries => handlers::list_deliveries(api, &call).await,
        Op::GetDelivery => handlers::get_delivery(api, &call).await,
        Op::RetryDelivery => handlers::retry_delivery(api, &call).await,
        Op::CreateApiKey => handlers::create_api_key(api, &call, rng).await,
        Op::ListApiKeys => handlers::list_api_keys(api, &call).await,
        Op::DeleteApiKey => handlers::delete_api_key(api, &call).await,
        Op::DlqStatus => handlers::dlq_status(api, &call).await,
        Op::DlqRedrive => handlers::dlq_redrive(api, &call).await,
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
            lookup: Default::default(),
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
        let (status, doc) = call(&api, include_str!("../../../events/api-openapi.json")).await;
        assert_eq!((status, doc["openapi"].as_str()), (200, Some("3.1.0")));
        let (status, key) = call(
            &api,
            include_str!("../../../events/api-create-api-key.json"),
        )
        .await;
        assert_eq!(status, 201, "{key}");
        assert!(key["key"].as_str().unwrap().starts_with("key_"));
        let (status, dlq) = call(&api, include_str!("../../../events/api-dlq-status.json")).await;
        assert_eq!((status, dlq["depth"].as_u64()), (200, Some(0)));
        let (status, recover) = call(
            &api,
            include_str!("../../../events/api-recover-endpoint.json"),
        )
        .await;
        assert_eq!(
            (status, recover["error"]["code"].as_str()),
            (404, Some("not_found"))
        );
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

    #[tokio::test]
    async fn openapi_document_lists_exactly_the_served_routes() {
        let doc: serde_json::Value = serde_json::from_str(openapi::document()).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        let mut documented = Vec::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for method in item.as_object().unwrap().keys() {
                if ["get", "post", "patch", "delete", "put"].contains(&method.as_str()) {
                    documented.push((method.to_uppercase(), path.clone()));
                }
            }
        }
        let mut served: Vec<(String, String)> = routes::ROUTES
            .iter()
            .map(|r| (r.method.to_string(), r.path.to_owned()))
            .collect();
        documented.sort();
        served.sort();
        assert_eq!(documented, served);
        // Every documented operation is served: the router never answers
        // "no such route" or 405 for it, and public ones need no key.
        let api = api();
        for (method, path) in &documented {
            let concrete = path
                .replace("{app_id}", "acme")
                .replace("{endpoint_id}", "ep_00000000000000000000000000")
                .replace("{delivery_id}", "dlv_00000000000000000000000000")
                .replace("{event_id}", "evt_00000000000000000000000000")
                .replace("{key_id}", "key_00000000000000000000000000");
            let request = apigw::http_request(
                method,
                &concrete,
                &[("authorization".into(), "Bearer local-admin-key".into())],
                None,
            )
            .unwrap();
            let response = handle(
                &api,
                request,
                Utc::now(),
                &mut rand::rngs::StdRng::seed_from_u64(1),
            )
            .await;
            let body = String::from_utf8_lossy(response.body().as_ref()).into_owned();
            assert!(
                !body.contains("no such route") && response.status() != 405,
                "{method} {path}: {} {body}",
                response.status()
            );
            let public = routes::ROUTES
                .iter()
                .any(|r| r.path == path && !r.authenticated);
            let operation = &doc["paths"][path][method.to_lowercase()];
            assert_eq!(
                operation["security"]
                    .as_array()
                    .is_some_and(|s| s.is_empty()),
                public,
                "{method} {path}: documented security matches the route"
            );
        }
        assert_eq!(
            doc["components"]["securitySchemes"]["bearer"]["scheme"],
            "bearer"
        );
    }

    #[tokio::test]
    async fn dashboard_is_served_without_a_key_and_locked_to_its_origin() {
        let api = api();
        let request = apigw::http_request("GET", "/dashboard", &[], None).unwrap();
        let response = handle(
            &api,
            request,
            Utc::now(),
            &mut rand::rngs::StdRng::seed_from_u64(1),
        )
        .await;
        assert_eq!(response.status(), 200);
        assert!(response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html"));
        assert!(response.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("connect-src 'self'"));
    }
}
