//! hookline's delivery pipeline, independent of AWS: the use cases behind the
//! four Lambdas, written against three coarse ports.
//!
//! - [`ports`]: the [`Store`](ports::Store), [`Queue`](ports::Queue) and
//!   [`Sender`](ports::Sender) traits (one real implementation each: DynamoDB
//!   and SQS in `hookline-aws`, HTTP in [`sender`]).
//! - [`settings`]: configuration from `WEBHOOKS_*` environment variables.
//! - [`messages`]: the SQS message bodies (delivery queue and DLQ).
//! - [`ingest`]: accept an event: validate, fan out, commit the outbox.
//! - [`dispatch`]: a stream record of a pending delivery -> a delayed SQS message;
//!   an event with fan-out left -> its next chunk of deliveries.
//! - [`deliver`]: an SQS message -> a signed POST -> one conditional update.
//! - [`reconcile`]: re-queue pending deliveries whose queue message was lost
//!   (the scheduled reconciler), from the overdue index.
//! - [`redrive`]: drain the DLQ on demand (manual retry).
//! - [`recover`]: retry one failed delivery, or an endpoint's failed ones in a
//!   time window (bulk recover).
//! - [`replay`]: replay missing: an endpoint's deliveries of the events of a
//!   window it never had, bounded per call and continued in the background.
//! - [`pacer`]: rate-limit send slots gathered per process (one limiter
//!   write for the attempts of a batch that reach the same endpoint).
//! - [`sender`]: the reqwest HTTP sender with the private-address guard.
//! - [`operational`]: operational webhooks (`endpoint.disabled`, `endpoint.enabled`,
//!   `delivery.failed`) as events of the reserved app `_operational`.
//! - [`metrics`]: CloudWatch Embedded Metric Format log lines.
//! - [`error`]: [`PipelineError`], saying what is retryable.
//! - `fakes` (feature `fakes`): in-memory ports for unit tests only; every AWS
//!   path is also tested against moto.

pub mod deliver;
pub mod dispatch;
pub mod error;
#[cfg(any(test, feature = "fakes"))]
pub mod fakes;
pub mod ingest;
pub mod messages;
pub mod metrics;
pub mod operational;
pub mod pacer;
pub mod ports;
pub mod reconcile;
pub mod recover;
pub mod redrive;
pub mod replay;
pub mod sender;
pub mod settings;

pub use error::PipelineError;
pub use settings::Settings;
