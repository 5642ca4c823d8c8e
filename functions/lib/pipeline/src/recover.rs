//! Manual recovery of failed deliveries: one at a time (the retry route) or
//! every failed delivery of an endpoint created in a time window (bulk
//! recover). A recovered delivery goes back to `pending` with a fresh attempt
//! budget through one conditional update; the table's stream then dispatches
//! it like any new delivery, so recovery shares the normal delivery path.

use chrono::{DateTime, Utc};
use hookline_core::ids::{AppId, EndpointId};
use hookline_core::model::{Delivery, DeliveryStatus};
use serde::{Deserialize, Serialize};

use crate::ports::{DeliveryQuery, Store};
use crate::PipelineError;

/// What a single retry did.
#[derive(Debug, Clone, PartialEq)]
pub enum RetryOutcome {
    /// Back to pending; the stored state.
    Retried(Box<Delivery>),
    /// Not in a state this restart accepts (pending; or delivered, for a
    /// retry of failed ones only): nothing done.
    NotFailed(DeliveryStatus),
    /// It changed between read and write (another retry won); nothing written.
    Changed,
}

/// Moves one failed delivery back to pending (conditional on its read state).
pub async fn retry_failed<S: Store>(
    store: &S,
    delivery: Delivery,
    now: DateTime<Utc>,
) -> Result<RetryOutcome, PipelineError> {
    restart(store, delivery, false, now).await
}

/// The retry route: a failed delivery is retried, a delivered one is resent
/// (same `webhook-id`); a pending one is left alone ([`RetryOutcome::NotFailed`]).
pub async fn retry_or_resend<S: Store>(
    store: &S,
    delivery: Delivery,
    now: DateTime<Utc>,
) -> Result<RetryOutcome, PipelineError> {
    restart(store, delivery, true, now).await
}

async fn restart<S: Store>(
    store: &S,
    mut delivery: Delivery,
    resend_delivered: bool,
    now: DateTime<Utc>,
) -> Result<RetryOutcome, PipelineError> {
    let expected = delivery.version;
    let restarted = match delivery.status {
        DeliveryStatus::Delivered if resend_delivered => delivery.resend(now),
        _ => delivery.manual_retry(now),
    };
    if restarted.is_err() {
        return Ok(RetryOutcome::NotFailed(delivery.status));
    }
    // The event first: a restarted delivery must not outlive its body.
    store
        .extend_event_retention(&delivery.app_id, &delivery.event_id, now)
        .await?;
    if store.update_delivery(&delivery, expected).await? {
        tracing::info!(
            delivery_id = %delivery.id,
            endpoint_id = %delivery.endpoint_id,
            manual_retries = delivery.manual_retries,
            "manual retry"
        );
        Ok(RetryOutcome::Retried(Box::new(delivery)))
    } else {
        Ok(RetryOutcome::Changed)
    }
}

/// The bulk recover route's body.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RecoverRequest {
    /// Recover failed deliveries created at or after this time.
    pub since: DateTime<Utc>,
    /// ... and before this time (default: now).
    #[serde(default)]
    pub until: Option<DateTime<Utc>>,
}

/// Deliveries one call looks at, at most; a caller repeats the call (which
/// is idempotent: recovered deliveries are no longer failed) while
/// `complete` is false.
pub const MAX_RECOVER_SCAN: u32 = 5_000;

/// What a bulk recover did.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoverReport {
    /// Failed deliveries moved back to pending.
    pub recovered: u32,
    /// Failed deliveries that changed meanwhile (retried by someone else).
    pub skipped: u32,
    /// Deliveries of the endpoint looked at in the window.
    pub scanned: u32,
    /// False when the scan limit stopped the call early: call again.
    pub complete: bool,
}

