//! Security, measured: the SSRF guard against a table of vectors (checked at
//! registration through the API and at send time with the real HTTP sender,
//! with a loopback listener proving no connection was made), redirects not
//! followed, and no secret in the logs of a full local-stack run.

use hookline_tests::{error_code, secret_of};
use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hookline_core::signing::{sign, Schemes, Secret};
use hookline_pipeline::ports::{OutgoingRequest, Sender};
use hookline_pipeline::sender::{HttpSender, Lookup};
use hookline_tests::receiver::{Receiver, Reply};
use hookline_tests::stack::Stack;
use hookline_tests::{local_binary, record_figures, workspace_root};
use serde_json::json;

/// A loopback listener that counts the connections it accepts.
fn counting_listener() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            if stream.is_ok() {
                h.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    (port, hits)
}

/// A DNS name that resolves to loopback in this test, whatever /etc/hosts
/// holds (a resolver override, like curl's --resolve, used both by the
/// registration check and by the sender's guarded resolver).
const LOOPBACK_NAME: &str = "hooks.rebind.example";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssrf_vectors_are_blocked_at_registration_and_at_send() {
    let mut stack = Stack::start(&[("WEBHOOKS_ALLOW_PRIVATE_ENDPOINTS", "false")]).await;
    let (port, hits) = counting_listener();
    let mut vectors: Vec<(String, String)> = vec![
        ("loopback".into(), format!("https://127.0.0.1:{port}/")),
        (
            "loopback, short form".into(),
            format!("https://127.1:{port}/"),
        ),
        (
            "loopback, decimal".into(),
            format!("https://2130706433:{port}/"),
        ),
        (
            "loopback, hex".into(),
            format!("https://0x7f.0.0.1:{port}/"),
        ),
        (
            "loopback, octal".into(),
            format!("https://0177.0.0.1:{port}/"),
        ),
        ("localhost".into(), format!("https://localhost:{port}/")),
        (
            "localhost, trailing dot".into(),
            format!("https://localhost.:{port}/"),
        ),
        ("IPv6 loopback".into(), format!("https://[::1]:{port}/")),
        (
            "IPv4-mapped IPv6 loopback".into(),
            format!("https://[::ffff:127.0.0.1]:{port}/"),
        ),
        (
            "NAT64 of loopback".into(),
            format!("https://[64:ff9b::7f00:1]:{port}/"),
        ),
        (
            "6to4 of loopback".into(),
            format!("https://[2002:7f00:1::]:{port}/"),
        ),
        (
            "SIIT-translated loopback".into(),
            format!("https://[::ffff:0:7f00:1]:{port}/"),
        ),
        (
            "Teredo to a loopback client".into(),
            format!("https://[2001:0:4136:e378:8000:63bf:80ff:fffe]:{port}/"),
        ),
        (
            "NAT64 local-use prefix of IMDS".into(),
            "https://[64:ff9b:1::a9fe:a9fe]/".into(),
        ),
        (
            "unspecified 0.0.0.0".into(),
            format!("https://0.0.0.0:{port}/"),
        ),
        ("unspecified ::".into(), format!("https://[::]:{port}/")),
        (
            "cloud metadata (IMDS)".into(),
            "https://169.254.169.254/latest/meta-data/".into(),
        ),
        (
            "cloud metadata, IPv6 (IMDS)".into(),
            "https://[fd00:ec2::254]/latest/meta-data/".into(),
        ),
        (
            "container metadata (ECS)".into(),
            "https://169.254.170.2/v2/credentials".into(),
        ),
        ("private 10/8".into(), "https://10.0.0.1/".into()),
        ("private 172.16/12".into(), "https://172.16.0.1/".into()),
        ("private 192.168/16".into(), "https://192.168.1.1/".into()),
        ("CGNAT 100.64/10".into(), "https://100.64.0.1/".into()),
        ("IPv6 unique local".into(), "https://[fc00::1]/".into()),
        ("IPv6 link-local".into(), "https://[fe80::1]/".into()),
        ("plain http".into(), "http://93.184.216.34/".into()),
        (
            "credentials in URL".into(),
            "https://user:pass@93.184.216.34/".into(),
        ),
        ("file scheme".into(), "file:///etc/passwd".into()),
        (
            "gopher scheme".into(),
            format!("gopher://127.0.0.1:{port}/"),
        ),
    ];
    vectors.push((
        format!("DNS name `{LOOPBACK_NAME}` resolving to loopback"),
        format!("https://{LOOPBACK_NAME}:{port}/"),
    ));
    let lookup = Lookup::system().with_override(
        LOOPBACK_NAME,
        vec![std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)],
    );
    stack.local.api.lookup = lookup.clone();
    let sender = HttpSender::with_lookup(false, lookup).expect("sender");
    let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("secret");
    let headers = sign("msg_1", 1, b"{}", &[&secret], Schemes::default()).expect("sign");
    let mut rows = Vec::new();
    for (name, url) in &vectors {
        let (status, _, body) = stack
            .call(
                "POST",
                "/v1/apps/ssrf/endpoints",
                Some(json!({"url": url})),
                &[],
            )
            .await;
        let at_registration = status == 400 && error_code(&body).as_deref() == Some("invalid_url");
        // The rule broken, never the address a name resolved to.
        if url.contains(LOOPBACK_NAME) {
            let message = body["error"]["message"].as_str().unwrap_or_default();
            assert!(
                message.contains("loopback") && !message.contains("127.0.0.1"),
                "{message}"
            );
        }
        let result = sender
            .send(OutgoingRequest {
                custom_headers: &std::collections::BTreeMap::new(),
                url,
                headers: &headers,
                body: b"{}",
                timeout: Duration::from_secs(3),
            })
            .await;
        let at_send = result.status.is_none() && result.error.is_some();
        rows.push(format!(
            "| {name} | `{url}` | {} | {} |",
            if at_registration {
                "blocked (400)"
            } else {
                "ALLOWED"
            },
            if at_send { "blocked" } else { "SENT" }
        ));
        assert!(
            at_registration,
            "{name}: registration answered {status} {body}"
        );
        assert!(
            at_send,
            "{name}: the sender did not refuse {url}: {result:?}"
        );
    }
    // Allowed at registration (not resolvable here), still checked per send.
    let (status, _, _) = stack
        .call(
            "POST",
            "/v1/apps/ssrf/endpoints",
            Some(json!({"url": "https://hooks.customer.invalid/webhooks"})),
            &[],
        )
        .await;
    assert_eq!(status, 201, "a public-looking name is accepted");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "no connection reached the loopback listener"
    );
    rows.push(format!(
        "| (all of the above) | | {} of {} blocked | {} of {} blocked; 0 connections reached a loopback listener |",
        vectors.len(),
        vectors.len(),
        vectors.len(),
        vectors.len()
    ));
    for row in rows {
        record_figures("ssrf", &row);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_are_not_followed() {
    let target = Receiver::healthy().await;
    let redirector = Receiver::start(
        vec![],
        Reply::Redirect {
            status: 302,
            location: target.url.clone(),
        },
    )
    .await;
    let sender = HttpSender::new(true).expect("sender");
    let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("secret");
    let headers = sign("msg_1", 1, b"{}", &[&secret], Schemes::default()).expect("sign");
    for status in [301u16, 302, 307, 308] {
        redirector.set_fallback(Reply::Redirect {
            status,
            location: target.url.clone(),
        });
        let result = sender
            .send(OutgoingRequest {
                custom_headers: &std::collections::BTreeMap::new(),
                url: &redirector.url,
                headers: &headers,
                body: b"{}",
                timeout: Duration::from_secs(3),
            })
            .await;
        assert_eq!(result.status, Some(status), "the redirect is the answer");
    }
    assert!(
        target.received().is_empty(),
        "the redirect target was never called"
    );
    record_figures(
        "ssrf",
        "| redirects 301/302/307/308 to loopback | | n/a | not followed (recorded as the attempt's status, retried as a failure); 0 requests reached the target |",
    );
}

/// Secrets used in a full run: none may appear in the process's logs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_in_the_logs_of_a_full_run() {
    let receiver = Receiver::start(vec![Reply::Status(500)], Reply::Status(200)).await;
    let admin = "adm_9f8e7d6c5b4a39281706f5e4d3c2b1a0";
    let mut child = Command::new(local_binary())
        .args(["up", "--port", "0", "--template"])
        .arg(workspace_root().join("template.yaml"))
        .env("WEBHOOKS_ADMIN_KEY", admin)
        .env("WEBHOOKS_ALLOW_PRIVATE_ENDPOINTS", "true")
        .env("WEBHOOKS_RETRY_SCHEDULE", "1s")
        .env("RUST_LOG", "debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("hookline-local");
    let pid = child.id();
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut stderr = child.stderr.take().expect("stderr");
    let logs = std::thread::spawn(move || {
        let mut all = String::new();
        let _ = stderr.read_to_string(&mut all);
        all
    });
    let mut banner = String::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    let api = loop {
        let mut line = String::new();
        if stdout.read_line(&mut line).unwrap_or(0) == 0 || Instant::now() > deadline {
            let _ = child.kill();
            panic!("stack did not start: {banner}");
        }
        banner.push_str(&line);
        if let Some(url) = line.trim().strip_prefix("API").map(str::trim) {
            break url.split_whitespace().next().unwrap_or_default().to_owned();
        }
    };
    let out_thread = std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = stdout.read_to_string(&mut rest);
        rest
    });
    let http = reqwest::Client::new();
    let call =
        |method: reqwest::Method, path: String, key: String, body: Option<serde_json::Value>| {
            let http = http.clone();
            let api = api.clone();
            async move {
                let mut req = http
                    .request(method, format!("{api}{path}"))
                    .bearer_auth(key);
                if let Some(b) = body {
                    req = req.json(&b);
                }
                let res = req.send().await.expect("request");
                let status = res.status().as_u16();
                (
                    status,
                    res.json::<serde_json::Value>().await.unwrap_or_default(),
                )
            }
        };
    let mut secrets = vec![admin.to_owned()];
    let chosen = "whsec_c2VjcmV0LWNob3Nlbi1ieS10aGUtY2FsbGVyLTEyMzQ=";
    let (status, ep) = call(
        reqwest::Method::POST,
        "/v1/apps/s/endpoints".into(),
        admin.into(),
        Some(json!({"url": receiver.url, "secret": chosen})),
    )
    .await;
    assert_eq!(status, 201, "{ep}");
    secrets.push(chosen.to_owned());
    let ep_id = ep["id"].as_str().expect("id").to_owned();
    let (_, rotated) = call(
        reqwest::Method::POST,
        format!("/v1/apps/s/endpoints/{ep_id}/rotate-secret"),
        admin.into(),
        None,
    )
    .await;
    secrets.push(secret_of(&rotated));
    let (_, key) = call(
        reqwest::Method::POST,
        "/v1/apps/s/api-keys".into(),
        admin.into(),
        Some(json!({"name": "ci"})),
    )
    .await;
    let app_key = key["key"].as_str().expect("key").to_owned();
    secrets.push(app_key.clone());
    // Wrong keys and a bad secret are refused without being echoed.
    let wrong = "adm_wrong_0123456789abcdef0123456789";
    let (status, err) = call(
        reqwest::Method::GET,
        "/v1/apps/s/endpoints".into(),
        wrong.into(),
        None,
    )
    .await;
    assert_eq!(status, 401);
    assert!(!err.to_string().contains(wrong));
    secrets.push(wrong.to_owned());
    let bad_secret = "whsec_bm90LWxvbmctZW5vdWdo";
    let (status, err) = call(
        reqwest::Method::POST,
        "/v1/apps/s/endpoints".into(),
        app_key.clone(),
        Some(json!({"url": receiver.url, "secret": bad_secret})),
    )
    .await;
    assert_eq!(status, 400);
    assert!(!err.to_string().contains(bad_secret), "{err}");
    secrets.push(bad_secret.to_owned());
    // Events delivered (one after a failed attempt), with the app key.
    for i in 0..3 {
        let (status, _) = call(
            reqwest::Method::POST,
            "/v1/apps/s/events".into(),
            app_key.clone(),
            Some(json!({"event_type": "order.paid", "payload": {"i": i}})),
        )
        .await;
        assert_eq!(status, 202);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while receiver.accepted().len() < 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(receiver.accepted().len(), 3);
    // Stop the stack (SIGTERM, by PID) and read everything it wrote.
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let stop_deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().ok().flatten().is_none() && Instant::now() < stop_deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    let logs = logs.join().unwrap_or_default();
    let rest = out_thread.join().unwrap_or_default();
    // JSON logs go to stdout (as on Lambda); stderr carries anything else.
    let lines = logs.lines().count() + rest.lines().count();
    assert!(lines > 20, "debug logs were captured ({lines} lines)");
    let mut leaks = Vec::new();
    for secret in &secrets {
        // The secret itself and its key material (after the prefix / dot).
        let core = secret
            .strip_prefix("whsec_")
            .or_else(|| secret.split_once('.').map(|(_, s)| s))
            .unwrap_or(secret);
        for needle in [secret.as_str(), core] {
            if logs.contains(needle) || rest.contains(needle) {
                leaks.push(needle.to_owned());
            }
        }
    }
    assert!(leaks.is_empty(), "secrets leaked into logs: {leaks:?}");
    record_figures(
        "secrets",
        &format!(
            "secrets in logs: {} secrets (admin key, chosen and rotated endpoint secrets, an app key, a wrong key, a malformed secret) searched in {lines} log lines of a full run at RUST_LOG=debug: 0 found",
            secrets.len()
        ),
    );
}
