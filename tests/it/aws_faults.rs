//! AWS faults: a fault-injecting HTTP proxy between every SDK client and
//! moto returns throttling errors and 500s, and drops connections after
//! moto has acted (the response is lost), at set rates. Events go in with
//! `Idempotency-Key`s (a client retries a 503); nothing may be lost.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hookline_local::{LocalConfig, LocalStack};
use hookline_tests::moto::Moto;
use hookline_tests::receiver::Receiver;
use hookline_tests::{event_id, record_figures, workspace_root};
use rand::Rng;
use serde_json::json;

#[derive(Default)]
struct Faults {
    enabled: AtomicBool,
    requests: AtomicU64,
    throttled: AtomicU64,
    errors_500: AtomicU64,
    dropped: AtomicU64,
    /// The next this-many TransactWriteItems are cancelled with
    /// `TransactionConflict` (what DynamoDB answers when another transaction
    /// holds an item; moto never does).
    conflicts: AtomicU64,
    /// The next this-many puts of an event item fail (an internal error on
    /// every SDK retry): a request stopped between its key and its event.
    event_put_failures: AtomicU64,
    /// The next this-many writes of a delivery item are applied by moto
    /// and their answers lost (the client retries and meets its own write).
    dropped_delivery_writes: AtomicU64,
}

struct Proxy {
    upstream: String,
    client: reqwest::Client,
    faults: Faults,
}

/// Percent rates: throttle, 500, drop-after-forwarding.
const RATES: (u32, u32, u32) = (8, 4, 3);

async fn forward(
    State(proxy): State<Arc<Proxy>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let f = &proxy.faults;
    let target = headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let transact = target.ends_with(".TransactWriteItems");
    // A put of an idempotency key's record (keyed events without delivery
    // items claim the key with a conditional put, not a transaction).
    let key_put = target.ends_with(".PutItem") && body.windows(5).any(|w| w == b"IDEM#");
    let event_put = target.ends_with(".PutItem") && body.windows(5).any(|w| w == b"\"EVD#");
    if event_put
        && f.event_put_failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            [("content-type", "application/x-amz-json-1.0")],
            r#"{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"injected: the event put fails"}"#,
        )
            .into_response();
    }
    if (transact || key_put)
        && f.conflicts
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    {
        let answer = if transact {
            r#"{"__type":"com.amazonaws.dynamodb.v20120810#TransactionCanceledException","Message":"Transaction cancelled, please refer cancellation reasons for specific reasons [None, None, TransactionConflict]","CancellationReasons":[{"Code":"None"},{"Code":"None"},{"Code":"TransactionConflict","Message":"Transaction is ongoing for the item"}]}"#
        } else {
            r#"{"__type":"com.amazonaws.dynamodb.v20120810#TransactionConflictException","message":"Transaction is ongoing for the item"}"#
        };
        return (
            StatusCode::BAD_REQUEST,
            [("content-type", "application/x-amz-json-1.0")],
            answer,
        )
            .into_response();
    }
    let delivery_write = (target.ends_with(".PutItem") || target.ends_with(".UpdateItem"))
        && body.windows(5).any(|w| w == b"\"DLA#");
    let drop_this = delivery_write
        && f.dropped_delivery_writes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
    let roll = if drop_this {
        RATES.0 + RATES.1
    } else if f.enabled.load(Ordering::SeqCst) {
        f.requests.fetch_add(1, Ordering::SeqCst);
        rand::thread_rng().gen_range(0..100u32)
    } else {
        100
    };
    if roll < RATES.0 {
        f.throttled.fetch_add(1, Ordering::SeqCst);
        return (
            StatusCode::BAD_REQUEST,
            [("content-type", "application/x-amz-json-1.0")],
            r#"{"__type":"com.amazonaws.dynamodb.v20120810#ThrottlingException","message":"Rate of requests exceeds the allowed throughput."}"#,
        )
            .into_response();
    }
    if roll < RATES.0 + RATES.1 {
        f.errors_500.fetch_add(1, Ordering::SeqCst);
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            [("content-type", "application/x-amz-json-1.0")],
            r#"{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"injected"}"#,
        )
            .into_response();
    }
    let url = format!(
        "{}{}",
        proxy.upstream,
        uri.path_and_query().map_or("/", |p| p.as_str())
    );
    let mut req = proxy.client.request(method, url).body(body);
    for (k, v) in &headers {
        if k != "host" && k != "content-length" {
            req = req.header(k, v);
        }
    }
    let Ok(res) = req.send().await else {
        return StatusCode::BAD_GATEWAY.into_response();
    };
    let status = res.status();
    let res_headers = res.headers().clone();
    let bytes = res.bytes().await.unwrap_or_default();
    if roll < RATES.0 + RATES.1 + RATES.2 {
        // Moto has acted; the caller never hears back: a body that fails
        // makes the server abort the connection mid-response.
        f.dropped.fetch_add(1, Ordering::SeqCst);
        let stream = futures::stream::once(async {
            Err::<Bytes, std::io::Error>(std::io::Error::other("dropped"))
        });
        let mut response = Response::new(Body::from_stream(stream));
        *response.status_mut() = status;
        return response;
    }
    let mut response = Response::new(Body::from(bytes));
    *response.status_mut() = status;
    for (k, v) in &res_headers {
        if k != "content-length" && k != "transfer-encoding" {
            response.headers_mut().insert(k, v.clone());
        }
    }
    response
}

