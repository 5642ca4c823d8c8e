//! Queue -> HTTP: one message is one attempt of one delivery.
//!
//! Per message: not due yet -> re-queued with the remaining delay (hops of at
//! most 900 s) and acked; stale (attempt number or state moved on) -> acked
//! without sending; otherwise sign, POST, and record the attempt with ONE
//! conditional update that also moves the state (delivered; pending with the
//! next due time, which re-triggers dispatch through the stream; or failed,
//! after a copy went to the DLQ, and `delivery.failed` was announced).
//! An endpoint disabled here (410, or failing too long) is announced as
//! `endpoint.disabled` first ([`crate::operational`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use hookline_core::ids::{AppId, EndpointId};
use hookline_core::model::{
    body_digest, Attempt, Delivery, DeliveryStatus, Endpoint, FailReason, Transition,
};
use hookline_core::ordering::{self, KeyTail, OrderGate, Predecessor};
use hookline_core::retry::parse_retry_after;
use hookline_core::signing::{self, Schemes};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

use crate::messages::{delay_seconds, DeliveryMessage};
use crate::metrics::{self, Outcome};
use crate::operational::{self, Operational};
use crate::ports::{OutgoingRequest, Queue, QueueLag, Sender, Store};
use crate::{PipelineError, Settings};
use hookline_core::stats::StatsDelta;
use hookline_core::sync::lock;

/// What handling one message did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliverOutcome {
    Delivered,
    /// Attempt failed; the next one is scheduled.
    RetryScheduled,
    /// Attempt failed and the delivery is now `failed` (copy in the DLQ).
    Failed,
    /// Not due yet: re-queued with the remaining delay.
    NotDue,
    /// The message no longer matches the delivery: acked, nothing sent.
    Stale,
    /// The endpoint's rate limit put the attempt at a later send slot: the
    /// delivery is due then (dispatch queues it; budget untouched).
    Throttled,
    /// The endpoint is unreachable (its circuit open, or this process
    /// already has a request to it in flight): the delivery is due later,
    /// no attempt made, budget untouched ([`hookline_core::circuit`]).
    Held,
    /// Its ordering key's previous delivery to the endpoint has not ended:
    /// it waits, woken by that one's end ([`hookline_core::ordering`]).
    Blocked,
    /// That previous delivery has not recorded its first attempt yet: the
    /// delivery waits (blocked, so its own successor registers on it) and
    /// this message comes back shortly to look again.
    Rechecking,
}

/// The most a delivery waiting for a predecessor with no record yet waits
/// between two looks (1 s, then doubling): the predecessor's first attempt
/// records it within a delivery timeout; one whose message was lost is
/// found by the reconciler, which writes it, from when on the wait is a
/// registration woken by its end (no more looks). Only the first waiting
/// delivery of a key looks: the ones after it register on it.
pub const RECHECK_MAX_SECS: i32 = 60;

/// Longest wait for a send slot inside a deliver invocation; a later slot
/// is written to the delivery and the attempt comes back then.
const IN_PROCESS_WAIT: chrono::TimeDelta = chrono::TimeDelta::seconds(1);
/// New slots a sender too late for its slot takes before it lets the
/// attempt wait in the queue instead.
const LATE_RETAKES: usize = 3;

/// A message is handled this much before `not_before` at the earliest (SQS
/// delays are whole seconds, rounded up by dispatch). A slow endpoint's
/// turn is taken as early ([`hookline_core::circuit::TURN_EARLY`]).
const EARLY_SLACK_MS: i64 = 500;
const _: () = assert!(hookline_core::circuit::TURN_EARLY.as_millis() == EARLY_SLACK_MS as u128);
/// A process reports how late it receives due messages at most this often
/// (one small write; none while messages arrive on time).
pub const QUEUE_LAG_REPORT_EVERY: chrono::TimeDelta = chrono::TimeDelta::seconds(30);
/// A period's lateness is reported only from this many messages: a backlog
/// is many late messages, not one (a lone old message, say one redriven
/// as it was, must not make the reconciler lenient).
pub const QUEUE_LAG_MIN_MESSAGES: u32 = 10;

/// Requests one process keeps in flight to an endpoint whose last request
/// got no answer (a timeout, a refused connection) while its circuit is
/// still closed: the others due meanwhile are held for a delivery timeout
/// instead of each holding a deliver slot for one. An answering endpoint
/// is not capped (its requests end quickly).
const UNREACHABLE_IN_FLIGHT: u32 = 1;
/// How long a process uses its copy of an endpoint with a run of
/// unanswered requests (one read a second at most, and only while the run
/// lasts): another process may open its circuit at any moment.
const SUSPECT_CACHE_TTL: Duration = Duration::from_secs(1);
/// A probe's answer is awaited this much beyond the delivery timeout
/// before another deliver may take the probe again.
const PROBE_SLACK: Duration = Duration::from_secs(5);
/// Deliveries held by an open circuit come back spread over this much
/// after it ends (not all at the probe's instant).
const HOLD_SPREAD_MS: u64 = 2_000;

/// How long a failure streak lasts at least once begun: a 2xx within it
/// does not clear `failing_since` (see [`Deliverer::track_health`]). Each
/// endpoint's health is then written at most twice per settle period
/// however its attempts alternate, and an endpoint failing from then on is
/// disabled at most this much early: a minute, or a tenth of
/// `WEBHOOKS_DISABLE_AFTER` when that is shorter.
pub fn health_settle(disable_after: chrono::Duration) -> chrono::Duration {
    (disable_after / 10).min(chrono::Duration::minutes(1))
}

fn to_delta(d: Duration) -> chrono::TimeDelta {
    chrono::TimeDelta::from_std(d).expect("delivery timeouts are seconds, not ages")
}

/// The deliver use case with its dependencies, built once per process.
pub struct Deliverer<S, Q, H> {
    pub store: S,
    pub queue: Q,
    pub sender: H,
    pub settings: Settings,
    endpoint_cache: Mutex<HashMap<EndpointId, (Instant, Option<Endpoint>)>>,
    /// Endpoint stats of the batch being handled, added to the store once
    /// per endpoint at its end.
    stats: Mutex<HashMap<(AppId, EndpointId), StatsDelta>>,
    rng: Mutex<StdRng>,
    /// Send slots of rate-limited endpoints, gathered per batch.
    pacer: crate::pacer::Pacer,
    clock: fn() -> DateTime<Utc>,
    /// How late due messages were received since the last report.
    lateness: Mutex<Lateness>,
    /// What this process saw of each endpoint's reachability.
    reach: Mutex<HashMap<EndpointId, Reach>>,
}

/// One endpoint as this process saw it: whether its last request here got
/// no answer (added to the endpoint's run, not yet cleared by this
/// process), and its requests in flight.
#[derive(Debug, Default)]
struct Reach {
    unanswered: bool,
    in_flight: u32,
    /// Slow answers in a row here ([`hookline_core::circuit::is_slow`]).
    slow_in_a_row: u32,
    /// While this process paces it (at [`hookline_core::circuit::SLOW_AFTER`]
    /// slow answers in a row, until a fast one): the last slow answer's
    /// latency.
    pacing: Option<Duration>,
}

/// What one request to an endpoint met.
struct Observed<'a> {
    /// Any HTTP answer (else a timeout, a refused or reset connection).
    answered: bool,
    /// What it met, if no answer.
    error: Option<&'a str>,
    latency: Duration,
}

/// Whether a due delivery is sent now.
enum Admission<'a> {
    /// Sent (`probe`: as its endpoint's circuit probe, the circuit as
    /// taken); the slot is held until the request is over.
    Send {
        probe: Option<hookline_core::circuit::Circuit>,
        _slot: InFlight<'a>,
    },
    /// Held until `until`, no attempt made; `circuit`: by its open
    /// circuit (the hold ends with the delivery's schedule), else by this
    /// process's one request in flight to it (no deadline).
    Wait { until: DateTime<Utc>, circuit: bool },
    /// Its slow endpoint's pacing gave it this turn: it waits for it, no
    /// attempt made.
    Turn(DateTime<Utc>),
}

/// A request counted in its endpoint's [`Reach::in_flight`] until dropped.
struct InFlight<'a> {
    reach: &'a Mutex<HashMap<EndpointId, Reach>>,
    endpoint: EndpointId,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some(reach) = lock(self.reach).get_mut(&self.endpoint) {
            reach.in_flight = reach.in_flight.saturating_sub(1);
        }
    }
}

/// How late due messages were received over the current period: the
/// least late of them (every message received was at least this late: the
/// queue's backlog, robust to a lone outlier), how many, since when.
#[derive(Debug, Default)]
struct Lateness {
    least: Option<chrono::TimeDelta>,
    seen: u32,
    since: Option<DateTime<Utc>>,
}

impl<S, Q, H> std::fmt::Debug for Deliverer<S, Q, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deliverer").finish_non_exhaustive()
    }
}

impl<S: Store, Q: Queue, H: Sender> Deliverer<S, Q, H> {
    pub fn new(store: S, queue: Q, sender: H, settings: Settings) -> Self {
        Self {
            store,
            queue,
            sender,
            settings,
            endpoint_cache: Mutex::new(HashMap::new()),
            stats: Mutex::new(HashMap::new()),
            rng: Mutex::new(StdRng::from_entropy()),
            pacer: crate::pacer::Pacer::default(),
            clock: Utc::now,
            lateness: Mutex::new(Lateness::default()),
            reach: Mutex::new(HashMap::new()),
        }
    }

    /// Handles a batch concurrently; returns the indices of messages to report
    /// as batch item failures (SQS makes them visible again, and after
    /// `maxReceiveCount` moves them to the DLQ).
    pub async fn handle_batch(&self, bodies: &[&str]) -> Vec<usize> {
        use futures::StreamExt;
        // Owned futures first: a stream holding closures over borrowed bodies
        // is not `Send` enough for `tokio::spawn` (higher-ranked lifetimes).
        let tasks: Vec<_> = bodies
            .iter()
            .enumerate()
            .map(|(i, body)| async move { (i, self.handle_body(body).await) })
            .collect();
        let results: Vec<(usize, Result<DeliverOutcome, PipelineError>)> =
            futures::stream::iter(tasks)
                .buffer_unordered(self.settings.deliver_concurrency.max(1))
                .collect()
                .await;
        let mut failed: Vec<usize> = results
            .into_iter()
            .filter_map(|(i, r)| match r {
                Ok(_) => None,
                Err(err) => {
                    tracing::error!(error = %hookline_core::error::Chain(&err), retryable = err.is_retryable(), "delivery message failed; left on the queue");
                    Some(i)
                }
            })
            .collect();
        failed.sort_unstable();
        self.flush_gathered().await;
        failed
    }

    /// What a batch gathered: the endpoints' stats and the queue's lag.
    pub async fn flush_gathered(&self) {
        self.flush_stats().await;
        self.report_queue_lag().await;
    }

