//! Ordering per key against unkeyed traffic, same run: the pipeline's use
//! cases (ingest, dispatch on the store's stream, deliver) over the
//! in-memory store and queue with an instant receiver, so our code is
//! measured, not moto. Events arrive in waves of one per key (1,000 keys),
//! each wave followed by one pass of the pipeline (the stream to dispatch,
//! every queued message to deliver, due or not); then passes until every
//! delivery is made. Baseline: as many unkeyed events, in the same waves.

use chrono::Utc;
use hookline_core::ids::{AppId, EndpointId};
use hookline_core::model::Endpoint;
use hookline_core::signing::Secret;
use hookline_pipeline::deliver::Deliverer;
use hookline_pipeline::fakes::{MemoryQueue, MemoryStore, ScriptedSender};
use hookline_pipeline::ingest::{ingest, Unchecked};
use hookline_pipeline::ports::Store;
use hookline_pipeline::Settings;
use rand::SeedableRng;
use serde::Serialize;

use crate::throughput::thread_cpu;

/// One run's figures.
#[derive(Debug, Clone, Serialize)]
pub struct OrderingRun {
    pub keys: Option<usize>,
    pub fail_share: f64,
    pub deliveries: usize,
    /// Pipeline passes after the last wave until every delivery was made.
    pub drain_passes: usize,
    /// CPU of the whole run (this thread: ingest, dispatch, deliver).
    pub cpu_per_delivery_us: f64,
    /// Messages deliver handled per delivery (1: each went at once).
    pub messages_per_delivery: f64,
}

