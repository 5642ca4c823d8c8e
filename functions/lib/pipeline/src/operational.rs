//! Operational webhooks: events about the system itself, sent as events of
//! the reserved app [`OPERATIONAL_APP`] and delivered by the same pipeline
//! (signed, retried, logged) to whatever endpoints the operator registers
//! there.
//!
//! | type | when | payload |
//! |---|---|---|
//! | `endpoint.disabled` | deliver disables an endpoint (410, or failing for `WEBHOOKS_DISABLE_AFTER`), or an operator does | `{app_id, endpoint_id, reason}` |
//! | `endpoint.enabled` | an operator enables a disabled endpoint | `{app_id, endpoint_id}` |
//! | `delivery.failed` | a delivery ends `failed` (attempts exhausted, endpoint gone or disabled, blocked) | `{app_id, delivery_id, endpoint_id, event_id, event_type, attempts, last_error}` |
//!
//! Nothing is lost and nothing is announced twice: the event is accepted
//! *before* the change it announces is written, under an `Idempotency-Key`
//! naming the occurrence (the subject, the version or attempt it happened
//! at, and a digest of the payload). A crash between the two re-runs the
//! step, which sends the same key: the first answer is replayed. Changes of
//! the operational app's own endpoints and deliveries announce nothing
//! (an operational endpoint that fails would otherwise feed itself).

use chrono::{DateTime, Utc};
use hookline_core::ids::{AppId, DeliveryId, EndpointId, EventId};
use rand::RngCore;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::ports::Store;
use crate::{PipelineError, Settings};

/// The reserved app receiving operational events (admin key only).
pub const OPERATIONAL_APP: &str = "_operational";

/// True for the reserved operational app.
pub fn is_operational(app: &AppId) -> bool {
    app.as_str() == OPERATIONAL_APP
}

/// One operational event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Operational {
    EndpointDisabled {
        app_id: AppId,
        endpoint_id: EndpointId,
        reason: String,
    },
    EndpointEnabled {
        app_id: AppId,
        endpoint_id: EndpointId,
    },
    DeliveryFailed {
        app_id: AppId,
        delivery_id: DeliveryId,
        endpoint_id: EndpointId,
        event_id: EventId,
        event_type: String,
        attempts: u32,
        last_error: String,
    },
}

impl Operational {
    /// The event type receivers subscribe to.
    pub fn event_type(&self) -> &'static str {
        match self {
            Self::EndpointDisabled { .. } => "endpoint.disabled",
            Self::EndpointEnabled { .. } => "endpoint.enabled",
            Self::DeliveryFailed { .. } => "delivery.failed",
        }
    }

    /// The app the event is about.
    pub fn app_id(&self) -> &AppId {
        match self {
            Self::EndpointDisabled { app_id, .. }
            | Self::EndpointEnabled { app_id, .. }
            | Self::DeliveryFailed { app_id, .. } => app_id,
        }
    }

    fn subject(&self) -> &str {
        match self {
            Self::EndpointDisabled { endpoint_id, .. }
            | Self::EndpointEnabled { endpoint_id, .. } => endpoint_id.as_str(),
            Self::DeliveryFailed { delivery_id, .. } => delivery_id.as_str(),
        }
    }

    /// The event's `Idempotency-Key`: type, subject, `occurrence` (what
    /// tells two real occurrences apart: the endpoint version the change
    /// was made from, the attempt number) and a digest of the payload.
    pub fn idempotency_key(&self, occurrence: u64, payload: &str) -> String {
        let digest = hex::encode(&Sha256::digest(payload.as_bytes())[..12]);
        format!(
            "{}:{}:{occurrence}:{digest}",
            self.event_type(),
            self.subject()
        )
    }
}

/// Accepts `event` into the operational app (unless it is about that app
/// itself). `occurrence`: see [`Operational::idempotency_key`]. Sending the
/// same occurrence again is a no-op.
pub async fn announce<S: Store>(
    store: &S,
    settings: &Settings,
    event: &Operational,
    occurrence: u64,
    now: DateTime<Utc>,
    rng: &mut (dyn RngCore + Send),
) -> Result<(), PipelineError> {
    if is_operational(event.app_id()) {
        return Ok(());
    }
    let payload =
        serde_json::to_string(event).map_err(|e| PipelineError::Corrupt(e.to_string()))?;
    let key = event.idempotency_key(occurrence, &payload);
    let body = format!(
        r#"{{"event_type":"{}","payload":{payload}}}"#,
        event.event_type()
    );
    let accepted = crate::ingest::ingest(
        store,
        settings,
        &crate::ingest::Unchecked,
        OPERATIONAL_APP,
        Some(&key),
        body.as_bytes(),
        now,
        rng,
    )
    .await?;
    tracing::info!(
        event_type = event.event_type(),
        app_id = %event.app_id(),
        subject = event.subject(),
        replayed = accepted.replayed,
        "operational event accepted"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::MemoryStore;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn disabled(app: &str) -> Operational {
        Operational::EndpointDisabled {
            app_id: AppId::parse(app).unwrap(),
            endpoint_id: EndpointId::new(Utc::now(), &mut StdRng::seed_from_u64(1)),
            reason: "endpoint answered 410 Gone".into(),
        }
    }

    fn endpoint_id(event: &Operational) -> String {
        match event {
            Operational::EndpointDisabled { endpoint_id, .. } => endpoint_id.to_string(),
            _ => unreachable!(),
        }
    }

    #[tokio::test]
    async fn an_occurrence_is_announced_once_and_the_operational_app_never_about_itself() {
        let store = MemoryStore::default();
        let settings = Settings::for_tests(&[]).unwrap();
        let mut rng = StdRng::seed_from_u64(7);
        let now = Utc::now();
        let event = disabled("shop");
        for _ in 0..2 {
            announce(&store, &settings, &event, 3, now, &mut rng)
                .await
                .unwrap();
        }
        // Another occurrence (re-enabled, then disabled again) is another event.
        announce(&store, &settings, &event, 5, now, &mut rng)
            .await
            .unwrap();
        announce(
            &store,
            &settings,
            &disabled(OPERATIONAL_APP),
            1,
            now,
            &mut rng,
        )
        .await
        .unwrap();
        let events = store.events();
        assert_eq!(events.len(), 2, "{events:?}");
        for stored in &events {
            assert_eq!(stored.event.app_id.as_str(), OPERATIONAL_APP);
            assert_eq!(stored.event.event_type.as_str(), "endpoint.disabled");
            let body: serde_json::Value = serde_json::from_str(&stored.event.body).unwrap();
            assert_eq!(
                body["data"],
                serde_json::json!({"app_id": "shop", "endpoint_id": endpoint_id(&event), "reason": "endpoint answered 410 Gone"})
            );
        }
    }
}
