//! SQS message bodies. The same shape travels on the delivery queue and in the
//! DLQ (SQS's redrive policy moves delivery messages there unchanged).

use chrono::{DateTime, Utc};
use hookline_core::ids::{AppId, DeliveryId, EndpointId};
use hookline_core::model::{Delivery, EventType};
use hookline_core::ordering::KeyTail;
use serde::{Deserialize, Serialize};

/// "Attempt number `attempt` of delivery `delivery_id` is due at `not_before`."
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryMessage {
    pub delivery_id: DeliveryId,
    /// 1-based attempt number within the delivery's current budget.
    pub attempt: u32,
    pub not_before: DateTime<Utc>,
    pub app_id: AppId,
    pub endpoint_id: EndpointId,
    pub event_type: String,
    /// The delivery's version when this message was made: a message whose
    /// delivery moved on (an attempt recorded, a manual retry, a re-queue by
    /// the reconciler) is stale. Absent in messages of older releases (the
    /// attempt number decides then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
    /// Set on copies sent to the DLQ: why the delivery failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// The webhook body to POST, when it is at most [`INLINE_BODY_MAX`]
    /// bytes: deliver then does not read the event. Used only if its digest
    /// matches the delivery's `body_sha256`; absent, or not matching, deliver
    /// reads the event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// The delivery's creation, on the message of a never-attempted one
    /// (version 0): with the body, what deliver needs to build a listed
    /// delivery without reading its event ([`Self::listed_delivery`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<DateTime<Utc>>,
    /// On a never-attempted one too: its event's `ordering_key` and the
    /// delivery it waits for ([`hookline_core::ordering`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<KeyTail>,
    /// How many times deliver found its predecessor not yet attempted and
    /// sent this message again (each time a little later).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rechecks: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Largest body carried in a queue message: the message stays within one
/// 64 KB SQS billing chunk even with JSON escaping.
pub const INLINE_BODY_MAX: usize = 24 * 1024;

impl DeliveryMessage {
    /// The delivery of a listed fan-out this message is the first attempt
    /// of, as it stands before that attempt, built from the message alone
    /// (its id names the event and the position; it carries version 0, the
    /// creation time and the body): equal to the one its event lists. Deliver
    /// then reads only the delivery's own item (present if anything wrote
    /// the delivery meanwhile), not the event. `None` when the message does
    /// not say enough (an older message, a body too large to carry, a later
    /// attempt).
    pub fn listed_delivery(&self) -> Option<Delivery> {
        if self.version != Some(0) {
            return None;
        }
        let (body, created_at) = (self.body.as_deref()?, self.created_at?);
        let (event_id, _) = self.delivery_id.fanout_origin()?;
        let mut delivery = Delivery::of_event_parts(
            self.delivery_id.clone(),
            self.app_id.clone(),
            event_id,
            self.endpoint_id.clone(),
            EventType::parse(&self.event_type).ok()?,
            created_at,
            body,
        );
        delivery.ordering_key = self.ordering_key.clone();
        delivery.after = self.after.clone();
        Some(delivery)
    }

    pub fn to_json(&self) -> String {
        // A struct of strings and numbers always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// SQS's largest `DelaySeconds`.
pub const MAX_DELAY_SECS: i64 = 900;

/// `clamp(not_before - now, 0, 900)` in whole seconds (rounded up so a message
/// never arrives early by a fraction of a second).
pub fn delay_seconds(not_before: DateTime<Utc>, now: DateTime<Utc>) -> i32 {
    let millis = (not_before - now).num_milliseconds();
    let secs = if millis <= 0 {
        0
    } else {
        (millis + 999) / 1000
    };
    secs.clamp(0, MAX_DELAY_SECS) as i32
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Duration;

    #[test]
    fn delay_is_clamped_and_rounded_up() {
        let now = Utc::now();
        assert_eq!(delay_seconds(now - Duration::seconds(5), now), 0);
        assert_eq!(delay_seconds(now, now), 0);
        assert_eq!(delay_seconds(now + Duration::milliseconds(1), now), 1);
        assert_eq!(delay_seconds(now + Duration::seconds(30), now), 30);
        assert_eq!(delay_seconds(now + Duration::minutes(256), now), 900);
    }

    #[test]
    fn message_round_trips() {
        let m = DeliveryMessage {
            delivery_id: DeliveryId::generate(),
            attempt: 2,
            not_before: Utc::now(),
            app_id: AppId::parse("app").unwrap(),
            endpoint_id: EndpointId::generate(),
            event_type: "a.b".into(),
            version: Some(3),
            failure: None,
            body: Some(r#"{"data":{"n":1e2}}"#.into()),
            created_at: None,
            ordering_key: Some("order_42".into()),
            after: Some(KeyTail {
                delivery: DeliveryId::generate(),
                event: hookline_core::ids::EventId::generate(),
            }),
            rechecks: 2,
        };
        let back: DeliveryMessage = serde_json::from_str(&m.to_json()).unwrap();
        assert_eq!(back, m);
        assert!(!m.to_json().contains("failure"));
        // A message of an older release (no version) still reads.
        let old = m.to_json().replace(r#","version":3"#, "");
        let back: DeliveryMessage = serde_json::from_str(&old).unwrap();
        assert_eq!(back.version, None);
    }

    /// A listed delivery's first-attempt message builds exactly the
    /// delivery its event lists (so deliver need not read the event); any
    /// message that does not say enough builds none.
    #[test]
    fn a_first_attempt_message_builds_the_listed_delivery() {
        use hookline_core::ids::EventId;
        use hookline_core::model::Event;
        let now = Utc::now();
        let event = Event::new(
            EventId::new_fanout_base(now, &mut rand::thread_rng()),
            AppId::parse("shop").unwrap(),
            EventType::parse("order.paid").unwrap(),
            &serde_json::value::RawValue::from_string(r#"{"id": "o_1", "total": 12.5}"#.into())
                .unwrap(),
            now,
        );
        let stored = crate::ports::StoredEvent {
            event: event.clone(),
            targets: vec![EndpointId::generate(), EndpointId::generate()],
            fanout_remaining: vec![],
            fanout_version: 0,
        };
        for listed in stored.listed_deliveries() {
            let (mut message, _) = crate::dispatch::message_for(&listed, now).unwrap();
            message.body = Some(event.body.clone());
            let message: DeliveryMessage = serde_json::from_str(&message.to_json()).unwrap();
            assert_eq!(message.listed_delivery(), Some(listed.clone()));
            // Without the body, the creation time or version 0: none.
            let mut m = message.clone();
            m.body = None;
            assert_eq!(m.listed_delivery(), None);
            let mut m = message.clone();
            m.created_at = None;
            assert_eq!(m.listed_delivery(), None);
            let mut m = message.clone();
            m.version = Some(1);
            assert_eq!(m.listed_delivery(), None);
        }
        // A later attempt's message carries no creation time.
        let mut attempted = stored.listed_delivery(0).unwrap();
        attempted.version = 1;
        assert_eq!(
            crate::dispatch::message_for(&attempted, now)
                .unwrap()
                .0
                .created_at,
            None
        );
    }
}
