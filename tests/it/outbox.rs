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
        Err(OrderError::AlreadyExists(_))
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
}
