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

/// Writes the EMF line to stdout (one write, so lines never interleave).
/// Does nothing unless `enabled` (`Settings::emf_metrics`: inside Lambda,
/// or `WEBHOOKS_EMF_METRICS=true`).
pub fn emit(
    enabled: bool,
    function: &str,
    outcome: Outcome,
    latency_ms: u64,
    delivery_id: &str,
    endpoint_id: &str,
) {
    if !enabled {
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
