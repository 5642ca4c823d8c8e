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
    #[error("at most {max} secrets can be valid at once: wait until the oldest rotation's overlap ends, or rotate without overlap")]
    TooManySecrets { max: usize },
    #[error("illegal delivery transition: {action} from `{from}`")]
    IllegalTransition {
        from: &'static str,
        action: &'static str,
    },
}

/// Displays an error with every cause in its `source()` chain
/// (`outer: middle: root`), for logs: `tracing::error!(error = %Chain(&e))`.
#[derive(Debug, Clone, Copy)]
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(err) = cause {
            write!(f, ": {err}")?;
            cause = err.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod chain_tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn chain_shows_every_cause() {
        let err = Outer(std::io::Error::other("root cause"));
        assert_eq!(Chain(&err).to_string(), "outer: root cause");
    }
}