async fn start_proxy(upstream: &str) -> (String, Arc<Proxy>) {
    let proxy = Arc::new(Proxy {
        upstream: upstream.to_owned(),
        client: reqwest::Client::new(),
        faults: Faults::default(),
    });
    let app = Router::new().fallback(forward).with_state(proxy.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, proxy)
}

/// The local stack on `moto` with every SDK client going through the proxy.
async fn proxied_stack(moto: &Moto, env: &[(&str, &str)]) -> (LocalStack, Arc<Proxy>) {
    let (proxy_url, proxy) = start_proxy(&moto.url).await;
    let env: HashMap<String, String> = [("WEBHOOKS_ALLOW_PRIVATE_ENDPOINTS", "true")]
        .iter()
        .chain(env)
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let stack = LocalStack::start(LocalConfig {
        endpoint_url: proxy_url,
        template: workspace_root().join("template.yaml"),
        prefix: "hookline-".into(),
        env,
        admin_key: "faults-admin".into(),
        checkpoint_file: None,
        counters: None,
    })
    .await
    .expect("stack");
    (stack, proxy)
}

/// Registers `receiver` as an endpoint of `app` (through the API); its answer.
async fn register(stack: &LocalStack, app: &str, receiver: &Receiver) -> serde_json::Value {
    let path = format!("/v1/apps/{app}/endpoints");
    let (status, _, ep) = stack
        .call("POST", &path, Some(json!({"url": receiver.url})), &[])
        .await;
    assert_eq!(status, 201, "{ep}");
    ep
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_lost_when_aws_throttles_fails_and_drops_connections() {
    let moto = hookline_tests::moto::start();
    let (stack, proxy) = proxied_stack(&moto, &[("WEBHOOKS_RETRY_SCHEDULE", "1s")]).await;
    let receiver = Receiver::healthy().await;
    register(&stack, "f", &receiver).await;
    // A ReceiveMessage answer dropped after moto acted hides its messages
    // for the queue's visibility timeout (180 s in the template), as SQS
    // does: they must come back and be delivered, within this test's wait.
    stack
        .set_queue_visibility(20)
        .await
        .expect("the delivery queue's visibility timeout shortened");
    proxy.faults.enabled.store(true, Ordering::SeqCst);

    const EVENTS: usize = 100;
    let mut client_retries = 0;
    let mut event_ids = Vec::new();
    for i in 0..EVENTS {
        let key = format!("evt-{i}");
        let mut accepted = None;
        for _ in 0..10 {
            let (status, _, body) = stack
                .call(
                    "POST",
                    "/v1/apps/f/events",
                    Some(json!({"event_type": "order.paid", "payload": {"i": i}})),
                    &[("idempotency-key", key.as_str())],
                )
                .await;
            match status {
                202 => {
                    accepted = Some(body);
                    break;
                }
                503 | 500 => client_retries += 1,
                other => panic!("event {i}: {other} {body}"),
            }
        }
        let body = accepted.unwrap_or_else(|| panic!("event {i} never accepted"));
        assert!(body.to_string().len() < 10_000);
        event_ids.push(event_id(&body));
        if i % 20 == 19 {
            let _ = stack.pump().await;
        }
    }
    let mut unique = event_ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), EVENTS, "one event per idempotency key");
    let done = stack
        .pump_until(Duration::from_secs(240), || async {
            receiver.unique_accepted() >= EVENTS
        })
        .await;
    proxy.faults.enabled.store(false, Ordering::SeqCst);
    let delivered = receiver.unique_accepted();
    let f = &proxy.faults;
    let figures = format!(
        "AWS faults: {} AWS requests through the fault proxy, {} throttled, {} answered 500, {} dropped after moto acted; {EVENTS} events accepted ({client_retries} client retries of a 503, same Idempotency-Key), {delivered} delivered, lost {}, duplicates {}",
        f.requests.load(Ordering::SeqCst),
        f.throttled.load(Ordering::SeqCst),
        f.errors_500.load(Ordering::SeqCst),
        f.dropped.load(Ordering::SeqCst),
        EVENTS.saturating_sub(delivered),
        receiver.duplicates()
    );
    println!("{figures}");
    assert!(done, "every event delivered: {figures}");
    assert!(f.throttled.load(Ordering::SeqCst) > 0 && f.dropped.load(Ordering::SeqCst) > 0);
    record_figures("aws-faults", &figures);
}

