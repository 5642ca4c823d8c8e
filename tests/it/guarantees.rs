//! "Guaranteed, provably": the windows where a delivery could be lost,
//! corrupted, duplicated in bursts or stuck, each shown closed against moto
//! (real SDK clients and wire protocols) and real loopback receivers.

use hookline_tests::{delivery_ids, event_id, first_delivery, secret_of};
use std::time::Duration;

use hookline_core::ids::{AppId, DeliveryId};
use hookline_core::model::{DeliveryStatus, EventType};
use hookline_pipeline::ingest::plan_event;
use hookline_pipeline::ports::{CommitOutcome, Store};
use hookline_tests::receiver::{Receiver, Reply};
use hookline_tests::record_figures;
use hookline_tests::stack::{Stack, ADMIN_KEY};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::json;
use serde_json::value::RawValue;

const T: Duration = Duration::from_secs(60);

fn admin_headers(extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut headers = vec![
        ("authorization".to_owned(), format!("Bearer {ADMIN_KEY}")),
        ("content-type".to_owned(), "application/json".to_owned()),
    ];
    headers.extend(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    headers
}

/// The receiver gets the producer's payload text byte for byte as `data`:
/// integers beyond 64 bits, 30-digit decimals, exponents, escapes, key order
/// and spacing are not touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payload_reaches_the_receiver_byte_for_byte() {
    use aws_sdk_dynamodb::types::AttributeValue;
    let stack = Stack::start(&[]).await;
    let receiver = Receiver::healthy().await;
    let _ = stack.subscribe("shop", &receiver).await;
    let tricky = r#"{"id":12345678901234567890123,"amount":10.50,"small":1e2,
    "price": 0.100000000000000000000000000001 , "esc":"caf\u00e9 \"q\" \/","zz":[],"a":{"b":-0.0}}"#;
    // Short: stored as text. Longer: stored compressed (`body_z`); each
    // must reach the receiver unchanged.
    let long = format!(
        r#"{{"lines": [{}], "note": "ação ✓ \u2713"}}"#,
        vec![tricky; 30].join(" ,\n ")
    );
    let short = r#"{"id":12345678901234567890123, "x":1e2,"z":-0.0,"e":"\u00e9"}"#;
    for (payload, compressed) in [
        (short.to_owned(), false),
        (tricky.to_owned(), true),
        (long, true),
    ] {
        let before = receiver.received().len();
        let request = format!(r#"{{"event_type":"order.paid","payload":  {payload}  }}"#);
        let (status, _, body) = stack
            .raw_call(
                "POST",
                "/v1/apps/shop/events",
                &admin_headers(&[]),
                Some(&request),
            )
            .await;
        assert_eq!(status, 202, "{body}");
        let event_id = body["event_id"].as_str().expect("event id").to_owned();
        let (pk, sk) = Stack::event_key("shop", &event_id);
        let item = raw_item(&stack, &pk, &sk).await.expect("the event item");
        assert_eq!(
            (
                matches!(item.get("body_z"), Some(AttributeValue::B(_))),
                item.contains_key("body")
            ),
            (compressed, !compressed),
            "stored form of a {}-byte payload",
            payload.len()
        );
        let delivery_id = first_delivery(&body);
        let delivered = stack
            .pump_until_all(
                std::slice::from_ref(&delivery_id),
                DeliveryStatus::Delivered,
                T,
            )
            .await;
        assert!(delivered);
        let got = receiver.received();
        assert_eq!(got.len(), before + 1);
        let last = got.last().expect("one request");
        assert!(last.standard_ok && last.stripe_ok);
        let text = String::from_utf8(last.body.clone()).unwrap();
        let expected_tail = format!(r#","data":{payload}}}"#);
        assert!(
            text.ends_with(&expected_tail),
            "payload changed in flight:\n sent {payload}\n got {text}"
        );
        assert!(
            text.starts_with(r#"{"type":"order.paid","timestamp":""#),
            "{text}"
        );
    }
    record_figures(
        "payload",
        "payload bytes: an integer beyond 64 bits, a 30-digit decimal, 10.50, 1e2, -0.0, escapes, non-ASCII, key order and spacing reached the receiver byte for byte (both signatures valid), from an event item stored as text and from one stored compressed (body_z)",
    );
}

/// Seconds until `at` has passed by `after` (for overdue checks).
async fn sleep_until_overdue(at: chrono::DateTime<chrono::Utc>, after: Duration) {
    let after = chrono::Duration::from_std(after).expect("a short duration");
    let wait = (at + after - chrono::Utc::now())
        .to_std()
        .unwrap_or_default();
    tokio::time::sleep(wait + Duration::from_millis(300)).await;
}

/// The shortest the settings accept with the tests' 2 s delivery timeout
/// and a 7 s deliver function timeout (a batch of POSTs + 5 s).
const RECONCILE_AFTER: Duration = Duration::from_secs(7);
const RECONCILE_ENV: [(&str, &str); 2] = [
    ("WEBHOOKS_RECONCILE_AFTER", "7s"),
    ("WEBHOOKS_DELIVER_FUNCTION_TIMEOUT", "7s"),
];

/// The delivery queue is purged while a retry waits in it: without the
/// reconciler the delivery stays `pending` forever; with it, it arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciler_recovers_a_retry_lost_with_a_purged_queue() {
    let stack = Stack::start(&RECONCILE_ENV).await;
    let receiver = Receiver::start(vec![Reply::Status(503)], Reply::Status(200)).await;
    let _ = stack.subscribe("shop", &receiver).await;
    let (status, body) = stack
        .send_event("shop", "order.paid", json!({"n": 1}), None)
        .await;
    assert_eq!(status, 202);
    let id = first_delivery(&body);
    // Attempt 1 fails; the retry is scheduled (1 s) and queued by dispatch.
    assert!(
        stack
            .pump_until(T, || async { stack.delivery(&id).await.attempt_count == 1 })
            .await
    );
    stack.pump().await; // dispatch queues the delayed retry message
    stack.purge_delivery_queue().await;
    // The retry message is gone: nothing happens however long we pump.
    let delivered = stack
        .pump_until(Duration::from_secs(5), || async {
            stack.delivery(&id).await.status == DeliveryStatus::Delivered
        })
        .await;
    assert!(
        !delivered,
        "the purge did not lose the message; test is void"
    );
    let d = stack.delivery(&id).await;
    assert_eq!((d.status, d.attempt_count), (DeliveryStatus::Pending, 1));
    sleep_until_overdue(d.next_attempt_at.unwrap(), RECONCILE_AFTER).await;
    let report = stack.reconcile().await.unwrap();
    assert_eq!(report.requeued, 1, "{report:?}");
    assert!(stack.reaches(&id, DeliveryStatus::Delivered, T).await);
    let got = receiver.received();
    assert_eq!(got.len(), 2, "attempt 1 (503) + the re-queued attempt 2");
    assert!(got.iter().all(|r| r.standard_ok && r.stripe_ok));
    assert_eq!(got[0].body, got[1].body);
    // Idempotent with the normal path: nothing is overdue any more.
    let again = stack.reconcile().await.unwrap();
    assert_eq!((again.overdue, again.requeued), (0, 0));
    record_figures(
        "reconciler",
        "queue purged while a retry waited: 1/1 delivered by the reconciler, 0 lost, 0 duplicates",
    );
}

/// Stream records are dropped (dispatch never sees them: what the stream's
/// on-failure destination gets after the retries, metadata only). The
/// delivery and a large fan-out's remaining endpoints are still delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciler_recovers_dropped_stream_records_and_fanouts() {
    let stack = Stack::start(&RECONCILE_ENV).await;
    let receivers = [Receiver::healthy().await, Receiver::healthy().await];
    let mut endpoints = Vec::new();
    for r in &receivers {
        let (id, _) = stack.subscribe("shop", r).await;
        endpoints.push(id);
    }
    // An event through the API (2 deliveries inline) ...
    let (status, body) = stack
        .send_event("shop", "order.paid", json!({"n": 1}), None)
        .await;
    assert_eq!(status, 202);
    let inline: Vec<String> = delivery_ids(&body);
    // ... and one whose whole fan-out was deferred (as for > 98 endpoints),
    // committed through the same store.
    let app = AppId::parse("shop").unwrap();
    let all = stack.store.list_routes(&app).await.unwrap();
    let (mut new, _) = plan_event(
        app.clone(),
        EventType::parse("order.shipped").unwrap(),
        &RawValue::from_string(r#"{"n":2}"#.into()).unwrap(),
        &all,
        chrono::Utc::now(),
        &mut StdRng::from_entropy(),
    );
    new.fanout_remaining = std::mem::take(&mut new.targets);
    let deferred: Vec<String> = new
        .fanout_remaining
        .iter()
        .map(|ep| DeliveryId::for_event_endpoint(&new.event.id, ep).to_string())
        .collect();
    assert_eq!(
        stack.store.commit_event(&new).await.unwrap(),
        CommitOutcome::Committed
    );
    // Every stream record so far is dropped.
    let dropped = stack.next_stream_event().await.unwrap();
    let dropped = dropped["Records"].as_array().unwrap().len();
    assert!(dropped >= 2, "{dropped} records");
    let delivered = stack
        .pump_until(Duration::from_secs(3), || async {
            receivers.iter().any(|r| !r.received().is_empty())
        })
        .await;
    assert!(!delivered, "records were not dropped; test is void");

    sleep_until_overdue(chrono::Utc::now(), RECONCILE_AFTER).await;
    let report = stack.reconcile().await.unwrap();
    assert_eq!(
        (report.listed_requeued, report.fanouts),
        (2, 1),
        "{report:?}"
    );
    // The fan-out's deliveries are materialised; drop their stream records
    // too, then let the two re-queued messages be delivered: the next run
    // queues only the fan-out's two.
    stack.next_stream_event().await.unwrap();
    let first_two = stack
        .pump_until_all(&inline, DeliveryStatus::Delivered, T)
        .await;
    assert!(first_two);
    sleep_until_overdue(chrono::Utc::now(), RECONCILE_AFTER).await;
    let report = stack.reconcile().await.unwrap();
    assert_eq!(report.requeued, 2, "{report:?}");
    let ids: Vec<String> = inline
        .iter()
        .cloned()
        .chain(deferred.iter().cloned())
        .collect();
    assert_eq!(ids.len(), 4);
    let all_delivered = stack
        .pump_until_all(&ids, DeliveryStatus::Delivered, T)
        .await;
    assert!(all_delivered);
    for r in &receivers {
        assert_eq!(r.unique_accepted(), 2);
        assert_eq!(r.duplicates(), 0);
    }
    record_figures(
        "reconciler",
        &format!("stream records dropped ({dropped} records, incl. a deferred fan-out): 4/4 delivered by the reconciler, 0 lost, 0 duplicates"),
    );
}

/// A raw item of the table, for checking attributes the model hides.
async fn raw_item(
    stack: &Stack,
    pk: &str,
    sk: &str,
) -> Option<std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>> {
    use aws_sdk_dynamodb::types::AttributeValue;
    stack
        .clients
        .dynamodb
        .get_item()
        .table_name(&stack.settings.table)
        .key("PK", AttributeValue::S(pk.into()))
        .key("SK", AttributeValue::S(sk.into()))
        .consistent_read(true)
        .send()
        .await
        .expect("GetItem on moto")
        .item
}

/// An expired `Idempotency-Key` record (DynamoDB deletes expired items up to
/// days late) is taken over at once: a new event, not a 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_idempotency_key_can_be_reused_at_once() {
    use aws_sdk_dynamodb::types::AttributeValue;
    let stack = Stack::start(&[]).await;
    let receiver = Receiver::healthy().await;
    stack.create_endpoint("shop", &receiver.url, &[]).await;
    let (status, first) = stack
        .send_event("shop", "order.paid", json!({"n": 1}), Some("order-7"))
        .await;
    assert_eq!(status, 202);
    // Same key, same body: replayed.
    let (status, again) = stack
        .send_event("shop", "order.paid", json!({"n": 1}), Some("order-7"))
        .await;
    assert_eq!((status, &again), (202, &first));
    // The record expires (TTL attribute in the past; the item lingers).
    let past = chrono::Utc::now().timestamp() - 10;
    stack
        .set_attribute(
            "IDEM#shop#order-7",
            "IDEM",
            "expires_at",
            AttributeValue::N(past.to_string()),
        )
        .await;
    assert!(raw_item(&stack, "IDEM#shop#order-7", "IDEM")
        .await
        .is_some());
    // Reused, even with another body: a new event (was: 503 for up to two days).
    let (status, reused) = stack
        .send_event("shop", "order.paid", json!({"n": 2}), Some("order-7"))
        .await;
    assert_eq!(status, 202, "{reused}");
    assert_ne!(event_id(&reused), event_id(&first));
    // And the new record is live: a replay answers the new body.
    let (status, replay) = stack
        .send_event("shop", "order.paid", json!({"n": 2}), Some("order-7"))
        .await;
    assert_eq!((status, &replay), (202, &reused));
    record_figures(
        "idempotency",
        "expired Idempotency-Key reused at once: 202 with a new event (was 503 until TTL deletion)",
    );
}

