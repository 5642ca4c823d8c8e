//! Per-endpoint rate limits as numbered send slots.
//!
//! A limit of `r` requests per second cuts time into slots of `1/r` s,
//! numbered from the Unix epoch: slot `k` starts at `k / r` s, so the `r`
//! slots of a wall-clock second all lie inside it. A limiter keeps one
//! number per endpoint, the next free slot; each request takes one
//! ([`reserve`]; requests gathered in one process take consecutive slots in
//! one write): the slot of `now` when the limiter is idle, else the next
//! free one. A request is sent at its slot's start, or later but still in
//! its slot's wall-clock second ([`send_deadline`]; a sender later than
//! that takes a new slot), so no wall-clock second sees more than `r`
//! requests, across every deliver instance sharing the limiter.

use chrono::{DateTime, Utc};

use crate::CoreError;

/// Highest `rate_limit` an endpoint can have (requests per second; a
/// slot is then 1 ms, the clock's resolution).
pub const MAX_RATE_LIMIT: u32 = 1_000;

/// Checks a `rate_limit`: 1 to [`MAX_RATE_LIMIT`] requests per second.
pub fn check_rate_limit(per_second: u32) -> Result<(), CoreError> {
    if (1..=MAX_RATE_LIMIT).contains(&per_second) {
        Ok(())
    } else {
        Err(CoreError::InvalidInput {
            field: "rate_limit",
            reason: format!("requests per second, 1 to {MAX_RATE_LIMIT}"),
        })
    }
}

/// The slot `now` falls in.
pub fn slot_of(now: DateTime<Utc>, per_second: u32) -> i64 {
    (now.timestamp_millis() * i64::from(per_second)).div_euclid(1000)
}

/// When slot `slot` starts.
pub fn slot_start(slot: i64, per_second: u32) -> DateTime<Utc> {
    let ms = (slot * 1000).div_euclid(i64::from(per_second.max(1)))
        + i64::from((slot * 1000).rem_euclid(i64::from(per_second.max(1))) != 0);
    DateTime::from_timestamp_millis(ms).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// Time a request sent near the end of its slot's second is given to
/// arrive within it.
pub const ARRIVAL_MARGIN_MS: i64 = 50;

/// The latest a request holding slot `slot` may still be sent: within the
/// wall-clock second the slot lies in, [`ARRIVAL_MARGIN_MS`] before its end
/// (a slot starting later than that: its first millisecond). A sender later than this (a busy
/// process, a long pause) would land in the next second next to that
/// second's own `r` requests: it takes a new slot instead.
pub fn send_deadline(slot: i64, per_second: u32) -> DateTime<Utc> {
    let start = slot_start(slot, per_second);
    let second_end = second_of(start) + chrono::TimeDelta::seconds(1);
    (second_end - chrono::TimeDelta::milliseconds(ARRIVAL_MARGIN_MS))
        .max(start + chrono::TimeDelta::milliseconds(1))
        .min(second_end)
}

/// The start of the wall-clock second `at` falls in.
pub fn second_of(at: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp(at.timestamp(), 0).unwrap_or(at)
}

/// A limiter's state: the next free slot, under the rate it was numbered for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limiter {
    pub next: i64,
    pub per_second: u32,
}

/// Takes `count` consecutive slots at `now` (at least one): from the
/// limiter's next free one, or from `now`'s slot when it is idle, new, or
/// numbered for another rate. Returns the first slot and the new state
/// (what a store writes, conditionally on the old one).
pub fn reserve(
    state: Option<Limiter>,
    per_second: u32,
    count: u32,
    now: DateTime<Utc>,
) -> (i64, Limiter) {
    let first = match state {
        Some(s) if is_busy(s, per_second, now) => s.next,
        _ => slot_of(now, per_second),
    };
    (
        first,
        Limiter {
            next: first + i64::from(count.max(1)),
            per_second,
        },
    )
}

