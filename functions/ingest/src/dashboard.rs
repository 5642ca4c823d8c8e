//! The delivery dashboard: one static page (HTML, CSS and JS in one file,
//! no build step) embedded in the binary. It talks to the same API with the
//! key the operator types in, kept in the tab's session storage only.

use lambda_http::http::{HeaderValue, StatusCode};
use lambda_http::{Body, Response};

/// The page's source.
pub const HTML: &str = include_str!("dashboard/index.html");

/// The page, with headers that keep it to its own origin.
pub fn page() -> Response<Body> {
    let mut response = Response::new(Body::Text(HTML.to_owned()));
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(
        "content-type",
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(
        "content-security-policy",
        HeaderValue::from_static(
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        ),
    );
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    headers.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    headers.insert("cache-control", HeaderValue::from_static("no-store"));
    response
}
