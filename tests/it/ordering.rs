//! Ordering per key on moto: a receiver failing 30 % of requests at
//! random across 10 keys x 20 events, one key stuck on a dead message.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use hookline_core::ids::{DeliveryId, MessageId};
use hookline_core::model::DeliveryStatus;
use hookline_tests::receiver::{Received, Receiver};
use hookline_tests::stack::Stack;
use serde_json::{json, Value};

const KEYS: usize = 10;
const EVENTS_PER_KEY: usize = 20;

/// Each key's events reach the receiver in the order they were accepted:
/// an event's first request comes after its predecessor's 2xx, whatever
/// the random failures; the dead message holds back its own key only
/// (the nine others finish while it still retries, its key's next
/// delivery shows `blocked_by` it and was never sent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_keys_deliveries_arrive_in_order_and_a_dead_message_holds_back_only_its_key() {
    let _alone = hookline_tests::WALL_CLOCK.lock().await;
    // Random failures at most twice per message (3 attempts at most); the
    // dead message's sixth attempt waits 5 minutes: still pending at the end.
    let stack = Stack::start(&[("WEBHOOKS_RETRY_SCHEDULE", "1s,1s,1s,1s,1s,300s")]).await;
    let receiver = Receiver::flaky(36, 0.3, 2, r#""dead":true"#).await;
    stack.subscribe("ordered", &receiver).await;

    // ids[key][n]: the delivery of key `key`'s event `n`. Half the rounds
    // go as one batch (one event per key), half as concurrent singles.
    let mut ids: Vec<Vec<String>> = vec![Vec::new(); KEYS];
    for n in 0..EVENTS_PER_KEY {
        let event = |key: usize| {
            json!({
                "event_type": "order.updated",
                "payload": {"key": key, "n": n, "dead": key == 0 && n == 0},
                "ordering_key": format!("order-{key}"),
            })
        };
        if n % 2 == 0 {
            let batch = json!({"events": (0..KEYS).map(event).collect::<Vec<_>>()});
            let (status, _, body) = stack
                .call("POST", "/v1/apps/ordered/events/batch", Some(batch), &[])
                .await;
            assert_eq!(status, 200, "{body}");
            let answer: hookline_ingest::views::BatchResponse = hookline_tests::view(&body);
            for (key, item) in answer.items.into_iter().enumerate() {
                assert_eq!(item.status, 202, "{body}");
                let delivery = item.delivery_ids.and_then(|d| d.into_iter().next());
                ids[key].push(delivery.expect("one delivery"));
            }
        } else {
            let sends = (0..KEYS).map(|key| {
                let path = "/v1/apps/ordered/events";
                let event = event(key);
                let stack = &stack;
                async move { stack.call("POST", path, Some(event), &[]).await }
            });
            for (key, (status, _, body)) in futures::future::join_all(sends)
                .await
                .into_iter()
                .enumerate()
            {
                assert_eq!(status, 202, "{body}");
                ids[key].push(hookline_tests::first_delivery(&body));
            }
        }
    }

    // The nine live keys finish while the dead message still retries.
    let live: Vec<String> = ids[1..].iter().flatten().cloned().collect();
    let started = Instant::now();
    assert!(
        stack
            .pump_until_all(&live, DeliveryStatus::Delivered, Duration::from_secs(240))
            .await,
        "the live keys' deliveries did not all arrive"
    );
    let took = started.elapsed();
    let received = receiver.received();
    let by_id = requests_by_webhook_id(&received);
    let webhook_id = |id: &str| {
        MessageId::for_delivery(&DeliveryId::parse(id).expect("a delivery id")).to_string()
    };

    // Per key: each event's first request after its predecessor's 2xx.
    let mut pairs = 0;
    for chain in &ids[1..] {
        for pair in chain.windows(2) {
            let earlier = &by_id[&webhook_id(&pair[0])];
            let later = &by_id[&webhook_id(&pair[1])];
            let ok = earlier
                .iter()
                .find(|r| (200..300).contains(&r.answered))
                .expect("the earlier one was delivered");
            assert!(
                later[0].at > ok.at,
                "{} went before its predecessor {} was delivered",
                pair[1],
                pair[0]
            );
            pairs += 1;
        }
    }
    let failures = received.iter().filter(|r| r.answered >= 500).count();
    // A successor registering on its predecessor is no state change of
    // the predecessor's: it is not queued (and sent) a second time.
    assert_eq!(receiver.duplicates(), 0, "a delivery got two 2xx");

    // The dead key: its head still pending, the next blocked by it, never sent.
    let dead = stack.delivery(&ids[0][0]).await;
    assert_eq!(dead.status, DeliveryStatus::Pending);
    assert!(dead.attempt_count >= 5, "{}", dead.attempt_count);
    let (status, _, next) = stack
        .call(
            "GET",
            &format!("/v1/apps/ordered/deliveries/{}", ids[0][1]),
            None,
            &[],
        )
        .await;
    assert_eq!(status, 200, "{next}");
    assert_eq!(next["ordering_key"], "order-0");
    assert_eq!(next["blocked_by"], Value::String(ids[0][0].clone()));
    assert_eq!(next["status"], "pending");
    for id in &ids[0][1..] {
        assert!(
            !by_id.contains_key(&webhook_id(id)),
            "{id} was sent past the dead message"
        );
    }
    let (_, _, head) = stack
        .call(
            "GET",
            &format!("/v1/apps/ordered/deliveries/{}", ids[1][1]),
            None,
            &[],
        )
        .await;
    assert_eq!(
        (head["ordering_key"].as_str(), &head["blocked_by"]),
        (Some("order-1"), &Value::Null)
    );

    hookline_tests::record_figures(
        "ordering",
        &format!(
            "ordering per key (moto, 30 % random 500s): {KEYS} keys x {EVENTS_PER_KEY} events, {} requests ({failures} answered 500), {pairs} consecutive pairs of 9 live keys checked, 0 out of order; the live keys' {} deliveries done in {:.1} s while key 0's dead message held back only its own 19",
            received.len(),
            live.len(),
            took.as_secs_f64()
        ),
    );
}

/// Requests by webhook id, in arrival order.
fn requests_by_webhook_id(received: &[Received]) -> HashMap<String, Vec<Received>> {
    let mut by_id: HashMap<String, Vec<Received>> = HashMap::new();
    for r in received {
        by_id
            .entry(r.webhook_id.clone())
            .or_default()
            .push(r.clone());
    }
    by_id
}
