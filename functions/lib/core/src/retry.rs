//! When to try again: the retry policy, `Retry-After`, and response classes.
//!
//! The default is the seed's schedule: the first attempt, then retries after
//! 30 s, 1, 2, 4, 8, 16, 32, 64, 128 and 256 min (doubling, capped at 256 min),
//! each with ±20 % jitter: 10 retries over ~8.5 h, 11 attempts in all. (The
//! seed's code stops after 10 attempts, which uses delays only up to 128 min,
//! ~4.3 h, contradicting its own "256 min" and "~8 h"; we keep the figures.)

use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};
use rand::Rng;

use crate::CoreError;

/// A sequence of delays between attempts.
#[derive(Debug, Clone, PartialEq)]
pub enum Schedule {
    /// `base * 2^(n-1)` after the n-th failed attempt, at most `cap`.
    Exponential { base: Duration, cap: Duration },
    /// Explicit delays; after the list runs out the last one repeats.
    Fixed(Vec<Duration>),
}

impl Schedule {
    /// The seed's schedule: 30 s doubling, capped at 256 min.
    pub fn seed() -> Self {
        Self::Exponential {
            base: Duration::from_secs(30),
            cap: Duration::from_secs(256 * 60),
        }
    }

    /// Parses a comma-separated list like `"5s,5m,30m,2h,5h,10h,10h"` (units
    /// `ms`, `s`, `m`, `h`, `d`; a bare number is seconds).
    pub fn parse(text: &str) -> Result<Self, CoreError> {
        let delays = text
            .split(',')
            .map(|item| parse_duration(item.trim()))
            .collect::<Result<Vec<_>, _>>()?;
        if delays.is_empty() {
            return Err(CoreError::InvalidSchedule("no delays".into()));
        }
        if delays.len() > 100 {
            return Err(CoreError::InvalidSchedule("more than 100 delays".into()));
        }
        Ok(Self::Fixed(delays))
    }

    /// The un-jittered delay after the `failed_attempt`-th attempt (1-based).
    pub fn base_delay(&self, failed_attempt: u32) -> Duration {
        let n = failed_attempt.max(1);
        match self {
            Self::Exponential { base, cap } => {
                let factor = 2u32.checked_pow(n - 1).unwrap_or(u32::MAX);
                base.checked_mul(factor).unwrap_or(*cap).min(*cap)
            }
            Self::Fixed(delays) => {
                let idx = usize::try_from(n - 1)
                    .unwrap_or(usize::MAX)
                    .min(delays.len() - 1);
                delays[idx]
            }
        }
    }

    /// Number of delays in the schedule proper (10 for the seed's).
    pub fn natural_len(&self) -> u32 {
        match self {
            Self::Exponential { base, cap } => {
                let mut n = 1;
                while self.base_delay(n) < *cap && n < 64 && !base.is_zero() {
                    n += 1;
                }
                n
            }
            Self::Fixed(delays) => u32::try_from(delays.len()).unwrap_or(u32::MAX),
        }
    }
}

/// Parses one duration: `500ms`, `30s`, `5m`, `2h`, `1d`, or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, CoreError> {
    let bad = || CoreError::InvalidSchedule(format!("`{text}` is not a duration like 30s, 5m, 2h"));
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    if digits.is_empty() || digits.len() > 9 {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "" | "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n * 60),
        "h" => Duration::from_secs(n * 3600),
        "d" => Duration::from_secs(n * 86_400),
        _ => return Err(bad()),
    };
    Ok(d)
}

/// How many times and how far apart a delivery is attempted.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    pub schedule: Schedule,
    /// Attempts in all, the first included (so retries = `max_attempts - 1`).
    pub max_attempts: u32,
    /// Relative jitter: each delay is multiplied by a factor in `[1-j, 1+j)`.
    pub jitter: f64,
    /// `Retry-After` is honoured up to this long; never shorter than the schedule.
    pub retry_after_max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            schedule: Schedule::seed(),
            max_attempts: 11,
            jitter: 0.2,
            retry_after_max: Duration::from_secs(6 * 3600),
        }
    }
}

