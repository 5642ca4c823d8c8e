//! SDK errors -> [`PipelineError`], deciding what is retryable.

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use hookline_pipeline::PipelineError;

/// Service error codes worth retrying (throttling, transient server trouble,
/// transaction conflicts).
const RETRYABLE_CODES: &[&str] = &[
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "Throttling",
    "RequestLimitExceeded",
    "InternalServerError",
    "InternalFailure",
    "ServiceUnavailable",
    "TransactionConflictException",
    "TransactionInProgressException",
    "RequestThrottled",
    "KMSThrottlingException",
];

fn is_retryable<E: ProvideErrorMetadata, R>(err: &SdkError<E, R>) -> bool {
    match err {
        SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) | SdkError::ResponseError(_) => {
            true
        }
        SdkError::ServiceError(service) => service
            .err()
            .code()
            .is_some_and(|c| RETRYABLE_CODES.contains(&c)),
        _ => false,
    }
}

/// A DynamoDB error.
pub fn store_error<E, R>(operation: &str, err: SdkError<E, R>) -> PipelineError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    PipelineError::Store {
        retryable: is_retryable(&err),
        message: operation.to_owned(),
        source: Some(Box::new(err)),
    }
}

/// An SQS error.
pub fn queue_error<E, R>(operation: &str, err: SdkError<E, R>) -> PipelineError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    PipelineError::Queue {
        retryable: is_retryable(&err),
        message: operation.to_owned(),
        source: Some(Box::new(err)),
    }
}

/// An item that does not decode.
pub fn corrupt(what: &str, err: impl std::fmt::Display) -> PipelineError {
    PipelineError::Corrupt(format!("{what}: {err}"))
}
