//! Deliver throughput per instance: one deliver invocation (`handle_batch`)
//! over a batch of 10 messages, real HTTP to a loopback receiver that answers
//! after 100 ms, in-memory store and queue (our code, not moto, is measured).
//! Baseline: the same code with concurrency 1 (the seed's serial loop).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::post;
use axum::Router;
use chrono::Utc;
use hookline_core::ids::{AppId, DeliveryId, EndpointId, EventId};
use hookline_core::model::{Delivery, Endpoint, Event, EventType};
use hookline_core::signing::Secret;
use hookline_pipeline::deliver::Deliverer;
use hookline_pipeline::dispatch::message_for;
use hookline_pipeline::fakes::{MemoryQueue, MemoryStore};
use hookline_pipeline::ports::{Store, StoredEvent};
use hookline_pipeline::sender::HttpSender;
use hookline_pipeline::Settings;
use rand::SeedableRng;
use serde::Serialize;

/// CPU time of the calling thread (ns on CPU, from the scheduler's
/// `/proc/thread-self/schedstat`).
pub fn thread_cpu() -> Duration {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(Duration::ZERO, Duration::from_nanos)
}

/// A receiver that answers 200 after `delay`, on its own thread and runtime
/// (so its CPU time is not the deliverer's).
pub fn slow_receiver(delay: Duration) -> Result<String, String> {
    counting_receiver(delay).map(|(url, _)| url)
}

/// [`slow_receiver`], with the count of the requests it has answered.
pub fn counting_receiver(
    delay: Duration,
) -> Result<(String, std::sync::Arc<std::sync::atomic::AtomicU64>), String> {
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = answered.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async move {
            let app = Router::new().route(
                "/hook",
                post(move || {
                    let counter = counter.clone();
                    async move {
                        tokio::time::sleep(delay).await;
                        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        "ok"
                    }
                }),
            );
            let Ok(listener) = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await else {
                return;
            };
            let _ = tx.send(listener.local_addr().map(|a| format!("http://{a}/hook")));
            let _ = axum::serve(listener, app).await;
        });
    });
    let url = rx
        .recv_timeout(Duration::from_secs(10))
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    Ok((url, answered))
}

/// One measured batch.
#[derive(Debug, Clone, Serialize)]
pub struct BatchRun {
    pub concurrency: usize,
    pub wall_ms: f64,
    pub cpu_ms: f64,
}

async fn one_batch(url: &str, concurrency: usize, batch: usize) -> Result<BatchRun, String> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let now = Utc::now();
    let store = MemoryStore::default();
    let app = AppId::parse("bench").map_err(|e| e.to_string())?;
    let endpoint = Endpoint::new(
        EndpointId::new(now, &mut rng),
        app.clone(),
        url.to_owned(),
        Secret::generate(&mut rng),
        now,
    );
    store
        .put_endpoint(
            &endpoint,
            hookline_pipeline::settings::MAX_ENDPOINTS_PER_APP_CEILING,
        )
        .await
        .map_err(|e| e.to_string())?;
    let payload = serde_json::value::to_raw_value(&serde_json::json!({"order": {"id": "ord_123", "total": 1999, "items": [1, 2, 3]}, "pad": "x".repeat(800)}))
        .map_err(|e| e.to_string())?;
    let mut bodies = Vec::new();
    for _ in 0..batch {
        let event = Event::new(
            EventId::new(now, &mut rng),
            app.clone(),
            EventType::parse("order.paid").map_err(|e| e.to_string())?,
            &payload,
            now,
        );
        let delivery = Delivery::new(
            DeliveryId::for_event_endpoint(&event.id, &endpoint.id),
            &event,
            endpoint.id.clone(),
            now,
        );
        store.insert_event(StoredEvent {
            targets: vec![],
            event,
            fanout_remaining: vec![],
            fanout_version: 0,
        });
        let (message, _) = message_for(&delivery, now).ok_or("delivery not pending")?;
        bodies.push(message.to_json());
        store.insert_delivery(delivery);
    }
    let concurrency_var = concurrency.to_string();
    let settings = Settings::for_tests(&[
        ("WEBHOOKS_ALLOW_PRIVATE_ENDPOINTS", "true"),
        ("WEBHOOKS_DELIVER_CONCURRENCY", &concurrency_var),
        // A serial run needs a function timeout for 10 rounds of POSTs.
        ("WEBHOOKS_DELIVER_FUNCTION_TIMEOUT", "160s"),
    ])
    .map_err(|e| e.to_string())?;
    let sender = HttpSender::new(true).map_err(|e| e.to_string())?;
    let deliverer = Deliverer::new(store, MemoryQueue::default(), sender, settings);
    let refs: Vec<&str> = bodies.iter().map(String::as_str).collect();
    let cpu0 = thread_cpu();
    let t0 = Instant::now();
    let failed = deliverer.handle_batch(&refs).await;
    let wall = t0.elapsed();
    let cpu = thread_cpu().saturating_sub(cpu0);
    if !failed.is_empty() {
        return Err(format!("{} messages failed", failed.len()));
    }
    Ok(BatchRun {
        concurrency,
        wall_ms: wall.as_secs_f64() * 1000.0,
        cpu_ms: cpu.as_secs_f64() * 1000.0,
    })
}

/// Results of the throughput benchmark.
#[derive(Debug, Clone, Serialize)]
pub struct Throughput {
    pub batch: usize,
    pub receiver_delay_ms: u64,
    pub repeats: usize,
    pub concurrent: Vec<BatchRun>,
    pub serial: Vec<BatchRun>,
}

/// Runs `repeats` batches each way on a current-thread runtime in this
/// thread (so the thread's CPU time is the deliverer's alone).
pub fn run(repeats: usize) -> Result<Throughput, String> {
    let delay = Duration::from_millis(100);
    let url = slow_receiver(delay)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let url = Arc::new(url);
    rt.block_on(async move {
        // Warm-up: connection pool, TLS-free loopback, allocator.
        one_batch(&url, 10, 10).await?;
        let mut concurrent = Vec::new();
        let mut serial = Vec::new();
        for _ in 0..repeats {
            concurrent.push(one_batch(&url, 10, 10).await?);
            serial.push(one_batch(&url, 1, 10).await?);
        }
        Ok(Throughput {
            batch: 10,
            receiver_delay_ms: delay.as_millis() as u64,
            repeats,
            concurrent,
            serial,
        })
    })
}
