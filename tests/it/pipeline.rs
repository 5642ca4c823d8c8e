//! The delivery pipeline end to end: real SDK clients against moto (real
//! DynamoDB, Streams and SQS protocols), real HTTP receivers on loopback, the
//! four functions' handlers fed by the local event-source poller.

use hookline_ingest::views::DeliveryList;
use hookline_tests::{delivery_ids, error_code, event_id, first_delivery, secret_of, view};
use std::time::Duration;

use hookline_core::model::DeliveryStatus;
use hookline_tests::receiver::{Receiver, Reply};
use hookline_tests::stack::Stack;
use serde_json::json;

const T: Duration = Duration::from_secs(60);

async fn status_of(stack: &Stack, id: &str) -> DeliveryStatus {
    stack.delivery(id).await.status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn happy_path_delivers_signed_body_with_both_schemes() {
    let stack = Stack::start(&[]).await;
    let receiver = Receiver::healthy().await;
    let (endpoint_id, _) = stack.subscribe("shop", &receiver).await;
    let (status, body) = stack
        .send_event(
            "shop",
            "order.paid",
            json!({"order_id": 42, "total": "99.90"}),
            None,
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let delivery_id = first_delivery(&body);
    assert!(event_id(&body).as_str().starts_with("evt_"));

    let delivered = stack
        .reaches(&delivery_id, DeliveryStatus::Delivered, T)
        .await;
    assert!(
        delivered,
        "not delivered: {:?}",
        stack.delivery(&delivery_id).await
    );

    let got = receiver.received();
    assert_eq!(got.len(), 1);
    let r = &got[0];
    assert!(
        r.standard_ok,
        "Standard Webhooks signature did not verify: {:?}",
        r.headers
    );
    assert!(
        r.stripe_ok,
        "Stripe-compatible signature did not verify: {:?}",
        r.headers
    );
    assert_eq!(r.headers["content-type"], "application/json");
    assert!(r.headers["user-agent"].starts_with("hookline/"));
    assert_eq!(r.headers["x-webhook-id"], r.webhook_id);
    assert_eq!(
        r.headers["x-webhook-timestamp"],
        r.headers["webhook-timestamp"]
    );
    let sent: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(sent["type"], "order.paid");
    assert_eq!(sent["data"]["order_id"], 42);
    assert!(sent["timestamp"].as_str().unwrap().ends_with('Z'));

    let d = stack.delivery(&delivery_id).await;
    assert_eq!(d.endpoint_id.as_str(), endpoint_id);
    assert_eq!(d.attempt_count, 1);
    assert_eq!(d.attempts[0].status_code, Some(200));
    assert_eq!(d.message_id().as_str(), r.webhook_id);

    // The API shows the delivery with its attempt log.
    let (status, _, view) = stack
        .call(
            "GET",
            &format!("/v1/apps/shop/deliveries/{delivery_id}"),
            None,
            &[],
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(view["status"], "delivered");
    assert_eq!(view["attempts"][0]["status_code"], 200);
    // Another app cannot see it.
    let (status, _, _) = stack
        .call(
            "GET",
            &format!("/v1/apps/other/deliveries/{delivery_id}"),
            None,
            &[],
        )
        .await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flaky_receiver_is_delivered_on_attempt_three_with_identical_bodies() {
    let stack = Stack::start(&[("WEBHOOKS_RETRY_SCHEDULE", "1s,2s,4s")]).await;
    let receiver = Receiver::start(
        vec![Reply::Status(500), Reply::Status(500)],
        Reply::Status(200),
    )
    .await;
    let (_, secret) = stack
        .create_endpoint("shop", &receiver.url, &["order.*"])
        .await;
    receiver.set_secret(&secret);
    let id = stack.send_one("shop", "order.paid", json!({"n": 1})).await;

    assert!(stack.reaches(&id, DeliveryStatus::Delivered, T).await);
    let d = stack.delivery(&id).await;
    assert_eq!(d.attempt_count, 3);
    assert_eq!(
        d.attempts.iter().map(|a| a.status_code).collect::<Vec<_>>(),
        [Some(500), Some(500), Some(200)]
    );
    let got = receiver.received();
    assert_eq!(got.len(), 3);
    assert!(
        got.iter()
            .all(|r| r.body == got[0].body && r.webhook_id == got[0].webhook_id),
        "retries must be byte-identical"
    );
    assert!(got.iter().all(|r| r.standard_ok && r.stripe_ok));
    // Backoff: 1 s then 2 s (±20 % jitter), never hammering.
    let gap1 = got[1].at - got[0].at;
    let gap2 = got[2].at - got[1].at;
    assert!(gap1 >= Duration::from_millis(700), "{gap1:?}");
    assert!(gap2 >= Duration::from_millis(1500), "{gap2:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_failure_goes_to_dlq_and_retry_function_redelivers() {
    let stack = Stack::start(&[
        ("WEBHOOKS_RETRY_SCHEDULE", "1s,1s"),
        ("WEBHOOKS_MAX_ATTEMPTS", "3"),
    ])
    .await;
    let receiver = Receiver::start(vec![], Reply::Status(503)).await;
    let _ = stack.subscribe("shop", &receiver).await;
    let id = stack
        .send_one("shop", "invoice.created", json!({"invoice": "inv_1"}))
        .await;

    assert!(stack.reaches(&id, DeliveryStatus::Failed, T).await);
    let d = stack.delivery(&id).await;
    assert_eq!(d.attempt_count, 3);
    assert_eq!(d.attempts.len(), 3, "attempt log kept");
    assert!(d.attempts.iter().all(|a| a.status_code == Some(503)));
    assert_eq!(stack.dlq_depth().await, 1);

    // Dry run counts without acting.
    let report = hookline_retry::handle(
        &stack.store,
        &stack.queue,
        json!({"dry_run": true}),
        chrono::Utc::now(),
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    assert_eq!(
        (report.received, report.redriven, report.dry_run),
        (1, 1, true)
    );
    assert_eq!(status_of(&stack, &id).await, DeliveryStatus::Failed);
    // A filter that does not match leaves the message alone.
    let report = hookline_retry::handle(
        &stack.store,
        &stack.queue,
        json!({"event_type": "other.type"}),
        chrono::Utc::now(),
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    assert_eq!((report.skipped, report.redriven), (1, 0));

    // The receiver recovers; the retry function drains the DLQ.
    receiver.set_fallback(Reply::Status(200));
    let report = hookline_retry::handle(
        &stack.store,
        &stack.queue,
        json!({"max_messages": 10}),
        chrono::Utc::now(),
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    assert_eq!(report.redriven, 1, "{report:?}");
    assert_eq!(stack.dlq_depth().await, 0);
    assert!(stack.reaches(&id, DeliveryStatus::Delivered, T).await);
    let d = stack.delivery(&id).await;
    assert_eq!(
        (d.manual_retries, d.attempt_count, d.total_attempts),
        (1, 1, 4)
    );
    assert_eq!(d.attempts.len(), 4);
    assert_eq!(receiver.unique_accepted(), 1);

    // Redriving again finds nothing; a stale copy of a delivered one is just deleted.
    let report = hookline_retry::handle(
        &stack.store,
        &stack.queue,
        json!({}),
        chrono::Utc::now(),
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    assert_eq!(report.received, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_respected_and_timeouts_and_refused_connections_are_retried() {
    let stack = Stack::start(&[
        ("WEBHOOKS_RETRY_SCHEDULE", "1s"),
        ("WEBHOOKS_MAX_ATTEMPTS", "3"),
        ("WEBHOOKS_DELIVERY_TIMEOUT", "1s"),
    ])
    .await;
    // 429 with Retry-After: 3 -> the second attempt waits >= 3 s (schedule says 1 s).
    let limited =
        Receiver::start(vec![Reply::RetryAfter(429, "3".into())], Reply::Status(200)).await;
    let _ = stack.subscribe("a", &limited).await;
    // A receiver slower than the delivery timeout, then healthy.
    let slow = Receiver::start(
        vec![Reply::Slow(Duration::from_secs(3))],
        Reply::Status(200),
    )
    .await;
    let _ = stack.subscribe("b", &slow).await;
    // Nothing listens here: connection refused.
    let refused = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/hook", l.local_addr().unwrap())
    };
    stack.create_endpoint("c", &refused, &[]).await;

    let (_, a) = stack.send_event("a", "x.y", json!({}), None).await;
    let (_, b) = stack.send_event("b", "x.y", json!({}), None).await;
    let (_, c) = stack.send_event("c", "x.y", json!({}), None).await;
    let (a, b, c) = (first_delivery(&a), first_delivery(&b), first_delivery(&c));
    let done = stack
        .pump_until(T, || async {
            status_of(&stack, &a).await == DeliveryStatus::Delivered
                && status_of(&stack, &b).await == DeliveryStatus::Delivered
                && status_of(&stack, &c).await == DeliveryStatus::Failed
        })
        .await;
    assert!(
        done,
        "a={:?} b={:?} c={:?}",
        stack.delivery(&a).await.status,
        stack.delivery(&b).await.status,
        stack.delivery(&c).await.status
    );

    let got = limited.received();
    assert_eq!(got.len(), 2);
    assert!(
        got[1].at - got[0].at >= Duration::from_millis(2900),
        "Retry-After ignored: {:?}",
        got[1].at - got[0].at
    );
    let da = stack.delivery(&a).await;
    assert_eq!(da.attempts[0].status_code, Some(429));

    let db = stack.delivery(&b).await;
    assert_eq!(db.attempts[0].status_code, None);
    assert!(
        db.attempts[0]
            .error
            .as_deref()
            .unwrap_or("")
            .contains("timeout"),
        "{:?}",
        db.attempts[0]
    );
    assert_eq!(db.attempts[1].status_code, Some(200));

    let dc = stack.delivery(&c).await;
    assert_eq!(dc.attempt_count, 3);
    assert!(
        dc.attempts
            .iter()
            .all(|x| x.status_code.is_none()
                && x.error.as_deref().unwrap_or("").contains("connection")),
        "{:?}",
        dc.attempts
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_subscriptions_and_disabled_endpoints() {
    let stack = Stack::start(&[]).await;
    let orders = Receiver::healthy().await;
    let users = Receiver::healthy().await;
    let disabled = Receiver::healthy().await;
    stack
        .create_endpoint("shop", &orders.url, &["order.*"])
        .await;
    stack
        .create_endpoint("shop", &users.url, &["user.created"])
        .await;
    let (disabled_id, _) = stack.create_endpoint("shop", &disabled.url, &[]).await;
    let app = hookline_core::ids::AppId::parse("shop").unwrap();
    let ep = hookline_core::ids::EndpointId::parse(&disabled_id).unwrap();
    let version = hookline_pipeline::ports::Store::get_endpoint(&stack.store, &app, &ep)
        .await
        .unwrap()
        .unwrap()
        .version;
    assert!(hookline_pipeline::ports::Store::disable_endpoint(
        &stack.store,
        &app,
        &ep,
        "test",
        version,
        chrono::Utc::now(),
    )
    .await
    .unwrap());

    let (s1, first) = stack
        .send_event("shop", "order.paid", json!({"id": 1}), Some("key-1"))
        .await;
    let (s2, second) = stack
        .send_event("shop", "order.paid", json!({"id": 1}), Some("key-1"))
        .await;
    assert_eq!((s1, s2), (202, 202));
    assert_eq!(first, second, "same key -> same response");
    assert_eq!(
        delivery_ids(&first).len(),
        1,
        "only the order.* endpoint subscribes"
    );
    // Same key, different request -> 409, nothing written.
    let (s3, err) = stack
        .send_event("shop", "order.paid", json!({"id": 2}), Some("key-1"))
        .await;
    assert_eq!(s3, 409, "{err}");
    assert_eq!(error_code(&err).as_deref(), Some("conflict"));

    let id = first_delivery(&first);
    assert!(stack.reaches(&id, DeliveryStatus::Delivered, T).await);
    // Let anything stray arrive.
    for _ in 0..5 {
        stack.pump().await;
    }
    assert_eq!(orders.received().len(), 1, "one event, one delivery");
    assert_eq!(
        users.received().len(),
        0,
        "unsubscribed endpoint gets nothing"
    );
    assert_eq!(
        disabled.received().len(),
        0,
        "disabled endpoint gets nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_clear_4xx_and_writes_nothing() {
    let stack = Stack::start(&[("WEBHOOKS_MAX_PAYLOAD_BYTES", "1024")]).await;
    let cases: Vec<(&str, &str, Option<serde_json::Value>, u16, &str)> = vec![
        (
            "POST",
            "/v1/apps/shop/events",
            Some(json!({"event_type": "a.b"})),
            400,
            "invalid_body",
        ),
        (
            "POST",
            "/v1/apps/shop/events",
            Some(json!({"event_type": "bad type", "payload": {}})),
            400,
            "invalid_input",
        ),
        (
            "POST",
            "/v1/apps/shop/events",
            Some(json!({"event_type": "a.b", "payload": {}, "extra": 1})),
            400,
            "invalid_body",
        ),
        (
            "POST",
            "/v1/apps/shop/events",
            Some(json!({"event_type": "a.b", "payload": "x".repeat(2000)})),
            413,
            "payload_too_large",
        ),
        (
            "POST",
            "/v1/apps/bad%20app/events",
            Some(json!({"event_type": "a.b", "payload": {}})),
            400,
            "invalid_id",
        ),
        (
            "POST",
            "/v1/apps/shop/endpoints",
            Some(json!({"url": "ftp://x"})),
            400,
            "invalid_url",
        ),
        (
            "POST",
            "/v1/apps/shop/endpoints",
            Some(json!({"url": "http://127.0.0.1:1/", "secret": "nope"})),
            400,
            "invalid_secret",
        ),
        (
            "GET",
            "/v1/apps/shop/deliveries/dlv_nope",
            None,
            400,
            "invalid_id",
        ),
        ("GET", "/v1/nothing", None, 404, "not_found"),
    ];
    for (method, path, body, want, code) in cases {
        let (status, _, json) = stack.call(method, path, body.clone(), &[]).await;
        assert_eq!(status, want, "{method} {path} {body:?} -> {json}");
        assert_eq!(error_code(&json).as_deref(), Some(code), "{json}");
    }
    // No key, wrong key.
    let request =
        hookline_ingest::apigw::http_request("GET", "/v1/apps/shop/endpoints", &[], None).unwrap();
    let response = hookline_ingest::handle(
        &stack.api,
        request,
        chrono::Utc::now(),
        &mut <rand::rngs::StdRng as rand::SeedableRng>::from_entropy(),
    )
    .await;
    assert_eq!(response.status().as_u16(), 401);
    let (status, _, _) = stack
        .call("GET", "/health", None, &[("authorization", "Bearer wrong")])
        .await;
    assert_eq!(status, 200, "health needs no key");
    // Nothing was written: no event, no endpoint.
    let (_, _, endpoints) = stack
        .call("GET", "/v1/apps/shop/endpoints", None, &[])
        .await;
    assert_eq!(endpoints["items"].as_array().unwrap().len(), 0);
    let scan = stack.scan().await;
    assert_eq!(scan.len(), 0, "bad input wrote items");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_to_250_endpoints_is_accepted_atomically_and_delivered_250_times() {
    // More endpoints than the default limit of an app.
    let stack = Stack::start(&[("WEBHOOKS_MAX_ENDPOINTS_PER_APP", "500")]).await;
    let receiver = Receiver::healthy().await;
    for i in 0..250 {
        stack
            .create_endpoint("big", &format!("{}?n={i}", receiver.url), &[])
            .await;
    }
    let (status, body) = stack
        .send_event(
            "big",
            "catalog.updated",
            json!({"sku": "A1"}),
            Some("fan-1"),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let ids: Vec<String> = delivery_ids(&body);
    assert_eq!(ids.len(), 250);
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 250);
    // The event committed with 98 deliveries inline and the rest as its fan-out list.
    let event_id = hookline_core::ids::EventId::parse(event_id(&body).as_str()).unwrap();
    let big = hookline_core::ids::AppId::parse("big").unwrap();
    let stored = hookline_pipeline::ports::Store::get_event(&stack.store, &big, &event_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        stored.fanout_remaining.len(),
        250 - hookline_pipeline::ports::INLINE_DELIVERIES
    );
    // Dispatch reads the bodies for its messages with one BatchGetItem: the
    // events that exist come back, an unknown id is left out.
    let unknown = hookline_core::ids::EventId::generate();
    let batch = hookline_pipeline::ports::Store::get_events(
        &stack.store,
        &[(big.clone(), unknown), (big.clone(), event_id.clone())],
    )
    .await
    .unwrap();
    assert_eq!(batch.len(), 1);
    assert_eq!(batch[0].event, stored.event);

    let ok = stack
        .pump_until(Duration::from_secs(240), || async {
            receiver.unique_accepted() >= 250
        })
        .await;
    assert!(ok, "only {} of 250 delivered", receiver.unique_accepted());
    for id in &ids {
        assert_eq!(
            status_of(&stack, id).await,
            DeliveryStatus::Delivered,
            "{id}"
        );
    }
    let stored = hookline_pipeline::ports::Store::get_event(&stack.store, &big, &event_id)
        .await
        .unwrap()
        .unwrap();
    assert!(stored.fanout_remaining.is_empty());
    let figures = format!(
        "fan-out 250: accepted 250 in one request, delivered {}, duplicates {}",
        receiver.unique_accepted(),
        receiver.duplicates()
    );
    println!("{figures}");
    hookline_tests::record_figures("fanout", &figures);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_routes_list_retry_rotate_patch_delete() {
    // No endpoint cache here, so the rotation is visible to the very next attempt
    // (deployed, deliver caches endpoints for WEBHOOKS_ENDPOINT_CACHE_TTL; the old
    // secret keeps verifying for the overlap, 24 h by default).
    let stack = Stack::start(&[
        ("WEBHOOKS_RETRY_SCHEDULE", "1s"),
        ("WEBHOOKS_MAX_ATTEMPTS", "1"),
        ("WEBHOOKS_ENDPOINT_CACHE_TTL", "0s"),
    ])
    .await;
    let good = Receiver::healthy().await;
    let bad = Receiver::start(vec![], Reply::Status(500)).await;
    let (good_id, good_secret) = stack.create_endpoint("ops", &good.url, &[]).await;
    let (bad_id, _) = stack.create_endpoint("ops", &bad.url, &["order.*"]).await;
    good.set_secret(&good_secret);
    let mut all = Vec::new();
    for i in 0..3 {
        let (_, body) = stack
            .send_event("ops", "order.paid", json!({"i": i}), None)
            .await;
        all.extend(delivery_ids(&body));
    }
    let (_, user) = stack
        .send_event("ops", "user.created", json!({}), None)
        .await;
    assert_eq!(delivery_ids(&user).len(), 1, "only the unfiltered endpoint");
    all.push(first_delivery(&user));
    assert_eq!(all.len(), 7);
    let settled = stack
        .pump_until(T, || async {
            let mut done = 0;
            for id in &all {
                if stack.delivery(id).await.status != DeliveryStatus::Pending {
                    done += 1;
                }
            }
            done == all.len()
        })
        .await;
    assert!(settled);

    let list = |q: &str| {
        let path = format!("/v1/apps/ops/deliveries{q}");
        let stack = &stack;
        async move {
            let (status, _, body) = stack.call("GET", &path, None, &[]).await;
            assert_eq!(status, 200, "{path}: {body}");
            view::<DeliveryList>(&body)
        }
    };
    assert_eq!(list("").await.items.len(), 7);
    let failed = list("?status=failed").await;
    assert_eq!(failed.items.len(), 3);
    assert!(failed
        .items
        .iter()
        .all(|d| d.status == "failed" && d.endpoint_id == bad_id));
    assert_eq!(
        list(&format!("?endpoint_id={good_id}")).await.items.len(),
        4
    );
    assert_eq!(list("?event_type=user.created").await.items.len(), 1);
    // Pagination: 3 pages of at most 3, newest first, no repeats, no gaps.
    let mut seen = Vec::new();
    let mut cursor = String::new();
    for _ in 0..5 {
        let page = list(&format!("?limit=3{cursor}")).await;
        seen.extend(page.items.into_iter().map(|d| d.id));
        match page.next_cursor {
            Some(c) => cursor = format!("&cursor={c}"),
            None => break,
        }
    }
    let mut sorted = seen.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    assert_eq!(seen, sorted, "newest first");
    sorted.dedup();
    assert_eq!(sorted.len(), 7, "every delivery exactly once: {seen:?}");
    let (status, _, err) = stack
        .call("GET", "/v1/apps/ops/deliveries?limit=0", None, &[])
        .await;
    assert_eq!(
        (status, error_code(&err).as_deref()),
        (400, Some("invalid_query"))
    );

    // Retry one failed delivery: 202, then 409 while it is pending.
    bad.set_fallback(Reply::Status(200));
    let target = failed.items[0].id.clone();
    let attempts_before = stack.delivery(&target).await.total_attempts;
    let (status, body) = stack.retry_delivery("ops", &target).await;
    assert_eq!(status, 202, "{body}");
    let (status, body) = stack.retry_delivery("ops", &target).await;
    assert_eq!(
        (status, error_code(&body).as_deref()),
        (409, Some("pending"))
    );
    assert!(stack.reaches(&target, DeliveryStatus::Delivered, T).await);
    // Delivered: the same route resends it, with the same webhook-id; the
    // attempt log counts on over the delivery's whole life.
    let posts = bad.received().len();
    let (status, body) = stack.retry_delivery("ops", &target).await;
    assert_eq!(status, 202, "{body}");
    assert!(
        stack
            .pump_until(T, || async { bad.received().len() == posts + 1 })
            .await
    );
    assert!(stack.reaches(&target, DeliveryStatus::Delivered, T).await);
    let got = bad.received();
    assert_eq!(
        got[posts].webhook_id,
        got[posts - 1].webhook_id,
        "resent: same webhook-id"
    );
    let resent = stack.delivery(&target).await;
    let numbers: Vec<u32> = resent.attempts.iter().map(|a| a.attempt).collect();
    let expected: Vec<u32> = (1..=resent.total_attempts)
        .skip(resent.total_attempts as usize - numbers.len())
        .collect();
    assert_eq!(numbers, expected, "numbered over the whole life");
    assert_eq!(resent.total_attempts, attempts_before + 2);
    hookline_tests::record_figures(
        "endpoint-health",
        &format!("resend: a delivered delivery resent through the retry route (202; 409 `pending` while pending): 1 more POST with the same webhook-id; its attempt log numbered {numbers:?} over its whole life (was: restarting at 1 after a retry)"),
    );

    // The event is readable; another app's is not.
    let event_id = stack.delivery(&target).await.event_id.to_string();
    let (status, _, event) = stack
        .call("GET", &format!("/v1/apps/ops/events/{event_id}"), None, &[])
        .await;
    assert_eq!(
        (status, event["event_type"].as_str()),
        (200, Some("order.paid"))
    );
    assert_eq!(
        stack
            .call(
                "GET",
                &format!("/v1/apps/other/events/{event_id}"),
                None,
                &[]
            )
            .await
            .0,
        404
    );

    // Rotation: the new secret signs, the old one still verifies during the overlap.
    let (status, rotated) = stack
        .endpoint_call("POST", "ops", &good_id, "/rotate-secret", None)
        .await;
    assert_eq!(status, 200);
    let new_secret = secret_of(&rotated);
    assert_ne!(new_secret, good_secret);
    let id = stack
        .send_one("ops", "user.created", json!({"after": "rotation"}))
        .await;
    assert!(stack.reaches(&id, DeliveryStatus::Delivered, T).await);
    let last = good.received().pop().unwrap();
    assert_eq!(
        last.headers["webhook-signature"].split(' ').count(),
        2,
        "two signatures during the overlap"
    );
    assert!(
        last.standard_ok && last.stripe_ok,
        "old secret still verifies"
    );
    good.set_secret(&new_secret);
    let id = stack.send_one("ops", "user.created", json!({"n": 2})).await;
    assert!(stack.reaches(&id, DeliveryStatus::Delivered, T).await);
    let last = good.received().pop().unwrap();
    assert!(last.standard_ok && last.stripe_ok, "new secret verifies");
    let (_, _, listed) = stack.call("GET", "/v1/apps/ops/endpoints", None, &[]).await;
    assert!(
        !listed.to_string().contains(&new_secret),
        "no secret in lists"
    );

    // PATCH disables; DELETE removes.
    let (status, patched) = stack
        .endpoint_call(
            "PATCH",
            "ops",
            &bad_id,
            "",
            Some(json!({"disabled": true, "event_types": ["order.refunded"]})),
        )
        .await;
    assert_eq!(
        (status, patched["disabled"].as_bool()),
        (200, Some(true)),
        "{patched}"
    );
    let (status, err) = stack
        .endpoint_call(
            "PATCH",
            "ops",
            &bad_id,
            "",
            Some(json!({"url": "ftp://nope"})),
        )
        .await;
    assert_eq!(
        (status, error_code(&err).as_deref()),
        (400, Some("invalid_url"))
    );
    assert_eq!(
        stack
            .endpoint_call("DELETE", "ops", &bad_id, "", None)
            .await
            .0,
        204
    );
    assert_eq!(
        stack.endpoint_call("GET", "ops", &bad_id, "", None).await.0,
        404
    );
    assert_eq!(
        stack
            .endpoint_call("DELETE", "ops", &bad_id, "", None)
            .await
            .0,
        404
    );
}

/// `POST /events/batch` on moto: every accepted event committed on its own
/// (real transactions) and delivered; a refused one writes nothing; a key
/// used before is replayed, not written twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_events_is_accepted_event_by_event_and_delivered() {
    let stack = Stack::start(&[]).await;
    let receiver = Receiver::healthy().await;
    stack.subscribe("shop", &receiver).await;
    let (status, single) = stack
        .send_event("shop", "order.paid", json!({"n": 0}), Some("order-0"))
        .await;
    assert_eq!(status, 202);
    let batch = json!({"events": [
        {"event_type": "order.paid", "payload": {"n": 1}, "idempotency_key": "order-1"},
        {"event_type": "order.paid", "payload": {"n": 0}, "idempotency_key": "order-0"},
        {"event_type": "not a type", "payload": {"n": 2}},
        {"event_type": "order.refunded", "payload": {"n": 3}},
    ]});
    let (status, _, body) = stack
        .call("POST", "/v1/apps/shop/events/batch", Some(batch), &[])
        .await;
    assert_eq!(status, 200, "{body}");
    let answer: hookline_ingest::views::BatchResponse = view(&body);
    let statuses: Vec<u16> = answer.items.iter().map(|i| i.status).collect();
    assert_eq!(statuses, [202, 202, 400, 202], "{body}");
    assert!(answer.items[1].replayed, "the key used before replays");
    assert_eq!(
        answer.items[1].event_id.as_deref(),
        Some(event_id(&single).as_str())
    );
    let new_ids: Vec<String> = [0, 3]
        .iter()
        .flat_map(|&i| answer.items[i].delivery_ids.clone().unwrap_or_default())
        .collect();
    assert_eq!(new_ids.len(), 2);
    let all: Vec<String> = new_ids
        .iter()
        .cloned()
        .chain([first_delivery(&single)])
        .collect();
    assert!(
        stack
            .pump_until_all(&all, DeliveryStatus::Delivered, T)
            .await
    );
    // Three events in the table (the refused one wrote nothing), three POSTs.
    let events = stack
        .scan()
        .await
        .iter()
        .filter(|i| {
            i.get("kind")
                .and_then(|k| k.as_s().ok())
                .map(String::as_str)
                == Some("event")
        })
        .count();
    assert_eq!(events, 3);
    assert_eq!(receiver.received().len(), 3);
}