/// A keyed request that stopped between its key's record and its event
/// (the record names the event; the event was never written), retried
/// after the app grew past a listed fan-out (so the retry takes the
/// transaction path and meets its own key): the retry writes that event
/// before it answers 202 with the first answer. It used to answer 202 for
/// an event that was never written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_keyed_request_writes_its_missing_event_whatever_path_it_takes() {
    use aws_sdk_dynamodb::types::AttributeValue;
    use hookline_pipeline::ports::FANOUT_LIST_MAX;
    // Past a listed fan-out: more endpoints than the default limit.
    let stack = Stack::start(&[("WEBHOOKS_MAX_ENDPOINTS_PER_APP", "500")]).await;
    let receiver = Receiver::healthy().await;
    stack.create_endpoint("shop", &receiver.url, &[]).await;
    let (status, first) = stack
        .send_event("shop", "order.paid", json!({"n": 1}), Some("order-8"))
        .await;
    assert_eq!(status, 202);
    let id = hookline_core::ids::EventId::parse(&event_id(&first)).unwrap();
    // The request "stopped" after its key's record: its event is removed.
    let shop = hookline_core::ids::AppId::parse("shop").unwrap();
    let (pk, sk) = hookline_aws::schema::event_key(&shop, &id);
    stack
        .clients
        .dynamodb
        .delete_item()
        .table_name(&stack.settings.table)
        .key("PK", AttributeValue::S(pk))
        .key("SK", AttributeValue::S(sk))
        .send()
        .await
        .expect("DeleteItem on moto");
    assert!(stack.store.get_event(&shop, &id).await.unwrap().is_none());
    // The app grows past a listed fan-out.
    for _ in 0..FANOUT_LIST_MAX {
        stack.create_endpoint("shop", &receiver.url, &[]).await;
    }
    let (status, again) = stack
        .send_event("shop", "order.paid", json!({"n": 1}), Some("order-8"))
        .await;
    assert_eq!((status, &again), (202, &first));
    let event = stack
        .store
        .get_event(&shop, &id)
        .await
        .unwrap()
        .expect("the accepted event is written");
    assert_eq!(event.targets.len(), 1, "the fan-out its key's record named");
    record_figures(
        "idempotency",
        "keyed request stopped between its record and its event, retried after the app grew past a listed fan-out: the event is written before the 202 (was: 202 for an event never written)",
    );
}