    /// Once per [`QUEUE_LAG_REPORT_EVERY`]: records how late due messages
    /// were received over the period, when every one of at least
    /// [`QUEUE_LAG_MIN_MESSAGES`] was half of `WEBHOOKS_RECONCILE_AFTER`
    /// late or more (a backlog the reconciler must not copy:
    /// [`crate::reconcile`]). A failed write is logged: the figure is
    /// advisory.
    async fn report_queue_lag(&self) {
        let now = (self.clock)();
        let least = {
            let mut lateness = lock(&self.lateness);
            let since = *lateness.since.get_or_insert(now);
            if now - since < QUEUE_LAG_REPORT_EVERY {
                return;
            }
            let period = std::mem::take(&mut *lateness);
            lateness.since = Some(now);
            let Some(Ok(least)) = period.least.map(|l| l.to_std()) else {
                return;
            };
            if period.seen < QUEUE_LAG_MIN_MESSAGES || least < self.settings.reconcile_after / 2 {
                return;
            }
            least
        };
        let lag = QueueLag {
            observed_at: now,
            lag: least,
        };
        match self.store.record_queue_lag(&lag).await {
            Ok(()) => {
                tracing::warn!(
                    lag_seconds = least.as_secs(),
                    "due messages are received late: the delivery queue has a backlog"
                );
            }
            Err(err) => {
                tracing::warn!(error = %hookline_core::error::Chain(&err), "the queue lag was not recorded");
            }
        }
    }

    /// Adds the stats gathered since the last flush to the store, one
    /// update per endpoint. Counters only: a failed write is logged and the
    /// batch's messages are unaffected.
    async fn flush_stats(&self) {
        let gathered = std::mem::take(&mut *lock(&self.stats));
        let hour = hookline_core::stats::hour_of((self.clock)());
        for ((app, endpoint), delta) in gathered {
            if let Err(err) = self
                .store
                .add_endpoint_stats(&app, &endpoint, hour, &delta)
                .await
            {
                tracing::warn!(endpoint_id = %endpoint, error = %hookline_core::error::Chain(&err), "endpoint stats not recorded");
            }
        }
    }

    /// The endpoint's rate limit: `None` when the request may go now (after
    /// waiting in process for a slot at most [`IN_PROCESS_WAIT`] away), or
    /// the later slot the attempt must wait for. The slot the delivery
    /// already holds is used; otherwise one is taken from the limiter.
    async fn pace(
        &self,
        delivery: &Delivery,
        endpoint: &Endpoint,
        now: DateTime<Utc>,
    ) -> Result<Option<DateTime<Utc>>, PipelineError> {
        let Some(per_second) = endpoint.rate_limit else {
            return Ok(None);
        };
        let mut slot = match delivery.reserved_slot(now) {
            Some(slot) => slot,
            None => self.next_slot(endpoint, per_second).await?,
        };
        for _ in 0..LATE_RETAKES {
            let wait = slot - (self.clock)();
            if wait > IN_PROCESS_WAIT {
                return Ok(Some(slot));
            }
            if let Ok(wait) = wait.to_std() {
                tokio::time::sleep(wait).await;
            }
            let number = hookline_core::rate::slot_of(slot, per_second);
            if (self.clock)() < hookline_core::rate::send_deadline(number, per_second) {
                return Ok(None);
            }
            // Too late for the slot's second (a busy process): sent now it
            // could land next to the next second's own requests.
            tracing::info!(delivery_id = %delivery.id, endpoint_id = %endpoint.id, slot = %slot, "send slot missed; taking another");
            slot = self.next_slot(endpoint, per_second).await?;
        }
        // Still late: the attempt waits for its slot in the queue.
        Ok(Some(slot))
    }

    /// The start of the next free send slot of `endpoint`'s limiter.
    async fn next_slot(
        &self,
        endpoint: &Endpoint,
        per_second: u32,
    ) -> Result<DateTime<Utc>, PipelineError> {
        // The time of the reservation, not of the message's pick-up: the
        // limiter's state is judged as it is now.
        let number = self
            .pacer
            .take_slot(&self.store, &endpoint.id, per_second, (self.clock)())
            .await?;
        Ok(hookline_core::rate::slot_start(number, per_second))
    }

    /// The same, reading time from `clock` (tests, the scale simulation).
    #[cfg(any(test, feature = "fakes"))]
    pub fn with_clock(mut self, clock: fn() -> DateTime<Utc>) -> Self {
        self.clock = clock;
        self
    }

    /// Parses and handles one message body.
    pub async fn handle_body(&self, body: &str) -> Result<DeliverOutcome, PipelineError> {
        let message: DeliveryMessage = serde_json::from_str(body)
            .map_err(|e| PipelineError::Corrupt(format!("delivery message is not valid: {e}")))?;
        self.handle(&message).await
    }

    /// Handles one message (one delivery attempt, in its own span).
    #[tracing::instrument(name = "delivery", skip_all, fields(delivery_id = %message.delivery_id, attempt = message.attempt))]
    pub async fn handle(&self, message: &DeliveryMessage) -> Result<DeliverOutcome, PipelineError> {
        let now = (self.clock)();
        if (message.not_before - now).num_milliseconds() > EARLY_SLACK_MS {
            let delay = delay_seconds(message.not_before, now);
            let failed = self
                .queue
                .send_deliveries(&[(message.clone(), delay)])
                .await?;
            if !failed.is_empty() {
                return Err(PipelineError::queue(
                    "re-queue of a not-yet-due message was refused",
                    true,
                ));
            }
            tracing::debug!(delivery_id = %message.delivery_id, delay_seconds = delay, "not due yet; re-queued");
            return Ok(DeliverOutcome::NotDue);
        }
        {
            let mut lateness = lock(&self.lateness);
            let late = now - message.not_before;
            lateness.least = Some(lateness.least.map_or(late, |least| least.min(late)));
            lateness.seen += 1;
        }
        // A listed delivery's first attempt: the message says all its event
        // would; only an item written meanwhile can say otherwise (an
        // earlier copy of this message, the reconciler's, an operator's
        // restart: seconds ago at the least, so an eventually consistent
        // read sees it; one it misses costs a second POST, never a wrong
        // record, as the outcome's write is conditional).
        let found = match (message.listed_delivery(), message.version) {
            // With its endpoint, in the same read, unless it is cached.
            (Some(listed), _) if !self.endpoint_is_cached(&message.endpoint_id) => {
                let (item, endpoint) = self
                    .store
                    .peek_delivery_item_and_endpoint(
                        &message.app_id,
                        &message.delivery_id,
                        &message.endpoint_id,
                    )
                    .await?;
                self.remember_endpoint(&message.endpoint_id, endpoint);
                item.or(Some(listed))
            }
            (Some(listed), _) => self
                .store
                .peek_delivery_item(&message.app_id, &message.delivery_id)
                .await?
                .or(Some(listed)),
            // A later attempt: the earlier one wrote the delivery's item (no
            // item: it expired, and the message is stale).
            (None, Some(version)) if version > 0 => {
                self.store
                    .get_delivery_item(&message.app_id, &message.delivery_id)
                    .await?
            }
            (None, _) => {
                self.store
                    .get_delivery(&message.app_id, &message.delivery_id)
                    .await?
            }
        };
        let Some(mut delivery) = found else {
            tracing::warn!(delivery_id = %message.delivery_id, "message for an unknown delivery acked");
            return Ok(DeliverOutcome::Stale);
        };
        let current = delivery.status == DeliveryStatus::Pending
            && match message.version {
                Some(version) => version == delivery.version,
                None => delivery.next_attempt_number() == message.attempt,
            };
        if !current {
            tracing::info!(
                delivery_id = %delivery.id,
                status = %delivery.status,
                message_attempt = message.attempt,
                message_version = message.version,
                version = delivery.version,
                "stale message acked"
            );
            return Ok(DeliverOutcome::Stale);
        }
        let expected_version = delivery.version;
        // Ordered per key: the first attempt waits for the key's previous
        // delivery to this endpoint to end.
        if let Some(tail) = delivery.waits_for().cloned() {
            if let Some(outcome) = self
                .order_gate(message, &mut delivery, expected_version, &tail, now)
                .await?
            {
                return Ok(outcome);
            }
        }
        // The gate may have written it (blocked, then found its predecessor
        // ended): the outcome is written over that version.
        let expected_version = delivery.version;
        let number = delivery.next_attempt_number();
        let waiting_before = delivery.attempt_count > 0;
        // The request sent, if one was: answered 2xx, latency (ms).
        let mut sent = None;
        // Whether it got an HTTP answer (else what it met), if one was sent.
        let mut answered: Option<(bool, Option<String>, Duration)> = None;
        let endpoint = self
            .endpoint(&delivery.app_id, &delivery.endpoint_id)
            .await?;
        let not_deliverable = |reason: &str| {
            Attempt::new(
                number,
                now,
                None,
                Duration::ZERO,
                Some(reason.to_owned()),
                None,
            )
        };

        // An unreachable endpoint's deliveries wait (no attempt) rather
        // than each hold a deliver slot for a delivery timeout, a slow
        // one's wait for their turns; past its schedule a held delivery
        // fails as its last attempt would have.
        let mut admitted = None;
        // Why the delivery's schedule ended without a request, if it did.
        let mut ended_unsent = None;
        if let Some(ep) = endpoint.as_ref().filter(|ep| !ep.disabled) {
            // What its schedule has left (none representable: no end).
            let remaining = chrono::TimeDelta::from_std(
                self.settings.retry.remaining_window(delivery.attempt_count),
            )
            .unwrap_or(chrono::TimeDelta::MAX);
            match self.admit(ep, &delivery, now).await? {
                Admission::Turn(turn) => {
                    if !delivery.wait_turn(turn, remaining, now)? {
                        ended_unsent = Some(
                            "endpoint too slow: its turn came after the end of the delivery's schedule",
                        );
                    } else if !self.put_back(&delivery, expected_version).await? {
                        return Ok(DeliverOutcome::Stale);
                    } else {
                        tracing::info!(delivery_id = %delivery.id, endpoint_id = %ep.id, turn = %turn.to_rfc3339(), "slow endpoint: the attempt waits for its turn");
                        return Ok(DeliverOutcome::Held);
                    }
                }
                Admission::Wait { until, circuit } => {
                    let deadline = circuit.then_some(remaining);
                    if !delivery.hold(until, deadline, now)? {
                        ended_unsent = Some(
                            "endpoint unreachable: its circuit was open at the end of the delivery's schedule",
                        );
                    } else if !self.put_back(&delivery, expected_version).await? {
                        return Ok(DeliverOutcome::Stale);
                    } else {
                        tracing::info!(delivery_id = %delivery.id, endpoint_id = %ep.id, until = %until.to_rfc3339(), "endpoint unreachable: the delivery waits, no attempt made");
                        return Ok(DeliverOutcome::Held);
                    }
                }
                admission @ Admission::Send { .. } => admitted = Some(admission),
            }
        }
        let probe = match &admitted {
            Some(Admission::Send { probe, .. }) => probe.clone(),
            _ => None,
        };
        if let Some(ep) = endpoint
            .as_ref()
            .filter(|ep| !ep.disabled && ended_unsent.is_none())
        {
            if let Some(slot) = self.pace(&delivery, ep, now).await? {
                delivery.throttle(slot, now)?;
                if !self.put_back(&delivery, expected_version).await? {
                    return Ok(DeliverOutcome::Stale);
                }
                tracing::info!(delivery_id = %delivery.id, endpoint_id = %ep.id, slot = %slot.to_rfc3339(), "rate limited: the attempt waits for its send slot");
                return Ok(DeliverOutcome::Throttled);
            }
        }
        let (transition, latency_ms) = match endpoint.as_ref() {
            None => (delivery.fail_now(not_deliverable("endpoint deleted"))?, 0),
            Some(ep) if ep.disabled => {
                (delivery.fail_now(not_deliverable("endpoint disabled"))?, 0)
            }
            Some(_) if ended_unsent.is_some() => (
                delivery.fail_now(not_deliverable(ended_unsent.expect("matched as some")))?,
                0,
            ),
            Some(ep) => match self.body_of(message, &delivery).await? {
                None => (
                    delivery.fail_now(not_deliverable("event not found (expired?)"))?,
                    0,
                ),
                Some(body) => {
                    let sent_at = (self.clock)();
                    let secrets = ep.signing_secrets(sent_at);
                    let body = body.as_bytes();
                    let headers = signing::sign(
                        delivery.message_id().as_str(),
                        sent_at.timestamp(),
                        body,
                        &secrets,
                        Schemes::default(),
                    )?;
                    let result = self
                        .sender
                        .send(OutgoingRequest {
                            url: &ep.url,
                            custom_headers: &ep.headers,
                            headers: &headers,
                            body,
                            timeout: self.settings.delivery_timeout,
                        })
                        .await;
                    let attempt = Attempt::new(
                        number,
                        sent_at,
                        result.status,
                        result.latency,
                        result.error.clone(),
                        result.body_prefix.as_deref(),
                    );
                    let latency_ms = attempt.latency_ms;
                    if !result.blocked {
                        answered = Some((
                            result.status.is_some(),
                            result.error.clone(),
                            result.latency,
                        ));
                    }
                    if !result.blocked {
                        let ok = result.status.is_some_and(|s| (200..300).contains(&s));
                        sent = Some((ok, latency_ms));
                    }
                    let transition = if result.blocked {
                        delivery.fail_now(attempt)?
                    } else {
                        let done = (self.clock)();
                        let retry_after = result
                            .retry_after
                            .as_deref()
                            .and_then(|v| parse_retry_after(v, done));
                        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
                        delivery.record_attempt(
                            attempt,
                            retry_after,
                            &self.settings.retry,
                            &mut *rng,
                        )?
                    };
                    (transition, latency_ms)
                }
            },
        };

        if let Transition::Failed { reason } = &transition {
            // The DLQ copy goes first: a crash after it leaves a pending
            // delivery (retried from the queue) plus a copy the redrive skips,
            // never a failed delivery without a copy.
            let last_error = delivery
                .attempts
                .last()
                .and_then(|a| {
                    a.error
                        .clone()
                        .or_else(|| a.status_code.map(|s| format!("HTTP {s}")))
                })
                .unwrap_or_else(|| format!("{reason:?}"));
            let mut copy = message.clone();
            copy.failure = Some(last_error.clone());
            self.queue.send_to_dlq(&copy).await?;
            // Announced before the outcome is written, as the DLQ copy.
            let failed = Operational::DeliveryFailed {
                app_id: delivery.app_id.clone(),
                delivery_id: delivery.id.clone(),
                endpoint_id: delivery.endpoint_id.clone(),
                event_id: delivery.event_id.clone(),
                event_type: delivery.event_type.to_string(),
                attempts: delivery.total_attempts,
                last_error,
            };
            self.announce(&failed, u64::from(number), now).await?;
        }
        if !self
            .store
            .update_delivery(&delivery, expected_version)
            .await?
        {
            tracing::warn!(delivery_id = %delivery.id, attempt = number, "attempt raced with another writer; result dropped");
            return Ok(DeliverOutcome::Stale);
        }
        {
            let mut stats = lock(&self.stats);
            let delta = stats
                .entry((delivery.app_id.clone(), delivery.endpoint_id.clone()))
                .or_default();
            if let Some((ok, latency)) = sent {
                delta.attempt(ok, latency);
            }
            match &transition {
                Transition::Delivered => delta.delivered += 1,
                Transition::Failed { .. } => delta.failed += 1,
                Transition::Retry { .. } => {}
            }
            let waiting_after = matches!(transition, Transition::Retry { .. });
            delta.waiting += i64::from(waiting_after) - i64::from(waiting_before);
        }
        let last = delivery.attempts.last();
        let status_code = last.and_then(|a| a.status_code);
        let outcome = match &transition {
            Transition::Delivered => DeliverOutcome::Delivered,
            Transition::Retry { .. } => DeliverOutcome::RetryScheduled,
            Transition::Failed { .. } => DeliverOutcome::Failed,
        };
        tracing::info!(
            delivery_id = %delivery.id,
            event_id = %delivery.event_id,
            endpoint_id = %delivery.endpoint_id,
            attempt = number,
            status_code = status_code,
            latency_ms = latency_ms,
            outcome = ?outcome,
            next_attempt_at = delivery.next_attempt_at.map(tracing::field::display),
            "attempt recorded"
        );
        metrics::emit(
            self.settings.emf_metrics,
            "deliver",
            match outcome {
                DeliverOutcome::Delivered => Outcome::Succeeded,
                DeliverOutcome::RetryScheduled => Outcome::Retried,
                _ => Outcome::Failed,
            },
            latency_ms,
            delivery.id.as_str(),
            delivery.endpoint_id.as_str(),
        );
        let gone = matches!(
            transition,
            Transition::Failed {
                reason: FailReason::EndpointGone
            }
        );
        drop(admitted);
        if let (Some(ep), Some((answer, error, latency))) = (endpoint.as_ref(), answered) {
            let reach = Observed {
                answered: answer,
                error: error.as_deref(),
                latency,
            };
            // Judged when the request ended: a circuit opens for its whole
            // cool-down from then.
            self.observe_reach(ep, reach, probe.as_ref(), (self.clock)())
                .await;
        }
        if let Some(ep) = endpoint.as_ref().filter(|ep| !ep.disabled) {
            if gone {
                // Disabled at once, as judged at this version (no health
                // write first: it would move the version on).
                self.disable(ep, "endpoint answered 410 Gone", now).await?;
            } else {
                let answered_2xx = status_code.is_some_and(|s| (200..300).contains(&s));
                self.track_health(ep, answered_2xx, now).await?;
            }
        }
        if gone {
            self.forget_endpoint(&delivery.endpoint_id);
        }
        Ok(outcome)
    }

