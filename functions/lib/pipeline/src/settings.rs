//! Configuration from `WEBHOOKS_*` environment variables: the same names in
//! `template.yaml`, `events/env.local.json` and the local stack.

use std::time::Duration;

use hookline_core::retry::{parse_duration, RetryPolicy};

use crate::PipelineError;

/// Every setting the functions read. Missing variables take the defaults.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `WEBHOOKS_TABLE`: the DynamoDB table.
    pub table: String,
    /// `WEBHOOKS_QUEUE_URL`: the delivery queue.
    pub queue_url: String,
    /// `WEBHOOKS_DLQ_URL`: the dead-letter queue.
    pub dlq_url: String,
    /// `WEBHOOKS_RETRY_SCHEDULE` + `WEBHOOKS_MAX_ATTEMPTS`.
    pub retry: RetryPolicy,
    /// `WEBHOOKS_DELIVERY_TIMEOUT` (default 15s): one POST, connect to last byte.
    pub delivery_timeout: Duration,
    /// `WEBHOOKS_ALLOW_PRIVATE_ENDPOINTS` (default false): allow loopback and
    /// private addresses (local runs only).
    pub allow_private_endpoints: bool,
    /// `WEBHOOKS_MAX_PAYLOAD_BYTES` (default 262144): largest accepted event payload.
    pub max_payload_bytes: usize,
    /// `WEBHOOKS_RETENTION_DAYS` (default 30): events and deliveries expire (TTL).
    pub retention: Duration,
    /// `WEBHOOKS_ENDPOINT_CACHE_TTL` (default 30s): deliver's endpoint cache.
    pub endpoint_cache_ttl: Duration,
    /// `WEBHOOKS_SECRET_ROTATION_OVERLAP` (default 24h): old secret keeps signing.
    pub rotation_overlap: Duration,
    /// `WEBHOOKS_DELIVER_CONCURRENCY` (default 10, 1..=100): POSTs one deliver
    /// invocation makes at once (an SQS batch is at most 10 messages).
    pub deliver_concurrency: usize,
    /// `WEBHOOKS_RECONCILE_AFTER` (default 15m): a pending delivery due
    /// longer ago than this, never picked up, lost its queue message; the
    /// reconciler queues it again. At least the deliver function's timeout
    /// and twice the delivery timeout (an attempt in progress is never taken
    /// for lost).
    pub reconcile_after: Duration,
    /// `WEBHOOKS_RECONCILE_INTERVAL` (default 5m): how often the reconciler
    /// runs (the template's schedule; the local stack's timer).
    pub reconcile_interval: Duration,
    /// `WEBHOOKS_KMS_KEY_ID`: the KMS key that seals endpoint secrets at rest
    /// (envelope encryption; the template creates it). Unset: secrets are
    /// stored in plaintext (unit tests only; every stack sets it).
    pub kms_key_id: Option<String>,
    /// `WEBHOOKS_DELIVER_FUNCTION_TIMEOUT` (default 30s): the deliver
    /// function's timeout; a full batch of POSTs must fit in it.
    pub deliver_function_timeout: Duration,
}

/// SQS batch size of the deliver function (template.yaml).
const DELIVER_BATCH: usize = 10;

