//! The scale simulation: the pipeline's real use cases — ingest, dispatch
//! ([`dispatch_changes`] on the store's stream), deliver, the reconciler —
//! over the in-memory store (DynamoDB's 1 MB query pages, its shards), a
//! simulated clock and injected losses, at a production rate for many
//! reconciler intervals.
//!
//! - [`Config`]: the load and the losses; [`Config::full`] is SCALE.md's run,
//!   [`Config::quick`] the one `cargo test` runs on every stop.
//! - [`run`]: one simulation; [`Figures`]: what it measured, with
//!   [`Figures::check`] asserting nothing was lost and every loss was
//!   recovered within `WEBHOOKS_RECONCILE_AFTER` + 2 intervals.
//!
//! The world, one simulated second at a time: producers send
//! `events_per_second` events spread over `apps` apps with one endpoint
//! each (every event a listed fan-out); two thirds in, one app gets a
//! second endpoint and replays every event it had so far to it (the
//! replay reads only that app's events: counted); the store's stream goes to dispatch in batches of 100,
//! of which `stream_batch_loss` are given up (as Lambda does after its
//! retries); queue messages become visible at their delay, and a share
//! `first_message_loss` of first attempts never arrives; one purge empties
//! the queue; one second brings `burst_events` events of `burst_bytes`;
//! the receiver fails the first attempt of one delivery in 20 (so retries
//! wait in the queue when it is purged); the reconciler runs every
//! interval. TTL is modelled: events whose deliveries all finished are
//! removed three intervals after their creation.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeZone, Utc};
use hookline_core::ids::{AppId, DeliveryId, EndpointId, MessageId};
use hookline_core::model::{DeliveryStatus, Endpoint};
use hookline_core::signing::Secret;
use hookline_core::sync::lock;
use hookline_pipeline::deliver::Deliverer;
use hookline_pipeline::dispatch::{dispatch_changes, RecordChange, StreamChange};
use hookline_pipeline::fakes::{MemoryQueue, MemoryStore};
use hookline_pipeline::ingest::{ingest, Unchecked};
use hookline_pipeline::messages::DeliveryMessage;
use hookline_pipeline::ports::{OutgoingRequest, SendResult, Sender, Store};
use hookline_pipeline::reconcile::reconcile;
use hookline_pipeline::replay::{start_replay, ReplayRequest};
use hookline_pipeline::Settings;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The load and the losses of one run.
#[derive(Debug, Clone)]
pub struct Config {
    pub events_per_second: u32,
    /// Apps the events are spread over (the sweep reads each one's
    /// partitions; a replay reads one app's).
    pub apps: u32,
    /// Reconciler intervals of load (a drain of `WEBHOOKS_RECONCILE_AFTER`
    /// plus three intervals follows, with no new events).
    pub intervals: u32,
    /// `WEBHOOKS_RECONCILE_INTERVAL`, in seconds.
    pub interval_secs: i64,
    /// `WEBHOOKS_RECONCILE_AFTER`, in seconds.
    pub reconcile_after_secs: i64,
    /// Share of first-attempt queue messages that never arrive.
    pub first_message_loss: f64,
    /// Share of stream batches (100 records) dispatch gives up.
    pub stream_batch_loss: f64,
    /// Events of `burst_bytes` each, all in one second.
    pub burst_events: u32,
    pub burst_bytes: usize,
    pub seed: u64,
    /// Ordering keys per app (0: events without one): event `n` of an app
    /// takes key `n % ordering_keys`, and each key's deliveries are
    /// checked to have gone in its order ([`Figures::order_violations`]).
    pub ordering_keys: u32,
}

impl Config {
    /// SCALE.md's run: 1,000 events a second for 12 intervals of 1 minute
    /// (720,000 events), every loss of the issue injected.
    pub fn full() -> Self {
        Self {
            events_per_second: 1_000,
            apps: 100,
            intervals: 12,
            interval_secs: 60,
            reconcile_after_secs: 120,
            first_message_loss: 0.001,
            stream_batch_loss: 0.01,
            burst_events: 2_000,
            burst_bytes: 200 * 1024,
            seed: 35,
            ordering_keys: 0,
        }
    }