impl RetryPolicy {
    /// A policy from its text settings (the `WEBHOOKS_RETRY_SCHEDULE` and
    /// `WEBHOOKS_MAX_ATTEMPTS` variables): an empty schedule means the seed's,
    /// a missing max means "first attempt + one retry per listed delay".
    pub fn from_settings(
        schedule: Option<&str>,
        max_attempts: Option<&str>,
    ) -> Result<Self, CoreError> {
        let schedule = match schedule.map(str::trim).filter(|s| !s.is_empty()) {
            Some(text) => Schedule::parse(text)?,
            None => Schedule::seed(),
        };
        let max_attempts = match max_attempts.map(str::trim).filter(|s| !s.is_empty()) {
            Some(text) => text
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=100).contains(n))
                .ok_or_else(|| {
                    CoreError::InvalidSchedule(format!("max attempts `{text}` is not 1..=100"))
                })?,
            None => schedule.natural_len() + 1,
        };
        Ok(Self {
            schedule,
            max_attempts,
            ..Self::default()
        })
    }

    /// Whether another attempt may follow the `attempt`-th (1-based).
    pub fn has_attempts_left(&self, attempt: u32) -> bool {
        attempt < self.max_attempts
    }

    /// The delay after the `failed_attempt`-th attempt failed, or `None` when
    /// the budget is spent. `retry_after` (from the response) lengthens the
    /// delay up to `retry_after_max`; it never shortens it.
    pub fn next_delay<R: Rng + ?Sized>(
        &self,
        failed_attempt: u32,
        retry_after: Option<Duration>,
        rng: &mut R,
    ) -> Option<Duration> {
        if !self.has_attempts_left(failed_attempt) {
            return None;
        }
        let base = self.schedule.base_delay(failed_attempt);
        let jitter = self.jitter.clamp(0.0, 1.0);
        let factor = if jitter > 0.0 {
            1.0 + rng.gen_range(-jitter..jitter)
        } else {
            1.0
        };
        let delay = base.mul_f64(factor);
        Some(match retry_after {
            Some(asked) => delay.max(asked.min(self.retry_after_max)),
            None => delay,
        })
    }

    /// The longest a delivery can stay pending on its own: every delay at
    /// its largest (full jitter, or the longest `Retry-After` honoured).
    /// Retention must be longer, or data could expire while still due.
    pub fn longest_window(&self) -> Duration {
        let jitter = self.jitter.clamp(0.0, 1.0);
        (1..self.max_attempts)
            .map(|n| {
                self.schedule
                    .base_delay(n)
                    .mul_f64(1.0 + jitter)
                    .max(self.retry_after_max)
            })
            .sum()
    }

    /// How long the schedule of a delivery that made `attempts_made`
    /// attempts of its budget runs from its next attempt on: the
    /// un-jittered delays after each attempt it has left but the last. A
    /// delivery held back (its endpoint's circuit open) waits no longer
    /// than this.
    pub fn remaining_window(&self, attempts_made: u32) -> Duration {
        (attempts_made.saturating_add(1)..self.max_attempts)
            .map(|n| self.schedule.base_delay(n))
            .sum()
    }

    /// Sum of un-jittered delays over the whole budget.
    pub fn total_window(&self) -> Duration {
        (1..self.max_attempts)
            .map(|n| self.schedule.base_delay(n))
            .sum()
    }
}

/// Parses a `Retry-After` value: delay-seconds or an HTTP date (all three
/// formats of RFC 9110). A date in the past is a zero delay. Invalid -> `None`.
pub fn parse_retry_after(value: &str, now: DateTime<Utc>) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return Some(match value.parse::<u64>() {
            Ok(secs) => Duration::from_secs(secs),
            Err(_) => Duration::MAX,
        });
    }
    let at = httpdate::parse_http_date(value).ok()?;
    let now: SystemTime = now.into();
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// What a response (or the lack of one) means for the delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseClass {
    /// 2xx: delivered.
    Success,
    /// Anything else, timeouts and connection errors included: try again.
    Retryable,
    /// 410 Gone: the receiver says the endpoint no longer exists: stop and
    /// disable the endpoint.
    Gone,
}

