//! Events, endpoints, deliveries, attempts, and the delivery state machine.
//!
//! ```text
//!             success                      
//!   pending ----------> delivered          
//!     |  ^ retryable failure, budget left (attempt_count += 1, next_attempt_at)
//!     |  '----'                                
//!     | budget spent, or 410 Gone              
//!     v                                        
//!   failed ---- manual retry (fresh budget) ---> pending
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use rand::Rng;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::ids::{AppId, DeliveryId, EndpointId, EventId, MessageId};
use crate::ordering::KeyTail;
use crate::retry::{classify, ResponseClass, RetryPolicy};
use crate::signing::Secret;
use crate::CoreError;

/// At most this many attempts are kept in a delivery's log (the oldest are
/// dropped first; `attempt_count` and `total_attempts` keep counting).
pub const ATTEMPT_LOG_LIMIT: usize = 30;
/// At most this many bytes of a response body are kept per attempt.
pub const RESPONSE_BODY_LIMIT: usize = 1024;

/// A validated event type: 1-128 characters of `A-Z a-z 0-9 . _ - :`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct EventType(String);

impl EventType {
    pub fn parse(s: &str) -> Result<Self, CoreError> {
        let ok = !s.is_empty()
            && s.len() <= 128
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':'));
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(CoreError::InvalidInput {
                field: "event_type",
                reason: "1-128 characters of A-Z, a-z, 0-9, `.`, `_`, `-`, `:`".into(),
            })
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for EventType {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An event accepted for delivery.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub id: EventId,
    pub app_id: AppId,
    pub event_type: EventType,
    /// The exact bytes every receiver gets, on every attempt (see [`Event::new`]).
    pub body: String,
    pub created_at: DateTime<Utc>,
    /// A test event sent to one endpoint by hand (`POST .../endpoints/{id}/test`):
    /// delivered like any event, but never replayed to other endpoints.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub test: bool,
    /// Its `ordering_key` ([`crate::ordering`]), if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering_key: Option<String>,
    /// Per endpoint, the delivery of its key that its own delivery there
    /// waits for (planned at commit from the key's head).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub after: BTreeMap<EndpointId, KeyTail>,
}

impl Event {
    /// Builds the event and renders its body once, in the Standard Webhooks
    /// payload shape `{"type": ..., "timestamp": ..., "data": ...}`, with the
    /// producer's payload JSON text as `data`, byte for byte.
    pub fn new(
        id: EventId,
        app_id: AppId,
        event_type: EventType,
        payload: &RawValue,
        created_at: DateTime<Utc>,
    ) -> Self {
        let body = render_body(&event_type, created_at, payload);
        Self {
            id,
            app_id,
            event_type,
            body,
            created_at,
            test: false,
            ordering_key: None,
            after: BTreeMap::new(),
        }
    }

    /// Marks a test event: its body gets a top-level `"test": true`
    /// member, inside the signed bytes, so a receiver can tell a test
    /// (sent by hand from the API or the portal) from a real event whatever
    /// secret signed it: `{"type", "timestamp", "data", "test": true}`.
    pub fn mark_test(&mut self) {
        if self.test {
            return;
        }
        self.test = true;
        debug_assert!(self.body.ends_with('}'), "a rendered body is an object");
        self.body.pop();
        self.body.push_str(r#","test":true}"#);
    }
}

/// `{"type":"<type>","timestamp":"<RFC 3339>","data":<payload>}`.
///
/// `data` is the payload's JSON text exactly as the producer sent it (big
/// integers, decimals, exponents, escapes, key order and inner spacing
/// untouched): it is spliced in, never parsed into numbers and written again.
/// The type is `[A-Za-z0-9._:-]` only (see [`EventType::parse`]) and the
/// timestamp is digits and punctuation, so neither needs JSON escaping.
pub fn render_body(event_type: &EventType, at: DateTime<Utc>, payload: &RawValue) -> String {
    let timestamp = at.to_rfc3339_opts(SecondsFormat::Millis, true);
    let data = payload.get();
    let mut body = String::with_capacity(48 + event_type.as_str().len() + data.len());
    body.push_str(r#"{"type":""#);
    body.push_str(event_type.as_str());
    body.push_str(r#"","timestamp":""#);
    body.push_str(&timestamp);
    body.push_str(r#"","data":"#);
    body.push_str(data);
    body.push('}');
    body
}

/// The `data` member of a rendered body, as raw JSON text (byte for byte
/// what the producer sent). `None` if `body` is not a rendered body.
pub fn body_data(body: &str) -> Option<Box<RawValue>> {
    #[derive(Deserialize)]
    struct Shape {
        data: Box<RawValue>,
    }
    serde_json::from_str::<Shape>(body).ok().map(|s| s.data)
}

/// A secret that still signs after a rotation, until `expires_at`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreviousSecret {
    pub secret: Secret,
    pub expires_at: DateTime<Utc>,
}

/// A receiver's URL and what it subscribes to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Endpoint {
    pub id: EndpointId,
    pub app_id: AppId,
    pub url: String,
    pub description: Option<String>,
    /// Event types delivered here; empty means all. `prefix.*` matches a family.
    pub event_types: Vec<String>,
    pub secret: Secret,
    /// Older secrets still signing during a rotation overlap.
    #[serde(default)]
    pub previous_secrets: Vec<PreviousSecret>,
    pub disabled: bool,
    /// Why the endpoint was disabled by the system (e.g. `410 Gone`), if it was.
    #[serde(default)]
    pub disabled_reason: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Bumped by every write (PATCH, rotation, auto-disable): writes are
    /// conditional on it, so concurrent changes never undo each other.
    /// Items written before it existed read as 0.
    #[serde(default)]
    pub version: u64,
    /// Sent on every request to the endpoint (checked by
    /// [`check_custom_headers`]); their values are sealed at rest like the
    /// secrets (they often carry credentials).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// When its attempts started failing with no 2xx since (cleared by the
    /// next 2xx and by re-enabling it); past `WEBHOOKS_DISABLE_AFTER` the
    /// endpoint is disabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing_since: Option<DateTime<Utc>>,
    /// At most this many requests per second to it, across every deliver
    /// instance ([`crate::rate`]); none: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<u32>,
    /// Open while it keeps timing out or refusing connections: its
    /// deliveries wait, one probe closes it ([`crate::circuit`]). Written
    /// without a version bump (it is deliver's bookkeeping, not a change a
    /// PATCH could conflict with); a PATCH or re-enable closes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit: Option<crate::circuit::Circuit>,
    /// The current run of requests to it that got no answer, as every
    /// deliver process records them ([`crate::circuit`]): its length (0:
    /// none), and when it began. Cleared by an answer; at
    /// [`crate::circuit::OPEN_AFTER`] the circuit opens. Written without a
    /// version bump, like the circuit.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unanswered_count: u32,
    #[serde(
        default,
        with = "chrono::serde::ts_milliseconds_option",
        skip_serializing_if = "Option::is_none"
    )]
    pub unanswered_since: Option<DateTime<Utc>>,
    /// While it answers slowly: the start of the next free turn of its
    /// requests ([`crate::circuit::turn_gap`] apart). Written without a
    /// version bump.
    #[serde(
        default,
        with = "chrono::serde::ts_milliseconds_option",
        skip_serializing_if = "Option::is_none"
    )]
    pub turn_next: Option<DateTime<Utc>>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Most custom headers per endpoint.
