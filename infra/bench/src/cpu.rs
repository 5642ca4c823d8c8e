//! Our CPU per delivered webhook: runs the `cpu-probe` binary (ingest +
//! dispatch + deliver handlers in one release process, see its docs) against
//! the stateful AWS stub and an instant loopback receiver, both in this
//! process (so their CPU is not the probe's).

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::aws_stub::AwsStub;
use crate::{init, throughput};

/// What the probe measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CpuFigures {
    pub deliveries: usize,
    pub ours_cpu_ms_per_delivery: f64,
    pub bare_post_cpu_ms_per_delivery: f64,
    /// One bare AWS SDK request (GetItem) through the functions' SDK
    /// configuration and HTTP client, to the same stub.
    #[serde(default)]
    pub sdk_request_cpu_ms: f64,
    /// The same GetItem on the functions' direct DynamoDB client
    /// (`hookline_aws::dynamo_http`), which their DynamoDB requests use.
    #[serde(default)]
    pub direct_request_cpu_ms: f64,
    /// Per function: ingest, dispatch, deliver (they add up to ours).
    #[serde(default)]
    pub ingest_cpu_ms_per_delivery: f64,
    #[serde(default)]
    pub dispatch_cpu_ms_per_delivery: f64,
    #[serde(default)]
    pub deliver_cpu_ms_per_delivery: f64,
    /// The requests of those two baselines (warm-up included), which the
    /// stub also counted.
    #[serde(default)]
    pub baseline_requests: u64,
    /// Requests the stub answered per delivery (warm-up and setup included).
    #[serde(default)]
    pub aws_requests_per_delivery: f64,
}

pub async fn run(probe: &Path, events: usize) -> Result<CpuFigures, Box<dyn std::error::Error>> {
    let (stub, aws_url) = AwsStub::start_stateful().await?;
    let receiver = throughput::slow_receiver(Duration::ZERO)?;
    let extra: HashMap<String, String> = [
        ("WEBHOOKS_AWS_ENDPOINT_URL", aws_url.as_str()),
        ("WEBHOOKS_ADMIN_KEY", "local-admin-key"),
        ("WEBHOOKS_ALLOW_PRIVATE_ENDPOINTS", "true"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let env = init::lambda_env("127.0.0.1:9", &extra);
    let output = tokio::process::Command::new(probe)
        .env_clear()
        .envs(&env)
        .args([aws_url.as_str(), receiver.as_str(), &events.to_string()])
        .kill_on_drop(true)
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!(
            "cpu-probe failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
                .lines()
                .chain(stdout.lines())
                .rev()
                .take(5)
                .collect::<Vec<_>>()
                .join(" | ")
        )
        .into());
    }
    // Its JSON logs share stdout; the figures are the line naming them.
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.contains("ours_cpu_ms_per_delivery"))
        .ok_or("cpu-probe printed no figures")?;
    let mut figures: CpuFigures = serde_json::from_str(line)?;
    let requests = stub.requests.load(std::sync::atomic::Ordering::Relaxed);
    let pipeline = requests.saturating_sub(figures.baseline_requests);
    figures.aws_requests_per_delivery = pipeline as f64 / figures.deliveries.max(1) as f64;
    Ok(figures)
}