/// A pending delivery never expires; a finished one expires a retention
/// after it finished; a restart late in an event's life keeps the event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_deliveries_never_expire_and_restarts_keep_their_event() {
    let stack = Stack::start(&[
        ("WEBHOOKS_RETRY_SCHEDULE", "1s"),
        ("WEBHOOKS_MAX_ATTEMPTS", "1"),
    ])
    .await;
    let receiver = Receiver::start(vec![Reply::Status(500)], Reply::Status(200)).await;
    stack.create_endpoint("shop", &receiver.url, &[]).await;
    let (_, body) = stack
        .send_event("shop", "order.paid", json!({"n": 1}), None)
        .await;
    let (id, event_id) = (first_delivery(&body), event_id(&body));
    let (pk, sk) = Stack::delivery_key("shop", &id);
    assert!(pk.starts_with("DLA#shop#"), "in its app's partition");
    // Before its first attempt the delivery is listed on its event, which is
    // in its creation day's partition (the reconciler's sweep reads those),
    // with no index entry.
    let (event_pk, event_sk) = Stack::event_key("shop", &event_id);
    let event = raw_item(&stack, &event_pk, &event_sk).await.unwrap();
    assert!(event_pk.starts_with("EVD#shop#") && event.contains_key("targets"));
    assert!(!event.contains_key("GSI3PK"), "no index entry");
    // One attempt only: it fails.
    assert!(stack.reaches(&id, DeliveryStatus::Failed, T).await);
    let item = raw_item(&stack, &pk, &sk).await.unwrap();
    assert!(
        item.contains_key("GSI2PK") && !item.contains_key("GSI1PK"),
        "a failed delivery is in the by-status index only"
    );
    let ttl: i64 = item["expires_at"].as_n().unwrap().parse().unwrap();
    let retention = 30 * 86_400;
    assert!((ttl - chrono::Utc::now().timestamp() - retention).abs() < 60);
    assert!(
        !item.contains_key("GSI3PK"),
        "a finished delivery leaves the overdue index"
    );
    // The event is near the end of its retention when a manual retry comes.
    use aws_sdk_dynamodb::types::AttributeValue;
    let soon = chrono::Utc::now().timestamp() + 60;
    stack
        .set_attribute(
            &event_pk,
            &event_sk,
            "expires_at",
            AttributeValue::N(soon.to_string()),
        )
        .await;
    let (status, _) = stack.retry_delivery("shop", &id).await;
    assert_eq!(status, 202);
    let event = raw_item(&stack, &event_pk, &event_sk).await.unwrap();
    let kept: i64 = event["expires_at"].as_n().unwrap().parse().unwrap();
    assert!(
        kept >= chrono::Utc::now().timestamp() + retention - 60,
        "event kept a retention from the restart"
    );
    let item = raw_item(&stack, &pk, &sk).await.unwrap();
    assert!(!item.contains_key("expires_at"), "pending again: no TTL");
    assert!(
        item.contains_key("GSI3PK"),
        "a pending delivery is in the overdue index"
    );
    assert!(stack.reaches(&id, DeliveryStatus::Delivered, T).await);
    let item = raw_item(&stack, &pk, &sk).await.unwrap();
    assert!(
        !item.contains_key("GSI2PK") && !item.contains_key("GSI3PK"),
        "a delivered delivery has no index copy"
    );
}

