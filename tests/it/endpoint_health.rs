//! Endpoint health and receiver protection: custom headers (sent on every
//! attempt, sealed at rest, credential-like values masked in answers).

use std::time::Duration;

use hookline_core::model::DeliveryStatus;
use hookline_tests::receiver::{Receiver, Reply};
use hookline_tests::stack::Stack;
use hookline_tests::{record_figures, secret_of};
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_headers_arrive_on_every_attempt_sealed_at_rest_masked_in_answers() {
    // Deliver caches endpoints for WEBHOOKS_ENDPOINT_CACHE_TTL: a change
    // reaches it within that time.
    let stack = Stack::start(&[
        ("WEBHOOKS_RETRY_SCHEDULE", "1s"),
        ("WEBHOOKS_ENDPOINT_CACHE_TTL", "1s"),
    ])
    .await;
    let cache_ttl = Duration::from_millis(1100);
    let receiver = Receiver::start(vec![Reply::Status(503)], Reply::Status(200)).await;
    let token = "Bearer tok_9f8e7d6c5b4a3";
    let create = |headers: serde_json::Value| {
        let stack = &stack;
        let url = receiver.url.clone();
        async move {
            let (status, _, body) = stack
                .call(
                    "POST",
                    "/v1/apps/shop/endpoints",
                    Some(json!({"url": url, "headers": headers})),
                    &[],
                )
                .await;
            (status, body)
        }
    };
    // Refused: reserved names, a header injection, a bad name; the error
    // names the header, never its value; nothing is created.
    for bad in [
        json!({"Webhook-Id": "msg_forged"}),
        json!({"content-type": "text/plain"}),
        json!({"X-Smuggle": "ok\r\nX-Injected: yes"}),
        json!({"Bad Name": "v"}),
    ] {
        let (status, body) = create(bad.clone()).await;
        assert_eq!(status, 400, "{bad} -> {body}");
        assert_eq!(body["error"]["code"], "invalid_headers", "{body}");
        assert!(!body.to_string().contains("msg_forged") && !body.to_string().contains("Injected"));
    }
    let (_, _, list) = stack
        .call("GET", "/v1/apps/shop/endpoints", None, &[])
        .await;
    assert_eq!(list["items"].as_array().map(Vec::len), Some(0));

    let (status, ep) = create(json!({"Authorization": token, "X-Tenant": "acme"})).await;
    assert_eq!(status, 201, "{ep}");
    assert_eq!(
        ep["headers"],
        json!({"Authorization": "********", "X-Tenant": "acme"})
    );
    receiver.set_secret(&secret_of(&ep));
    let id = ep["id"].as_str().unwrap().to_owned();
    let (_, _, list) = stack
        .call("GET", "/v1/apps/shop/endpoints", None, &[])
        .await;
    assert!(!list.to_string().contains("tok_9f8e7d6c5b4a3"), "{list}");
    assert_eq!(list["items"][0]["headers"]["Authorization"], "********");

    // Sealed at rest: not in a table scan (an export) nor in the stream.
    let items = stack.scan().await;
    let dump = format!("{items:?}");
    assert!(
        !dump.contains("tok_9f8e7d6c5b4a3"),
        "a header credential is readable in the table"
    );
    let stored = items
        .iter()
        .find_map(|i| i.get("headers").and_then(|h| h.as_m().ok()))
        .and_then(|h| h.get("Authorization"))
        .and_then(|v| v.as_s().ok())
        .expect("the endpoint item has its headers");
    assert!(stored.starts_with("sealed:v1:"), "sealed under the KMS key");
    let stream = stack.next_stream_event().await.unwrap().to_string();
    assert!(
        !stream.contains("tok_9f8e7d6c5b4a3"),
        "readable in the stream"
    );

    // Sent on every attempt: a 503, then the retry delivered.
    let first = stack.send_one("shop", "order.paid", json!({"n": 1})).await;
    assert!(stack.reaches(&first, DeliveryStatus::Delivered, T).await);
    let got = receiver.received();
    assert_eq!(got.len(), 2, "attempt 1 (503) and 2 (200)");
    for r in &got {
        assert_eq!(
            r.headers.get("authorization").map(String::as_str),
            Some(token)
        );
        assert_eq!(r.headers.get("x-tenant").map(String::as_str), Some("acme"));
        assert!(
            r.standard_ok && r.stripe_ok,
            "the signature headers are hookline's"
        );
    }

    // PATCH: a masked value keeps the stored one; another header changes.
    let (status, patched) = stack
        .endpoint_call(
            "PATCH",
            "shop",
            &id,
            "",
            Some(json!({"headers": {"Authorization": "********", "X-Tenant": "beta"}})),
        )
        .await;
    assert_eq!(status, 200, "{patched}");
    assert_eq!(patched["headers"]["X-Tenant"], "beta");
    tokio::time::sleep(cache_ttl).await;
    let second = stack.send_one("shop", "order.paid", json!({"n": 2})).await;
    assert!(stack.reaches(&second, DeliveryStatus::Delivered, T).await);
    let last = receiver.received().pop().unwrap();
    assert_eq!(
        last.headers.get("authorization").map(String::as_str),
        Some(token)
    );
    assert_eq!(
        last.headers.get("x-tenant").map(String::as_str),
        Some("beta")
    );

    // `{}` removes them all.
    let (status, cleared) = stack
        .endpoint_call("PATCH", "shop", &id, "", Some(json!({"headers": {}})))
        .await;
    assert_eq!((status, &cleared["headers"]), (200, &json!({})));
    tokio::time::sleep(cache_ttl).await;
    let third = stack.send_one("shop", "order.paid", json!({"n": 3})).await;
    assert!(stack.reaches(&third, DeliveryStatus::Delivered, T).await);
    let last = receiver.received().pop().unwrap();
    assert!(!last.headers.contains_key("authorization") && !last.headers.contains_key("x-tenant"));
    record_figures(
        "endpoint-health",
        "custom headers: 4/4 bad header sets refused (400 invalid_headers, value never echoed); sent on 4/4 requests (incl. the retry after a 503) next to valid signatures; credential value sealed at rest (0 in the table scan and the stream), masked in create/list answers, kept by a masked PATCH, removed by `{}`",
    );
}

