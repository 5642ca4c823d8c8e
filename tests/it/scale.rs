//! Recovery at scale on the real wire protocol: the reconciler's sweep of a
//! window far past the old per-run cap, on moto.

use std::collections::HashSet;
use std::time::Duration;

use aws_sdk_dynamodb::types::{PutRequest, WriteRequest};
use hookline_core::ids::{AppId, EndpointId};
use hookline_core::model::{DeliveryStatus, EventType};
use hookline_pipeline::ingest::plan_event;
use hookline_pipeline::messages::DeliveryMessage;
use hookline_pipeline::ports::Store;
use hookline_tests::record_figures;
use hookline_tests::stack::Stack;
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::value::RawValue;

/// The shortest reconcile delay the settings take with the tests' 2 s
/// delivery timeout, and a short retention: a new table's first sweep
/// reads every day partition an event could still be in (one query each,
/// an empty one costs ~1 s on a moto table this size).
const SCALE_ENV: [(&str, &str); 3] = [
    ("WEBHOOKS_RECONCILE_AFTER", "7s"),
    ("WEBHOOKS_DELIVER_FUNCTION_TIMEOUT", "7s"),
    ("WEBHOOKS_RETENTION_DAYS", "2"),
];

/// Events in the window: past the old cap (20,000 a run over 16 shards,
/// so 10,000 of the day partitions' events).
const EVENTS: usize = 12_000;
/// One in this many lost its first message (no delivery item).
const LOST_EVERY: usize = 120;