/// `waves` waves of `width` events (one per key when `keyed`); the
/// receiver answers 503 to a random `fail_share` of requests (seeded: the
/// same answers for both runs), 200 to the others.
pub async fn run(
    width: usize,
    waves: usize,
    keyed: bool,
    fail_share: f64,
) -> Result<OrderingRun, String> {
    let settings = Settings::for_tests(&[(
        "WEBHOOKS_RETRY_SCHEDULE",
        "1s,1s,1s,1s,1s,1s,1s,1s,1s,1s,1s,1s,1s,1s,1s",
    )])
    .map_err(|e| e.to_string())?;
    let answers = script(width * waves * 3, fail_share);
    let deliverer = Deliverer::new(
        MemoryStore::default(),
        MemoryQueue::default(),
        ScriptedSender::new(answers.clone(), ScriptedSender::status(200)),
        settings.clone(),
    );
    let store = &deliverer.store;
    store.record_stream();
    let app = AppId::parse("bench").map_err(|e| e.to_string())?;
    let endpoint = Endpoint::new(
        EndpointId::generate(),
        app.clone(),
        "https://receiver.example/hook",
        Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").map_err(|e| e.to_string())?,
        Utc::now(),
    );
    store
        .put_endpoint(
            &endpoint,
            hookline_pipeline::settings::MAX_ENDPOINTS_PER_APP_CEILING,
        )
        .await
        .map_err(|e| e.to_string())?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(36);
    let expected = width * waves;
    let mut handled = 0usize;
    let started = thread_cpu();
    for wave in 0..waves {
        for i in 0..width {
            let body = if keyed {
                format!(
                    r#"{{"event_type":"order.paid","payload":{{"wave":{wave},"i":{i}}},"ordering_key":"order-{i}"}}"#
                )
            } else {
                format!(r#"{{"event_type":"order.paid","payload":{{"wave":{wave},"i":{i}}}}}"#)
            };
            ingest(
                store,
                &settings,
                &Unchecked,
                app.as_str(),
                None,
                body.as_bytes(),
                Utc::now(),
                &mut rng,
            )
            .await
            .map_err(|e| e.to_string())?;
        }
        handled += one_pass(&deliverer).await?;
    }
    let mut drain_passes = 0;
    while delivered(&deliverer, &answers) < expected {
        drain_passes += 1;
        if drain_passes > 10 * waves + 100 {
            return Err(format!(
                "not drained: {} of {expected} delivered",
                delivered(&deliverer, &answers)
            ));
        }
        handled += one_pass(&deliverer).await?;
    }
    let cpu = thread_cpu().saturating_sub(started);
    Ok(OrderingRun {
        keys: keyed.then_some(width),
        fail_share,
        deliveries: expected,
        drain_passes,
        cpu_per_delivery_us: cpu.as_secs_f64() * 1e6 / expected as f64,
        messages_per_delivery: handled as f64 / expected as f64,
    })
}

/// The run of median CPU per delivery.
fn median(mut runs: Vec<OrderingRun>) -> OrderingRun {
    runs.sort_by(|a, b| a.cpu_per_delivery_us.total_cmp(&b.cpu_per_delivery_us));
    runs.swap_remove(runs.len() / 2)
}

/// `len` answers, a seeded random `fail_share` of them 503.
fn script(len: usize, fail_share: f64) -> Vec<hookline_pipeline::ports::SendResult> {
    use rand::Rng;
    let mut rng = rand::rngs::StdRng::seed_from_u64(30);
    (0..len)
        .map(|_| ScriptedSender::status(if rng.gen_bool(fail_share) { 503 } else { 200 }))
        .collect()
}

type Bench = Deliverer<MemoryStore, MemoryQueue, ScriptedSender>;

/// Deliveries the receiver answered 200 (distinct `webhook-id`s; request
/// `i` got `answers[i]`, then 200s).
fn delivered(deliverer: &Bench, answers: &[hookline_pipeline::ports::SendResult]) -> usize {
    let requests = deliverer
        .sender
        .requests
        .lock()
        .expect("the receiver's log is never poisoned");
    requests
        .iter()
        .enumerate()
        .filter(|(i, _)| answers.get(*i).is_none_or(|a| a.status == Some(200)))
        .filter_map(|(_, (_, headers, _))| {
            headers
                .iter()
                .find(|(k, _)| k == "webhook-id")
                .map(|(_, v)| v.as_str())
        })
        .collect::<std::collections::HashSet<_>>()
        .len()
}

/// One pass: the stream to dispatch, then every queued message to deliver
/// (due or not: a pass is a step of time). The messages handled.
async fn one_pass(deliverer: &Bench) -> Result<usize, String> {
    let (store, queue) = (&deliverer.store, &deliverer.queue);
    let records = store.take_stream();
    let now = Utc::now();
    if hookline_pipeline::dispatch::dispatch_changes(
        store,
        queue,
        records,
        chrono::TimeDelta::hours(1),
        now,
    )
    .await
    .is_some()
    {
        return Err("dispatch failed a record".to_owned());
    }
    let messages = std::mem::take(&mut *queue.sent.lock().map_err(|e| e.to_string())?);
    let count = messages.len();
    for (mut message, _) in messages {
        message.not_before = now;
        deliverer
            .handle(&message)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(count)
}

/// The section: 1,000 keys against unkeyed traffic, `waves` events per
/// key, with every first answer a 2xx and with 30 % of answers a 503.
pub async fn section(waves: usize) -> Result<(String, serde_json::Value), String> {
    let width = 1_000;
    // A warm-up run: the first run of a process pays its allocations.
    run(width / 10, 2, true, 0.3).await?;
    let mut rows = String::new();
    let mut raw = Vec::new();
    let mut verdicts = Vec::new();
    for (label, share) in [("all succeed", 0.0), ("30 % of answers 503", 0.3)] {
        // Interleaved, 3 runs each: the median run by CPU (a run slowed by
        // another process on this shared machine does not move it).
        let (mut unkeyed_runs, mut keyed_runs) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            unkeyed_runs.push(run(width, waves, false, share).await?);
            keyed_runs.push(run(width, waves, true, share).await?);
        }
        let (unkeyed, keyed) = (median(unkeyed_runs), median(keyed_runs));
        rows.push_str(&format!(
            "| {label} | unkeyed (baseline) | {} | {:.1} µs | {:.2} | {} |\n| {label} | {width} keys | {} | {:.1} µs ({:.2}x) | {:.2} | {} |\n",
            unkeyed.deliveries,
            unkeyed.cpu_per_delivery_us,
            unkeyed.messages_per_delivery,
            unkeyed.drain_passes,
            keyed.deliveries,
            keyed.cpu_per_delivery_us,
            keyed.cpu_per_delivery_us / unkeyed.cpu_per_delivery_us,
            keyed.messages_per_delivery,
            keyed.drain_passes,
        ));
        verdicts.push(format!(
            "{label}: {width} keys drained {} passes after the last wave against {} unkeyed, at {:.2}x the CPU per delivery",
            keyed.drain_passes,
            unkeyed.drain_passes,
            keyed.cpu_per_delivery_us / unkeyed.cpu_per_delivery_us
        ));
        raw.push(serde_json::json!({"label": label, "unkeyed": unkeyed, "keyed": keyed}));
    }
    let md = format!(
        "\n### Ordered keys against unkeyed traffic\n\nThe pipeline's use cases (ingest, dispatch on the store's stream, deliver) over the in-memory store and queue (`infra/bench/src/ordering.rs`): {waves} waves of {width} events, each wave one event per key over {width} keys, each followed by one pass of the pipeline (the stream to dispatch, every queued message to deliver, due or not: a pass is a step of time); then passes until every delivery is made. The receiver answers at once, 200, or 503 to a seeded random 30 % of requests (the same answers in both runs of a row pair). Baseline: as many events without a key, same waves, same run. Each figure is the median of 3 runs, the two kinds interleaved. A key holds one delivery in flight, never its endpoint: a key whose delivery retries holds back only its own next events.\n\n| receiver | traffic | deliveries | CPU per delivery | messages per delivery | passes to drain after the last wave |\n|---|---|---|---|---|---|\n{rows}\nVerdict: {}.\n",
        verdicts.join("; ")
    );
    Ok((md, serde_json::Value::Array(raw)))
}
