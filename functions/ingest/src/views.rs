//! What the API reads and writes: request bodies, query strings and response
//! shapes, each with its OpenAPI schema. Secrets appear only in the answers
//! to create and rotate (endpoints) and create (API keys).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use hookline_core::apikey::ApiKey;
use hookline_core::ids::{ApiKeyId, AppId, DeliveryId, EndpointId, EventId, ReplayId};
use hookline_core::model::{Attempt, Delivery, Endpoint};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// Every error answer.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

impl ErrorBody {
    /// `{"error": {"code", "message"}}`: the one error envelope (the API's
    /// answers and the local API Gateway's own).
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        Self {
            error: ErrorDetail {
                code: code.to_owned(),
                message: message.into(),
                location: None,
            },
        }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable machine-readable code, e.g. `invalid_url`, `not_found`.
    pub code: String,
    /// What was wrong, for a human; never echoes secrets.
    pub message: String,
    /// Where in the payload it failed, as a JSON Pointer (`""`: the
    /// payload itself); only with `payload_schema_mismatch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Health {
    pub status: String,
}

/// An endpoint; `secret` only in the answers to create and rotate-secret.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct EndpointOut {
    pub id: String,
    pub url: String,
    pub description: Option<String>,
    /// Event types it receives: exact names, `prefix.*`, or `*`; empty = all.
    pub event_types: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// How many earlier secrets still sign (rotation overlap).
    pub previous_secrets: usize,
    pub disabled: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disabled_reason: Option<String>,
    /// Since when its attempts have all failed (no 2xx since); the endpoint
    /// is disabled once this is older than `WEBHOOKS_DISABLE_AFTER`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failing_since: Option<DateTime<Utc>>,
    /// Present while the endpoint keeps timing out or refusing
    /// connections: its deliveries wait until `open_until` without an
    /// attempt (their budgets kept), then one probe is sent; any HTTP
    /// answer to it closes the circuit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub circuit: Option<hookline_core::circuit::Circuit>,
    /// Sent on every request to the endpoint. Values of credential-like
    /// names (`authorization`, `cookie`, names with `auth`, `token`, `key`,
    /// `secret`, `password`, `session`, `credential`, `signature`) read as
    /// `********`; a PATCH giving `********` keeps the stored value.
    pub headers: BTreeMap<String, String>,
    /// At most this many requests per second to it, across all deliver
    /// instances; absent: no limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<u32>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// What a credential-like header value reads as in answers.
pub const MASKED_HEADER_VALUE: &str = "********";

/// Whether a header's value is a credential (never shown in answers).
pub fn is_sensitive_header(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower == "cookie"
        || [
            "auth",
            "token",
            "key",
            "secret",
            "password",
            "session",
            "credential",
            "signature",
        ]
        .iter()
        .any(|word| lower.contains(word))
}

