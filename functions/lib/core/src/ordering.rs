//! Ordering per key (the rules; ingest, deliver and dispatch apply them):
//! for each endpoint, the deliveries of events with the
//! same `ordering_key` are attempted in the order the events were accepted.
//!
//! | rule | how |
//! |---|---|
//! | the order | decided at commit: the key's [`KeyHead`] (its version, its latest event's time, and per endpoint the key's latest delivery) is written in the event's transaction, conditional on the version read; a loser re-reads and plans again ([`plan`]) |
//! | a delivery waits | its first attempt is not made before its predecessor to the same endpoint has ended ([`gate`]) |
//! | a failure holds back | only its own key on its own endpoint |
//! | released | a predecessor that ended (delivered or failed), or that is gone with its event |
//! | out of order | a manual retry, resend or redrive of a delivery that has ended |

use std::collections::BTreeMap;

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};

use crate::ids::{DeliveryId, EndpointId, EventId};
use crate::CoreError;

/// Longest `ordering_key`, in characters.
pub const MAX_ORDERING_KEY_LEN: usize = 128;

/// Checks an `ordering_key`: 1 to [`MAX_ORDERING_KEY_LEN`] visible ASCII
/// characters (`!` to `~`: no space, no control character).
pub fn check_ordering_key(key: &str) -> Result<(), CoreError> {
    let visible = key.bytes().all(|b| b.is_ascii_graphic());
    if !key.is_empty() && key.len() <= MAX_ORDERING_KEY_LEN && visible {
        Ok(())
    } else {
        Err(CoreError::InvalidInput {
            field: "ordering_key",
            reason: format!("1 to {MAX_ORDERING_KEY_LEN} visible ASCII characters"),
        })
    }
}

/// A key's latest delivery to one endpoint: what the next one waits for.
/// Its event is kept with it: a delivery with no item yet (a listed one not
/// attempted) or none any more is told apart by whether its event exists.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct KeyTail {
    pub delivery: DeliveryId,
    pub event: EventId,
}

/// A key's head: what the next keyed event's commit orders itself after.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyHead {
    /// Moved on by each keyed event's commit (0: the key has none yet).
    pub version: u64,
    /// When its latest event was accepted.
    pub last_at: Option<DateTime<Utc>>,
    /// Per endpoint, the key's latest delivery to it (at most one entry per
    /// endpoint of the app: bounded by the app's endpoint limit).
    pub tails: BTreeMap<EndpointId, KeyTail>,
}

/// A keyed event's place, planned from its key's head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyedPlan {
    /// When the event is accepted: after the key's latest event even when
    /// this instance's clock is behind the one that accepted it, so the
    /// key's events sort by acceptance.
    pub accepted_at: DateTime<Utc>,
    /// Per endpoint of the event, the delivery its own waits for.
    pub after: BTreeMap<EndpointId, KeyTail>,
    /// The head to write, on the condition that the stored one is still at
    /// the version read.
    pub head: KeyHead,
}

/// When a keyed event read at `now` is accepted: after the key's latest
/// event even when this instance's clock is behind the one that accepted
/// it (a millisecond later at least, so a key's event ids, which carry
/// their acceptance time, sort in its order).
pub fn accepted_at(head: &KeyHead, now: DateTime<Utc>) -> DateTime<Utc> {
    match head.last_at {
        Some(last) if last >= now => last + TimeDelta::milliseconds(1),
        _ => now,
    }
}

/// Plans keyed event `event` with `deliveries` (its endpoint and delivery
/// ids) after `head`, as read at `now`.
pub fn plan(
    head: &KeyHead,
    event: &EventId,
    deliveries: &[(EndpointId, DeliveryId)],
    now: DateTime<Utc>,
) -> KeyedPlan {
    let accepted_at = accepted_at(head, now);
    let mut next = head.clone();
    next.version += 1;
    next.last_at = Some(accepted_at);
    let mut after = BTreeMap::new();
    for (endpoint, delivery) in deliveries {
        let tail = KeyTail {
            delivery: delivery.clone(),
            event: event.clone(),
        };
        if let Some(previous) = next.tails.insert(endpoint.clone(), tail) {
            after.insert(endpoint.clone(), previous);
        }
    }
    KeyedPlan {
        accepted_at,
        after,
        head: next,
    }
}

/// What deliver knows of a delivery's predecessor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Predecessor {
    /// It has ended (delivered or failed) at least once.
    Ended,
    /// Pending; `attempted`: its item records an attempt or a hold (a
    /// successor may register on it).
    Pending { attempted: bool },
    /// No item: not attempted yet, or gone. `may_come`: its event is still
    /// there and the waiting delivery is younger than [`lost_after`] (by
    /// then the reconciler has written any predecessor still pending: one
    /// with no item is gone, its item expired though its event was kept).
    Missing { may_come: bool },
}

/// How old a waiting delivery is when a predecessor with no item is taken
/// as gone: twice the reconciler's bound for recovering a lost first
/// attempt (`reconcile_after` plus two runs), which writes the item of any
/// predecessor still pending. Nothing waits forever on a record that
/// will not come.
pub fn lost_after(
    reconcile_after: std::time::Duration,
    reconcile_interval: std::time::Duration,
) -> TimeDelta {
    TimeDelta::from_std((reconcile_after + reconcile_interval * 2) * 2).unwrap_or(TimeDelta::MAX)
}