pub const MAX_CUSTOM_HEADERS: usize = 20;
/// Longest custom header value, in bytes.
pub const MAX_CUSTOM_HEADER_VALUE: usize = 2048;

/// Header names an endpoint cannot set: what hookline sends itself
/// (signatures, ids, content type, user agent) and what HTTP/1.1 framing or
/// a proxy owns.
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "content-type",
    "content-encoding",
    "user-agent",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "expect",
    "date",
];
const RESERVED_PREFIXES: &[&str] = &["webhook-", "x-webhook-", "proxy-"];

/// Checks an endpoint's custom headers: at most [`MAX_CUSTOM_HEADERS`], each
/// name an HTTP token (1-64 characters) that is not reserved (see
/// [`RESERVED_HEADERS`]; names are case-insensitive, so two names differing
/// only in case are refused too), each value visible ASCII, spaces and tabs,
/// at most [`MAX_CUSTOM_HEADER_VALUE`] bytes. The error names the header,
/// never its value (values may be credentials).
pub fn check_custom_headers(headers: &BTreeMap<String, String>) -> Result<(), CoreError> {
    let invalid = |reason: String| CoreError::InvalidInput {
        field: "headers",
        reason,
    };
    if headers.len() > MAX_CUSTOM_HEADERS {
        return Err(invalid(format!("at most {MAX_CUSTOM_HEADERS} headers")));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (name, value) in headers {
        let is_token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
        if name.is_empty() || name.len() > 64 || !name.chars().all(is_token) {
            return Err(invalid(format!(
                "`{}` is not a header name (1-64 letters, digits or !#$%&'*+-.^_`|~)",
                name.escape_debug()
            )));
        }
        let lower = name.to_ascii_lowercase();
        if RESERVED_HEADERS.contains(&lower.as_str())
            || RESERVED_PREFIXES.iter().any(|p| lower.starts_with(p))
        {
            return Err(invalid(format!("`{name}` is reserved: hookline sets it")));
        }
        if !seen.insert(lower) {
            return Err(invalid(format!(
                "`{name}` is given twice (names ignore case)"
            )));
        }
        if value.len() > MAX_CUSTOM_HEADER_VALUE
            || !value
                .chars()
                .all(|c| c == ' ' || c == '\t' || c.is_ascii_graphic())
        {
            return Err(invalid(format!(
                "the value of `{name}` must be at most {MAX_CUSTOM_HEADER_VALUE} bytes of visible ASCII, spaces and tabs"
            )));
        }
    }
    Ok(())
}

impl Endpoint {
    /// Closes its circuit and ends its run of unanswered requests (a new
    /// URL, or re-enabled: judged afresh).
    pub fn close_circuit(&mut self) {
        self.circuit = None;
        self.unanswered_count = 0;
        self.unanswered_since = None;
    }

    /// A new, enabled endpoint receiving every event type, version 0.
    pub fn new(
        id: EndpointId,
        app_id: AppId,
        url: impl Into<String>,
        secret: Secret,
        now: DateTime<Utc>,
    ) -> Self {
        Self {
            id,
            app_id,
            url: url.into(),
            description: None,
            event_types: vec![],
            secret,
            previous_secrets: vec![],
            disabled: false,
            disabled_reason: None,
            created_at: now,
            updated_at: now,
            version: 0,
            headers: BTreeMap::new(),
            failing_since: None,
            rate_limit: None,
            circuit: None,
            unanswered_count: 0,
            unanswered_since: None,
            turn_next: None,
        }
    }

    /// Whether an event of `event_type` goes to this endpoint.
    pub fn subscribes_to(&self, event_type: &EventType) -> bool {
        subscribes(&self.event_types, event_type)
    }

    /// Enabled and subscribed.
    pub fn receives(&self, event_type: &EventType) -> bool {
        !self.disabled && self.subscribes_to(event_type)
    }

    /// Every secret that signs at `now`: the current one first.
    pub fn signing_secrets(&self, now: DateTime<Utc>) -> Vec<&Secret> {
        std::iter::once(&self.secret)
            .chain(
                self.previous_secrets
                    .iter()
                    .filter(|p| p.expires_at > now)
                    .map(|p| &p.secret),
            )
            .collect()
    }

    /// Replaces the secret; the old one keeps signing for `overlap`.
    pub fn rotate_secret(
        &mut self,
        new: Secret,
        now: DateTime<Utc>,
        overlap: Duration,
    ) -> Result<(), CoreError> {
        self.previous_secrets.retain(|p| p.expires_at > now);
        let valid_after = 2 + self.previous_secrets.len();
        if !overlap.is_zero() && valid_after > MAX_VALID_SECRETS {
            return Err(CoreError::TooManySecrets {
                max: MAX_VALID_SECRETS,
            });
        }
        let old = std::mem::replace(&mut self.secret, new);
        if !overlap.is_zero() {
            let expires_at =
                now + chrono::Duration::from_std(overlap).unwrap_or(chrono::Duration::days(1));
            self.previous_secrets.push(PreviousSecret {
                secret: old,
                expires_at,
            });
        }
        self.updated_at = now;
        Ok(())
    }
}

/// At most this many secrets of an endpoint are valid at once: the current
/// one and those still in their rotation overlap. Each signs every request
/// (one signature per secret in its header) and the endpoint's item holds
/// them all, so rotations within an overlap are refused past it.
pub const MAX_VALID_SECRETS: usize = 5;

/// The state of a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryStatus {
    Pending,
    Delivered,
    Failed,
}

impl DeliveryStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Delivered => "delivered",
            Self::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Result<Self, CoreError> {
        match s {
            "pending" => Ok(Self::Pending),
            "delivered" => Ok(Self::Delivered),
            "failed" => Ok(Self::Failed),
            _ => Err(CoreError::InvalidInput {
                field: "status",
                reason: "one of pending, delivered, failed".into(),
            }),
        }
    }
}

