//! Configuration from `WEBHOOKS_*` environment variables: the same names in
//! `template.yaml`, `events/env.local.json` and the local stack. Read once,
//! at init, into one typed [`Settings`]: a missing required variable or a
//! bad value fails the cold start with a [`ConfigError`] naming it; nothing
//! else in the functions reads the environment.

use std::time::Duration;

use hookline_core::retry::{parse_duration, RetryPolicy};

/// A SHA-256 of a secret (never printed).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct KeyHash(pub [u8; 32]);

impl KeyHash {
    pub fn of(secret: &str) -> Self {
        use sha2::{Digest, Sha256};
        Self(Sha256::digest(secret.as_bytes()).into())
    }
}

impl std::fmt::Debug for KeyHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyHash(..)")
    }
}

/// A configuration problem found at init.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{var} is required and not set")]
    Missing { var: &'static str },
    #[error("{var}: {reason}")]
    Invalid { var: &'static str, reason: String },
    /// Values that are fine alone but together could lose or stall a delivery.
    #[error("{var}: {reason}")]
    Inconsistent { var: &'static str, reason: String },
}

/// The most `WEBHOOKS_MAX_ENDPOINTS_PER_APP` can be: a keyed event's
/// idempotency record lists every delivery id (about 30 bytes each), and
/// 5,000 of them keep it near 150 KB, well inside DynamoDB's 400 KB item.
pub const MAX_ENDPOINTS_PER_APP_CEILING: u32 = 5_000;

/// Every setting the functions read. Required: `WEBHOOKS_TABLE`,
/// `WEBHOOKS_QUEUE_URL`, `WEBHOOKS_DLQ_URL`, `WEBHOOKS_KMS_KEY_ID`; the
/// others have the defaults documented on each field.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `WEBHOOKS_TABLE` (required): the DynamoDB table.
    pub table: String,
    /// `WEBHOOKS_QUEUE_URL` (required): the delivery queue.
    pub queue_url: String,
    /// `WEBHOOKS_DLQ_URL` (required): the dead-letter queue.
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
    /// `WEBHOOKS_CATALOG_CACHE_TTL` (default 10s): how long ingest keeps an
    /// event type's schema (a change through another instance applies
    /// within this time; through the same one at once).
    pub catalog_cache_ttl: Duration,
    /// `WEBHOOKS_PORTAL_URL` (optional): the consumer portal page a portal
    /// session's `url` opens (say, on the provider's own domain); by
    /// default this API's `/portal` as the request reached it.
    pub portal_url: Option<String>,
    /// `WEBHOOKS_SECRET_ROTATION_OVERLAP` (default 24h): old secret keeps signing.
    pub rotation_overlap: Duration,
    /// `WEBHOOKS_DISABLE_AFTER` (default 5d): an endpoint whose attempts have
    /// all failed for this long, with no 2xx in between, is disabled.
    pub disable_after: Duration,
    /// `WEBHOOKS_DELIVER_CONCURRENCY` (default 10, 1..=100): POSTs one deliver
    /// invocation makes at once (an SQS batch is at most 10 messages).
    pub deliver_concurrency: usize,
    /// `WEBHOOKS_MAX_ENDPOINTS_PER_APP` (default 100, at most
    /// [`MAX_ENDPOINTS_PER_APP_CEILING`]): creating one more endpoint is
    /// refused (409 `too_many_endpoints`). An event fans out to every
    /// endpoint of its app, so this bounds what one event costs.
    pub max_endpoints_per_app: u32,
    /// `WEBHOOKS_RECONCILE_AFTER` (default 15m): a pending delivery due
    /// longer ago than this, never picked up, lost its queue message; the
    /// reconciler queues it again. At least the deliver function's timeout
    /// and twice the delivery timeout (an attempt in progress is never taken
    /// for lost).
    pub reconcile_after: Duration,
    /// `WEBHOOKS_RECONCILE_INTERVAL` (default 5m): how often the reconciler
    /// runs (the template's schedule; the local stack's timer).
    pub reconcile_interval: Duration,
    /// `WEBHOOKS_REPLAY_INLINE_BUDGET` (default 5s, at most 20s): how long
    /// the replay route advances a replay before answering; the rest of the
    /// window continues in the background (0: all of it).
    pub replay_inline_budget: Duration,
    /// `WEBHOOKS_KMS_KEY_ID` (required): the KMS key that seals endpoint
    /// secrets at rest (envelope encryption; the template creates it).
    /// `None` only in [`Settings::for_tests`] (in-memory stores).
    pub kms_key_id: Option<String>,
    /// `WEBHOOKS_DELIVER_FUNCTION_TIMEOUT` (default 30s): the deliver
    /// function's timeout; a full batch of POSTs must fit in it.
    pub deliver_function_timeout: Duration,
    /// `WEBHOOKS_AWS_ENDPOINT_URL` (default none): send AWS calls there
    /// instead of AWS (moto, for `sam local invoke`); empty when deployed.
    pub aws_endpoint_url: Option<String>,
    /// `WEBHOOKS_SERIALIZE_DYNAMODB` (default false): one DynamoDB call at a
    /// time (moto loses writes under concurrent transactions).
    pub serialize_dynamodb: bool,
    /// The admin API key's SHA-256, from `WEBHOOKS_ADMIN_KEY_SHA256` (hex;
    /// what a deployment stores) or `WEBHOOKS_ADMIN_KEY` (the key itself;
    /// local runs). None: only app-scoped keys work.
    pub admin_key_sha256: Option<KeyHash>,
    /// Write CloudWatch EMF metric lines: inside Lambda
    /// (`AWS_LAMBDA_FUNCTION_NAME` set) or `WEBHOOKS_EMF_METRICS=true`.
    pub emf_metrics: bool,
}

/// SQS batch size of the deliver function (template.yaml).
const DELIVER_BATCH: usize = 10;

/// The environment, read through a lookup, with typed errors (also for the
/// example receiver's own settings).
#[derive(Debug)]
pub struct Vars<F> {
    lookup: F,
}

impl<F: Fn(&str) -> Option<String>> Vars<F> {
    pub fn new(lookup: F) -> Self {
        Self { lookup }
    }

    /// A variable's trimmed value; blank counts as unset.
    pub fn get(&self, var: &str) -> Option<String> {
        (self.lookup)(var)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    }

    /// A variable that must be set.
    pub fn required(&self, var: &'static str) -> Result<String, ConfigError> {
        self.get(var).ok_or(ConfigError::Missing { var })
    }

    fn parsed<T>(
        &self,
        var: &'static str,
        default: T,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Result<T, ConfigError> {
        match self.get(var) {
            Some(v) => parse(&v).map_err(|reason| ConfigError::Invalid { var, reason }),
            None => Ok(default),
        }
    }

    fn duration(&self, var: &'static str, default: Duration) -> Result<Duration, ConfigError> {
        self.parsed(var, default, |v| {
            parse_duration(v).map_err(|e| e.to_string())
        })
    }

    /// `true`/`1`/`yes` or `false`/`0`/`no` (default false).
    pub fn flag(&self, var: &'static str) -> Result<bool, ConfigError> {
        self.parsed(var, false, |v| match v {
            "false" | "0" | "no" => Ok(false),
            "true" | "1" | "yes" => Ok(true),
            other => Err(format!("`{other}` is not true/false")),
        })
    }

    fn number<T: std::str::FromStr + PartialOrd>(
        &self,
        var: &'static str,
        default: T,
        range: std::ops::RangeInclusive<T>,
    ) -> Result<T, ConfigError> {
        self.parsed(var, default, |v| {
            v.parse::<T>()
                .ok()
                .filter(|n| range.contains(n))
                .ok_or_else(|| format!("`{v}` is not a number in the allowed range"))
        })
    }
}

fn admin_key<F: Fn(&str) -> Option<String>>(
    vars: &Vars<F>,
) -> Result<Option<KeyHash>, ConfigError> {
    let var = "WEBHOOKS_ADMIN_KEY_SHA256";
    if let Some(hex_hash) = vars.get(var) {
        let bytes = hex::decode(&hex_hash).map_err(|_| ConfigError::Invalid {
            var,
            reason: "not hex".into(),
        })?;
        let hash: [u8; 32] = bytes.try_into().map_err(|_| ConfigError::Invalid {
            var,
            reason: "not 32 bytes".into(),
        })?;
        return Ok(Some(KeyHash(hash)));
    }
    Ok(vars.get("WEBHOOKS_ADMIN_KEY").map(|key| KeyHash::of(&key)))
}

impl Settings {
    /// Reads the process environment (once, at init).
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads settings through `lookup` (the local stack and tests pass a map).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let vars = Vars::new(lookup);
        let retry = RetryPolicy::from_settings(
            vars.get("WEBHOOKS_RETRY_SCHEDULE").as_deref(),
            vars.get("WEBHOOKS_MAX_ATTEMPTS").as_deref(),
        )
        .map_err(|e| ConfigError::Invalid {
            var: "WEBHOOKS_RETRY_SCHEDULE / WEBHOOKS_MAX_ATTEMPTS",
            reason: e.to_string(),
        })?;
        let retention_days: u64 = vars.number("WEBHOOKS_RETENTION_DAYS", 30, 1..=3650)?;
        let settings = Self {
            table: vars.required("WEBHOOKS_TABLE")?,
            queue_url: vars.required("WEBHOOKS_QUEUE_URL")?,
            dlq_url: vars.required("WEBHOOKS_DLQ_URL")?,
            kms_key_id: Some(vars.required("WEBHOOKS_KMS_KEY_ID")?),
            retry,
            delivery_timeout: vars
                .duration("WEBHOOKS_DELIVERY_TIMEOUT", Duration::from_secs(15))?,
            allow_private_endpoints: vars.flag("WEBHOOKS_ALLOW_PRIVATE_ENDPOINTS")?,
            max_payload_bytes: vars.number(
                "WEBHOOKS_MAX_PAYLOAD_BYTES",
                256 * 1024,
                1..=usize::MAX,
            )?,
            retention: Duration::from_secs(retention_days * 86_400),
            endpoint_cache_ttl: vars
                .duration("WEBHOOKS_ENDPOINT_CACHE_TTL", Duration::from_secs(30))?,
            catalog_cache_ttl: vars
                .duration("WEBHOOKS_CATALOG_CACHE_TTL", Duration::from_secs(10))?,
            rotation_overlap: vars.duration(
                "WEBHOOKS_SECRET_ROTATION_OVERLAP",
                Duration::from_secs(86_400),
            )?,
            disable_after: vars
                .duration("WEBHOOKS_DISABLE_AFTER", Duration::from_secs(5 * 86_400))?,
            deliver_concurrency: vars.number("WEBHOOKS_DELIVER_CONCURRENCY", 10, 1..=100)?,
            max_endpoints_per_app: vars.number(
                "WEBHOOKS_MAX_ENDPOINTS_PER_APP",
                100,
                1..=MAX_ENDPOINTS_PER_APP_CEILING,
            )?,
            reconcile_after: vars
                .duration("WEBHOOKS_RECONCILE_AFTER", Duration::from_secs(15 * 60))?,
            reconcile_interval: vars
                .duration("WEBHOOKS_RECONCILE_INTERVAL", Duration::from_secs(5 * 60))?,
            replay_inline_budget: vars.duration(
                "WEBHOOKS_REPLAY_INLINE_BUDGET",
                crate::replay::INLINE_BUDGET,
            )?,
            deliver_function_timeout: vars
                .duration("WEBHOOKS_DELIVER_FUNCTION_TIMEOUT", Duration::from_secs(30))?,
            aws_endpoint_url: match vars.get("WEBHOOKS_AWS_ENDPOINT_URL") {
                Some(text) => Some(aws_endpoint_url(text)?),
                None => None,
            },
            portal_url: match vars.get("WEBHOOKS_PORTAL_URL") {
                Some(text) => Some(portal_url(&text)?),
                None => None,
            },
            serialize_dynamodb: vars.flag("WEBHOOKS_SERIALIZE_DYNAMODB")?,
            admin_key_sha256: admin_key(&vars)?,
            emf_metrics: vars.get("AWS_LAMBDA_FUNCTION_NAME").is_some()
                || vars.flag("WEBHOOKS_EMF_METRICS")?,
        };
        settings.validate()?;
        Ok(settings)
    }

    /// Settings for in-memory tests: the required names get placeholders
    /// (no KMS key), then `vars` as the environment.
    #[cfg(any(test, feature = "fakes"))]
    pub fn for_tests(vars: &[(&str, &str)]) -> Result<Self, ConfigError> {
        let mut settings = Self::from_lookup(|k| {
            vars.iter()
                .find(|(name, _)| *name == k)
                .map(|(_, v)| (*v).to_owned())
                .or_else(|| match k {
                    "WEBHOOKS_TABLE" => Some("test-table".into()),
                    "WEBHOOKS_QUEUE_URL" => Some("test-queue".into()),
                    "WEBHOOKS_DLQ_URL" => Some("test-dlq".into()),
                    "WEBHOOKS_KMS_KEY_ID" => Some("test-key".into()),
                    _ => None,
                })
        })?;
        if !vars.iter().any(|(k, _)| *k == "WEBHOOKS_KMS_KEY_ID") {
            settings.kms_key_id = None;
        }
        Ok(settings)
    }

    /// Cross-checks: every combination that could lose or stall a delivery
    /// is refused at init.
    fn validate(&self) -> Result<(), ConfigError> {
        let window = self.retry.longest_window() + self.reconcile_after * 2;
        if self.retention < window {
            return Err(ConfigError::Inconsistent {
                var: "WEBHOOKS_RETENTION_DAYS",
                reason: format!(
                    "{} days is shorter than the longest retry window \
                 ({} h with full jitter and Retry-After, plus reconciliation): pending \
                 deliveries' events could expire",
                    self.retention.as_secs() / 86_400,
                    window.as_secs().div_ceil(3600)
                ),
            });
        }
        // One invocation handles a batch of 10 in rounds of `concurrency`.
        let rounds = DELIVER_BATCH.div_ceil(self.deliver_concurrency.max(1)) as u32;
        let needed = self.delivery_timeout * rounds + Duration::from_secs(5);
        if needed > self.deliver_function_timeout {
            return Err(ConfigError::Inconsistent {
                var: "WEBHOOKS_DELIVERY_TIMEOUT",
                reason: format!(
                    "{} s x {rounds} round(s) of POSTs + 5 s does not fit \
                 the deliver function's timeout ({} s)",
                    self.delivery_timeout.as_secs(),
                    self.deliver_function_timeout.as_secs()
                ),
            });
        }
        // A message being handled (up to one deliver invocation) is never
        // taken for lost: a re-queue then would mean a second POST.
        let in_flight = self.deliver_function_timeout.max(self.delivery_timeout * 2);
        if self.reconcile_after < in_flight {
            return Err(ConfigError::Inconsistent {
                var: "WEBHOOKS_RECONCILE_AFTER",
                reason: format!(
                    "must be at least the deliver function's timeout and \
                 twice the delivery timeout ({} s)",
                    in_flight.as_secs()
                ),
            });
        }
        // API Gateway answers 504 after 29 s: the route must answer first.
        if self.replay_inline_budget > Duration::from_secs(20) {
            return Err(ConfigError::Inconsistent {
                var: "WEBHOOKS_REPLAY_INLINE_BUDGET",
                reason: "at most 20s (API Gateway's 29 s limit, plus the last step)".into(),
            });
        }
        if self.reconcile_interval.is_zero() {
            return Err(ConfigError::Inconsistent {
                var: "WEBHOOKS_RECONCILE_INTERVAL",
                reason: "must be more than 0".into(),
            });
        }
        Ok(())
    }
}

/// An AWS endpoint override: an http(s) URL with a host, kept as given.
fn aws_endpoint_url(text: String) -> Result<String, ConfigError> {
    let invalid = |reason: String| ConfigError::Invalid {
        var: "WEBHOOKS_AWS_ENDPOINT_URL",
        reason,
    };
    let url = url::Url::parse(&text).map_err(|e| invalid(format!("not a URL: {e}")))?;
    if !matches!(url.scheme(), "https" | "http") || url.host_str().is_none() {
        return Err(invalid("expected an http(s) URL with a host".into()));
    }
    Ok(text)
}

/// An absolute http(s) URL without a fragment (the session's token goes
/// there).
fn portal_url(text: &str) -> Result<String, ConfigError> {
    let invalid = |reason: &str| ConfigError::Invalid {
        var: "WEBHOOKS_PORTAL_URL",
        reason: reason.to_owned(),
    };
    let url = url::Url::parse(text.trim()).map_err(|e| invalid(&format!("not a URL: {e}")))?;
    if !matches!(url.scheme(), "https" | "http") || url.host_str().is_none() {
        return Err(invalid("expected an http(s) URL with a host"));
    }
    if url.fragment().is_some() {
        return Err(invalid(
            "must not have a #fragment (the session token goes there)",
        ));
    }
    Ok(url.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const REQUIRED: [(&str, &str); 4] = [
        ("WEBHOOKS_TABLE", "t1"),
        ("WEBHOOKS_QUEUE_URL", "q"),
        ("WEBHOOKS_DLQ_URL", "dlq"),
        ("WEBHOOKS_KMS_KEY_ID", "alias/k"),
    ];

    fn with(extra: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        Settings::from_lookup(|k| {
            extra
                .iter()
                .chain(REQUIRED.iter())
                .find(|(name, _)| *name == k)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn defaults_and_overrides() {
        let s = with(&[]).unwrap();
        assert_eq!(s.retry, RetryPolicy::default());
        assert_eq!(s.delivery_timeout, Duration::from_secs(15));
        assert!(!s.allow_private_endpoints);
        assert_eq!(s.max_payload_bytes, 262_144);
        assert_eq!(s.reconcile_after, Duration::from_secs(900));
        assert_eq!(s.reconcile_interval, Duration::from_secs(300));
        assert_eq!(s.retention, Duration::from_secs(30 * 86_400));
        assert_eq!(s.kms_key_id.as_deref(), Some("alias/k"));
        assert_eq!(s.aws_endpoint_url, None);
        assert!(!s.serialize_dynamodb && !s.emf_metrics);
        let s = with(&[
            ("WEBHOOKS_RETRY_SCHEDULE", "1s,2s,4s"),
            ("WEBHOOKS_DELIVERY_TIMEOUT", "2s"),
            ("WEBHOOKS_ALLOW_PRIVATE_ENDPOINTS", "true"),
            ("WEBHOOKS_AWS_ENDPOINT_URL", " http://127.0.0.1:5000 "),
            ("AWS_LAMBDA_FUNCTION_NAME", "deliver"),
        ])
        .unwrap();
        assert_eq!(s.retry.max_attempts, 4);
        assert_eq!(s.delivery_timeout, Duration::from_secs(2));
        assert!(s.allow_private_endpoints && s.emf_metrics);
        assert_eq!(s.table, "t1");
        assert_eq!(s.aws_endpoint_url.as_deref(), Some("http://127.0.0.1:5000"));
        for bad in ["127.0.0.1:5000", "ftp://moto", "http://"] {
            let err = with(&[("WEBHOOKS_AWS_ENDPOINT_URL", bad)]).unwrap_err();
            assert!(
                matches!(err, ConfigError::Invalid { var, .. } if var == "WEBHOOKS_AWS_ENDPOINT_URL"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn a_missing_required_variable_fails_naming_it() {
        for (var, _) in REQUIRED {
            let err = Settings::from_lookup(|k| {
                REQUIRED
                    .iter()
                    .find(|(name, _)| *name == k && *name != var)
                    .map(|(_, v)| (*v).to_owned())
            })
            .unwrap_err();
            assert!(
                matches!(err, ConfigError::Missing { var: v } if v == var),
                "{var}"
            );
            assert_eq!(err.to_string(), format!("{var} is required and not set"));
        }
        // Blank is missing too (a template parameter left empty).
        let err = with(&[("WEBHOOKS_TABLE", "  ")]).unwrap_err();
        assert!(matches!(
            err,
            ConfigError::Missing {
                var: "WEBHOOKS_TABLE"
            }
        ));
    }

    #[test]
    fn the_portal_url_is_optional_and_absolute() {
        assert_eq!(with(&[]).unwrap().portal_url, None);
        let s = with(&[("WEBHOOKS_PORTAL_URL", " https://hooks.example.com/portal ")]).unwrap();
        assert_eq!(
            s.portal_url.as_deref(),
            Some("https://hooks.example.com/portal")
        );
    }

    #[test]
    fn bad_values_are_config_errors_naming_the_variable() {
        for (k, v, inconsistent) in [
            ("WEBHOOKS_RETRY_SCHEDULE", "soon", false),
            ("WEBHOOKS_MAX_ATTEMPTS", "0", false),
            ("WEBHOOKS_DELIVERY_TIMEOUT", "fast", false),
            ("WEBHOOKS_ALLOW_PRIVATE_ENDPOINTS", "maybe", false),
            ("WEBHOOKS_MAX_PAYLOAD_BYTES", "big", false),
            ("WEBHOOKS_DELIVER_CONCURRENCY", "0", false),
            ("WEBHOOKS_RECONCILE_AFTER", "soon", false),
            ("WEBHOOKS_SERIALIZE_DYNAMODB", "sometimes", false),
            ("WEBHOOKS_PORTAL_URL", "hooks.example.com/portal", false),
            (
                "WEBHOOKS_PORTAL_URL",
                "ftp://hooks.example.com/portal",
                false,
            ),
            (
                "WEBHOOKS_PORTAL_URL",
                "https://hooks.example.com/portal#x",
                false,
            ),
            // Shorter than the seed schedule's worst case (10 x 6 h).
            ("WEBHOOKS_RETENTION_DAYS", "2", true),
            // 29 s of POST + margin does not fit a 30 s function.
            ("WEBHOOKS_DELIVERY_TIMEOUT", "29s", true),
            ("WEBHOOKS_RECONCILE_AFTER", "20s", true),
            ("WEBHOOKS_RECONCILE_INTERVAL", "0s", true),
        ] {
            let err = with(&[(k, v)]).unwrap_err();
            match err {
                ConfigError::Invalid { var, .. } if !inconsistent => {
                    assert!(var.contains(k), "{k}: {var}")
                }
                ConfigError::Inconsistent { var, .. } if inconsistent => assert_eq!(var, k),
                other => panic!("{k}={v}: {other:?}"),
            }
        }
    }
}
