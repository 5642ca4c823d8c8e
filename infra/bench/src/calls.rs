//! AWS requests per delivery: the local stack on moto with every SDK client
//! counted (functions apart from the event-source pollers), in three
//! scenarios, and the seed's naive design replayed on the same table with
//! the same counter. Only request counts and capacity estimates come from
//! here; no time measured on moto is reported.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use hookline_local::clients::{function_clients, local_sdk_config};
use hookline_local::counting::{CallCounter, OperationCount};
use hookline_local::{LocalConfig, LocalCounters, LocalStack};
use hookline_tests::workspace_root;
use serde::Serialize;
use serde_json::json;

/// A scenario's shape.
#[derive(Debug, Clone, Serialize)]
pub struct Scenario {
    pub name: &'static str,
    pub events: usize,
    pub endpoints: usize,
    /// Share of messages whose first attempt fails (then succeed).
    pub retry_share: f64,
    /// Events per ingest request: 1 (`POST /events`) or more
    /// (`POST /events/batch`).
    pub events_per_request: usize,
    /// The goal for this scenario, $ per million deliveries.
    pub goal_usd: f64,
    /// The endpoints' `rate_limit` (requests per second), if any.
    pub rate_limit: Option<u32>,
    /// Event `i` gets `ordering_key` `order-{i % n}`, if set.
    pub ordering_keys: Option<usize>,
}

/// What a scenario cost, by operation.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioCounts {
    pub scenario: Scenario,
    pub deliveries: usize,
    pub attempts: usize,
    pub functions: BTreeMap<String, OperationCount>,
    pub event_sources: BTreeMap<String, OperationCount>,
}

#[derive(Default)]
struct ReceiverState {
    seen: HashSet<String>,
    delivered: HashSet<String>,
    attempts: usize,
}