/// Conditional writes on moto: an endpoint write based on a stale read is
/// refused (no resurrection after DELETE, no rotated secret written back, no
/// re-enable over an auto-disable), and a delivery write based on a state
/// that came back after a manual retry (ABA) is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_writes_are_refused_for_endpoints_and_deliveries() {
    use hookline_core::ids::EndpointId;
    let stack = Stack::start(&[("WEBHOOKS_MAX_ATTEMPTS", "1")]).await;
    let receiver = Receiver::start(vec![Reply::Status(500)], Reply::Status(200)).await;
    let app = AppId::parse("shop").unwrap();
    let (ep_id, secret) = stack.create_endpoint("shop", &receiver.url, &[]).await;
    let ep_id = EndpointId::parse(&ep_id).unwrap();
    let stale = stack
        .store
        .get_endpoint(&app, &ep_id)
        .await
        .unwrap()
        .unwrap();

    // PATCH racing a rotation: the stale PATCH must not write the old secret back.
    let (status, rotated) = stack
        .endpoint_call("POST", "shop", &ep_id, "/rotate-secret", None)
        .await;
    assert_eq!(status, 200);
    let mut patch = stale.clone();
    patch.description = Some("stale".into());
    patch.version += 1;
    assert!(!stack
        .store
        .update_endpoint(&patch, stale.version)
        .await
        .unwrap());
    let now = stack
        .store
        .get_endpoint(&app, &ep_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(now.secret.expose(), secret_of(&rotated).as_str());
    assert_ne!(now.secret.expose(), secret);
    // Through the API a PATCH re-reads and lands on top of the rotation.
    let (status, _) = stack
        .endpoint_call(
            "PATCH",
            "shop",
            &ep_id,
            "",
            Some(json!({"description": "fresh"})),
        )
        .await;
    assert_eq!(status, 200);
    let now = stack
        .store
        .get_endpoint(&app, &ep_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (now.description.as_deref(), now.secret.expose()),
        (Some("fresh"), secret_of(&rotated).as_str())
    );

    // PATCH racing the 410 auto-disable: the stale "enabled" copy loses.
    let before_disable = now.clone();
    assert!(stack
        .store
        .disable_endpoint(
            &app,
            &ep_id,
            "endpoint answered 410 Gone",
            before_disable.version,
            chrono::Utc::now(),
        )
        .await
        .unwrap());
    // A 410 judged from a copy older than that (a deliver's cached
    // endpoint, before the disable or a user's re-enable): nothing written.
    assert!(!stack
        .store
        .disable_endpoint(
            &app,
            &ep_id,
            "endpoint answered 410 Gone",
            before_disable.version,
            chrono::Utc::now(),
        )
        .await
        .unwrap());
    let mut enable = before_disable.clone();
    enable.version += 1;
    assert!(!stack
        .store
        .update_endpoint(&enable, before_disable.version)
        .await
        .unwrap());
    assert!(
        stack
            .store
            .get_endpoint(&app, &ep_id)
            .await
            .unwrap()
            .unwrap()
            .disabled
    );

    // PATCH racing DELETE: no resurrection.
    let last = stack
        .store
        .get_endpoint(&app, &ep_id)
        .await
        .unwrap()
        .unwrap();
    assert!(stack.store.delete_endpoint(&app, &ep_id).await.unwrap());
    let mut resurrect = last.clone();
    resurrect.version += 1;
    assert!(!stack
        .store
        .update_endpoint(&resurrect, last.version)
        .await
        .unwrap());
    assert!(stack
        .store
        .get_endpoint(&app, &ep_id)
        .await
        .unwrap()
        .is_none());
    let (status, _) = stack
        .endpoint_call(
            "PATCH",
            "shop",
            &ep_id,
            "",
            Some(json!({"description": "x"})),
        )
        .await;
    assert_eq!(status, 404);

    // Delivery ABA: attempt 1 fails (budget 1) -> failed; a stale in-flight
    // writer read it while pending at attempt_count 0; a manual retry brings
    // attempt_count back to 0. The stale write must be refused.
    let (ep2, _) = stack.create_endpoint("shop", &receiver.url, &[]).await;
    let id = stack.send_one("shop", "order.paid", json!({"n": 1})).await;
    let stale_read = stack.delivery(&id).await;
    assert_eq!(stale_read.endpoint_id.as_str(), ep2);
    assert!(stack.reaches(&id, DeliveryStatus::Failed, T).await);
    let (status, _) = stack.retry_delivery("shop", &id).await;
    assert_eq!(status, 202);
    let current = stack.delivery(&id).await;
    assert_eq!(
        (current.status, current.attempt_count),
        (stale_read.status, stale_read.attempt_count)
    );
    let mut stale_write = stale_read.clone();
    stale_write.attempts.clear();
    stale_write.version += 1;
    assert!(!stack
        .store
        .update_delivery(&stale_write, stale_read.version)
        .await
        .unwrap());
    assert_eq!(
        stack.delivery(&id).await.attempts.len(),
        1,
        "the attempt log survived"
    );
    record_figures(
        "races",
        "stale writes refused on moto: PATCH vs rotation, PATCH vs 410 disable, PATCH vs DELETE, delivery ABA after manual retry (4/4)",
    );
}

