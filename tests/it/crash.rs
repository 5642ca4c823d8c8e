//! Crash safety: the worker running dispatch and deliver is SIGKILLed at random
//! moments, mid-batch, and restarted on the same moto state. Nothing is lost;
//! duplicates at the receiver are counted and reported.

use hookline_tests::delivery_ids as accepted_ids;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hookline_core::model::DeliveryStatus;
use hookline_tests::receiver::{Receiver, Reply};
use hookline_tests::stack::{test_env, Stack};
use hookline_tests::workspace_root;
use rand::Rng;
use serde_json::json;

fn spawn_worker(
    bin: &std::path::Path,
    endpoint: &str,
    checkpoint: &std::path::Path,
    env: &[(&str, &str)],
) -> Child {
    let mut cmd = Command::new(bin);
    cmd.args(["worker", "--endpoint-url", endpoint, "--checkpoint-file"])
        .arg(checkpoint)
        .arg("--template")
        .arg(workspace_root().join("template.yaml"))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(std::env::temp_dir().join("hookline-crash-worker.log"))
                .map(Stdio::from)
                .unwrap_or_else(|_| Stdio::null()),
        );
    for (k, v) in test_env(env) {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn worker")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_worker_loses_nothing() {
    let env = [("WEBHOOKS_RETRY_SCHEDULE", "1s,1s,1s,1s,1s")];
    let stack = Stack::start(&env).await;
    // Messages a killed worker held come back after 3 s instead of 180 s.
    stack.set_queue_visibility(3).await.unwrap();
    let receiver = Receiver::start(vec![], Reply::Slow(Duration::from_millis(400))).await;
    let (_, secret_a) = stack
        .create_endpoint("crash", &format!("{}?a", receiver.url), &[])
        .await;
    let (_, _secret_b) = stack
        .create_endpoint("crash", &format!("{}?b", receiver.url), &[])
        .await;
    receiver.set_secret(&secret_a);

    const EVENTS: usize = 300;
    let mut delivery_ids = Vec::new();
    for i in 0..EVENTS {
        let (status, body) = stack
            .send_event(
                "crash",
                "order.paid",
                json!({"n": i}),
                Some(&format!("crash-{i}")),
            )
            .await;
        assert_eq!(status, 202, "{body}");
        delivery_ids.extend(accepted_ids(&body));
    }
    let expected = delivery_ids.len();
    assert_eq!(expected, EVENTS * 2);

    let bin = hookline_tests::local_binary();
    let checkpoint = std::env::temp_dir().join(format!("hookline-crash-{}.json", stack.moto.port));
    let _ = std::fs::remove_file(&checkpoint);
    let mut kills = 0;
    let mut rng = rand::thread_rng();
    for _ in 0..5 {
        let mut worker = spawn_worker(&bin, &stack.moto.url, &checkpoint, &env);
        // Kill mid-work: wait until this worker has sent at least one request
        // (it may need a moment to start), then a random moment later.
        let seen = receiver.received().len();
        let deadline = Instant::now() + Duration::from_secs(30);
        while receiver.received().len() == seen && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let pause = rng.gen_range(0..600);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        worker.kill().expect("SIGKILL the worker");
        worker.wait().expect("reap the worker");
        kills += 1;
    }
    let delivered_before_drain = receiver.unique_accepted();

    // A last worker drains everything.
    let mut worker = spawn_worker(&bin, &stack.moto.url, &checkpoint, &env);
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut delivered = 0;
    while Instant::now() < deadline {
        // Cheap signal first (the receiver), then the table's word on each.
        if receiver.unique_accepted() < expected {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        delivered = 0;
        for id in &delivery_ids {
            if stack.delivery(id).await.status == DeliveryStatus::Delivered {
                delivered += 1;
            }
        }
        if delivered == expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if delivered < expected {
        delivered = 0;
        for id in &delivery_ids {
            if stack.delivery(id).await.status == DeliveryStatus::Delivered {
                delivered += 1;
            }
        }
    }
    worker.kill().expect("stop the last worker");
    worker.wait().expect("reap the last worker");
    let _ = std::fs::remove_file(&checkpoint);

    let lost = expected - delivered;
    let duplicates = receiver.duplicates();
    let figures = format!(
        "crash test: events accepted {EVENTS}, deliveries expected {expected}, SIGKILLs {kills}, delivered before drain {delivered_before_drain}, \
         delivered {delivered}, lost {lost}, receiver unique {}, duplicates {duplicates}",
        receiver.unique_accepted()
    );
    println!("{figures}");
    hookline_tests::record_figures("crash", &figures);
    assert_eq!(lost, 0, "deliveries lost");
    assert_eq!(
        receiver.unique_accepted(),
        expected,
        "every delivery reached the receiver"
    );
    assert!(
        delivered_before_drain < expected,
        "the kills happened before the work was done"
    );
}