/// An endpoint that answers nothing but 500 is disabled once it has failed
/// for `WEBHOOKS_DISABLE_AFTER` with no 2xx in between; its pending delivery
/// then ends `failed` ("endpoint disabled") with a DLQ copy, recoverable; new
/// events skip it. Re-enabling clears the streak. (A 2xx ending a streak:
/// `pipeline::deliver` unit test, with given times.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_failing_too_long_is_disabled_and_its_pending_deliveries_fail() {
    let stack = Stack::start(&[
        ("WEBHOOKS_RETRY_SCHEDULE", "1s"),
        ("WEBHOOKS_MAX_ATTEMPTS", "20"),
        ("WEBHOOKS_DISABLE_AFTER", "3s"),
        ("WEBHOOKS_ENDPOINT_CACHE_TTL", "1s"),
    ])
    .await;
    let dead = Receiver::start(vec![], Reply::Status(500)).await;
    let healthy = Receiver::healthy().await;
    // The operator's own receiver of operational webhooks.
    let operator = Receiver::healthy().await;
    stack.subscribe("_operational", &operator).await;
    let (dead_id, _) = stack.subscribe("ops", &dead).await;
    let (healthy_id, _) = stack.subscribe("ops", &healthy).await;
    let (status, body) = stack
        .send_event("ops", "order.paid", json!({"n": 1}), None)
        .await;
    assert_eq!(status, 202, "{body}");
    let ids: Vec<String> = body["delivery_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    let mut doomed = None;
    for id in &ids {
        if stack
            .reaches(id, DeliveryStatus::Delivered, Duration::from_secs(5))
            .await
        {
            continue;
        }
        doomed = Some(id.clone());
    }
    let doomed = doomed.expect("the dead endpoint's delivery");
    assert!(stack.reaches(&doomed, DeliveryStatus::Failed, T).await);
    let (_, ep) = stack.endpoint_call("GET", "ops", &dead_id, "", None).await;
    assert_eq!(ep["disabled"], true, "{ep}");
    let reason = ep["disabled_reason"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(reason.contains("no 2xx answer since"), "{reason}");
    let d = stack.delivery(&doomed).await;
    let last = d.attempts.last().unwrap();
    assert_eq!(last.error.as_deref(), Some("endpoint disabled"), "{d:?}");
    assert!(
        d.total_attempts >= 4,
        "failed for 3 s at 1 s intervals: {d:?}"
    );
    let (status, _, dlq) = stack.call("GET", "/v1/dlq", None, &[]).await;
    assert_eq!(status, 200, "{dlq}");
    assert!(
        dlq["depth"].as_u64().is_some_and(|n| n >= 1),
        "a DLQ copy: {dlq}"
    );
    // The healthy endpoint of the same app is untouched; a new event skips
    // the disabled one.
    let (_, ok) = stack
        .endpoint_call("GET", "ops", &healthy_id, "", None)
        .await;
    assert_eq!(ok["disabled"], false, "{ok}");
    let (status, body) = stack
        .send_event("ops", "order.paid", json!({"n": 2}), None)
        .await;
    assert_eq!(
        (status, body["delivery_ids"].as_array().map(Vec::len)),
        (202, Some(1)),
        "{body}"
    );

    // Re-enabled: the streak starts over; the failed delivery is recoverable.
    let (status, ep) = stack
        .endpoint_call(
            "PATCH",
            "ops",
            &dead_id,
            "",
            Some(json!({"disabled": false})),
        )
        .await;
    assert_eq!(status, 200, "{ep}");
    assert!(
        ep.get("failing_since").is_none() && ep.get("disabled_reason").is_none(),
        "{ep}"
    );
    let (status, _) = stack.retry_delivery("ops", &doomed).await;
    assert_eq!(status, 202);

    // The operator's receiver got each change once, signed by the pipeline:
    // endpoint.disabled, delivery.failed, endpoint.enabled (in that order).
    stack
        .local
        .pump_until(T, || async { operator.received().len() >= 3 })
        .await;
    let announced: Vec<(String, Value, bool)> = operator
        .received()
        .iter()
        .map(|r| {
            let body: Value = serde_json::from_slice(&r.body).unwrap();
            (
                body["type"].as_str().unwrap_or_default().to_owned(),
                body["data"].clone(),
                r.standard_ok,
            )
        })
        .collect();
    let types: Vec<&str> = announced.iter().map(|(t, _, _)| t.as_str()).collect();
    assert_eq!(
        types,
        ["endpoint.disabled", "delivery.failed", "endpoint.enabled"],
        "{announced:?}"
    );
    assert!(
        announced.iter().all(|(_, _, signed)| *signed),
        "{announced:?}"
    );
    assert_eq!(
        announced[0].1,
        json!({"app_id": "ops", "endpoint_id": dead_id, "reason": reason})
    );
    assert_eq!(
        announced[1].1,
        json!({"app_id": "ops", "delivery_id": doomed, "endpoint_id": dead_id,
            "event_id": d.event_id.to_string(), "event_type": "order.paid",
            "attempts": d.total_attempts, "last_error": "endpoint disabled"})
    );
    assert_eq!(
        announced[2].1,
        json!({"app_id": "ops", "endpoint_id": dead_id})
    );
    // The operational app takes the admin key only.
    let (status, _, body) = stack
        .call(
            "POST",
            "/v1/apps/_operational/api-keys",
            Some(json!({})),
            &[],
        )
        .await;
    assert_eq!(status, 400, "{body}");
    record_figures(
        "endpoint-health",
        &format!("auto-disable (WEBHOOKS_DISABLE_AFTER 3s, always-500 endpoint): disabled after {} attempts, reason \"{reason}\"; its pending delivery failed (\"endpoint disabled\") with a DLQ copy, retry accepted after re-enabling; new events skip it; the app's healthy endpoint untouched", d.total_attempts),
    );
    record_figures(
        "endpoint-health",
        "operational webhooks: the `_operational` app's receiver got endpoint.disabled, delivery.failed and endpoint.enabled once each, in order, with valid signatures and the DESIGN.md payloads",
    );
}

/// `GET .../endpoints/{id}/stats` matches what the receivers saw: counts
/// of deliveries ended delivered and failed, the gauge of deliveries waiting
/// for a retry (while one waits, and 0 after), requests sent and answered
/// 2xx, latency percentiles within the histogram's 25 %; read from counters
/// per hour, never a scan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_stats_match_what_the_receivers_saw() {
    let stack = Stack::start(&[
        ("WEBHOOKS_RETRY_SCHEDULE", "3s"),
        ("WEBHOOKS_MAX_ATTEMPTS", "2"),
    ])
    .await;
    // Every request waits 150 ms; the second event's first attempt is a 500.
    let slow = Receiver::start(
        vec![Reply::Slow(Duration::from_millis(150)), Reply::Status(500)],
        Reply::Slow(Duration::from_millis(150)),
    )
    .await;
    let dead = Receiver::start(vec![], Reply::Status(503)).await;
    let (slow_id, _) = stack.subscribe("stats", &slow).await;
    let (dead_id, _) = stack.subscribe("stats", &dead).await;
    let stats = |ep: String| {
        let stack = &stack;
        async move {
            let (status, body) = stack
                .endpoint_call("GET", "stats", &ep, "/stats", None)
                .await;
            assert_eq!(status, 200, "{body}");
            body
        }
    };
    let mut ids = Vec::new();
    for n in 0..2 {
        let (status, body) = stack
            .send_event("stats", "order.paid", json!({"n": n}), None)
            .await;
        assert_eq!(status, 202, "{body}");
        ids.extend(
            body["delivery_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_owned()),
        );
        // In order: the scripted 500 is the second event's.
        stack
            .local
            .pump_until(T, || async { slow.received().len() > n })
            .await;
    }
    // While the slow endpoint's second delivery waits for its retry (and
    // both of the dead one's do), the gauges say so.
    let waiting = stack
        .local
        .pump_until(T, || async {
            stats(slow_id.clone()).await["pending"] == 1
                && stats(dead_id.clone()).await["pending"] == 2
        })
        .await;
    assert!(
        waiting,
        "{} {}",
        stats(slow_id.clone()).await,
        stats(dead_id.clone()).await
    );
    let ended = stack
        .local
        .pump_until(T, || async {
            for id in &ids {
                if stack.delivery(id).await.status == DeliveryStatus::Pending {
                    return false;
                }
            }
            true
        })
        .await;
    assert!(ended, "every delivery ended");
    let s = stats(slow_id.clone()).await;
    assert_eq!(slow.received().len(), 3, "two events, one retried");
    assert_eq!(
        (
            &s["delivered"],
            &s["failed"],
            &s["pending"],
            &s["attempts"],
            &s["attempts_ok"]
        ),
        (&json!(2), &json!(0), &json!(0), &json!(3), &json!(2)),
        "{s}"
    );
    assert_eq!(s["success_rate"], 1.0, "{s}");
    // The two slow answers took >= 150 ms; the 500 came at once.
    let p95 = s["latency_ms"]["p95"].as_u64().unwrap();
    assert!((150..=1000).contains(&p95), "{s}");
    let d = stats(dead_id.clone()).await;
    assert_eq!(
        dead.received().len(),
        4,
        "two deliveries, two attempts each"
    );
    assert_eq!(
        (
            &d["delivered"],
            &d["failed"],
            &d["pending"],
            &d["attempts"],
            &d["attempts_ok"]
        ),
        (&json!(0), &json!(2), &json!(0), &json!(4), &json!(0)),
        "{d}"
    );
    assert_eq!(d["success_rate"], 0.0, "{d}");
    // A window starting in the next hour has nothing yet; bad windows are 400s.
    let next_hour = (chrono::Utc::now() + chrono::TimeDelta::hours(1)).to_rfc3339();
    for bad in [next_hour.as_str(), "2020-01-01T00:00:00Z", "yesterday"] {
        let (status, body) = stack
            .endpoint_call(
                "GET",
                "stats",
                &slow_id,
                &format!("/stats?since={}", bad.replace('+', "%2B")),
                None,
            )
            .await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
    let (status, _) = stack
        .endpoint_call(
            "GET",
            "stats",
            &"ep_01m8yqy78hff49fqq91dxt59je",
            "/stats",
            None,
        )
        .await;
    assert_eq!(status, 404);
    record_figures(
        "endpoint-health",
        &format!("endpoint stats: slow endpoint {s}; always-503 endpoint {d}; both match the receivers' logs (3 and 4 requests), pending seen at 1 and 2 while retries waited"),
    );
}