    /// The ordering gate of `delivery` (pending, no attempt made yet), which
    /// waits for `tail` ([`hookline_core::ordering::gate`]): `None` to go
    /// on (its predecessor ended, or is gone with its event), else what
    /// was done instead: this message sent again a little later (the
    /// predecessor has no record yet), or the delivery blocked after
    /// registering on its predecessor to be woken by its end.
    async fn order_gate(
        &self,
        message: &DeliveryMessage,
        delivery: &mut Delivery,
        expected_version: u64,
        tail: &KeyTail,
        now: DateTime<Utc>,
    ) -> Result<Option<DeliverOutcome>, PipelineError> {
        let app = delivery.app_id.clone();
        // Eventually consistent: a stale copy says pending (the
        // registration's condition then finds it ended) or nothing (looked
        // at again in a second); never ended when it has not.
        let found = self.store.peek_delivery_item(&app, &tail.delivery).await?;
        let state = match &found {
            Some(p) if p.released || p.status != DeliveryStatus::Pending => Predecessor::Ended,
            Some(p) => Predecessor::Pending {
                attempted: p.version > 0,
            },
            None => {
                let lost_after = ordering::lost_after(
                    self.settings.reconcile_after,
                    self.settings.reconcile_interval,
                );
                // A queue backlog delays a predecessor's first attempt as
                // much (and the reconciler waits it out): added to the bound.
                let backlog = lock(&self.lateness)
                    .least
                    .unwrap_or_default()
                    .max(chrono::TimeDelta::zero());
                // By its event's age (its id's time): past the bound the
                // reconciler has written a predecessor still pending, so an
                // old one with no item is gone (expired), however new this
                // delivery is; a younger one may come while its event is
                // there.
                let young = now - tail.event.created_at() <= lost_after + backlog;
                Predecessor::Missing {
                    may_come: young && self.store.event_exists(&app, &tail.event).await?,
                }
            }
        };
        match ordering::gate(state) {
            OrderGate::Go => Ok(None),
            OrderGate::Recheck => {
                // Blocked too (its item written: its own successor can
                // register on it rather than look again as well), and
                // back in a little while, from 1 s, doubling.
                let delay = if message.rechecks >= 6 {
                    RECHECK_MAX_SECS
                } else {
                    (1_i32 << message.rechecks).min(RECHECK_MAX_SECS)
                };
                let back_at = now + chrono::TimeDelta::seconds(i64::from(delay));
                let first_block = delivery.blocked_by.is_none();
                delivery.block(&tail.delivery, Some(back_at), now)?;
                if !self.put_back(delivery, expected_version).await? {
                    return Ok(Some(DeliverOutcome::Stale));
                }
                if first_block {
                    self.keep_event_while_waiting(delivery, now).await?;
                }
                let mut again = message.clone();
                again.version = Some(delivery.version);
                again.rechecks = message.rechecks.saturating_add(1);
                again.not_before = back_at;
                if !self
                    .queue
                    .send_deliveries(&[(again, delay)])
                    .await?
                    .is_empty()
                {
                    // Its block stands; the reconciler finds it when due.
                    return Err(PipelineError::queue(
                        "re-queue of a delivery waiting for its predecessor was refused",
                        true,
                    ));
                }
                tracing::info!(delivery_id = %delivery.id, predecessor = %tail.delivery, delay_seconds = delay, "its ordering key's previous delivery has no record yet: looking again later");
                Ok(Some(DeliverOutcome::Rechecking))
            }
            OrderGate::Wait => {
                // Blocked first, registered second: a predecessor still
                // pending at the registration ends after it, and its wake
                // finds this one blocked (no look again needed).
                let due = found.as_ref().and_then(|p| p.next_attempt_at);
                let first_block = delivery.blocked_by.is_none();
                delivery.block(&tail.delivery, due, now)?;
                if !self.put_back(delivery, expected_version).await? {
                    return Ok(Some(DeliverOutcome::Stale));
                }
                if !self
                    .store
                    .register_successor(&app, &tail.delivery, &delivery.id)
                    .await?
                {
                    // Its condition failed: the predecessor ended meanwhile.
                    // The attempt goes now, written over the block.
                    return Ok(None);
                }
                if first_block {
                    self.keep_event_while_waiting(delivery, now).await?;
                }
                tracing::info!(delivery_id = %delivery.id, predecessor = %tail.delivery, "waiting for its ordering key's previous delivery to end");
                Ok(Some(DeliverOutcome::Blocked))
            }
        }
    }

    /// A delivery starts waiting for its key's previous one: its event is
    /// kept a retention from now (a key's deliveries may wait through
    /// several schedules, longer than the event's own retention; the
    /// reconciler's re-blocks keep it on).
    async fn keep_event_while_waiting(
        &self,
        delivery: &Delivery,
        now: DateTime<Utc>,
    ) -> Result<(), PipelineError> {
        self.store
            .extend_event_retention(&delivery.app_id, &delivery.event_id, now)
            .await
    }

