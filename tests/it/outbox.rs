//! The producer's own outbox (the article's `OrdersService`): an order and its
//! webhook commit together or not at all, on moto's real DynamoDB protocol.

use std::time::Duration;

use hookline_core::ids::AppId;
use hookline_core::model::DeliveryStatus;
use hookline_orders_example::{create_orders_table, Order, OrderError, OrdersService};
use hookline_tests::receiver::Receiver;
use hookline_tests::stack::Stack;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_and_webhook_commit_together_or_not_at_all() {
    let stack = Stack::start(&[]).await;
    let receiver = Receiver::healthy().await;
    let (_, secret) = stack
        .create_endpoint("shop", &receiver.url, &["order.*"])
        .await;
    receiver.set_secret(&secret);
    create_orders_table(&stack.clients.dynamodb, "orders")
        .await
        .unwrap();
    let service = OrdersService {
        client: stack.clients.dynamodb.get().clone(),
        orders_table: "orders".into(),
        webhooks: stack.store.clone(),
        app_id: AppId::parse("shop").unwrap(),
        retention: Duration::from_secs(86_400),
    };
    let order = Order {
        order_id: "ord_1".into(),
        customer: "ana".into(),
        total_cents: 4990,
        created_at: chrono::Utc::now(),
    };
    let accepted = service.create_order(&order).await.unwrap();
    assert_eq!(accepted.delivery_ids.len(), 1);

    // The same order again: the order's condition fails, so the whole
    // transaction is cancelled and no second webhook exists.
    let again = Order {
        total_cents: 1,
        ..order.clone()
    };
    assert!(matches!(
        service.create_order(&again).await,
        Err(OrderError::Conflict(_))
    ));
    let count = |table: &str| {
        let client = stack.clients.dynamodb.clone();
        let table = table.to_owned();
        async move {
            client
                .scan()
                .table_name(table)
                .send()
                .await
                .unwrap()
                .count()
        }
    };
    assert_eq!(count("orders").await, 1);
    let items = stack.scan().await;
    let kinds: Vec<String> = items
        .iter()
        .filter_map(|i| i.get("kind").and_then(|k| k.as_s().ok()).cloned())
        .filter(|k| k != "endpoint")
        .collect();
    assert_eq!(
        kinds.iter().filter(|k| *k == "event").count(),
        1,
        "{kinds:?}"
    );
    // The delivery is listed on the event (no item before its first attempt).
    assert_eq!(
        kinds.iter().filter(|k| *k == "delivery").count(),
        0,
        "{kinds:?}"
    );
    let listed = items
        .iter()
        .find(|i| {
            i.get("kind")
                .and_then(|k| k.as_s().ok())
                .map(String::as_str)
                == Some("event")
        })
        .and_then(|i| i.get("targets"))
        .and_then(|t| t.as_l().ok())
        .map(Vec::len);
    assert_eq!(listed, Some(1));
    assert_eq!(
        stack
            .delivery(accepted.delivery_ids[0].as_ref())
            .await
            .status,
        DeliveryStatus::Pending
    );
    let stored: Order = serde_dynamo::from_item(
        stack
            .clients
            .dynamodb
            .get_item()
            .table_name("orders")
            .key(
                "order_id",
                aws_sdk_dynamodb::types::AttributeValue::S("ord_1".into()),
            )
            .send()
            .await
            .unwrap()
            .item
            .unwrap(),
    )
    .unwrap();
    assert_eq!(stored.total_cents, 4990, "the failed write changed nothing");

    // The committed webhook is delivered by the pipeline like any other.
    let id = accepted.delivery_ids[0].to_string();
    assert!(
        stack
            .pump_until(Duration::from_secs(60), || async {
                stack.delivery(&id).await.status == DeliveryStatus::Delivered
            })
            .await
    );
    let got = receiver.received();
    assert_eq!(got.len(), 1);
    assert!(got[0].standard_ok && got[0].stripe_ok);
    let body: serde_json::Value = serde_json::from_slice(&got[0].body).unwrap();
    assert_eq!(body["type"], "order.created");
    assert_eq!(body["data"]["order_id"], "ord_1");

    // Ordered by the order's id: `order.paid` waits for `order.created`.
    // A head read before another event of the key committed: that
    // producer's transaction is cancelled (nothing written) and says so.
    use hookline_pipeline::ports::Store;
    let app = AppId::parse("shop").unwrap();
    let stale = stack.store.get_key_head(&app, "ord_1").await.unwrap();
    assert_eq!(stale.version, 1, "order.created moved the order's key");
    let paid = service
        .pay_order("ord_1", chrono::Utc::now())
        .await
        .unwrap();
    let endpoints = stack.store.list_routes(&app).await.unwrap();
    let (late, _) = hookline_aws::outbox::keyed_event_items(
        stack.store.table(),
        app.clone(),
        "order.refunded",
        &serde_json::value::RawValue::from_string("{}".into()).unwrap(),
        "ord_1",
        &stale,
        &endpoints,
        chrono::Utc::now(),
        Duration::from_secs(86_400),
    )
    .unwrap();
    let err = stack
        .clients
        .dynamodb
        .transact_write_items()
        .set_transact_items(Some(late))
        .send()
        .await
        .expect_err("the key moved on");
    let reasons = hookline_aws::error::cancellation_reasons(&err).unwrap_or_default();
    assert!(hookline_aws::outbox::key_moved(reasons, 0), "{reasons:?}");
    assert!(matches!(
        service.pay_order("ord_missing", chrono::Utc::now()).await,
        Err(OrderError::Conflict(_))
    ));
    let paid_id = paid.delivery_ids[0].to_string();
    let (_, _, view) = stack
        .call(
            "GET",
            &format!("/v1/apps/shop/deliveries/{paid_id}"),
            None,
            &[],
        )
        .await;
    assert_eq!(view["ordering_key"], "ord_1");
    assert!(
        stack
            .pump_until(Duration::from_secs(60), || async {
                stack.delivery(&paid_id).await.status == DeliveryStatus::Delivered
            })
            .await
    );
    let types: Vec<String> = receiver
        .received()
        .iter()
        .map(|r| serde_json::from_slice::<serde_json::Value>(&r.body).unwrap()["type"].to_string())
        .collect();
    assert_eq!(types, [r#""order.created""#, r#""order.paid""#]);
    let stored = stack.delivery(&paid_id).await;
    assert_eq!(
        stored.after.map(|t| t.delivery.to_string()),
        Some(id),
        "order.paid waited for order.created"
    );
}