    /// The run `cargo test` makes on every stop: the same losses at a
    /// tenth of the rate, a tenth of the burst.
    pub fn quick() -> Self {
        Self {
            events_per_second: 100,
            apps: 20,
            burst_events: 200,
            ..Self::full()
        }
    }

    /// The quick run with ordering keys: 100 per app (2,000 keys), so each
    /// key gets an event every 20 s, as close as a failed first attempt's
    /// two retries (10 s, then 20 s): a retrying delivery holds its key's
    /// next one back.
    pub fn quick_ordered() -> Self {
        Self {
            ordering_keys: 100,
            seed: 36,
            ..Self::quick()
        }
    }

    fn settings(&self) -> Settings {
        Settings::for_tests(&[
            (
                "WEBHOOKS_RECONCILE_AFTER",
                &format!("{}s", self.reconcile_after_secs),
            ),
            (
                "WEBHOOKS_RECONCILE_INTERVAL",
                &format!("{}s", self.interval_secs),
            ),
            ("WEBHOOKS_RETRY_SCHEDULE", "10s,20s,40s"),
            ("WEBHOOKS_DELIVERY_TIMEOUT", "5s"),
            ("WEBHOOKS_DELIVER_FUNCTION_TIMEOUT", "30s"),
        ])
        .expect("the simulation's settings are valid")
    }
}

/// What one run measured.
#[derive(Debug, Clone, Default)]
pub struct Figures {
    pub events: u64,
    pub deliveries: u64,
    /// Deliveries the receiver got at least once.
    pub received: u64,
    /// Requests for a delivery already received (at-least-once's cost).
    pub duplicates: u64,
    /// Deliveries never received: must be 0.
    pub lost: u64,
    /// Injected: first messages dropped, stream records given up (in
    /// batches), messages purged.
    pub first_messages_dropped: u64,
    pub stream_records_dropped: u64,
    pub purged: u64,
    /// Longest time from a delivery's loss to its receipt, in simulated
    /// seconds, and the bound it must stay within.
    pub longest_recovery_secs: i64,
    pub recovery_bound_secs: i64,
    /// The replay: deliveries it made, event items it read, and the events
    /// of its app and of all apps when it ran.
    pub replayed: u64,
    pub replay_items_read: u64,
    pub replay_app_events: u64,
    pub events_then: u64,
    /// Reconciler runs and the largest sweep lag one reported.
    pub reconciler_runs: u32,
    pub max_sweep_lag_secs: i64,
    /// Simulated seconds, wall-clock seconds, peak resident memory (MB).
    pub simulated_secs: i64,
    pub run_secs: f64,
    pub peak_rss_mb: f64,
    /// With ordering keys: the pairs of a key's consecutive deliveries to
    /// an endpoint checked, and those whose later one's first request came
    /// before the earlier one's 2xx (must be 0).
    pub ordered_pairs: u64,
    pub order_violations: u64,
}

impl Figures {
    /// Nothing lost; every loss recovered within the bound.
    pub fn check(&self) -> Result<(), String> {
        if self.lost > 0 {
            return Err(format!("{} deliveries lost", self.lost));
        }
        if self.received != self.deliveries {
            return Err(format!(
                "{} deliveries received of {}",
                self.received, self.deliveries
            ));
        }
        if self.longest_recovery_secs > self.recovery_bound_secs {
            return Err(format!(
                "a loss took {} s to recover (bound {} s)",
                self.longest_recovery_secs, self.recovery_bound_secs
            ));
        }
        if self.replayed == 0 || self.replayed != self.replay_app_events {
            return Err(format!(
                "the replay made {} deliveries for {} events of its app",
                self.replayed, self.replay_app_events
            ));
        }
        if self.replay_items_read > self.replay_app_events {
            return Err(format!(
                "the replay read {} event items for {} events of its app: other apps' too",
                self.replay_items_read, self.replay_app_events
            ));
        }
        if self.order_violations > 0 {
            return Err(format!(
                "{} of {} consecutive deliveries of a key went out of order",
                self.order_violations, self.ordered_pairs
            ));
        }
        let injected = self.first_messages_dropped + self.stream_records_dropped + self.purged;
        if injected == 0 {
            return Err("no loss was injected: the run proves nothing".into());
        }
        Ok(())
    }

