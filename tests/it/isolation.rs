//! Tenant isolation and hardening, on moto through the API: what the least
//! privileged credential can cost others (limits refused with their code,
//! nothing lost or leaked).

use std::time::Duration;

use hookline_tests::receiver::Receiver;
use hookline_tests::stack::Stack;
use hookline_tests::{error_code, record_figures, secret_of};
use serde_json::{json, Value};

async fn create(stack: &Stack, app: &str, url: &str) -> (u16, Value) {
    let (status, _, body) = stack
        .call(
            "POST",
            &format!("/v1/apps/{app}/endpoints"),
            Some(json!({"url": url})),
            &[],
        )
        .await;
    (status, body)
}

/// `WEBHOOKS_MAX_ENDPOINTS_PER_APP`: the app at its limit gets 409
/// `too_many_endpoints` (nothing written); six creations at once against a
/// limit of 3 leave exactly 3; another app is not affected; a deletion makes
/// room again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_per_app_stop_at_the_limit_even_when_created_at_once() {
    let stack = Stack::start(&[("WEBHOOKS_MAX_ENDPOINTS_PER_APP", "3")]).await;
    let receiver = Receiver::healthy().await;
    let attempts =
        futures::future::join_all((0..6).map(|_| create(&stack, "busy", &receiver.url))).await;
    let created: Vec<&Value> = attempts
        .iter()
        .filter(|(status, _)| *status == 201)
        .map(|(_, body)| body)
        .collect();
    assert_eq!(created.len(), 3, "{attempts:?}");
    for (status, body) in attempts.iter().filter(|(status, _)| *status != 201) {
        assert_eq!(
            (*status, error_code(body).as_deref()),
            (409, Some("too_many_endpoints")),
            "{body}"
        );
    }
    let (status, _, list) = stack
        .call("GET", "/v1/apps/busy/endpoints", None, &[])
        .await;
    assert_eq!(
        (status, list["items"].as_array().map(Vec::len)),
        (200, Some(3))
    );
    let (status, _) = create(&stack, "other", &receiver.url).await;
    assert_eq!(status, 201, "another app has its own limit");
    let first = created[0]["id"].as_str().unwrap().to_owned();
    let (status, _) = stack
        .endpoint_call("DELETE", "busy", &first, "", None)
        .await;
    assert_eq!(status, 204);
    let (status, body) = create(&stack, "busy", &receiver.url).await;
    assert_eq!(status, 201, "a deletion makes room: {body}");
    let (status, body) = create(&stack, "busy", &receiver.url).await;
    assert_eq!(
        (status, error_code(&body).as_deref()),
        (409, Some("too_many_endpoints"))
    );
    record_figures(
        "isolation",
        "WEBHOOKS_MAX_ENDPOINTS_PER_APP=3 on moto: 6 creations at once -> 3 created, 3 refused 409 too_many_endpoints; another app unaffected; a deletion makes room for one",
    );
}

/// At most five valid secrets: four rotations within the overlap make
/// five; the fifth rotation is refused (409 `too_many_secrets`) and the
/// endpoint still signs with the five (a delivery verifies with the newest).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotations_stop_at_five_valid_secrets() {
    let stack = Stack::start(&[]).await;
    let receiver = Receiver::healthy().await;
    let (status, body) = create(&stack, "shop", &receiver.url).await;
    assert_eq!(status, 201);
    let id = body["id"].as_str().unwrap().to_owned();
    let mut newest = secret_of(&body);
    for _ in 0..4 {
        let (status, body) = stack
            .endpoint_call("POST", "shop", &id, "/rotate-secret", None)
            .await;
        assert_eq!(status, 200, "{body}");
        newest = secret_of(&body);
    }
    let (status, body) = stack
        .endpoint_call("POST", "shop", &id, "/rotate-secret", None)
        .await;
    assert_eq!(
        (status, error_code(&body).as_deref()),
        (409, Some("too_many_secrets")),
        "{body}"
    );
    assert!(
        !body.to_string().contains("whsec_"),
        "no secret in an error: {body}"
    );
    receiver.set_secret(&newest);
    let (status, _) = stack
        .send_event("shop", "order.paid", json!({"n": 1}), None)
        .await;
    assert_eq!(status, 202);
    let ok = stack
        .pump_until(Duration::from_secs(60), || async {
            receiver.unique_accepted() == 1
        })
        .await;
    assert!(ok, "delivered");
    let got = &receiver.accepted()[0];
    assert!(got.standard_ok, "signed with the newest secret");
    let signatures = got.headers["webhook-signature"].split(' ').count();
    assert_eq!(signatures, 5, "one signature per valid secret");
    record_figures(
        "isolation",
        "rotations on moto: 4 within the overlap -> 5 valid secrets (5 signatures per request); the 5th rotation refused 409 too_many_secrets",
    );
}

