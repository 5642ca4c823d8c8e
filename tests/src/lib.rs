//! The integration-test kit: real parts on loopback.
//!
//! - [`moto`]: a moto server (real DynamoDB / Streams / SQS wire protocols) on a
//!   free loopback port, installed into `.venv/moto` if missing, stopped by PID.
//! - [`receiver`]: real HTTP receivers (axum) with scripted answers, verifying
//!   both signature schemes and counting duplicates by `webhook-id`.
//! - [`stack`]: the four functions' handlers wired to moto through the local
//!   event-source poller, driven step by step by the tests.

pub mod moto;
pub mod receiver;
pub mod stack;

/// The workspace root.
pub fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}
