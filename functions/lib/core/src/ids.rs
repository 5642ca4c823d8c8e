//! Typed, prefixed, time-ordered ids.
//!
//! An id is `<prefix>_<26 chars>`: a UUIDv7 (48-bit unix-millisecond time +
//! 74 random bits) in lowercase Crockford base32, as in TypeID. Ids of one
//! kind sort by creation time as plain strings, which DynamoDB sort keys use.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, TimeZone, Utc};
use rand::RngCore;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::CoreError;

const ALPHABET: &[u8; 32] = b"0123456789abcdefghjkmnpqrstvwxyz";
const ENCODED_LEN: usize = 26;

fn encode(value: u128) -> String {
    let mut out = String::with_capacity(ENCODED_LEN);
    for i in 0..ENCODED_LEN {
        let shift = 125 - 5 * i as u32;
        let idx = ((value >> shift) & 31) as usize;
        out.push(ALPHABET[idx] as char);
    }
    out
}

fn decode(s: &str) -> Option<u128> {
    let bytes = s.as_bytes();
    if bytes.len() != ENCODED_LEN || !(b'0'..=b'7').contains(&bytes[0]) {
        return None;
    }
    let mut value: u128 = 0;
    for &b in bytes {
        let digit = ALPHABET.iter().position(|&c| c == b)? as u128;
        value = (value << 5) | digit;
    }
    Some(value)
}

/// A fresh UUIDv7 value from a time and a random source.
fn uuid_v7(now: DateTime<Utc>, rng: &mut dyn RngCore) -> u128 {
    let millis = u64::try_from(now.timestamp_millis()).unwrap_or(0);
    let mut random = [0u8; 10];
    rng.fill_bytes(&mut random);
    uuid::Builder::from_unix_timestamp_millis(millis, &random)
        .into_uuid()
        .as_u128()
}

macro_rules! typed_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal, $kind:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// The prefix before the `_`.
            pub const PREFIX: &'static str = $prefix;

            /// A new id for time `now`, random bits from `rng`.
            pub fn new(now: DateTime<Utc>, rng: &mut dyn RngCore) -> Self {
                Self::from_u128(uuid_v7(now, rng))
            }

            /// A new id from the system clock and thread RNG.
            pub fn generate() -> Self {
                Self::new(Utc::now(), &mut rand::thread_rng())
            }

            fn from_u128(value: u128) -> Self {
                Self(format!("{}_{}", $prefix, encode(value)))
            }

            /// The smallest id of this kind made at `at` (millisecond): every id
            /// made at or after `at` sorts at or after it, every earlier id
            /// before it. Time-range filters become key conditions with it.
            pub fn time_floor(at: DateTime<Utc>) -> Self {
                let millis = u128::from(u64::try_from(at.timestamp_millis()).unwrap_or(0));
                Self::from_u128((millis & 0xffff_ffff_ffff) << 80)
            }

            /// Parses `<prefix>_<26 base32 chars>`.
            pub fn parse(s: &str) -> Result<Self, CoreError> {
                let rest = s
                    .strip_prefix($prefix)
                    .and_then(|r| r.strip_prefix('_'))
                    .ok_or(CoreError::InvalidId { kind: $kind, reason: concat!("must start with `", $prefix, "_`") })?;
                decode(rest).ok_or(CoreError::InvalidId {
                    kind: $kind,
                    reason: "expected 26 lowercase base32 characters after the prefix",
                })?;
                Ok(Self(s.to_owned()))
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The 128-bit UUIDv7 behind the id.
            pub fn as_uuid(&self) -> uuid::Uuid {
                let value = decode(&self.0[$prefix.len() + 1..]).unwrap_or(0);
                uuid::Uuid::from_u128(value)
            }

            /// When the id was made (millisecond precision).
            pub fn created_at(&self) -> DateTime<Utc> {
                let millis = (self.as_uuid().as_u128() >> 80) as i64;
                Utc.timestamp_millis_opt(millis).single().unwrap_or_default()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0)
            }
        }

        impl FromStr for $name {
            type Err = CoreError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::parse(s)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::parse(&s).map_err(serde::de::Error::custom)
            }
        }
    };
}

typed_id!(
    /// An accepted event (`evt_...`).
    EventId, "evt", "event"
);
typed_id!(
    /// A receiver endpoint (`ep_...`).
    EndpointId, "ep", "endpoint"
);
typed_id!(
    /// One event's delivery to one endpoint (`dlv_...`).
    DeliveryId, "dlv", "delivery"
);
typed_id!(
    /// A replay of the events an endpoint never had (`rpl_...`).
    ReplayId, "rpl", "replay"
);
typed_id!(
    /// An app-scoped API key (`key_...`); the key itself is `<id>.<secret>`.
    ApiKeyId, "key", "API key"
);
typed_id!(
    /// The id a receiver sees as `webhook-id` / `X-Webhook-ID` (`msg_...`):
    /// stable across every retry and manual redrive of one delivery.
    MessageId, "msg", "message"
);

