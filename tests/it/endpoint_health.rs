//! Endpoint health and receiver protection: custom headers (sent on every
//! attempt, sealed at rest, credential-like values masked in answers),
//! auto-disable and operational webhooks, stats, replay missing.

use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
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
    assert!(stored.starts_with("sealed:v2:"), "sealed under the KMS key");
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

/// The data of every webhook `receiver` accepted, as `n`s, sorted; and
/// whether each of them verified (both signature schemes).
fn received_ns(receiver: &Receiver) -> (Vec<i64>, bool) {
    let got = receiver.accepted();
    let verified = got.iter().all(|r| r.standard_ok && r.stripe_ok);
    let mut ns: Vec<i64> = got
        .iter()
        .map(|r| {
            let body: Value = serde_json::from_slice(&r.body).expect("a JSON webhook");
            body["data"]["n"].as_i64().expect("the test's payload")
        })
        .collect();
    ns.sort_unstable();
    (ns, verified)
}

/// Replay missing: events sent before the endpoint existed and while it was
/// disabled (none of them listed it), of the types it subscribes to, reach
/// it once, signed, on `POST .../replay`; one it had, another type, another
/// app and the window's edges do not; a second replay replays 0; progress
/// at `status_url`; bad input 400, a disabled endpoint 409, unknown 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_sends_exactly_the_events_the_endpoint_missed() {
    let stack = Stack::start(&[]).await;
    let receiver = Receiver::healthy().await;
    let send = |app: &'static str, kind: &'static str, n: i64| {
        let stack = &stack;
        async move {
            let (status, body) = stack.send_event(app, kind, json!({"n": n}), None).await;
            assert_eq!(status, 202, "{body}");
            body
        }
    };
    let outside = send("replay", "order.paid", 0).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let since = chrono::Utc::now();
    // Before the endpoint existed (no endpoint at all: nothing listed).
    send("replay", "order.paid", 1).await;
    send("replay", "user.created", 100).await;
    send("other-app", "order.paid", 200).await;
    let (id, secret) = stack
        .create_endpoint("replay", &receiver.url, &["order.*"])
        .await;
    receiver.set_secret(&secret);
    // Had it: delivered live, never again.
    let live = send("replay", "order.paid", 2).await;
    let live_delivery = hookline_tests::first_delivery(&live);
    assert!(
        stack
            .reaches(&live_delivery, DeliveryStatus::Delivered, T)
            .await
    );
    // While disabled: accepted, not listed for it.
    let (status, _) = stack
        .endpoint_call("PATCH", "replay", &id, "", Some(json!({"disabled": true})))
        .await;
    assert_eq!(status, 200);
    for n in [3, 4] {
        let body = send("replay", "order.shipped", n).await;
        assert_eq!(body["delivery_ids"], json!([]), "{body}");
    }
    let replay = |body: Value| {
        let stack = &stack;
        let id = id.clone();
        async move {
            stack
                .endpoint_call("POST", "replay", &id, "/replay", Some(body))
                .await
        }
    };
    let window = json!({"since": since.to_rfc3339()});
    let (status, body) = replay(window.clone()).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (409, &json!("conflict")),
        "{body}"
    );
    let (status, _) = stack
        .endpoint_call("PATCH", "replay", &id, "", Some(json!({"disabled": false})))
        .await;
    assert_eq!(status, 200);
    let until = chrono::Utc::now();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let after = send("replay", "order.paid", 5).await; // outside the window
    let new_delivery = hookline_tests::first_delivery(&after);

    // Bad input loses nothing and says why.
    let since_s = since.to_rfc3339();
    for bad in [
        json!({}),
        json!({"since": "yesterday"}),
        json!({"since": until.to_rfc3339(), "until": since_s}),
        json!({"since": since_s, "extra": 1}),
    ] {
        let (status, body) = replay(bad.clone()).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
    let (status, _) = stack
        .endpoint_call(
            "POST",
            "replay",
            &"ep_01m8yqy78hff49fqq91dxt59je",
            "/replay",
            Some(window.clone()),
        )
        .await;
    assert_eq!(status, 404);

    let bounded = json!({"since": since_s, "until": until.to_rfc3339()});
    let (status, first) = replay(bounded.clone()).await;
    assert_eq!(status, 202, "{first}");
    assert_eq!(
        (&first["complete"], &first["replayed"], &first["scanned"]),
        (&json!(true), &json!(3), &json!(5)),
        "{first}"
    );
    let done = stack
        .local
        .pump_until(T, || async { receiver.accepted().len() >= 5 })
        .await;
    assert!(done, "{:?}", received_ns(&receiver));
    assert!(
        stack
            .reaches(&new_delivery, DeliveryStatus::Delivered, T)
            .await
    );
    // Let anything extra arrive before counting.
    stack
        .local
        .pump_until(Duration::from_secs(3), || async { false })
        .await;
    let (ns, verified) = received_ns(&receiver);
    assert_eq!(ns, [1, 2, 3, 4, 5], "the live two and the missed three");
    assert!(verified, "replayed webhooks are signed like any other");
    assert_eq!(receiver.duplicates(), 0);

    let (status, again) = replay(bounded.clone()).await;
    assert_eq!(status, 202, "{again}");
    assert_eq!(
        (&again["complete"], &again["replayed"]),
        (&json!(true), &json!(0))
    );
    // From before the first event: only that one is new.
    let wider = json!({"since": (since - chrono::TimeDelta::seconds(60)).to_rfc3339()});
    let (_, wide) = replay(wider).await;
    assert_eq!(wide["replayed"], 1, "{wide} (outside: {outside})");
    // A window starting at an event's exact creation time (finer than its
    // id's millisecond) holds it: replaying from `outside`'s own time finds
    // it (already replayed above: 0 new, but scanned).
    let outside_id = hookline_tests::event_id(&outside);
    let (status, _, stored) = stack
        .call(
            "GET",
            &format!("/v1/apps/replay/events/{outside_id}"),
            None,
            &[],
        )
        .await;
    assert_eq!(status, 200, "{stored}");
    let exact = json!({"since": stored["created_at"], "until": since_s});
    let (_, from_exact) = replay(exact).await;
    assert_eq!(
        (&from_exact["scanned"], &from_exact["replayed"]),
        (&json!(1), &json!(0)),
        "{from_exact} ({stored})"
    );
    let status_url = first["status_url"].as_str().unwrap().to_owned();
    let (status, _, progress) = stack.call("GET", &status_url, None, &[]).await;
    assert_eq!(status, 200, "{progress}");
    assert_eq!(
        progress, first,
        "the stored replay is what the call answered"
    );
    let (status, _, _) = stack
        .call(
            "GET",
            &status_url.replace("/replay/", "/other-app/"),
            None,
            &[],
        )
        .await;
    assert_eq!(status, 404, "another app's path does not find it");
    stack
        .local
        .pump_until(T, || async { receiver.accepted().len() >= 6 })
        .await;
    let (ns, _) = received_ns(&receiver);
    assert_eq!(ns, [0, 1, 2, 3, 4, 5]);
    record_figures(
        "endpoint-health",
        &format!("replay missing: 5 events in the window, 3 never had by the endpoint (before it existed, while disabled) replayed once and signed, 0 duplicates; a second replay of the window replayed 0; a wider window 1 more; 4/4 bad bodies 400, disabled 409, unknown endpoint 404; answer {first}"),
    );
}

