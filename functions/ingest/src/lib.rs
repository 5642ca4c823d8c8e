//! The HTTP API function (API Gateway HTTP API, payload v2): event ingestion
//! and the operator API in one Lambda, so one warm pool serves both and one
//! IAM policy covers the table and queues; management traffic is small next
//! to ingestion, and both share the same validation, auth and error shape.
//!
//! - [`handle`]: one request in, one response out (never an `Err`).
//! - [`router`]: every route declared once (handler + access; path and method
//!   from its `#[utoipa::path]`): matching, authorisation, dispatch, and the
//!   OpenAPI 3.1 document (`GET /openapi.json`) generated from the same list.
//! - [`handlers`]: one module per resource (`events`, `endpoints`,
//!   `deliveries`, `event_types`, `api_keys`, `portal_sessions`, `dlq`, `meta`).
//! - [`catalog`]: event-type definitions checked (schema compiles, example
//!   matches) and payloads validated against their type's schema at ingest
//!   (JSON Schema via `boon`, only in this function).
//! - [`call`]: what a handler gets — typed path, query and body extraction.
//! - [`respond`]: building answers (JSON, 204).
//! - [`views`]: request and response shapes, with their OpenAPI schemas.
//! - [`error`]: [`ApiError`], the only place pipeline errors become statuses.
//! - [`auth`]: the admin key and app-scoped keys (stored hashed, compared in
//!   constant time) and what each may touch.
//! - [`pages`]: the embedded pages: the delivery dashboard (`GET /dashboard`)
//!   and the consumer portal (`GET /portal`).
//! - [`apigw`]: API Gateway event helpers for the local stack and tests.

pub mod apigw;
pub mod auth;
pub mod call;
pub mod catalog;
pub mod error;
pub mod handlers;
pub mod pages;
pub mod respond;
pub mod router;
pub mod views;

use chrono::{DateTime, Utc};
use hookline_pipeline::ports::{Queue, Store};
use hookline_pipeline::Settings;
use lambda_http::{Body, Request, Response};
use rand::RngCore;
use tracing::Instrument;

pub use auth::ApiKeys;
pub use error::ApiError;

/// Everything the API needs, built once per process.
#[derive(Debug)]
pub struct Api<S, Q> {
    pub store: S,
    pub queue: Q,
    pub settings: Settings,
    pub keys: ApiKeys,
    /// How endpoint host names are looked up at registration (SSRF check).
    pub lookup: hookline_pipeline::sender::Lookup,
    /// The event types' schemas ingest checks payloads against.
    pub catalog: crate::catalog::CatalogCache,
}

impl<S, Q> Api<S, Q> {
    /// The API over `store` and `queue`, with the system's host lookup and
    /// a catalog cache of `settings.catalog_cache_ttl`.
    pub fn new(store: S, queue: Q, settings: Settings, keys: ApiKeys) -> Self {
        let catalog = crate::catalog::CatalogCache::new(settings.catalog_cache_ttl);
        Self {
            store,
            queue,
            settings,
            keys,
            lookup: Default::default(),
            catalog,
        }
    }
}