/// Low bits of an event id made by [`EventId::new_fanout_base`] (zero), which
/// the ids of its deliveries ([`DeliveryId::for_fanout`]) use for their
/// position in the event's fan-out list.
const FANOUT_MASK: u128 = 0xffff;
/// Fan-out positions a base event id leaves room for.
pub const FANOUT_POSITIONS: usize = 0xffff;

impl EventId {
    /// A new event id whose low 16 bits are zero (58 random bits remain,
    /// per millisecond): the ids of its deliveries carry it, so a delivery
    /// that exists only in its event's fan-out list can be found by id.
    pub fn new_fanout_base(now: DateTime<Utc>, rng: &mut dyn RngCore) -> Self {
        Self::from_u128(uuid_v7(now, rng) & !FANOUT_MASK)
    }

    fn is_fanout_base(&self) -> bool {
        self.as_uuid().as_u128() & FANOUT_MASK == 0
    }
}

impl DeliveryId {
    /// The delivery at `position` of the fan-out list of `event` (an id made
    /// by [`EventId::new_fanout_base`]): the event's bits with the position
    /// (plus one) in the low 16 bits. Deterministic, time-ordered with the
    /// event, and [`DeliveryId::fanout_origin`] gives the event back. `None`
    /// for another kind of event id or a position beyond [`FANOUT_POSITIONS`].
    pub fn for_fanout(event: &EventId, position: usize) -> Option<Self> {
        if !event.is_fanout_base() || position >= FANOUT_POSITIONS {
            return None;
        }
        let low = u128::try_from(position + 1).ok()?;
        Some(Self::from_u128(event.as_uuid().as_u128() | low))
    }

    /// The event and fan-out position this id would have been made from by
    /// [`DeliveryId::for_fanout`]. Any id reads as some candidate: the
    /// caller checks that the event exists and lists this delivery.
    pub fn fanout_origin(&self) -> Option<(EventId, usize)> {
        let value = self.as_uuid().as_u128();
        let low = usize::try_from(value & FANOUT_MASK).ok()?;
        (low > 0).then(|| (EventId::from_u128(value & !FANOUT_MASK), low - 1))
    }

    /// The delivery of `event` to `endpoint`: deterministic, so materialising
    /// a fan-out twice (a retried stream batch, a crash) yields the same ids and
    /// conditional writes make it idempotent. Time bits are the event's.
    pub fn for_event_endpoint(event: &EventId, endpoint: &EndpointId) -> Self {
        use sha2::{Digest, Sha256};
        let digest = Sha256::new()
            .chain_update(event.as_str())
            .chain_update(b"/")
            .chain_update(endpoint.as_str())
            .finalize();
        let mut random = [0u8; 10];
        random.copy_from_slice(&digest[..10]);
        let millis = u64::try_from(event.created_at().timestamp_millis()).unwrap_or(0);
        let value = uuid::Builder::from_unix_timestamp_millis(millis, &random)
            .into_uuid()
            .as_u128();
        Self::from_u128(value)
    }
}

impl MessageId {
    /// The message id of a delivery: the same 128 bits, so it is stable for
    /// the delivery's whole life without being stored separately.
    pub fn for_delivery(delivery: &DeliveryId) -> Self {
        Self::from_u128(delivery.as_uuid().as_u128())
    }
}

/// A tenant ("application") id, chosen by the API user: 1-64 characters of
/// `A-Z a-z 0-9 _ - .`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct AppId(String);