/// Endpoint secrets are sealed at rest under the template's KMS key (moto
/// speaks KMS): no table item and no stream record carries a usable secret,
/// and deliveries are still signed with it.
/// The store of a new Lambda container: its own sealer (own data keys).
fn new_container(
    stack: &Stack,
) -> (
    hookline_aws::DynamoStore,
    std::sync::Arc<hookline_aws::sealing::SecretSealer>,
) {
    stack.container_store(&stack.clients)
}

/// One storage format: a process on a new table writes its format item
/// (once); a process that finds another format refuses, naming both,
/// with its first read (which carries the format item in that request) or
/// before its first write (a check started beside its first queries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_of_another_format_is_refused_naming_both() {
    use aws_sdk_dynamodb::types::AttributeValue;
    use hookline_aws::schema::{FORMAT_PK, FORMAT_SK, TABLE_FORMAT};
    let stack = Stack::start(&[]).await;
    let (store, _) = new_container(&stack);
    store
        .check_format()
        .await
        .expect("a new table takes this format");
    let item = raw_item(&stack, FORMAT_PK, FORMAT_SK)
        .await
        .expect("the format item is written");
    assert_eq!(item["format"].as_n().unwrap(), &TABLE_FORMAT.to_string());
    // Another build's table.
    let other = TABLE_FORMAT + 1;
    stack
        .set_attribute(
            FORMAT_PK,
            FORMAT_SK,
            "format",
            AttributeValue::N(other.to_string()),
        )
        .await;
    let (fresh, _) = new_container(&stack);
    let err = fresh.check_format().await.unwrap_err();
    let text = err.to_string();
    assert!(!err.is_retryable(), "{text}");
    assert!(
        text.contains(&format!("storage format {other}"))
            && text.contains(&format!("format {TABLE_FORMAT} only")),
        "{text}"
    );
    // Deliver's first read: the same refusal, from that read.
    let (fresh, _) = new_container(&stack);
    let app = AppId::parse("shop").unwrap();
    let err = fresh
        .peek_delivery_item(&app, &DeliveryId::generate())
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains(&format!("storage format {other}")),
        "{err}"
    );
    // Ingest's first read (the catalog's) carries the format item too.
    let (fresh, _) = new_container(&stack);
    let err = fresh
        .get_event_type(&EventType::parse("order.paid").unwrap())
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains(&format!("storage format {other}")),
        "{err}"
    );
    // A process whose first request is a write (the reconciler's check
    // runs beside its first queries) checks first: nothing is written.
    let (fresh, _) = new_container(&stack);
    fresh.check_format_in_background();
    let err = fresh
        .register_app(&AppId::parse("elsewhere").unwrap(), chrono::Utc::now())
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains(&format!("storage format {other}")),
        "{err}"
    );
    assert!(
        raw_item(&stack, hookline_aws::schema::SWEPT_APPS_PK, "elsewhere")
            .await
            .is_none(),
        "nothing written into a table of another format"
    );
    record_figures(
        "format",
        "a table of another storage format: every function's first read or first write refuses it, naming both formats, and nothing is written",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_secrets_are_sealed_at_rest() {
    use aws_sdk_dynamodb::types::AttributeValue;
    use hookline_aws::DynamoStore;
    use hookline_core::ids::EndpointId;
    let stack = Stack::start(&[]).await;
    let receiver = Receiver::healthy().await;
    let (ep, secret) = stack.subscribe("shop", &receiver).await;
    let (status, rotated) = stack
        .endpoint_call("POST", "shop", &ep, "/rotate-secret", None)
        .await;
    assert_eq!(status, 200);
    let new_secret = secret_of(&rotated);
    let item = raw_item(&stack, "APP#shop", &format!("EP#{ep}"))
        .await
        .unwrap();
    let stored = item["secret"].as_s().unwrap();
    assert!(stored.starts_with("sealed:v2:"), "{stored}");
    let previous = item["previous_secrets"].as_l().unwrap();
    assert!(previous[0].as_m().unwrap()["secret"]
        .as_s()
        .unwrap()
        .starts_with("sealed:v2:"));
    // Nowhere in the table (a scan stands for an export) or its stream.
    let scan = stack.scan().await;
    let dump = format!("{scan:?}");
    let stream = stack.next_stream_event().await.unwrap().to_string();
    for s in [&secret, &new_secret] {
        let key_part = s.trim_start_matches("whsec_");
        assert!(
            !dump.contains(key_part),
            "a secret is readable in the table"
        );
        assert!(
            !stream.contains(key_part),
            "a secret is readable in the stream"
        );
    }
    // Deliveries are signed with the (rotated) secrets: the receiver verifies.
    receiver.set_secret(&new_secret);
    let id = stack.send_one("shop", "order.paid", json!({"n": 1})).await;
    assert!(stack.reaches(&id, DeliveryStatus::Delivered, T).await);
    assert!(receiver.received()[0].standard_ok);

    // A new container opens them with one KMS Decrypt per data key.
    let (fresh, sealer) = new_container(&stack);
    let app = AppId::parse("shop").unwrap();
    let ep_id = EndpointId::parse(&ep).unwrap();
    let read = fresh.get_endpoint(&app, &ep_id).await.unwrap().unwrap();
    assert_eq!(read.secret.expose(), new_secret);
    assert_eq!(read.previous_secrets[0].secret.expose(), secret);
    assert_eq!(sealer.open_data_keys(), 1, "one data key for both secrets");
    // Fan-out never needs a secret: a fresh ingest container lists the
    // routes (ids, filters, state) without a single KMS call.
    let (fresh_ingest, ingest_sealer) = new_container(&stack);
    let routes = fresh_ingest.list_routes(&app).await.unwrap();
    let route = routes.iter().find(|r| r.id == ep_id).expect("listed");
    assert!(!route.disabled);
    assert_eq!(ingest_sealer.open_data_keys(), 0);

    // Endpoints sealed by two containers (two data keys): a third container
    // lists them, opening both data keys in one concurrent round.
    let (other_container, _) = new_container(&stack);
    let mut second = read.clone();
    second.id = EndpointId::generate();
    other_container
        .put_endpoint(
            &second,
            hookline_pipeline::settings::MAX_ENDPOINTS_PER_APP_CEILING,
        )
        .await
        .unwrap();
    let (lister, third) = new_container(&stack);
    let listed = lister.list_endpoints(&app).await.unwrap();
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|e| e.secret.expose() == new_secret));
    assert_eq!(third.open_data_keys(), 2);

    // A sealed secret moved onto another endpoint does not open.
    let (other, _) = stack.create_endpoint("shop", &receiver.url, &[]).await;
    stack
        .set_attribute(
            "APP#shop",
            &format!("EP#{other}"),
            "secret",
            AttributeValue::S(stored.clone()),
        )
        .await;
    let moved = fresh
        .get_endpoint(&app, &EndpointId::parse(&other).unwrap())
        .await;
    assert!(
        moved.is_err(),
        "a secret copied to another endpoint must not open"
    );

    // A plaintext value where a sealed one is expected is corrupt (a store
    // with no KMS key wrote it): nothing is read as plaintext.
    let plain_store = DynamoStore::new(
        &stack.clients,
        stack.settings.table.clone(),
        stack.settings.retention,
    );
    let mut plain = read.clone();
    plain.id = EndpointId::generate();
    plain_store
        .put_endpoint(
            &plain,
            hookline_pipeline::settings::MAX_ENDPOINTS_PER_APP_CEILING,
        )
        .await
        .unwrap();
    let refused = fresh.get_endpoint(&app, &plain.id).await;
    assert!(
        matches!(&refused, Err(hookline_pipeline::PipelineError::Corrupt(m)) if m.contains("not sealed")),
        "{refused:?}"
    );

    // A sealed header value moved to another header of the same item does
    // not open, nor does the whole item copied under another app's key.
    let (status, _) = stack
        .endpoint_call(
            "PATCH",
            "shop",
            &ep,
            "",
            Some(json!({"headers": {"Authorization": "Bearer kept-secret"}})),
        )
        .await;
    assert_eq!(status, 200);
    let item = raw_item(&stack, "APP#shop", &format!("EP#{ep}"))
        .await
        .unwrap();
    let sealed_header = item["headers"].as_m().unwrap()["Authorization"].clone();
    assert!(sealed_header.as_s().unwrap().starts_with("sealed:v2:"));
    let mut copy = item.clone();
    copy.insert("PK".into(), AttributeValue::S("APP#other".into()));
    stack
        .clients
        .dynamodb
        .put_item()
        .table_name(&stack.settings.table)
        .set_item(Some(copy))
        .send()
        .await
        .expect("PutItem on moto");
    let other_app = AppId::parse("other").unwrap();
    assert!(
        fresh.get_endpoint(&other_app, &ep_id).await.is_err(),
        "an item copied under another app's key must not open"
    );
    stack
        .set_attribute(
            "APP#shop",
            &format!("EP#{ep}"),
            "headers",
            AttributeValue::M(std::collections::HashMap::from([(
                "X-Debug".to_owned(),
                sealed_header,
            )])),
        )
        .await;
    let moved_header = fresh.get_endpoint(&app, &ep_id).await;
    assert!(
        moved_header.is_err(),
        "a sealed header moved to another header must not open"
    );
    record_figures(
        "secrets",
        "endpoint secrets at rest: sealed under the KMS key (AES-256-GCM data keys, the item's table key and the field as associated data); 0 of 2 secrets readable in a table scan or the stream; a sealed value moved to another endpoint, to another header of its item, or copied with its item under another app's key does not open; a plaintext value is refused as corrupt",
    );
}