/// Recovers every failed delivery of `endpoint` created in `[since, until)`.
pub async fn recover_endpoint<S: Store>(
    store: &S,
    app: &AppId,
    endpoint: &EndpointId,
    request: &RecoverRequest,
    now: DateTime<Utc>,
) -> Result<RecoverReport, PipelineError> {
    let until = request.until.unwrap_or(now);
    if until <= request.since {
        return Err(PipelineError::Invalid {
            code: "invalid_time_range",
            message: "`since` must be before `until` (and before now)".into(),
        });
    }
    let mut report = RecoverReport::default();
    let mut query = DeliveryQuery {
        endpoint_id: Some(endpoint.clone()),
        status: Some(DeliveryStatus::Failed),
        created_after: Some(request.since),
        created_before: Some(until),
        limit: 500,
        ..DeliveryQuery::default()
    };
    loop {
        let page = store.list_deliveries(app, &query).await?;
        report.scanned += u32::try_from(page.items.len()).unwrap_or(u32::MAX);
        for delivery in page.items {
            match retry_failed(store, delivery, now).await? {
                RetryOutcome::Retried(_) => report.recovered += 1,
                RetryOutcome::Changed => report.skipped += 1,
                RetryOutcome::NotFailed(_) => {}
            }
        }
        match page.next_cursor {
            None => {
                report.complete = true;
                break;
            }
            Some(cursor) if report.scanned < MAX_RECOVER_SCAN => query.before = Some(cursor),
            Some(_) => break,
        }
    }
    tracing::info!(
        app_id = %app,
        endpoint_id = %endpoint,
        recovered = report.recovered,
        skipped = report.skipped,
        complete = report.complete,
        "bulk recover"
    );
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::MemoryStore;
    use chrono::Duration;
    use hookline_core::ids::{DeliveryId, EventId};
    use hookline_core::model::{Attempt, Event, EventType};
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn failed(at: DateTime<Utc>, endpoint: &EndpointId, rng: &mut StdRng) -> Delivery {
        let event = Event::new(
            EventId::new(at, rng),
            AppId::parse("acme").unwrap(),
            EventType::parse("order.paid").unwrap(),
            &serde_json::value::RawValue::from_string("{}".into()).unwrap(),
            at,
        );
        let mut d = Delivery::new(DeliveryId::new(at, rng), &event, endpoint.clone(), at);
        d.fail_now(Attempt::new(
            1,
            at,
            Some(500),
            std::time::Duration::ZERO,
            None,
            None,
        ))
        .unwrap();
        d
    }

    #[tokio::test]
    async fn recovers_only_failed_deliveries_of_the_endpoint_in_the_window() {
        let mut rng = StdRng::seed_from_u64(3);
        let now = Utc::now();
        let store = MemoryStore::default();
        let app = AppId::parse("acme").unwrap();
        let ep = EndpointId::new(now, &mut rng);
        let other = EndpointId::new(now, &mut rng);
        let old = failed(now - Duration::hours(5), &ep, &mut rng);
        let mut recent = Vec::new();
        for i in 0..7 {
            let d = failed(now - Duration::minutes(50 - i), &ep, &mut rng);
            recent.push(d.id.clone());
            store.insert_delivery(d);
        }
        store.insert_delivery(old.clone());
        store.insert_delivery(failed(now - Duration::minutes(5), &other, &mut rng));
        let request = RecoverRequest {
            since: now - Duration::hours(1),
            until: None,
        };
        let report = recover_endpoint(&store, &app, &ep, &request, now)
            .await
            .unwrap();
        assert_eq!((report.recovered, report.complete), (7, true));
        for d in store.deliveries() {
            let expect = if recent.contains(&d.id) {
                DeliveryStatus::Pending
            } else {
                DeliveryStatus::Failed
            };
            assert_eq!(d.status, expect, "{}", d.id);
        }
        // Idempotent: nothing left to recover.
        let again = recover_endpoint(&store, &app, &ep, &request, now)
            .await
            .unwrap();
        assert_eq!(again.recovered, 0);
        let bad = RecoverRequest {
            since: now,
            until: Some(now - Duration::seconds(1)),
        };
        assert!(matches!(
            recover_endpoint(&store, &app, &ep, &bad, now).await,
            Err(PipelineError::Invalid { .. })
        ));
    }
}
