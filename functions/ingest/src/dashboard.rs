//! The delivery dashboard: one static page (HTML with its CSS) and its
//! script, no build step, embedded in the binary. It talks to the same API with the
//! key the operator types in, kept in the tab's session storage only.

use lambda_http::http::{HeaderValue, StatusCode};
use lambda_http::{Body, Response};

/// The page's source.
pub const HTML: &str = include_str!("dashboard/index.html");
/// The page's script (`GET /dashboard/app.js`): no inline script, so the
/// page's policy allows scripts from its own origin only.
pub const SCRIPT: &str = include_str!("dashboard/app.js");

/// The page, with headers that keep it to its own origin.
pub fn page() -> Response<Body> {
    static_file(HTML, "text/html; charset=utf-8")
}

/// The page's script.
pub fn script() -> Response<Body> {
    static_file(SCRIPT, "text/javascript; charset=utf-8")
}

fn static_file(text: &str, content_type: &'static str) -> Response<Body> {
    let mut response = Response::new(Body::Text(text.to_owned()));
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert("content-type", HeaderValue::from_static(content_type));
    headers.insert(
        "content-security-policy",
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
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
