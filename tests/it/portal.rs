//! Portal sessions on moto: a session's token reaches its own app's portal
//! routes and nothing else — every route of the router's table is tried,
//! with its app and with another — and dies at its end and on revocation.

use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use chrono::Utc;
use hookline_core::model::DeliveryStatus;
use hookline_ingest::router::{routes, Access};
use hookline_ingest::views::{ApiKeyList, EndpointOut, PortalSessionOut};
use hookline_pipeline::ingest::IngestResponse;
use hookline_tests::receiver::Receiver;
use hookline_tests::stack::Stack;
use hookline_tests::{error_code, first_delivery, secret_of, view};
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(60);

/// The ids one app's objects have, to fill a route's path with.
struct Ids {
    app: &'static str,
    endpoint: String,
    event: String,
    delivery: String,
}

impl Ids {
    fn path(&self, template: &str) -> String {
        template
            .replace("{app_id}", self.app)
            .replace("{endpoint_id}", &self.endpoint)
            .replace("{event_id}", &self.event)
            .replace("{delivery_id}", &self.delivery)
            .replace("{replay_id}", "rpl_00000000000000000000000000")
            .replace("{key_id}", "key_00000000000000000000000000")
            .replace("{session_id}", "key_00000000000000000000000000")
            .replace("{name}", "order.paid")
    }
}

/// An endpoint, an event and its delivery (delivered) in `app`.
async fn objects(stack: &Stack, app: &'static str, receiver: &Receiver) -> Ids {
    let (status, _, ep) = stack
        .call(
            "POST",
            &format!("/v1/apps/{app}/endpoints"),
            Some(json!({"url": receiver.url})),
            &[],
        )
        .await;
    assert_eq!(status, 201, "{ep}");
    let (status, _, accepted) = stack
        .call(
            "POST",
            &format!("/v1/apps/{app}/events"),
            Some(json!({"event_type": "order.paid", "payload": {"n": 1}})),
            &[],
        )
        .await;
    assert_eq!(status, 202, "{accepted}");
    let delivery = first_delivery(&accepted);
    assert!(
        stack
            .pump_until_all(
                std::slice::from_ref(&delivery),
                DeliveryStatus::Delivered,
                T
            )
            .await
    );
    Ids {
        app,
        endpoint: view::<EndpointOut>(&ep).id,
        event: view::<IngestResponse>(&accepted).event_id.to_string(),
        delivery,
    }
}