/// DynamoDB's `TransactionConflict` (a concurrent transaction on the same
/// idempotency key) on the wire, through the real SDK parsing: the ingest
/// retries or replays, never answers 5xx, and writes the event once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_conflict_is_retried_never_a_5xx() {
    let moto = hookline_tests::moto::start();
    let (stack, proxy) = proxied_stack(&moto, &[]).await;
    let receiver = Receiver::healthy().await;
    register(&stack, "c", &receiver).await;
    let event = json!({"event_type": "order.paid", "payload": {"n": 1}});
    // Two conflicts, then the commit goes through.
    proxy.faults.conflicts.store(2, Ordering::SeqCst);
    let send = || {
        stack.call(
            "POST",
            "/v1/apps/c/events",
            Some(event.clone()),
            &[("idempotency-key", "k-1")],
        )
    };
    let (status, _, first) = send().await;
    assert_eq!(status, 202, "{first}");
    assert_eq!(proxy.faults.conflicts.load(Ordering::SeqCst), 0);
    // The same key again: the stored answer, no second event.
    let (status, headers, again) = send().await;
    assert_eq!((status, &again), (202, &first));
    assert_eq!(
        headers.get("idempotent-replayed").map(String::as_str),
        Some("true")
    );
    // Conflicting forever: a retryable 503, never a 500.
    proxy.faults.conflicts.store(100, Ordering::SeqCst);
    let (status, _, body) = stack
        .call(
            "POST",
            "/v1/apps/c/events",
            Some(event),
            &[("idempotency-key", "k-2")],
        )
        .await;
    assert_eq!(status, 503, "{body}");
    proxy.faults.conflicts.store(0, Ordering::SeqCst);
    record_figures(
        "idempotency",
        "TransactionConflict on the wire (real SDK parsing): 2 conflicts then committed (202), replay of the same key (202, same body), endless conflicts -> 503 (retryable), never a 500",
    );
}