/// One running replay per endpoint: a second start while the first runs
/// is 409 `replay_running`; once it completed, another starts. A window
/// reaching past the retention is 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_running_replay_per_endpoint_and_windows_within_the_retention() {
    // No inline work: a replay runs in the background from its first call.
    let stack = Stack::start(&[("WEBHOOKS_REPLAY_INLINE_BUDGET", "0s")]).await;
    let receiver = Receiver::healthy().await;
    let (status, body) = create(&stack, "shop", &receiver.url).await;
    assert_eq!(status, 201);
    let id = body["id"].as_str().unwrap().to_owned();
    let since = chrono::Utc::now() - chrono::Duration::hours(1);
    let window = json!({"since": since.to_rfc3339()});
    let (status, first) = stack
        .endpoint_call("POST", "shop", &id, "/replay", Some(window.clone()))
        .await;
    assert_eq!(
        (status, first["complete"].as_bool()),
        (202, Some(false)),
        "{first}"
    );
    let (status, body) = stack
        .endpoint_call("POST", "shop", &id, "/replay", Some(window.clone()))
        .await;
    assert_eq!(
        (status, error_code(&body).as_deref()),
        (409, Some("replay_running")),
        "{body}"
    );
    // Another endpoint's replay is not held back.
    let (_, other) = create(&stack, "shop", &receiver.url).await;
    let other = other["id"].as_str().unwrap().to_owned();
    let (status, _) = stack
        .endpoint_call("POST", "shop", &other, "/replay", Some(window.clone()))
        .await;
    assert_eq!(status, 202);
    // The background (the stream's record of it) completes the first.
    let status_url = format!("/replays/{}", first["id"].as_str().unwrap());
    let done = stack
        .pump_until(Duration::from_secs(60), || async {
            let (_, replay) = stack
                .endpoint_call("GET", "shop", &id, &status_url, None)
                .await;
            replay["complete"].as_bool() == Some(true)
        })
        .await;
    assert!(done, "the first replay completes");
    let (status, body) = stack
        .endpoint_call("POST", "shop", &id, "/replay", Some(window))
        .await;
    assert_eq!(status, 202, "{body}");
    let old = chrono::Utc::now() - chrono::Duration::days(31);
    let (status, body) = stack
        .endpoint_call(
            "POST",
            "shop",
            &id,
            "/replay",
            Some(json!({"since": old.to_rfc3339()})),
        )
        .await;
    assert_eq!(
        (status, error_code(&body).as_deref()),
        (400, Some("invalid_time_range")),
        "{body}"
    );
    record_figures(
        "isolation",
        "replays on moto: a second start while one runs -> 409 replay_running (another endpoint's starts); after it completes, another starts; a window past the 30-day retention -> 400",
    );
}

