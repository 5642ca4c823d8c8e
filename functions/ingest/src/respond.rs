//! Building answers: JSON, typed bodies, 204.

use lambda_http::http::{HeaderValue, StatusCode};
use lambda_http::{Body, Response};
use serde::Serialize;

/// A JSON answer.
pub fn json<T: Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    let body = serde_json::to_string(value).unwrap_or_else(|_| "{}".to_owned());
    with_type(status, Body::Text(body), "application/json")
}

/// An answer with a body of `content_type`.
pub fn with_type(status: StatusCode, body: Body, content_type: &'static str) -> Response<Body> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert("content-type", HeaderValue::from_static(content_type));
    response
}

/// 204.
pub fn no_content() -> Response<Body> {
    let mut response = Response::new(Body::Empty);
    *response.status_mut() = StatusCode::NO_CONTENT;
    response
}