/// A poison record on the table's stream: the local poller, like Lambda,
/// gives up after `MaximumRetryAttempts` (50) on the retried batch, which
/// also holds a good delivery's record, and sends metadata only to the
/// on-failure queue. Before the reconciler that delivery was lost; the
/// local poller retried forever, hiding it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_in_a_stream_batch_dropped_for_a_poison_record_still_arrives() {
    use aws_sdk_dynamodb::types::AttributeValue;
    let stack = Stack::start(&RECONCILE_ENV).await;
    let receiver = Receiver::healthy().await;
    let _ = stack.subscribe("shop", &receiver).await;
    stack.pump().await;
    // A pending "delivery" that can never be decoded, written first ...
    stack
        .clients
        .dynamodb
        .put_item()
        .table_name(&stack.settings.table)
        .item("PK", AttributeValue::S("DLV#poison".into()))
        .item("SK", AttributeValue::S("DLV".into()))
        .item("kind", AttributeValue::S("delivery".into()))
        .item("status", AttributeValue::S("pending".into()))
        .item("attempt_count", AttributeValue::S("many".into()))
        .send()
        .await
        .expect("put the poison item");
    // ... then a good event: its delivery's record follows the poison.
    let (status, body) = stack
        .send_event("shop", "order.paid", json!({"n": 1}), None)
        .await;
    assert_eq!(status, 202);
    let id = first_delivery(&body);
    let mut dropped = 0;
    for _ in 0..60 {
        let (stream, _) = stack.pump().await;
        dropped += stream.dropped;
        if dropped > 0 {
            break;
        }
    }
    assert!(
        dropped >= 2,
        "the poison and the good record are given up on: {dropped}"
    );
    let failure_queue = stack
        .stream_failure_queue
        .clone()
        .expect("on-failure queue");
    let attrs = stack
        .clients
        .sqs
        .get_queue_attributes()
        .queue_url(&failure_queue)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages)
        .send()
        .await
        .expect("failure queue attributes");
    let depth = attrs
        .attributes()
        .and_then(|a| a.get(&aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages))
        .cloned();
    assert_eq!(depth.as_deref(), Some("1"), "metadata of the dropped batch");
    assert_eq!(stack.delivery(&id).await.status, DeliveryStatus::Pending);
    assert!(receiver.received().is_empty(), "dropped with the poison");
    sleep_until_overdue(chrono::Utc::now(), RECONCILE_AFTER).await;
    let report = stack.reconcile().await.unwrap();
    assert_eq!(report.listed_requeued, 1, "{report:?}");
    assert!(stack.reaches(&id, DeliveryStatus::Delivered, T).await);
    record_figures(
        "reconciler",
        &format!("poison stream record: the batch with it ({dropped} records, a good delivery among them) given up on after 50 retries, metadata in the on-failure queue; the good delivery delivered by the reconciler, 0 lost"),
    );
}

