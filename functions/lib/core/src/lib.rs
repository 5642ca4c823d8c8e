//! The pure domain core of hookline: functions of their inputs, with time and
//! randomness passed in. No AWS SDK, no I/O.
//!
//! - [`ids`]: typed, prefixed, time-ordered ids (`evt_`, `ep_`, `dlv_`, `msg_`, `key_`)
//!   and the validated [`AppId`](ids::AppId).
//! - [`model`]: [`Event`](model::Event), [`Endpoint`](model::Endpoint),
//!   [`Delivery`](model::Delivery), [`Attempt`](model::Attempt) and the delivery
//!   state machine (`pending -> delivered | failed`, `failed -> pending`).
//! - [`catalog`]: the event-type catalog's definitions, and an endpoint's
//!   subscriptions checked against it (closest names suggested).
//! - [`circuit`]: an endpoint's circuit (open while it times out or refuses
//!   connections: its deliveries wait, one probe closes it), and the pacing of
//!   one that answers slowly (its requests in turns).
//! - [`ordering`]: ordering per key (the order at commit, the gate of a
//!   delivery waiting for its predecessor).
//! - [`rate`]: per-endpoint rate limits as numbered send slots.
//! - [`retry`]: [`RetryPolicy`](retry::RetryPolicy) (the seed's schedule by
//!   default, or one parsed from `"5s,5m,30m"`), `Retry-After` parsing, and
//!   response classification.
//! - [`signing`]: [`Secret`](signing::Secret) and the full signed header set of
//!   a message for both schemes (via `hookline-verify`'s scheme functions).
//! - [`stats`]: endpoint statistics per hour (counts, latency histogram) and
//!   their summary (success rate, p50/p95/p99).
//! - [`apikey`]: app-scoped API keys (`<key id>.<secret>`, stored as SHA-256).
//! - [`error`]: [`CoreError`], and [`Chain`](error::Chain) to log an error with its causes.
//! - [`sync`]: a poison-tolerant `lock` for in-process state.

pub mod apikey;
pub mod catalog;
pub mod circuit;
pub mod error;
pub mod ids;
pub mod model;
pub mod ordering;
pub mod rate;
pub mod retry;
pub mod signing;
pub mod stats;
pub mod sync;

pub use error::CoreError;