impl Settings {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self, PipelineError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads settings through `lookup` (tests pass a map).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, PipelineError> {
        let get = |k: &str| {
            lookup(k)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let duration = |k: &str, default: Duration| -> Result<Duration, PipelineError> {
            match get(k) {
                Some(v) => {
                    parse_duration(&v).map_err(|e| PipelineError::Config(format!("{k}: {e}")))
                }
                None => Ok(default),
            }
        };
        let retry = RetryPolicy::from_settings(
            get("WEBHOOKS_RETRY_SCHEDULE").as_deref(),
            get("WEBHOOKS_MAX_ATTEMPTS").as_deref(),
        )
        .map_err(|e| PipelineError::Config(e.to_string()))?;
        let allow_private_endpoints = match get("WEBHOOKS_ALLOW_PRIVATE_ENDPOINTS").as_deref() {
            None | Some("false") | Some("0") | Some("no") => false,
            Some("true") | Some("1") | Some("yes") => true,
            Some(other) => {
                return Err(PipelineError::Config(format!(
                    "WEBHOOKS_ALLOW_PRIVATE_ENDPOINTS: `{other}` is not true/false"
                )))
            }
        };
        let max_payload_bytes = match get("WEBHOOKS_MAX_PAYLOAD_BYTES") {
            Some(v) => v.parse().map_err(|_| {
                PipelineError::Config(format!("WEBHOOKS_MAX_PAYLOAD_BYTES: `{v}` is not a number"))
            })?,
            None => 256 * 1024,
        };
        let retention_days: u64 = match get("WEBHOOKS_RETENTION_DAYS") {
            Some(v) => v.parse().map_err(|_| {
                PipelineError::Config(format!("WEBHOOKS_RETENTION_DAYS: `{v}` is not a number"))
            })?,
            None => 30,
        };
        let deliver_concurrency = match get("WEBHOOKS_DELIVER_CONCURRENCY") {
            Some(v) => v
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=100).contains(n))
                .ok_or_else(|| {
                    PipelineError::Config(format!(
                        "WEBHOOKS_DELIVER_CONCURRENCY: `{v}` is not in 1..=100"
                    ))
                })?,
            None => 10,
        };
        let settings = Self {
            deliver_concurrency,
            table: get("WEBHOOKS_TABLE").unwrap_or_else(|| "hookline".into()),
            queue_url: get("WEBHOOKS_QUEUE_URL").unwrap_or_default(),
            dlq_url: get("WEBHOOKS_DLQ_URL").unwrap_or_default(),
            retry,
            delivery_timeout: duration("WEBHOOKS_DELIVERY_TIMEOUT", Duration::from_secs(15))?,
            allow_private_endpoints,
            max_payload_bytes,
            retention: Duration::from_secs(retention_days * 86_400),
            endpoint_cache_ttl: duration("WEBHOOKS_ENDPOINT_CACHE_TTL", Duration::from_secs(30))?,
            rotation_overlap: duration(
                "WEBHOOKS_SECRET_ROTATION_OVERLAP",
                Duration::from_secs(86_400),
            )?,
            reconcile_after: duration("WEBHOOKS_RECONCILE_AFTER", Duration::from_secs(15 * 60))?,
            kms_key_id: get("WEBHOOKS_KMS_KEY_ID"),
            reconcile_interval: duration(
                "WEBHOOKS_RECONCILE_INTERVAL",
                Duration::from_secs(5 * 60),
            )?,
            deliver_function_timeout: duration(
                "WEBHOOKS_DELIVER_FUNCTION_TIMEOUT",
                Duration::from_secs(30),
            )?,
        };
        settings.validate()?;
        Ok(settings)
    }

    /// Cross-checks: every combination that could lose or stall a delivery
    /// is refused at init.
    fn validate(&self) -> Result<(), PipelineError> {
        let window = self.retry.longest_window() + self.reconcile_after * 2;
        if self.retention < window {
            return Err(PipelineError::Config(format!(
                "WEBHOOKS_RETENTION_DAYS: {} days is shorter than the longest retry window \
                 ({} h with full jitter and Retry-After, plus reconciliation): pending \
                 deliveries' events could expire",
                self.retention.as_secs() / 86_400,
                window.as_secs().div_ceil(3600)
            )));
        }
        // One invocation handles a batch of 10 in rounds of `concurrency`.
        let rounds = DELIVER_BATCH.div_ceil(self.deliver_concurrency.max(1)) as u32;
        let needed = self.delivery_timeout * rounds + Duration::from_secs(5);
        if needed > self.deliver_function_timeout {
            return Err(PipelineError::Config(format!(
                "WEBHOOKS_DELIVERY_TIMEOUT: {} s x {rounds} round(s) of POSTs + 5 s does not fit \
                 the deliver function's timeout ({} s)",
                self.delivery_timeout.as_secs(),
                self.deliver_function_timeout.as_secs()
            )));
        }
        // A message being handled (up to one deliver invocation) is never
        // taken for lost: a re-queue then would mean a second POST.
        let in_flight = self.deliver_function_timeout.max(self.delivery_timeout * 2);
        if self.reconcile_after < in_flight {
            return Err(PipelineError::Config(format!(
                "WEBHOOKS_RECONCILE_AFTER must be at least the deliver function's timeout and \
                 twice the delivery timeout ({} s)",
                in_flight.as_secs()
            )));
        }
        if self.reconcile_interval.is_zero() {
            return Err(PipelineError::Config(
                "WEBHOOKS_RECONCILE_INTERVAL must be more than 0".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn defaults_and_overrides() {
        let s = Settings::from_lookup(|_| None).unwrap();
        assert_eq!(s.retry, RetryPolicy::default());
        assert_eq!(s.delivery_timeout, Duration::from_secs(15));
        assert!(!s.allow_private_endpoints);
        assert_eq!(s.max_payload_bytes, 262_144);
        assert_eq!(s.reconcile_after, Duration::from_secs(900));
        assert_eq!(s.reconcile_interval, Duration::from_secs(300));
        assert_eq!(s.retention, Duration::from_secs(30 * 86_400));
        let env: HashMap<&str, &str> = [
            ("WEBHOOKS_RETRY_SCHEDULE", "1s,2s,4s"),
            ("WEBHOOKS_DELIVERY_TIMEOUT", "2s"),
            ("WEBHOOKS_ALLOW_PRIVATE_ENDPOINTS", "true"),
            ("WEBHOOKS_TABLE", "t1"),
        ]
        .into();
        let s = Settings::from_lookup(|k| env.get(k).map(|v| v.to_string())).unwrap();
        assert_eq!(s.retry.max_attempts, 4);
        assert_eq!(s.delivery_timeout, Duration::from_secs(2));
        assert!(s.allow_private_endpoints);
        assert_eq!(s.table, "t1");
    }

    #[test]
    fn bad_values_are_config_errors() {
        for (k, v) in [
            ("WEBHOOKS_RETRY_SCHEDULE", "soon"),
            ("WEBHOOKS_MAX_ATTEMPTS", "0"),
            ("WEBHOOKS_DELIVERY_TIMEOUT", "fast"),
            ("WEBHOOKS_ALLOW_PRIVATE_ENDPOINTS", "maybe"),
            ("WEBHOOKS_MAX_PAYLOAD_BYTES", "big"),
            ("WEBHOOKS_DELIVER_CONCURRENCY", "0"),
            ("WEBHOOKS_RECONCILE_AFTER", "soon"),
            // Shorter than the seed schedule's worst case (10 x 6 h).
            ("WEBHOOKS_RETENTION_DAYS", "2"),
            // 29 s of POST + margin does not fit a 30 s function.
            ("WEBHOOKS_DELIVERY_TIMEOUT", "29s"),
            ("WEBHOOKS_RECONCILE_AFTER", "20s"),
            ("WEBHOOKS_RECONCILE_INTERVAL", "0s"),
        ] {
            let err = Settings::from_lookup(|key| (key == k).then(|| v.to_string())).unwrap_err();
            assert!(matches!(err, PipelineError::Config(_)), "{k}");
        }
    }
}