/// Whether a keyed delivery's first attempt may be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderGate {
    /// Made now (its predecessor has ended, or is gone).
    Go,
    /// Its predecessor has not recorded its first outcome yet: check again
    /// shortly (no write).
    Recheck,
    /// Its predecessor is pending: register to be woken when it ends, and
    /// wait.
    Wait,
}

/// The gate of a delivery that waits for a predecessor
/// ([`crate::model::Delivery::waits_for`]: one whose first attempt is not
/// made yet; a later attempt, a manual retry or a resend never waits).
pub fn gate(predecessor: Predecessor) -> OrderGate {
    match predecessor {
        Predecessor::Ended | Predecessor::Missing { may_come: false } => OrderGate::Go,
        Predecessor::Missing { may_come: true } | Predecessor::Pending { attempted: false } => {
            OrderGate::Recheck
        }
        Predecessor::Pending { attempted: true } => OrderGate::Wait,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t(ms: i64) -> DateTime<Utc> {
        Utc.timestamp_millis_opt(1_700_000_000_000 + ms).unwrap()
    }

    fn ep(n: u8) -> EndpointId {
        EndpointId::parse(&format!("ep_01m9800000000000000000000{n}")).unwrap()
    }

    fn dlv(n: u8) -> DeliveryId {
        DeliveryId::parse(&format!("dlv_01m9800000000000000000000{n}")).unwrap()
    }

    fn evt(n: u8) -> EventId {
        EventId::parse(&format!("evt_01m9800000000000000000000{n}")).unwrap()
    }

    fn tail(d: u8, e: u8) -> KeyTail {
        KeyTail {
            delivery: dlv(d),
            event: evt(e),
        }
    }

    #[test]
    fn ordering_keys_are_one_to_128_visible_ascii_characters() {
        for ok in ["order_42", "a", "~!#", &"k".repeat(128)] {
            assert!(check_ordering_key(ok).is_ok(), "{ok}");
        }
        for bad in ["", " ", "order 42", "tab\t", "é", &"k".repeat(129), "nul\0"] {
            let err = check_ordering_key(bad).unwrap_err();
            assert!(err.to_string().contains("ordering_key"), "{bad}: {err}");
        }
    }

    #[test]
    fn each_endpoint_waits_for_the_keys_latest_delivery_to_it() {
        let head = KeyHead::default();
        let first = plan(&head, &evt(1), &[(ep(1), dlv(1)), (ep(2), dlv(2))], t(0));
        assert_eq!(
            first.after,
            BTreeMap::new(),
            "the key's first event waits for nothing"
        );
        assert_eq!(first.head.version, 1);
        // The second goes to endpoint 1 only; the third to both.
        let second = plan(&first.head, &evt(2), &[(ep(1), dlv(3))], t(5));
        assert_eq!(second.after, BTreeMap::from([(ep(1), tail(1, 1))]));
        let third = plan(
            &second.head,
            &evt(3),
            &[(ep(1), dlv(4)), (ep(2), dlv(5))],
            t(9),
        );
        assert_eq!(
            third.after,
            BTreeMap::from([(ep(1), tail(3, 2)), (ep(2), tail(2, 1))]),
            "endpoint 2 waits for its own latest, not endpoint 1's"
        );
        assert_eq!(third.head.version, 3);
    }

    #[test]
    fn acceptance_follows_the_key_even_behind_another_clock() {
        let head = KeyHead {
            version: 7,
            last_at: Some(t(1_000)),
            tails: BTreeMap::new(),
        };
        // This instance's clock is 400 ms behind the last commit's.
        let behind = plan(&head, &evt(1), &[(ep(1), dlv(1))], t(600));
        assert_eq!(behind.accepted_at, t(1_001));
        assert_eq!(behind.head.last_at, Some(t(1_001)));
        let ahead = plan(&head, &evt(1), &[(ep(1), dlv(1))], t(2_000));
        assert_eq!(ahead.accepted_at, t(2_000));
    }

    #[test]
    fn a_delivery_waits_only_for_a_pending_predecessor() {
        assert_eq!(
            gate(Predecessor::Pending { attempted: true }),
            OrderGate::Wait
        );
        assert_eq!(gate(Predecessor::Ended), OrderGate::Go);
        assert_eq!(
            gate(Predecessor::Pending { attempted: false }),
            OrderGate::Recheck,
            "written, never attempted (a materialised fan-out)"
        );
        assert_eq!(
            gate(Predecessor::Missing { may_come: true }),
            OrderGate::Recheck,
            "listed, not attempted yet"
        );
        assert_eq!(
            gate(Predecessor::Missing { may_come: false }),
            OrderGate::Go,
            "gone with its event, or waited past the recovery bound"
        );
        assert_eq!(
            lost_after(
                std::time::Duration::from_secs(900),
                std::time::Duration::from_secs(300)
            ),
            TimeDelta::minutes(50)
        );
    }
}
