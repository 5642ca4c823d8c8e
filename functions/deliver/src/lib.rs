//! The deliver function: SQS -> signed HTTP POST -> one conditional update.
//!
//! [`handle`] is the batch wrapper (partial failures by message id); the
//! per-message work is [`hookline_pipeline::deliver::Deliverer`].

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};
use hookline_pipeline::deliver::Deliverer;
use hookline_pipeline::ports::{Queue, Sender, Store};

/// Handles one SQS batch concurrently; failed messages are reported so SQS
/// retries them (and moves them to the DLQ after `maxReceiveCount`).
pub async fn handle<S: Store, Q: Queue, H: Sender>(
    deliverer: &Deliverer<S, Q, H>,
    event: SqsEvent,
) -> SqsBatchResponse {
    let ids: Vec<String> = event
        .records
        .iter()
        .map(|r| r.message_id.clone().unwrap_or_default())
        .collect();
    let bodies: Vec<&str> = event
        .records
        .iter()
        .map(|r| r.body.as_deref().unwrap_or(""))
        .collect();
    let failed = deliverer.handle_batch(&bodies).await;
    let mut response = SqsBatchResponse::default();
    for i in failed {
        let mut failure = BatchItemFailure::default();
        failure.item_identifier = ids[i].clone();
        response.batch_item_failures.push(failure);
    }
    response
}