/// A replay the call does not finish (`WEBHOOKS_REPLAY_INLINE_BUDGET=0s`:
/// none of it) continues in the background through the stream; one whose
/// stream record is lost is continued by the reconciler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_continues_in_the_background_and_the_reconciler_resumes_a_stalled_one() {
    let stack = Stack::start(&[("WEBHOOKS_REPLAY_INLINE_BUDGET", "0s")]).await;
    let since = chrono::Utc::now() - chrono::TimeDelta::seconds(1);
    for n in 0..3 {
        let (status, _) = stack
            .send_event("bg", "order.paid", json!({"n": n}), None)
            .await;
        assert_eq!(status, 202);
    }
    let window = json!({"since": since.to_rfc3339()});
    let start = |id: String| {
        let stack = &stack;
        let window = window.clone();
        async move {
            let (status, body) = stack
                .endpoint_call("POST", "bg", &id, "/replay", Some(window))
                .await;
            assert_eq!(status, 202, "{body}");
            assert_eq!(
                (&body["complete"], &body["replayed"]),
                (&json!(false), &json!(0)),
                "the call left it all to the background: {body}"
            );
            body["status_url"].as_str().unwrap().to_owned()
        }
    };

    // Through the stream: dispatch advances it.
    let streamed = Receiver::healthy().await;
    let (id, _) = stack.subscribe("bg", &streamed).await;
    let status_url = start(id).await;
    let done = stack
        .local
        .pump_until(T, || async { streamed.accepted().len() >= 3 })
        .await;
    assert!(done, "{:?}", received_ns(&streamed));
    let (_, _, progress) = stack.call("GET", &status_url, None, &[]).await;
    assert_eq!(
        (
            &progress["complete"],
            &progress["replayed"],
            &progress["scanned"]
        ),
        (&json!(true), &json!(3), &json!(3)),
        "{progress}"
    );
    assert_eq!(received_ns(&streamed), (vec![0, 1, 2], true));

    // Its stream record lost: the reconciler finds it running and overdue.
    let stalled = Receiver::healthy().await;
    let (id, _) = stack.subscribe("bg", &stalled).await;
    let status_url = start(id).await;
    let replay_id = status_url.rsplit('/').next().unwrap().to_owned();
    // Drops the stream records of the replay's item (a lost invocation).
    let drop_its_records = || {
        let stack = &stack;
        let replay_id = replay_id.clone();
        async move {
            for _ in 0..10 {
                let records = stack.local.next_stream_event().await.unwrap();
                if records.to_string().contains(&replay_id) {
                    return true;
                }
            }
            false
        }
    };
    assert!(
        drop_its_records().await,
        "the replay's stream record was dropped"
    );
    // Last advanced 20 minutes ago (past WEBHOOKS_RECONCILE_AFTER): that
    // write's record is dropped too.
    let long_ago = chrono::Utc::now() - chrono::TimeDelta::minutes(20);
    stack
        .set_attribute(
            &format!("RPL#{replay_id}"),
            "RPL",
            "GSI3SK",
            AttributeValue::S(hookline_aws::schema::due_sk(long_ago, &replay_id)),
        )
        .await;
    assert!(drop_its_records().await);
    stack
        .local
        .pump_until(Duration::from_secs(2), || async { false })
        .await;
    assert!(stalled.received().is_empty(), "nothing continued it");
    let (_, _, progress) = stack.call("GET", &status_url, None, &[]).await;
    assert_eq!(progress["complete"], false, "{progress}");
    let report = stack.local.reconcile().await.unwrap();
    assert_eq!(report.replays, 1, "{report:?}");
    let done = stack
        .local
        .pump_until(T, || async { stalled.accepted().len() >= 3 })
        .await;
    assert!(done, "{:?}", received_ns(&stalled));
    stack
        .local
        .pump_until(Duration::from_secs(2), || async { false })
        .await;
    assert_eq!(received_ns(&stalled), (vec![0, 1, 2], true));
    assert_eq!(received_ns(&streamed).0.len(), 3, "the first one untouched");
    let (_, _, progress) = stack.call("GET", &status_url, None, &[]).await;
    assert_eq!(
        (&progress["complete"], &progress["replayed"]),
        (&json!(true), &json!(3)),
        "{progress}"
    );
    record_figures(
        "endpoint-health",
        "replay in the background (inline budget 0s): continued by dispatch from the stream (3/3 delivered), and by the reconciler when its stream record was dropped (report.replays = 1, then 3/3 delivered); no duplicate",
    );
}