impl EndpointOut {
    pub fn new(ep: &Endpoint, with_secret: bool) -> Self {
        Self {
            id: ep.id.to_string(),
            url: ep.url.clone(),
            description: ep.description.clone(),
            event_types: ep.event_types.clone(),
            secret: with_secret.then(|| ep.secret.expose().to_owned()),
            previous_secrets: ep.previous_secrets.len(),
            disabled: ep.disabled,
            disabled_reason: ep.disabled_reason.clone(),
            failing_since: ep.failing_since,
            circuit: ep.circuit.clone(),
            headers: ep
                .headers
                .iter()
                .map(|(name, value)| {
                    let shown = if is_sensitive_header(name) {
                        MASKED_HEADER_VALUE.to_owned()
                    } else {
                        value.clone()
                    };
                    (name.clone(), shown)
                })
                .collect(),
            rate_limit: ep.rate_limit,
            created_at: ep.created_at,
            updated_at: ep.updated_at,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct EndpointList {
    pub items: Vec<EndpointOut>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateEndpoint {
    /// `https://` (or `http://` to private hosts when the deployment allows it).
    pub url: String,
    #[serde(default)]
    pub event_types: Vec<String>,
    #[serde(default)]
    pub description: Option<String>,
    /// `whsec_` + base64 of at least 24 bytes; generated when absent.
    #[serde(default)]
    pub secret: Option<String>,
    /// Sent on every request: at most 20, names not reserved (`host`,
    /// `content-*`, `user-agent`, `webhook-*`, `x-webhook-*`, `proxy-*`,
    /// HTTP framing), values visible ASCII up to 2048 bytes.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Requests per second, 1 to 1000, across all deliver instances: a
    /// delivery over the limit waits for its send slot (its attempt budget
    /// untouched). Absent: no limit.
    #[serde(default)]
    pub rate_limit: Option<u32>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateEndpoint {
    #[serde(default)]
    pub url: Option<String>,
    #[serde(default)]
    pub event_types: Option<Vec<String>>,
    #[serde(default)]
    pub description: Option<String>,
    /// Disabled endpoints receive nothing new; pending deliveries fail.
    #[serde(default)]
    pub disabled: Option<bool>,
    /// Replaces every custom header (`{}` removes them all); a value of
    /// `********` keeps the stored value of that header.
    #[serde(default)]
    pub headers: Option<BTreeMap<String, String>>,
    /// Requests per second (1 to 1000); `null` removes the limit; absent
    /// keeps it.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u32>)]
    pub rate_limit: Option<Option<u32>>,
}

/// A field given (even as `null`) is `Some`: `null` then means "remove".
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RotateSecret {
    /// The new secret; generated when absent. The old one keeps signing
    /// alongside it for the deployment's rotation overlap (24 h by default).
    #[serde(default)]
    pub secret: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct EventOut {
    pub id: String,
    pub event_type: String,
    pub created_at: DateTime<Utc>,
    /// The payload as accepted, byte for byte.
    #[schema(value_type = Object)]
    pub payload: Box<serde_json::value::RawValue>,
    /// Endpoints still to get a delivery item (large fan-outs, in chunks).
    pub fanout_pending: usize,
    /// Its `ordering_key`, or null.
    pub ordering_key: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AttemptOut {
    /// 1-based over the delivery's whole life (a retry or resend continues it).
    pub attempt: u32,
    pub at: DateTime<Utc>,
    /// Null when no response came (timeout, refused, reset).
    pub status_code: Option<u16>,
    pub latency_ms: u64,
    pub error: Option<String>,
    /// The first KiB of the response body.
    pub response_body: Option<String>,
}

impl From<&Attempt> for AttemptOut {
    fn from(a: &Attempt) -> Self {
        Self {
            attempt: a.attempt,
            at: a.at,
            status_code: a.status_code,
            latency_ms: a.latency_ms,
            error: a.error.clone(),
            response_body: a.response_body.clone(),
        }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DeliveryOut {
    pub id: String,
    pub event_id: String,
    pub endpoint_id: String,
    pub event_type: String,
    /// `pending`, `delivered` or `failed`.
    pub status: String,
    pub attempt_count: u32,
    pub total_attempts: u32,
    pub manual_retries: u32,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// What receivers see as `webhook-id`: stable across every retry.
    pub message_id: String,
    /// Its event's `ordering_key`, or null.
    pub ordering_key: Option<String>,
    /// While it waits for the previous delivery of its ordering key to its
    /// endpoint to end: that delivery's id; otherwise null.
    pub blocked_by: Option<String>,
    /// Oldest first (the most recent 30); in the detail answer only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempts: Option<Vec<AttemptOut>>,
}

impl DeliveryOut {
    pub fn new(d: &Delivery, with_attempts: bool) -> Self {
        Self {
            id: d.id.to_string(),
            event_id: d.event_id.to_string(),
            endpoint_id: d.endpoint_id.to_string(),
            event_type: d.event_type.to_string(),
            status: d.status.to_string(),
            attempt_count: d.attempt_count,
            total_attempts: d.total_attempts,
            manual_retries: d.manual_retries,
            next_attempt_at: d.next_attempt_at,
            created_at: d.created_at,
            updated_at: d.updated_at,
            message_id: d.message_id().to_string(),
            ordering_key: d.ordering_key.clone(),
            blocked_by: d.blocked_by.as_ref().map(ToString::to_string),
            attempts: with_attempts.then(|| d.attempts.iter().map(AttemptOut::from).collect()),
        }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DeliveryList {
    /// Newest first.
    pub items: Vec<DeliveryOut>,
    /// Pass as `cursor` for the next page; null on the last page.
    pub next_cursor: Option<String>,
}

/// The window of `GET .../endpoints/{endpoint_id}/stats`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct StatsQuery {
    /// RFC 3339, at most 31 days ago; counted from the start of its hour.
    /// Default: 24 hours ago.
    pub since: Option<String>,
}

/// Filters of `GET /v1/apps/{app_id}/deliveries` (all optional).
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DeliveryFilters {
    /// `pending`, `delivered` or `failed`.
    pub status: Option<String>,
    pub endpoint_id: Option<String>,
    /// An exact event type.
    pub event_type: Option<String>,
    /// RFC 3339; deliveries created at or after it.
    pub created_after: Option<String>,
    /// RFC 3339; deliveries created before it.
    pub created_before: Option<String>,
    /// 1..=500, default 50.
    pub limit: Option<String>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateApiKey {
    /// A label for people ("billing service").
    #[serde(default)]
    pub name: Option<String>,
}

/// An API key; `key` only in the answer to create (it is stored hashed).
/// Portal sessions are listed too, with their end (`portal_until`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ApiKeyOut {
    pub id: String,
    pub app_id: String,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    pub created_at: DateTime<Utc>,
    /// A portal session's end (absent for an API key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub portal_until: Option<DateTime<Utc>>,
}

impl ApiKeyOut {
    pub fn new(k: &ApiKey, key: Option<String>) -> Self {
        Self {
            id: k.id.to_string(),
            app_id: k.app_id.to_string(),
            name: k.name.clone(),
            key,
            created_at: k.created_at,
            portal_until: k.portal_until,
        }
    }
}

/// The body of `POST /v1/apps/{app_id}/portal-sessions` (optional).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreatePortalSession {
    /// How long the session works: 60 to 86400 seconds, default 3600.
    #[serde(default)]
    pub expires_in_seconds: Option<u32>,
}

/// A new portal session: `token` and `url` are in this answer only (the
/// token is stored hashed). Hand `url` to the app's customer: it opens the
/// consumer portal already signed in (the app and the token ride in the
/// `#app=…&token=…` fragment, which browsers never send to a server).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PortalSessionOut {
    /// Revoke with `DELETE /v1/apps/{app_id}/portal-sessions/{id}`.
    pub id: String,
    pub app_id: String,
    /// A bearer token for the app's portal routes only.
    pub token: String,
    pub url: String,
    pub expires_at: DateTime<Utc>,
}

/// A live portal session as listed: never its token.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PortalSessionSummary {
    pub id: String,
    pub expires_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PortalSessionList {
    pub items: Vec<PortalSessionSummary>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ApiKeyList {
    pub items: Vec<ApiKeyOut>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DlqStatus {
    /// Approximate number of messages in the dead-letter queue.
    pub depth: u64,
}

/// The answer to a batch of events: one result per event, in request order.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BatchResponse {
    pub items: Vec<BatchItemOut>,
}

/// One event's result: accepted (202, with its ids; `replayed` when its
/// idempotency key answered before) or refused with the status and error a
/// single `POST /events` would have got. Nothing of a refused event is written.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BatchItemOut {
    pub status: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery_ids: Option<Vec<String>>,
    #[serde(default)]
    pub replayed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorDetail>,
}

/// `{app_id}` in a path.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct AppPath {
    /// The tenant: 1-64 characters of `A-Z a-z 0-9 _ - .`.
    #[param(value_type = String)]
    pub app_id: AppId,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct EndpointPath {
    #[param(value_type = String)]
    pub app_id: AppId,
    #[param(value_type = String)]
    pub endpoint_id: EndpointId,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ReplayPath {
    #[param(value_type = String)]
    pub app_id: AppId,
    #[param(value_type = String)]
    pub endpoint_id: EndpointId,
    #[param(value_type = String)]
    pub replay_id: ReplayId,
}

/// A replay of the events an endpoint never had, and its progress.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ReplayOut {
    #[schema(value_type = String)]
    pub id: ReplayId,
    #[schema(value_type = String)]
    pub endpoint_id: EndpointId,
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
    /// Deliveries created so far (one per event the endpoint never had).
    pub replayed: u64,
    /// Events of the app in the window looked at so far.
    pub scanned: u64,
    /// The whole window is done; while false the replay continues in the
    /// background: follow it at `status_url`.
    pub complete: bool,
    /// Why it ended before the end of the window (the endpoint was deleted
    /// or disabled meanwhile).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
    /// Where to follow its progress.
    pub status_url: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl ReplayOut {
    pub fn new(replay: &hookline_pipeline::replay::Replay) -> Self {
        Self {
            id: replay.id.clone(),
            endpoint_id: replay.endpoint_id.clone(),
            since: replay.since,
            until: replay.until,
            replayed: replay.replayed,
            scanned: replay.scanned,
            complete: replay.complete,
            stopped: replay.stopped.clone(),
            status_url: format!(
                "/v1/apps/{}/endpoints/{}/replays/{}",
                replay.app_id, replay.endpoint_id, replay.id
            ),
            created_at: replay.created_at,
            updated_at: replay.updated_at,
        }
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct DeliveryPath {
    #[param(value_type = String)]
    pub app_id: AppId,
    #[param(value_type = String)]
    pub delivery_id: DeliveryId,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct EventPath {
    #[param(value_type = String)]
    pub app_id: AppId,
    #[param(value_type = String)]
    pub event_id: EventId,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ApiKeyPath {
    #[param(value_type = String)]
    pub app_id: AppId,
    #[param(value_type = String)]
    pub key_id: ApiKeyId,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct PortalSessionPath {
    #[param(value_type = String)]
    pub app_id: AppId,
    /// The session's `id` (from its creation).
    #[param(value_type = String)]
    pub session_id: ApiKeyId,
}

/// The optional `Idempotency-Key` header of event ingestion.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Header)]
pub struct IdempotencyHeader {
    /// Up to 255 visible ASCII characters; the same key again within 24 h
    /// returns the first answer and writes nothing.
    #[param(rename = "Idempotency-Key")]
    pub idempotency_key: Option<String>,
}

/// `{name}` of a catalog type in a path.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct EventTypePath {
    /// An exact event type: 1-128 characters of `A-Z a-z 0-9 . _ - :`.
    #[param(value_type = String)]
    pub name: hookline_core::model::EventType,
}

/// Paging of `GET /v1/event-types`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventTypeQuery {
    /// 1..=100, default 50.
    pub limit: Option<String>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// A type of the event-type catalog.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct EventTypeOut {
    pub name: String,
    pub description: Option<String>,
    /// The JSON Schema payloads of this type must match (none: any payload).
    #[schema(value_type = Option<Object>)]
    pub schema: Option<serde_json::Value>,
    /// An example payload (matches `schema`).
    #[schema(value_type = Option<Object>)]
    pub example: Option<serde_json::Value>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<hookline_core::catalog::EventTypeDef> for EventTypeOut {
    fn from(def: hookline_core::catalog::EventTypeDef) -> Self {
        Self {
            name: def.name.to_string(),
            description: def.description,
            schema: def.schema,
            example: def.example,
            created_at: def.created_at,
            updated_at: def.updated_at,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct EventTypeList {
    /// By name.
    pub items: Vec<EventTypeOut>,
    /// Pass as `cursor` for the next page; null on the last page.
    pub next_cursor: Option<String>,
}
