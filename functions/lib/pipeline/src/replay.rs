//! Replay missing: give an endpoint one delivery of every event of its app
//! created in a window that it subscribes to and never had a delivery for
//! (sent while it was disabled, before it existed, or filtered out then).
//!
//! - What "never had" means: the endpoint is not in the event's listed
//!   fan-out nor in its fan-out still to materialise, and there is no item
//!   at `DeliveryId::for_event_endpoint(event, endpoint)` (the id a large
//!   fan-out's deliveries and earlier replays use). The new delivery takes
//!   that id through a put-if-absent ([`Store::create_delivery`]), so a
//!   second replay of the same window, or two at once, replay 0: nothing is
//!   ever delivered twice because of a replay.
//! - Bounded: [`advance`] reads one page of the window's events
//!   ([`REPLAY_PAGE`]); the API call advances for up to [`INLINE_BUDGET`]
//!   (`WEBHOOKS_REPLAY_INLINE_BUDGET`) and
//!   answers with the replay's state. A replay not done by then is stored
//!   running: each write of it is a stream record that dispatch answers by
//!   advancing it one page more ([`continue_replay`]), and the overdue index
//!   holds it while running, so the reconciler continues one that stalled.
//!   Progress: `GET .../endpoints/{id}/replays/{replay_id}`.
//! - A replayed delivery is pending and due now; its event's retention is
//!   extended first (the delivery must not outlive its body), then the
//!   stream dispatches it like any new delivery.

use std::time::Duration;

use chrono::{DateTime, Utc};
use hookline_core::ids::{AppId, DeliveryId, EndpointId, ReplayId};
use hookline_core::model::{Delivery, Endpoint, EndpointRoute};
use rand::RngCore;
use serde::{Deserialize, Serialize};

use crate::ports::{Store, StoredEvent};
use crate::PipelineError;

/// Events read per step (one page of the time indexes, one batch read).
pub const REPLAY_PAGE: usize = 200;
/// How long the API call itself advances a replay before answering, by
/// default (`WEBHOOKS_REPLAY_INLINE_BUDGET`).
pub const INLINE_BUDGET: Duration = Duration::from_secs(5);

/// The replay route's body.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayRequest {
    /// Replay events created at or after this time.
    pub since: DateTime<Utc>,
    /// ... and before this time (default: now).
    #[serde(default)]
    pub until: Option<DateTime<Utc>>,
}

/// A replay and its progress, as stored and as the API shows it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Replay {
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub id: ReplayId,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub app_id: AppId,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub endpoint_id: EndpointId,
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
    /// Deliveries created so far.
    pub replayed: u64,
    /// Events of the app in the window looked at so far.
    pub scanned: u64,
    /// Every event of the window has been looked at (or the replay stopped).
    pub complete: bool,
    /// Why it ended before the end of the window (the endpoint was deleted
    /// or disabled meanwhile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
    /// Where the next step reads from (opaque to all but the store).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub position: String,
    /// Bumped by every step (optimistic concurrency between steps).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub version: u64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl Replay {
    /// A new replay of `[since, until)` (until: default now) for `endpoint`,
    /// a window within `retention` (nothing older is kept: a longer one
    /// would only cost reads).
    pub fn new(
        endpoint: &Endpoint,
        request: &ReplayRequest,
        now: DateTime<Utc>,
        retention: Duration,
        rng: &mut dyn RngCore,
    ) -> Result<Self, PipelineError> {
        let until = request.until.unwrap_or(now).min(now);
        if until <= request.since {
            return Err(PipelineError::invalid(
                "invalid_time_range",
                "`since` must be before `until` (and before now)",
            ));
        }
        let kept = chrono::Duration::from_std(retention).unwrap_or(chrono::Duration::MAX);
        if request.since < now - kept {
            return Err(PipelineError::invalid(
                "invalid_time_range",
                format!(
                    "`since` is before the retention ({} days): nothing older is kept",
                    kept.num_days()
                ),
            ));
        }
        Ok(Self {
            id: ReplayId::new(now, rng),
            app_id: endpoint.app_id.clone(),
            endpoint_id: endpoint.id.clone(),
            since: request.since,
            until,
            replayed: 0,
            scanned: 0,
            complete: false,
            stopped: None,
            position: String::new(),
            version: 0,
            created_at: now,
            updated_at: now,
        })
    }
}