/// A body a route would take (its own checks may still refuse it: only
/// the router's answer matters here).
fn body_for(method: &str, path: &str, receiver: &Receiver) -> Option<Value> {
    match method {
        "GET" | "DELETE" => None,
        _ if path.ends_with("/endpoints") => Some(json!({"url": receiver.url})),
        _ if path.ends_with("/recover") || path.ends_with("/replay") => {
            Some(json!({"since": "2020-01-01T00:00:00Z"}))
        }
        _ if path.ends_with("/events") => Some(json!({"event_type": "order.paid", "payload": {}})),
        _ if path.ends_with("/batch") => {
            Some(json!({"events": [{"event_type": "order.paid", "payload": {}}]}))
        }
        _ if path.contains("/event-types/") => Some(json!({"description": "paid"})),
        _ if path.ends_with("/test") => {
            Some(json!({"event_type": "order.paid", "payload": {"n": 2}}))
        }
        "PATCH" => Some(json!({"description": "from the portal"})),
        _ => Some(json!({})),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_portal_session_reaches_its_app_and_nothing_else_and_dies_at_its_end_or_revocation() {
    let stack = Stack::start(&[]).await;
    let receiver = Receiver::healthy().await;
    let acme = objects(&stack, "acme", &receiver).await;
    let globex = objects(&stack, "globex", &receiver).await;
    let (_, acme_key) = stack.new_key("acme").await;
    let (_, globex_key) = stack.new_key("globex").await;

    // Who may open one, and for how long.
    for bad in [
        json!({"expires_in_seconds": 59}),
        json!({"expires_in_seconds": 86_401}),
        json!({"expires_in_seconds": "600"}),
        json!({"ttl": 600}),
    ] {
        let (status, err) = stack
            .call_as(
                &acme_key,
                "POST",
                "/v1/apps/acme/portal-sessions",
                Some(bad.clone()),
            )
            .await;
        assert_eq!(status, 400, "{bad}: {err}");
    }
    let (status, _) = stack
        .call_as(&globex_key, "POST", "/v1/apps/acme/portal-sessions", None)
        .await;
    assert_eq!(status, 403, "another app's key");
    let (status, _, _) = stack
        .call("POST", "/v1/apps/_operational/portal-sessions", None, &[])
        .await;
    assert_eq!(status, 400, "the operational app has no portal");
    let before = Utc::now();
    let (status, body) = stack
        .call_as(
            &acme_key,
            "POST",
            "/v1/apps/acme/portal-sessions",
            Some(json!({"expires_in_seconds": 600})),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let session: PortalSessionOut = view(&body);
    assert_eq!(session.app_id, "acme");
    assert!(
        session
            .url
            .ends_with(&format!("/portal#app=acme&token={}", session.token)),
        "{}",
        session.url
    );
    let ends_in = (session.expires_at - before).num_seconds();
    assert!((599..=601).contains(&ends_in), "{ends_in}");
    let token = session.token.clone();
    // Stored hashed, listed with its end, never with its token.
    let (_, _, keys) = stack.call("GET", "/v1/apps/acme/api-keys", None, &[]).await;
    assert!(!keys.to_string().contains(token.split_once('.').unwrap().1));
    let listed: ApiKeyList = view(&keys);
    assert!(listed
        .items
        .iter()
        .any(|k| k.id == session.id && k.portal_until == Some(session.expires_at)));

    // The route table drives the rest: every route, its own app and another.
    let mut open = 0;
    for route in routes() {
        let method = route.method.as_str();
        let path = acme.path(&route.path);
        let body = body_for(method, &path, &receiver);
        let (status, answer) = stack.call_as(&token, method, &path, body.clone()).await;
        match route.access {
            Access::Public | Access::Portal => {
                open += 1;
                assert!(
                    ![401, 403].contains(&status),
                    "{method} {path} is open to the app's portal: {status} {answer}"
                );
            }
            Access::AppKey | Access::Admin => assert_eq!(
                (status, error_code(&answer).as_deref()),
                (403, Some("forbidden")),
                "{method} {path} is not for a portal session: {answer}"
            ),
        }
        if route.path.contains("{app_id}") {
            let other = globex.path(&route.path);
            let (status, answer) = stack.call_as(&token, method, &other, body).await;
            assert_eq!(
                (status, error_code(&answer).as_deref()),
                (403, Some("forbidden")),
                "{method} {other} belongs to another app: {answer}"
            );
        }
    }
    assert_eq!(open, 22, "6 public routes and 16 portal routes");
    // What it did to its own app stays there; globex is untouched.
    let (status, globex_ep) = stack
        .call_as(
            &globex_key,
            "GET",
            &format!("/v1/apps/globex/endpoints/{}", globex.endpoint),
            None,
        )
        .await;
    assert_eq!(status, 200);
    assert_ne!(globex_ep["description"], "from the portal");

    // Each check below: a key's call and what it must answer.
    let list = |key: &str| {
        let key = key.to_owned();
        let stack = &stack;
        async move {
            let (status, body) = stack
                .call_as(&key, "GET", "/v1/apps/acme/endpoints", None)
                .await;
            (status, error_code(&body), body)
        }
    };
    let revoke = |key: &str, id: &str| {
        let (key, path) = (
            key.to_owned(),
            format!("/v1/apps/acme/portal-sessions/{id}"),
        );
        let stack = &stack;
        async move { stack.call_as(&key, "DELETE", &path, None).await.0 }
    };

    // A session at its end is refused (the record's end moved to the past:
    // what the clock would do in ten minutes).
    let (status, body) = stack
        .call_as(&acme_key, "POST", "/v1/apps/acme/portal-sessions", None)
        .await;
    assert_eq!(status, 201);
    let short: PortalSessionOut = view(&body);
    assert_eq!(list(&short.token).await.0, 200);
    stack
        .set_attribute(
            &format!("KEY#{}", short.id),
            "KEY",
            "portal_until",
            AttributeValue::S((Utc::now() - chrono::Duration::seconds(1)).to_rfc3339()),
        )
        .await;
    let (status, code, err) = list(&short.token).await;
    assert_eq!((status, code.as_deref()), (401, Some("unauthorized")));
    assert!(err.to_string().contains("expired"), "{err}");

    // Revoked by the app's key: refused at once; an API key cannot be
    // revoked through this route.
    let (key_id, other_key) = stack.new_key("acme").await;
    assert_eq!(
        revoke(&acme_key, &key_id).await,
        404,
        "an API key is not a portal session"
    );
    assert_eq!(list(&other_key).await.0, 200, "still works");
    assert_eq!(
        revoke(&globex_key, &session.id).await,
        403,
        "another app's key"
    );
    assert_eq!(revoke(&acme_key, &session.id).await, 204);
    let (status, code, _) = list(&token).await;
    assert_eq!((status, code.as_deref()), (401, Some("unauthorized")));
    assert_eq!(revoke(&acme_key, &session.id).await, 404, "already revoked");
}

/// A customer's test event (through a portal session): a real, signed
/// delivery to that one endpoint — the catalog example when no payload is
/// given, checked against the type's schema — that the app's other
/// endpoints never get, not even by a replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_test_event_reaches_one_endpoint_only_and_is_never_replayed() {
    let stack = Stack::start(&[]).await;
    let (a, b) = (Receiver::healthy().await, Receiver::healthy().await);
    let since = Utc::now() - chrono::Duration::seconds(1);
    let mut ids = Vec::new();
    for (receiver, types) in [(&a, json!([])), (&b, json!([])), (&b, json!(["user.*"]))] {
        let (status, _, ep) = stack
            .call(
                "POST",
                "/v1/apps/acme/endpoints",
                Some(json!({"url": receiver.url, "event_types": types})),
                &[],
            )
            .await;
        assert_eq!(status, 201, "{ep}");
        receiver.set_secret(&secret_of(&ep));
        ids.push(view::<EndpointOut>(&ep).id);
    }
    let (status, _, _) = stack
        .call(
            "PUT",
            "/v1/event-types/order.paid",
            Some(json!({
                "description": "an order was paid",
                "schema": {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}},
                "example": {"n": 7}
            })),
            &[],
        )
        .await;
    assert_eq!(status, 201);
    let (status, _, _) = stack
        .call("PUT", "/v1/event-types/user.created", Some(json!({})), &[])
        .await;
    assert_eq!(status, 201);
    let (_, _, session) = stack
        .call("POST", "/v1/apps/acme/portal-sessions", None, &[])
        .await;
    let token = view::<PortalSessionOut>(&session).token;
    let test = |endpoint: &str, body: Value| {
        let path = format!("/v1/apps/acme/endpoints/{endpoint}/test");
        let token = token.clone();
        let stack = &stack;
        async move { stack.call_as(&token, "POST", &path, Some(body)).await }
    };

    // The example, to endpoint a only.
    let (status, accepted) = test(&ids[0], json!({"event_type": "order.paid"})).await;
    assert_eq!(status, 202, "{accepted}");
    let response: IngestResponse = view(&accepted);
    assert_eq!(response.delivery_ids.len(), 1);
    let delivery = response.delivery_ids[0].to_string();
    assert!(
        stack
            .pump_until_all(
                std::slice::from_ref(&delivery),
                DeliveryStatus::Delivered,
                T
            )
            .await
    );
    let got = a.received();
    assert_eq!(got.len(), 1);
    assert!(got[0].standard_ok, "signed like any webhook");
    let text = String::from_utf8(got[0].body.clone()).unwrap();
    assert!(
        text.ends_with(r#","data":{"n":7},"test":true}"#),
        "a test event says so in its signed body: {text}"
    );
    // Its own payload, held to the schema.
    let (status, err) = test(
        &ids[0],
        json!({"event_type": "order.paid", "payload": {"n": "x"}}),
    )
    .await;
    assert_eq!(
        (status, error_code(&err).as_deref()),
        (400, Some("payload_schema_mismatch")),
        "{err}"
    );
    // Refusals say why and write nothing.
    for (endpoint, body, code) in [
        (
            &ids[2],
            json!({"event_type": "order.paid"}),
            "not_subscribed",
        ),
        (
            &ids[0],
            json!({"event_type": "user.created"}),
            "payload_required",
        ),
        (
            &ids[0],
            json!({"event_type": "no such type!"}),
            "invalid_input",
        ),
        (&ids[0], json!({"payload": {}}), "invalid_body"),
    ] {
        let (status, err) = test(endpoint, body.clone()).await;
        assert_eq!(
            (status, error_code(&err).as_deref()),
            (400, Some(code)),
            "{body}: {err}"
        );
    }
    let disable = |disabled: bool| {
        let (path, token) = (format!("/v1/apps/acme/endpoints/{}", ids[1]), token.clone());
        let stack = &stack;
        async move {
            let body = Some(json!({ "disabled": disabled }));
            stack.call_as(&token, "PATCH", &path, body).await.0
        }
    };
    assert_eq!(disable(true).await, 200);
    let (status, err) = test(&ids[1], json!({"event_type": "order.paid"})).await;
    assert_eq!(status, 409, "{err}");
    assert_eq!(disable(false).await, 200);

    // b never had it, and a replay of the window does not give it to b.
    let (status, replay) = stack
        .call_as(
            &token,
            "POST",
            &format!("/v1/apps/acme/endpoints/{}/replay", ids[1]),
            Some(json!({"since": since.to_rfc3339()})),
        )
        .await;
    assert_eq!(status, 202, "{replay}");
    assert_eq!(
        (&replay["complete"], &replay["replayed"]),
        (&json!(true), &json!(0)),
        "{replay}"
    );
    stack.pump().await;
    assert!(
        b.received().is_empty(),
        "the test event is endpoint a's alone"
    );
}
