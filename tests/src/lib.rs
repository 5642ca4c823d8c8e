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
pub fn record_figures(name: &str, line: &str) {
    use std::io::Write;
    let dir = target_dir().join("test-figures");
    let _ = std::fs::create_dir_all(&dir);
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{name}.txt")))
    {
        let _ = writeln!(f, "{line}");
    }
}
