//! Endpoint statistics: what deliver adds up per endpoint and hour, and the
//! summary `GET .../endpoints/{id}/stats` answers from those hours.
//!
//! Deliver keeps a [`StatsDelta`] per endpoint while it handles a batch and
//! adds it to the endpoint's hour with one counter update per endpoint and
//! batch; a stats request reads the hours since `since` (at most one item per
//! hour) and [`summarize`]s them. Latency is a histogram over
//! [`LATENCY_BUCKETS`] log-spaced buckets (each bound 1.25x the previous):
//! a percentile is answered as its bucket's upper bound, at most 25 % above
//! the true value.

use std::collections::BTreeMap;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use serde::Serialize;

/// Latency histogram buckets: bucket `i` holds latencies up to
/// [`bucket_bound_ms`]`(i)`; the last one also holds everything longer.
pub const LATENCY_BUCKETS: usize = 48;

/// Upper bound (ms) of latency bucket `i`: `ceil(1.25^i)`.
pub fn bucket_bound_ms(i: usize) -> u64 {
    let exp = i32::try_from(i.min(LATENCY_BUCKETS - 1)).expect("bucket index is small");
    // At most 1.25^47 (about 36 000): exact enough in f64, fits u64.
    1.25f64.powi(exp).ceil() as u64
}

/// The bucket of a latency.
pub fn latency_bucket(ms: u64) -> usize {
    (0..LATENCY_BUCKETS)
        .find(|&i| ms <= bucket_bound_ms(i))
        .unwrap_or(LATENCY_BUCKETS - 1)
}

/// The start of the hour holding `at` (stats are kept per hour).
pub fn hour_of(at: DateTime<Utc>) -> DateTime<Utc> {
    at.duration_trunc(TimeDelta::hours(1))
        .expect("an hour divides every representable time")
}

/// Counts for one endpoint over some time (an hour, or a batch's share of
/// it). `waiting` is a change of the gauge of deliveries waiting for a retry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsDelta {
    /// Deliveries that ended delivered.
    pub delivered: u64,
    /// Deliveries that ended failed.
    pub failed: u64,
    /// Requests sent (every attempt that reached the network).
    pub attempts: u64,
    /// Of those, answered 2xx.
    pub attempts_ok: u64,
    /// Attempt latencies: bucket index -> count.
    pub latency: BTreeMap<usize, u64>,
    /// Change of the number of deliveries waiting for a retry.
    pub waiting: i64,
}

impl StatsDelta {
    /// One sent request and its latency.
    pub fn attempt(&mut self, ok: bool, latency_ms: u64) {
        self.attempts += 1;
        if ok {
            self.attempts_ok += 1;
        }
        *self.latency.entry(latency_bucket(latency_ms)).or_default() += 1;
    }

    /// Adds `other` to this.
    pub fn merge(&mut self, other: &StatsDelta) {
        self.delivered += other.delivered;
        self.failed += other.failed;
        self.attempts += other.attempts;
        self.attempts_ok += other.attempts_ok;
        for (bucket, n) in &other.latency {
            *self.latency.entry(*bucket).or_default() += n;
        }
        self.waiting += other.waiting;
    }

    /// Nothing to add.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// Latency percentiles (ms); `None` without attempts.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Percentiles {
    pub p50: Option<u64>,
    pub p95: Option<u64>,
    pub p99: Option<u64>,
}

/// One hour of an endpoint's stats (the dashboard's chart).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HourStats {
    /// Start of the hour.
    pub hour: DateTime<Utc>,
    pub delivered: u64,
    pub failed: u64,
    pub attempts: u64,
    pub attempts_ok: u64,
}

/// The answer of `GET .../endpoints/{id}/stats`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EndpointStats {
    /// Start of the first hour counted (`since`, rounded down to the hour).
    pub since: DateTime<Utc>,
    /// Deliveries that ended delivered since then.
    pub delivered: u64,
    /// Deliveries that ended failed since then.
    pub failed: u64,
    /// Deliveries waiting for a retry now (a first attempt in flight is not
    /// counted).
    pub pending: u64,
    /// delivered / (delivered + failed); `None` when none ended.
    pub success_rate: Option<f64>,
    /// Requests sent, and how many were answered 2xx.
    pub attempts: u64,
    pub attempts_ok: u64,
    /// Of the requests sent.
    pub latency_ms: Percentiles,
    /// The hours with any activity, oldest first.
    pub hours: Vec<HourStats>,
}