/// A receiver that fails the first attempt of `retry_share` of the
/// messages (chosen by a hash of the webhook id), then accepts.
async fn receiver(retry_share: f64) -> Result<(String, Arc<Mutex<ReceiverState>>), String> {
    let state = Arc::new(Mutex::new(ReceiverState::default()));
    let s = state.clone();
    let app = Router::new().route(
        "/hook",
        post(move |headers: HeaderMap| {
            let s = s.clone();
            async move {
                let id = headers
                    .get("webhook-id")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                let hash = id
                    .bytes()
                    .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
                let fails_first = f64::from(hash % 1000) < retry_share * 1000.0;
                let mut st = s.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                st.attempts += 1;
                let first = st.seen.insert(id.clone());
                if first && fails_first {
                    StatusCode::SERVICE_UNAVAILABLE
                } else {
                    st.delivered.insert(id);
                    StatusCode::OK
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .map_err(|e| e.to_string())?;
    let url = format!(
        "http://{}/hook",
        listener.local_addr().map_err(|e| e.to_string())?
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((url, state))
}

fn delivered(state: &Mutex<ReceiverState>) -> (usize, usize) {
    let st = state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    (st.delivered.len(), st.attempts)
}

/// The local stack on `moto_url` (loopback receivers allowed), with `env`
/// overrides and optional request counters.
pub async fn local_stack(
    moto_url: &str,
    env: &[(&str, &str)],
    counters: Option<LocalCounters>,
) -> Result<LocalStack, String> {
    let mut vars: HashMap<String, String> = HashMap::from([(
        "WEBHOOKS_ALLOW_PRIVATE_ENDPOINTS".to_owned(),
        "true".to_owned(),
    )]);
    vars.extend(env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    LocalStack::start(LocalConfig {
        endpoint_url: moto_url.to_owned(),
        template: workspace_root().join("template.yaml"),
        prefix: "hookline-".into(),
        env: vars,
        admin_key: "bench-admin-key".into(),
        checkpoint_file: None,
        counters,
    })
    .await
    .map_err(|e| e.to_string())
}

/// Sends the events keyed `keys` (one request each, or one batch); the keys
/// that answered 503 (to send again).
async fn send<'k>(
    stack: &LocalStack,
    event: &dyn Fn(&str) -> serde_json::Value,
    keys: &[&'k str],
    batch: bool,
) -> Result<Vec<&'k str>, String> {
    let mut again = Vec::new();
    if batch {
        let events: Vec<serde_json::Value> = keys
            .iter()
            .map(|k| {
                let mut e = event(k);
                e["idempotency_key"] = json!(k);
                e
            })
            .collect();
        let (status, _, body) = stack
            .call(
                "POST",
                "/v1/apps/bench/events/batch",
                Some(json!({"events": events})),
                &[],
            )
            .await;
        if status == 503 {
            return Ok(keys.to_vec());
        }
        let answer: hookline_ingest::views::BatchResponse = serde_json::from_value(body.clone())
            .map_err(|e| format!("batch: {status} {body}: {e}"))?;
        for (key, item) in keys.iter().zip(&answer.items) {
            match item.status {
                202 => {}
                503 => again.push(*key),
                other => return Err(format!("event {key}: {other} {body}")),
            }
        }
    } else {
        for key in keys {
            let (status, _, body) = stack
                .call(
                    "POST",
                    "/v1/apps/bench/events",
                    Some(event(key)),
                    &[("idempotency-key", key)],
                )
                .await;
            match status {
                202 => {}
                503 => again.push(*key),
                _ => return Err(format!("event {key}: {status} {body}")),
            }
        }
    }
    Ok(again)
}

/// A realistic webhook payload of about 0.8 KB (a paid order as payment
/// providers send it: ids, amounts, a customer, line items, metadata), its
/// ids, amounts and names drawn from `key` so no two events repeat. Real
/// JSON, not padding: what the store's compression gains on it is what a
/// producer's payloads gain.
pub fn order_payload(key: &str) -> serde_json::Value {
    // splitmix64 seeded by the key's bytes: deterministic, well spread.
    struct Mix(u64);
    impl Mix {
        fn n(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        fn id(&mut self, prefix: &str, len: usize) -> String {
            const ALPHABET: &[u8] =
                b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
            let tail: String = (0..len)
                .map(|_| char::from(ALPHABET[(self.n() % ALPHABET.len() as u64) as usize]))
                .collect();
            format!("{prefix}_{tail}")
        }
    }
    let mut mix = Mix(key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x1000_0000_01b3)
    }));
    let (order, customer) = (mix.id("ord", 14), mix.id("cus", 14));
    let (charge, intent) = (mix.id("ch", 24), mix.id("pi", 24));
    let (sku1, sku2) = (mix.id("sku", 8), mix.id("sku", 8));
    let (tracking, cart) = (mix.id("BR", 11), mix.id("cart", 12));
    let mut n = || mix.n();
    let names = [
        "Ana Souza",
        "Bruno Lima",
        "Carla Dias",
        "Diego Alves",
        "Elisa Rocha",
        "Fabio Melo",
    ];
    let cities = [
        "São Paulo",
        "Recife",
        "Porto Alegre",
        "Curitiba",
        "Belo Horizonte",
        "Salvador",
    ];
    let name = names[(n() % 6) as usize];
    let (qty1, qty2) = (1 + n() % 4, 1 + n() % 3);
    let (price1, price2) = (500 + n() % 20_000, 990 + n() % 9_000);
    let total = qty1 * price1 + qty2 * price2;
    json!({
        "id": order,
        "object": "order",
        "status": "paid",
        "amount": total,
        "amount_received": total,
        "currency": "brl",
        "created": 1_764_000_000 + n() % 10_000_000,
        "customer": {
            "id": customer,
            "name": name,
            "email": format!("{}.{}@example.com", name.split(' ').next().unwrap_or("x").to_lowercase(), n() % 10_000),
            "address": {"city": cities[(n() % 6) as usize], "country": "BR", "postal_code": format!("{:05}-{:03}", n() % 100_000, n() % 1_000)}
        },
        "payment": {"intent": intent, "charge": charge, "method": "card", "card": {"brand": "visa", "last4": format!("{:04}", n() % 10_000), "exp_month": 1 + n() % 12, "exp_year": 2027 + n() % 5}, "installments": 1 + n() % 6},
        "items": [
            {"sku": sku1, "description": "Camiseta algodão orgânico", "quantity": qty1, "unit_amount": price1},
            {"sku": sku2, "description": "Caneca cerâmica 350 ml", "quantity": qty2, "unit_amount": price2}
        ],
        "shipping": {"carrier": "correios", "service": "sedex", "amount": 1990 + n() % 3_000, "tracking": tracking},
        "metadata": {"channel": "web", "campaign": "black-friday", "cart_id": cart},
        "livemode": false
    })
}

/// Runs one scenario on a fresh moto.
pub async fn run(scenario: Scenario) -> Result<ScenarioCounts, String> {
    let moto = hookline_tests::moto::start();
    let counters = LocalCounters::default();
    let stack = local_stack(
        &moto.url,
        &[
            ("WEBHOOKS_RETRY_SCHEDULE", "1s"),
            ("WEBHOOKS_DELIVERY_TIMEOUT", "5s"),
        ],
        Some(counters.clone()),
    )
    .await?;
    let (url, state) = receiver(scenario.retry_share).await?;
    for _ in 0..scenario.endpoints {
        let (status, _, body) = stack
            .call(
                "POST",
                "/v1/apps/bench/endpoints",
                Some(match scenario.rate_limit {
                    Some(limit) => json!({"url": url, "rate_limit": limit}),
                    None => json!({"url": url}),
                }),
                &[],
            )
            .await;
        if status != 201 {
            return Err(format!("endpoint: {status} {body}"));
        }
    }
    // The table's format item, as every deployed table has once its first
    // process ran.
    stack
        .store
        .check_format()
        .await
        .map_err(|e| format!("format item: {e}"))?;
    // The reconciler's first run on the new table: with no mark yet, its
    // sweep reads every day an event could still be kept (retention) to
    // set where it starts; a one-time cost of a deployment.
    stack
        .reconcile_at(chrono::Utc::now())
        .await
        .map_err(|e| format!("first reconcile: {e}"))?;
    // Count from here: setup (tables, queues, endpoints, the reconciler's
    // first mark) is not per delivery.
    counters.functions.reset();
    counters.event_sources.reset();
    let expected = scenario.events * scenario.endpoints;
    let ordering_keys = scenario.ordering_keys;
    let event = |key: &str| {
        let mut event = json!({"event_type": "order.paid", "payload": order_payload(key)});
        if let Some(keys) = ordering_keys {
            let i: usize = key
                .trim_start_matches("bench-")
                .parse()
                .expect("the bench's keys are numbered");
            event["ordering_key"] = json!(format!("order-{}", i % keys));
        }
        event
    };
    let per_request = scenario.events_per_request.max(1);
    let mut sent = 0;
    while sent < scenario.events {
        let count = per_request.min(scenario.events - sent);
        // A well-behaved client: an Idempotency-Key per event, and a retry
        // of what answered 503 (moto has slow moments); retried calls are
        // counted too.
        let keys: Vec<String> = (sent..sent + count).map(|i| format!("bench-{i}")).collect();
        let mut pending: Vec<&str> = keys.iter().map(String::as_str).collect();
        for _ in 0..5 {
            pending = send(&stack, &event, &pending, per_request > 1).await?;
            if pending.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if !pending.is_empty() {
            return Err(format!("events {pending:?}: still 503 after 5 tries"));
        }
        sent += count;
        // Keep the pipeline moving while events arrive (as Lambda would).
        if sent % 25 < count {
            stack.pump().await;
        }
    }
    let timeout = Duration::from_secs(60 + (expected as u64) / 5);
    let done = stack
        .pump_until(timeout, || async { delivered(&state).0 >= expected })
        .await;
    // Let the last deliver calls record their attempts.
    for _ in 0..3 {
        stack.pump().await;
    }
    // The scheduled reconciler's share: one sweep past every event (what
    // its runs read over the scenario's traffic); nothing may be lost.
    let after =
        chrono::Duration::from_std(stack.settings.reconcile_after).map_err(|e| e.to_string())?;
    let report = stack
        .reconcile_at(chrono::Utc::now() + after + chrono::Duration::seconds(1))
        .await
        .map_err(|e| format!("reconcile: {e}"))?;
    if report.listed_requeued + report.requeued > 0 || !report.complete {
        return Err(format!(
            "{}: the reconciler found lost work: {report:?}",
            scenario.name
        ));
    }
    let (count, attempts) = delivered(&state);
    if !done {
        return Err(format!(
            "{}: delivered {count} of {expected}",
            scenario.name
        ));
    }
    drop(stack);
    drop(moto);
    Ok(ScenarioCounts {
        scenario,
        deliveries: count,
        attempts,
        functions: counters.functions.snapshot(),
        event_sources: counters.event_sources.snapshot(),
    })
}

/// The seed's design ported 1:1 to DynamoDB (a table with a GSI on status,
/// polled by a scheduled function every 30 s), replayed request by request:
/// insert the delivery; the poller queries due pending rows (50 at a time)
/// and claims each (`FOR UPDATE SKIP LOCKED` -> a conditional update); after
/// the POST, one update records the outcome (attempts, status, error).
pub async fn naive(scenario: &Scenario) -> Result<ScenarioCounts, String> {
    let moto = hookline_tests::moto::start();
    let counter = CallCounter::default();
    let sdk = local_sdk_config(&moto.url).await;
    let clients = function_clients(&sdk, Some(&counter));
    let db = &clients.dynamodb;
    let table = "naive";
    let attr = |n: &str| {
        aws_sdk_dynamodb::types::AttributeDefinition::builder()
            .attribute_name(n)
            .attribute_type(aws_sdk_dynamodb::types::ScalarAttributeType::S)
            .build()
    };
    let key = |n: &str, t| {
        aws_sdk_dynamodb::types::KeySchemaElement::builder()
            .attribute_name(n)
            .key_type(t)
            .build()
    };
    use aws_sdk_dynamodb::types::KeyType;
    let gsi = aws_sdk_dynamodb::types::GlobalSecondaryIndex::builder()
        .index_name("GSI2")
        .key_schema(key("GSI2PK", KeyType::Hash).map_err(|e| e.to_string())?)
        .key_schema(key("GSI2SK", KeyType::Range).map_err(|e| e.to_string())?)
        .projection(
            aws_sdk_dynamodb::types::Projection::builder()
                .projection_type(aws_sdk_dynamodb::types::ProjectionType::All)
                .build(),
        )
        .build()
        .map_err(|e| e.to_string())?;
    db.create_table()
        .table_name(table)
        .billing_mode(aws_sdk_dynamodb::types::BillingMode::PayPerRequest)
        .attribute_definitions(attr("PK").map_err(|e| e.to_string())?)
        .attribute_definitions(attr("GSI2PK").map_err(|e| e.to_string())?)
        .attribute_definitions(attr("GSI2SK").map_err(|e| e.to_string())?)
        .key_schema(key("PK", KeyType::Hash).map_err(|e| e.to_string())?)
        .global_secondary_indexes(gsi)
        .send()
        .await
        .map_err(|e| format!("create naive table: {e:?}"))?;
    counter.reset();
    let s = |v: &str| AttributeValue::S(v.to_owned());
    let total = scenario.events * scenario.endpoints;
    for i in 0..total {
        let payload = order_payload(&format!("bench-{i}")).to_string();
        // INSERT INTO webhook_deliveries (...) — with the payload (JSONB).
        db.put_item()
            .table_name(table)
            .item("PK", s(&format!("NAIVE#{i:08}")))
            .item("kind", s("delivery"))
            .item("endpoint_id", s("ep_1"))
            .item("event_type", s("order.paid"))
            .item("payload", s(&payload))
            .item("status", s("pending"))
            .item("attempts", AttributeValue::N("0".into()))
            .item("GSI2PK", s("pending"))
            .item("GSI2SK", s(&format!("{i:08}")))
            .send()
            .await
            .map_err(|e| e.to_string())?;
    }
    let mut attempts = 0usize;
    let mut delivered = 0usize;
    let mut failed_once: HashSet<usize> = HashSet::new();
    // The cron: query due pending rows, 50 at a time, until none is left.
    loop {
        let page = db
            .query()
            .table_name(table)
            .index_name("GSI2")
            .key_condition_expression("GSI2PK = :p")
            .expression_attribute_values(":p", s("pending"))
            .limit(50)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let items = page.items.unwrap_or_default();
        if items.is_empty() {
            break;
        }
        for item in items {
            let Some(AttributeValue::S(pk)) = item.get("PK") else {
                continue;
            };
            let i: usize = pk.trim_start_matches("NAIVE#").parse().unwrap_or(0);
            // SELECT ... FOR UPDATE SKIP LOCKED: a conditional claim.
            db.update_item()
                .table_name(table)
                .key("PK", s(pk))
                .update_expression("SET locked_until = :t")
                .condition_expression("attribute_not_exists(locked_until) OR locked_until < :now")
                .expression_attribute_values(":t", AttributeValue::N("9999999999".into()))
                .expression_attribute_values(":now", AttributeValue::N("0".into()))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            attempts += 1;
            let fails = (i * 7919 % 1000) as f64 / 1000.0 < scenario.retry_share
                && !failed_once.contains(&i);
            if fails {
                failed_once.insert(i);
                // attempts + 1, next_attempt_at, last_error; stays pending.
                db.update_item()
                    .table_name(table)
                    .key("PK", s(pk))
                    .update_expression("SET attempts = attempts + :one, last_error = :e, next_attempt_at = :n, GSI2SK = :n REMOVE locked_until")
                    .expression_attribute_values(":one", AttributeValue::N("1".into()))
                    .expression_attribute_values(":e", s("HTTP 503"))
                    .expression_attribute_values(":n", s(&format!("z{i:08}")))
                    .send()
                    .await
                    .map_err(|e| e.to_string())?;
            } else {
                db.update_item()
                    .table_name(table)
                    .key("PK", s(pk))
                    .update_expression(
                        "SET #s = :d, attempts = attempts + :one, GSI2PK = :d REMOVE locked_until",
                    )
                    .expression_attribute_names("#s", "status")
                    .expression_attribute_values(":d", s("delivered"))
                    .expression_attribute_values(":one", AttributeValue::N("1".into()))
                    .send()
                    .await
                    .map_err(|e| e.to_string())?;
                delivered += 1;
            }
        }
    }
    drop(moto);
    Ok(ScenarioCounts {
        scenario: scenario.clone(),
        deliveries: delivered,
        attempts,
        functions: counter.snapshot(),
        event_sources: BTreeMap::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::order_payload;

    #[test]
    fn order_payloads_are_realistic_and_never_repeat() {
        let a = order_payload("bench-1").to_string();
        let b = order_payload("bench-2").to_string();
        assert_ne!(a, b);
        assert_eq!(a, order_payload("bench-1").to_string(), "deterministic");
        assert!((700..1100).contains(&a.len()), "{} bytes: {a}", a.len());
    }
}
