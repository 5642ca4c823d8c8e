//! One matched, authorised request as a handler sees it ([`Call`]): typed
//! extraction of the path, query and JSON body, each with its own 400 code.

use chrono::{DateTime, Utc};
use lambda_http::{Body, Request, RequestExt, Response};
use rand::RngCore;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::error::ApiError;

/// What a handler answers.
pub type Answer = Result<Response<Body>, ApiError>;

/// One request, matched against its route and authorised for it.
#[allow(missing_debug_implementations)]
pub struct Call<'a> {
    pub request: &'a Request,
    pub params: Params<'a>,
    pub now: DateTime<Utc>,
    pub rng: &'a mut (dyn RngCore + Send),
    /// The OpenAPI document of the routes (served by `GET /openapi.json`).
    pub document: fn() -> &'static str,
    /// The API key or portal session that authenticated the call (`None`:
    /// the admin key, or a public route).
    pub caller: Option<hookline_core::ids::ApiKeyId>,
}

/// The path parameters of a matched route.
#[derive(Debug, Default)]
pub struct Params<'a> {
    pub(crate) pairs: Vec<(&'a str, &'a str)>,
}

impl<'a> Params<'a> {
    /// A parameter the route template names.
    pub fn get(&self, name: &str) -> Option<&'a str> {
        self.pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&'a str, &'a str)> + '_ {
        self.pairs.iter().copied()
    }
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
