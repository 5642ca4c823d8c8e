//! The API's error answer: the one place a [`PipelineError`] becomes an HTTP
//! status, and the one `{"error": {"code", "message"}}` envelope.

use hookline_pipeline::PipelineError;
use lambda_http::http::StatusCode;
use lambda_http::{Body, Response};

use crate::respond::json;
use crate::views::ErrorBody;

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// Where in the request body it failed (a JSON Pointer), when known.
    pub location: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            location: None,
        }
    }

    /// A 400 with `code`.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// A 409 with `code`.
    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, code, message)
    }

    /// A 403 with `message`.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    /// A 401 with `message`.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    /// The JSON error response.
    pub fn into_response(self) -> Response<Body> {
        let mut body = ErrorBody::new(self.code, self.message);
        body.error.location = self.location;
        json(self.status, &body)
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
            PipelineError::Invalid { code, message } => Self::bad_request(code, message),
            PipelineError::SchemaMismatch {
                event_type,
                location,
                message,
            } => Self {
                location: Some(location),
                ..Self::bad_request(
                    "payload_schema_mismatch",
                    format!("the payload does not match the schema of `{event_type}`: {message}"),
                )
            },
            PipelineError::NotFound(what) => Self::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("{what} not found"),
            ),
            PipelineError::Conflict(message) => Self::conflict("conflict", message),
            PipelineError::Limit { code, message } => Self::conflict(code, message),
            err if err.is_retryable() => {
                tracing::error!(error = %hookline_core::error::Chain(&err), "retryable backend error");
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "temporarily unavailable, retry",
                )
            }
            err => {
                tracing::error!(error = %hookline_core::error::Chain(&err), "backend error");
                Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error",
                )
            }
        }
    }
}

impl From<hookline_core::CoreError> for ApiError {
    fn from(err: hookline_core::CoreError) -> Self {
        PipelineError::from(err).into()
    }
}
