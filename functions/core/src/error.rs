//! The core's one error type.

use thiserror::Error;

/// Errors of the pure core. None of them is retryable: they describe bad
/// input or an illegal state change, which the same call would repeat.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CoreError {
    #[error("invalid {kind} id: {reason}")]
    InvalidId {
        kind: &'static str,
        reason: &'static str,
    },
    #[error("invalid {field}: {reason}")]
    InvalidInput { field: &'static str, reason: String },
    #[error("invalid retry schedule: {0}")]
    InvalidSchedule(String),
    #[error("invalid secret: {0}")]
    InvalidSecret(&'static str),
    #[error("illegal delivery transition: {action} from `{from}`")]
    IllegalTransition {
        from: &'static str,
        action: &'static str,
    },
}