/// Whether a limiter in state `s` is busy at `now` under `per_second`: its
/// next free slot is not in the past, so a request must queue behind it.
/// (A store tries the matching write first; see [`reserve`].)
pub fn is_busy(s: Limiter, per_second: u32, now: DateTime<Utc>) -> bool {
    s.per_second == per_second && s.next >= slot_of(now, per_second)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at_ms(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(1_800_000_000_000 + ms).unwrap()
    }

    /// A request may go late, but only within its slot's second: every
    /// slot's deadline is in the same second as its start, after it, and
    /// leaves the arrival margin when the slot starts before it.
    #[test]
    fn a_late_request_still_goes_within_its_slots_second() {
        for per_second in [1, 2, 3, 7, 10, 333, 1000] {
            let first = slot_of(at_ms(0), per_second);
            for slot in first..first + i64::from(per_second) * 2 {
                let start = slot_start(slot, per_second);
                let deadline = send_deadline(slot, per_second);
                let second_end = second_of(start) + chrono::TimeDelta::seconds(1);
                assert!(deadline <= second_end, "{per_second}/s slot {slot}");
                assert!(deadline > start);
                if start < second_end - chrono::TimeDelta::milliseconds(ARRIVAL_MARGIN_MS) {
                    assert_eq!(
                        deadline,
                        second_end - chrono::TimeDelta::milliseconds(ARRIVAL_MARGIN_MS)
                    );
                }
            }
        }
        // 2 per second: slots at .0 and .5 may go until .95.
        let slot = slot_of(at_ms(500), 2);
        assert_eq!(send_deadline(slot, 2), at_ms(950));
        assert_eq!(send_deadline(slot - 1, 2), at_ms(950));
    }

    /// However the requests come, no wall-clock second holds more than the
    /// limit of slot starts, and an idle limiter serves at once.
    #[test]
    fn no_second_holds_more_than_the_limit() {
        for per_second in [1, 2, 3, 7, 10, 333] {
            let mut state = None;
            let mut per_sec = std::collections::BTreeMap::<i64, u32>::new();
            let now = at_ms(123);
            for _ in 0..(per_second * 5) {
                let (slot, next) = reserve(state, per_second, 1, now);
                state = Some(next);
                let start = slot_start(slot, per_second).max(now);
                *per_sec.entry(start.timestamp()).or_default() += 1;
                assert!(slot_of(start, per_second) == slot, "{per_second}: {slot}");
            }
            assert!(per_sec.values().all(|&n| n <= per_second), "{per_sec:?}");
            // Five seconds' worth, in at most six seconds.
            assert!(per_sec.len() <= 6, "{per_sec:?}");
        }
        // Idle, then used again later: the slot of now.
        let (slot, state) = reserve(None, 4, 1, at_ms(0));
        assert_eq!(slot_start(slot, 4), at_ms(0));
        let (later, _) = reserve(Some(state), 4, 1, at_ms(10_000));
        assert_eq!(later, slot_of(at_ms(10_000), 4));
        // Another rate renumbers.
        let (slot, _) = reserve(
            Some(Limiter {
                next: i64::MAX / 2,
                per_second: 3,
            }),
            4,
            1,
            at_ms(0),
        );
        assert_eq!(slot, slot_of(at_ms(0), 4));
        // A group takes consecutive slots: the next request queues behind
        // all of them.
        let (first, state) = reserve(None, 10, 3, at_ms(0));
        assert_eq!(state.next, first + 3);
        assert!(is_busy(state, 10, at_ms(0)));
        let (after, _) = reserve(Some(state), 10, 1, at_ms(0));
        assert_eq!(after, first + 3);
        assert!(!is_busy(state, 10, at_ms(10_000)));
    }

    #[test]
    fn limits_are_checked() {
        assert!(check_rate_limit(0).is_err());
        assert!(check_rate_limit(1).is_ok());
        assert!(check_rate_limit(MAX_RATE_LIMIT).is_ok());
        assert!(check_rate_limit(MAX_RATE_LIMIT + 1).is_err());
    }
}