impl AppId {
    pub fn parse(s: &str) -> Result<Self, CoreError> {
        let ok = !s.is_empty()
            && s.len() <= 64
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        // `.` and `..` are path segments, not names: a URL or a link to the
        // dashboard would resolve them away.
        if ok && s != "." && s != ".." {
            Ok(Self(s.to_owned()))
        } else {
            Err(CoreError::InvalidId {
                kind: "app",
                reason: "1-64 characters of A-Z, a-z, 0-9, `_`, `-`, `.`, and not `.` or `..`",
            })
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for AppId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for AppId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn at(millis: i64) -> DateTime<Utc> {
        Utc.timestamp_millis_opt(millis).unwrap()
    }

    #[test]
    fn ids_are_prefixed_and_round_trip() {
        let mut rng = StdRng::seed_from_u64(1);
        let id = EventId::new(at(1_700_000_000_123), &mut rng);
        assert!(id.as_str().starts_with("evt_"));
        assert_eq!(id.as_str().len(), 4 + 26);
        assert_eq!(EventId::parse(id.as_str()).unwrap(), id);
        assert_eq!(id.created_at(), at(1_700_000_000_123));
        assert_eq!(id.as_uuid().get_version_num(), 7);
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(serde_json::from_str::<EventId>(&json).unwrap(), id);
    }

    #[test]
    fn fanout_ids_name_their_event_and_position() {
        let mut rng = StdRng::seed_from_u64(7);
        let event = EventId::new_fanout_base(at(1_700_000_000_123), &mut rng);
        assert_eq!(event.created_at(), at(1_700_000_000_123));
        assert_eq!(event.as_uuid().get_version_num(), 7);
        let ids: Vec<DeliveryId> = (0..3)
            .map(|p| DeliveryId::for_fanout(&event, p).unwrap())
            .collect();
        for (position, id) in ids.iter().enumerate() {
            assert_eq!(id.fanout_origin(), Some((event.clone(), position)));
            assert_eq!(id.created_at(), event.created_at());
            assert!(DeliveryId::parse(id.as_str()).is_ok());
        }
        assert!(ids[0] < ids[1] && ids[1] < ids[2]);
        assert!(DeliveryId::for_fanout(&event, FANOUT_POSITIONS).is_none());
        // An ordinary event id has random low bits: no fan-out ids.
        let plain = EventId::new(at(1), &mut StdRng::seed_from_u64(3));
        assert!(DeliveryId::for_fanout(&plain, 0).is_none());
        // Later events sort after every delivery of earlier ones.
        let later = EventId::new_fanout_base(at(1_700_000_000_124), &mut rng);
        assert!(DeliveryId::for_fanout(&later, 0).unwrap() > ids[2]);
    }

    proptest! {
        #[test]
        fn time_floor_splits_ids_by_time(a in 0i64..4_000_000_000_000, b in 0i64..4_000_000_000_000, seed: u64) {
            let mut rng = StdRng::seed_from_u64(seed);
            let id = DeliveryId::new(at(a), &mut rng);
            let floor = DeliveryId::time_floor(at(b));
            prop_assert_eq!(id >= floor, a >= b, "{} vs {}", id, floor);
            prop_assert!(DeliveryId::parse(floor.as_str()).is_ok());
        }
    }

    #[test]
    fn wrong_prefix_or_body_is_rejected() {
        let id = EndpointId::generate();
        assert!(DeliveryId::parse(id.as_str()).is_err());
        for bad in [
            "",
            "ep_",
            "ep",
            "ep_123",
            "ep_8zzzzzzzzzzzzzzzzzzzzzzzzz",
            "ep_0000000000000000000000000u",
            "EP_00000000000000000000000000",
        ] {
            assert!(EndpointId::parse(bad).is_err(), "{bad}");
        }
        assert!(serde_json::from_str::<EndpointId>("\"evt_00000000000000000000000000\"").is_err());
    }

    #[test]
    fn ids_sort_by_time() {
        let mut rng = StdRng::seed_from_u64(2);
        let mut prev = DeliveryId::new(at(0), &mut rng);
        for ms in [1, 2, 1000, 1_700_000_000_000, 4_000_000_000_000] {
            let next = DeliveryId::new(at(ms), &mut rng);
            assert!(next.as_str() > prev.as_str());
            prev = next;
        }
    }

    #[test]
    fn message_id_is_stable_per_delivery() {
        let d = DeliveryId::generate();
        assert_eq!(MessageId::for_delivery(&d), MessageId::for_delivery(&d));
        assert_eq!(MessageId::for_delivery(&d).as_str()[4..], d.as_str()[4..]);
    }

    #[test]
    fn derived_delivery_ids_are_deterministic_and_distinct() {
        let e = EventId::generate();
        let (a, b) = (EndpointId::generate(), EndpointId::generate());
        let d1 = DeliveryId::for_event_endpoint(&e, &a);
        assert_eq!(d1, DeliveryId::for_event_endpoint(&e, &a));
        assert_ne!(d1, DeliveryId::for_event_endpoint(&e, &b));
        assert_ne!(d1, DeliveryId::for_event_endpoint(&EventId::generate(), &a));
        assert_eq!(d1.created_at(), e.created_at());
        assert_eq!(DeliveryId::parse(d1.as_str()).unwrap(), d1);
    }

    #[test]
    fn app_ids() {
        assert!(AppId::parse("acme-prod_1.eu").is_ok());
        for bad in ["", "a b", "a/b", &"x".repeat(65), "é", ".", ".."] {
            assert!(AppId::parse(bad).is_err(), "{bad}");
        }
        assert!(AppId::parse("...").is_ok() && AppId::parse(".a").is_ok());
    }

    proptest! {
        #[test]
        fn base32_round_trips(v in any::<u128>()) {
            prop_assert_eq!(decode(&encode(v)), Some(v));
        }

        #[test]
        fn parse_never_panics(s in any::<String>()) {
            let _ = MessageId::parse(&s);
            let _ = AppId::parse(&s);
        }
    }
}