/// Commits `n` events of `shop` through the store, each listing one
/// delivery to its endpoint; their stream records are dropped (their
/// messages lost). Half of them (every other one) then get their item as a
/// delivered first attempt would write it, plus (`others`) that many
/// further items of deliveries no event lists in the same partitions'
/// ranges (as a large fan-out's): the sweep must requeue exactly the other
/// half. Returns the ids expected requeued.
async fn events_half_attempted(stack: &Stack, n: usize, others: usize) -> Vec<String> {
    let app = AppId::parse("shop").expect("an app id");
    let routes = stack.store.list_routes(&app).await.expect("routes");
    let mut rng = StdRng::from_entropy();
    let mut lost = Vec::new();
    let mut groups: std::collections::HashMap<String, usize> = Default::default();
    for i in 0..n {
        let (new, _) = plan_event(
            app.clone(),
            EventType::parse("order.paid").expect("a type"),
            &RawValue::from_string(format!(r#"{{"n":{i}}}"#)).expect("JSON"),
            &routes,
            chrono::Utc::now(),
            &mut rng,
        );
        assert_eq!(
            stack.store.commit_event(&new).await.expect("commit"),
            CommitOutcome::Committed
        );
        let mut listed = hookline_core::model::Delivery::new(
            DeliveryId::for_fanout(&new.event.id, 0).expect("a listed fan-out id"),
            &new.event,
            new.targets[0].clone(),
            new.event.created_at,
        );
        *groups
            .entry(hookline_aws::schema::delivery_key(&app, &listed.id).0)
            .or_default() += 1;
        if i % 2 == 0 {
            listed.status = DeliveryStatus::Delivered;
            listed.attempt_count = 1;
            listed.version = 1;
            listed.next_attempt_at = None;
            assert!(stack.store.create_delivery(&listed).await.expect("written"));
            for _ in 0..others {
                let mut other = listed.clone();
                other.id = DeliveryId::for_event_endpoint(
                    &new.event.id,
                    &hookline_core::ids::EndpointId::generate(),
                );
                assert!(stack.store.create_delivery(&other).await.expect("written"));
            }
        } else {
            lost.push(listed.id.to_string());
        }
    }
    assert!(
        groups.values().any(|&g| g >= 4),
        "some partition holds enough of them to be read as a range: {groups:?}"
    );
    let dropped = stack.next_stream_event().await.expect("stream records");
    assert!(!dropped["Records"].as_array().expect("records").is_empty());
    lost
}

/// The reconciler's check of swept listed deliveries (which have an item,
/// which must be requeued) reads a partition's range where it holds several
/// of them, and falls back to keys when the range is crowded with others:
/// either way exactly the ones without an item are requeued, and delivered
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_requeues_exactly_the_listed_deliveries_without_an_item() {
    let stack = Stack::start(&RECONCILE_ENV).await;
    let receiver = Receiver::healthy().await;
    stack.subscribe("shop", &receiver).await;
    let mut expected = Vec::new();
    // Ranges of the swept deliveries alone, then ranges crowded with 12
    // other deliveries per attempted one (beyond the read's budget).
    for others in [0, 12] {
        let lost = events_half_attempted(&stack, 40, others).await;
        sleep_until_overdue(chrono::Utc::now(), RECONCILE_AFTER).await;
        let report = stack.reconcile().await.unwrap();
        assert_eq!(
            (report.swept, report.listed_requeued),
            (40, 20),
            "{others} others: {report:?}"
        );
        expected.extend(lost);
        assert!(
            stack
                .pump_until_all(&expected, DeliveryStatus::Delivered, T)
                .await
        );
        assert_eq!(receiver.unique_accepted(), expected.len());
        assert_eq!(receiver.duplicates(), 0);
    }
    record_figures(
        "reconciler",
        "swept listed deliveries checked by partition range (and by key where a range is crowded): of 2 x 40 events with their messages lost, exactly the 2 x 20 never attempted requeued and delivered once",
    );
}