/// Whether `endpoint` should get a replayed delivery of `stored`, judged
/// from the event alone (the put-if-absent decides the rest): it subscribes
/// to the type now, and the event did not list it or will not materialise
/// one for it. A test event (sent to one endpoint by hand) is no one
/// else's.
pub fn wants(endpoint: &EndpointRoute, stored: &StoredEvent) -> bool {
    !stored.event.test
        && endpoint.receives(&stored.event.event_type)
        && !stored.targets.contains(&endpoint.id)
        && !stored.fanout_remaining.contains(&endpoint.id)
}

/// Advances `replay` by one page of its window: one delivery for each event
/// the endpoint wants and has none of. Changes `replay` in memory only; the
/// caller stores it.
#[tracing::instrument(name = "replay", skip_all, fields(replay_id = %replay.id, endpoint_id = %endpoint.id))]
pub async fn advance<S: Store>(
    store: &S,
    endpoint: &EndpointRoute,
    replay: &mut Replay,
    now: DateTime<Utc>,
) -> Result<(), PipelineError> {
    let window = store
        .events_in_window(
            &replay.app_id,
            replay.since,
            replay.until,
            &replay.position,
            REPLAY_PAGE,
        )
        .await?;
    for stored in &window.events {
        replay.scanned += 1;
        if !wants(endpoint, stored) {
            continue;
        }
        let event = &stored.event;
        let delivery = Delivery::new(
            DeliveryId::for_event_endpoint(&event.id, &endpoint.id),
            event,
            endpoint.id.clone(),
            now,
        );
        // The event first: the delivery must not outlive its body.
        store
            .extend_event_retention(&event.app_id, &event.id, now)
            .await?;
        if store.create_delivery(&delivery).await? {
            replay.replayed += 1;
            tracing::debug!(event_id = %event.id, delivery_id = %delivery.id, "replayed");
        }
    }
    replay.position = window.position;
    replay.complete = window.complete;
    replay.updated_at = now;
    Ok(())
}

/// The replay route: a new replay, advanced until done or `budget` is
/// spent, then stored (running, when not done: the background continues
/// it). `clock` is read between steps.
pub async fn start_replay<S: Store>(
    store: &S,
    endpoint: &Endpoint,
    request: &ReplayRequest,
    clock: impl Fn() -> DateTime<Utc>,
    budget: Duration,
    retention: Duration,
    rng: &mut (dyn RngCore + Send),
) -> Result<Replay, PipelineError> {
    if endpoint.disabled {
        return Err(PipelineError::Conflict(
            "the endpoint is disabled: enable it, then replay".into(),
        ));
    }
    let started = clock();
    let mut replay = Replay::new(endpoint, request, started, retention, rng)?;
    // One running replay per endpoint: the slot names the last one started.
    let holder = store.replay_slot(&endpoint.app_id, &endpoint.id).await?;
    if let Some(slot) = &holder {
        let running = match store.get_replay(&slot.replay_id).await? {
            Some(earlier) => !earlier.complete,
            // Taken, its replay not stored yet: still inside its first call.
            None => started - slot.taken_at < SLOT_UNSTORED_FOR,
        };
        if running {
            return Err(replay_running(&slot.replay_id));
        }
    }
    let held_by = holder.as_ref().map(|slot| &slot.replay_id);
    if !store
        .take_replay_slot(&endpoint.app_id, &endpoint.id, &replay.id, held_by, started)
        .await?
    {
        // Another start took it meanwhile.
        let slot = store.replay_slot(&endpoint.app_id, &endpoint.id).await?;
        return Err(replay_running(
            slot.as_ref().map_or(&replay.id, |s| &s.replay_id),
        ));
    }
    let deadline =
        started + chrono::Duration::from_std(budget).expect("the inline budget is a few seconds");
    let route = EndpointRoute::from(endpoint);
    while !replay.complete && clock() < deadline {
        advance(store, &route, &mut replay, clock()).await?;
    }
    if !store.put_replay(&replay, None).await? {
        return Err(PipelineError::Conflict("replay id taken".into()));
    }
    tracing::info!(replay_id = %replay.id, endpoint_id = %endpoint.id, replayed = replay.replayed, complete = replay.complete, "replay started");
    Ok(replay)
}

/// A slot taken by a replay whose item is missing this long after counts
/// as free: its start stopped before storing it (a start stores it within
/// its inline budget, at most 20 s).
pub const SLOT_UNSTORED_FOR: chrono::TimeDelta = chrono::TimeDelta::minutes(1);

fn replay_running(id: &ReplayId) -> PipelineError {
    PipelineError::Limit {
        code: "replay_running",
        message: format!(
            "replay {id} of this endpoint is still running: follow it at its status URL, then start another"
        ),
    }
}