impl fmt::Display for DeliveryStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One HTTP attempt and what came of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// 1-based number over the delivery's whole life (manual retries and
    /// resends continue it). Logs written before this counted within the
    /// attempt budget.
    pub attempt: u32,
    pub at: DateTime<Utc>,
    /// `None` when no response came (timeout, refused, reset).
    pub status_code: Option<u16>,
    pub latency_ms: u64,
    pub error: Option<String>,
    /// The first [`RESPONSE_BODY_LIMIT`] bytes of the response body (lossy UTF-8).
    pub response_body: Option<String>,
}

impl Attempt {
    /// Builds an attempt record, truncating the body on a char boundary.
    pub fn new(
        attempt: u32,
        at: DateTime<Utc>,
        status_code: Option<u16>,
        latency: Duration,
        error: Option<String>,
        response_body: Option<&[u8]>,
    ) -> Self {
        let response_body = response_body.map(|b| {
            let text = String::from_utf8_lossy(&b[..b.len().min(RESPONSE_BODY_LIMIT)]).into_owned();
            truncate_chars(text, RESPONSE_BODY_LIMIT)
        });
        Self {
            attempt,
            at,
            status_code,
            latency_ms: u64::try_from(latency.as_millis()).unwrap_or(u64::MAX),
            error: error.map(|e| truncate_chars(e, 512)),
            response_body,
        }
    }
}

fn truncate_chars(mut s: String, max_bytes: usize) -> String {
    if s.len() > max_bytes {
        let mut cut = max_bytes;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

/// What recording an attempt did to the delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    Delivered,
    /// Stays pending; the next attempt is due at this time.
    Retry {
        next_attempt_at: DateTime<Utc>,
    },
    /// Terminal until a manual retry.
    Failed {
        reason: FailReason,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailReason {
    /// Every attempt of the budget failed.
    AttemptsExhausted,
    /// The endpoint answered 410 Gone: it should be disabled.
    EndpointGone,
    /// The endpoint is deleted, disabled or not allowed (see [`Delivery::fail_now`]).
    NotDeliverable,
}

/// One event's delivery to one endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delivery {
    pub id: DeliveryId,
    pub app_id: AppId,
    pub event_id: EventId,
    pub endpoint_id: EndpointId,
    pub event_type: EventType,
    pub status: DeliveryStatus,
    /// Attempts made in the current budget (reset by a manual retry).
    pub attempt_count: u32,
    /// Attempts made over the delivery's whole life.
    pub total_attempts: u32,
    /// Manual retries (redrives) so far.
    pub manual_retries: u32,
    /// Bumped by every change of state (each attempt recorded, each failure,
    /// each manual retry, each re-queue by the reconciler); never repeats, so
    /// a conditional write on it cannot be fooled by a state that comes back
    /// (ABA: a manual retry resets `attempt_count`). Items written before it
    /// existed read as 0.
    #[serde(default)]
    pub version: u64,
    /// Set by [`Delivery::requeue`] and [`Delivery::unblock`]: the
    /// reconciler (or the waker) itself queued the attempt due now, so the
    /// table's stream must not queue it a second time.
    /// Cleared by the next attempt or manual retry.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub requeued: bool,
    /// When the next attempt is due; `None` once delivered or failed.
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// The most recent attempts, oldest first, at most [`ATTEMPT_LOG_LIMIT`].
    pub attempts: Vec<Attempt>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// [`body_digest`] of the event body this delivery sends. A body carried
    /// in a queue message is signed and sent only if it matches, so whoever
    /// can write to the queue still cannot make hookline sign anything but
    /// the stored event. Absent on items written before it existed (deliver
    /// then reads the event, as it always did).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_sha256: Option<String>,
    /// The send slot its endpoint's rate limiter gave the next attempt
    /// (which is due then): that attempt is sent without taking another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throttled_until: Option<DateTime<Utc>>,
    /// While its endpoint's circuit holds it back ([`Delivery::hold`]):
    /// when its schedule ends (it fails then if still held). Cleared by
    /// its next attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_until_deadline: Option<DateTime<Utc>>,
    /// The turn its slow endpoint's pacing gave its next attempt
    /// ([`Delivery::wait_turn`]); cleared by that attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_at: Option<DateTime<Utc>>,
    /// Its event's `ordering_key`, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering_key: Option<String>,
    /// The delivery of its key to its endpoint accepted just before it:
    /// its first attempt is not made before that one has ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<KeyTail>,
    /// While it waits for [`Self::after`] to end ([`Delivery::block`]):
    /// that delivery's id. Its predecessor's end wakes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_by: Option<DeliveryId>,
    /// Set when it first ends (delivered or failed) and never cleared (a
    /// manual retry or resend is not waited for): its successor goes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub released: bool,
}

/// Whether filters `event_types` (exact names, `prefix.*`, `*`; empty =
/// all) admit `event_type`.
fn subscribes(event_types: &[String], event_type: &EventType) -> bool {
    let t = event_type.as_str();
    event_types.is_empty()
        || event_types.iter().any(|pattern| {
            pattern == "*"
                || pattern == t
                || pattern.strip_suffix(".*").is_some_and(|prefix| {
                    t.len() > prefix.len() + 1
                        && t.starts_with(prefix)
                        && t.as_bytes()[prefix.len()] == b'.'
                })
        })
}

/// What fan-out needs of an endpoint: its id, filters and state; no URL,
/// no secrets, so listing routes never opens a sealed secret (no KMS call
/// on an ingest cold start).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointRoute {
    pub id: EndpointId,
    #[serde(default)]
    pub event_types: Vec<String>,
    #[serde(default)]
    pub disabled: bool,
}

impl EndpointRoute {
    /// Enabled and subscribed (as [`Endpoint::receives`]).
    pub fn receives(&self, event_type: &EventType) -> bool {
        !self.disabled && subscribes(&self.event_types, event_type)
    }
}

impl From<&Endpoint> for EndpointRoute {
    fn from(endpoint: &Endpoint) -> Self {
        Self {
            id: endpoint.id.clone(),
            event_types: endpoint.event_types.clone(),
            disabled: endpoint.disabled,
        }
    }
}

/// SHA-256 of a webhook body, as lowercase hex.
pub fn body_digest(body: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(body.as_bytes()))
}

impl Delivery {
    /// A new pending delivery, due now.
    pub fn new(id: DeliveryId, event: &Event, endpoint_id: EndpointId, now: DateTime<Utc>) -> Self {
        let after = event.after.get(&endpoint_id).cloned();
        let mut delivery = Self::of_event_parts(
            id,
            event.app_id.clone(),
            event.id.clone(),
            endpoint_id,
            event.event_type.clone(),
            now,
            &event.body,
        );
        delivery.ordering_key = event.ordering_key.clone();
        delivery.after = after;
        delivery
    }