/// A URL change drops every credential-like custom header the same PATCH
/// does not give again (a masked value is not a value): the new host never
/// gets the old host's credentials; other headers stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_change_drops_the_old_hosts_credentials() {
    let stack = Stack::start(&[]).await;
    let old_host = Receiver::healthy().await;
    let new_host = Receiver::healthy().await;
    let (status, _, body) = stack
        .call(
            "POST",
            "/v1/apps/shop/endpoints",
            Some(json!({"url": old_host.url, "headers": {
                "Authorization": "Bearer old-host-token",
                "X-Api-Key": "old-host-key",
                "X-Tenant": "acme"}})),
            &[],
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let id = body["id"].as_str().unwrap().to_owned();
    // The masks an answer shows, sent back with the new URL: not values.
    let (status, body) = stack
        .endpoint_call(
            "PATCH",
            "shop",
            &id,
            "",
            Some(json!({"url": new_host.url, "headers": {
                "Authorization": "********", "X-Api-Key": "new-host-key", "X-Tenant": "acme"}})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let headers = body["headers"].as_object().unwrap();
    assert!(!headers.contains_key("Authorization"), "{body}");
    assert_eq!(headers["X-Api-Key"], "********");
    assert_eq!(headers["X-Tenant"], "acme");
    let (status, _) = stack
        .send_event("shop", "order.paid", json!({"n": 1}), None)
        .await;
    assert_eq!(status, 202);
    let ok = stack
        .pump_until(Duration::from_secs(60), || async {
            new_host.unique_accepted() == 1
        })
        .await;
    assert!(ok, "delivered to the new host");
    let got = &new_host.accepted()[0].headers;
    assert!(!got.contains_key("authorization"), "{got:?}");
    assert_eq!(
        got.get("x-api-key").map(String::as_str),
        Some("new-host-key")
    );
    assert_eq!(got.get("x-tenant").map(String::as_str), Some("acme"));
    assert!(old_host.received().is_empty());
    // Without a URL change a mask keeps the stored value.
    let (status, body) = stack
        .endpoint_call(
            "PATCH",
            "shop",
            &id,
            "",
            Some(json!({"headers": {"X-Api-Key": "********"}})),
        )
        .await;
    assert_eq!(
        (status, &body["headers"]["X-Api-Key"]),
        (200, &json!("********"))
    );
    record_figures(
        "isolation",
        "a URL change on moto: Authorization (masked in the PATCH) dropped, X-Api-Key given again kept, X-Tenant kept; the new host got no old credential",
    );
}

/// A test event's delivered body says `"test": true` inside the signed
/// bytes (the signature verifies over it); a real event's has no `test`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_test_event_says_so_inside_its_signed_body() {
    let stack = Stack::start(&[]).await;
    let receiver = Receiver::healthy().await;
    let (status, body) = create(&stack, "shop", &receiver.url).await;
    assert_eq!(status, 201);
    receiver.set_secret(&secret_of(&body));
    let id = body["id"].as_str().unwrap().to_owned();
    let (status, body) = stack
        .endpoint_call(
            "POST",
            "shop",
            &id,
            "/test",
            Some(json!({"event_type": "order.paid", "payload": {"n": 1}})),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let (status, _) = stack
        .send_event("shop", "order.paid", json!({"n": 2}), None)
        .await;
    assert_eq!(status, 202);
    let ok = stack
        .pump_until(Duration::from_secs(60), || async {
            receiver.unique_accepted() == 2
        })
        .await;
    assert!(ok, "both delivered");
    for got in receiver.accepted() {
        assert!(got.standard_ok, "signed over the body as delivered");
        let body: Value = serde_json::from_slice(&got.body).unwrap();
        match body["data"]["n"].as_i64() {
            Some(1) => assert_eq!(body["test"], json!(true), "{body}"),
            _ => assert!(body.get("test").is_none(), "{body}"),
        }
    }
    record_figures(
        "isolation",
        "a test event on moto: delivered body {type, timestamp, data, test: true}, signature verified over it; a real event has no test member",
    );
}

/// A portal session opened with an app key ends when that key is deleted
/// (401 from then on); one the admin opened does not. `GET
/// .../portal-sessions` lists the live ones (id, expires_at, created_at),
/// never a token; an app has at most 100 live sessions (409
/// `too_many_sessions`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portal_sessions_end_with_their_key_and_are_listed_without_tokens() {
    let stack = Stack::start(&[]).await;
    let (key_id, key) = stack.new_key("shop").await;
    let open = |bearer: Option<String>| {
        let stack = &stack;
        async move {
            let (status, body) = match bearer {
                Some(key) => {
                    stack
                        .call_as(&key, "POST", "/v1/apps/shop/portal-sessions", None)
                        .await
                }
                None => {
                    let (status, _, body) = stack
                        .call("POST", "/v1/apps/shop/portal-sessions", None, &[])
                        .await;
                    (status, body)
                }
            };
            assert_eq!(status, 201, "{body}");
            (
                body["id"].as_str().unwrap().to_owned(),
                body["token"].as_str().unwrap().to_owned(),
            )
        }
    };
    let (by_key, by_key_token) = open(Some(key.clone())).await;
    let (by_admin, by_admin_token) = open(None).await;
    let portal_call = |token: String| {
        let stack = &stack;
        async move {
            stack
                .call_as(&token, "GET", "/v1/apps/shop/endpoints", None)
                .await
                .0
        }
    };
    assert_eq!(portal_call(by_key_token.clone()).await, 200);
    let (status, list) = stack
        .call_as(&key, "GET", "/v1/apps/shop/portal-sessions", None)
        .await;
    assert_eq!(status, 200, "{list}");
    let ids: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [by_key.as_str(), by_admin.as_str()]);
    let text = list.to_string();
    assert!(
        !text.contains(&by_key_token) && !text.contains("token"),
        "{list}"
    );
    // The key that opened it is deleted: its session ends with it.
    let (status, _, _) = stack
        .call(
            "DELETE",
            &format!("/v1/apps/shop/api-keys/{key_id}"),
            None,
            &[],
        )
        .await;
    assert_eq!(status, 204);
    assert_eq!(portal_call(by_key_token).await, 401);
    assert_eq!(
        portal_call(by_admin_token).await,
        200,
        "the admin's still works"
    );
    let (_, _, list) = stack
        .call("GET", "/v1/apps/shop/portal-sessions", None, &[])
        .await;
    assert_eq!(list["items"].as_array().map(Vec::len), Some(1), "{list}");
    // At most 100 live sessions.
    for _ in 1..100 {
        open(None).await;
    }
    let (status, _, body) = stack
        .call("POST", "/v1/apps/shop/portal-sessions", None, &[])
        .await;
    assert_eq!(
        (status, error_code(&body).as_deref()),
        (409, Some("too_many_sessions")),
        "{body}"
    );
    record_figures(
        "isolation",
        "portal sessions on moto: one opened with an app key answers 401 once the key is deleted (the admin's keeps working); the list shows the live ones without tokens; the 101st live session -> 409 too_many_sessions",
    );
}