/// `rate_limit`: a burst of 12 events at an endpoint limited to 2 requests
/// per second arrives at most 2 in any wall-clock second, every delivery on
/// its first attempt (waiting is not failing); an unlimited endpoint of
/// another app sent the same burst at the same time gets all of it at once.
/// Bad limits are 400s; `null` removes the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_endpoint_gets_at_most_its_limit_per_second() {
    let stack = Stack::start(&[]).await;
    let limited = Receiver::healthy().await;
    let free = Receiver::healthy().await;
    // Wall-clock time of the receivers' `Instant`s.
    let anchor = (std::time::Instant::now(), chrono::Utc::now());
    let wall = |at: std::time::Instant| anchor.1 + (at - anchor.0);

    for bad in [json!(0), json!(1001), json!(-1), json!(1.5), json!("2")] {
        let (status, _, body) = stack
            .call(
                "POST",
                "/v1/apps/paced/endpoints",
                Some(json!({"url": limited.url, "rate_limit": bad})),
                &[],
            )
            .await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
    let (status, _, ep) = stack
        .call(
            "POST",
            "/v1/apps/paced/endpoints",
            Some(json!({"url": limited.url, "rate_limit": 2})),
            &[],
        )
        .await;
    assert_eq!((status, &ep["rate_limit"]), (201, &json!(2)), "{ep}");
    limited.set_secret(&secret_of(&ep));
    let limited_id = ep["id"].as_str().unwrap().to_owned();
    stack.subscribe("other", &free).await;

    let burst = 12;
    let mut ids = Vec::new();
    for n in 0..burst {
        for app in ["paced", "other"] {
            let (status, body) = stack
                .send_event(app, "order.paid", json!({"n": n}), None)
                .await;
            assert_eq!(status, 202, "{body}");
            if app == "paced" {
                ids.push(hookline_tests::first_delivery(&body));
            }
        }
    }
    let sent_at = std::time::Instant::now();
    let done = stack
        .local
        .pump_until(T, || async {
            limited.accepted().len() >= burst && free.accepted().len() >= burst
        })
        .await;
    assert!(
        done,
        "limited {} free {}",
        limited.accepted().len(),
        free.accepted().len()
    );
    let arrivals = limited.accepted();
    let mut per_second = std::collections::BTreeMap::<i64, usize>::new();
    for r in &arrivals {
        *per_second.entry(wall(r.at).timestamp()).or_default() += 1;
    }
    assert!(
        per_second.values().all(|&n| n <= 2),
        "more than 2 in a second: {per_second:?}"
    );
    assert!(arrivals.iter().all(|r| r.standard_ok && r.stripe_ok));
    assert_eq!(limited.duplicates(), 0);
    for id in &ids {
        let d = stack.delivery(id).await;
        assert_eq!(d.status, DeliveryStatus::Delivered);
        assert_eq!(
            (d.attempt_count, d.total_attempts),
            (1, 1),
            "delivered on its first attempt: {d:?}"
        );
    }
    let span = |got: &[hookline_tests::receiver::Received]| {
        let first = got.iter().map(|r| r.at).min().unwrap();
        let last = got.iter().map(|r| r.at).max().unwrap();
        (last - first).as_secs_f64()
    };
    let limited_span = span(&arrivals);
    let free_got = free.accepted();
    let free_last = free_got.iter().map(|r| r.at).max().unwrap();
    let limited_last = arrivals.iter().map(|r| r.at).max().unwrap();
    // 12 at 2/s: at least 5 s from first to last.
    assert!(limited_span >= 4.9, "{limited_span} s: {per_second:?}");
    assert!(
        free_last < limited_last,
        "the unlimited endpoint was not held up behind the limited one"
    );

    // `null` removes the limit.
    let (status, patched) = stack
        .endpoint_call(
            "PATCH",
            "paced",
            &limited_id,
            "",
            Some(json!({"rate_limit": null})),
        )
        .await;
    assert_eq!(status, 200, "{patched}");
    assert!(patched.get("rate_limit").is_none(), "{patched}");
    record_figures(
        "endpoint-health",
        &format!(
            "rate limit 2/s, burst of {burst}: arrivals per wall-clock second {:?} (max {}), first to last {limited_span:.1} s, every delivery on attempt 1; the unlimited endpoint sent the same burst got all {burst} in {:.1} s (last {:.1} s after the burst was accepted, the limited one's last {:.1} s); 5/5 bad limits 400",
            per_second.values().collect::<Vec<_>>(),
            per_second.values().max().unwrap(),
            span(&free_got),
            (free_last - sent_at.min(free_last)).as_secs_f64(),
            (limited_last - sent_at.min(limited_last)).as_secs_f64(),
        ),
    );
}

