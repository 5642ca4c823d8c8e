//! A table written by the earlier version keeps working: its events are in
//! their own partitions (`EVT#{id}` / `EVT`) with an entry in the event time
//! index (a listed fan-out), the overdue index (a deferred fan-out) or the
//! event log (no fan-out). This version reads them through the API, delivers
//! them, sweeps and materialises them in the reconciler and replays them,
//! next to events of the new shape (in their creation day's partitions).

use std::collections::HashMap;
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