    /// Writes a delivery put back without an attempt (held, or waiting
    /// for its turn or send slot): `false` when another writer came first
    /// (its version moved on; this message is stale).
    async fn put_back(
        &self,
        delivery: &Delivery,
        expected_version: u64,
    ) -> Result<bool, PipelineError> {
        let written = self
            .store
            .update_delivery(delivery, expected_version)
            .await?;
        if !written {
            tracing::warn!(delivery_id = %delivery.id, "putting the delivery back raced with another writer");
        }
        Ok(written)
    }

    /// Whether a due delivery to `endpoint` is sent now: not while its
    /// circuit is open (held until it ends, spread over
    /// [`HOLD_SPREAD_MS`]); once it has ended, only by the deliver that
    /// takes the probe (the others wait for the probe's answer); while it
    /// answers slowly, on the delivery's turn (one is taken if it holds
    /// none: [`hookline_core::circuit::SLOW_SHARE`]); and while its run of
    /// unanswered requests lasts, only [`UNREACHABLE_IN_FLIGHT`] at a time
    /// from this process (the others wait a delivery timeout).
    async fn admit<'a>(
        &'a self,
        endpoint: &Endpoint,
        delivery: &Delivery,
        now: DateTime<Utc>,
    ) -> Result<Admission<'a>, PipelineError> {
        use hookline_core::circuit::{gate, turn_gap, turn_has_come, Gate};
        let probe_for = self.settings.delivery_timeout + PROBE_SLACK;
        let mut probe = None;
        match gate(endpoint.circuit.as_ref(), now) {
            Gate::Send => {}
            Gate::Wait(until) => {
                let spread = lock(&self.rng).next_u64() % HOLD_SPREAD_MS;
                let spread = chrono::TimeDelta::milliseconds(
                    i64::try_from(spread).expect("under HOLD_SPREAD_MS"),
                );
                return Ok(Admission::Wait {
                    until: until + spread,
                    circuit: true,
                });
            }
            Gate::Probe => {
                let circuit = endpoint
                    .circuit
                    .as_ref()
                    .expect("a probe gate comes from a circuit");
                let taken = circuit.probing(now, probe_for);
                let won = self
                    .store
                    .set_circuit(
                        &endpoint.app_id,
                        &endpoint.id,
                        endpoint.version,
                        Some(&taken),
                        Some(circuit.open_until),
                    )
                    .await?;
                // Either way the cached circuit is out of date.
                self.forget_endpoint(&endpoint.id);
                if !won {
                    return Ok(Admission::Wait {
                        until: now + to_delta(probe_for),
                        circuit: true,
                    });
                }
                tracing::info!(endpoint_id = %endpoint.id, "circuit probe taken");
                probe = Some(taken);
            }
        }
        // A slow endpoint, as this process sees it: its requests go in
        // turns; a delivery holding one goes when it has come, even late.
        let pacing = lock(&self.reach)
            .get(&endpoint.id)
            .and_then(|seen| seen.pacing);
        match (probe.is_none(), pacing, delivery.turn_at) {
            (true, Some(_), Some(turn)) if !turn_has_come(turn, now) => {
                return Ok(Admission::Turn(turn))
            }
            (true, Some(latency), None) => {
                let gap = turn_gap(latency.min(self.settings.delivery_timeout));
                let turn = self
                    .store
                    .take_turn(&endpoint.app_id, &endpoint.id, now, gap)
                    .await?;
                if let Some(turn) = turn.filter(|turn| !turn_has_come(*turn, now)) {
                    return Ok(Admission::Turn(turn));
                }
            }
            _ => {}
        }
        let mut reach = lock(&self.reach);
        let seen = reach.entry(endpoint.id.clone()).or_default();
        let suspect = seen.unanswered || endpoint.unanswered_count > 0;
        if probe.is_none() && suspect && seen.in_flight >= UNREACHABLE_IN_FLIGHT {
            return Ok(Admission::Wait {
                until: now + to_delta(self.settings.delivery_timeout),
                circuit: false,
            });
        }
        seen.in_flight += 1;
        Ok(Admission::Send {
            probe,
            _slot: InFlight {
                reach: &self.reach,
                endpoint: endpoint.id.clone(),
            },
        })
    }

    /// After a request to `endpoint`: an answer (any HTTP status) clears
    /// the endpoint's run of unanswered requests (when this process added
    /// to it or saw it) and closes the circuit it probed; no answer adds
    /// to the run, opens the circuit at
    /// [`hookline_core::circuit::OPEN_AFTER`], or reopens the one it
    /// probed for longer. Circuit writes are conditional on the circuit
    /// judged (another deliver's change wins) and advisory: a failed one
    /// is logged, the attempt stands.
    async fn observe_reach(
        &self,
        endpoint: &Endpoint,
        Observed {
            answered,
            error,
            latency,
        }: Observed<'_>,
        probe: Option<&hookline_core::circuit::Circuit>,
        now: DateTime<Utc>,
    ) {
        use hookline_core::circuit::{is_slow, run_window, Circuit, OPEN_AFTER, SLOW_AFTER};
        let added_before = {
            let mut reach = lock(&self.reach);
            let seen = reach.entry(endpoint.id.clone()).or_default();
            if answered && is_slow(latency, self.settings.delivery_timeout) {
                seen.slow_in_a_row = seen.slow_in_a_row.saturating_add(1);
                if seen.slow_in_a_row >= SLOW_AFTER {
                    seen.pacing = Some(latency);
                }
            } else if answered {
                seen.slow_in_a_row = 0;
                seen.pacing = None;
            }
            std::mem::replace(&mut seen.unanswered, !answered)
        };
        let (change, expected, what) = match (probe, answered) {
            (Some(probe), true) => (None, Some(probe.open_until), "closed"),
            (Some(probe), false) => (
                Some(probe.reopened(now, error)),
                Some(probe.open_until),
                "reopened",
            ),
            (None, true) => {
                if added_before || endpoint.unanswered_count > 0 {
                    if let Err(err) = self
                        .store
                        .clear_unanswered(&endpoint.app_id, &endpoint.id)
                        .await
                    {
                        tracing::warn!(endpoint_id = %endpoint.id, error = %hookline_core::error::Chain(&err), "endpoint's unanswered run not cleared");
                    }
                    self.forget_endpoint(&endpoint.id);
                }
                return;
            }
            (None, false) if endpoint.circuit.is_some() => return,
            (None, false) => {
                let run_from = now - to_delta(run_window(self.settings.delivery_timeout));
                match self
                    .store
                    .add_unanswered(
                        &endpoint.app_id,
                        &endpoint.id,
                        endpoint.version,
                        now,
                        run_from,
                    )
                    .await
                {
                    Ok(Some(run)) if run >= OPEN_AFTER => {
                        (Some(Circuit::opened(now, error)), None, "opened")
                    }
                    Ok(run) => {
                        // Below the threshold (or already open): read it
                        // afresh next time, another deliver's request
                        // may open it.
                        tracing::info!(endpoint_id = %endpoint.id, unanswered_in_a_row = run, "endpoint request unanswered");
                        self.forget_endpoint(&endpoint.id);
                        return;
                    }
                    Err(err) => {
                        tracing::warn!(endpoint_id = %endpoint.id, error = %hookline_core::error::Chain(&err), "endpoint's unanswered request not recorded");
                        self.forget_endpoint(&endpoint.id);
                        return;
                    }
                }
            }
        };
        match self
            .store
            .set_circuit(
                &endpoint.app_id,
                &endpoint.id,
                endpoint.version,
                change.as_ref(),
                expected,
            )
            .await
        {
            Ok(true) => {
                tracing::warn!(endpoint_id = %endpoint.id, app_id = %endpoint.app_id, circuit = what, open_until = change.as_ref().map(|c| tracing::field::display(c.open_until)), "endpoint circuit {what}");
                // Read afresh next time (the copy judged may be older
                // than a PATCH; it is not cached again as new).
                self.forget_endpoint(&endpoint.id);
            }
            Ok(false) => self.forget_endpoint(&endpoint.id),
            Err(err) => {
                tracing::warn!(endpoint_id = %endpoint.id, error = %hookline_core::error::Chain(&err), "endpoint circuit not recorded");
                self.forget_endpoint(&endpoint.id);
            }
        }
    }

    /// Sends an operational event (see [`crate::operational`]) with ids
    /// from this deliverer's generator.
    async fn announce(
        &self,
        event: &Operational,
        occurrence: u64,
        now: DateTime<Utc>,
    ) -> Result<(), PipelineError> {
        let seed = self
            .rng
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .next_u64();
        let mut rng = StdRng::seed_from_u64(seed);
        operational::announce(
            &self.store,
            &self.settings,
            event,
            occurrence,
            now,
            &mut rng,
        )
        .await
    }

    /// `endpoint.disabled`, announced before the endpoint is disabled (the
    /// occurrence is the version it is disabled from).
    /// Disables `endpoint` as judged at its version (a cached copy may be
    /// up to the cache's time to live old): if it changed since (re-enabled,
    /// a new URL, a PATCH), nothing is disabled and nothing announced.
    /// Announced once disabled (the announcement's id is the judged
    /// version's, so a repeat is the same event).
    async fn disable(
        &self,
        endpoint: &Endpoint,
        reason: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, PipelineError> {
        let disabled = self
            .store
            .disable_endpoint(
                &endpoint.app_id,
                &endpoint.id,
                reason,
                endpoint.version,
                now,
            )
            .await?;
        if disabled {
            self.announce_disabled(endpoint, reason, now).await?;
        } else {
            tracing::info!(endpoint_id = %endpoint.id, version = endpoint.version, "not disabled: the endpoint changed since it was judged");
        }
        Ok(disabled)
    }

    async fn announce_disabled(
        &self,
        endpoint: &Endpoint,
        reason: &str,
        now: DateTime<Utc>,
    ) -> Result<(), PipelineError> {
        let event = Operational::EndpointDisabled {
            app_id: endpoint.app_id.clone(),
            endpoint_id: endpoint.id.clone(),
            reason: reason.to_owned(),
        };
        self.announce(&event, endpoint.version, now).await
    }

    /// Endpoint health after an attempt: the first failure with no 2xx since
    /// is remembered (`failing_since`), a 2xx clears it once the streak is
    /// older than [`health_settle`] (so `failing_since` is a streak's start
    /// to within that, at most a minute), and an endpoint
    /// failing for `WEBHOOKS_DISABLE_AFTER` is disabled with its reason. A
    /// write happens only on a change of state, conditional on the
    /// endpoint's version (a concurrent deliver doing the same wins; no
    /// harm), and the cached copy is dropped.
    async fn track_health(
        &self,
        endpoint: &Endpoint,
        answered_2xx: bool,
        now: DateTime<Utc>,
    ) -> Result<(), PipelineError> {
        let disable_after = chrono::Duration::from_std(self.settings.disable_after)
            .unwrap_or(chrono::Duration::MAX);
        let failing_since = match (answered_2xx, endpoint.failing_since) {
            (true, None) => return Ok(()),
            // A young streak is kept through a 2xx: a flapping endpoint
            // (some attempts fail, most succeed) would otherwise cost two
            // endpoint writes and a re-read per flip.
            (true, Some(since)) if now - since < health_settle(disable_after) => return Ok(()),
            (true, Some(_)) => None,
            (false, None) => Some(now),
            (false, Some(since)) if now - since >= disable_after => {
                let reason = format!(
                    "no 2xx answer since {} (WEBHOOKS_DISABLE_AFTER)",
                    since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                );
                if self.disable(endpoint, &reason, now).await? {
                    tracing::warn!(endpoint_id = %endpoint.id, app_id = %endpoint.app_id, failing_since = %since, "endpoint disabled: failing too long");
                }
                self.forget_endpoint(&endpoint.id);
                return Ok(());
            }
            (false, Some(_)) => return Ok(()),
        };
        if !self
            .store
            .set_failing_since(
                &endpoint.app_id,
                &endpoint.id,
                failing_since,
                endpoint.version,
            )
            .await?
        {
            tracing::debug!(endpoint_id = %endpoint.id, "endpoint changed meanwhile; health not recorded this time");
        }
        self.forget_endpoint(&endpoint.id);
        Ok(())
    }

    /// The body to send: the message's own if it is the delivery's (its
    /// digest matches `body_sha256`), else the stored event's; `None` when
    /// the event is gone.
    async fn body_of<'m>(
        &self,
        message: &'m DeliveryMessage,
        delivery: &Delivery,
    ) -> Result<Option<std::borrow::Cow<'m, str>>, PipelineError> {
        if let (Some(body), Some(expected)) = (&message.body, &delivery.body_sha256) {
            if body_digest(body) == *expected {
                return Ok(Some(std::borrow::Cow::Borrowed(body)));
            }
            tracing::warn!(delivery_id = %delivery.id, "message body does not match the delivery's; the stored event is sent");
        }
        Ok(self
            .store
            .get_event(&delivery.app_id, &delivery.event_id)
            .await?
            .map(|stored| std::borrow::Cow::Owned(stored.event.body)))
    }

    async fn endpoint(
        &self,
        app: &AppId,
        id: &EndpointId,
    ) -> Result<Option<Endpoint>, PipelineError> {
        if let Some(cached) = self.cached_endpoint(id) {
            return Ok(cached);
        }
        let fresh = self.store.get_endpoint(app, id).await?;
        self.remember_endpoint(id, fresh.clone());
        Ok(fresh)
    }

    /// The endpoint `id` as read less than the cache's time to live ago
    /// (`Some(None)`: it did not exist then); `None` when not cached.
    fn cached_endpoint(&self, id: &EndpointId) -> Option<Option<Endpoint>> {
        self.lock_cache()
            .get(id)
            .filter(|entry| self.still_fresh(entry))
            .map(|(_, cached)| cached.clone())
    }

    /// Whether [`Self::cached_endpoint`] would answer (nothing cloned).
    fn endpoint_is_cached(&self, id: &EndpointId) -> bool {
        self.lock_cache()
            .get(id)
            .is_some_and(|entry| self.still_fresh(entry))
    }

    /// A cached endpoint is used for the cache's time to live; one with a
    /// run of unanswered requests, whose circuit another deliver may open
    /// at any moment, for [`SUSPECT_CACHE_TTL`] at most.
    fn still_fresh(&self, (at, cached): &(Instant, Option<Endpoint>)) -> bool {
        let suspect = cached.as_ref().is_some_and(|ep| ep.unanswered_count > 0);
        let ttl = if suspect {
            SUSPECT_CACHE_TTL.min(self.settings.endpoint_cache_ttl)
        } else {
            self.settings.endpoint_cache_ttl
        };
        at.elapsed() < ttl
    }

    fn remember_endpoint(&self, id: &EndpointId, endpoint: Option<Endpoint>) {
        self.lock_cache()
            .insert(id.clone(), (Instant::now(), endpoint));
    }

    fn forget_endpoint(&self, id: &EndpointId) {
        self.lock_cache().remove(id);
    }

    fn lock_cache(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<EndpointId, (Instant, Option<Endpoint>)>> {
        self.endpoint_cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::message_for;
    use crate::fakes::{MemoryQueue, MemoryStore, ScriptedSender};
    use crate::ports::StoredEvent;
    use hookline_core::ids::{DeliveryId, EventId};
    use hookline_core::model::{Event, EventType};
    use hookline_core::signing::Secret;
    use std::sync::atomic::{AtomicI64, Ordering};

    /// The rate-limit test's clock: now, moved by `SHIFT_MS`.
    static SHIFT_MS: AtomicI64 = AtomicI64::new(0);
    fn shifted() -> DateTime<Utc> {
        Utc::now() + chrono::TimeDelta::milliseconds(SHIFT_MS.load(Ordering::SeqCst))
    }
    fn move_clock_to(at: DateTime<Utc>) {
        let delta = (at - Utc::now()).num_milliseconds();
        SHIFT_MS.store(delta, Ordering::SeqCst);
    }

    /// An endpoint of app `a` at `url`, created in `store` at `now`.
    async fn stored_endpoint(store: &MemoryStore, url: &str, now: DateTime<Utc>) -> Endpoint {
        let ep = Endpoint::new(
            EndpointId::generate(),
            AppId::parse("a").unwrap(),
            url,
            Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap(),
            now,
        );
        assert!(store
            .put_endpoint(&ep, crate::settings::MAX_ENDPOINTS_PER_APP_CEILING)
            .await
            .unwrap());
        ep
    }

    /// A pending delivery of a new event (`{"n": n}`) to `ep`, both in
    /// `store`.
    fn seeded_delivery(
        store: &MemoryStore,
        ep: &Endpoint,
        n: usize,
        at: DateTime<Utc>,
    ) -> Delivery {
        let event = Event::new(
            EventId::new_fanout_base(at, &mut rand::thread_rng()),
            ep.app_id.clone(),
            EventType::parse("order.paid").unwrap(),
            &serde_json::value::RawValue::from_string(format!("{{\"n\":{n}}}")).unwrap(),
            at,
        );
        let d = Delivery::new(
            DeliveryId::for_event_endpoint(&event.id, &ep.id),
            &event,
            ep.id.clone(),
            at,
        );
        store.insert_event(StoredEvent {
            event,
            targets: vec![],
            fanout_remaining: vec![],
            fanout_version: 0,
        });
        store.insert_delivery(d.clone());
        d
    }

    /// The queue-lag test's clock: now, moved by `LAG_SHIFT_MS`.
    static LAG_SHIFT_MS: AtomicI64 = AtomicI64::new(0);
    fn lag_clock() -> DateTime<Utc> {
        Utc::now() + chrono::TimeDelta::milliseconds(LAG_SHIFT_MS.load(Ordering::SeqCst))
    }

    /// Window (e)'s other half: deliver records how late it receives due
    /// messages once per 30 s period, when all of at least 10 messages of
    /// the period were half of `WEBHOOKS_RECONCILE_AFTER` (15 min) late or
    /// more: a lone old message, fewer than 10, or one on time among them
    /// record nothing.
    #[tokio::test]
    async fn a_backlog_records_the_queue_lag_once_per_period() {
        let deliverer = Deliverer::new(
            MemoryStore::default(),
            MemoryQueue::default(),
            ScriptedSender::new(vec![], ScriptedSender::status(200)),
            Settings::for_tests(&[("WEBHOOKS_RECONCILE_AFTER", "15m")]).unwrap(),
        )
        .with_clock(lag_clock);
        let now = Utc::now();
        let ep = stored_endpoint(&deliverer.store, "https://example.com/hook", now).await;
        let mut n = 0;
        let mut late_by = |minutes: i64| {
            n += 1;
            let due = now - chrono::TimeDelta::minutes(minutes);
            let d = seeded_delivery(&deliverer.store, &ep, n, due);
            let (mut message, _) = message_for(&d, due).unwrap();
            message.not_before = due;
            serde_json::to_string(&message).unwrap()
        };
        let period = |bodies: Vec<String>, shift_s: i64| {
            LAG_SHIFT_MS.store(shift_s * 1000, Ordering::SeqCst);
            bodies
        };
        let deliverer = &deliverer;
        let run = |bodies: Vec<String>| async move {
            let refs: Vec<&str> = bodies.iter().map(String::as_str).collect();
            assert!(deliverer.handle_batch(&refs).await.is_empty());
        };
        // A lone message days late, then a period's end: nothing (one is
        // not a backlog).
        run(period(vec![late_by(5 * 24 * 60)], 0)).await;
        run(period(vec![], 31)).await;
        assert_eq!(deliverer.store.queue_lag_writes(), 0, "a lone old message");
        // Ten late by 20 to 29 minutes and one on time: not a backlog.
        let mut bodies: Vec<String> = (20..30).map(&mut late_by).collect();
        bodies.push(late_by(0));
        run(period(bodies, 40)).await;
        run(period(vec![], 72)).await;
        assert_eq!(
            deliverer.store.queue_lag_writes(),
            0,
            "one on time among them"
        );
        // Ten all late by 20 minutes or more: recorded, the least of them.
        run(period((20..30).map(&mut late_by).collect(), 80)).await;
        run(period(vec![], 112)).await;
        assert_eq!(deliverer.store.queue_lag_writes(), 1);
        let lag = deliverer
            .store
            .queue_lag()
            .await
            .unwrap()
            .expect("recorded");
        assert!(
            // 20 minutes, and the 80 s the clock moved.
            lag.lag >= Duration::from_secs(20 * 60) && lag.lag < Duration::from_secs(22 * 60),
            "{lag:?}"
        );
        // Five late minutes (under half of 15): nothing more.
        run(period((0..10).map(|_| late_by(5)).collect(), 120)).await;
        run(period(vec![], 150)).await;
        assert_eq!(deliverer.store.queue_lag_writes(), 1);
    }

    /// The circuit test's clock: now, moved by `CIRCUIT_SHIFT_MS`.
    static CIRCUIT_SHIFT_MS: AtomicI64 = AtomicI64::new(0);
    fn circuit_clock() -> DateTime<Utc> {
        Utc::now() + chrono::TimeDelta::milliseconds(CIRCUIT_SHIFT_MS.load(Ordering::SeqCst))
    }

    fn unanswered() -> crate::ports::SendResult {
        crate::ports::SendResult {
            error: Some("timed out after 15s".into()),
            latency: Duration::from_secs(15),
            ..Default::default()
        }
    }

    /// Item 10 of #39: an endpoint that stops answering opens its circuit
    /// after three unanswered requests; its deliveries then wait without an
    /// attempt (budget kept), one fails at the end of its schedule; after
    /// the cool-down one probe is sent: unanswered, the circuit reopens
    /// for twice as long; answered, it closes and the probe is delivered.
    #[tokio::test]
    async fn an_unanswering_endpoint_opens_its_circuit_and_one_probe_closes_it() {
        use hookline_core::circuit::COOL_DOWN_FIRST;
        let script: Vec<_> = (0..4).map(|_| unanswered()).collect();
        let deliverer = Deliverer::new(
            MemoryStore::default(),
            MemoryQueue::default(),
            ScriptedSender::new(script, ScriptedSender::status(200)),
            Settings::for_tests(&[("WEBHOOKS_RETRY_SCHEDULE", "1s,2s")]).unwrap(),
        )
        .with_clock(circuit_clock);
        let now = Utc::now();
        let ep = stored_endpoint(&deliverer.store, "https://example.com/hung", now).await;
        let deliveries: Vec<Delivery> = (0..6)
            .map(|n| seeded_delivery(&deliverer.store, &ep, n, now))
            .collect();
        let current = |d: &Delivery| {
            let stored = deliverer
                .store
                .deliveries()
                .into_iter()
                .find(|s| s.id == d.id)
                .expect("stored");
            (message_for(&stored, now).map(|(m, _)| m), stored)
        };
        let requests = || lock(&deliverer.sender.requests).len();
        // Three unanswered: each an attempt; the third opens the circuit.
        for d in &deliveries[..3] {
            let outcome = deliverer.handle(&current(d).0.unwrap()).await.unwrap();
            assert_eq!(outcome, DeliverOutcome::RetryScheduled);
        }
        let circuit = deliverer
            .store
            .endpoint(&ep.id)
            .unwrap()
            .circuit
            .expect("open after three");
        assert_eq!(requests(), 3);
        assert_eq!(circuit.last_error.as_deref(), Some("timed out after 15s"));
        // The next is held: no request, no attempt, due after the cool-down.
        let outcome = deliverer
            .handle(&current(&deliveries[3]).0.unwrap())
            .await
            .unwrap();
        assert_eq!(outcome, DeliverOutcome::Held);
        let (message, held) = current(&deliveries[3]);
        assert_eq!(requests(), 3);
        assert_eq!((held.attempt_count, held.total_attempts), (0, 0));
        // Its schedule (1 s + 2 s) ends before the cool-down: held to then.
        let deadline = held.held_until_deadline.expect("held");
        assert_eq!(held.next_attempt_at, Some(deadline));
        // At that end, still open: it fails as its last attempt would
        // have, with its DLQ copy.
        CIRCUIT_SHIFT_MS.store((deadline - now).num_milliseconds() + 100, Ordering::SeqCst);
        let outcome = deliverer.handle(&message.unwrap()).await.unwrap();
        assert_eq!(outcome, DeliverOutcome::Failed);
        let (_, failed) = current(&deliveries[3]);
        assert!(failed.attempts[0]
            .error
            .as_deref()
            .is_some_and(|e| e.contains("circuit was open")));
        assert_eq!(deliverer.queue.dlq_bodies().len(), 1);
        assert_eq!(requests(), 3, "no request to an open circuit");
        // After the cool-down one probe goes: unanswered, reopened for 60 s.
        let cool = chrono::TimeDelta::from_std(COOL_DOWN_FIRST).unwrap();
        CIRCUIT_SHIFT_MS.store(
            (circuit.open_until - now).num_milliseconds() + 100,
            Ordering::SeqCst,
        );
        let probe = current(&deliveries[4]).0.unwrap();
        assert_eq!(
            deliverer.handle(&probe).await.unwrap(),
            DeliverOutcome::RetryScheduled
        );
        assert_eq!(requests(), 4);
        let reopened = deliverer.store.endpoint(&ep.id).unwrap().circuit.unwrap();
        assert_eq!(reopened.cool_down_seconds, 2 * COOL_DOWN_FIRST.as_secs());
        assert!(!reopened.probing);
        assert!(reopened.open_until > circuit.open_until + cool);
        // After that, the next probe is answered: closed, delivered.
        CIRCUIT_SHIFT_MS.store(
            (reopened.open_until - now).num_milliseconds() + 100,
            Ordering::SeqCst,
        );
        let outcome = deliverer
            .handle(&current(&deliveries[5]).0.unwrap())
            .await
            .unwrap();
        assert_eq!(outcome, DeliverOutcome::Delivered);
        assert_eq!(deliverer.store.endpoint(&ep.id).unwrap().circuit, None);
        assert_eq!(requests(), 5);
    }

    /// An endpoint that misses an answer now and then, among answered
    /// requests, never opens its circuit: each answer ends the run.
    #[tokio::test]
    async fn an_endpoint_missing_every_other_answer_keeps_its_circuit_closed() {
        let ok = ScriptedSender::status(200);
        let script = (0..7)
            .map(|n| if n % 2 == 0 { unanswered() } else { ok.clone() })
            .collect();
        let deliverer = Deliverer::new(
            MemoryStore::default(),
            MemoryQueue::default(),
            ScriptedSender::new(script, ok.clone()),
            Settings::for_tests(&[]).unwrap(),
        );
        let now = Utc::now();
        let ep = stored_endpoint(&deliverer.store, "https://example.com/flaky", now).await;
        for n in 0..7 {
            let d = seeded_delivery(&deliverer.store, &ep, n, now);
            let message = message_for(&d, now).unwrap().0;
            deliverer.handle(&message).await.unwrap();
            let stored = deliverer.store.endpoint(&ep.id).unwrap();
            assert_eq!(stored.circuit, None, "request {n}");
            assert_eq!(
                stored.unanswered_count,
                u32::from(n % 2 == 0),
                "request {n}"
            );
        }
        assert_eq!(lock(&deliverer.sender.requests).len(), 7, "none held");
    }

    /// The slow-endpoint test's clock: now, moved by `SLOW_SHIFT_MS`.
    static SLOW_SHIFT_MS: AtomicI64 = AtomicI64::new(0);
    fn slow_clock() -> DateTime<Utc> {
        Utc::now() + chrono::TimeDelta::milliseconds(SLOW_SHIFT_MS.load(Ordering::SeqCst))
    }

    /// An endpoint that answers slowly (4 s, of a 15 s timeout) twice in a
    /// row is paced: its requests start in turns 2 s apart (half its
    /// answers' time) across processes, so it holds about two deliver
    /// environments; the others wait for their turn (no attempt, budget
    /// kept) and go on it without taking another, even when picked up late.
    #[tokio::test]
    async fn a_slow_endpoint_is_sent_in_turns() {
        use hookline_core::circuit::turn_gap;
        let slow = crate::ports::SendResult {
            latency: Duration::from_secs(4),
            ..ScriptedSender::status(200)
        };
        let deliverer = Deliverer::new(
            MemoryStore::default(),
            MemoryQueue::default(),
            ScriptedSender::new(vec![], slow),
            Settings::for_tests(&[("WEBHOOKS_DELIVERY_TIMEOUT", "15s")]).unwrap(),
        )
        .with_clock(slow_clock);
        let now = Utc::now();
        let ep = stored_endpoint(&deliverer.store, "https://example.com/slow", now).await;
        let deliveries: Vec<Delivery> = (0..5)
            .map(|n| seeded_delivery(&deliverer.store, &ep, n, now))
            .collect();
        let stored = |d: &Delivery| {
            deliverer
                .store
                .deliveries()
                .into_iter()
                .find(|s| s.id == d.id)
                .expect("stored")
        };
        let deliverer = &deliverer;
        let handle = |d: &Delivery| {
            let message = message_for(&stored(d), now).unwrap().0;
            async move { deliverer.handle(&message).await.unwrap() }
        };
        let requests = || lock(&deliverer.sender.requests).len();
        // Two slow answers in a row make it paced; the next takes the
        // idle turn.
        for d in &deliveries[..3] {
            assert_eq!(handle(d).await, DeliverOutcome::Delivered);
        }
        assert_eq!(requests(), 3);
        // The next two wait for the following turns (half its 4 s answers
        // apart), no attempt made.
        let gap = chrono::TimeDelta::from_std(turn_gap(Duration::from_secs(4))).unwrap();
        for (n, d) in deliveries[3..].iter().enumerate() {
            assert_eq!(handle(d).await, DeliverOutcome::Held);
            let waiting = stored(d);
            let turn = waiting.turn_at.expect("a turn");
            assert_eq!(waiting.next_attempt_at, Some(turn));
            assert_eq!(waiting.total_attempts, 0);
            let ahead = turn - now;
            let expected = gap * i32::try_from(n + 1).unwrap();
            assert!(
                (ahead - expected).num_milliseconds().abs() < 500,
                "turn {n} is {ahead} ahead"
            );
        }
        assert_eq!(requests(), 3);
        // At its turn the fourth goes, without taking another; so does the
        // fifth picked up late, past the turn after it.
        SLOW_SHIFT_MS.store(gap.num_milliseconds(), Ordering::SeqCst);
        assert_eq!(handle(&deliveries[3]).await, DeliverOutcome::Delivered);
        SLOW_SHIFT_MS.store(gap.num_milliseconds() * 5, Ordering::SeqCst);
        assert_eq!(handle(&deliveries[4]).await, DeliverOutcome::Delivered);
        assert_eq!(requests(), 5);
        let next = deliverer.store.endpoint(&ep.id).unwrap().turn_next.unwrap();
        assert!((next - now - gap * 3).num_milliseconds().abs() < 500);
    }

    /// A sender whose every request goes unanswered after `delay`.
    struct Hung {
        delay: Duration,
        requests: std::sync::atomic::AtomicU32,
    }
    impl Sender for Hung {
        async fn send(&self, _: OutgoingRequest<'_>) -> crate::ports::SendResult {
            self.requests.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(self.delay).await;
            unanswered()
        }
    }

    /// While the circuit is still closed, one process keeps one request in
    /// flight to an endpoint whose last request went unanswered: a batch of
    /// four to it sends one, the three others are held (no attempt) a
    /// delivery timeout. An endpoint that answers is not capped.
    #[tokio::test]
    async fn an_unanswering_endpoint_gets_one_request_in_flight_per_process() {
        let deliverer = Deliverer::new(
            MemoryStore::default(),
            MemoryQueue::default(),
            Hung {
                delay: Duration::from_millis(100),
                requests: Default::default(),
            },
            Settings::for_tests(&[]).unwrap(),
        );
        let now = Utc::now();
        let ep = stored_endpoint(&deliverer.store, "https://example.com/hung", now).await;
        let bodies: Vec<String> = (0..5)
            .map(|n| {
                let d = seeded_delivery(&deliverer.store, &ep, n, now);
                serde_json::to_string(&message_for(&d, now).unwrap().0).unwrap()
            })
            .collect();
        assert!(deliverer.handle_batch(&[&bodies[0]]).await.is_empty());
        let refs: Vec<&str> = bodies[1..].iter().map(String::as_str).collect();
        assert!(deliverer.handle_batch(&refs).await.is_empty());
        assert_eq!(deliverer.sender.requests.load(Ordering::SeqCst), 2);
        let held: Vec<Delivery> = deliverer
            .store
            .deliveries()
            .into_iter()
            .filter(|d| d.attempt_count == 0)
            .collect();
        assert_eq!(held.len(), 3, "three held, no attempt made");
        let timeout = chrono::TimeDelta::from_std(deliverer.settings.delivery_timeout).unwrap();
        assert!(held
            .iter()
            .all(|d| d.next_attempt_at.is_some_and(|at| at >= now + timeout)));
        assert_eq!(
            deliverer.store.endpoint(&ep.id).unwrap().circuit,
            None,
            "two unanswered: not open yet"
        );
    }

    /// A 410 judged from a cached copy of the endpoint older than its
    /// current state (re-enabled, or its URL fixed, after that copy was
    /// read): the endpoint is not disabled and nothing is announced. The
    /// same 410 from a current copy disables it.
    #[tokio::test]
    async fn a_410_from_a_stale_copy_of_the_endpoint_disables_nothing() {
        let deliverer = Deliverer::new(
            MemoryStore::default(),
            MemoryQueue::default(),
            ScriptedSender::new(vec![], ScriptedSender::status(410)),
            Settings::for_tests(&[]).unwrap(),
        );
        let now = Utc::now();
        let ep = stored_endpoint(&deliverer.store, "https://example.com/old", now).await;
        let delivery = |n: usize| {
            let d = seeded_delivery(&deliverer.store, &ep, n, now);
            message_for(&d, now).unwrap().0
        };
        // The deliverer reads (and caches) the endpoint at its version...
        let first = delivery(1);
        let second = delivery(2);
        assert!(deliverer
            .endpoint(&ep.app_id, &ep.id)
            .await
            .unwrap()
            .is_some());
        // ... then the user moves it to a new URL (a new version).
        let mut moved = ep.clone();
        moved.url = "https://example.com/new".into();
        moved.version += 1;
        assert!(deliverer
            .store
            .update_endpoint(&moved, ep.version)
            .await
            .unwrap());
        // The old copy's 410: nothing disabled.
        deliverer.handle(&first).await.unwrap();
        let now_stored = deliverer.store.endpoint(&ep.id).unwrap();
        assert!(!now_stored.disabled, "a stale judgement disabled it");
        // Judged again from the current state: disabled.
        deliverer.handle(&second).await.unwrap();
        assert!(deliverer.store.endpoint(&ep.id).unwrap().disabled);
    }

    /// A limit of 1 request per second: of four attempts handled at once, the
    /// first goes now, the second after waiting in process for its slot,
    /// the others are written due at their slots (1 s apart), budget
    /// untouched, their message done (stale if it comes again). Coming back
    /// at its slot an attempt uses it (the limiter is not asked again, so
    /// the next new one gets the slot after the last); one picked up after
    /// its slot's second, or in it but past its send deadline, takes a new
    /// slot.
    #[tokio::test]
    async fn a_rate_limit_gives_each_attempt_a_slot_and_keeps_the_budget() {
        let deliverer = Deliverer::new(
            MemoryStore::default(),
            MemoryQueue::default(),
            ScriptedSender::new(vec![], ScriptedSender::status(200)),
            Settings::for_tests(&[]).unwrap(),
        )
        .with_clock(shifted);
        // Early in a second: the first send goes in the second it is
        // handled in (not past its slot's deadline, 50 ms before the end).
        move_clock_to(
            hookline_core::rate::second_of(Utc::now()) + chrono::TimeDelta::milliseconds(1100),
        );
        let t0 = shifted();
        let ep = Endpoint {
            rate_limit: Some(1),
            ..Endpoint::new(
                EndpointId::generate(),
                AppId::parse("a").unwrap(),
                "https://example.com/hook",
                Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap(),
                t0,
            )
        };
        deliverer
            .store
            .put_endpoint(&ep, crate::settings::MAX_ENDPOINTS_PER_APP_CEILING)
            .await
            .unwrap();
        let new_delivery = |n: usize| seeded_delivery(&deliverer.store, &ep, n, t0);
        let stored = |d: &Delivery| {
            deliverer
                .store
                .delivery_items()
                .into_iter()
                .find(|s| s.id == d.id)
                .unwrap()
        };
        let deliverer = &deliverer;
        let handle = |d: Delivery| async move {
            let (message, _) = message_for(&d, shifted()).unwrap();
            deliverer.handle(&message).await.unwrap()
        };
        let sent = || deliverer.sender.requests.lock().unwrap().len();

        let ds: Vec<Delivery> = (0..4).map(new_delivery).collect();
        let outcomes = futures::future::join_all(ds.iter().cloned().map(handle)).await;
        use DeliverOutcome::{Delivered, Stale, Throttled};
        assert_eq!(outcomes, [Delivered, Delivered, Throttled, Throttled]);
        assert_eq!(sent(), 2);
        let (third, fourth) = (stored(&ds[2]), stored(&ds[3]));
        let slot3 = third.throttled_until.expect("a slot");
        let slot4 = fourth.throttled_until.expect("a slot");
        assert_eq!(slot4 - slot3, chrono::TimeDelta::seconds(1));
        assert!(
            slot3 - t0 >= chrono::TimeDelta::milliseconds(1000),
            "{slot3} {t0}"
        );
        for d in [&third, &fourth] {
            assert_eq!(d.status, DeliveryStatus::Pending);
            assert_eq!((d.attempt_count, d.total_attempts, d.version), (0, 0, 1));
            // Due at the start of the slot's second.
            let slot = d.throttled_until.unwrap();
            assert_eq!(
                d.next_attempt_at,
                Some(hookline_core::rate::second_of(slot))
            );
        }
        // The message that brought it is done.
        assert_eq!(handle(ds[2].clone()).await, Stale);

        // Back in their slots' seconds: sent, with no new slot taken.
        move_clock_to(hookline_core::rate::second_of(slot3));
        assert_eq!(handle(third.clone()).await, Delivered);
        move_clock_to(slot4);
        assert_eq!(handle(fourth.clone()).await, Delivered);
        assert_eq!(sent(), 4);
        let after = stored(&ds[2]);
        assert_eq!(
            (
                after.attempt_count,
                after.attempts[0].attempt,
                after.throttled_until
            ),
            (1, 1, None)
        );
        // Two more at slot4: the first waits in process for slot4 + 1 s,
        // the second's slot is slot4 + 2 s.
        let more: Vec<Delivery> = (4..6).map(new_delivery).collect();
        let outcomes = futures::future::join_all(more.iter().cloned().map(handle)).await;
        assert_eq!(outcomes, [Delivered, Throttled]);
        let slot6 = stored(&more[1]).throttled_until.unwrap();
        assert_eq!(slot6 - slot4, chrono::TimeDelta::seconds(2));
        // Picked up after its slot's second: a new slot, now (idle limiter).
        move_clock_to(slot6 + chrono::TimeDelta::seconds(3));
        assert_eq!(handle(stored(&more[1])).await, Delivered);
        assert_eq!(sent(), 6);

        // Holding a slot but picked up in its second after its deadline
        // (a busy process): sent then it could land next to the next
        // second's own request. It takes new slots instead (its second's
        // is as late; the next second's is 30 ms away: it waits and goes),
        // so the next two new ones get the two seconds after that.
        let second = hookline_core::rate::second_of(shifted()) + chrono::TimeDelta::seconds(10);
        let mut late = new_delivery(6);
        late.throttle(second, shifted()).unwrap();
        deliverer.store.insert_delivery(late.clone());
        move_clock_to(second + chrono::TimeDelta::milliseconds(970));
        assert_eq!(handle(stored(&late)).await, Delivered);
        assert_eq!(sent(), 7);
        let next: Vec<Delivery> = (7..9).map(new_delivery).collect();
        let outcomes = futures::future::join_all(next.iter().cloned().map(handle)).await;
        assert_eq!(outcomes, [Delivered, Throttled]);
        assert_eq!(
            stored(&next[1]).throttled_until,
            Some(second + chrono::TimeDelta::seconds(3))
        );
        SHIFT_MS.store(0, Ordering::SeqCst);
    }

    /// A listed delivery's first attempt is made from its message alone
    /// (the event is not read: here it is not even in the store), and its
    /// outcome written as its first item; once anything wrote the delivery
    /// (a re-queue by the reconciler, at version 1), a first-attempt message
    /// is stale and nothing is sent.
    #[tokio::test]
    async fn a_listed_first_attempt_reads_only_its_delivery_item() {
        let deliverer = Deliverer::new(
            MemoryStore::default(),
            MemoryQueue::default(),
            ScriptedSender::new(vec![], ScriptedSender::status(200)),
            Settings::for_tests(&[]).unwrap(),
        );
        let now = Utc::now();
        let ep = stored_endpoint(&deliverer.store, "https://example.com/hook", now).await;
        let event = Event::new(
            EventId::new_fanout_base(now, &mut rand::thread_rng()),
            ep.app_id.clone(),
            EventType::parse("order.paid").unwrap(),
            &serde_json::value::RawValue::from_string(r#"{"n":1}"#.into()).unwrap(),
            now,
        );
        let stored = StoredEvent {
            event: event.clone(),
            targets: vec![ep.id.clone(), ep.id.clone(), ep.id.clone()],
            fanout_remaining: vec![],
            fanout_version: 0,
        };
        let first_message = |d: &Delivery| {
            let (mut message, _) = message_for(d, now).unwrap();
            message.body = Some(event.body.clone());
            message
        };
        let first = stored.listed_delivery(0).unwrap();
        assert_eq!(
            deliverer.handle(&first_message(&first)).await.unwrap(),
            DeliverOutcome::Delivered
        );
        let written = deliverer.store.delivery_items();
        assert_eq!(written.len(), 1);
        assert_eq!(
            (written[0].id.clone(), written[0].status, written[0].version),
            (first.id.clone(), DeliveryStatus::Delivered, 1)
        );
        assert_eq!(written[0].created_at, event.created_at);
        let requests = deliverer.sender.requests.lock().unwrap().clone();
        assert_eq!(requests.len(), 1);
        assert_eq!(requests[0].2, event.body.as_bytes());
        assert_eq!(
            deliverer.store.item_reads(),
            (0, 1),
            "a first attempt's read is eventually consistent (half the units)"
        );

        // The second was re-queued by the reconciler meanwhile (version 1).
        let mut second = stored.listed_delivery(1).unwrap();
        let message = first_message(&second);
        second.requeue(now).unwrap();
        deliverer.store.insert_delivery(second.clone());
        assert_eq!(
            deliverer.handle(&message).await.unwrap(),
            DeliverOutcome::Stale
        );
        assert_eq!(deliverer.sender.requests.lock().unwrap().len(), 1);

        // Its version-1 message: read from its item alone, and sent.
        assert_eq!(
            deliverer
                .handle(&first_message(&stored_delivery(&deliverer, &second.id)))
                .await
                .unwrap(),
            DeliverOutcome::Delivered
        );
        assert_eq!(deliverer.sender.requests.lock().unwrap().len(), 2);
        assert_eq!(
            deliverer.store.item_reads(),
            (1, 2),
            "a later attempt compares versions: a consistent read"
        );

        // A later attempt's message for a delivery with no item (expired):
        // stale, not rebuilt from the event's list.
        let mut third = stored.listed_delivery(2).unwrap();
        third.requeue(now).unwrap();
        assert_eq!(
            deliverer.handle(&first_message(&third)).await.unwrap(),
            DeliverOutcome::Stale
        );
        assert_eq!(deliverer.sender.requests.lock().unwrap().len(), 2);
    }

    fn stored_delivery<H>(
        deliverer: &Deliverer<MemoryStore, MemoryQueue, H>,
        id: &DeliveryId,
    ) -> Delivery {
        deliverer
            .store
            .delivery_items()
            .into_iter()
            .find(|d| &d.id == id)
            .expect("the delivery's item")
    }

    /// A failure streak is measured from its first failure; a 2xx ends it;
    /// the endpoint is disabled only once a streak lasts
    /// `WEBHOOKS_DISABLE_AFTER` (times given, no sleeping).
    #[tokio::test]
    async fn a_2xx_ends_a_failure_streak_and_only_a_long_streak_disables() {
        let settings = Settings::for_tests(&[("WEBHOOKS_DISABLE_AFTER", "3s")]).unwrap();
        let deliverer = Deliverer::new(
            MemoryStore::default(),
            MemoryQueue::default(),
            ScriptedSender::new(vec![], ScriptedSender::status(200)),
            settings,
        );
        let t0 = chrono::Utc::now();
        let at = |ms: i64| t0 + chrono::Duration::milliseconds(ms);
        let ep = stored_endpoint(&deliverer.store, "https://example.com/hook", t0).await;
        let current = || deliverer.store.endpoint(&ep.id).unwrap();
        // The settle period is a tenth of 3 s.
        assert_eq!(
            health_settle(chrono::Duration::seconds(3)),
            chrono::Duration::milliseconds(300)
        );
        assert_eq!(
            health_settle(chrono::Duration::days(5)),
            chrono::Duration::minutes(1)
        );
        let steps: [(i64, bool, Option<i64>, bool, bool); 9] = [
            // (ms, answered 2xx, failing since, disabled after it, written)
            (0, false, Some(0), false, true),
            (100, true, Some(0), false, false), // a 2xx 0.1 s into the streak: it settles first
            (250, false, Some(0), false, false),
            (299, true, Some(0), false, false),
            (2000, true, None, false, true),
            (3000, false, Some(3000), false, true),
            (5000, false, Some(3000), false, false), // 2 s into this streak
            (6000, false, Some(3000), true, true),   // this streak reached 3 s
            (7000, true, Some(3000), true, false),   // disabled: nothing is tracked any more
        ];
        for (ms, ok, since, disabled, written) in steps {
            let endpoint = current();
            if !endpoint.disabled {
                deliverer.track_health(&endpoint, ok, at(ms)).await.unwrap();
            }
            let after = current();
            assert_eq!(after.failing_since, since.map(at), "at {ms} ms");
            assert_eq!(after.disabled, disabled, "at {ms} ms");
            assert_eq!(after.version != endpoint.version, written, "at {ms} ms");
        }
        assert!(current()
            .disabled_reason
            .unwrap()
            .contains("WEBHOOKS_DISABLE_AFTER"));
    }

    /// A small pipeline around `deliverer` for the ordering tests: sends
    /// keyed events (`key`, `{"n": n}`) through ingest, then pumps the
    /// store's stream through dispatch and every queued message through
    /// deliver (due at once) until nothing moves.
    struct Pipeline {
        deliverer: Deliverer<MemoryStore, MemoryQueue, ScriptedSender>,
        app: AppId,
    }

    impl Pipeline {
        async fn new(script: Vec<crate::ports::SendResult>) -> (Self, Endpoint) {
            let deliverer = Deliverer::new(
                MemoryStore::default(),
                MemoryQueue::default(),
                ScriptedSender::new(script, ScriptedSender::status(200)),
                Settings::for_tests(&[]).unwrap(),
            );
            deliverer.store.record_stream();
            let ep =
                stored_endpoint(&deliverer.store, "https://example.com/hook", Utc::now()).await;
            let app = ep.app_id.clone();
            (Self { deliverer, app }, ep)
        }

        /// Accepts `{"n": n}` with `key`; its delivery's id.
        async fn send(&self, key: Option<&str>, n: u32) -> DeliveryId {
            self.send_at(key, n, Utc::now()).await
        }

        /// [`Self::send`], accepted at `at`.
        async fn send_at(&self, key: Option<&str>, n: u32, at: DateTime<Utc>) -> DeliveryId {
            let body = match key {
                Some(k) => format!(
                    r#"{{"event_type":"order.paid","payload":{{"n":{n}}},"ordering_key":"{k}"}}"#
                ),
                None => format!(r#"{{"event_type":"order.paid","payload":{{"n":{n}}}}}"#),
            };
            let accepted = crate::ingest::ingest(
                &self.deliverer.store,
                &self.deliverer.settings,
                &crate::ingest::Unchecked,
                self.app.as_str(),
                None,
                body.as_bytes(),
                at,
                &mut StdRng::from_entropy(),
            )
            .await
            .unwrap();
            let answer: crate::ingest::IngestResponse =
                serde_json::from_str(&accepted.body).unwrap();
            answer.delivery_ids[0].clone()
        }

        /// The stream to dispatch: the messages it queued (taken).
        async fn dispatch(&self) -> Vec<(DeliveryMessage, i32)> {
            let (store, queue) = (&self.deliverer.store, &self.deliverer.queue);
            let records = store.take_stream();
            assert_eq!(
                crate::dispatch::dispatch_changes(
                    store,
                    queue,
                    records,
                    chrono::TimeDelta::hours(1),
                    Utc::now()
                )
                .await,
                None
            );
            std::mem::take(&mut *queue.sent.lock().unwrap())
        }

        /// One round: the stream to dispatch, then each message to deliver.
        /// The outcomes, by delivery; empty when nothing moved.
        async fn round(&self) -> Vec<(DeliveryId, DeliverOutcome)> {
            let now = Utc::now();
            let messages = self.dispatch().await;
            let mut outcomes = Vec::new();
            for (mut message, _) in messages {
                message.not_before = now;
                let outcome = self.deliverer.handle(&message).await.unwrap();
                outcomes.push((message.delivery_id, outcome));
            }
            outcomes
        }

        /// Rounds until nothing moves; every outcome in order.
        async fn settle(&self) -> Vec<(DeliveryId, DeliverOutcome)> {
            let mut all = Vec::new();
            for _ in 0..20 {
                let outcomes = self.round().await;
                if outcomes.is_empty() && self.deliverer.store.take_stream().is_empty() {
                    return all;
                }
                all.extend(outcomes);
            }
            panic!("the pipeline did not settle: {all:?}");
        }

        /// The `n` of each request the receiver got, in order.
        fn received(&self) -> Vec<u32> {
            self.deliverer
                .sender
                .requests
                .lock()
                .unwrap()
                .iter()
                .map(|(_, _, body)| {
                    let v: serde_json::Value = serde_json::from_slice(body).unwrap();
                    u32::try_from(v["data"]["n"].as_u64().unwrap()).unwrap()
                })
                .collect()
        }

        fn delivery(&self, id: &DeliveryId) -> Delivery {
            self.deliverer
                .store
                .delivery_items()
                .into_iter()
                .find(|d| &d.id == id)
                .unwrap()
        }
    }

    /// A key's first delivery fails once: the key's next two wait for it
    /// (registered on their predecessor, blocked, no request), another key
    /// and an unkeyed event do not; its 2xx wakes the next, whose 2xx
    /// wakes the last.
    #[tokio::test]
    async fn a_keys_deliveries_go_in_order_and_a_failure_holds_back_only_its_key() {
        let (pipeline, _) = Pipeline::new(vec![ScriptedSender::status(503)]).await;
        let first = pipeline.send(Some("order_1"), 1).await;
        let second = pipeline.send(Some("order_1"), 2).await;
        let third = pipeline.send(Some("order_1"), 3).await;
        pipeline.send(Some("order_2"), 4).await;
        pipeline.send(None, 5).await;
        let outcomes = pipeline.round().await;
        use DeliverOutcome::*;
        assert_eq!(
            outcomes.iter().map(|(_, o)| *o).collect::<Vec<_>>(),
            [RetryScheduled, Blocked, Blocked, Delivered, Delivered]
        );
        assert_eq!(pipeline.delivery(&second).blocked_by, Some(first.clone()));
        assert_eq!(pipeline.delivery(&third).blocked_by, Some(second.clone()));
        assert_eq!(pipeline.received(), [1, 4, 5], "only the failing key waits");
        pipeline.settle().await;
        assert_eq!(pipeline.received(), [1, 4, 5, 1, 2, 3]);
        for id in [&first, &second, &third] {
            let d = pipeline.delivery(id);
            assert_eq!(
                (d.status, d.blocked_by.clone(), d.released),
                (DeliveryStatus::Delivered, None, true)
            );
            assert_eq!(d.ordering_key.as_deref(), Some("order_1"));
        }
        assert_eq!(pipeline.delivery(&third).after.unwrap().delivery, second);
    }

    /// A failed delivery releases the next one: a 410 fails the key's
    /// first delivery (and disables the endpoint); the next two then fail
    /// in order, unsent ("endpoint disabled").
    #[tokio::test]
    async fn a_failed_delivery_releases_the_next_and_a_disabled_endpoints_fail_in_order() {
        let (pipeline, _) = Pipeline::new(vec![ScriptedSender::status(410)]).await;
        let ids = [
            pipeline.send(Some("k"), 1).await,
            pipeline.send(Some("k"), 2).await,
            pipeline.send(Some("k"), 3).await,
        ];
        let outcomes = pipeline.settle().await;
        assert_eq!(pipeline.received(), [1]);
        let failed: Vec<&DeliveryId> = outcomes
            .iter()
            .filter(|(_, o)| *o == DeliverOutcome::Failed)
            .map(|(id, _)| id)
            .collect();
        assert_eq!(
            failed,
            ids.iter().collect::<Vec<_>>(),
            "failed in the key's order"
        );
    }

    /// A delivery whose predecessor has no record yet (its first attempt
    /// not made) blocks itself and looks again a second later; the next
    /// one registers on it instead of looking too.
    #[tokio::test]
    async fn a_delivery_ahead_of_its_predecessor_looks_again_shortly() {
        let (pipeline, _) = Pipeline::new(vec![]).await;
        let first = pipeline.send(Some("k"), 1).await;
        let second = pipeline.send(Some("k"), 2).await;
        let third = pipeline.send(Some("k"), 3).await;
        let messages = pipeline.dispatch().await;
        let by_id = |id: &DeliveryId| {
            messages
                .iter()
                .find(|(m, _)| &m.delivery_id == id)
                .unwrap()
                .0
                .clone()
        };
        // The second's message comes first.
        use DeliverOutcome::*;
        assert_eq!(
            pipeline.deliverer.handle(&by_id(&second)).await.unwrap(),
            Rechecking
        );
        let (again, delay) = pipeline.deliverer.queue.sent.lock().unwrap()[0].clone();
        assert_eq!((again.rechecks, delay), (1, 1));
        assert_eq!(pipeline.delivery(&second).blocked_by, Some(first.clone()));
        assert_eq!(
            pipeline.deliverer.handle(&by_id(&third)).await.unwrap(),
            Blocked
        );
        assert_eq!(
            pipeline.deliverer.handle(&by_id(&first)).await.unwrap(),
            Delivered
        );
        pipeline.settle().await;
        assert_eq!(pipeline.received(), [1, 2, 3]);
    }

    /// Nothing waits forever: a predecessor with no record long past the
    /// reconciler's bound (its item expired though its event was kept) is
    /// taken as gone, and the delivery goes.
    #[tokio::test]
    async fn a_predecessor_with_no_record_past_the_recovery_bound_is_gone() {
        let (pipeline, _) = Pipeline::new(vec![]).await;
        let long_ago = Utc::now() - chrono::TimeDelta::hours(3);
        let first = pipeline.send_at(Some("k"), 1, long_ago).await;
        let second = pipeline.send_at(Some("k"), 2, long_ago).await;
        let messages = pipeline.dispatch().await;
        let mut message = messages
            .iter()
            .find(|(m, _)| m.delivery_id == second)
            .unwrap()
            .0
            .clone();
        // Not a backlog: the message arrives on time (a look again).
        message.not_before = Utc::now();
        assert_eq!(
            pipeline.deliverer.handle(&message).await.unwrap(),
            DeliverOutcome::Delivered
        );
        assert!(!pipeline
            .deliverer
            .store
            .delivery_items()
            .iter()
            .any(|d| d.id == first));
        assert_eq!(pipeline.received(), [2]);
    }
}
