//! The receiver fault matrix on the local stack (moto): every way a
//! receiver can misbehave ends in the right state with the right attempt
//! log, in bounded time, reading at most 1 KiB of any response.

use hookline_tests::first_delivery;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use hookline_core::model::{Delivery, DeliveryStatus};
use hookline_tests::receiver::{Receiver, Reply};
use hookline_tests::record_figures;
use hookline_tests::stack::Stack;
use serde_json::json;

/// A raw loopback server: reads a request, writes `reply` bytes, closes.
fn raw_server(reply: &'static [u8]) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
            let mut buf = [0u8; 8192];
            let _ = stream.read(&mut buf);
            let _ = stream.write_all(reply);
            let _ = stream.flush();
            drop(stream);
        }
    });
    format!("http://127.0.0.1:{port}/hook")
}

fn refused_url() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    format!("http://127.0.0.1:{port}/hook")
}

struct Case {
    name: &'static str,
    url: String,
    expect: DeliveryStatus,
    /// Status codes of the attempts, in order (`None`: no response).
    codes: Vec<Option<u16>>,
    /// Whether the endpoint ends disabled.
    disabled: bool,
    /// Minimum gap between attempts 1 and 2 (Retry-After).
    min_gap: Duration,
    _receiver: Option<Receiver>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_receiver_fault_ends_in_the_right_state() {
    let stack = Stack::start(&[
        ("WEBHOOKS_RETRY_SCHEDULE", "1s"),
        ("WEBHOOKS_MAX_ATTEMPTS", "2"),
        ("WEBHOOKS_DELIVERY_TIMEOUT", "2s"),
    ])
    .await;
    let mut cases = Vec::new();
    let add = |name, reply: Reply, expect, codes: Vec<Option<u16>>, disabled, min_gap| {
        let reply2 = reply.clone();
        async move {
            let r = Receiver::start(vec![], reply2).await;
            Case {
                name,
                url: r.url.clone(),
                expect,
                codes,
                disabled,
                min_gap,
                _receiver: Some(r),
            }
        }
    };
    use DeliveryStatus::{Delivered, Failed};
    let z = Duration::ZERO;
    let elsewhere = Receiver::healthy().await;
    let table = vec![
        (
            "500",
            Reply::Status(500),
            Failed,
            vec![Some(500); 2],
            false,
            z,
        ),
        (
            "502",
            Reply::Status(502),
            Failed,
            vec![Some(502); 2],
            false,
            z,
        ),
        (
            "503 + Retry-After: 3",
            Reply::RetryAfter(503, "3".into()),
            Failed,
            vec![Some(503); 2],
            false,
            Duration::from_secs(3),
        ),
        (
            "429 + Retry-After: 2",
            Reply::RetryAfter(429, "2".into()),
            Failed,
            vec![Some(429); 2],
            false,
            Duration::from_secs(2),
        ),
        (
            "301 (not followed)",
            Reply::Redirect {
                status: 301,
                location: elsewhere.url.clone(),
            },
            Failed,
            vec![Some(301); 2],
            false,
            z,
        ),
        (
            "302 (not followed)",
            Reply::Redirect {
                status: 302,
                location: elsewhere.url.clone(),
            },
            Failed,
            vec![Some(302); 2],
            false,
            z,
        ),
        (
            "410 Gone (endpoint disabled)",
            Reply::Status(410),
            Failed,
            vec![Some(410)],
            true,
            z,
        ),
        (
            "timeout (answers after 5 s, limit 2 s)",
            Reply::Slow(Duration::from_secs(5)),
            Failed,
            vec![None; 2],
            false,
            z,
        ),
        (
            "slow trickling body after 200",
            Reply::Trickle(Duration::from_millis(300)),
            Delivered,
            vec![Some(200)],
            false,
            z,
        ),
        (
            "50 MB response body",
            Reply::Huge(200, 50 * 1024 * 1024),
            Delivered,
            vec![Some(200)],
            false,
            z,
        ),
        (
            "invalid UTF-8 body",
            Reply::Body(500, vec![0xff, 0xfe, b'o', b'k', 0xc3]),
            Failed,
            vec![Some(500); 2],
            false,
            z,
        ),
    ];
    for (name, reply, expect, codes, disabled, min_gap) in table {
        cases.push(add(name, reply, expect, codes, disabled, min_gap).await);
    }
    cases.push(Case {
        name: "connection refused",
        url: refused_url(),
        expect: Failed,
        codes: vec![None; 2],
        disabled: false,
        min_gap: z,
        _receiver: None,
    });
    cases.push(Case {
        name: "connection closed before any response",
        url: raw_server(b""),
        expect: Failed,
        codes: vec![None; 2],
        disabled: false,
        min_gap: z,
        _receiver: None,
    });
    cases.push(Case {
        name: "connection closed mid-body after 200",
        url: raw_server(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\npartial"),
        expect: Delivered,
        codes: vec![Some(200)],
        disabled: false,
        min_gap: z,
        _receiver: None,
    });
    cases.push(Case {
        name: "garbage instead of HTTP",
        url: raw_server(b"SSH-2.0-OpenSSH_9.6\r\n"),
        expect: Failed,
        codes: vec![None; 2],
        disabled: false,
        min_gap: z,
        _receiver: None,
    });

    let started = Instant::now();
    let mut ids = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let app = format!("fault{i}");
        let (endpoint, _) = stack.create_endpoint(&app, &case.url, &[]).await;
        let (status, body) = stack
            .send_event(&app, "order.paid", json!({"case": case.name}), None)
            .await;
        assert_eq!(status, 202, "{}: {body}", case.name);
        ids.push((endpoint, first_delivery(&body)));
    }
    let settled = stack
        .pump_until(Duration::from_secs(120), || async {
            for (_, id) in &ids {
                if stack.delivery(id).await.status == DeliveryStatus::Pending {
                    return false;
                }
            }
            true
        })
        .await;
    assert!(settled, "every delivery settles");
    let total = started.elapsed();
    let mut rows = Vec::new();
    let mut max_latency = 0u64;
    for (case, (endpoint, id)) in cases.iter().zip(&ids) {
        let d: Delivery = stack.delivery(id).await;
        let codes: Vec<Option<u16>> = d.attempts.iter().map(|a| a.status_code).collect();
        let gap = match (d.attempts.first(), d.attempts.get(1)) {
            (Some(a), Some(b)) => (b.at - a.at).to_std().unwrap_or_default(),
            _ => Duration::ZERO,
        };
        let latency = d.attempts.iter().map(|a| a.latency_ms).max().unwrap_or(0);
        max_latency = max_latency.max(latency);
        let body_max = d
            .attempts
            .iter()
            .map(|a| a.response_body.as_ref().map_or(0, String::len))
            .max()
            .unwrap_or(0);
        let (_, _, ep) = stack
            .call(
                "GET",
                &format!("/v1/apps/{}/endpoints/{endpoint}", d.app_id),
                None,
                &[],
            )
            .await;
        let disabled = ep["disabled"].as_bool().unwrap_or(false);
        let errors: Vec<String> = d.attempts.iter().filter_map(|a| a.error.clone()).collect();
        rows.push(format!(
            "| {} | {} | {} | {:?} | {} ms | {} B | {} |",
            case.name,
            d.status,
            if disabled { "disabled" } else { "enabled" },
            codes
                .iter()
                .map(|c| c.map_or("none".to_owned(), |c| c.to_string()))
                .collect::<Vec<_>>(),
            latency,
            body_max,
            errors
                .first()
                .map(|e| e.replace('|', "/"))
                .unwrap_or_default()
        ));
        assert_eq!(d.status, case.expect, "{}: {:?}", case.name, d.attempts);
        assert_eq!(codes, case.codes, "{}: attempt codes", case.name);
        assert_eq!(disabled, case.disabled, "{}: endpoint state", case.name);
        assert!(
            gap >= case.min_gap,
            "{}: Retry-After honoured ({gap:?})",
            case.name
        );
        assert!(
            latency <= 3_000,
            "{}: attempt bounded by the 2 s timeout ({latency} ms)",
            case.name
        );
        assert!(
            body_max <= 1024 * 3,
            "{}: at most 1 KiB of the body kept",
            case.name
        );
        if case.codes.iter().any(Option::is_none) {
            assert!(!errors.is_empty(), "{}: the error is recorded", case.name);
        }
    }
    assert!(
        elsewhere.received().is_empty(),
        "redirect targets never called"
    );
    record_figures(
        "faults",
        &format!(
            "receiver fault matrix: {} cases, all in the expected state; longest attempt {max_latency} ms (timeout 2 s); whole matrix settled in {:.0} s",
            cases.len(),
            total.as_secs_f64()
        ),
    );
    for row in rows {
        record_figures("faults-table", &row);
    }
}
