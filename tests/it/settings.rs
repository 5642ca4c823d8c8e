//! Settings are read once at init: a Lambda bootstrap started without a
//! required variable fails its cold start, naming the variable, instead of
//! running on a default.

use std::process::{Command, Stdio};
use std::time::Duration;

const FUNCTIONS: [(&str, &str); 5] = [
    ("hookline-ingest", "ingest"),
    ("hookline-dispatch", "dispatch"),
    ("hookline-deliver", "deliver"),
    ("hookline-retry", "retry"),
    ("hookline-reconcile", "reconcile"),
];

/// Ours, and the AWS access Lambda sets in every environment (read
/// directly, without aws-config's credential chain).
const REQUIRED: [(&str, &str); 7] = [
    ("WEBHOOKS_TABLE", "hookline-Table"),
    ("WEBHOOKS_QUEUE_URL", "http://127.0.0.1:9/000000000000/q"),
    ("WEBHOOKS_DLQ_URL", "http://127.0.0.1:9/000000000000/dlq"),
    ("WEBHOOKS_KMS_KEY_ID", "alias/hookline-SecretsKey"),
    ("AWS_REGION", "us-east-1"),
    ("AWS_ACCESS_KEY_ID", "local"),
    ("AWS_SECRET_ACCESS_KEY", "local"),
];

#[test]
fn a_missing_required_variable_fails_every_cold_start_naming_it() {
    for (package, bin) in FUNCTIONS {
        let binary = hookline_tests::binary(package, bin);
        for (missing, _) in REQUIRED {
            let mut child = Command::new(&binary)
                .env_clear()
                .envs(REQUIRED.iter().filter(|(k, _)| *k != missing).copied())
                // A runtime API nobody answers: a process that got past its
                // settings would hang on it, not exit.
                .env("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start the bootstrap");
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            let status = loop {
                if let Some(status) = child.try_wait().expect("wait") {
                    break Some(status);
                }
                if std::time::Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            let output = child.wait_with_output().expect("output");
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            let status = status.unwrap_or_else(|| panic!("{bin} without {missing} kept running"));
            assert!(!status.success(), "{bin} without {missing}: {text}");
            assert!(
                text.contains(&format!("{missing} is required and not set")),
                "{bin} without {missing} must name it: {text}"
            );
        }
    }
}