    /// SCALE.md's table rows.
    pub fn table(&self, config: &Config) -> String {
        format!(
            "| figure | value |\n|---|---|\n\
             | load | {} events/s over {} apps (1 endpoint each) for {} intervals of {} s (`WEBHOOKS_RECONCILE_AFTER` {} s), then a drain |\n\
             | events, deliveries | {}, {} |\n\
             | injected losses | {} first messages dropped ({:.1} %), {} stream records given up ({:.0} % of batches), {} messages purged, a burst of {} events of {} KB |\n\
             | received, duplicates | {}, {} |\n\
             | **lost** | **{}** |\n\
             | longest loss to receipt | {} s (bound: {} s = `WEBHOOKS_RECONCILE_AFTER` + 2 intervals, twice that with ordering keys) |\n\
             | replay (one app, a new endpoint) | {} deliveries; read {} event items, for {} events of its app ({} in all) |\n\
             | reconciler runs, largest sweep lag | {}, {} s |\n\
             | simulated, wall clock, peak memory | {} s, {:.1} s, {:.0} MB (the whole process: store, queue and receiver included) |\n\
             | ordering keys per app; consecutive pairs checked, out of order | {}; {}, {} |\n",
            config.events_per_second,
            config.apps,
            config.intervals,
            config.interval_secs,
            config.reconcile_after_secs,
            self.events,
            self.deliveries,
            self.first_messages_dropped,
            config.first_message_loss * 100.0,
            self.stream_records_dropped,
            config.stream_batch_loss * 100.0,
            self.purged,
            config.burst_events,
            config.burst_bytes / 1024,
            self.received,
            self.duplicates,
            self.lost,
            self.longest_recovery_secs,
            self.recovery_bound_secs,
            self.replayed,
            self.replay_items_read,
            self.replay_app_events,
            self.events_then,
            self.reconciler_runs,
            self.max_sweep_lag_secs,
            self.simulated_secs,
            self.run_secs,
            self.peak_rss_mb,
            config.ordering_keys,
            self.ordered_pairs,
            self.order_violations,
        )
    }
}

/// The simulated clock (epoch milliseconds), read by deliver.
static SIM_MS: AtomicI64 = AtomicI64::new(0);

fn sim_now() -> DateTime<Utc> {
    Utc.timestamp_millis_opt(SIM_MS.load(Ordering::SeqCst))
        .single()
        .expect("the simulated clock is a valid time")
}

fn set_clock(at: DateTime<Utc>) {
    SIM_MS.store(at.timestamp_millis(), Ordering::SeqCst);
}

/// The receiver: records the first receipt of each `webhook-id` (simulated
/// time), counts repeats, and answers 503 to the first attempt of one
/// delivery in [`FAIL_ONE_IN`].
#[derive(Debug, Default)]
struct Receiver {
    first_seen: Mutex<HashMap<String, i64>>,
    failed_once: Mutex<HashSet<String>>,
    duplicates: AtomicU64,
    /// Requests in the order they came: each `webhook-id`'s first request
    /// and its first 2xx, by that number.
    requests: AtomicU64,
    first_request: Mutex<HashMap<String, u64>>,
    first_ok: Mutex<HashMap<String, u64>>,
}

const FAIL_ONE_IN: u64 = 20;

impl Sender for Receiver {
    async fn send(&self, request: OutgoingRequest<'_>) -> SendResult {
        let id = request
            .headers
            .get("webhook-id")
            .expect("deliver signs every request with a webhook-id")
            .to_owned();
        let number = self.requests.fetch_add(1, Ordering::SeqCst);
        lock(&self.first_request)
            .entry(id.clone())
            .or_insert(number);
        let fails = id.bytes().map(u64::from).sum::<u64>() % FAIL_ONE_IN == 0;
        if fails && lock(&self.failed_once).insert(id.clone()) {
            return SendResult {
                status: Some(503),
                latency: Duration::from_millis(5),
                ..SendResult::default()
            };
        }
        lock(&self.first_ok).entry(id.clone()).or_insert(number);
        match lock(&self.first_seen).entry(id) {
            std::collections::hash_map::Entry::Occupied(_) => {
                self.duplicates.fetch_add(1, Ordering::Relaxed);
            }
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(SIM_MS.load(Ordering::SeqCst));
            }
        }
        SendResult {
            status: Some(200),
            latency: Duration::from_millis(5),
            ..SendResult::default()
        }
    }
}

