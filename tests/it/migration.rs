//! A table written by the earlier version keeps working: its events are in
//! their own partitions (`EVT#{id}` / `EVT`) with an entry in the event time
//! index (a listed fan-out), the overdue index (a deferred fan-out) or the
//! event log (no fan-out). This version reads them through the API, delivers
//! them, sweeps and materialises them in the reconciler and replays them,
//! next to events of the new shape (in their creation day's partitions).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use hookline_aws::schema;
use hookline_core::ids::{AppId, DeliveryId};
use hookline_core::model::{DeliveryStatus, EventType};
use hookline_pipeline::ingest::plan_event;
use hookline_pipeline::ports::{NewEvent, Store};
use hookline_tests::receiver::Receiver;
use hookline_tests::record_figures;
use hookline_tests::stack::Stack;
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::json;
use serde_json::value::RawValue;

const T: Duration = Duration::from_secs(60);
const RECONCILE_AFTER: Duration = Duration::from_secs(7);

/// Plans an event of `shop` for its current endpoints.
async fn plan(stack: &Stack, n: u32) -> NewEvent {
    let app = AppId::parse("shop").expect("an app id");
    let routes = stack.store.list_routes(&app).await.expect("routes");
    let (new, _) = plan_event(
        app,
        EventType::parse("order.paid").expect("a type"),
        &RawValue::from_string(format!(r#"{{"legacy":{n}}}"#)).expect("JSON"),
        &routes,
        chrono::Utc::now(),
        &mut StdRng::from_entropy(),
    );
    new
}

/// Writes `new`'s event item as the earlier version did: its own partition,
/// and a time-index, overdue-index or event-log entry.
async fn put_legacy_event(stack: &Stack, new: &NewEvent) {
    let event = &new.event;
    let retention = Duration::from_secs(30 * 86_400);
    let mut item = schema::event_item(
        event,
        &new.targets,
        &new.fanout_remaining,
        0,
        retention,
        event.created_at,
    )
    .expect("an event item");
    let (pk, sk) = schema::legacy_event_key(&event.id);
    let time_sk = schema::event_time_sk(event.created_at, &event.app_id, &event.id);
    let (gsi3pk, gsi3sk) = if !new.fanout_remaining.is_empty() {
        (
            schema::due_pk(event.id.as_str()),
            schema::due_sk(event.created_at, event.id.as_str()),
        )
    } else if !new.targets.is_empty() {
        (schema::sweep_pk(event.id.as_str()), time_sk)
    } else {
        (schema::event_log_pk(&event.id), time_sk)
    };
    for (name, value) in [
        ("PK", pk),
        ("SK", sk),
        ("GSI3PK", gsi3pk),
        ("GSI3SK", gsi3sk),
    ] {
        item.insert(name.to_owned(), serde_dynamo::AttributeValue::S(value));
    }
    let item: HashMap<String, AttributeValue> = item.into();
    stack
        .clients
        .dynamodb
        .put_item()
        .table_name(&stack.settings.table)
        .set_item(Some(item))
        .send()
        .await
        .expect("PutItem on moto");
}

/// Replays what `endpoint` missed since `since` (202 expected).
async fn replay(
    stack: &Stack,
    endpoint: &str,
    since: chrono::DateTime<chrono::Utc>,
) -> serde_json::Value {
    let (status, _, body) = stack
        .call(
            "POST",
            &format!("/v1/apps/shop/endpoints/{endpoint}/replay"),
            Some(json!({ "since": since })),
            &[],
        )
        .await;
    assert_eq!(status, 202, "{body}");
    body
}

async fn sleep_until_overdue() {
    tokio::time::sleep(RECONCILE_AFTER + Duration::from_millis(500)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_of_the_earlier_shape_are_read_delivered_swept_and_replayed() {
    let stack = Stack::start(&[
        ("WEBHOOKS_RECONCILE_AFTER", "7s"),
        ("WEBHOOKS_DELIVER_FUNCTION_TIMEOUT", "7s"),
    ])
    .await;
    let a = Receiver::healthy().await;
    stack.subscribe("shop", &a).await;

    // Written by the earlier version: a listed fan-out (time index) and a
    // deferred one (overdue index); their stream records are lost.
    let listed = plan(&stack, 1).await;
    assert_eq!(listed.targets.len(), 1);
    let mut deferred = plan(&stack, 2).await;
    deferred.fanout_remaining = std::mem::take(&mut deferred.targets);
    put_legacy_event(&stack, &listed).await;
    put_legacy_event(&stack, &deferred).await;
    let dropped = stack.next_stream_event().await.unwrap();
    assert_eq!(dropped["Records"].as_array().unwrap().len(), 2);

    // Read through the API: the event and its listed delivery.
    let listed_id = listed.event.id.to_string();
    let (status, _, body) = stack
        .call(
            "GET",
            &format!("/v1/apps/shop/events/{listed_id}"),
            None,
            &[],
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let delivery = DeliveryId::for_fanout(&listed.event.id, 0)
        .unwrap()
        .to_string();
    let (status, _, body) = stack
        .call(
            "GET",
            &format!("/v1/apps/shop/deliveries/{delivery}"),
            None,
            &[],
        )
        .await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("pending")),
        "{body}"
    );

    // The reconciler finds both through their index entries.
    sleep_until_overdue().await;
    let report = stack.reconcile().await.unwrap();
    assert_eq!(
        (report.listed_requeued, report.fanouts),
        (1, 1),
        "{report:?}"
    );
    let materialised =
        DeliveryId::for_event_endpoint(&deferred.event.id, &deferred.fanout_remaining[0])
            .to_string();
    let both = [delivery.clone(), materialised];
    assert!(
        stack
            .pump_until_all(&both, DeliveryStatus::Delivered, T)
            .await
    );
    assert_eq!((a.unique_accepted(), a.duplicates()), (2, 0));
    let again = stack.reconcile().await.unwrap();
    assert_eq!((again.listed_requeued, again.fanouts), (0, 0), "{again:?}");

    // An event the earlier version put in the event log (no endpoint then),
    // and one of the new shape; a new endpoint's replay finds all four.
    let logged = plan(&stack, 3).await;
    let mut logged = logged;
    logged.targets.clear();
    put_legacy_event(&stack, &logged).await;
    let b = Receiver::healthy().await;
    let since = chrono::Utc::now() - chrono::TimeDelta::minutes(5);
    let (endpoint_b, _) = stack.subscribe("shop", &b).await;
    let (status, body) = stack
        .send_event("shop", "order.paid", json!({"new": true}), None)
        .await;
    assert_eq!(status, 202, "{body}");
    let fresh = hookline_tests::delivery_ids(&body);
    assert!(
        stack
            .pump_until_all(&fresh, DeliveryStatus::Delivered, T)
            .await
    );
    let body = replay(&stack, &endpoint_b, since).await;
    assert_eq!(
        (body["replayed"].as_u64(), body["complete"].as_bool()),
        (Some(3), Some(true)),
        "the 3 earlier-shape events b never had: {body}"
    );
    let got_all = stack
        .pump_until(T, || async { b.unique_accepted() == 4 })
        .await;
    assert!(got_all, "b got {}", b.unique_accepted());
    let body = replay(&stack, &endpoint_b, since).await;
    assert_eq!(body["replayed"].as_u64(), Some(0), "{body}");
    assert_eq!(b.duplicates(), 0);
    // A window reaching back decades reads the day partitions of the
    // retention only, ten days per call: it answers, then goes on in the
    // background, and finds nothing new.
    let body = replay(&stack, &endpoint_b, "2000-01-01T00:00:00Z".parse().unwrap()).await;
    assert_eq!(body["replayed"].as_u64(), Some(0), "{body}");
    record_figures(
        "migration",
        "events of the earlier table shape (own partition + index entry): read by the API, a lost listed delivery swept and a deferred fan-out materialised by the reconciler, replayed with a new-shape event (3 + 1 to a new endpoint, then 0), 0 lost, 0 duplicates",
    );
}

/// Writes `delivery`'s item as the earlier version did: its own partition
/// (`DLV#{id}` / `DLV`) with copies in the by-endpoint (GSI1) and by-status
/// (GSI2) indexes whatever its status, and the overdue index when pending.
async fn put_legacy_delivery(stack: &Stack, delivery: &hookline_core::model::Delivery) {
    let mut item =
        schema::delivery_item(delivery, Duration::from_secs(30 * 86_400)).expect("a delivery item");
    let (pk, sk) = schema::legacy_delivery_key(&delivery.id);
    let shard = schema::shard_of(&delivery.id);
    for (name, value) in [
        ("PK", pk),
        ("SK", sk),
        (
            "GSI1PK",
            schema::by_endpoint_pk(&delivery.endpoint_id, shard),
        ),
        ("GSI1SK", delivery.id.to_string()),
        (
            "GSI2PK",
            schema::by_status_pk(&delivery.app_id, delivery.status, shard),
        ),
        ("GSI2SK", delivery.id.to_string()),
    ] {
        item.insert(name.to_owned(), serde_dynamo::AttributeValue::S(value));
    }
    let item: HashMap<String, AttributeValue> = item.into();
    stack
        .clients
        .dynamodb
        .put_item()
        .table_name(&stack.settings.table)
        .set_item(Some(item))
        .send()
        .await
        .expect("PutItem on moto");
}

/// The delivery at position 0 of `new`'s listed fan-out, never attempted.
fn first_listed(new: &NewEvent) -> hookline_core::model::Delivery {
    hookline_core::model::Delivery::new(
        DeliveryId::for_fanout(&new.event.id, 0).expect("a listed fan-out id"),
        &new.event,
        new.targets[0].clone(),
        new.event.created_at,
    )
}

/// The delivery ids a list answers (`query` after `?`), in its order.
async fn listed(stack: &Stack, query: &str) -> Vec<String> {
    let path = format!("/v1/apps/shop/deliveries?{query}");
    let (status, _, body) = stack.call("GET", &path, None, &[]).await;
    assert_eq!(status, 200, "{path}: {body}");
    body["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|d| d["id"].as_str().expect("an id").to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_of_the_earlier_shape_are_listed_moved_and_reconciled() {
    let stack = Stack::start(&[
        ("WEBHOOKS_RECONCILE_AFTER", "7s"),
        ("WEBHOOKS_DELIVER_FUNCTION_TIMEOUT", "7s"),
    ])
    .await;
    let a = Receiver::healthy().await;
    let (endpoint, _) = stack.subscribe("shop", &a).await;

    // Two listed events; the earlier version attempted both deliveries:
    // the first was delivered, the second failed once and waits for its
    // retry, whose message is lost (due a while ago: the overdue index).
    let (first, second) = (plan(&stack, 1).await, plan(&stack, 2).await);
    for new in [&first, &second] {
        assert_eq!(
            stack.store.commit_event(new).await.expect("commit"),
            hookline_pipeline::ports::CommitOutcome::Committed
        );
    }
    let now = chrono::Utc::now();
    let mut done = first_listed(&first);
    done.status = DeliveryStatus::Delivered;
    done.attempt_count = 1;
    done.version = 1;
    done.next_attempt_at = None;
    let mut waiting = first_listed(&second);
    waiting.attempt_count = 1;
    waiting.version = 1;
    waiting.next_attempt_at = Some(now - chrono::TimeDelta::seconds(1));
    put_legacy_delivery(&stack, &done).await;
    put_legacy_delivery(&stack, &waiting).await;
    // Their stream records (the events', the pending item's: the stream
    // filter passes no delivered one) are lost.
    let dropped = stack.next_stream_event().await.expect("stream records");
    assert_eq!(dropped["Records"].as_array().expect("records").len(), 3);
    let (done_id, waiting_id) = (done.id.to_string(), waiting.id.to_string());

    // Listed through their index copies, each once, with every filter.
    let both = vec![waiting_id.clone(), done_id.clone()];
    assert_eq!(listed(&stack, "").await, both);
    assert_eq!(
        listed(&stack, &format!("endpoint_id={endpoint}")).await,
        both
    );
    assert_eq!(
        listed(&stack, "status=delivered").await,
        vec![done_id.clone()]
    );
    assert_eq!(
        listed(&stack, "status=pending").await,
        vec![waiting_id.clone()]
    );
    assert_eq!(
        listed(&stack, &format!("endpoint_id={endpoint}&status=pending")).await,
        vec![waiting_id.clone()]
    );

    // The reconciler finds the waiting one through its overdue entry (which
    // does not name the app), moves it to its app's partition and
    // re-queues it; the sweep finds both listed deliveries written (one at
    // its earlier key): nothing else is sent.
    sleep_until_overdue().await;
    let report = stack.reconcile().await.expect("reconcile");
    assert_eq!(
        (report.requeued, report.listed_requeued),
        (1, 0),
        "{report:?}"
    );
    assert!(
        stack
            .pump_until_all(
                std::slice::from_ref(&waiting_id),
                DeliveryStatus::Delivered,
                T
            )
            .await
    );
    assert_eq!((a.unique_accepted(), a.duplicates()), (1, 0));

    // Read by id through the API, the delivered one moves too: its item of
    // the earlier shape (and its index copies) gone, one in the app's
    // partition with no index copy; the lists still show each once.
    let (status, _, body) = stack
        .call(
            "GET",
            &format!("/v1/apps/shop/deliveries/{done_id}"),
            None,
            &[],
        )
        .await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("delivered")),
        "{body}"
    );
    let (status, _, _) = stack
        .call(
            "GET",
            &format!("/v1/apps/other/deliveries/{done_id}"),
            None,
            &[],
        )
        .await;
    assert_eq!(status, 404, "another app's delivery is not found");
    for d in [&done, &waiting] {
        let (pk, sk) = schema::legacy_delivery_key(&d.id);
        assert!(raw(&stack, &pk, &sk).await.is_none(), "{pk} moved");
        let (pk, sk) = schema::delivery_key(&d.app_id, &d.id);
        let item = raw(&stack, &pk, &sk).await.expect("the moved item");
        for attr in ["GSI1PK", "GSI2PK", "GSI3PK"] {
            assert!(!item.contains_key(attr), "{pk}: {attr}");
        }
    }
    assert_eq!(listed(&stack, "").await, both);
    assert_eq!(listed(&stack, "status=delivered").await, both);
    assert!(listed(&stack, "status=pending").await.is_empty());
    let again = stack.reconcile().await.expect("reconcile");
    assert_eq!((again.requeued, again.listed_requeued), (0, 0), "{again:?}");
    assert_eq!((a.unique_accepted(), a.duplicates()), (1, 0));
    record_figures(
        "migration",
        "deliveries of the earlier table shape (own partition + GSI1/GSI2 copies): listed with every filter, the lost retry found by the reconciler through its overdue entry and delivered, both moved to their app's partition when read by id, 0 re-sent, 0 duplicates",
    );
}

/// A producer's service may run an earlier version of the outbox library
/// long after the stack's upgrade: it writes its events' delivery items at
/// the earlier key (`DLV#{id}`) with fresh ids, which the shape marker's
/// hour does not cover. Such a delivery is not in its event's listed
/// fan-out, so a miss at the new key looks at the earlier one whatever the
/// delivery's age: it is delivered (here a large event, whose message
/// carries no body and names the delivery alone), not acked as unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_an_earlier_outbox_library_writes_after_the_upgrade_is_delivered() {
    let stack = Stack::start(&[]).await;
    // This version took over the table two hours ago.
    let now = chrono::Utc::now();
    stack
        .store
        .set_deliveries_by_app_since(now - chrono::TimeDelta::hours(2))
        .await
        .expect("the shape marker");
    let a = Receiver::healthy().await;
    let (endpoint, _) = stack.subscribe("shop", &a).await;
    let endpoint = hookline_core::ids::EndpointId::parse(&endpoint).expect("an endpoint id");

    // The producer's event (no listed fan-out: the earlier library wrote
    // an item per delivery), larger than a queue message carries.
    let big = format!(r#"{{"lines":"{}"}}"#, "x".repeat(30 * 1024));
    let (new, _) = plan_event(
        AppId::parse("shop").expect("an app id"),
        EventType::parse("order.paid").expect("a type"),
        &RawValue::from_string(big).expect("JSON"),
        &[],
        now,
        &mut StdRng::from_entropy(),
    );
    assert_eq!(
        stack.store.commit_event(&new).await.expect("commit"),
        hookline_pipeline::ports::CommitOutcome::Committed
    );
    let delivery = hookline_core::model::Delivery::new(
        DeliveryId::for_event_endpoint(&new.event.id, &endpoint),
        &new.event,
        endpoint,
        now,
    );
    put_legacy_delivery(&stack, &delivery).await;
    let id = delivery.id.to_string();
    assert!(
        stack
            .pump_until_all(std::slice::from_ref(&id), DeliveryStatus::Delivered, T)
            .await,
        "delivered"
    );
    assert_eq!((a.unique_accepted(), a.duplicates()), (1, 0));
    let (pk, sk) = schema::legacy_delivery_key(&delivery.id);
    assert!(raw(&stack, &pk, &sk).await.is_none(), "{pk} moved");
    let (pk, sk) = schema::delivery_key(&delivery.app_id, &delivery.id);
    assert!(raw(&stack, &pk, &sk).await.is_some(), "{pk} written");
}

async fn raw(stack: &Stack, pk: &str, sk: &str) -> Option<HashMap<String, AttributeValue>> {
    stack
        .clients
        .dynamodb
        .get_item()
        .table_name(&stack.settings.table)
        .key("PK", AttributeValue::S(pk.to_owned()))
        .key("SK", AttributeValue::S(sk.to_owned()))
        .consistent_read(true)
        .send()
        .await
        .expect("GetItem on moto")
        .item
}

/// A process's first read of a delivery carries the table's shape marker
/// in the same request (one BatchGetItem: on a cold start one connection,
/// not a second one for the marker alongside); later reads make no request
/// for it. The marker still decides: a delivery created before this
/// version took over is looked for, and found, at its earlier key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_process_reads_the_shape_marker_with_its_first_delivery_read() {
    let stack = Stack::start(&[]).await;
    let now = chrono::Utc::now();
    stack
        .store
        .set_deliveries_by_app_since(now - chrono::TimeDelta::hours(2))
        .await
        .expect("the shape marker");
    let a = Receiver::healthy().await;
    let (endpoint, _) = stack.subscribe("shop", &a).await;
    let endpoint = hookline_core::ids::EndpointId::parse(&endpoint).expect("an endpoint id");
    // A delivery of the earlier shape, from before the takeover.
    let (old, _) = plan_event(
        AppId::parse("shop").expect("an app id"),
        EventType::parse("order.paid").expect("a type"),
        &RawValue::from_string(r#"{"n":1}"#.into()).expect("JSON"),
        &[],
        now - chrono::TimeDelta::hours(3),
        &mut StdRng::from_entropy(),
    );
    let delivery = hookline_core::model::Delivery::new(
        DeliveryId::for_event_endpoint(&old.event.id, &endpoint),
        &old.event,
        endpoint,
        now - chrono::TimeDelta::hours(3),
    );
    put_legacy_delivery(&stack, &delivery).await;

    let (store, log) = new_process(&stack);
    let app = AppId::parse("shop").expect("an app id");
    let found = store
        .get_delivery(&app, &delivery.id)
        .await
        .expect("read")
        .expect("found at its earlier key");
    assert_eq!(found.id, delivery.id);
    let ops = std::mem::take(&mut *log.lock().expect("log"));
    assert_eq!(
        ops.first().map(String::as_str),
        Some("BatchGetItem+SHAPE"),
        "{ops:?}"
    );
    assert_eq!(
        ops.iter().filter(|op| op.contains("SHAPE")).count(),
        1,
        "{ops:?}"
    );
    // Moved: read again, by key, without the marker.
    let again = store
        .get_delivery(&app, &delivery.id)
        .await
        .expect("read")
        .expect("found at its new key");
    assert_eq!(again.id, delivery.id);
    let ops = std::mem::take(&mut *log.lock().expect("log"));
    assert!(!ops.iter().any(|op| op.contains("SHAPE")), "{ops:?}");
    assert_eq!(ops.len(), 1, "one read: {ops:?}");
}

/// The store of a new process, its direct DynamoDB requests logged by name
/// (`+SHAPE` when one carries the table's shape marker).
fn new_process(stack: &Stack) -> (hookline_aws::DynamoStore, Arc<Mutex<Vec<String>>>) {
    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = log.clone();
    let mut clients = stack.clients.clone();
    clients.dynamodb_http = clients
        .dynamodb_http
        .clone()
        .observed_by(Arc::new(move |op, body| {
            let marker = String::from_utf8_lossy(body).contains(schema::DELIVERY_SHAPE_PK);
            seen.lock().expect("log").push(format!(
                "{}{}",
                op.name,
                if marker { "+SHAPE" } else { "" }
            ));
        }));
    (stack.container_store(&clients).0, log)
}

/// A listed delivery's first attempt in a fresh process reads its item
/// (none yet), its endpoint (secret opened) and the table's shape marker
/// in one request; an endpoint that read does not find is asked again
/// consistently before it counts as deleted (the batch read is eventually
/// consistent, and an endpoint created a moment ago may already have
/// events on their way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_attempt_reads_its_item_and_endpoint_in_one_request() {
    let stack = Stack::start(&[]).await;
    // A table in steady state: this version took over long ago.
    stack
        .store
        .set_deliveries_by_app_since(chrono::Utc::now() - chrono::TimeDelta::days(2))
        .await
        .expect("the shape marker");
    let a = Receiver::healthy().await;
    let (endpoint, secret) = stack.subscribe("shop", &a).await;
    let endpoint = hookline_core::ids::EndpointId::parse(&endpoint).expect("an endpoint id");
    let new = plan(&stack, 1).await;
    let delivery = first_listed(&new);
    let (store, log) = new_process(&stack);
    let app = AppId::parse("shop").expect("an app id");
    let (item, found) = store
        .peek_delivery_item_and_endpoint(&app, &delivery.id, &endpoint)
        .await
        .expect("read");
    assert!(item.is_none(), "never attempted: no item");
    let found = found.expect("the endpoint");
    assert_eq!(found.id, endpoint);
    assert_eq!(found.secret.expose(), secret, "its secret opened");
    let ops = std::mem::take(&mut *log.lock().expect("log"));
    assert_eq!(ops, ["BatchGetItem+SHAPE"]);

    let gone = hookline_core::ids::EndpointId::parse("ep_01m8vgw5r0fdnvqj6sdwzakm9z")
        .expect("an endpoint id");
    let (_, missing) = store
        .peek_delivery_item_and_endpoint(&app, &delivery.id, &gone)
        .await
        .expect("read");
    assert!(missing.is_none());
    let ops = std::mem::take(&mut *log.lock().expect("log"));
    assert_eq!(
        ops,
        ["BatchGetItem", "GetItem"],
        "asked again, consistently"
    );
}