/// Routes one request. Never fails: every error becomes a JSON error response.
pub async fn handle<S: Store, Q: Queue>(
    api: &Api<S, Q>,
    request: Request,
    now: DateTime<Utc>,
    rng: &mut (dyn RngCore + Send),
) -> Response<Body> {
    // Lambda's runtime span already carries the request id.
    let span = tracing::info_span!(
        "request",
        method = %request.method(),
        path = %request.uri().path(),
    );
    router::route(api, &request, now, rng)
        .instrument(span)
        .await
        .unwrap_or_else(ApiError::into_response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hookline_pipeline::fakes::{MemoryQueue, MemoryStore};
    use rand::SeedableRng;

    fn api() -> Api<MemoryStore, MemoryQueue> {
        Api::new(
            MemoryStore::default(),
            MemoryQueue::default(),
            Settings::for_tests(&[("WEBHOOKS_ALLOW_PRIVATE_ENDPOINTS", "true")]).unwrap(),
            ApiKeys::admin("local-admin-key"),
        )
    }

    /// Calls the API with `events/<name>.json` (the `sam local invoke` fixtures).
    macro_rules! fixture {
        ($api:expr, $name:literal) => {
            call(
                &$api,
                include_str!(concat!("../../../events/", $name, ".json")),
            )
        };
    }

    async fn answer(api: &Api<MemoryStore, MemoryQueue>, request: Request) -> Response<Body> {
        // Fresh ids per request, as in Lambda (a fixed seed would repeat them).
        handle(
            api,
            request,
            Utc::now(),
            &mut rand::rngs::StdRng::from_entropy(),
        )
        .await
    }

    async fn call(api: &Api<MemoryStore, MemoryQueue>, fixture: &str) -> (u16, serde_json::Value) {
        let request =
            lambda_http::request::from_str(fixture).expect("fixture is an API Gateway v2 event");
        let response = answer(api, request).await;
        let body: &[u8] = response.body().as_ref();
        (
            response.status().as_u16(),
            serde_json::from_slice(body).unwrap_or(serde_json::Value::Null),
        )
    }

    #[tokio::test]
    async fn fixtures_drive_the_api() {
        let api = api();
        assert_eq!(fixture!(api, "api-health").await.0, 200);
        let (status, etype) = fixture!(api, "api-put-event-type").await;
        assert_eq!(status, 201, "{etype}");
        assert_eq!(etype["schema"]["required"][0], "order_id");
        let (status, endpoint) = fixture!(api, "api-create-endpoint").await;
        assert_eq!(status, 201, "{endpoint}");
        assert!(endpoint["secret"].as_str().unwrap().starts_with("whsec_"));
        let (status, list) = fixture!(api, "api-list-endpoints").await;
        assert_eq!(status, 200);
        assert!(
            list["items"][0].get("secret").is_none(),
            "secrets never in lists: {list}"
        );
        let (status, accepted) = fixture!(api, "api-post-event").await;
        assert_eq!(status, 202, "{accepted}");
        assert_eq!(accepted["delivery_ids"].as_array().unwrap().len(), 1);
        let (status, again) = fixture!(api, "api-post-event").await;
        assert_eq!(
            (status, &again),
            (202, &accepted),
            "same Idempotency-Key, same answer"
        );
        assert_eq!(api.store.deliveries().len(), 1);
        // A batch: each event on its own, results in order.
        let (status, batch) = fixture!(api, "api-post-event-batch").await;
        assert_eq!(status, 200, "{batch}");
        let batch: views::BatchResponse = serde_json::from_value(batch).unwrap();
        let statuses: Vec<u16> = batch.items.iter().map(|i| i.status).collect();
        assert_eq!(statuses, [202, 202, 400]);
        assert_eq!(batch.items[0].delivery_ids.as_ref().map(Vec::len), Some(1));
        assert_eq!(
            batch.items[2].error.as_ref().map(|e| e.code.as_str()),
            Some("invalid_input")
        );
        assert_eq!(api.store.deliveries().len(), 3, "nothing of the bad event");
        // The catalog's schema holds: a payload breaking it is refused, located.
        let mut bad: serde_json::Value =
            serde_json::from_str(include_str!("../../../events/api-post-event.json")).unwrap();
        bad["headers"]["idempotency-key"] = "order-1099-paid".into();
        bad["body"] = r#"{"event_type":"order.paid","payload":{"order_id":"1099","amount_cents":1,"currency":"BRL"}}"#.into();
        let (status, refused) = call(&api, &bad.to_string()).await;
        assert_eq!(status, 400, "{refused}");
        assert_eq!(refused["error"]["code"], "payload_schema_mismatch");
        assert_eq!(refused["error"]["location"], "/order_id");
        assert_eq!(
            api.store.deliveries().len(),
            3,
            "nothing of the refused event"
        );
        let (status, report) = fixture!(api, "api-redrive").await;
        assert_eq!(status, 200, "{report}");
        assert_eq!(report["dry_run"], true);
        let (status, doc) = fixture!(api, "api-openapi").await;
        assert_eq!((status, doc["openapi"].as_str()), (200, Some("3.1.0")));
        let (status, key) = fixture!(api, "api-create-api-key").await;
        assert_eq!(status, 201, "{key}");
        assert!(key["key"].as_str().unwrap().starts_with("key_"));
        let (status, dlq) = fixture!(api, "api-dlq-status").await;
        assert_eq!((status, dlq["depth"].as_u64()), (200, Some(0)));
        let (status, recover) = fixture!(api, "api-recover-endpoint").await;
        assert_eq!(
            (status, recover["error"]["code"].as_str()),
            (404, Some("not_found"))
        );
        let (status, missing) = fixture!(api, "api-get-delivery").await;
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

    /// `UPDATE_OPENAPI=1 cargo test -p hookline-ingest openapi_json` writes
    /// the file afresh.
    #[test]
    fn openapi_json_is_the_generated_document() {
        let generated = router::generate_document();
        let file = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.json");
        if std::env::var_os("UPDATE_OPENAPI").is_some() {
            std::fs::write(file, &generated).unwrap();
            return;
        }
        assert!(
            generated == router::DOCUMENT,
            "functions/ingest/openapi.json is not what the route table generates: \
             run `UPDATE_OPENAPI=1 cargo test -p hookline-ingest openapi_json` and commit the file"
        );
    }

    #[tokio::test]
    async fn openapi_document_lists_exactly_the_served_routes() {
        let doc: serde_json::Value = serde_json::from_str(router::document()).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        let mut documented = Vec::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for method in item.as_object().unwrap().keys() {
                if ["get", "post", "patch", "delete", "put"].contains(&method.as_str()) {
                    documented.push((method.to_uppercase(), path.clone()));
                }
            }
        }
        let mut served: Vec<(String, String)> = router::routes()
            .iter()
            .map(|r| (r.method.to_string(), r.path.clone()))
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
                .replace("{key_id}", "key_00000000000000000000000000")
                .replace("{session_id}", "key_00000000000000000000000000");
            let request = apigw::http_request(
                method,
                &concrete,
                &[("authorization".into(), "Bearer local-admin-key".into())],
                None,
            )
            .unwrap();
            let response = answer(&api, request).await;
            let body = String::from_utf8_lossy(response.body().as_ref()).into_owned();
            assert!(
                !body.contains("no such route") && response.status() != 405,
                "{method} {path}: {} {body}",
                response.status()
            );
            let public = router::routes()
                .iter()
                .any(|r| r.path == *path && r.access == router::Access::Public);
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
    async fn the_pages_are_served_without_a_key_and_locked_to_their_origin() {
        let api = api();
        for page in ["/dashboard", "/portal"] {
            let request = apigw::http_request("GET", page, &[], None).unwrap();
            let response = answer(&api, request).await;
            assert_eq!(response.status(), 200, "{page}");
            assert!(response.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/html"));
            let csp = response.headers()["content-security-policy"]
                .to_str()
                .unwrap()
                .to_owned();
            assert!(csp.contains("connect-src 'self'"), "{csp}");
            // No inline script: the script is its own file from the same origin.
            assert!(csp.contains("script-src 'self';"), "{csp}");
            assert_eq!(
                response.headers()["referrer-policy"].to_str().unwrap(),
                "no-referrer"
            );
            let Body::Text(html) = response.body() else {
                panic!("the page is text")
            };
            let script = format!("{page}/app.js");
            assert!(html.contains(&format!(r#"<script src="{script}"></script>"#)));
            assert_eq!(html.matches("<script").count(), 1, "no inline script");
            let request = apigw::http_request("GET", &script, &[], None).unwrap();
            let response = answer(&api, request).await;
            assert_eq!(response.status(), 200);
            assert!(response.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/javascript"));
            assert_eq!(
                response.headers()["content-security-policy"]
                    .to_str()
                    .unwrap(),
                csp
            );
            let Body::Text(js) = response.body() else {
                panic!("the script is text")
            };
            assert!(js.starts_with("// What the dashboard and the portal share"));
        }
    }
}
