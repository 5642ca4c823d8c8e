//! The OpenAPI 3.1 document, generated from the `#[utoipa::path]` attributes
//! of [`crate::handlers`] and the schemas of [`crate::views`].

use std::sync::OnceLock;

use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::handlers;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

#[derive(Debug, OpenApi)]
#[openapi(
    info(
        title = "hookline",
        description = "Serverless webhook delivery with guaranteed delivery: endpoints, events, deliveries and their attempt logs, manual and bulk recovery, the DLQ. Every route except /health, /openapi.json and /dashboard needs `Authorization: Bearer <api key>`: the admin key (every app) or an app-scoped key (one app)."
    ),
    paths(
        handlers::health,
        handlers::openapi,
        handlers::dashboard,
        handlers::create_event,
        handlers::get_event,
        handlers::create_endpoint,
        handlers::list_endpoints,
        handlers::get_endpoint,
        handlers::update_endpoint,
        handlers::delete_endpoint,
        handlers::rotate_secret,
        handlers::recover,
        handlers::list_deliveries,
        handlers::get_delivery,
        handlers::retry_delivery,
        handlers::create_api_key,
        handlers::list_api_keys,
        handlers::delete_api_key,
        handlers::dlq_status,
        handlers::dlq_redrive,
    ),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
)]
pub struct ApiDoc;

/// The document as JSON, built once.
pub fn document() -> &'static str {
    static DOC: OnceLock<String> = OnceLock::new();
    DOC.get_or_init(|| ApiDoc::openapi().to_pretty_json().unwrap_or_default())
}
