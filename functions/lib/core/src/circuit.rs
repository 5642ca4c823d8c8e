//! An endpoint's circuit: how deliver steps around an endpoint that keeps
//! timing out or refusing connections (a hung receiver), so it stops taking
//! the deliver slots every tenant shares.
//!
//! | state | when | what a due delivery does |
//! |---|---|---|
//! | closed (no circuit) | the endpoint answers (any HTTP status) | it is sent |
//! | closed, a run of unanswered requests | some requests got no answer | each deliver process keeps one request in flight to it; the others wait a delivery timeout |
//! | open | [`OPEN_AFTER`] unanswered requests in a row, or a failed probe | it waits until `open_until`, no attempt made, budget kept |
//! | probing | `open_until` passed: one deliver took the probe | one request is sent; the others wait for its answer |
//!
//! The run of unanswered requests is the endpoint's, not a process's: every
//! deliver process adds its unanswered requests to it (one conditional
//! update each), and an answer seen by a process that added to it, or that
//! read it, clears it. A run whose first request is older than
//! [`run_window`] starts over: an endpoint that misses an answer now and
//! then, among many answered, never opens its circuit.
//!
//! An endpoint that answers, but slowly (a fifth of the delivery timeout or
//! more, [`SLOW_AFTER`] times in a row), is paced instead: its requests start in turns, at most
//! [`SLOW_SHARE`] in flight across every process, so it cannot hold every
//! deliver environment either.
//!
//! A probe that gets any HTTP answer closes the circuit (a 5xx is the retry
//! schedule's business, not the circuit's); one that fails again reopens it
//! for twice the cool-down, up to [`COOL_DOWN_MAX`]. A delivery never waits
//! past the end of its own schedule ([`crate::retry::RetryPolicy::remaining_window`]):
//! there it fails as its last attempt would have.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Unanswered requests in a row (no HTTP answer: a timeout, a refused or
/// reset connection), counted across deliver processes, that open the
/// circuit. Three, not one: a single lost connection does not stall an
/// endpoint's deliveries for a cool-down. A hung endpoint's first wave
/// (requests sent before any timed out) costs each deliver process one
/// delivery timeout; after it, each keeps one request in flight to it
/// until the run opens the circuit.
pub const OPEN_AFTER: u32 = 3;
/// The first cool-down: long enough that a hung endpoint holds a deliver
/// slot for at most one probe's delivery timeout per this period.
pub const COOL_DOWN_FIRST: Duration = Duration::from_secs(30);
/// The longest cool-down (each failed probe doubles it): an endpoint back
/// up is found within this, and a hung one costs one request per it.
pub const COOL_DOWN_MAX: Duration = Duration::from_secs(600);

/// How long a run of unanswered requests lasts at most from its first:
/// four delivery timeouts (60 s at the default 15 s). A hung endpoint's
/// requests end unanswered a delivery timeout after they start, in waves,
/// so its run reaches [`OPEN_AFTER`] within one or two of them.
pub fn run_window(delivery_timeout: Duration) -> Duration {
    delivery_timeout.saturating_mul(4)
}

/// Requests in flight at once, across every deliver process, to an
/// endpoint that answers slowly ([`is_slow`]): its requests start in
/// turns [`turn_gap`] apart, so a slow endpoint holds about this many
/// deliver environments (of `DeliverMaxConcurrency`, 10 by default) while
/// the others go on; its deliveries wait for their turn, budgets kept.
pub const SLOW_SHARE: u32 = 2;

/// Slow answers in a row (in one process) that make it pace an endpoint:
/// one slow answer among fast ones is a blip, not a slow receiver. One
/// fast answer ends the pacing.
pub const SLOW_AFTER: u32 = 2;

/// Whether an answer this slow is a slow one: a fifth of the delivery
/// timeout or more (3 s at the default 15 s), and never under
/// [`SLOW_FLOOR`].
pub fn is_slow(latency: Duration, delivery_timeout: Duration) -> bool {
    latency >= (delivery_timeout / 5).max(SLOW_FLOOR)
}

/// The least latency that makes an answer slow, whatever the delivery
/// timeout: an answer within a second is a working receiver (with a 2 s
/// timeout a fifth would pace one answering in 400 ms).
pub const SLOW_FLOOR: Duration = Duration::from_secs(1);

/// The time between two turns of a slow endpoint whose answers take
/// `latency`: starts this far apart keep about [`SLOW_SHARE`] in flight
/// (1.5 s for 3 s answers: 40 requests a minute; 7.5 s at a 15 s
/// timeout).
pub fn turn_gap(latency: Duration) -> Duration {
    latency / SLOW_SHARE
}

/// Whether a delivery holding the turn `turn` goes at `now`: from
/// [`TURN_EARLY`] before it on (deliver handles a message that early: a
/// queue's delay is whole seconds). One picked up late (a backlog) still
/// goes on its turn rather than take another at the back of the line.
pub fn turn_has_come(turn: DateTime<Utc>, now: DateTime<Utc>) -> bool {
    now >= turn - delta(TURN_EARLY)
}