/// Classifies an HTTP status; `None` means no response (timeout, refused, reset).
pub fn classify(status: Option<u16>) -> ResponseClass {
    match status {
        Some(200..=299) => ResponseClass::Success,
        Some(410) => ResponseClass::Gone,
        _ => ResponseClass::Retryable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn min(n: u64) -> Duration {
        Duration::from_secs(n * 60)
    }

    #[test]
    fn seed_schedule_matches_the_article() {
        let p = RetryPolicy::default();
        let delays: Vec<Duration> = (1..=10).map(|n| p.schedule.base_delay(n)).collect();
        assert_eq!(
            delays,
            vec![
                Duration::from_secs(30),
                min(1),
                min(2),
                min(4),
                min(8),
                min(16),
                min(32),
                min(64),
                min(128),
                min(256)
            ]
        );
        // Cap holds far past the end.
        assert_eq!(p.schedule.base_delay(11), min(256));
        assert_eq!(p.schedule.base_delay(40), min(256));
        assert_eq!(p.schedule.base_delay(u32::MAX), min(256));
        assert_eq!(p.schedule.natural_len(), 10);
        assert_eq!(p.max_attempts, 11);
        // ~8.5 h in all.
        assert_eq!(p.total_window(), Duration::from_secs(30) + min(511));
    }

    #[test]
    fn first_attempt_edge_and_budget_exhaustion() {
        let p = RetryPolicy {
            jitter: 0.0,
            ..RetryPolicy::default()
        };
        let mut rng = StdRng::seed_from_u64(0);
        assert_eq!(p.schedule.base_delay(0), Duration::from_secs(30));
        assert_eq!(
            p.next_delay(1, None, &mut rng),
            Some(Duration::from_secs(30))
        );
        assert_eq!(p.next_delay(10, None, &mut rng), Some(min(256)));
        assert_eq!(p.next_delay(11, None, &mut rng), None);
        assert_eq!(p.next_delay(12, None, &mut rng), None);
    }

    #[test]
    fn jitter_stays_within_twenty_percent() {
        let p = RetryPolicy::default();
        let mut rng = StdRng::seed_from_u64(42);
        let (mut lo, mut hi) = (f64::MAX, 0.0f64);
        for _ in 0..5000 {
            for n in [1, 5, 10] {
                let d = p.next_delay(n, None, &mut rng).unwrap().as_secs_f64();
                let base = p.schedule.base_delay(n).as_secs_f64();
                let r = d / base;
                assert!((0.8..1.2).contains(&r), "ratio {r}");
                lo = lo.min(r);
                hi = hi.max(r);
            }
        }
        // The jitter really spreads (not a constant factor).
        assert!(lo < 0.82 && hi > 1.18, "{lo} {hi}");
    }

    #[test]
    fn parsed_schedule_and_settings() {
        let s = Schedule::parse("5s,5m,30m,2h,5h,10h,10h").unwrap();
        assert_eq!(s.base_delay(1), Duration::from_secs(5));
        assert_eq!(s.base_delay(4), Duration::from_secs(7200));
        assert_eq!(s.base_delay(7), Duration::from_secs(36_000));
        assert_eq!(s.base_delay(99), Duration::from_secs(36_000));
        let p = RetryPolicy::from_settings(Some("1s,2s,4s"), None).unwrap();
        assert_eq!(p.max_attempts, 4);
        let p = RetryPolicy::from_settings(Some("1s, 2s ,500ms"), Some("6")).unwrap();
        assert_eq!(p.max_attempts, 6);
        assert_eq!(p.schedule.base_delay(3), Duration::from_millis(500));
        assert_eq!(p.schedule.base_delay(5), Duration::from_millis(500));
        let p = RetryPolicy::from_settings(None, None).unwrap();
        assert_eq!(p, RetryPolicy::default());
        let p = RetryPolicy::from_settings(Some(""), Some("")).unwrap();
        assert_eq!(p, RetryPolicy::default());
        for bad in [
            "",
            "5x",
            "s",
            "1s,,2s",
            "-1s",
            "1.5s",
            "9999999999s",
            "1h30m",
        ] {
            assert!(Schedule::parse(bad).is_err(), "{bad}");
        }
        for bad in ["0", "101", "ten", "-1"] {
            assert!(
                RetryPolicy::from_settings(None, Some(bad)).is_err(),
                "{bad}"
            );
        }
        assert_eq!(parse_duration("1d").unwrap(), Duration::from_secs(86_400));
        assert_eq!(parse_duration("15").unwrap(), Duration::from_secs(15));
    }

    #[test]
    fn retry_after_lengthens_but_never_shortens_and_is_capped() {
        let p = RetryPolicy {
            jitter: 0.0,
            ..RetryPolicy::default()
        };
        let mut rng = StdRng::seed_from_u64(0);
        // Shorter than the schedule: the schedule wins (never hammer).
        assert_eq!(
            p.next_delay(3, Some(Duration::from_secs(1)), &mut rng),
            Some(min(2))
        );
        // Longer: honoured.
        assert_eq!(p.next_delay(1, Some(min(10)), &mut rng), Some(min(10)));
        // Absurd: clamped to retry_after_max.
        assert_eq!(
            p.next_delay(1, Some(Duration::MAX), &mut rng),
            Some(Duration::from_secs(6 * 3600))
        );
        // Exactly at the bound.
        assert_eq!(
            p.next_delay(1, Some(Duration::from_secs(6 * 3600)), &mut rng),
            Some(Duration::from_secs(6 * 3600))
        );
        // Budget spent: Retry-After does not buy another attempt.
        assert_eq!(p.next_delay(11, Some(min(1)), &mut rng), None);
    }

    #[test]
    fn retry_after_parsing() {
        let now = Utc.with_ymd_and_hms(2015, 10, 21, 7, 28, 0).unwrap();
        assert_eq!(
            parse_retry_after("120", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(parse_retry_after(" 0 ", now), Some(Duration::ZERO));
        assert_eq!(
            parse_retry_after("99999999999999999999999", now),
            Some(Duration::MAX)
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:30:00 GMT", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            parse_retry_after("Wednesday, 21-Oct-15 07:29:00 GMT", now),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            parse_retry_after("Wed Oct 21 07:28:30 2015", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        for bad in ["", "-5", "1.5", "soon", "Wed, 32 Oct 2015 07:00:00 GMT"] {
            assert_eq!(parse_retry_after(bad, now), None, "{bad}");
        }
    }

    #[test]
    fn classification() {
        for s in [200, 201, 202, 204, 299] {
            assert_eq!(classify(Some(s)), ResponseClass::Success);
        }
        for s in [
            100, 301, 302, 304, 400, 401, 403, 404, 408, 409, 429, 500, 502, 503, 504, 599,
        ] {
            assert_eq!(classify(Some(s)), ResponseClass::Retryable, "{s}");
        }
        assert_eq!(classify(Some(410)), ResponseClass::Gone);
        assert_eq!(classify(None), ResponseClass::Retryable);
    }

    proptest::proptest! {
        #[test]
        fn delays_are_bounded(n in 0u32..200, seed in proptest::prelude::any::<u64>(), ra in proptest::option::of(0u64..100_000)) {
            let p = RetryPolicy::default();
            let mut rng = StdRng::seed_from_u64(seed);
            if let Some(d) = p.next_delay(n, ra.map(Duration::from_secs), &mut rng) {
                proptest::prop_assert!(d <= min(256).mul_f64(1.2).max(p.retry_after_max));
                proptest::prop_assert!(d >= Duration::from_secs(24));
            }
        }
    }
}
