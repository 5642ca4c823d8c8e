//! SDK (and direct DynamoDB client) errors -> [`PipelineError`], deciding
//! what is retryable.

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

/// An error of a direct client ([`crate::aws_json`]): SQS's a queue
/// error, DynamoDB's and KMS's (the sealed secrets' data keys) a store error.
pub fn direct_error(err: crate::aws_json::AwsJsonError) -> PipelineError {
    let operation = err.operation();
    let (retryable, message) = (err.is_retryable(), operation.to_string());
    let source = Some(Box::new(err) as Box<dyn std::error::Error + Send + Sync>);
    if *operation.service == crate::sqs_http::SQS {
        PipelineError::Queue {
            retryable,
            message,
            source,
        }
    } else {
        PipelineError::Store {
            retryable,
            message,
            source,
        }
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

/// The cancellation reasons of a cancelled transaction (None for any other error).
pub fn cancellation_reasons<R>(
    err: &SdkError<aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError, R>,
) -> Option<&[aws_sdk_dynamodb::types::CancellationReason]> {
    match err.as_service_error() {
        Some(aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError::TransactionCanceledException(c)) => {
            Some(c.cancellation_reasons())
        }
        _ => None,
    }
}

/// Whether a cancelled transaction's reason is a failed condition.
pub fn condition_failed(reason: &aws_sdk_dynamodb::types::CancellationReason) -> bool {
    reason.code() == Some("ConditionalCheckFailed")
}

/// Whether a single-item write failed its condition.
pub fn is_condition_failure<E: ProvideErrorMetadata, R>(err: &SdkError<E, R>) -> bool {
    err.as_service_error().and_then(|e| e.code()) == Some("ConditionalCheckFailedException")
}

/// Whether a single-item write met a transaction in progress on its item
/// (`TransactionConflictException`): nothing was written; try again.
pub fn is_transaction_conflict<E: ProvideErrorMetadata, R>(err: &SdkError<E, R>) -> bool {
    err.as_service_error().and_then(|e| e.code()) == Some("TransactionConflictException")
}