/// A queued message, visible from `visible_at` (simulated epoch ms).
struct Queued {
    visible_at: i64,
    message: DeliveryMessage,
}

/// One simulation at a time in a process: they share the simulated clock.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs one simulation.
pub async fn run(config: &Config) -> Figures {
    let _alone = ONE_AT_A_TIME.lock().await;
    let started = Instant::now();
    let settings = config.settings();
    let start = Utc
        .with_ymd_and_hms(2026, 12, 7, 0, 0, 0)
        .single()
        .expect("a valid start");
    set_clock(start);
    let deliverer = Deliverer::new(
        MemoryStore::default(),
        MemoryQueue::default(),
        Receiver::default(),
        settings.clone(),
    )
    .with_clock(sim_now);
    let (store, queue) = (&deliverer.store, &deliverer.queue);
    store.record_stream();
    let apps: Vec<String> = (0..config.apps.max(1))
        .map(|n| format!("sim-{n}"))
        .collect();
    let endpoint_of = |app: &str, at| {
        Endpoint::new(
            EndpointId::generate(),
            AppId::parse(app).expect("a valid app id"),
            "https://receiver.example/hook",
            Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("a valid secret"),
            at,
        )
    };
    for app in &apps {
        store
            .put_endpoint(
                &endpoint_of(app, start),
                hookline_pipeline::settings::MAX_ENDPOINTS_PER_APP_CEILING,
            )
            .await
            .expect("the in-memory store takes the endpoint");
    }

    let mut rng = StdRng::seed_from_u64(config.seed);
    let mut figures = Figures {
        // With ordering keys, a lost delivery once re-queued may wait for
        // its predecessor, itself lost and re-queued within the same bound.
        recovery_bound_secs: (config.reconcile_after_secs + 2 * config.interval_secs)
            * if config.ordering_keys > 0 { 2 } else { 1 },
        ..Figures::default()
    };
    // Deliveries lost, with when they were last lost (simulated epoch ms):
    // a re-queued attempt can be lost again (say its retry is purged), and
    // each loss is measured to the receipt that recovered it.
    let mut lost_at: HashMap<DeliveryId, i64> = HashMap::new();
    let mut accepted: Vec<DeliveryId> = Vec::new();
    // With ordering keys: each (app, key, endpoint)'s deliveries in order.
    let mut chains: HashMap<(String, u32, EndpointId), Vec<DeliveryId>> = HashMap::new();
    let mut queued: BTreeMap<(i64, u64), Queued> = BTreeMap::new();
    let mut sequence = 0u64;
    let load_secs = i64::from(config.intervals) * config.interval_secs;
    // With ordering keys a loss holds back the rest of its key until it is
    // recovered: the drain is longer (see `Figures::check`).
    let drain_intervals = if config.ordering_keys > 0 { 10 } else { 3 };
    let total_secs =
        load_secs + config.reconcile_after_secs + drain_intervals * config.interval_secs;
    let purge_at = load_secs / 2 + 7;
    let burst_at = load_secs / 3;
    let replay_at = load_secs * 2 / 3 + 3;
    let small = br#"{"event_type":"order.paid","payload":{"order":{"id":42,"total":"19.99"}}}"#;
    let big = format!(
        r#"{{"event_type":"order.paid","payload":{{"pad":"{}"}}}}"#,
        "x".repeat(config.burst_bytes)
    );
    let budget = Duration::from_secs(105);

    for second in 0..total_secs {
        let now = start + chrono::TimeDelta::seconds(second);
        set_clock(now);
        let now_ms = now.timestamp_millis();

        // Producers.
        if second < load_secs {
            let count = if second == burst_at {
                config.burst_events
            } else {
                config.events_per_second
            };
            for i in 0..count {
                let at = now
                    + chrono::TimeDelta::microseconds(i64::from(i) * 1_000_000 / i64::from(count));
                let body: &[u8] = if second == burst_at {
                    big.as_bytes()
                } else {
                    small
                };
                let app = &apps[(figures.events % apps.len() as u64) as usize];
                let key = (config.ordering_keys > 0).then(|| {
                    u32::try_from(
                        figures.events / apps.len() as u64 % u64::from(config.ordering_keys),
                    )
                    .expect("a key number under ordering_keys")
                });
                let keyed;
                let body = match key {
                    Some(k) => {
                        keyed = with_ordering_key(body, k);
                        keyed.as_slice()
                    }
                    None => body,
                };
                let answer = ingest(store, &settings, &Unchecked, app, None, body, at, &mut rng)
                    .await
                    .expect("the in-memory store accepts every event");
                let value: serde_json::Value =
                    serde_json::from_str(&answer.body).expect("a 202 body is JSON");
                let ids: Vec<DeliveryId> = value["delivery_ids"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|id| {
                        DeliveryId::parse(id.as_str().unwrap_or_default())
                            .expect("a valid delivery id")
                    })
                    .collect();
                if let Some(k) = key {
                    chain_deliveries(store, app, k, &ids, &mut chains).await;
                }
                accepted.extend(ids);
                figures.events += 1;
            }
        }

        if second == replay_at {
            replay_to_a_new_endpoint(
                store,
                &apps[0],
                &endpoint_of,
                now,
                &mut accepted,
                &mut figures,
            )
            .await;
        }

        // The stream, to dispatch in batches of 100; some given up.
        let mut stream = store.take_stream();
        while !stream.is_empty() {
            let rest = stream.split_off(stream.len().min(100));
            let batch = std::mem::replace(&mut stream, rest);
            dispatch_batch(
                store,
                queue,
                batch,
                config,
                &mut rng,
                now,
                &mut lost_at,
                &mut figures,
            )
            .await;
        }

        // What was sent enters the queue; some first messages never arrive.
        let sent = std::mem::take(&mut *lock(&queue.sent));
        for (message, delay) in sent {
            if message.attempt == 1
                && message.version.unwrap_or(0) == 0
                && rng.gen_bool(config.first_message_loss)
            {
                figures.first_messages_dropped += 1;
                lost_at.insert(message.delivery_id.clone(), now_ms);
                continue;
            }
            sequence += 1;
            let visible_at = now_ms + i64::from(delay) * 1000;
            queued.insert(
                (visible_at, sequence),
                Queued {
                    visible_at,
                    message,
                },
            );
        }
        if second == purge_at {
            figures.purged += queued.len() as u64;
            for (_, q) in std::mem::take(&mut queued) {
                lost_at.insert(q.message.delivery_id, now_ms);
            }
        }

        // Deliver: every visible message, in batches of 10 at once; a
        // failed one is visible again after the visibility timeout.
        let due: Vec<Queued> = {
            let later = queued.split_off(&(now_ms + 1, 0));
            std::mem::replace(&mut queued, later)
                .into_values()
                .collect()
        };
        for chunk in due.chunks(10) {
            let outcomes =
                futures::future::join_all(chunk.iter().map(|q| deliverer.handle(&q.message))).await;
            for (q, outcome) in chunk.iter().zip(outcomes) {
                if outcome.is_err() {
                    sequence += 1;
                    let again = q.visible_at.max(now_ms) + 30_000;
                    queued.insert(
                        (again, sequence),
                        Queued {
                            visible_at: again,
                            message: q.message.clone(),
                        },
                    );
                }
            }
        }
        deliverer.flush_gathered().await;

        // The reconciler, and TTL.
        if second > 0 && second % config.interval_secs == 0 {
            let report = reconcile(store, queue, &settings, now, budget)
                .await
                .expect("a reconciler run on the in-memory store");
            figures.reconciler_runs += 1;
            figures.max_sweep_lag_secs = figures.max_sweep_lag_secs.max(report.sweep_lag_seconds);
            store
                .expire_finished_before(now - chrono::TimeDelta::seconds(3 * config.interval_secs));
        }
    }

    let receiver = &deliverer.sender;
    let seen = lock(&receiver.first_seen);
    figures.deliveries = accepted.len() as u64;
    let webhook_id = |id: &DeliveryId| MessageId::for_delivery(id).to_string();
    figures.received = accepted
        .iter()
        .filter(|id| seen.contains_key(&webhook_id(id)))
        .count() as u64;
    figures.lost = figures.deliveries - figures.received;
    figures.duplicates = receiver.duplicates.load(Ordering::Relaxed);
    figures.longest_recovery_secs = lost_at
        .iter()
        .filter_map(|(id, at)| seen.get(&webhook_id(id)).map(|got| (got - at) / 1000))
        .max()
        .unwrap_or(0);
    let (first_request, first_ok) = (lock(&receiver.first_request), lock(&receiver.first_ok));
    for chain in chains.values() {
        for pair in chain.windows(2) {
            figures.ordered_pairs += 1;
            let ended = first_ok.get(&webhook_id(&pair[0]));
            let began = first_request.get(&webhook_id(&pair[1]));
            if let (Some(ended), Some(began)) = (ended, began) {
                if began < ended {
                    figures.order_violations += 1;
                }
            }
        }
    }
    figures.simulated_secs = total_secs;
    figures.run_secs = started.elapsed().as_secs_f64();
    figures.peak_rss_mb = peak_rss_mb();
    let pending = store
        .delivery_items()
        .iter()
        .filter(|d| d.status == DeliveryStatus::Pending)
        .count();
    debug_assert!(pending == 0 || figures.lost > 0, "{pending} still pending");
    figures
}