/// 12,000 events with a listed fan-out, written as ingest writes them, in
/// one window an hour old; for all but 100 the first attempt wrote its
/// delivery item, those 100 lost their first message. One reconciler run
/// (DynamoDB pages of 1 MB, heads only) writes and queues exactly those
/// 100, moves every mark, and the next run finds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_recovers_every_lost_first_message_of_a_window_past_the_old_cap() {
    let stack = Stack::start(&SCALE_ENV).await;
    let app = AppId::parse("shop").unwrap();
    let endpoint = EndpointId::generate();
    let routes = vec![hookline_core::model::EndpointRoute {
        id: endpoint.clone(),
        event_types: vec![],
        disabled: false,
    }];
    let payload = RawValue::from_string(r#"{"order":{"id":42,"total":"19.99"}}"#.into()).unwrap();
    let mut rng = StdRng::seed_from_u64(35);
    let start = chrono::Utc::now() - chrono::Duration::hours(1);
    // Its endpoint was created before its events (as the API does it).
    stack.store.register_app(&app, start).await.unwrap();
    let retention = stack.settings.retention;
    let mut lost = HashSet::new();
    let mut writes = Vec::new();
    for i in 0..EVENTS {
        let at = start + chrono::Duration::milliseconds(i as i64 * 100);
        let (new, _) = plan_event(
            app.clone(),
            EventType::parse("order.paid").unwrap(),
            &payload,
            &routes,
            at,
            &mut rng,
        );
        let item =
            hookline_aws::schema::event_item(&new.event, &new.targets, &[], 0, retention, at)
                .unwrap();
        writes.push(item);
        let stored = hookline_pipeline::ports::StoredEvent {
            event: new.event.clone(),
            targets: new.targets.clone(),
            fanout_remaining: vec![],
            fanout_version: 0,
        };
        let mut delivery = stored.listed_delivery(0).unwrap();
        if i % LOST_EVERY == 0 {
            lost.insert(delivery.id.clone());
            continue;
        }
        delivery.status = DeliveryStatus::Delivered;
        delivery.version = 1;
        writes.push(hookline_aws::schema::delivery_item(&delivery, retention).unwrap());
    }
    assert_eq!(lost.len(), EVENTS / LOST_EVERY);
    write_items(&stack, &writes).await;

    let started = std::time::Instant::now();
    let report = stack.reconcile().await.unwrap();
    let took = started.elapsed();
    assert_eq!(
        (
            report.swept as usize,
            report.listed_requeued as usize,
            report.complete
        ),
        (EVENTS, lost.len(), true),
        "{report:?}"
    );
    // Exactly the lost ones are queued (version 1: a late version-0
    // message is stale), and written pending.
    let mut queued = HashSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while queued.len() < lost.len() && std::time::Instant::now() < deadline {
        let out = stack
            .clients
            .sqs
            .receive_message()
            .queue_url(&stack.settings.queue_url)
            .max_number_of_messages(10)
            .visibility_timeout(600)
            .wait_time_seconds(1)
            .send()
            .await
            .expect("ReceiveMessage");
        for m in out.messages.unwrap_or_default() {
            let message: DeliveryMessage = serde_json::from_str(m.body().unwrap()).unwrap();
            assert_eq!(message.version, Some(1));
            queued.insert(message.delivery_id);
        }
    }
    assert_eq!(queued, lost);
    for id in lost.iter().take(5) {
        let d = stack
            .store
            .get_delivery_item(&app, id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((d.status, d.version), (DeliveryStatus::Pending, 1));
    }
    let again = stack.reconcile().await.unwrap();
    assert_eq!((again.swept, again.listed_requeued), (0, 0), "{again:?}");
    record_figures(
        "scale",
        &format!(
            "reconciler sweep on moto: {EVENTS} events in one window (the old cap read 10,000 a run), {} first messages lost -> {} recovered in one run ({:.1} s on moto), 0 re-sent, the next run reads nothing",
            lost.len(),
            report.listed_requeued,
            took.as_secs_f64()
        ),
    );
}

/// Window (b) on the real stream: an event committed an hour after its
/// creation (a producer's outbox transaction retried late), after the
/// sweep of its day passed that time. Dispatch sees from the stream
/// record's time that it was written late and indexes it by its write;
/// its first message is then lost (the queue purged): the next sweep finds
/// it through that index and queues it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_committed_long_after_its_creation_is_swept_by_its_write() {
    let stack = Stack::start(&SCALE_ENV).await;
    let app = AppId::parse("shop").unwrap();
    let routes = vec![hookline_core::model::EndpointRoute {
        id: EndpointId::generate(),
        event_types: vec![],
        disabled: false,
    }];
    // The sweep passes the hour ago (nothing there yet); the app's
    // endpoint is older.
    let created = chrono::Utc::now() - chrono::Duration::hours(1);
    stack
        .store
        .register_app(&app, created - chrono::Duration::minutes(1))
        .await
        .unwrap();
    let first = stack.reconcile().await.unwrap();
    assert_eq!(first.swept, 0);
    let (new, accepted) = plan_event(
        app.clone(),
        EventType::parse("order.paid").unwrap(),
        &RawValue::from_string(r#"{"n":1}"#.into()).unwrap(),
        &routes,
        created,
        &mut StdRng::seed_from_u64(9),
    );
    stack.store.commit_event(&new).await.unwrap();
    // Dispatch queues its first message (and indexes it, from the stream
    // record's time); the queue is then purged: that message is lost.
    let batch: aws_lambda_events::event::dynamodb::Event =
        serde_json::from_value(stack.next_stream_event().await.unwrap()).unwrap();
    let late_after = hookline_pipeline::dispatch::late_after(stack.settings.reconcile_after);
    let response = hookline_dispatch::handle(
        &stack.store,
        &stack.queue,
        batch,
        late_after,
        chrono::Utc::now(),
    )
    .await;
    assert!(response.batch_item_failures.is_empty());
    stack.purge_delivery_queue().await;
    // Past WEBHOOKS_RECONCILE_AFTER, without waiting for it.
    let report = stack
        .reconcile_at(chrono::Utc::now() + chrono::Duration::seconds(8))
        .await
        .unwrap();
    assert_eq!(report.listed_requeued, 1, "{report:?}");
    let delivery = stack
        .store
        .get_delivery_item(&app, &accepted.delivery_ids[0])
        .await
        .unwrap()
        .expect("written by the sweep");
    assert_eq!(
        (delivery.status, delivery.version),
        (DeliveryStatus::Pending, 1)
    );
    record_figures(
        "scale",
        "an outbox event committed an hour after its creation, its first message lost: indexed by dispatch from the stream's write time, recovered by the next sweep (was: never swept)",
    );
}

/// Writes `items` as they are, 25 to a BatchWriteItem.
async fn write_items(stack: &Stack, items: &[serde_dynamo::Item]) {
    let client = stack.store.client();
    for chunk in items.chunks(25) {
        let mut requests: Vec<WriteRequest> = chunk
            .iter()
            .map(|item| {
                WriteRequest::builder()
                    .put_request(
                        PutRequest::builder()
                            .set_item(Some(item.clone().into()))
                            .build()
                            .expect("a put request with its item"),
                    )
                    .build()
            })
            .collect();
        while !requests.is_empty() {
            let out = client
                .batch_write_item()
                .request_items(stack.store.table(), requests)
                .send()
                .await
                .expect("BatchWriteItem");
            requests = out
                .unprocessed_items
                .and_then(|mut m| m.remove(stack.store.table()))
                .unwrap_or_default();
        }
    }
}

/// Items the `Query` requests counted since the last reset read.
fn items_queried(counter: &hookline_local::counting::CallCounter) -> u64 {
    counter
        .snapshot()
        .iter()
        .filter(|(op, _)| op.ends_with(".Query"))
        .map(|(_, count)| count.items_read)
        .sum()
}

/// A replay reads only its own app's events. Next to an app holding 2,000
/// events, a replay in an app with none reads no item (the request
/// counter's items read by queries); the same replay in the busy app
/// reads its 2,000 (the counter sees them). The shared day partitions
/// read every app's events for both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_reads_only_its_own_apps_events() {
    let (stack, counter) = Stack::start_counted(&SCALE_ENV).await;
    let receiver = hookline_tests::receiver::Receiver::healthy().await;
    // Subscribed to another type: the busy app's replay reads its events
    // and writes nothing.
    let (busy_endpoint, _) = stack
        .create_endpoint("busy", &receiver.url, &["refund.issued"])
        .await;
    let (quiet_endpoint, _) = stack.create_endpoint("quiet", &receiver.url, &[]).await;
    let busy = AppId::parse("busy").unwrap();
    let routes = vec![hookline_core::model::EndpointRoute {
        id: EndpointId::parse(&busy_endpoint).unwrap(),
        event_types: vec![],
        disabled: false,
    }];
    let payload = RawValue::from_string(r#"{"order":{"id":42}}"#.into()).unwrap();
    let mut rng = StdRng::seed_from_u64(5);
    let start = chrono::Utc::now() - chrono::Duration::minutes(30);
    let items: Vec<serde_dynamo::Item> = (0..2_000)
        .map(|i| {
            let at = start + chrono::Duration::milliseconds(i * 500);
            let (new, _) = plan_event(
                busy.clone(),
                EventType::parse("order.paid").unwrap(),
                &payload,
                &routes,
                at,
                &mut rng,
            );
            hookline_aws::schema::event_item(
                &new.event,
                &new.targets,
                &[],
                0,
                stack.settings.retention,
                at,
            )
            .unwrap()
        })
        .collect();
    write_items(&stack, &items).await;
    let window = serde_json::json!({"since": (start - chrono::Duration::hours(1)).to_rfc3339()});

    counter.reset();
    let (status, body) = stack
        .endpoint_call(
            "POST",
            "quiet",
            &quiet_endpoint,
            "/replay",
            Some(window.clone()),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(
        (body["complete"].as_bool(), body["scanned"].as_u64()),
        (Some(true), Some(0)),
        "{body}"
    );
    let quiet_reads = items_queried(&counter);
    assert_eq!(
        quiet_reads, 0,
        "the quiet app's replay read other apps' events"
    );

    counter.reset();
    let (status, body) = stack
        .endpoint_call("POST", "busy", &busy_endpoint, "/replay", Some(window))
        .await;
    assert_eq!(status, 202, "{body}");
    // Its inline share reads what its time budget allows; the stream's
    // record of it completes it in the background.
    let status_url = format!("/replays/{}", body["id"].as_str().unwrap());
    let done = stack
        .pump_until(Duration::from_secs(120), || async {
            let (_, replay) = stack
                .endpoint_call("GET", "busy", &busy_endpoint, &status_url, None)
                .await;
            replay["complete"].as_bool() == Some(true)
        })
        .await;
    assert!(done, "the busy app's replay completes");
    let busy_reads = items_queried(&counter);
    assert!(
        busy_reads >= 2_000,
        "the counter sees an app's own reads: {busy_reads}"
    );
    record_figures(
        "scale",
        &format!(
            "tenant-scoped replay on moto: next to an app holding 2,000 events, a replay in an app with none read {quiet_reads} event items (the busy app's own replay: {busy_reads})"
        ),
    );
}

/// Window (e) on moto: while deliver's record says due messages are
/// received ten minutes late, a first attempt with no message seen yet is
/// left alone (it may be waiting in the backlog: no
/// copy queued, and the sweep's marks do not move back); once the record
/// is stale, the next run recovers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_backlog_is_not_copied_while_deliver_records_it() {
    use hookline_pipeline::ports::QueueLag;
    let stack = Stack::start(&SCALE_ENV).await;
    let receiver = hookline_tests::receiver::Receiver::healthy().await;
    let (endpoint, _) = stack.create_endpoint("shop", &receiver.url, &[]).await;
    let routes = vec![hookline_core::model::EndpointRoute {
        id: EndpointId::parse(&endpoint).unwrap(),
        event_types: vec![],
        disabled: false,
    }];
    // Committed without dispatch: its first message was never seen.
    let (new, accepted) = plan_event(
        AppId::parse("shop").unwrap(),
        EventType::parse("order.paid").unwrap(),
        &RawValue::from_string(r#"{"n":1}"#.into()).unwrap(),
        &routes,
        chrono::Utc::now(),
        &mut StdRng::seed_from_u64(11),
    );
    stack.store.commit_event(&new).await.unwrap();
    // A first run: too young to be overdue; the marks reach its cutoff.
    let now = chrono::Utc::now();
    let report = stack.reconcile_at(now).await.unwrap();
    assert_eq!((report.listed_requeued, report.errors), (0, 0));
    // A minute on, deliver records a backlog: the cutoff moves back past
    // the marks, which stay (and no query asks for a reversed range).
    let observed = now + chrono::Duration::minutes(1);
    stack
        .store
        .record_queue_lag(&QueueLag {
            observed_at: observed,
            lag: Duration::from_secs(600),
        })
        .await
        .unwrap();
    let report = stack.reconcile_at(observed).await.unwrap();
    assert_eq!(
        (
            report.listed_requeued,
            report.queue_lag_seconds,
            report.errors
        ),
        (0, 600, 0),
        "{report:?}"
    );
    // Six minutes later the record is stale: the backlog drained.
    let later = observed + chrono::Duration::minutes(6);
    let report = stack.reconcile_at(later).await.unwrap();
    assert_eq!(
        (report.listed_requeued, report.queue_lag_seconds),
        (1, 0),
        "{report:?}"
    );
    let app = AppId::parse("shop").unwrap();
    let delivery = stack
        .store
        .get_delivery_item(&app, &accepted.delivery_ids[0])
        .await
        .unwrap()
        .expect("written by the sweep");
    assert_eq!(delivery.version, 1);
    record_figures(
        "scale",
        "window (e) on moto: a first attempt with no message seen, while deliver records a 10-minute backlog: not copied; recovered once the record is stale",
    );
}