/// The DynamoDB limiter on the real wire protocol: a group takes
/// consecutive slots in one write, a wrong guess of the limiter's state
/// costs a write but never a slot, a new rate renumbers, and concurrent
/// reservations from several "instances" never share a slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dynamodb_rate_limiter_never_hands_out_a_slot_twice() {
    use hookline_aws::DynamoStore;
    use hookline_core::ids::EndpointId;
    use hookline_core::rate::slot_of;
    use hookline_pipeline::ports::Store;

    let stack = Stack::start(&[]).await;
    let store = DynamoStore::new(
        &stack.clients,
        stack.settings.table.clone(),
        stack.settings.retention,
    );
    let id = EndpointId::generate();
    // Far in the future so the limiter stays busy while the test runs.
    let now = chrono::Utc::now() + chrono::Duration::hours(1);
    let current = slot_of(now, 10);
    // New limiter, wrong guess (busy): still the slot of now, 3 of them.
    let first = store
        .reserve_send_slots(&id, 10, 3, true, now)
        .await
        .unwrap();
    assert_eq!(first, current);
    // Busy, wrong guess (idle): queued behind the group.
    let next = store
        .reserve_send_slots(&id, 10, 1, false, now)
        .await
        .unwrap();
    assert_eq!(next, current + 3);
    // Busy, right guess.
    let next = store
        .reserve_send_slots(&id, 10, 2, true, now)
        .await
        .unwrap();
    assert_eq!(next, current + 4);
    // Another rate renumbers from the slot of now.
    let renumbered = store
        .reserve_send_slots(&id, 4, 1, true, now)
        .await
        .unwrap();
    assert_eq!(renumbered, slot_of(now, 4));
    // Idle again much later: the slot of then.
    let later = now + chrono::Duration::minutes(5);
    let idle = store
        .reserve_send_slots(&id, 4, 1, true, later)
        .await
        .unwrap();
    assert_eq!(idle, slot_of(later, 4));

    // Four "instances" race, 5 groups of 2 each, guessing both ways.
    let fresh = EndpointId::generate();
    let tasks = (0..4).map(|i| {
        let store = store.clone();
        let fresh = fresh.clone();
        tokio::spawn(async move {
            let mut got = Vec::new();
            for j in 0..5 {
                let first = store
                    .reserve_send_slots(&fresh, 10, 2, (i + j) % 2 == 0, now)
                    .await
                    .unwrap();
                got.extend([first, first + 1]);
            }
            got
        })
    });
    let mut all: Vec<i64> = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort_unstable();
    assert_eq!(all, (current..current + 40).collect::<Vec<_>>());
}