    /// The same, from the parts of its event it keeps (the body only as
    /// its digest): what a first attempt's queue message carries.
    pub fn of_event_parts(
        id: DeliveryId,
        app_id: AppId,
        event_id: EventId,
        endpoint_id: EndpointId,
        event_type: EventType,
        now: DateTime<Utc>,
        body: &str,
    ) -> Self {
        Self {
            id,
            app_id,
            event_id,
            endpoint_id,
            event_type,
            status: DeliveryStatus::Pending,
            attempt_count: 0,
            total_attempts: 0,
            manual_retries: 0,
            version: 0,
            requeued: false,
            next_attempt_at: Some(now),
            attempts: Vec::new(),
            created_at: now,
            updated_at: now,
            body_sha256: Some(body_digest(body)),
            throttled_until: None,
            held_until_deadline: None,
            turn_at: None,
            ordering_key: None,
            after: None,
            blocked_by: None,
            released: false,
        }
    }

    /// The predecessor this delivery's next attempt waits for: its
    /// [`Self::after`] while it has made no attempt and never ended (a
    /// later attempt, a manual retry or a resend is not held back).
    pub fn waits_for(&self) -> Option<&KeyTail> {
        self.after
            .as_ref()
            .filter(|_| self.attempts.is_empty() && !self.released)
    }

    /// Whether it stands as [`Delivery::unblock`] left it after
    /// `predecessor`'s end (its message may not have been sent).
    pub fn woken_by(&self, predecessor: &DeliveryId) -> bool {
        self.status == DeliveryStatus::Pending
            && self.requeued
            && self.blocked_by.is_none()
            && self.attempts.is_empty()
            && self
                .after
                .as_ref()
                .is_some_and(|t| &t.delivery == predecessor)
    }

