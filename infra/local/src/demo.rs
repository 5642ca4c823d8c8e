//! The demo: three receivers (healthy, flaky, dead) built on the receiver kit
//! (`hookline-verify`: signature check + process-once by `webhook-id`), events
//! sent through the local HTTP API, each delivery's lifecycle shown live, the
//! DLQ redriven after the dead endpoint is fixed, and a summary table.

use hookline_core::sync::lock;
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use hookline_verify::{MemorySeenStore, Receiver, Verifier};
use serde_json::{json, Value};

/// How a demo receiver behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    Healthy,
    /// Fails the first two requests of each message, then succeeds.
    Flaky,
    /// Fails every request until fixed.
    Dead,
}

#[derive(Debug)]
struct ReceiverState {
    kit: Mutex<Option<Arc<Receiver<MemorySeenStore>>>>,
    fixed: AtomicBool,
    attempts_per_id: Mutex<BTreeMap<String, usize>>,
    requests: AtomicUsize,
    bad_signatures: AtomicUsize,
    processed: AtomicUsize,
    duplicates: AtomicUsize,
}

/// A running demo receiver.
#[derive(Debug)]
pub struct DemoReceiver {
    pub name: &'static str,
    pub behaviour: Behaviour,
    pub url: String,
    state: Arc<ReceiverState>,
}

async fn receive(
    State((behaviour, state)): State<(Behaviour, Arc<ReceiverState>)>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    state.requests.fetch_add(1, Ordering::SeqCst);
    let Some(kit) = lock(&state.kit).clone() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "no secret yet".into());
    };
    // The receiver kit: verify, process once per webhook-id, 2xx only after
    // the processing succeeded, 5xx (not marked) when it failed.
    let reply = kit
        .handle(&headers, &body, |verified| {
            let state = state.clone();
            async move {
                let id = verified.message_id.unwrap_or_default();
                let n = {
                    let mut map = lock(&state.attempts_per_id);
                    let n = map.entry(id).or_insert(0);
                    *n += 1;
                    *n
                };
                let fail = match behaviour {
                    Behaviour::Healthy => false,
                    Behaviour::Flaky => n <= 2,
                    Behaviour::Dead => !state.fixed.load(Ordering::SeqCst),
                };
                if fail {
                    return Err("the demo's processing failed");
                }
                state.processed.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        })
        .await;
    if reply.status == 401 {
        state.bad_signatures.fetch_add(1, Ordering::SeqCst);
    }
    if reply.message == "already processed" {
        state.duplicates.fetch_add(1, Ordering::SeqCst);
    }
    (
        StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        reply.message,
    )
}