/// A keyed event's request stops between its two writes (the key's record
/// claimed, the event's put failing on every SDK retry): no 202, nothing
/// delivered. The client sends it again: that request writes the very event
/// the record names and replays its answer; the delivery arrives once. The
/// key with another payload is still refused (409) and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_whose_request_stopped_before_its_event_is_completed_by_the_retry() {
    let moto = hookline_tests::moto::start();
    let (stack, proxy) = proxied_stack(&moto, &[]).await;
    let receiver = Receiver::healthy().await;
    register(&stack, "k", &receiver).await;
    let event = json!({"event_type": "order.paid", "payload": {"n": 7}});
    let send = |body: serde_json::Value| {
        let stack = &stack;
        async move {
            stack
                .call(
                    "POST",
                    "/v1/apps/k/events",
                    Some(body),
                    &[("idempotency-key", "k-stop")],
                )
                .await
        }
    };
    proxy.faults.event_put_failures.store(100, Ordering::SeqCst);
    let (status, _, first) = send(event.clone()).await;
    proxy.faults.event_put_failures.store(0, Ordering::SeqCst);
    assert_eq!(status, 503, "{first}");
    for _ in 0..5 {
        stack.pump().await;
    }
    assert!(receiver.received().is_empty(), "no event, nothing sent");

    let (status, headers, again) = send(event.clone()).await;
    assert_eq!(status, 202, "{again}");
    assert_eq!(
        headers.get("idempotent-replayed").map(String::as_str),
        Some("true"),
        "the claimed key's answer"
    );
    let id = event_id(&again);
    let (status, _, stored) = stack
        .call("GET", &format!("/v1/apps/k/events/{id}"), None, &[])
        .await;
    assert_eq!(
        status, 200,
        "the event the record names is written: {stored}"
    );
    // Indexed for the reconciler's sweep when it was written, not at its
    // (earlier) creation: a sweep that had passed that time still finds it.
    let (pk, sk) = hookline_tests::stack::Stack::event_key("k", &id);
    let item = stack
        .clients
        .dynamodb
        .get_item()
        .table_name(&stack.settings.table)
        .key("PK", aws_sdk_dynamodb::types::AttributeValue::S(pk))
        .key("SK", aws_sdk_dynamodb::types::AttributeValue::S(sk))
        .send()
        .await
        .expect("read the event item")
        .item
        .expect("the event item");
    let indexed = item["GSI3SK"].as_s().expect("in the time index").clone();
    let created = item["created_at"].as_s().expect("created_at").clone();
    let created = chrono::DateTime::parse_from_rfc3339(&created).expect("a time");
    let created = hookline_aws::schema::due_time(created.with_timezone(&chrono::Utc));
    assert!(
        indexed > created,
        "indexed at completion ({indexed}), after its creation ({created})"
    );
    let delivered = stack
        .pump_until(Duration::from_secs(30), || async {
            receiver.received().len() == 1
        })
        .await;
    assert!(delivered, "the completed event is delivered");
    let (status, _, third) = send(event).await;
    assert_eq!(
        (status, &third),
        (202, &again),
        "replayed again, nothing new"
    );
    let other = json!({"event_type": "order.paid", "payload": {"n": 2}});
    let (status, _, refused) = send(other).await;
    assert_eq!(status, 409, "{refused}");
    for _ in 0..5 {
        stack.pump().await;
    }
    assert_eq!(receiver.received().len(), 1, "one event, one POST");
    let got: serde_json::Value = serde_json::from_slice(&receiver.received()[0].body).unwrap();
    assert_eq!(got["data"], json!({"n": 7}), "the event as first sent");
    record_figures(
        "idempotency",
        "a keyed request stopped between its key record and its event (event put failing): 503, 0 sent; its retry wrote that event and replayed the answer (202), delivered once; the key with another payload -> 409",
    );
}

/// A delivery's outcome write is applied, but its answer is lost: the
/// client retries and the retry's condition fails on that very write. It
/// was read as a lost race ("attempt raced with another writer; result
/// dropped": no stats, no 410 disable); the store now reads the item back
/// and finds its own write, so the attempt counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_applied_before_its_answer_was_lost_counts_as_written() {
    let moto = hookline_tests::moto::start();
    let (stack, proxy) = proxied_stack(&moto, &[]).await;
    let receiver = Receiver::healthy().await;
    let ep = register(&stack, "w", &receiver).await;
    let ep = ep["id"].as_str().expect("an endpoint id").to_owned();
    proxy
        .faults
        .dropped_delivery_writes
        .store(1, Ordering::SeqCst);
    let (status, _, body) = stack
        .call(
            "POST",
            "/v1/apps/w/events",
            Some(json!({"event_type": "order.paid", "payload": {"n": 1}})),
            &[],
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let delivered = stack
        .pump_until(Duration::from_secs(30), || async {
            receiver.received().len() == 1
        })
        .await;
    assert!(delivered);
    for _ in 0..3 {
        stack.pump().await;
    }
    assert_eq!(
        proxy.faults.dropped_delivery_writes.load(Ordering::SeqCst),
        0,
        "the outcome's answer was dropped"
    );
    let (status, _, stats) = stack
        .call(
            "GET",
            &format!("/v1/apps/w/endpoints/{ep}/stats"),
            None,
            &[],
        )
        .await;
    assert_eq!(status, 200, "{stats}");
    assert_eq!(stats["delivered"], 1, "the attempt counted: {stats}");
    assert_eq!(receiver.received().len(), 1, "one POST");
    record_figures(
        "aws_faults",
        "a delivery outcome applied with its answer lost: the retry meets its own write and counts it (was: read as a lost race, no stats)",
    );
}
