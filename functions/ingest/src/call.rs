//! One matched, authorised request as a handler sees it ([`Call`]): typed
//! extraction of the path, query and JSON body (each with its own 400
//! code), and the response helpers.

use chrono::{DateTime, Utc};
use lambda_http::http::{HeaderValue, StatusCode};
use lambda_http::{Body, Request, RequestExt, Response};
use rand::RngCore;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::router::Params;

/// What a handler answers.
pub type Answer = Result<Response<Body>, ApiError>;

/// One request, matched against its route and authorised for it.
#[allow(missing_debug_implementations)]
pub struct Call<'a> {
    pub request: &'a Request,
    pub params: Params<'a>,
    pub now: DateTime<Utc>,
    pub rng: &'a mut (dyn RngCore + Send),
}

fn strings<'k>(pairs: impl Iterator<Item = (&'k str, &'k str)>) -> Value {
    Value::Object(
        pairs
            .map(|(k, v)| (k.to_owned(), Value::String(v.to_owned())))
            .collect::<Map<_, _>>(),
    )
}

impl<'a> Call<'a> {
    /// The path parameters as `T` (ids parsed and checked): 400 `invalid_id`.
    pub fn path<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        serde_json::from_value(strings(self.params.iter()))
            .map_err(|e| ApiError::bad_request("invalid_id", e.to_string()))
    }

    /// The query string as `T`: 400 `invalid_query`.
    pub fn query<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        let query = self.request.query_string_parameters();
        serde_json::from_value(strings(query.iter()))
            .map_err(|e| ApiError::bad_request("invalid_query", e.to_string()))
    }

    /// A header as text (`None` when absent): 400 `code` when not visible ASCII.
    pub fn header(&self, name: &str, code: &'static str) -> Result<Option<&'a str>, ApiError> {
        self.request
            .headers()
            .get(name)
            .map(|v| {
                v.to_str().map_err(|_| {
                    ApiError::bad_request(code, format!("{name} must be visible ASCII"))
                })
            })
            .transpose()
    }

    pub fn body(&self) -> &'a [u8] {
        self.request.body().as_ref()
    }

    /// The JSON body as `T`: 400 `invalid_body`.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        serde_json::from_slice(self.body())
            .map_err(|e| ApiError::bad_request("invalid_body", e.to_string()))
    }

    /// The JSON body, or the default when the body is empty.
    pub fn json_or_default<T: DeserializeOwned + Default>(&self) -> Result<T, ApiError> {
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
