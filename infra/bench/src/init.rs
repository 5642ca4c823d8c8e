//! Cold start and memory of the real function binaries, run as processes
//! against the runtime stub with a Lambda-like environment.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::stub::RuntimeStub;

/// The environment Lambda gives a function, plus hookline's settings.
pub fn lambda_env(runtime_api: &str, extra: &HashMap<String, String>) -> HashMap<String, String> {
    let mut env: HashMap<String, String> = [
        ("AWS_LAMBDA_RUNTIME_API", runtime_api),
        ("AWS_LAMBDA_FUNCTION_NAME", "bench"),
        ("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST"),
        ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128"),
        ("AWS_LAMBDA_LOG_GROUP_NAME", "/aws/lambda/bench"),
        ("AWS_LAMBDA_LOG_STREAM_NAME", "bench"),
        ("AWS_REGION", "us-east-1"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
        ("AWS_ACCESS_KEY_ID", "bench"),
        ("AWS_SECRET_ACCESS_KEY", "bench"),
        ("WEBHOOKS_TABLE", crate::aws_stub::FIXTURE_TABLE),
        (
            "WEBHOOKS_QUEUE_URL",
            "http://127.0.0.1:9/000000000000/hookline-DeliveryQueue",
        ),
        (
            "WEBHOOKS_DLQ_URL",
            "http://127.0.0.1:9/000000000000/hookline-DeadLetterQueue",
        ),
        ("WEBHOOKS_KMS_KEY_ID", crate::aws_stub::FIXTURE_KMS_KEY),
        ("RUST_LOG", "info"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    if let Ok(path) = std::env::var("PATH") {
        env.insert("PATH".into(), path);
    }
    env.extend(extra.clone());
    env
}

fn spawn(binary: &Path, env: &HashMap<String, String>) -> std::io::Result<std::process::Child> {
    Command::new(binary)
        .env_clear()
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
}

fn stop(mut child: std::process::Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Start-to-first-`next` times (ms) of `starts` fresh processes.
pub async fn init_times(
    stub: &RuntimeStub,
    binary: &Path,
    env: &HashMap<String, String>,
    starts: usize,
) -> Result<Vec<f64>, String> {
    let mut samples = Vec::with_capacity(starts);
    for _ in 0..starts {
        stub.reset(vec![]);
        let t0 = Instant::now();
        let child = spawn(binary, env).map_err(|e| format!("{}: {e}", binary.display()))?;
        let first = stub.first_next(Duration::from_secs(10)).await;
        stop(child);
        let first = first.ok_or_else(|| format!("{} never called next", binary.display()))?;
        samples.push(first.duration_since(t0).as_secs_f64() * 1000.0);
    }
    Ok(samples)
}

/// Process start to its first answer posted (ms), for `starts` fresh
/// processes each given `event` as its first invocation: the whole cold
/// start a caller waits for (runtime init, settings, SDK and HTTP clients
/// built on the first invocation, the invocation's own AWS round trips).
pub async fn first_answer_times(
    stub: &RuntimeStub,
    binary: &Path,
    env: &HashMap<String, String>,
    event: &str,
    starts: usize,
) -> Result<Vec<f64>, String> {
    let mut samples = Vec::with_capacity(starts);
    for _ in 0..starts {
        stub.reset(vec![event.to_owned()]);
        let t0 = Instant::now();
        let child = spawn(binary, env).map_err(|e| format!("{}: {e}", binary.display()))?;
        let first = stub.first_answer(Duration::from_secs(20)).await;
        stop(child);
        let (at, (kind, body)) =
            first.ok_or_else(|| format!("{} never answered", binary.display()))?;
        if !kind.ends_with("/response") {
            return Err(format!("{} answered {kind}: {body}", binary.display()));
        }
        samples.push(at.duration_since(t0).as_secs_f64() * 1000.0);
    }
    Ok(samples)
}

/// Peak resident memory (VmHWM, KiB) of a process.
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// What one process did with a list of invocation events.
#[derive(Debug, Clone, Serialize)]
pub struct InvocationRun {
    pub responses: Vec<String>,
    pub errors: Vec<String>,
    pub peak_rss_kib: u64,
}

/// Runs `binary` once over `events` (one invocation each) and reads its peak
/// RSS once it has answered them all.
pub async fn invoke(
    stub: &RuntimeStub,
    binary: &Path,
    env: &HashMap<String, String>,
    events: Vec<String>,
) -> Result<InvocationRun, String> {
    stub.reset(events);
    let child = spawn(binary, env).map_err(|e| format!("{}: {e}", binary.display()))?;
    let pid = child.id();
    let answered = stub.all_answered(Duration::from_secs(60)).await;
    let rss = peak_rss_kib(pid);
    stop(child);
    let answered =
        answered.ok_or_else(|| format!("{} did not answer in time", binary.display()))?;
    let (errors, responses): (Vec<_>, Vec<_>) = answered
        .into_iter()
        .partition(|(kind, _)| kind.ends_with("error"));
    Ok(InvocationRun {
        responses: responses.into_iter().map(|(_, b)| b).collect(),
        errors: errors.into_iter().map(|(_, b)| b).collect(),
        peak_rss_kib: rss.unwrap_or(0),
    })
}

/// Median and 90th percentile of samples.
pub fn median_p90(samples: &[f64]) -> (f64, f64) {
    let mut s = samples.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    if s.is_empty() {
        return (0.0, 0.0);
    }
    let at = |q: f64| s[((s.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.9))
}
