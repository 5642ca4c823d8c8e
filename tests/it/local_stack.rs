//! The README's main command: `hookline-local up` (what `infra/local/up` runs).
//! The demo completes with every delivery accounted for; without `--demo` the
//! stack serves the API until SIGTERM and then stops cleanly, moto included.

use hookline_ingest::views::DeliveryOut;
use hookline_tests::{first_delivery, secret_of, view};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hookline_tests::receiver::Receiver;
use hookline_tests::workspace_root;

/// Kills and reaps the child if the test fails before stopping it (by PID).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

fn port_open(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200))
        .is_ok()
}

#[test]
fn demo_accounts_for_every_delivery() {
    hookline_tests::moto::ensure_installed();
    let output = Command::new(hookline_tests::local_binary())
        .args(["up", "--demo", "--port", "0", "--template"])
        .arg(workspace_root().join("template.yaml"))
        .env("RUST_LOG", "error")
        .env_remove("WEBHOOKS_RETRY_SCHEDULE")
        .current_dir(workspace_root())
        .output()
        .expect("run the demo");
    let stdout = String::from_utf8_lossy(&output.stdout);
    println!("{stdout}");
    assert!(
        output.status.success(),
        "demo failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("every delivery accounted for"), "{stdout}");
    assert!(
        stdout.contains("redrive -> 200"),
        "the demo redrives the DLQ: {stdout}"
    );
}

#[test]
fn stack_serves_the_api_and_stops_cleanly_on_sigterm() {
    hookline_tests::moto::ensure_installed();
    let mut child = KillOnDrop(
        Command::new(hookline_tests::local_binary())
            .args(["up", "--port", "0", "--template"])
            .arg(workspace_root().join("template.yaml"))
            .env("RUST_LOG", "error")
            .env("WEBHOOKS_ADMIN_KEY", "k-local")
            .current_dir(workspace_root())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the stack"),
    );
    let mut lines = BufReader::new(child.0.stdout.take().expect("stdout")).lines();
    let (mut api_port, mut moto_port) = (0u16, 0u16);
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline && (api_port == 0 || moto_port == 0) {
        let Some(Ok(line)) = lines.next() else { break };
        let port_of = |l: &str| {
            l.split("127.0.0.1:")
                .nth(1)
                .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|p| p.parse().ok())
        };
        if line.trim_start().starts_with("API") {
            api_port = port_of(&line).unwrap_or(0);
        }
        if line.trim_start().starts_with("AWS") {
            moto_port = port_of(&line).unwrap_or(0);
        }
    }
    assert!(
        api_port > 0 && moto_port > 0,
        "stack did not print its addresses"
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // An external client, HTTP only: register an endpoint, send an event,
        // watch it get delivered to a loopback receiver, both signatures valid.
        let http = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{api_port}");
        // Public without a key; everything else refused without one.
        for (path, status) in [("/health", 200), ("/v1/apps/a/endpoints", 401)] {
            let response = http.get(format!("{base}{path}")).send().await.unwrap();
            assert_eq!(response.status().as_u16(), status, "{path}");
        }
        let receiver = Receiver::healthy().await;
        let created: serde_json::Value = http
            .post(format!("{base}/v1/apps/shop/endpoints"))
            .bearer_auth("k-local")
            .json(&serde_json::json!({"url": receiver.url}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        receiver.set_secret(secret_of(&created).as_str());
        let accepted = http
            .post(format!("{base}/v1/apps/shop/events"))
            .bearer_auth("k-local")
            .json(&serde_json::json!({"event_type": "order.paid", "payload": {"id": 7}}))
            .send()
            .await
            .unwrap();
        assert_eq!(accepted.status().as_u16(), 202);
        let accepted: serde_json::Value = accepted.json().await.unwrap();
        let id = first_delivery(&accepted);
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut status = String::new();
        while Instant::now() < deadline {
            let response = http
                .get(format!("{base}/v1/apps/shop/deliveries/{id}"))
                .bearer_auth("k-local")
                .send()
                .await
                .unwrap();
            status = view::<DeliveryOut>(&response.json().await.unwrap()).status;
            if status == "delivered" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        assert_eq!(status, "delivered");
        let got = receiver.received();
        assert_eq!(got.len(), 1);
        assert!(
            got[0].standard_ok && got[0].stripe_ok,
            "both signature schemes valid: {:?}",
            got[0].headers
        );
    });
    // SIGTERM, as Ctrl-C / a supervisor would.
    let status = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut exited = None;
    while Instant::now() < deadline {
        if let Some(s) = child.0.try_wait().unwrap() {
            exited = Some(s);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let exited = exited.expect("stack did not stop within 20 s of SIGTERM");
    assert!(exited.success(), "{exited:?}");
    assert!(!port_open(api_port), "API still listening");
    std::thread::sleep(Duration::from_millis(500));
    assert!(!port_open(moto_port), "moto left running (orphan)");
}
