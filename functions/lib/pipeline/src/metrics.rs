//! Delivery metrics as CloudWatch Embedded Metric Format lines on stdout:
//! CloudWatch extracts them from the logs, so they cost no API call.

use std::io::Write;

use chrono::Utc;

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
    // Written out rather than built as a `serde_json::Value` tree: one line
    // per delivery, and the tree's allocations were most of its cost. The
    // strings are JSON-escaped; the rest is numbers and constants.
    let text = |s: &str| serde_json::to_string(s).expect("a string always serializes");
    format!(
        concat!(
            r#"{{"_aws":{{"Timestamp":{},"CloudWatchMetrics":[{{"Namespace":"{}","#,
            r#""Dimensions":[["Function"]],"Metrics":["#,
            r#"{{"Name":"DeliverySucceeded","Unit":"Count"}},"#,
            r#"{{"Name":"DeliveryRetried","Unit":"Count"}},"#,
            r#"{{"Name":"DeliveryFailed","Unit":"Count"}},"#,
            r#"{{"Name":"DeliveryLatency","Unit":"Milliseconds"}}]}}]}},"#,
            r#""Function":{},"DeliverySucceeded":{},"DeliveryRetried":{},"DeliveryFailed":{},"#,
            r#""DeliveryLatency":{},"delivery_id":{},"endpoint_id":{}}}"#
        ),
        Utc::now().timestamp_millis(),
        NAMESPACE,
        text(function),
        succeeded,
        retried,
        failed,
        latency_ms,
        text(delivery_id),
        text(endpoint_id),
    )
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

/// Renders the EMF line of one reconciler run (pure, for tests): the
/// sweep's lag and how far it is behind its cutoff (`reconcile_after`
/// seconds behind now when caught up), the overdue entries found and the
/// oldest one's age, what was stepped over, and the queue lag the cutoff
/// allowed for. The template's alarms read
/// `ReconcileSweepBehind` and `ReconcileOverdueOldest`.
pub fn reconcile_emf_line(
    report: &crate::reconcile::ReconcileReport,
    reconcile_after_secs: i64,
) -> String {
    // Behind its cutoff, which a queue backlog moves back.
    let behind =
        (report.sweep_lag_seconds - reconcile_after_secs - report.queue_lag_seconds).max(0);
    format!(
        concat!(
            r#"{{"_aws":{{"Timestamp":{},"CloudWatchMetrics":[{{"Namespace":"{}","#,
            r#""Dimensions":[["Function"]],"Metrics":["#,
            r#"{{"Name":"ReconcileSweepLag","Unit":"Seconds"}},"#,
            r#"{{"Name":"ReconcileSweepBehind","Unit":"Seconds"}},"#,
            r#"{{"Name":"ReconcileOverdueFound","Unit":"Count"}},"#,
            r#"{{"Name":"ReconcileOverdueOldest","Unit":"Seconds"}},"#,
            r#"{{"Name":"ReconcileRecovered","Unit":"Count"}},"#,
            r#"{{"Name":"ReconcileSteppedOver","Unit":"Count"}},"#,
            r#"{{"Name":"ReconcileQueueLag","Unit":"Seconds"}}]}}]}},"#,
            r#""Function":"reconcile","ReconcileSweepLag":{},"ReconcileSweepBehind":{},"#,
            r#""ReconcileOverdueFound":{},"ReconcileOverdueOldest":{},"ReconcileRecovered":{},"#,
            r#""ReconcileSteppedOver":{},"ReconcileQueueLag":{},"complete":{}}}"#
        ),
        Utc::now().timestamp_millis(),
        NAMESPACE,
        report.sweep_lag_seconds,
        behind,
        report.overdue,
        report.overdue_oldest_seconds,
        report.requeued + report.listed_requeued + report.fanouts + report.replays,
        report.poison + report.expired,
        report.queue_lag_seconds,
        report.complete,
    )
}

/// Writes a reconciler run's EMF line to stdout, when `enabled`.
pub fn emit_reconcile(
    enabled: bool,
    report: &crate::reconcile::ReconcileReport,
    reconcile_after_secs: i64,
) {
    if !enabled {
        return;
    }
    let mut line = reconcile_emf_line(report, reconcile_after_secs);
    line.push('\n');
    let _ = std::io::stdout().lock().write_all(line.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconcile_emf_shape() {
        let report = crate::reconcile::ReconcileReport {
            sweep_lag_seconds: 2_000,
            overdue: 3,
            overdue_oldest_seconds: 1_200,
            requeued: 2,
            listed_requeued: 1,
            poison: 1,
            ..Default::default()
        };
        let v: serde_json::Value = serde_json::from_str(&reconcile_emf_line(&report, 900)).unwrap();
        assert_eq!(v["ReconcileSweepLag"], 2_000);
        assert_eq!(v["ReconcileSweepBehind"], 1_100);
        assert_eq!(v["ReconcileOverdueFound"], 3);
        assert_eq!(v["ReconcileOverdueOldest"], 1_200);
        assert_eq!(v["ReconcileRecovered"], 3);
        assert_eq!(v["ReconcileSteppedOver"], 1);
        assert_eq!(v["ReconcileQueueLag"], 0);
        for m in v["_aws"]["CloudWatchMetrics"][0]["Metrics"]
            .as_array()
            .unwrap()
        {
            assert!(v.get(m["Name"].as_str().unwrap()).is_some());
        }
        // Caught up: behind by nothing.
        let caught_up = crate::reconcile::ReconcileReport {
            sweep_lag_seconds: 900,
            ..Default::default()
        };
        let v: serde_json::Value =
            serde_json::from_str(&reconcile_emf_line(&caught_up, 900)).unwrap();
        assert_eq!(v["ReconcileSweepBehind"], 0);
    }

    #[test]
    fn emf_shape() {
        let v: serde_json::Value =
            serde_json::from_str(&emf_line("deliver", Outcome::Retried, 42, "dlv_1", "ep_1"))
                .unwrap();
        assert_eq!(v["_aws"]["CloudWatchMetrics"][0]["Namespace"], NAMESPACE);
        assert_eq!(v["DeliveryRetried"], 1);
        assert_eq!(v["DeliverySucceeded"], 0);
        assert_eq!(v["DeliveryLatency"], 42);
        assert_eq!(v["Function"], "deliver");
        assert_eq!(v["delivery_id"], "dlv_1");
        assert_eq!(v["endpoint_id"], "ep_1");
        assert_eq!(v["DeliveryFailed"], 0);
        assert!(v["_aws"]["Timestamp"].as_i64().is_some_and(|t| t > 0));
        assert_eq!(
            v["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            serde_json::json!([["Function"]])
        );
        // Whatever an id holds, the line stays one valid JSON object.
        let odd: serde_json::Value =
            serde_json::from_str(&emf_line("deliver", Outcome::Failed, 1, "a\"b\n", "ep")).unwrap();
        assert_eq!(odd["delivery_id"], "a\"b\n");
        for m in v["_aws"]["CloudWatchMetrics"][0]["Metrics"]
            .as_array()
            .unwrap()
        {
            assert!(v.get(m["Name"].as_str().unwrap()).is_some());
        }
    }
}