/// `body` (an event request) with `"ordering_key": "key-<k>"`.
fn with_ordering_key(body: &[u8], k: u32) -> Vec<u8> {
    let mut request: serde_json::Value =
        serde_json::from_slice(body).expect("the simulation's bodies are JSON");
    request["ordering_key"] = serde_json::Value::String(format!("key-{k}"));
    serde_json::to_vec(&request).expect("a JSON value serializes")
}

/// Appends a keyed event's deliveries (`ids`, of its listed fan-out) to
/// their key's chain to each endpoint.
async fn chain_deliveries(
    store: &MemoryStore,
    app: &str,
    key: u32,
    ids: &[DeliveryId],
    chains: &mut HashMap<(String, u32, EndpointId), Vec<DeliveryId>>,
) {
    let app_id = AppId::parse(app).expect("a valid app id");
    for id in ids {
        let (event, position) = id.fanout_origin().expect("a listed fan-out's id");
        let stored = store
            .get_event(&app_id, &event)
            .await
            .expect("an in-memory read")
            .expect("the event just accepted");
        let endpoint = stored.targets[position].clone();
        chains
            .entry((app.to_owned(), key, endpoint))
            .or_default()
            .push(id.clone());
    }
}

/// Gives `app` a new endpoint and replays every event it had to it (the
/// deliveries it writes join `accepted`): the replay's reads are counted.
async fn replay_to_a_new_endpoint(
    store: &MemoryStore,
    app: &str,
    endpoint_of: &impl Fn(&str, DateTime<Utc>) -> Endpoint,
    now: DateTime<Utc>,
    accepted: &mut Vec<DeliveryId>,
    figures: &mut Figures,
) {
    let endpoint = endpoint_of(app, now);
    store
        .put_endpoint(
            &endpoint,
            hookline_pipeline::settings::MAX_ENDPOINTS_PER_APP_CEILING,
        )
        .await
        .expect("the in-memory store takes the endpoint");
    let theirs: Vec<_> = store
        .events()
        .into_iter()
        .filter(|e| e.event.app_id == endpoint.app_id && e.event.created_at < now)
        .map(|e| e.event.id)
        .collect();
    let read_before = store.event_items_read();
    let request = ReplayRequest {
        since: now - chrono::TimeDelta::days(1),
        until: Some(now),
    };
    let mut rng = StdRng::seed_from_u64(7);
    // The clock stands still: the replay runs to its end inline.
    let replay = start_replay(
        store,
        &endpoint,
        &request,
        || now,
        Duration::from_secs(5),
        Duration::from_secs(30 * 86_400),
        &mut rng,
    )
    .await
    .expect("a replay on the in-memory store");
    figures.replay_items_read = store.event_items_read() - read_before;
    figures.replayed = replay.replayed;
    figures.replay_app_events = theirs.len() as u64;
    figures.events_then = figures.events;
    accepted.extend(
        theirs
            .iter()
            .map(|event| DeliveryId::for_event_endpoint(event, &endpoint.id)),
    );
}

