//! hookline's AWS edge: the real implementations of the pipeline's ports.
//!
//! - [`clients`]: SDK client construction from Lambda's environment
//!   (explicit retry and timeout settings; `WEBHOOKS_AWS_ENDPOINT_URL`
//!   points them at moto locally).
//! - [`lazy`]: SDK clients built on their first use (cold starts).
//! - [`transport`]: [`transport::AwsHttp`], the HTTP/1.1 client (hyper-util,
//!   rustls) every AWS request goes through, the SDK's included.
//! - [`aws_json`]: an AWS JSON API spoken directly (SigV4, the SDK's
//!   retries and timeouts), without the SDK orchestrator; on it
//!   [`dynamo_http`] (the DynamoDB operations every delivery makes),
//!   [`sqs_http`] (the message sends and the DLQ's drain) and [`kms_http`]
//!   (the sealed secrets' data keys).
//! - [`schema`]: the single-table design — keys, GSIs, item shapes (via
//!   serde_dynamo) and stream-image decoding.
//! - [`store`]: [`DynamoStore`], the [`Store`](hookline_pipeline::ports::Store) port.
//! - [`queue`]: [`SqsQueue`], the [`Queue`](hookline_pipeline::ports::Queue) port.
//! - [`outbox`]: the `TransactWriteItem`s of an event, for a producer's own
//!   transaction (business write and webhook commit together).
//! - [`sealing`]: endpoint secrets at rest, sealed under a KMS key
//!   (envelope encryption, data keys cached per process).
//! - [`serial`]: one DynamoDB call at a time when asked (moto).
//! - [`seen`]: [`seen::DynamoSeenStore`], the receiver kit's seen store on DynamoDB.
//! - [`error`]: SDK errors -> `PipelineError` with retryability.

pub mod aws_json;
pub mod clients;
pub mod dynamo_http;
pub mod error;
pub mod kms_http;
pub mod lazy;
pub mod outbox;
pub mod queue;
pub mod schema;
pub mod sealing;
pub mod seen;
pub mod serial;
pub mod sqs_http;
pub mod store;
#[cfg(test)]
mod test_server;
pub mod transport;

pub use queue::SqsQueue;
pub use store::DynamoStore;
