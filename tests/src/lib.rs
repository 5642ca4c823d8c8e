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

/// A JSON answer as its typed view (the API's own response types); panics
/// with the body when it does not fit.
/// Held for their whole run by the tests whose bounds are wall-clock
/// (the isolation tests' waits after a 202) and by the heaviest load
/// (ordering's 200 events with random failures), so they never overlap
/// on this 2-core machine; every other test still runs beside them.
pub static WALL_CLOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub fn view<T: serde::de::DeserializeOwned>(body: &serde_json::Value) -> T {
    serde_json::from_value(body.clone())
        .unwrap_or_else(|e| panic!("{e}: {body} is not a {}", std::any::type_name::<T>()))
}

/// The first delivery id of an accepted event's answer.
pub fn first_delivery(body: &serde_json::Value) -> String {
    let accepted: hookline_pipeline::ingest::IngestResponse = view(body);
    accepted
        .delivery_ids
        .first()
        .unwrap_or_else(|| panic!("no delivery in {body}"))
        .to_string()
}

/// Every delivery id of an accepted event's answer.
pub fn delivery_ids(body: &serde_json::Value) -> Vec<String> {
    let accepted: hookline_pipeline::ingest::IngestResponse = view(body);
    accepted
        .delivery_ids
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// The event id of an accepted event's answer.
pub fn event_id(body: &serde_json::Value) -> String {
    view::<hookline_pipeline::ingest::IngestResponse>(body)
        .event_id
        .to_string()
}

/// The signing secret in an endpoint's create or rotate answer.
pub fn secret_of(body: &serde_json::Value) -> String {
    view::<hookline_ingest::views::EndpointOut>(body)
        .secret
        .unwrap_or_else(|| panic!("no secret in {body}"))
}

/// The `error.code` of an error answer (None when the body is not one).
pub fn error_code(body: &serde_json::Value) -> Option<String> {
    serde_json::from_value::<hookline_ingest::views::ErrorBody>(body.clone())
        .ok()
        .map(|e| e.error.code)
}

/// The workspace root.
pub fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The cargo target directory (`CARGO_TARGET_DIR` or the workspace's `target`).
pub fn target_dir() -> std::path::PathBuf {
    std::env::var("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| workspace_root().join("target"))
}

/// Builds (if needed) and returns the `hookline-local` binary, for tests that
/// run the local stack or its worker as a subprocess.
pub fn local_binary() -> std::path::PathBuf {
    binary("hookline-local", "hookline-local")
}

/// Builds (if needed) and returns the debug binary `bin` of `package`.
pub fn binary(package: &str, bin: &str) -> std::path::PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = std::process::Command::new(cargo)
        .args(["build", "--quiet", "-p", package, "--bin", bin])
        .current_dir(workspace_root())
        .status()
        .expect("cargo build");
    assert!(status.success(), "building {package} failed");
    target_dir().join("debug").join(bin)
}

/// Appends a line of measured figures to `target/test-figures/<name>.txt`;
/// `tests/run` prints them after the suite (passing tests' output is hidden).
pub use hookline_pipeline::fakes::record_figure as record_figures;