/// The summary of an endpoint's hours since `since`, with its waiting gauge.
pub fn summarize(
    since: DateTime<Utc>,
    hours: &[(DateTime<Utc>, StatsDelta)],
    waiting: i64,
) -> EndpointStats {
    let mut total = StatsDelta::default();
    for (_, hour) in hours {
        total.merge(hour);
    }
    let ended = total.delivered + total.failed;
    let percentile = |p: f64| -> Option<u64> {
        let count: u64 = total.latency.values().sum();
        if count == 0 {
            return None;
        }
        // The rank of the p-th percentile (nearest rank, 1-based).
        let rank = ((p * count as f64).ceil() as u64).clamp(1, count);
        let mut seen = 0;
        total.latency.iter().find_map(|(bucket, n)| {
            seen += n;
            (seen >= rank).then(|| bucket_bound_ms(*bucket))
        })
    };
    EndpointStats {
        since: hour_of(since),
        delivered: total.delivered,
        failed: total.failed,
        pending: u64::try_from(waiting.max(0)).expect("non-negative"),
        success_rate: (ended > 0).then(|| total.delivered as f64 / ended as f64),
        attempts: total.attempts,
        attempts_ok: total.attempts_ok,
        latency_ms: Percentiles {
            p50: percentile(0.50),
            p95: percentile(0.95),
            p99: percentile(0.99),
        },
        hours: hours
            .iter()
            .map(|(hour, d)| HourStats {
                hour: *hour,
                delivered: d.delivered,
                failed: d.failed,
                attempts: d.attempts,
                attempts_ok: d.attempts_ok,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_log_spaced_and_cover_every_latency() {
        assert_eq!(bucket_bound_ms(0), 1);
        assert_eq!(latency_bucket(0), 0);
        assert_eq!(latency_bucket(1), 0);
        for ms in [2, 7, 100, 101, 999, 5_000, 29_999] {
            let b = latency_bucket(ms);
            assert!(ms <= bucket_bound_ms(b), "{ms} in {b}");
            assert!(b == 0 || ms > bucket_bound_ms(b - 1), "{ms} in {b}");
            // Within 25 % (plus rounding up to a whole ms).
            assert!(bucket_bound_ms(b) as f64 <= ms as f64 * 1.25 + 1.0, "{ms}");
        }
        assert_eq!(latency_bucket(10_000_000), LATENCY_BUCKETS - 1);
    }

    #[test]
    fn summary_adds_the_hours_and_reads_percentiles_from_the_histogram() {
        let mut a = StatsDelta::default();
        for ms in 1..=90 {
            a.attempt(true, 10 + ms % 3);
        }
        a.delivered = 90;
        let mut b = StatsDelta::default();
        for _ in 0..10 {
            b.attempt(false, 400);
        }
        b.failed = 2;
        b.waiting = 3;
        let since: DateTime<Utc> = "2026-12-03T10:20:00Z".parse().unwrap();
        let h10 = since - TimeDelta::minutes(20);
        let s = summarize(since, &[(h10, a), (h10 + TimeDelta::hours(1), b)], 3);
        assert_eq!(s.hours.len(), 2);
        assert_eq!((s.hours[1].attempts, s.hours[1].failed), (10, 2));
        assert_eq!(s.since.to_rfc3339(), "2026-12-03T10:00:00+00:00");
        assert_eq!((s.delivered, s.failed, s.pending), (92 - 2, 2, 3));
        assert_eq!((s.attempts, s.attempts_ok), (100, 90));
        assert_eq!(s.success_rate, Some(90.0 / 92.0));
        let p50 = s.latency_ms.p50.unwrap();
        assert!((12..=15).contains(&p50), "{p50}");
        let p95 = s.latency_ms.p95.unwrap();
        assert!((400..=500).contains(&p95), "{p95}");
        assert_eq!(s.latency_ms.p99, Some(p95));
        let empty = summarize(since, &[], -1);
        assert_eq!(
            (empty.pending, empty.success_rate, empty.latency_ms.p50),
            (0, None, None)
        );
    }
}
