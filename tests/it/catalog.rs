//! The event-type catalog on moto: types written, read, paged and deleted
//! through the API (admin key to change, any key to read); payloads checked
//! against their type's schema at ingest (single and batch), the failure
//! located; endpoint subscriptions checked against the catalog with the
//! closest names suggested; a valid event still reaches a real receiver.

use std::time::Duration;

use hookline_ingest::views::{EventTypeList, EventTypeOut};
use hookline_tests::receiver::Receiver;
use hookline_tests::stack::Stack;
use hookline_tests::{error_code, view};
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(60);

fn order_schema() -> Value {
    json!({
        "type": "object",
        "required": ["order_id", "amount"],
        "properties": {
            "order_id": {"type": "string"},
            "amount": {"type": "integer", "minimum": 0},
            "lines": {"type": "array", "items": {"type": "object", "required": ["sku"]}}
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_catalog_checks_payloads_and_subscriptions() {
    let stack = Stack::start(&[]).await;
    let put = |name: &str, body: Value| {
        let stack = &stack;
        let path = format!("/v1/event-types/{name}");
        async move {
            let (status, _, body) = stack.call("PUT", &path, Some(body), &[]).await;
            (status, body)
        }
    };

    // An empty catalog takes any subscription (no catalog yet).
    let (first_ep, _) = stack
        .create_endpoint("shop", "http://127.0.0.1:9/", &["anything.goes"])
        .await;
    assert!(!first_ep.is_empty());

    // Bad definitions: 400 with the reason, nothing stored.
    for (bad, code) in [
        (json!({"schema": {"type": 5}}), "invalid_schema"),
        (
            json!({"schema": {"$ref": "http://127.0.0.1:9/remote.json"}}),
            "invalid_schema",
        ),
        (
            json!({"schema": order_schema(), "example": {"order_id": 7, "amount": 1}}),
            "example_schema_mismatch",
        ),
        (
            json!({"description": "x".repeat(2000)}),
            "invalid_description",
        ),
    ] {
        let (status, body) = put("order.paid", bad).await;
        assert_eq!(
            (status, error_code(&body).as_deref()),
            (400, Some(code)),
            "{body}"
        );
    }
    let (status, _, body) = stack
        .call("GET", "/v1/event-types/order.paid", None, &[])
        .await;
    assert_eq!(status, 404, "{body}");

    // Created (201), then replaced (200) keeping created_at.
    let example = json!({"order_id": "o-1", "amount": 1250});
    let (status, created) = put(
        "order.paid",
        json!({"description": "An order was paid", "schema": order_schema(), "example": example}),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let created: EventTypeOut = view(&created);
    let (status, replaced) = put(
        "order.paid",
        json!({"description": "An order was paid in full", "schema": order_schema(), "example": example}),
    )
    .await;
    assert_eq!(status, 200, "{replaced}");
    let replaced: EventTypeOut = view(&replaced);
    assert_eq!(replaced.created_at, created.created_at);
    assert!(replaced.updated_at >= created.updated_at);
    assert_eq!(
        replaced.schema.as_ref(),
        Some(&order_schema()),
        "the schema kept exactly"
    );
    for name in ["order.refunded", "invoice.created", "user.signup"] {
        let (status, body) = put(name, json!({"description": name})).await;
        assert_eq!(status, 201, "{body}");
    }

    // Read with an app-scoped key; changes need the admin key.
    let (_, shop_key) = stack.new_key("shop").await;
    let (status, one) = stack
        .call_as(&shop_key, "GET", "/v1/event-types/order.paid", None)
        .await;
    assert_eq!(status, 200, "{one}");
    assert_eq!(view::<EventTypeOut>(&one).example, Some(example.clone()));
    let (status, _) = stack
        .call_as(&shop_key, "PUT", "/v1/event-types/x.y", Some(json!({})))
        .await;
    assert_eq!(status, 403);
    let (status, _) = stack
        .call_as(&shop_key, "DELETE", "/v1/event-types/user.signup", None)
        .await;
    assert_eq!(status, 403);

    // Paged by name.
    let mut names = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/event-types?limit=3&cursor={c}"),
            None => "/v1/event-types?limit=3".to_owned(),
        };
        let (status, _, page) = stack.call("GET", &path, None, &[]).await;
        assert_eq!(status, 200, "{page}");
        let page: EventTypeList = view(&page);
        names.extend(page.items.into_iter().map(|t| t.name));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(
        names,
        [
            "invoice.created",
            "order.paid",
            "order.refunded",
            "user.signup"
        ]
    );
    let (status, _, body) = stack
        .call("GET", "/v1/event-types?limit=0", None, &[])
        .await;
    assert_eq!(status, 400, "{body}");

    // Payloads: checked against the schema, the failure located.
    let (status, body) = stack
        .send_event(
            "shop",
            "order.paid",
            json!({"order_id": "o-2", "amount": "12.50"}),
            None,
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "payload_schema_mismatch");
    assert_eq!(body["error"]["location"], "/amount");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("order.paid"),
        "{body}"
    );
    let (status, body) = stack
        .send_event(
            "shop",
            "order.paid",
            json!({"order_id": "o-2", "amount": 1, "lines": [{"sku": "a"}, {"qty": 1}]}),
            None,
        )
        .await;
    assert_eq!(
        (status, body["error"]["location"].as_str()),
        (400, Some("/lines/1")),
        "{body}"
    );
    let (status, body) = stack
        .send_event("shop", "order.paid", json!({"order_id": "o-2"}), None)
        .await;
    assert_eq!(
        (status, body["error"]["location"].as_str()),
        (400, Some("")),
        "{body}"
    );
    // A type without a schema, or not in the catalog: accepted as before.
    let (status, body) = stack
        .send_event("shop", "user.signup", json!([1, "two"]), None)
        .await;
    assert_eq!(status, 202, "{body}");
    let (status, body) = stack
        .send_event("shop", "not.in.catalog", json!(1), None)
        .await;
    assert_eq!(status, 202, "{body}");
    // A batch: each event on its own.
    let (status, _, batch) = stack
        .call(
            "POST",
            "/v1/apps/shop/events/batch",
            Some(json!({"events": [
                {"event_type": "order.paid", "payload": {"order_id": "o-3", "amount": 3}},
                {"event_type": "order.paid", "payload": {"order_id": "o-4", "amount": -1}},
            ]})),
            &[],
        )
        .await;
    assert_eq!(status, 200, "{batch}");
    assert_eq!(batch["items"][0]["status"], 202, "{batch}");
    assert_eq!(batch["items"][1]["status"], 400, "{batch}");
    assert_eq!(
        batch["items"][1]["error"]["code"],
        "payload_schema_mismatch"
    );
    assert_eq!(batch["items"][1]["error"]["location"], "/amount");

    // Subscriptions against the (now non-empty) catalog.
    for (types, suggestion) in [
        (json!(["order.payd"]), "order.paid"),
        (json!(["ordr.*"]), "order.*"),
        (json!(["invoice"]), "invoice.created"),
    ] {
        let (status, _, body) = stack
            .call(
                "POST",
                "/v1/apps/shop/endpoints",
                Some(json!({"url": "http://127.0.0.1:9/", "event_types": types})),
                &[],
            )
            .await;
        assert_eq!(
            (status, error_code(&body).as_deref()),
            (400, Some("unknown_event_type")),
            "{body}"
        );
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains(suggestion),
            "{types}: {body}"
        );
    }
    let (status, body) = stack
        .endpoint_call(
            "PATCH",
            "shop",
            &first_ep,
            "",
            Some(json!({"event_types": ["nope.*"]})),
        )
        .await;
    assert_eq!(
        (status, error_code(&body).as_deref()),
        (400, Some("unknown_event_type")),
        "{body}"
    );
    // The operational app's types are ours, not the catalog's.
    let (status, _, body) = stack
        .call(
            "POST",
            "/v1/apps/_operational/endpoints",
            Some(json!({"url": "http://127.0.0.1:9/", "event_types": ["endpoint.disabled"]})),
            &[],
        )
        .await;
    assert_eq!(status, 201, "{body}");

    // A valid event reaches a real receiver subscribed by catalog names.
    let receiver = Receiver::healthy().await;
    let (_, secret) = stack
        .create_endpoint("shop", &receiver.url, &["order.*", "user.signup"])
        .await;
    receiver.set_secret(&secret);
    let (status, body) = stack
        .send_event(
            "shop",
            "order.paid",
            json!({"order_id": "o-5", "amount": 5}),
            None,
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let got = stack
        .local
        .pump_until(T, || async { !receiver.accepted().is_empty() })
        .await;
    assert!(got, "the valid event was delivered");
    let delivered = &receiver.accepted()[0];
    assert!(delivered.standard_ok && delivered.stripe_ok);

    // Deleted: 204, then 404; its events are accepted without a check.
    let (status, _, _) = stack
        .call("DELETE", "/v1/event-types/order.paid", None, &[])
        .await;
    assert_eq!(status, 204);
    let (status, _, _) = stack
        .call("DELETE", "/v1/event-types/order.paid", None, &[])
        .await;
    assert_eq!(status, 404);
    let (status, body) = stack
        .send_event("shop", "order.paid", json!({"amount": "any"}), None)
        .await;
    assert_eq!(status, 202, "{body}");
}