    /// Waits for `predecessor` (pending) to end, under a new version: no
    /// attempt is queued for it until [`Delivery::unblock`]. Due (for the
    /// reconciler, should the wake be lost) when its predecessor is, or
    /// now.
    pub fn block(
        &mut self,
        predecessor: &DeliveryId,
        predecessor_due: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> Result<(), CoreError> {
        self.check_pending("block")?;
        self.version += 1;
        self.requeued = false;
        self.blocked_by = Some(predecessor.clone());
        self.next_attempt_at = Some(predecessor_due.map_or(now, |due| due.max(now)));
        self.updated_at = now;
        Ok(())
    }

    /// Its predecessor `predecessor` has ended: due now, under a new
    /// version, re-queued (the waker sends its message itself). `false`
    /// (nothing changed) when it does not wait for that one (woken twice,
    /// or not blocked yet).
    pub fn unblock(&mut self, predecessor: &DeliveryId, now: DateTime<Utc>) -> bool {
        if self.status != DeliveryStatus::Pending || self.blocked_by.as_ref() != Some(predecessor) {
            return false;
        }
        self.version += 1;
        self.requeued = true;
        self.blocked_by = None;
        self.next_attempt_at = Some(now);
        self.updated_at = now;
        true
    }

    /// The `webhook-id` a receiver sees.
    pub fn message_id(&self) -> MessageId {
        MessageId::for_delivery(&self.id)
    }

    /// The number the next attempt will carry.
    pub fn next_attempt_number(&self) -> u32 {
        self.attempt_count + 1
    }

    /// Records an attempt (numbered [`Self::next_attempt_number`]) and moves
    /// the state. Only a pending delivery can be attempted.
    pub fn record_attempt<R: Rng + ?Sized>(
        &mut self,
        attempt: Attempt,
        retry_after: Option<Duration>,
        policy: &RetryPolicy,
        rng: &mut R,
    ) -> Result<Transition, CoreError> {
        if self.status != DeliveryStatus::Pending {
            return Err(CoreError::IllegalTransition {
                from: self.status.as_str(),
                action: "record an attempt",
            });
        }
        let now = attempt.at;
        let class = classify(attempt.status_code);
        self.push_attempt(attempt);
        let transition = match class {
            ResponseClass::Success => Transition::Delivered,
            ResponseClass::Gone => Transition::Failed {
                reason: FailReason::EndpointGone,
            },
            ResponseClass::Retryable => {
                match policy.next_delay(self.attempt_count, retry_after, rng) {
                    Some(delay) => Transition::Retry {
                        next_attempt_at: now
                            + chrono::Duration::from_std(delay)
                                .unwrap_or(chrono::Duration::days(1)),
                    },
                    None => Transition::Failed {
                        reason: FailReason::AttemptsExhausted,
                    },
                }
            }
        };
        match &transition {
            Transition::Delivered => {
                self.status = DeliveryStatus::Delivered;
                self.next_attempt_at = None;
                self.released = true;
            }
            Transition::Retry { next_attempt_at } => self.next_attempt_at = Some(*next_attempt_at),
            Transition::Failed { .. } => {
                self.status = DeliveryStatus::Failed;
                self.next_attempt_at = None;
                self.released = true;
            }
        }
        Ok(transition)
    }

    /// Logs an attempt, numbered over the delivery's whole life (a manual
    /// retry or a resend continues the count; the budget is
    /// `attempt_count`).
    fn push_attempt(&mut self, mut attempt: Attempt) {
        self.version += 1;
        self.requeued = false;
        self.throttled_until = None;
        self.held_until_deadline = None;
        self.turn_at = None;
        self.blocked_by = None;
        self.attempt_count += 1;
        self.total_attempts += 1;
        attempt.attempt = self.total_attempts;
        self.updated_at = attempt.at;
        self.attempts.push(attempt);
        if self.attempts.len() > ATTEMPT_LOG_LIMIT {
            let excess = self.attempts.len() - ATTEMPT_LOG_LIMIT;
            self.attempts.drain(..excess);
        }
    }

    /// Records a final attempt that ends the delivery at once, whatever the
    /// budget: the endpoint was deleted or disabled, or its address is not
    /// allowed. The delivery goes to `failed` (and so to the DLQ), from where a
    /// manual retry restarts it once the cause is fixed.
    pub fn fail_now(&mut self, attempt: Attempt) -> Result<Transition, CoreError> {
        if self.status != DeliveryStatus::Pending {
            return Err(CoreError::IllegalTransition {
                from: self.status.as_str(),
                action: "fail",
            });
        }
        self.push_attempt(attempt);
        self.status = DeliveryStatus::Failed;
        self.next_attempt_at = None;
        self.released = true;
        Ok(Transition::Failed {
            reason: FailReason::NotDeliverable,
        })
    }

    /// The reconciler found this pending delivery overdue (its queue message
    /// was lost): the attempt is due now, under a new version so any older
    /// message for it that still turns up is stale.
    pub fn requeue(&mut self, now: DateTime<Utc>) -> Result<(), CoreError> {
        if self.status != DeliveryStatus::Pending {
            return Err(CoreError::IllegalTransition {
                from: self.status.as_str(),
                action: "re-queue",
            });
        }
        self.version += 1;
        self.requeued = true;
        self.next_attempt_at = Some(now);
        self.updated_at = now;
        Ok(())
    }

    /// The endpoint's rate limiter put the next attempt at send slot
    /// `slot`: due at the start of the slot's second (a queue delay is whole
    /// seconds, so the attempt comes back within that second), under a new
    /// version (the message that brought it here is done), with the slot
    /// kept so that attempt does not take another. Attempt count and budget
    /// are untouched: waiting for the limit is not a failure.
    pub fn throttle(&mut self, slot: DateTime<Utc>, now: DateTime<Utc>) -> Result<(), CoreError> {
        if self.status != DeliveryStatus::Pending {
            return Err(CoreError::IllegalTransition {
                from: self.status.as_str(),
                action: "throttle",
            });
        }
        self.version += 1;
        self.requeued = false;
        self.next_attempt_at = Some(crate::rate::second_of(slot));
        self.throttled_until = Some(slot);
        self.updated_at = now;
        Ok(())
    }

    /// Puts this pending delivery's next attempt at `turn`, the turn its
    /// slow endpoint's pacing gave it ([`crate::circuit::SLOW_SHARE`]),
    /// under a new version; attempt count and budget untouched. Not past
    /// the end of its schedule (`remaining`, as for [`Delivery::hold`]):
    /// `Ok(false)`, nothing changed, when its turn comes after it (the
    /// caller fails it).
    pub fn wait_turn(
        &mut self,
        turn: DateTime<Utc>,
        remaining: chrono::TimeDelta,
        now: DateTime<Utc>,
    ) -> Result<bool, CoreError> {
        self.check_pending("wait_turn")?;
        let deadline = self.hold_deadline(Some(remaining), now);
        if deadline.is_some_and(|end| turn > end) {
            return Ok(false);
        }
        self.version += 1;
        self.requeued = false;
        self.next_attempt_at = Some(turn);
        self.turn_at = Some(turn);
        if deadline.is_some() {
            self.held_until_deadline = deadline;
        }
        self.updated_at = now;
        Ok(true)
    }

    /// Holds this pending delivery back until `until` without an attempt,
    /// under a new version; attempt count and budget untouched. Held by an
    /// open circuit ([`crate::circuit`]) it never waits past the end of its
    /// schedule: `remaining` (what its schedule had left) from its first
    /// hold; `Ok(false)`, nothing changed: that end has come (the caller
    /// fails it, as its last attempt would have). Held for another reason
    /// (`remaining` `None`: one request of this process is in flight to
    /// the endpoint), it has no deadline: the hold is a delivery timeout.
    pub fn hold(
        &mut self,
        until: DateTime<Utc>,
        remaining: Option<chrono::TimeDelta>,
        now: DateTime<Utc>,
    ) -> Result<bool, CoreError> {
        self.check_pending("hold")?;
        let deadline = self.hold_deadline(remaining, now);
        if deadline.is_some_and(|end| now >= end) {
            return Ok(false);
        }
        self.version += 1;
        self.requeued = false;
        self.throttled_until = None;
        self.next_attempt_at = Some(deadline.map_or(until, |end| until.min(end)));
        if deadline.is_some() {
            self.held_until_deadline = deadline;
        }
        self.updated_at = now;
        Ok(true)
    }

    /// The end of a held delivery's schedule: the one its first hold set,
    /// else `remaining` from now (`None`: no deadline, or one beyond the
    /// calendar).
    fn hold_deadline(
        &self,
        remaining: Option<chrono::TimeDelta>,
        now: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        let remaining = remaining?;
        self.held_until_deadline
            .or_else(|| now.checked_add_signed(remaining))
    }

    fn check_pending(&self, action: &'static str) -> Result<(), CoreError> {
        if self.status == DeliveryStatus::Pending {
            Ok(())
        } else {
            Err(CoreError::IllegalTransition {
                from: self.status.as_str(),
                action,
            })
        }
    }

    /// The send slot the limiter gave this delivery's next attempt, if it
    /// still holds at `now`: the attempt is the one throttled, and the
    /// slot's wall-clock second has not passed (a later attempt takes a new
    /// slot, so late ones arriving together cannot exceed the limit).
    pub fn reserved_slot(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.throttled_until.filter(|slot| {
            let second = crate::rate::second_of(*slot);
            self.next_attempt_at == Some(second) && now < second + chrono::TimeDelta::seconds(1)
        })
    }

    /// A manual retry: `failed -> pending`, due now, with a fresh attempt
    /// budget. The attempt log is kept.
    pub fn manual_retry(&mut self, now: DateTime<Utc>) -> Result<(), CoreError> {
        if self.status != DeliveryStatus::Failed {
            return Err(CoreError::IllegalTransition {
                from: self.status.as_str(),
                action: "manual retry",
            });
        }
        self.restart(now);
        Ok(())
    }

    /// A resend: `delivered -> pending`, due now, with a fresh attempt
    /// budget; the receiver gets the same `webhook-id` again. The attempt log
    /// is kept (and its numbering continues).
    pub fn resend(&mut self, now: DateTime<Utc>) -> Result<(), CoreError> {
        if self.status != DeliveryStatus::Delivered {
            return Err(CoreError::IllegalTransition {
                from: self.status.as_str(),
                action: "resend",
            });
        }
        self.restart(now);
        Ok(())
    }

    fn restart(&mut self, now: DateTime<Utc>) {
        self.status = DeliveryStatus::Pending;
        self.version += 1;
        self.requeued = false;
        self.attempt_count = 0;
        self.held_until_deadline = None;
        self.turn_at = None;
        self.manual_retries += 1;
        self.next_attempt_at = Some(now);
        self.updated_at = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retry::Schedule;
    use chrono::TimeZone;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    /// Stored with each delivery and checked before a retry's POST: the
    /// encoding must not change (FIPS 180-2's "abc" vector).
    #[test]
    fn a_body_digest_is_lowercase_hex_sha256() {
        assert_eq!(
            body_digest("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_owned()).unwrap()
    }

    fn t0() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 2, 3, 4, 5).unwrap()
    }

    fn headers(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn custom_headers_are_checked_and_errors_never_echo_values() {
        assert!(check_custom_headers(&headers(&[
            ("Authorization", "Bearer s3cr3t-token"),
            ("X-Tenant", "acme\t42"),
        ]))
        .is_ok());
        assert!(check_custom_headers(&BTreeMap::new()).is_ok());
        for bad in [
            ("Host", "x"),
            ("content-type", "text/plain"),
            ("User-Agent", "x"),
            ("webhook-id", "x"),
            ("X-Webhook-Signature", "x"),
            ("Proxy-Authorization", "x"),
            ("Transfer-Encoding", "chunked"),
            ("bad name", "x"),
            ("", "x"),
            ("X-Crlf", "a\r\nInjected: yes"),
            ("X-Unicode", "é"),
        ] {
            let err = check_custom_headers(&headers(&[bad]))
                .unwrap_err()
                .to_string();
            assert!(err.contains("headers"), "{err}");
            if !bad.1.is_empty() && bad.1 != "x" {
                assert!(!err.contains(bad.1), "a value is never echoed: {err}");
            }
        }
        let long = "v".repeat(MAX_CUSTOM_HEADER_VALUE + 1);
        assert!(check_custom_headers(&headers(&[("X-Long", &long)])).is_err());
        let twice = headers(&[("X-A", "1"), ("x-a", "2")]);
        assert!(check_custom_headers(&twice)
            .unwrap_err()
            .to_string()
            .contains("twice"));
        let many: BTreeMap<String, String> = (0..=MAX_CUSTOM_HEADERS)
            .map(|i| (format!("X-H{i}"), "v".to_owned()))
            .collect();
        assert!(check_custom_headers(&many).is_err());
    }

    fn event() -> Event {
        Event::new(
            EventId::generate(),
            AppId::parse("app1").unwrap(),
            EventType::parse("order.paid").unwrap(),
            &raw(r#"{"order_id": 42, "amount": "10.00"}"#),
            t0(),
        )
    }

    fn delivery() -> Delivery {
        Delivery::new(
            DeliveryId::generate(),
            &event(),
            EndpointId::generate(),
            t0(),
        )
    }

    fn attempt(n: u32, status: Option<u16>, at: DateTime<Utc>) -> Attempt {
        Attempt::new(n, at, status, Duration::from_millis(12), None, Some(b"ok"))
    }

    fn compressed() -> RetryPolicy {
        RetryPolicy {
            jitter: 0.0,
            ..RetryPolicy::from_settings(Some("1s,2s,4s"), None).unwrap()
        }
    }

    #[test]
    fn body_has_the_standard_webhooks_shape_and_is_stable() {
        let e = event();
        assert_eq!(
            e.body,
            r#"{"type":"order.paid","timestamp":"2026-01-02T03:04:05.000Z","data":{"order_id": 42, "amount": "10.00"}}"#
        );
        let again: Event = serde_json::from_str(&serde_json::to_string(&e).unwrap()).unwrap();
        assert_eq!(again.body, e.body);
    }

    #[test]
    fn payload_bytes_are_kept_exactly() {
        // Beyond 64 bits, 30-digit decimals, exponents, escapes, key order,
        // inner spacing and duplicate-looking keys: all must survive.
        let payload = r#"{"id":12345678901234567890123, "amount":10.50,"small":1e2,"pi":3.141592653589793238462643383279,
  "neg":-0.0,"esc":"\u00e9\n\"q\"","z":1,"a":[1E+300 ,2]}"#;
        let e = Event::new(
            EventId::generate(),
            AppId::parse("app1").unwrap(),
            EventType::parse("order.paid").unwrap(),
            &raw(payload),
            t0(),
        );
        let prefix = r#"{"type":"order.paid","timestamp":"2026-01-02T03:04:05.000Z","data":"#;
        assert_eq!(e.body, format!("{prefix}{payload}}}"));
        assert_eq!(body_data(&e.body).unwrap().get(), payload);
        // The body is valid JSON with the standard shape.
        let parsed: serde_json::Value = serde_json::from_str(&e.body).unwrap();
        assert_eq!(parsed["type"], "order.paid");
        assert!(body_data("not json").is_none());
    }

    #[test]
    fn a_held_delivery_keeps_its_budget_and_ends_by_its_schedule() {
        let policy = compressed();
        let mut d = delivery();
        let mut rng = StdRng::seed_from_u64(1);
        d.record_attempt(attempt(1, None, t0()), None, &policy, &mut rng)
            .unwrap();
        // 6 s of its schedule left after one attempt (2 s + 4 s).
        let remaining =
            chrono::TimeDelta::from_std(policy.remaining_window(d.attempt_count)).unwrap();
        assert_eq!(remaining, chrono::TimeDelta::seconds(6));
        let due = t0() + chrono::TimeDelta::seconds(1);
        let version = d.version;
        assert!(d
            .hold(due + chrono::TimeDelta::seconds(4), Some(remaining), due)
            .unwrap());
        assert_eq!(d.version, version + 1, "a new version: the message is done");
        assert_eq!((d.attempt_count, d.total_attempts), (1, 1), "no attempt");
        assert_eq!(d.next_attempt_at, Some(due + chrono::TimeDelta::seconds(4)));
        // Held again: never past the first hold's deadline, then no more.
        let later = due + chrono::TimeDelta::seconds(4);
        assert!(d
            .hold(
                later + chrono::TimeDelta::seconds(30),
                Some(remaining),
                later
            )
            .unwrap());
        assert_eq!(d.next_attempt_at, Some(due + remaining));
        assert!(!d
            .hold(
                due + remaining + chrono::TimeDelta::seconds(30),
                Some(remaining),
                due + remaining
            )
            .unwrap());
        // An attempt starts a new hold from its own remaining schedule.
        d.record_attempt(
            attempt(2, Some(200), due + remaining),
            None,
            &policy,
            &mut rng,
        )
        .unwrap();
        assert_eq!(d.held_until_deadline, None);
        assert!(
            d.hold(due, Some(remaining), due).is_err(),
            "only a pending one is held"
        );
    }

    #[test]
    fn a_hold_without_a_deadline_and_a_turn_past_the_schedule() {
        let s = |n| chrono::TimeDelta::seconds(n);
        let now = t0();
        let mut d = delivery();
        assert!(d.hold(now + s(5), None, now).unwrap());
        assert_eq!(d.held_until_deadline, None, "a cap's hold has no deadline");
        // A schedule beyond the calendar: no deadline, no overflow.
        assert!(d
            .hold(now + s(5), Some(chrono::TimeDelta::MAX), now)
            .unwrap());
        assert_eq!(d.held_until_deadline, None);
        // A turn after the schedule's end is refused; one before is kept,
        // with that end.
        let mut d = delivery();
        assert!(!d.wait_turn(now + s(10), s(6), now).unwrap());
        assert_eq!(d.version, 0, "nothing changed");
        assert!(d.wait_turn(now + s(5), s(6), now).unwrap());
        assert_eq!(
            (d.turn_at, d.next_attempt_at),
            (Some(now + s(5)), Some(now + s(5)))
        );
        assert_eq!(d.held_until_deadline, Some(now + s(6)));
    }

    #[test]
    fn success_delivers() {
        let mut d = delivery();
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(d.next_attempt_number(), 1);
        let t = d
            .record_attempt(attempt(1, Some(200), t0()), None, &compressed(), &mut rng)
            .unwrap();
        assert_eq!(t, Transition::Delivered);
        assert_eq!(d.status, DeliveryStatus::Delivered);
        assert_eq!(d.next_attempt_at, None);
        assert_eq!((d.attempt_count, d.total_attempts), (1, 1));
        // Delivered is terminal.
        assert!(d
            .record_attempt(attempt(2, Some(200), t0()), None, &compressed(), &mut rng)
            .is_err());
        assert!(d.manual_retry(t0()).is_err());
    }

    #[test]
    fn flaky_then_success_on_attempt_three() {
        let mut d = delivery();
        let mut rng = StdRng::seed_from_u64(1);
        let p = compressed();
        let t = d
            .record_attempt(attempt(1, Some(500), t0()), None, &p, &mut rng)
            .unwrap();
        assert_eq!(
            t,
            Transition::Retry {
                next_attempt_at: t0() + chrono::Duration::seconds(1)
            }
        );
        let t = d
            .record_attempt(attempt(2, None, t0()), None, &p, &mut rng)
            .unwrap();
        assert_eq!(
            t,
            Transition::Retry {
                next_attempt_at: t0() + chrono::Duration::seconds(2)
            }
        );
        let t = d
            .record_attempt(attempt(3, Some(204), t0()), None, &p, &mut rng)
            .unwrap();
        assert_eq!(t, Transition::Delivered);
        assert_eq!(
            d.attempts.iter().map(|a| a.status_code).collect::<Vec<_>>(),
            [Some(500), None, Some(204)]
        );
    }

    #[test]
    fn exhaustion_fails_and_manual_retry_gives_a_fresh_budget() {
        let mut d = delivery();
        let mut rng = StdRng::seed_from_u64(1);
        let p = compressed(); // 4 attempts
        for n in 1..=3 {
            let t = d
                .record_attempt(attempt(n, Some(503), t0()), None, &p, &mut rng)
                .unwrap();
            assert!(matches!(t, Transition::Retry { .. }));
        }
        let t = d
            .record_attempt(attempt(4, Some(503), t0()), None, &p, &mut rng)
            .unwrap();
        assert_eq!(
            t,
            Transition::Failed {
                reason: FailReason::AttemptsExhausted
            }
        );
        assert_eq!(d.status, DeliveryStatus::Failed);
        assert!(d
            .record_attempt(attempt(5, Some(200), t0()), None, &p, &mut rng)
            .is_err());

        let later = t0() + chrono::Duration::hours(1);
        d.manual_retry(later).unwrap();
        assert_eq!(d.status, DeliveryStatus::Pending);
        assert_eq!(
            (d.attempt_count, d.total_attempts, d.manual_retries),
            (0, 4, 1)
        );
        assert_eq!(d.next_attempt_at, Some(later));
        assert_eq!(d.attempts.len(), 4, "history kept");
        // Pending cannot be manually retried.
        assert!(d.manual_retry(later).is_err());
        let t = d
            .record_attempt(attempt(1, Some(200), later), None, &p, &mut rng)
            .unwrap();
        assert_eq!(t, Transition::Delivered);
        assert_eq!(d.total_attempts, 5);
    }

    #[test]
    fn version_never_repeats_across_manual_retries() {
        // ABA: after exhaustion and a manual retry, attempt_count returns to
        // earlier values; the version does not.
        let mut d = delivery();
        let mut rng = StdRng::seed_from_u64(1);
        let p = compressed();
        let mut seen = vec![(d.attempt_count, d.version)];
        for n in 1..=4 {
            d.record_attempt(attempt(n, Some(503), t0()), None, &p, &mut rng)
                .unwrap();
            seen.push((d.attempt_count, d.version));
        }
        d.manual_retry(t0()).unwrap();
        seen.push((d.attempt_count, d.version));
        d.record_attempt(attempt(1, Some(503), t0()), None, &p, &mut rng)
            .unwrap();
        seen.push((d.attempt_count, d.version));
        d.requeue(t0()).unwrap();
        seen.push((d.attempt_count, d.version));
        let counts: Vec<u32> = seen.iter().map(|s| s.0).collect();
        let versions: Vec<u64> = seen.iter().map(|s| s.1).collect();
        assert_eq!(counts, [0, 1, 2, 3, 4, 0, 1, 1], "attempt_count repeats");
        assert_eq!(
            versions,
            [0, 1, 2, 3, 4, 5, 6, 7],
            "version is strictly increasing"
        );
        d.fail_now(attempt(2, None, t0())).unwrap();
        assert!(
            d.requeue(t0()).is_err(),
            "only a pending delivery is re-queued"
        );
    }

    #[test]
    fn fail_now_ends_a_pending_delivery_only() {
        let mut d = delivery();
        let a = Attempt::new(
            1,
            t0(),
            None,
            Duration::ZERO,
            Some("endpoint disabled".into()),
            None,
        );
        assert_eq!(
            d.fail_now(a.clone()).unwrap(),
            Transition::Failed {
                reason: FailReason::NotDeliverable
            }
        );
        assert_eq!((d.status, d.attempt_count), (DeliveryStatus::Failed, 1));
        assert!(d.fail_now(a).is_err());
    }

    #[test]
    fn gone_fails_at_once() {
        let mut d = delivery();
        let mut rng = StdRng::seed_from_u64(1);
        let t = d
            .record_attempt(attempt(1, Some(410), t0()), None, &compressed(), &mut rng)
            .unwrap();
        assert_eq!(
            t,
            Transition::Failed {
                reason: FailReason::EndpointGone
            }
        );
    }

    #[test]
    fn retry_after_moves_next_attempt() {
        let mut d = delivery();
        let mut rng = StdRng::seed_from_u64(1);
        let t = d
            .record_attempt(
                attempt(1, Some(429), t0()),
                Some(Duration::from_secs(30)),
                &compressed(),
                &mut rng,
            )
            .unwrap();
        assert_eq!(
            t,
            Transition::Retry {
                next_attempt_at: t0() + chrono::Duration::seconds(30)
            }
        );
    }

    #[test]
    fn attempt_log_is_bounded() {
        let mut d = delivery();
        let mut rng = StdRng::seed_from_u64(1);
        let p = RetryPolicy {
            schedule: Schedule::parse("1s").unwrap(),
            max_attempts: 100,
            jitter: 0.0,
            ..RetryPolicy::default()
        };
        for n in 1..=45 {
            d.record_attempt(attempt(n, Some(500), t0()), None, &p, &mut rng)
                .unwrap();
        }
        assert_eq!(d.attempts.len(), ATTEMPT_LOG_LIMIT);
        assert_eq!(d.attempts[0].attempt, 16);
        assert_eq!(d.attempt_count, 45);
    }

    #[test]
    fn attempt_record_truncates_body_and_error() {
        let body = "é".repeat(2000);
        let a = Attempt::new(
            1,
            t0(),
            Some(500),
            Duration::from_secs(1),
            Some("x".repeat(5000)),
            Some(body.as_bytes()),
        );
        assert!(a.response_body.as_ref().unwrap().len() <= RESPONSE_BODY_LIMIT);
        assert_eq!(a.error.as_ref().unwrap().len(), 512);
        assert_eq!(a.latency_ms, 1000);
        let bad = Attempt::new(
            1,
            t0(),
            Some(200),
            Duration::ZERO,
            None,
            Some(&[0xff, 0xfe, b'a']),
        );
        assert_eq!(bad.response_body.as_deref(), Some("\u{fffd}\u{fffd}a"));
    }

    #[test]
    fn subscriptions_and_rotation() {
        let mut rng = StdRng::seed_from_u64(9);
        let mut ep = Endpoint::new(
            EndpointId::generate(),
            AppId::parse("app1").unwrap(),
            "https://example.com/hook",
            Secret::generate(&mut rng),
            t0(),
        );
        let paid = EventType::parse("order.paid").unwrap();
        let user = EventType::parse("user.created").unwrap();
        assert!(ep.receives(&paid) && ep.receives(&user));
        ep.event_types = vec!["order.*".into()];
        assert!(ep.receives(&paid) && !ep.receives(&user));
        // A route (what fan-out lists) decides exactly as its endpoint.
        for (types, disabled) in [
            (vec![], false),
            (vec!["order.*".to_owned()], false),
            (vec!["*".to_owned()], true),
        ] {
            let mut e = ep.clone();
            e.event_types = types;
            e.disabled = disabled;
            let route = EndpointRoute::from(&e);
            for t in [&paid, &user] {
                assert_eq!(route.receives(t), e.receives(t), "{:?} {t}", e.event_types);
            }
        }
        assert!(!ep.subscribes_to(&EventType::parse("orders.paid").unwrap()));
        assert!(!ep.subscribes_to(&EventType::parse("order").unwrap()));
        ep.event_types = vec!["user.created".into()];
        assert!(!ep.receives(&paid) && ep.receives(&user));
        ep.disabled = true;
        assert!(!ep.receives(&user));

        let old = ep.secret.clone();
        let new = Secret::generate(&mut rng);
        ep.rotate_secret(new.clone(), t0(), Duration::from_secs(3600))
            .unwrap();
        assert_eq!(ep.signing_secrets(t0()), vec![&new, &old]);
        assert_eq!(
            ep.signing_secrets(t0() + chrono::Duration::seconds(3601)),
            vec![&new]
        );
        ep.rotate_secret(
            Secret::generate(&mut rng),
            t0() + chrono::Duration::hours(2),
            Duration::ZERO,
        )
        .unwrap();
        assert_eq!(
            ep.signing_secrets(t0() + chrono::Duration::hours(2)).len(),
            1
        );
        assert!(ep.previous_secrets.is_empty());
    }

    /// Rotations within one overlap stop at five valid secrets: the sixth
    /// is refused and changes nothing; once the oldest overlap ends, one
    /// more is taken; a rotation without overlap is always taken.
    #[test]
    fn rotations_stop_at_five_valid_secrets() {
        let mut rng = rand::thread_rng();
        let mut ep = Endpoint::new(
            EndpointId::generate(),
            AppId::parse("a").unwrap(),
            "https://example.com/hook",
            Secret::generate(&mut rng),
            t0(),
        );
        let day = Duration::from_secs(86_400);
        for minute in 1..=4 {
            let at = t0() + chrono::Duration::minutes(minute);
            ep.rotate_secret(Secret::generate(&mut rng), at, day)
                .unwrap();
        }
        let at = t0() + chrono::Duration::minutes(5);
        assert_eq!(ep.signing_secrets(at).len(), MAX_VALID_SECRETS);
        let before = ep.clone();
        let refused = ep.rotate_secret(Secret::generate(&mut rng), at, day);
        assert!(matches!(refused, Err(CoreError::TooManySecrets { max: 5 })));
        assert_eq!(ep, before, "a refused rotation changes nothing");
        let later = t0() + chrono::Duration::minutes(1) + chrono::Duration::days(1);
        ep.rotate_secret(Secret::generate(&mut rng), later, day)
            .unwrap();
        assert_eq!(ep.signing_secrets(later).len(), MAX_VALID_SECRETS);
        ep.rotate_secret(Secret::generate(&mut rng), later, Duration::ZERO)
            .unwrap();
    }

    /// A test event's signed body says so; no other event's does.
    #[test]
    fn a_test_event_body_carries_test_true() {
        let payload = RawValue::from_string(r#"{"a":1}"#.into()).unwrap();
        let mut event = Event::new(
            EventId::generate(),
            AppId::parse("a").unwrap(),
            EventType::parse("order.paid").unwrap(),
            &payload,
            t0(),
        );
        let plain: serde_json::Value = serde_json::from_str(&event.body).unwrap();
        assert!(plain.get("test").is_none());
        event.mark_test();
        event.mark_test();
        let body: serde_json::Value = serde_json::from_str(&event.body).unwrap();
        assert_eq!(body["test"], serde_json::Value::Bool(true));
        assert_eq!(body["data"], serde_json::json!({"a": 1}));
        assert!(event.test && event.body.ends_with(r#""data":{"a":1},"test":true}"#));
    }

    #[test]
    fn statuses_and_event_types_parse() {
        for s in [
            DeliveryStatus::Pending,
            DeliveryStatus::Delivered,
            DeliveryStatus::Failed,
        ] {
            assert_eq!(DeliveryStatus::parse(s.as_str()).unwrap(), s);
            assert_eq!(serde_json::to_string(&s).unwrap(), format!("\"{s}\""));
        }
        assert!(DeliveryStatus::parse("done").is_err());
        assert!(EventType::parse("invoice.payment_failed:v2").is_ok());
        for bad in ["", "a b", &"x".repeat(129), "a/b"] {
            assert!(EventType::parse(bad).is_err());
        }
    }
}