/// What [`continue_replay`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Continued {
    /// One more page done (and stored: its write continues the chain).
    Advanced,
    /// Nothing to do: gone, complete, or another step got there first.
    Nothing,
}

/// The background step of a running replay (dispatch, on its stream record;
/// the reconciler, when it stalled): one more page, stored if the replay is
/// still at the version read (a concurrent step loses and stops).
pub async fn continue_replay<S: Store>(
    store: &S,
    id: &ReplayId,
    now: DateTime<Utc>,
) -> Result<Continued, PipelineError> {
    let Some(mut replay) = store.get_replay(id).await? else {
        tracing::warn!(replay_id = %id, "a running replay's item is gone");
        return Ok(Continued::Nothing);
    };
    if replay.complete {
        return Ok(Continued::Nothing);
    }
    let expected = replay.version;
    replay.version += 1;
    // The routes, not the endpoint: no secret is opened (no KMS call).
    let routes = store.list_routes(&replay.app_id).await?;
    match routes.into_iter().find(|r| r.id == replay.endpoint_id) {
        None => stop(&mut replay, "endpoint deleted", now),
        Some(endpoint) if endpoint.disabled => stop(&mut replay, "endpoint disabled", now),
        Some(endpoint) => advance(store, &endpoint, &mut replay, now).await?,
    }
    if !store.put_replay(&replay, Some(expected)).await? {
        return Ok(Continued::Nothing);
    }
    if replay.complete {
        tracing::info!(replay_id = %replay.id, replayed = replay.replayed, scanned = replay.scanned, stopped = replay.stopped.as_deref(), "replay complete");
    }
    Ok(Continued::Advanced)
}

