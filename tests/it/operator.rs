//! The operator API on moto: app-scoped API keys and tenancy, bulk recover
//! of an endpoint's failed deliveries, time-range filters, the DLQ status,
//! and the OpenAPI document / dashboard routes.

use hookline_ingest::views::{ApiKeyList, DeliveryList, DlqStatus, EndpointList, EndpointOut};
use hookline_pipeline::ingest::IngestResponse;
use hookline_pipeline::recover::RecoverReport;
use hookline_tests::{error_code, first_delivery, view};
use std::time::Duration;

use chrono::{SecondsFormat, Utc};
use hookline_core::model::DeliveryStatus;
use hookline_tests::receiver::{Receiver, Reply};
use hookline_tests::stack::Stack;
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(60);

fn rfc3339(t: chrono::DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn app_keys_never_reach_another_app() {
    let stack = Stack::start(&[]).await;
    let receiver = Receiver::healthy().await;
    let (acme_key_id, acme_key) = stack.new_key("acme").await;
    let (_, globex_key) = stack.new_key("globex").await;

    // Each key works on its own app.
    let (status, acme_ep) = stack
        .call_as(
            &acme_key,
            "POST",
            "/v1/apps/acme/endpoints",
            Some(json!({"url": receiver.url})),
        )
        .await;
    assert_eq!(status, 201, "{acme_ep}");
    let acme_ep = view::<EndpointOut>(&acme_ep).id;
    let (status, accepted) = stack
        .call_as(
            &acme_key,
            "POST",
            "/v1/apps/acme/events",
            Some(json!({"event_type": "order.paid", "payload": {"n": 1}})),
        )
        .await;
    assert_eq!(status, 202, "{accepted}");
    let acme_event = view::<IngestResponse>(&accepted).event_id.to_string();
    let acme_delivery = first_delivery(&accepted);
    let (status, globex_ep) = stack
        .call_as(
            &globex_key,
            "POST",
            "/v1/apps/globex/endpoints",
            Some(json!({"url": receiver.url})),
        )
        .await;
    assert_eq!(status, 201);
    let globex_ep = view::<EndpointOut>(&globex_ep).id;

    // acme's key on every globex route: 403, and nothing changes.
    let globex_routes: Vec<(&str, String, Option<Value>)> = vec![
        ("GET", "/v1/apps/globex/endpoints".into(), None),
        (
            "POST",
            "/v1/apps/globex/endpoints".into(),
            Some(json!({"url": receiver.url})),
        ),
        (
            "GET",
            format!("/v1/apps/globex/endpoints/{globex_ep}"),
            None,
        ),
        (
            "PATCH",
            format!("/v1/apps/globex/endpoints/{globex_ep}"),
            Some(json!({"disabled": true})),
        ),
        (
            "DELETE",
            format!("/v1/apps/globex/endpoints/{globex_ep}"),
            None,
        ),
        (
            "POST",
            format!("/v1/apps/globex/endpoints/{globex_ep}/rotate-secret"),
            None,
        ),
        (
            "POST",
            format!("/v1/apps/globex/endpoints/{globex_ep}/recover"),
            Some(json!({"since": "2020-01-01T00:00:00Z"})),
        ),
        (
            "POST",
            "/v1/apps/globex/events".into(),
            Some(json!({"event_type": "order.paid", "payload": {}})),
        ),
        ("GET", format!("/v1/apps/globex/events/{acme_event}"), None),
        ("GET", "/v1/apps/globex/deliveries".into(), None),
        (
            "GET",
            format!("/v1/apps/globex/deliveries/{acme_delivery}"),
            None,
        ),
        (
            "POST",
            format!("/v1/apps/globex/deliveries/{acme_delivery}/retry"),
            None,
        ),
    ];
    for (method, path, body) in &globex_routes {
        let (status, err) = stack.call_as(&acme_key, method, path, body.clone()).await;
        assert_eq!(
            (status, error_code(&err).as_deref()),
            (403, Some("forbidden")),
            "{method} {path}: {err}"
        );
    }
    // Admin-only routes refuse app keys.
    for (method, path) in [
        ("POST", "/v1/apps/acme/api-keys"),
        ("GET", "/v1/apps/acme/api-keys"),
        ("GET", "/v1/dlq"),
        ("POST", "/v1/dlq/redrive"),
    ] {
        let (status, _) = stack.call_as(&acme_key, method, path, None).await;
        assert_eq!(status, 403, "{method} {path}");
    }
    // globex's key cannot see acme's objects through its own app either.
    for path in [
        format!("/v1/apps/globex/events/{acme_event}"),
        format!("/v1/apps/globex/deliveries/{acme_delivery}"),
        format!("/v1/apps/globex/endpoints/{acme_ep}"),
    ] {
        let (status, _) = stack.call_as(&globex_key, "GET", &path, None).await;
        assert_eq!(status, 404, "{path}");
    }
    let (_, listed) = stack
        .call_as(&globex_key, "GET", "/v1/apps/globex/endpoints", None)
        .await;
    let ids: Vec<String> = view::<EndpointList>(&listed)
        .items
        .into_iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(
        ids,
        vec![globex_ep.clone()],
        "globex unchanged by acme's key"
    );
    let (status, _) = stack
        .call_as(
            &globex_key,
            "GET",
            &format!("/v1/apps/globex/endpoints/{globex_ep}"),
            None,
        )
        .await;
    assert_eq!(status, 200, "not deleted, not disabled");

    // Keys are listed without the key or its hash; revoking is immediate.
    let (status, _, keys) = stack.call("GET", "/v1/apps/acme/api-keys", None, &[]).await;
    assert_eq!(status, 200);
    let listed: ApiKeyList = view(&keys);
    assert_eq!(listed.items.len(), 1);
    assert!(listed.items[0].key.is_none());
    let secret_part = acme_key.split_once('.').unwrap().1;
    assert!(!keys.to_string().contains(secret_part));
    let (status, _, _) = stack
        .call(
            "DELETE",
            &format!("/v1/apps/acme/api-keys/{acme_key_id}"),
            None,
            &[],
        )
        .await;
    assert_eq!(status, 204);
    let (status, err) = stack
        .call_as(&acme_key, "GET", "/v1/apps/acme/endpoints", None)
        .await;
    assert_eq!(
        (status, error_code(&err).as_deref()),
        (401, Some("unauthorized"))
    );
    assert!(!err.to_string().contains(secret_part));
    // A forged key with a real id is refused.
    let forged = format!("{acme_key_id}.{}", "A".repeat(43));
    let (status, _) = stack
        .call_as(&forged, "GET", "/v1/apps/acme/endpoints", None)
        .await;
    assert_eq!(status, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_recover_and_time_range_filters() {
    let stack = Stack::start(&[
        ("WEBHOOKS_RETRY_SCHEDULE", "1s"),
        ("WEBHOOKS_MAX_ATTEMPTS", "1"),
    ])
    .await;
    let down = Receiver::start(vec![], Reply::Status(503)).await;
    let (ep, _) = stack.create_endpoint("shop", &down.url, &[]).await;
    let start = Utc::now();
    let mut ids = Vec::new();
    for i in 0..5 {
        let (status, body) = stack
            .send_event("shop", "order.paid", json!({"i": i}), None)
            .await;
        assert_eq!(status, 202);
        ids.push(first_delivery(&body));
    }
    let end = Utc::now() + chrono::Duration::milliseconds(1);
    assert!(
        stack
            .pump_until(T, || async {
                let mut failed = 0;
                for id in &ids {
                    if stack.delivery(id).await.status == DeliveryStatus::Failed {
                        failed += 1;
                    }
                }
                failed == ids.len()
            })
            .await,
        "all five fail (one attempt each)"
    );

    // Time-range filters are sort-key ranges on the GSIs.
    let count = |q: String| {
        let stack = &stack;
        async move {
            let path = format!("/v1/apps/shop/deliveries?{q}");
            let (status, _, body) = stack.call("GET", &path, None, &[]).await;
            assert_eq!(status, 200, "{path}: {body}");
            view::<DeliveryList>(&body).items.len()
        }
    };
    let (a, b) = (rfc3339(start), rfc3339(end));
    assert_eq!(
        count(format!("created_after={a}&created_before={b}")).await,
        5
    );
    assert_eq!(count(format!("status=failed&created_after={a}")).await, 5);
    assert_eq!(
        count(format!("endpoint_id={ep}&created_before={b}")).await,
        5
    );
    assert_eq!(count(format!("created_after={b}")).await, 0);
    assert_eq!(count(format!("created_before={a}")).await, 0);
    // A window with cursor pagination: 2 + 2 + 1.
    let mut seen = Vec::new();
    let mut cursor = String::new();
    for _ in 0..4 {
        let path = format!("/v1/apps/shop/deliveries?limit=2&created_after={a}{cursor}");
        let (_, _, page) = stack.call("GET", &path, None, &[]).await;
        let page: DeliveryList = view(&page);
        seen.extend(page.items.into_iter().map(|d| d.id));
        match page.next_cursor {
            Some(c) => cursor = format!("&cursor={c}"),
            None => break,
        }
    }
    let mut expected = ids.clone();
    expected.sort_by(|x, y| y.cmp(x));
    assert_eq!(seen, expected);
    for bad in [
        "created_after=yesterday",
        "created_after=2026-01-02T00:00:00Z&created_before=2026-01-01T00:00:00Z",
        "colour=red",
    ] {
        let (status, _, err) = stack
            .call("GET", &format!("/v1/apps/shop/deliveries?{bad}"), None, &[])
            .await;
        assert_eq!(
            (status, error_code(&err).as_deref()),
            (400, Some("invalid_query")),
            "{bad}: {err}"
        );
    }

    // Bulk recover: the endpoint is back; every failed delivery since `start`
    // starts again and is delivered.
    down.set_fallback(Reply::Status(200));
    let recover = format!("/v1/apps/shop/endpoints/{ep}/recover");
    let (status, _, err) = stack
        .call("POST", &recover, Some(json!({"since": "not a time"})), &[])
        .await;
    assert_eq!(
        (status, error_code(&err).as_deref()),
        (400, Some("invalid_body"))
    );
    let (status, _, report) = stack
        .call("POST", &recover, Some(json!({"since": a})), &[])
        .await;
    assert_eq!(status, 202, "{report}");
    let report: RecoverReport = view(&report);
    assert_eq!((report.recovered, report.complete), (5, true), "{report:?}");
    assert!(
        stack
            .pump_until(T, || async {
                let mut delivered = 0;
                for id in &ids {
                    if stack.delivery(id).await.status == DeliveryStatus::Delivered {
                        delivered += 1;
                    }
                }
                delivered == ids.len()
            })
            .await,
        "recovered deliveries are delivered"
    );
    let (_, _, again) = stack
        .call("POST", &recover, Some(json!({"since": a})), &[])
        .await;
    assert_eq!(
        view::<RecoverReport>(&again).recovered,
        0,
        "nothing failed is left: {again}"
    );
    let detail = stack.delivery(&ids[0]).await;
    assert_eq!(detail.manual_retries, 1);
    assert_eq!(detail.total_attempts, 2);

    // The DLQ status route answers the admin key.
    let (status, _, dlq) = stack.call("GET", "/v1/dlq", None, &[]).await;
    assert_eq!(status, 200, "{dlq}");
    view::<DlqStatus>(&dlq);

    // The public routes need no key.
    let (status, _, doc) = stack.raw_call("GET", "/openapi.json", &[], None).await;
    assert_eq!((status, doc["openapi"].as_str()), (200, Some("3.1.0")));
}

/// Cursor pages over a time window never end early. The index queries use an
/// inclusive BETWEEN (the cursor id comes back and is dropped), so with every
/// delivery in one shard a page used to lose its look-ahead row and say "no
/// more" one page too soon (seen once in CI as the oldest delivery missing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursor_pages_over_one_shard_reach_the_oldest_delivery() {
    use hookline_aws::schema::delivery_shard;
    use hookline_aws::DynamoStore;
    use hookline_core::ids::{AppId, DeliveryId, EndpointId, EventId};
    use hookline_core::model::{Delivery, Event, EventType};
    use hookline_pipeline::ports::{DeliveryQuery, Store};

    let stack = Stack::start(&[]).await;
    let store = DynamoStore::new(
        &stack.clients,
        stack.settings.table.clone(),
        stack.settings.retention,
    );
    let app = AppId::parse("shop").unwrap();
    let endpoint = EndpointId::generate();
    let start = Utc::now() - chrono::Duration::seconds(1);
    let payload = serde_json::value::RawValue::from_string("{}".to_owned()).unwrap();
    let mut rng = rand::thread_rng();
    // Failed deliveries to `endpoint`, interleaved with delivered ones to
    // another endpoint in the same partition: the filtered lists read past
    // those (the app's partitions) or never see them (the by-status index).
    let other = EndpointId::generate();
    let (mut ids, mut noise) = (Vec::new(), Vec::new());
    let mut at = start + chrono::Duration::milliseconds(10);
    while ids.len() < 7 {
        at += chrono::Duration::milliseconds(3);
        let id = DeliveryId::new(at, &mut rng);
        if delivery_shard(&id) != 0 {
            continue;
        }
        let event = Event::new(
            EventId::new(at, &mut rng),
            app.clone(),
            EventType::parse("order.paid").unwrap(),
            &payload,
            at,
        );
        let is_noise = noise.len() < ids.len();
        let target = if is_noise { &other } else { &endpoint };
        let mut delivery = Delivery::new(id.clone(), &event, target.clone(), at);
        delivery.status = if is_noise {
            DeliveryStatus::Delivered
        } else {
            DeliveryStatus::Failed
        };
        delivery.next_attempt_at = None;
        assert!(store.update_delivery(&delivery, 0).await.unwrap());
        if is_noise {
            noise.push(id);
        } else {
            ids.push(id);
        }
    }
    ids.reverse();
    noise.reverse();
    let mut all: Vec<_> = ids.iter().chain(&noise).cloned().collect();
    all.sort_by(|a, b| b.cmp(a));
    for (label, base, expected) in [
        (
            "time window",
            DeliveryQuery {
                created_after: Some(start),
                ..DeliveryQuery::default()
            },
            &all,
        ),
        ("cursor only", DeliveryQuery::default(), &all),
        (
            "endpoint and window",
            DeliveryQuery {
                endpoint_id: Some(endpoint.clone()),
                created_after: Some(start),
                ..DeliveryQuery::default()
            },
            &ids,
        ),
        (
            "status and window",
            DeliveryQuery {
                status: Some(DeliveryStatus::Failed),
                created_after: Some(start),
                ..DeliveryQuery::default()
            },
            &ids,
        ),
        (
            "delivered",
            DeliveryQuery {
                status: Some(DeliveryStatus::Delivered),
                ..DeliveryQuery::default()
            },
            &noise,
        ),
        (
            "other endpoint, failed: none",
            DeliveryQuery {
                endpoint_id: Some(other.clone()),
                status: Some(DeliveryStatus::Failed),
                ..DeliveryQuery::default()
            },
            &Vec::new(),
        ),
    ] {
        for limit in 1..=3 {
            let mut seen = Vec::new();
            let mut q = DeliveryQuery {
                limit,
                ..base.clone()
            };
            for _ in 0..=all.len() {
                let page = store.list_deliveries(&app, &q).await.unwrap();
                assert!(page.items.len() <= limit);
                seen.extend(page.items.into_iter().map(|d| d.id));
                match page.next_cursor {
                    Some(c) => q.before = Some(c),
                    None => break,
                }
            }
            assert_eq!(&seen, expected, "{label}, limit {limit}");
        }
    }
    // A cursor from before the window's start: an empty page, not an error.
    let page = store
        .list_deliveries(
            &app,
            &DeliveryQuery {
                created_after: Some(start),
                before: Some(DeliveryId::time_floor(start - chrono::Duration::seconds(1))),
                limit: 5,
                ..DeliveryQuery::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(page, hookline_pipeline::ports::DeliveryPage::default());
}

/// A pending delivery has no by-status index copy (it would be written
/// and removed again for every delivery that needs a retry): the list by
/// status reads pending ones from the app's partitions, with the other
/// filters; a pending copy an earlier version wrote is listed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_deliveries_are_listed_without_an_index_copy() {
    use aws_sdk_dynamodb::types::AttributeValue;
    use hookline_aws::schema;
    let stack = Stack::start(&[
        ("WEBHOOKS_RETRY_SCHEDULE", "1h"),
        ("WEBHOOKS_MAX_ATTEMPTS", "3"),
    ])
    .await;
    let down = Receiver::start(vec![], Reply::Status(503)).await;
    let up = Receiver::healthy().await;
    let (down_ep, _) = stack.create_endpoint("shop", &down.url, &[]).await;
    let (up_ep, _) = stack.create_endpoint("shop", &up.url, &[]).await;
    let (status, body) = stack
        .send_event("shop", "order.paid", json!({"n": 1}), None)
        .await;
    assert_eq!(status, 202, "{body}");
    let ids = hookline_tests::delivery_ids(&body);
    assert_eq!(ids.len(), 2);
    assert!(
        stack
            .pump_until(T, || async {
                let mut attempted = 0;
                for id in &ids {
                    attempted += usize::from(stack.delivery(id).await.total_attempts > 0);
                }
                attempted == ids.len()
            })
            .await,
        "both first attempts made"
    );
    let mut waiting = None;
    let mut done = None;
    for id in &ids {
        let d = stack.delivery(id).await;
        match d.status {
            DeliveryStatus::Pending => waiting = Some((id.clone(), d)),
            DeliveryStatus::Delivered => done = Some(id.clone()),
            DeliveryStatus::Failed => panic!("nothing fails here"),
        }
    }
    let ((waiting, pending), done) = (waiting.expect("one waits"), done.expect("one delivered"));
    assert_eq!(pending.endpoint_id.as_str(), down_ep);

    let listed = |q: String| {
        let stack = &stack;
        async move {
            let path = format!("/v1/apps/shop/deliveries?{q}");
            let (status, _, body) = stack.call("GET", &path, None, &[]).await;
            assert_eq!(status, 200, "{path}: {body}");
            view::<DeliveryList>(&body)
                .items
                .into_iter()
                .map(|d| d.id)
                .collect::<Vec<_>>()
        }
    };
    let only_waiting = vec![waiting.clone()];
    assert_eq!(listed("status=pending".into()).await, only_waiting);
    assert_eq!(
        listed("status=pending&event_type=order.paid".into()).await,
        only_waiting
    );
    assert_eq!(
        listed(format!("status=pending&endpoint_id={down_ep}")).await,
        only_waiting
    );
    assert!(listed(format!("status=pending&endpoint_id={up_ep}"))
        .await
        .is_empty());
    assert_eq!(listed("status=delivered".into()).await, vec![done]);
    assert!(listed("status=failed".into()).await.is_empty());

    // Its item: in the overdue index, not in the by-status index.
    let (pk, sk) = Stack::delivery_key("shop", &waiting);
    let raw = |stack: &Stack| {
        let (pk, sk) = (pk.clone(), sk.clone());
        let db = stack.local.clients.dynamodb.clone();
        let table = stack.local.settings.table.clone();
        async move {
            db.get_item()
                .table_name(table)
                .key("PK", AttributeValue::S(pk))
                .key("SK", AttributeValue::S(sk))
                .consistent_read(true)
                .send()
                .await
                .expect("GetItem on moto")
                .item
                .expect("the pending delivery's item")
        }
    };
    let item = raw(&stack).await;
    assert!(item.contains_key("GSI3PK"), "overdue index");
    assert!(!item.contains_key("GSI2PK"), "no by-status copy");

    // As an earlier version wrote it: with a pending copy. Listed once.
    let copy = schema::by_status_pk(
        &pending.app_id,
        DeliveryStatus::Pending,
        schema::shard_of(&pending.id),
    );
    stack
        .set_attribute(&pk, &sk, "GSI2PK", AttributeValue::S(copy))
        .await;
    stack
        .set_attribute(&pk, &sk, "GSI2SK", AttributeValue::S(waiting.clone()))
        .await;
    assert_eq!(listed("status=pending".into()).await, only_waiting);
    assert_eq!(listed(String::new()).await.len(), 2);
}