impl DemoReceiver {
    pub async fn start(name: &'static str, behaviour: Behaviour) -> std::io::Result<Self> {
        let state = Arc::new(ReceiverState {
            kit: Mutex::new(None),
            fixed: AtomicBool::new(false),
            attempts_per_id: Mutex::new(BTreeMap::new()),
            requests: AtomicUsize::new(0),
            bad_signatures: AtomicUsize::new(0),
            processed: AtomicUsize::new(0),
            duplicates: AtomicUsize::new(0),
        });
        let app = axum::Router::new()
            .fallback(receive)
            .with_state((behaviour, state.clone()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self {
            name,
            behaviour,
            url: format!("http://{addr}/webhooks/{name}"),
            state,
        })
    }

    /// Arms the receiver kit with the endpoint's secret.
    pub fn set_secret(&self, secret: &str) -> Result<(), hookline_verify::VerifyError> {
        let kit = Receiver::new(Verifier::new(secret)?, MemorySeenStore::new());
        *lock(&self.state.kit) = Some(Arc::new(kit));
        Ok(())
    }

    pub fn fix(&self) {
        self.state.fixed.store(true, Ordering::SeqCst);
    }
}

fn out(line: &str) {
    let _ = writeln!(std::io::stdout(), "{line}");
}

/// The demo's outcome: whether every delivery is accounted for (delivered).
pub async fn run(
    api: &str,
    admin_key: &str,
    events: usize,
    timeout: Duration,
) -> Result<bool, Box<dyn std::error::Error>> {
    let http = reqwest::Client::new();
    let auth = format!("Bearer {admin_key}");
    let call = |method: reqwest::Method, path: String, body: Option<Value>| {
        let mut req = http
            .request(method, format!("{api}{path}"))
            .header("authorization", auth.clone());
        if let Some(b) = body {
            req = req.json(&b);
        }
        async move {
            let resp = req.send().await?;
            let status = resp.status().as_u16();
            let json: Value = resp.json().await.unwrap_or(Value::Null);
            Ok::<_, reqwest::Error>((status, json))
        }
    };

    let receivers = [
        DemoReceiver::start("healthy", Behaviour::Healthy).await?,
        DemoReceiver::start("flaky", Behaviour::Flaky).await?,
        DemoReceiver::start("dead", Behaviour::Dead).await?,
    ];
    let mut endpoint_names = BTreeMap::new();
    for r in &receivers {
        let (status, body) = call(
            reqwest::Method::POST,
            "/v1/apps/demo/endpoints".into(),
            Some(json!({"url": r.url, "description": format!("demo {} receiver", r.name)})),
        )
        .await?;
        if status != 201 {
            return Err(
                format!("creating the {} endpoint answered {status}: {body}", r.name).into(),
            );
        }
        r.set_secret(body["secret"].as_str().unwrap_or_default())?;
        endpoint_names.insert(body["id"].as_str().unwrap_or_default().to_owned(), r.name);
        out(&format!(
            "endpoint {:<8} {} -> {}",
            r.name,
            body["id"].as_str().unwrap_or_default(),
            r.url
        ));
    }
    let mut deliveries: Vec<String> = Vec::new();
    for i in 0..events {
        let (status, body) = call(
            reqwest::Method::POST,
            "/v1/apps/demo/events".into(),
            Some(json!({"event_type": "order.paid", "payload": {"order_id": format!("ord_{i:04}"), "amount_cents": 1000 + i}})),
        )
        .await?;
        if status != 202 {
            return Err(format!("sending event {i} answered {status}: {body}").into());
        }
        for id in body["delivery_ids"].as_array().into_iter().flatten() {
            deliveries.push(id.as_str().unwrap_or_default().to_owned());
        }
    }
    out(&format!(
        "sent {events} events -> {} deliveries (3 endpoints each)",
        deliveries.len()
    ));

    let started = Instant::now();
    let mut redriven = false;
    let mut last_line = String::new();
    let mut views: BTreeMap<String, Value> = BTreeMap::new();
    loop {
        for id in &deliveries {
            let (_, view) = call(
                reqwest::Method::GET,
                format!("/v1/apps/demo/deliveries/{id}"),
                None,
            )
            .await?;
            views.insert(id.clone(), view);
        }
        let count = |s: &str| views.values().filter(|v| v["status"] == s).count();
        let (pending, delivered, failed) = (count("pending"), count("delivered"), count("failed"));
        let attempts: u64 = views
            .values()
            .map(|v| v["total_attempts"].as_u64().unwrap_or(0))
            .sum();
        let line = format!(
            "t={:>3}s  pending {pending:>3}  delivered {delivered:>3}  failed {failed:>3}  attempts {attempts:>3}{}",
            started.elapsed().as_secs(),
            if redriven { "  (after redrive)" } else { "" }
        );
        if line != last_line {
            out(&line);
            last_line = line;
        }
        if delivered == deliveries.len() {
            break;
        }
        if pending == 0 && failed > 0 && !redriven {
            out("dead endpoint exhausted its attempts -> its deliveries are failed and in the DLQ");
            out("fixing the dead endpoint, then POST /v1/dlq/redrive");
            receivers[2].fix();
            let (status, report) = call(
                reqwest::Method::POST,
                "/v1/dlq/redrive".into(),
                Some(json!({"max_messages": 1000})),
            )
            .await?;
            out(&format!("redrive -> {status} {report}"));
            redriven = true;
        }
        if started.elapsed() > timeout {
            out("timed out");
            break;
        }
        tokio::time::sleep(Duration::from_millis(700)).await;
    }

    out("");
    out(&format!(
        "{:<32} {:<8} {:<10} {:>8} {:>7}",
        "delivery", "endpoint", "status", "attempts", "manual"
    ));
    for (id, v) in &views {
        let endpoint = endpoint_names
            .get(v["endpoint_id"].as_str().unwrap_or_default())
            .copied()
            .unwrap_or("?");
        out(&format!(
            "{id:<32} {endpoint:<8} {:<10} {:>8} {:>7}",
            v["status"].as_str().unwrap_or("?"),
            v["total_attempts"],
            v["manual_retries"]
        ));
    }
    out("");
    out(&format!(
        "{:<8} {:>8} {:>9} {:>10} {:>14}",
        "receiver", "requests", "processed", "duplicates", "bad signature"
    ));
    for r in &receivers {
        out(&format!(
            "{:<8} {:>8} {:>9} {:>10} {:>14}",
            r.name,
            r.state.requests.load(Ordering::SeqCst),
            r.state.processed.load(Ordering::SeqCst),
            r.state.duplicates.load(Ordering::SeqCst),
            r.state.bad_signatures.load(Ordering::SeqCst)
        ));
    }
    let all_delivered = views.values().all(|v| v["status"] == "delivered");
    let processed: usize = receivers
        .iter()
        .map(|r| r.state.processed.load(Ordering::SeqCst))
        .sum();
    let bad: usize = receivers
        .iter()
        .map(|r| r.state.bad_signatures.load(Ordering::SeqCst))
        .sum();
    out("");
    out(&format!(
        "demo: {} deliveries, {} delivered, {} processed once by receivers, {} bad signatures -> {}",
        deliveries.len(),
        views.values().filter(|v| v["status"] == "delivered").count(),
        processed,
        bad,
        if all_delivered && processed == deliveries.len() && bad == 0 { "every delivery accounted for" } else { "INCOMPLETE" }
    ));
    Ok(all_delivered && processed == deliveries.len() && bad == 0)
}