fn stop(replay: &mut Replay, why: &str, now: DateTime<Utc>) {
    replay.complete = true;
    replay.stopped = Some(why.to_owned());
    replay.updated_at = now;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::{MemoryQueue, MemoryStore};
    use crate::reconcile::reconcile;
    use crate::Settings;
    use hookline_core::ids::EventId;
    use hookline_core::model::{DeliveryStatus, Event, EventType};
    use hookline_core::signing::Secret;
    use serde_json::value::RawValue;

    const RETENTION: Duration = Duration::from_secs(30 * 86_400);

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
    }

    fn rng() -> rand::rngs::StdRng {
        rand::SeedableRng::from_entropy()
    }

    fn app() -> AppId {
        AppId::parse("shop").unwrap()
    }

    fn endpoint(types: &[&str]) -> Endpoint {
        Endpoint {
            event_types: types.iter().map(|t| (*t).to_owned()).collect(),
            ..Endpoint::new(
                EndpointId::generate(),
                app(),
                "https://example.com/h",
                Secret::generate(&mut rng()),
                at(0),
            )
        }
    }

    /// Stores an event of `app` made at `secs`, listing `targets`.
    fn event(
        store: &MemoryStore,
        app: &AppId,
        kind: &str,
        secs: i64,
        targets: &[&EndpointId],
    ) -> Event {
        let event = Event::new(
            EventId::new_fanout_base(at(secs), &mut rng()),
            app.clone(),
            EventType::parse(kind).unwrap(),
            &RawValue::from_string("{}".into()).unwrap(),
            at(secs),
        );
        store.insert_event(StoredEvent {
            event: event.clone(),
            targets: targets.iter().map(|t| (*t).clone()).collect(),
            fanout_remaining: vec![],
            fanout_version: 0,
        });
        event
    }

    fn request(since: i64, until: Option<i64>) -> ReplayRequest {
        ReplayRequest {
            since: at(since),
            until: until.map(at),
        }
    }

    /// A start at `now` (seconds) with the inline budget.
    async fn try_start(
        store: &MemoryStore,
        ep: &Endpoint,
        req: &ReplayRequest,
        now: i64,
    ) -> Result<Replay, PipelineError> {
        start_replay(
            store,
            ep,
            req,
            || at(now),
            INLINE_BUDGET,
            RETENTION,
            &mut rng(),
        )
        .await
    }

    async fn start(
        store: &MemoryStore,
        ep: &Endpoint,
        req: &ReplayRequest,
        budget: Duration,
    ) -> Replay {
        start_replay(store, ep, req, || at(1000), budget, RETENTION, &mut rng())
            .await
            .unwrap()
    }

    /// Only the events the endpoint never had get a delivery: not one it
    /// was listed in, not another type, another app, or outside the window,
    /// nor one it already has an item for (a large fan-out's); a second
    #[test]
    fn a_test_event_is_wanted_by_no_other_endpoint() {
        let ep = endpoint(&[]);
        let route = EndpointRoute::from(&ep);
        let other = EndpointId::generate();
        let mut event = Event::new(
            EventId::generate(),
            app(),
            EventType::parse("order.paid").unwrap(),
            &RawValue::from_string("{}".into()).unwrap(),
            at(0),
        );
        let stored = |event: &Event| StoredEvent {
            event: event.clone(),
            targets: vec![other.clone()],
            fanout_remaining: vec![],
            fanout_version: 0,
        };
        assert!(wants(&route, &stored(&event)));
        event.mark_test();
        assert!(!wants(&route, &stored(&event)));
    }

    /// replay replays 0.
    #[tokio::test]
    async fn replays_exactly_the_missing_events_once() {
        let store = MemoryStore::default();
        let ep = endpoint(&["order.*"]);
        let other = EndpointId::generate();
        let missed = event(&store, &app(), "order.paid", 10, &[&other]);
        let unrouted = event(&store, &app(), "order.shipped", 20, &[]);
        let _had = event(&store, &app(), "order.paid", 30, &[&other, &ep.id]);
        let _filtered = event(&store, &app(), "user.created", 40, &[]);
        let _other_app = event(
            &store,
            &AppId::parse("other").unwrap(),
            "order.paid",
            50,
            &[],
        );
        let _before = event(&store, &app(), "order.paid", 5, &[]);
        let _after = event(&store, &app(), "order.paid", 100, &[]);
        let materialised = event(&store, &app(), "order.paid", 60, &[]);
        let existing = Delivery::new(
            DeliveryId::for_event_endpoint(&materialised.id, &ep.id),
            &materialised,
            ep.id.clone(),
            at(60),
        );
        store.insert_delivery(existing);

        let replay = start(&store, &ep, &request(10, Some(100)), INLINE_BUDGET).await;
        assert!(replay.complete);
        assert_eq!((replay.replayed, replay.scanned), (2, 5));
        let mut replayed: Vec<Delivery> = store
            .delivery_items()
            .into_iter()
            .filter(|d| d.endpoint_id == ep.id && d.event_id != materialised.id)
            .collect();
        replayed.sort_by(|a, b| a.event_id.cmp(&b.event_id));
        let events: Vec<EventId> = replayed.iter().map(|d| d.event_id.clone()).collect();
        assert_eq!(events, [missed.id.clone(), unrouted.id.clone()]);
        for d in &replayed {
            assert_eq!(d.status, DeliveryStatus::Pending);
            assert_eq!(d.id, DeliveryId::for_event_endpoint(&d.event_id, &ep.id));
            assert_eq!(store.retained_from(&d.event_id), Some(at(1000)));
        }
        assert_eq!(store.get_replay(&replay.id).await.unwrap(), Some(replay));

        let again = start(&store, &ep, &request(10, Some(100)), INLINE_BUDGET).await;
        assert_eq!((again.replayed, again.complete), (0, true));
        // A wider window adds exactly the two events outside the first one.
        let wider = start(&store, &ep, &request(0, None), INLINE_BUDGET).await;
        assert_eq!((wider.replayed, wider.complete), (2, true));
        let last = start(&store, &ep, &request(0, None), INLINE_BUDGET).await;
        assert_eq!(last.replayed, 0);
    }

    /// A replay the call does not finish is stored running and advanced
    /// step by step in the background, a step at a time (a stale step loses
    /// to the version and does nothing); the reconciler continues one that
    /// stalled.
    #[tokio::test]
    async fn a_long_replay_continues_in_the_background_and_the_reconciler_resumes_it() {
        let store = MemoryStore::default();
        let ep = endpoint(&[]);
        store
            .put_endpoint(&ep, crate::settings::MAX_ENDPOINTS_PER_APP_CEILING)
            .await
            .unwrap();
        let total = REPLAY_PAGE * 2 + 7;
        for i in 0..total {
            event(
                &store,
                &app(),
                "order.paid",
                10 + i64::try_from(i).unwrap(),
                &[],
            );
        }
        let replay = start(&store, &ep, &request(0, None), Duration::ZERO).await;
        assert!(!replay.complete);
        assert_eq!(replay.replayed, 0);
        assert_eq!(
            continue_replay(&store, &replay.id, at(1001)).await.unwrap(),
            Continued::Advanced
        );
        let after_one = store.get_replay(&replay.id).await.unwrap().unwrap();
        assert_eq!(after_one.replayed, REPLAY_PAGE as u64);
        assert_eq!(after_one.version, 1);

        // Stalled (no stream record came): the reconciler takes it on.
        let queue = MemoryQueue::default();
        let settings = Settings::for_tests(&[]).unwrap();
        let later = at(1001) + chrono::Duration::hours(1);
        let report = reconcile(
            &store,
            &queue,
            &settings,
            later,
            std::time::Duration::from_secs(60),
        )
        .await
        .unwrap();
        assert_eq!(report.replays, 1);
        while continue_replay(&store, &replay.id, later).await.unwrap() == Continued::Advanced {}
        let done = store.get_replay(&replay.id).await.unwrap().unwrap();
        assert!(done.complete);
        assert_eq!(done.replayed, total as u64);
        assert_eq!(done.scanned, total as u64);
        assert_eq!(
            store
                .delivery_items()
                .iter()
                .filter(|d| d.endpoint_id == ep.id)
                .count(),
            total
        );
        assert_eq!(
            continue_replay(&store, &replay.id, later).await.unwrap(),
            Continued::Nothing
        );
    }

    /// One running replay per endpoint: a second start while the first
    /// runs is `replay_running` (and takes nothing); once the first is
    /// complete, the next starts. A slot whose replay was never stored (its
    /// start stopped) is free after [`SLOT_UNSTORED_FOR`].
    #[tokio::test]
    async fn one_running_replay_per_endpoint() {
        let store = MemoryStore::default();
        let ep = endpoint(&[]);
        store
            .put_endpoint(&ep, crate::settings::MAX_ENDPOINTS_PER_APP_CEILING)
            .await
            .unwrap();
        event(&store, &app(), "order.paid", 10, &[]);
        let first = start(&store, &ep, &request(0, None), Duration::ZERO).await;
        assert!(!first.complete);
        let refused = try_start(&store, &ep, &request(0, None), 1000).await;
        assert!(
            matches!(
                &refused,
                Err(PipelineError::Limit {
                    code: "replay_running",
                    ..
                })
            ),
            "{refused:?}"
        );
        let slot = store.replay_slot(&app(), &ep.id).await.unwrap().unwrap();
        assert_eq!(slot.replay_id, first.id, "the refused start took nothing");
        while continue_replay(&store, &first.id, at(1001)).await.unwrap() == Continued::Advanced {}
        let second = start(&store, &ep, &request(0, None), INLINE_BUDGET).await;
        assert!(second.complete);
        // A start that took the slot and stopped before storing its replay.
        let lost = ReplayId::new(at(2000), &mut rng());
        assert!(store
            .take_replay_slot(&app(), &ep.id, &lost, Some(&second.id), at(2000))
            .await
            .unwrap());
        let too_soon = try_start(&store, &ep, &request(0, None), 2030).await;
        assert!(too_soon.is_err(), "within a minute it may still be storing");
        let later = try_start(&store, &ep, &request(0, None), 2100).await;
        assert!(later.is_ok(), "{later:?}");
    }

    /// A disabled endpoint is refused (enable it first); one deleted or
    /// disabled while its replay runs stops the replay with the reason.
    #[tokio::test]
    async fn disabled_or_deleted_endpoints_stop_replays() {
        let store = MemoryStore::default();
        let mut ep = endpoint(&[]);
        store
            .put_endpoint(&ep, crate::settings::MAX_ENDPOINTS_PER_APP_CEILING)
            .await
            .unwrap();
        event(&store, &app(), "order.paid", 10, &[]);
        ep.disabled = true;
        let refused = try_start(&store, &ep, &request(0, None), 1000).await;
        assert!(
            matches!(refused, Err(PipelineError::Conflict(_))),
            "{refused:?}"
        );
        ep.disabled = false;
        let replay = start(&store, &ep, &request(0, None), Duration::ZERO).await;
        assert!(store.delete_endpoint(&app(), &ep.id).await.unwrap());
        continue_replay(&store, &replay.id, at(1001)).await.unwrap();
        let stopped = store.get_replay(&replay.id).await.unwrap().unwrap();
        assert!(stopped.complete);
        assert_eq!(stopped.stopped.as_deref(), Some("endpoint deleted"));
        assert_eq!(stopped.replayed, 0);
        let bad = try_start(&store, &ep, &request(2000, None), 1000).await;
        assert!(matches!(
            bad,
            Err(PipelineError::Invalid {
                code: "invalid_time_range",
                ..
            })
        ));
    }
}
