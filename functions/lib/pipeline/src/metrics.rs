//! Delivery metrics as CloudWatch Embedded Metric Format lines on stdout:
//! CloudWatch extracts them from the logs, so they cost no API call.

use std::io::Write;

use chrono::Utc;
use serde_json::json;

/// Namespace of every metric.
pub const NAMESPACE: &str = "Hookline";

/// One delivery attempt's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    Retried,
    Failed,
}

/// Renders the EMF line for one attempt (pure, for tests).
pub fn emf_line(
    function: &str,
    outcome: Outcome,
    latency_ms: u64,
    delivery_id: &str,
    endpoint_id: &str,
) -> String {
    let (succeeded, retried, failed) = match outcome {
        Outcome::Succeeded => (1, 0, 0),
        Outcome::Retried => (0, 1, 0),
        Outcome::Failed => (0, 0, 1),
    };
    json!({
        "_aws": {
            "Timestamp": Utc::now().timestamp_millis(),
            "CloudWatchMetrics": [{
                "Namespace": NAMESPACE,
                "Dimensions": [["Function"]],
                "Metrics": [
                    {"Name": "DeliverySucceeded", "Unit": "Count"},
                    {"Name": "DeliveryRetried", "Unit": "Count"},
                    {"Name": "DeliveryFailed", "Unit": "Count"},
                    {"Name": "DeliveryLatency", "Unit": "Milliseconds"}
                ]
            }]
        },
        "Function": function,
        "DeliverySucceeded": succeeded,
        "DeliveryRetried": retried,
        "DeliveryFailed": failed,
        "DeliveryLatency": latency_ms,
        "delivery_id": delivery_id,
        "endpoint_id": endpoint_id,
    })
    .to_string()
}

/// Whether EMF lines are written: inside Lambda (`AWS_LAMBDA_FUNCTION_NAME`
/// set) or when `WEBHOOKS_EMF_METRICS=true`.
fn enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| {
        std::env::var_os("AWS_LAMBDA_FUNCTION_NAME").is_some()
            || std::env::var("WEBHOOKS_EMF_METRICS").is_ok_and(|v| v == "true")
    })
}

/// Writes the EMF line to stdout (one write, so lines never interleave).
pub fn emit(
    function: &str,
    outcome: Outcome,
    latency_ms: u64,
    delivery_id: &str,
    endpoint_id: &str,
) {
    if !enabled() {
        return;
    }
    let mut line = emf_line(function, outcome, latency_ms, delivery_id, endpoint_id);
    line.push('\n');
    let _ = std::io::stdout().lock().write_all(line.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emf_shape() {
        let v: serde_json::Value =
            serde_json::from_str(&emf_line("deliver", Outcome::Retried, 42, "dlv_1", "ep_1"))
                .unwrap();
        assert_eq!(v["_aws"]["CloudWatchMetrics"][0]["Namespace"], NAMESPACE);
        assert_eq!(v["DeliveryRetried"], 1);
        assert_eq!(v["DeliverySucceeded"], 0);
        assert_eq!(v["DeliveryLatency"], 42);
        for m in v["_aws"]["CloudWatchMetrics"][0]["Metrics"]
            .as_array()
            .unwrap()
        {
            assert!(v.get(m["Name"].as_str().unwrap()).is_some());
        }
    }
}