/// How many of `ids` have failed.
async fn failed_among(stack: &Stack, ids: &[String]) -> usize {
    let mut failed = 0;
    for id in ids {
        if stack.delivery(id).await.status == hookline_core::model::DeliveryStatus::Failed {
            failed += 1;
        }
    }
    failed
}

/// #39 item 10: a hung endpoint cannot starve other tenants. The local
/// pollers run the deliver mapping's `MaximumConcurrency` (10) batches of
/// 10 at once, as Lambda does, with a 5 s delivery timeout. One app's
/// endpoint never answers and is sent 200 events, another app's healthy
/// endpoint 10 among them (each within 8 s of its 202: the first wave,
/// sent before any request timed out, holds its environments a delivery
/// timeout) and then 20 (each within 5 s of its 202). The hung endpoint's
/// circuit opens (GET shows it), its deliveries wait without attempts and
/// still end by their schedule: every one failed (a DLQ copy each), none
/// lost, none left pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_endpoint_does_not_starve_another_apps_endpoint() {
    let _alone = hookline_tests::WALL_CLOCK.lock().await;
    use hookline_core::model::DeliveryStatus;
    use hookline_tests::delivery_ids;
    use hookline_tests::receiver::Reply;
    use std::time::Instant;
    let stack = Stack::start(&[
        ("WEBHOOKS_DELIVERY_TIMEOUT", "5s"),
        ("WEBHOOKS_RETRY_SCHEDULE", "2s,4s"),
    ])
    .await;
    let hung = Receiver::start(vec![], Reply::Slow(Duration::from_secs(3600))).await;
    let healthy = Receiver::healthy().await;
    let (hung_ep, _) = stack.subscribe("stuck", &hung).await;
    stack.subscribe("fine", &healthy).await;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let test = async {
        // The healthy app's events, each timed from its 202 (`n` numbers
        // them in order).
        let mut accepted_at = Vec::new();
        let send_healthy = |n: usize| {
            let stack = &stack;
            async move {
                let (status, body) = stack
                    .send_event("fine", "order.paid", json!({"n": n}), None)
                    .await;
                assert_eq!(status, 202, "{body}");
                Instant::now()
            }
        };
        // 10 among the 200, one after every 20 (the first while the first
        // wave is in flight).
        let started = Instant::now();
        let mut stuck = Vec::new();
        for n in 0..200 {
            let (status, body) = stack
                .send_event("stuck", "order.paid", json!({"n": n}), None)
                .await;
            assert_eq!(status, 202, "{body}");
            stuck.extend(delivery_ids(&body));
            if n % 20 == 19 {
                accepted_at.push(send_healthy(accepted_at.len()).await);
            }
        }
        let sent_200_in = started.elapsed();
        // Then 20, as the issue tells it.
        for _ in 0..20 {
            accepted_at.push(send_healthy(accepted_at.len()).await);
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while healthy.unique_accepted() < 30 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(healthy.unique_accepted(), 30, "every healthy event arrived");
        let mut waits = vec![Duration::MAX; 30];
        for got in healthy.accepted() {
            let body: Value = serde_json::from_slice(&got.body).unwrap();
            let n = usize::try_from(body["data"]["n"].as_u64().unwrap()).unwrap();
            waits[n] = waits[n].min(got.at.saturating_duration_since(accepted_at[n]));
        }
        let (among, after) = waits.split_at(10);
        let longest_among = among.iter().max().copied().expect("10");
        let longest_after = after.iter().max().copied().expect("20");
        // Among: the first wave's delivery timeout (requests sent before
        // any timed out hold their environments that long), and 3 s to
        // work through the held backlog on moto.
        assert!(
            longest_among <= Duration::from_secs(8),
            "a healthy event sent among the hung one's waited {longest_among:?} after its 202 (all: {among:?})"
        );
        assert!(
            longest_after <= Duration::from_secs(5),
            "a healthy event sent after the hung one's waited {longest_after:?} after its 202 (all: {after:?})"
        );
        // The hung endpoint's circuit is open, and shown.
        let (status, shown) = stack
            .endpoint_call("GET", "stuck", &hung_ep, "", None)
            .await;
        assert_eq!(status, 200);
        assert!(
            shown["circuit"]["open_until"].is_string(),
            "GET shows the open circuit: {shown}"
        );
        // Its deliveries end by their schedule: every one failed.
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut pending = stuck.clone();
        while !pending.is_empty() && Instant::now() < deadline {
            let mut still = Vec::new();
            for id in pending {
                if stack.delivery(&id).await.status == DeliveryStatus::Pending {
                    still.push(id);
                }
            }
            pending = still;
            if !pending.is_empty() {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        if let Some(id) = pending.first() {
            let d = stack.delivery(id).await;
            panic!(
                "{} still pending, e.g. {id}: attempts {}, next {:?}, held to {:?}, version {}",
                pending.len(),
                d.attempt_count,
                d.next_attempt_at,
                d.held_until_deadline,
                d.version
            );
        }
        assert_eq!(
            failed_among(&stack, &stuck).await,
            200,
            "none delivered to a hung endpoint, none lost"
        );
        let requests = hung.received().len();
        // Without the circuit: 600 (3 attempts each), each holding a
        // deliver slot 5 s.
        assert!(
            requests <= 50,
            "{requests} requests to the hung endpoint: the circuit did not step around it"
        );
        stop.send(true).expect("the pollers listen");
        record_figures(
            "isolation",
            &format!(
                "hung endpoint: 200 events (sent in {:.1} s) to an endpoint that never answers, 5 s delivery timeout, 10 deliver environments: it got {requests} requests instead of 600 (its circuit opened after the first wave), all 200 failed by their schedule (none lost); another app's 10 events sent among them arrived within {:.2} s of their 202 (bound 8 s: the first wave's 5 s timeout, then the held backlog), its 20 sent after within {:.2} s (bound 5 s)",
                sent_200_in.as_secs_f64(),
                longest_among.as_secs_f64(),
                longest_after.as_secs_f64(),
            ),
        );
    };
    futures::future::join(stack.run_pollers(stopped), test).await;
}

/// #39 item 10, the store's part on moto: an endpoint's run of unanswered
/// requests grows across writers, starts over when begun before the
/// window, ends with an answer or when the circuit opens; no run is added
/// to an open circuit; circuit changes are conditional on the circuit
/// judged. A held delivery keeps its deadline through `update_delivery`
/// (every field read back as written).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoints_circuit_and_a_held_delivery_round_trip_on_moto() {
    use chrono::{TimeDelta, Utc};
    use hookline_core::circuit::Circuit;
    use hookline_core::ids::{AppId, DeliveryId, EndpointId, EventId};
    use hookline_core::model::{Delivery, Event, EventType};
    use hookline_pipeline::ports::Store;
    let stack = Stack::start(&[]).await;
    let receiver = Receiver::healthy().await;
    let app = AppId::parse("shop").unwrap();
    let (ep, _) = stack.create_endpoint("shop", &receiver.url, &[]).await;
    let ep = EndpointId::parse(&ep).unwrap();
    let store = &stack.store;
    // Turns are kept to the millisecond.
    let now = chrono::DateTime::from_timestamp_millis(Utc::now().timestamp_millis()).unwrap();
    let window = now - TimeDelta::seconds(60);
    let version = store
        .get_endpoint(&app, &ep)
        .await
        .unwrap()
        .unwrap()
        .version;
    let run = |at| store.add_unanswered(&app, &ep, version, at, window);
    assert_eq!(run(now).await.unwrap(), Some(1));
    assert_eq!(run(now).await.unwrap(), Some(2));
    let read = store.get_endpoint(&app, &ep).await.unwrap().unwrap();
    assert_eq!(read.unanswered_count, 2);
    let since = read.unanswered_since.expect("the run's start");
    assert!((since - now).num_milliseconds().abs() <= 1);
    // An answer ends the run (twice: the second finds none).
    store.clear_unanswered(&app, &ep).await.unwrap();
    store.clear_unanswered(&app, &ep).await.unwrap();
    let read = store.get_endpoint(&app, &ep).await.unwrap().unwrap();
    assert_eq!((read.unanswered_count, read.unanswered_since), (0, None));
    // A run begun before the window starts over.
    assert_eq!(
        store
            .add_unanswered(&app, &ep, version, now - TimeDelta::seconds(90), window)
            .await
            .unwrap(),
        Some(1)
    );
    assert_eq!(run(now).await.unwrap(), Some(1), "started over");
    assert_eq!(run(now).await.unwrap(), Some(2));
    // Opening: only from closed, and it ends the run.
    let open = Circuit::opened(now, Some("timed out after 15s"));
    assert!(store
        .set_circuit(&app, &ep, version, Some(&open), None)
        .await
        .unwrap());
    assert!(!store
        .set_circuit(&app, &ep, version, Some(&open), None)
        .await
        .unwrap());
    let read = store.get_endpoint(&app, &ep).await.unwrap().unwrap();
    assert_eq!(read.circuit.as_ref(), Some(&open));
    assert_eq!(read.unanswered_count, 0);
    assert_eq!(run(now).await.unwrap(), None, "no run while open");
    // Closing: only the circuit judged.
    let wrong = Some(open.open_until + TimeDelta::seconds(1));
    assert!(!store
        .set_circuit(&app, &ep, version, None, wrong)
        .await
        .unwrap());
    assert!(store
        .set_circuit(&app, &ep, version, None, Some(open.open_until))
        .await
        .unwrap());
    let read = store.get_endpoint(&app, &ep).await.unwrap().unwrap();
    assert_eq!(read.circuit, None);
    // After a PATCH (another version), what a deliver judged from the
    // copy before it is not written.
    let (status, _) = stack
        .endpoint_call(
            "PATCH",
            "shop",
            &ep,
            "",
            Some(json!({"description": "new"})),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(run(now).await.unwrap(), None, "judged before the PATCH");
    assert!(!store
        .set_circuit(&app, &ep, version, Some(&open), None)
        .await
        .unwrap());
    let gone = EndpointId::generate();
    assert_eq!(
        store
            .add_unanswered(&app, &gone, version, now, window)
            .await
            .unwrap(),
        None
    );
    // A slow endpoint's turns: idle -> now; busy -> the next free one;
    // once passed, idle again.
    let gap = Duration::from_millis(7_500);
    let step = TimeDelta::milliseconds(7_500);
    let turn = |at| store.take_turn(&app, &ep, at, gap);
    assert_eq!(turn(now).await.unwrap(), Some(now));
    assert_eq!(turn(now).await.unwrap(), Some(now + step));
    assert_eq!(turn(now + step).await.unwrap(), Some(now + step * 2));
    let later = now + step * 10;
    assert_eq!(turn(later).await.unwrap(), Some(later), "idle again");
    let read = store.get_endpoint(&app, &ep).await.unwrap().unwrap();
    assert_eq!(read.turn_next, Some(later + step));
    assert_eq!(store.take_turn(&app, &gone, now, gap).await.unwrap(), None);

    // A held delivery, written then read back whole.
    let payload = serde_json::value::RawValue::from_string("{}".to_owned()).unwrap();
    let mut rng = rand::thread_rng();
    let event = Event::new(
        EventId::new(now, &mut rng),
        app.clone(),
        EventType::parse("order.paid").unwrap(),
        &payload,
        now,
    );
    let mut delivery = Delivery::new(DeliveryId::new(now, &mut rng), &event, ep.clone(), now);
    assert!(store.update_delivery(&delivery, 0).await.unwrap());
    let deadline = now + TimeDelta::seconds(6);
    assert!(delivery
        .hold(
            now + TimeDelta::seconds(30),
            Some(TimeDelta::seconds(6)),
            now
        )
        .unwrap());
    assert!(store.update_delivery(&delivery, 0).await.unwrap());
    let read = store
        .get_delivery(&app, &delivery.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read.held_until_deadline, Some(deadline));
    assert_eq!(read.next_attempt_at, Some(deadline));
    assert_eq!(read, delivery, "every field as written");
    // Waiting for a slow endpoint's turn, likewise.
    let version = delivery.version;
    let turn_at = now + TimeDelta::seconds(5);
    assert!(delivery
        .wait_turn(turn_at, TimeDelta::seconds(6), now)
        .unwrap());
    assert!(store.update_delivery(&delivery, version).await.unwrap());
    let read = store
        .get_delivery(&app, &delivery.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read.turn_at, Some(turn_at));
    assert_eq!(read, delivery, "every field as written");
}

/// #39 item 10, an endpoint that answers but slowly (2 s, of a 5 s
/// timeout): its requests go in turns across the 10 deliver environments,
/// so it holds about `SLOW_SHARE` (2) of them at once; another app's
/// healthy endpoint, sent 20 events after its 60, gets each within 3 s of
/// its 202; the slow one's deliveries wait for their turns without
/// burning attempts (none failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_endpoint_holds_at_most_its_share_of_deliver() {
    let _alone = hookline_tests::WALL_CLOCK.lock().await;
    use hookline_core::circuit::SLOW_SHARE;
    use hookline_tests::delivery_ids;
    use hookline_tests::receiver::Reply;
    use std::time::Instant;
    let answer_in = Duration::from_secs(2);
    // A schedule of 2 minutes: the 60 turns (1 s apart) come within it.
    let stack = Stack::start(&[
        ("WEBHOOKS_DELIVERY_TIMEOUT", "5s"),
        ("WEBHOOKS_RETRY_SCHEDULE", "1m,1m"),
    ])
    .await;
    let slow = Receiver::start(vec![], Reply::Slow(answer_in)).await;
    let healthy = Receiver::healthy().await;
    stack.subscribe("sluggish", &slow).await;
    stack.subscribe("fine", &healthy).await;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let test = async {
        let mut paced = Vec::new();
        let send_slow = |n: u32| {
            let stack = &stack;
            async move {
                let (status, body) = stack
                    .send_event("sluggish", "order.paid", json!({"n": n}), None)
                    .await;
                assert_eq!(status, 202, "{body}");
                delivery_ids(&body)
            }
        };
        for n in 0..60 {
            paced.extend(send_slow(n).await);
        }
        // Its first requests all go at once (nothing knows it is slow
        // before it answers): from its second answer, plus a second for
        // deliver to judge it, it is paced; 20 more events then go in turns
        // whatever this machine's speed left of the first 60.
        let deadline = Instant::now() + Duration::from_secs(30);
        while slow.received().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let first_request = slow
            .received()
            .first()
            .map(|r| r.at)
            .expect("the slow endpoint got its first requests");
        tokio::time::sleep_until((first_request + 2 * answer_in + Duration::from_secs(1)).into())
            .await;
        let measured_from = Instant::now();
        for n in 60..80 {
            paced.extend(send_slow(n).await);
        }
        let mut accepted_at = Vec::new();
        for n in 0..20 {
            let (status, body) = stack
                .send_event("fine", "order.paid", json!({"n": n}), None)
                .await;
            assert_eq!(status, 202, "{body}");
            accepted_at.push(Instant::now());
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while healthy.unique_accepted() < 20 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(healthy.unique_accepted(), 20, "every healthy event arrived");
        let mut longest = Duration::ZERO;
        for got in healthy.accepted() {
            let body: Value = serde_json::from_slice(&got.body).unwrap();
            let n = usize::try_from(body["data"]["n"].as_u64().unwrap()).unwrap();
            longest = longest.max(got.at.saturating_duration_since(accepted_at[n]));
        }
        assert!(
            longest <= Duration::from_secs(3),
            "a healthy event waited {longest:?} after its 202"
        );
        // Its requests once it is known slow: they go on in turns (2.5 s
        // apart), never more than its share in flight at once (each lasts
        // 2 s).
        let paced_requests = || {
            slow.received()
                .iter()
                .map(|r| r.at)
                .filter(|at| *at >= measured_from)
                .collect::<Vec<Instant>>()
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while paced_requests().len() < 4 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let starts = paced_requests();
        assert!(
            starts.len() >= 4,
            "the slow endpoint's turns go on: {}",
            starts.len()
        );
        let most_at_once = starts
            .iter()
            .map(|t| {
                starts
                    .iter()
                    .filter(|s| **s <= *t && t.duration_since(**s) < answer_in)
                    .count()
            })
            .max()
            .unwrap_or(0);
        // Turns keep SLOW_SHARE in flight on average over the paced span
        // (each request busy for its 2 s answer). A moment may see more: a
        // turn's start moves by the queue's whole-second delays, and a busy
        // machine picks late turns up together; unpaced, the 10
        // environments would keep 10 or more in flight.
        let span = starts
            .iter()
            .max()
            .zip(starts.iter().min())
            .map(|(last, first)| last.duration_since(*first) + answer_in)
            .expect("paced requests");
        let mean_in_flight = starts.len() as f64 * answer_in.as_secs_f64() / span.as_secs_f64();
        assert!(
            mean_in_flight <= f64::from(2 * SLOW_SHARE),
            "{mean_in_flight:.1} requests in flight on average to the slow endpoint ({most_at_once} at most at once)"
        );
        assert_eq!(
            failed_among(&stack, &paced).await,
            0,
            "waiting for a turn burns no attempt"
        );
        let sent = slow.received().len();
        stop.send(true).expect("the pollers listen");
        record_figures(
            "isolation",
            &format!(
                "slow endpoint: 60 events, then 20 more once it is known slow, to an endpoint answering in 2 s (5 s timeout), 10 deliver environments: {mean_in_flight:.1} of its requests in flight on average once paced ({most_at_once} at most at once) (share {SLOW_SHARE}, turns half its answers' time apart), {sent} sent so far and none failed (the rest wait for their turns); another app's 20 events after them each arrived within {:.2} s of their 202 (bound 3 s)",
                longest.as_secs_f64()
            ),
        );
    };
    futures::future::join(stack.run_pollers(stopped), test).await;
}