/// Hands one stream batch to dispatch, or gives it up (its pending
/// deliveries lost).
#[allow(clippy::too_many_arguments)]
async fn dispatch_batch(
    store: &MemoryStore,
    queue: &MemoryQueue,
    records: Vec<RecordChange>,
    config: &Config,
    rng: &mut StdRng,
    now: DateTime<Utc>,
    lost_at: &mut HashMap<DeliveryId, i64>,
    figures: &mut Figures,
) {
    if rng.gen_bool(config.stream_batch_loss) {
        figures.stream_records_dropped += records.len() as u64;
        for record in &records {
            let ids: Vec<DeliveryId> = match &record.change {
                Ok(StreamChange::PendingDelivery(d)) => vec![d.id.clone()],
                Ok(StreamChange::ListedFanout(e)) if record.insert => {
                    e.listed_deliveries().into_iter().map(|d| d.id).collect()
                }
                _ => Vec::new(),
            };
            for id in ids {
                lost_at.insert(id, now.timestamp_millis());
            }
        }
        return;
    }
    // A batch dispatch fails part of is retried whole, as Lambda does.
    for _ in 0..3 {
        let retry: Vec<RecordChange> = records
            .iter()
            .map(|r| RecordChange {
                sequence: r.sequence.clone(),
                insert: r.insert,
                written_at: r.written_at,
                change: match &r.change {
                    Ok(change) => Ok(change.clone()),
                    Err(err) => Err(hookline_pipeline::PipelineError::Corrupt(err.to_string())),
                },
            })
            .collect();
        let late_after = hookline_pipeline::dispatch::late_after(std::time::Duration::from_secs(
            u64::try_from(config.reconcile_after_secs).unwrap_or(0),
        ));
        if dispatch_changes(store, queue, retry, late_after, now)
            .await
            .is_none()
        {
            return;
        }
    }
}

