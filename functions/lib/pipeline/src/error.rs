//! The pipeline's one error type.

use hookline_core::CoreError;
use thiserror::Error;

/// A boxed cause, kept for logs (`hookline_core::error::Chain`).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

#[derive(Debug, Error)]
pub enum PipelineError {
    /// Bad input from a caller: a 4xx at the API edge, never retried.
    #[error("{code}: {message}")]
    Invalid { code: &'static str, message: String },
    /// A payload that does not match its event type's schema (a 400).
    #[error("payload_schema_mismatch: the payload does not match the schema of `{event_type}`: {message}")]
    SchemaMismatch {
        event_type: String,
        /// JSON Pointer into the payload where it failed (`""`: the whole payload).
        location: String,
        message: String,
    },
    #[error("{0} not found")]
    NotFound(&'static str),
    /// A state conflict (e.g. retrying a delivery that is not failed).
    #[error("conflict: {0}")]
    Conflict(String),
    /// A tenant limit refusing the request (a 409 with its own code:
    /// `replay_running`, ...), never retried as it stands.
    #[error("{code}: {message}")]
    Limit { code: &'static str, message: String },
    /// The store (DynamoDB) failed; `retryable` says whether trying again may help.
    #[error("store error: {message}")]
    Store {
        message: String,
        retryable: bool,
        #[source]
        source: Option<BoxError>,
    },
    /// The queue (SQS) failed.
    #[error("queue error: {message}")]
    Queue {
        message: String,
        retryable: bool,
        #[source]
        source: Option<BoxError>,
    },
    /// A stored record could not be decoded.
    #[error("corrupt record: {0}")]
    Corrupt(String),
    #[error("configuration")]
    Config(#[from] crate::settings::ConfigError),
    /// The table holds another storage format than this build reads: the
    /// function refuses to start (no migration, no fallback to older keys).
    #[error("the table holds storage format {table}; this build reads format {build} only (deploy the build of format {table}, or this build on a new table)")]
    Format { table: u32, build: u32 },
}

impl PipelineError {
    /// A store failure with no underlying error to keep.
    pub fn store(message: impl Into<String>, retryable: bool) -> Self {
        Self::Store {
            message: message.into(),
            retryable,
            source: None,
        }
    }

    /// A queue failure with no underlying error to keep.
    pub fn queue(message: impl Into<String>, retryable: bool) -> Self {
        Self::Queue {
            message: message.into(),
            retryable,
            source: None,
        }
    }

    pub fn invalid(code: &'static str, message: impl Into<String>) -> Self {
        Self::Invalid {
            code,
            message: message.into(),
        }
    }

    /// Whether the same operation may succeed if tried again (so a Lambda
    /// should report the record as a batch item failure rather than drop it).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Store { retryable, .. } | Self::Queue { retryable, .. } => *retryable,
            Self::Invalid { .. }
            | Self::SchemaMismatch { .. }
            | Self::NotFound(_)
            | Self::Conflict(_)
            | Self::Limit { .. }
            | Self::Corrupt(_)
            | Self::Config(_)
            | Self::Format { .. } => false,
        }
    }
}

impl From<CoreError> for PipelineError {
    fn from(err: CoreError) -> Self {
        let code = match &err {
            CoreError::InvalidId { .. } => "invalid_id",
            CoreError::InvalidInput { .. } => "invalid_input",
            CoreError::InvalidSchedule(_) => "invalid_schedule",
            CoreError::InvalidSecret(_) => "invalid_secret",
            CoreError::TooManySecrets { .. } => "too_many_secrets",
            CoreError::IllegalTransition { .. } => "illegal_transition",
        };
        Self::Invalid {
            code,
            message: err.to_string(),
        }
    }
}
