//! Public routes: liveness, the OpenAPI document, the dashboard and portal
//! pages with their scripts.

use lambda_http::http::StatusCode;
use lambda_http::Body;

use crate::call::{Answer, Call};
use crate::respond::{json, with_type};
use crate::views::Health;
use crate::Api;

/// Liveness: no key needed.
#[utoipa::path(get, path = "/health", tag = "meta",
    responses((status = 200, body = Health)))]
pub async fn health<S, Q>(_api: &Api<S, Q>, _call: Call<'_>) -> Answer {
    Ok(json(
        StatusCode::OK,
        &Health {
            status: "ok".into(),
        },
    ))
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "meta",
    responses((status = 200, description = "the OpenAPI 3.1 document", content_type = "application/json")))]
pub async fn openapi<S, Q>(_api: &Api<S, Q>, call: Call<'_>) -> Answer {
    Ok(with_type(
        StatusCode::OK,
        Body::Text((call.document)().to_owned()),
        "application/json",
    ))
}

/// The delivery dashboard (a static page; it asks for an API key).
#[utoipa::path(get, path = "/dashboard", tag = "meta",
    responses((status = 200, description = "HTML", content_type = "text/html")))]
pub async fn dashboard<S, Q>(_api: &Api<S, Q>, _call: Call<'_>) -> Answer {
    Ok(crate::pages::DASHBOARD.page())
}

/// The dashboard's script (the page's policy allows no inline script).
#[utoipa::path(get, path = "/dashboard/app.js", tag = "meta",
    responses((status = 200, description = "JavaScript", content_type = "text/javascript")))]
pub async fn dashboard_script<S, Q>(_api: &Api<S, Q>, _call: Call<'_>) -> Answer {
    Ok(crate::pages::DASHBOARD.script_file())
}

/// The consumer portal: an app's customers open it by a portal session's
/// link (`#app=…&token=…`) and manage their own endpoints.
#[utoipa::path(get, path = "/portal", tag = "meta",
    responses((status = 200, description = "HTML", content_type = "text/html")))]
pub async fn portal<S, Q>(_api: &Api<S, Q>, _call: Call<'_>) -> Answer {
    Ok(crate::pages::PORTAL.page())
}

/// The portal's script.
#[utoipa::path(get, path = "/portal/app.js", tag = "meta",
    responses((status = 200, description = "JavaScript", content_type = "text/javascript")))]
pub async fn portal_script<S, Q>(_api: &Api<S, Q>, _call: Call<'_>) -> Answer {
    Ok(crate::pages::PORTAL.script_file())
}