/// The process's peak resident memory (Linux `VmHWM`), in MB; 0 elsewhere.
pub fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The quick run, on every `cargo test`: nothing lost, every loss
    /// recovered within the bound.
    #[tokio::test]
    async fn the_quick_simulation_loses_nothing_and_recovers_in_time() {
        let config = Config::quick();
        let figures = run(&config).await;
        figures
            .check()
            .unwrap_or_else(|e| panic!("{e}\n{}", figures.table(&config)));
        hookline_pipeline::fakes::record_figure(
            "scale",
            &format!(
                "scale simulation (quick, in-memory): {} events, {} deliveries, {} lost; injected {} first messages, {} stream records, {} purged; longest loss to receipt {} s (bound {} s)",
                figures.events,
                figures.deliveries,
                figures.lost,
                figures.first_messages_dropped,
                figures.stream_records_dropped,
                figures.purged,
                figures.longest_recovery_secs,
                figures.recovery_bound_secs
            ),
        );
    }

    /// The quick run with ordering keys: the same losses, nothing lost,
    /// and each key's deliveries to each endpoint in the order accepted
    /// (a later one's first request after the earlier one's 2xx).
    #[tokio::test]
    async fn the_quick_simulation_with_ordering_keys_keeps_each_keys_order() {
        let config = Config::quick_ordered();
        let figures = run(&config).await;
        figures
            .check()
            .unwrap_or_else(|e| panic!("{e}\n{}", figures.table(&config)));
        assert!(figures.ordered_pairs > 1_000, "{}", figures.ordered_pairs);
        hookline_pipeline::fakes::record_figure(
            "scale",
            &format!(
                "scale simulation with ordering keys (quick, in-memory): {} events on {} keys, {} lost, {} consecutive pairs of a key checked, {} out of order; injected {} first messages, {} stream records, {} purged; longest loss to receipt {} s (bound {} s: a key's delivery may wait for its predecessor's recovery)",
                figures.events,
                config.ordering_keys * config.apps,
                figures.lost,
                figures.ordered_pairs,
                figures.order_violations,
                figures.first_messages_dropped,
                figures.stream_records_dropped,
                figures.purged,
                figures.longest_recovery_secs,
                figures.recovery_bound_secs,
            ),
        );
    }
}
