//! The receiver kit on DynamoDB (moto): claim / in-progress / processed /
//! release semantics, and a `Receiver` processing each message once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hookline_aws::clients::{sdk_config, AwsEnvironment};
use hookline_aws::seen::DynamoSeenStore;
use hookline_core::signing::{sign, Schemes, Secret};
use hookline_verify::{Claim, Receiver, SeenStore, Verifier};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_seen_store_and_receiver_process_once() {
    let moto = hookline_tests::moto::start();
    // The SDK configuration the Lambda functions build from their
    // environment (region and the role's credentials as Lambda sets them).
    let aws = AwsEnvironment::from_lookup(|var| match var {
        "AWS_REGION" => Some("us-east-1".into()),
        "AWS_ACCESS_KEY_ID" | "AWS_SECRET_ACCESS_KEY" => Some("testing".into()),
        "AWS_SESSION_TOKEN" => Some("session".into()),
        _ => None,
    })
    .expect("a complete environment");
    let clients = hookline_aws::clients::Clients::from_config(&sdk_config(&aws, Some(&moto.url)));
    DynamoSeenStore::create_table(&clients.dynamodb, "receiver-seen")
        .await
        .unwrap();
    // moto is not safe under concurrent writes; on DynamoDB the conditional put
    // alone makes claims atomic.
    let store = DynamoSeenStore::new(clients.dynamodb.get().clone(), "receiver-seen")
        .serialized(hookline_aws::serial::Serial::one_at_a_time());

    assert_eq!(
        store.claim("m1", Duration::from_secs(60)).await.unwrap(),
        Claim::Claimed
    );
    assert_eq!(
        store.claim("m1", Duration::from_secs(60)).await.unwrap(),
        Claim::InProgress
    );
    store.release("m1").await.unwrap();
    assert_eq!(
        store.claim("m1", Duration::from_secs(60)).await.unwrap(),
        Claim::Claimed
    );
    store
        .mark_processed("m1", Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(
        store.claim("m1", Duration::from_secs(60)).await.unwrap(),
        Claim::AlreadyProcessed
    );
    store.release("m1").await.unwrap();
    assert_eq!(
        store.claim("m1", Duration::from_secs(60)).await.unwrap(),
        Claim::AlreadyProcessed,
        "release never forgets a processed id"
    );
    // An expired lease (the processor died) lets a retry claim.
    assert_eq!(
        store.claim("m2", Duration::ZERO).await.unwrap(),
        Claim::Claimed
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        store.claim("m2", Duration::from_secs(60)).await.unwrap(),
        Claim::Claimed
    );

    let secret = Secret::generate(&mut rand::thread_rng());
    let receiver = Arc::new(Receiver::new(
        Verifier::new(secret.expose()).unwrap(),
        store,
    ));
    let body = br#"{"type":"order.paid","timestamp":"2026-12-02T00:00:00.000Z","data":{}}"#;
    let headers: Vec<(String, String)> = sign(
        "msg_once",
        chrono::Utc::now().timestamp(),
        body,
        &[&secret],
        Schemes::default(),
    )
    .unwrap()
    .iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let runs = Arc::new(AtomicUsize::new(0));
    // A failing processor: 500, not marked.
    let reply = receiver
        .handle(&headers, body, |_| async { Err::<(), _>("db down") })
        .await;
    assert_eq!(reply.status, 500);
    // Concurrent copies, then sequential duplicates: processed once.
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (receiver, runs, headers) = (receiver.clone(), runs.clone(), headers.clone());
        tasks.push(tokio::spawn(async move {
            receiver
                .handle(&headers, body, |_| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, String>(())
                })
                .await
                .status
        }));
    }
    for t in tasks {
        let status = t.await.unwrap();
        assert!(status == 200 || status == 409, "{status}");
    }
    let reply = receiver
        .handle(&headers, body, |_| async { Ok::<_, String>(()) })
        .await;
    assert_eq!(reply.status, 200);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // Bad signature: 401, nothing processed.
    let reply = receiver
        .handle(&headers, b"{}", |_| async { Ok::<_, String>(()) })
        .await;
    assert_eq!(reply.status, 401);
}