/// How early a turn may be taken: deliver's slack for a message handled
/// before its `not_before`.
pub const TURN_EARLY: Duration = Duration::from_millis(500);

/// The circuit of an endpoint, stored on it (absent: closed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Circuit {
    /// When it first opened (kept while probes fail).
    pub opened_at: DateTime<Utc>,
    /// Due deliveries wait until then; after it, one probe is sent. While
    /// a probe is in flight, the probe's deadline.
    pub open_until: DateTime<Utc>,
    /// The current cool-down in seconds.
    pub cool_down_seconds: u64,
    /// Whether a probe is in flight.
    #[serde(default)]
    pub probing: bool,
    /// What the last failed request met (no address, no secret: the
    /// sender's own words, e.g. `timed out after 15s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// What a due delivery to an endpoint with this circuit does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Sent.
    Send,
    /// Waits until then (no attempt).
    Wait(DateTime<Utc>),
    /// May take the probe (whoever takes it first sends it).
    Probe,
}

/// The gate of a circuit (`None`: closed) at `now`.
pub fn gate(circuit: Option<&Circuit>, now: DateTime<Utc>) -> Gate {
    match circuit {
        None => Gate::Send,
        Some(c) if now < c.open_until => Gate::Wait(c.open_until),
        Some(_) => Gate::Probe,
    }
}

impl Circuit {
    /// A circuit opened at `now` after unreachable attempts.
    pub fn opened(now: DateTime<Utc>, error: Option<&str>) -> Self {
        Self {
            opened_at: now,
            open_until: now + delta(COOL_DOWN_FIRST),
            cool_down_seconds: COOL_DOWN_FIRST.as_secs(),
            probing: false,
            last_error: error.map(short),
        }
    }

    /// This circuit with its probe taken at `now`: open until the probe
    /// must have been answered (`probe_for`: the delivery timeout and some
    /// slack), so a probe lost with its process is taken again then.
    pub fn probing(&self, now: DateTime<Utc>, probe_for: Duration) -> Self {
        Self {
            open_until: now + delta(probe_for),
            probing: true,
            ..self.clone()
        }
    }

    /// This circuit after its probe failed at `now`: open for twice the
    /// cool-down (at most [`COOL_DOWN_MAX`]).
    pub fn reopened(&self, now: DateTime<Utc>, error: Option<&str>) -> Self {
        let cool_down = Duration::from_secs(self.cool_down_seconds.saturating_mul(2))
            .clamp(COOL_DOWN_FIRST, COOL_DOWN_MAX);
        Self {
            opened_at: self.opened_at,
            open_until: now + delta(cool_down),
            cool_down_seconds: cool_down.as_secs(),
            probing: false,
            last_error: error.map(short).or_else(|| self.last_error.clone()),
        }
    }
}

fn delta(d: Duration) -> chrono::TimeDelta {
    chrono::TimeDelta::from_std(d).expect("cool-downs and probe windows are minutes, not ages")
}

/// An error kept on the circuit: at most 200 bytes, cut at a character.
fn short(error: &str) -> String {
    let mut end = error.len().min(200);
    while !error.is_char_boundary(end) {
        end -= 1;
    }
    error[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t(s: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_700_000_000 + s, 0).unwrap()
    }

    #[test]
    fn a_circuit_opens_waits_probes_and_backs_off_to_its_cap() {
        assert_eq!(gate(None, t(0)), Gate::Send);
        let open = Circuit::opened(t(0), Some("timed out after 15s"));
        assert_eq!(gate(Some(&open), t(1)), Gate::Wait(t(30)));
        assert_eq!(gate(Some(&open), t(30)), Gate::Probe);
        let probing = open.probing(t(30), Duration::from_secs(20));
        assert!(probing.probing);
        assert_eq!(gate(Some(&probing), t(31)), Gate::Wait(t(50)));
        let mut circuit = probing.reopened(t(45), None);
        assert_eq!(circuit.open_until, t(105), "twice the first cool-down");
        assert_eq!(circuit.last_error.as_deref(), Some("timed out after 15s"));
        assert!(!circuit.probing);
        for _ in 0..10 {
            circuit = circuit.reopened(t(45), Some("connection refused"));
        }
        assert_eq!(circuit.cool_down_seconds, COOL_DOWN_MAX.as_secs());
        assert_eq!(circuit.opened_at, t(0), "the first opening is kept");
    }

    #[test]
    fn a_long_error_is_cut_at_a_character() {
        let long = "é".repeat(300);
        let c = Circuit::opened(t(0), Some(&long));
        let kept = c.last_error.unwrap();
        assert!(kept.len() <= 200 && kept.chars().all(|ch| ch == 'é'));
    }
}
