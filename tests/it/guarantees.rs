//! "Guaranteed, provably": the windows where a delivery could be lost,
//! corrupted, duplicated in bursts or stuck, each shown closed against moto
//! (real SDK clients and wire protocols) and real loopback receivers.

use std::time::Duration;

use hookline_core::model::DeliveryStatus;
use hookline_tests::receiver::Receiver;
use hookline_tests::stack::{Stack, ADMIN_KEY};

const T: Duration = Duration::from_secs(60);

fn admin_headers(extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut headers = vec![
        ("authorization".to_owned(), format!("Bearer {ADMIN_KEY}")),
        ("content-type".to_owned(), "application/json".to_owned()),
    ];
    headers.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    headers
}

/// The receiver gets the producer's payload text byte for byte as `data`:
/// integers beyond 64 bits, 30-digit decimals, exponents, escapes, key order
/// and spacing are not touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payload_reaches_the_receiver_byte_for_byte() {
    let stack = Stack::start(&[]).await;
    let receiver = Receiver::healthy().await;
    let (_, secret) = stack.create_endpoint("shop", &receiver.url, &[]).await;
    receiver.set_secret(&secret);
    let payload = r#"{"id":12345678901234567890123,"amount":10.50,"small":1e2,
    "price": 0.100000000000000000000000000001 , "esc":"caf\u00e9 \"q\" \/","zz":[],"a":{"b":-0.0}}"#;
    let request = format!(r#"{{"event_type":"order.paid","payload":  {payload}  }}"#);
    let (status, _, body) = stack
        .raw_call(
            "POST",
            "/v1/apps/shop/events",
            &admin_headers(&[]),
            Some(&request),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let delivery_id = body["delivery_ids"][0].as_str().unwrap().to_owned();
    let delivered = stack
        .pump_until(T, || async {
            stack.delivery(&delivery_id).await.status == DeliveryStatus::Delivered
        })
        .await;
    assert!(delivered);
    let got = receiver.received();
    assert_eq!(got.len(), 1);
    assert!(got[0].standard_ok && got[0].stripe_ok);
    let text = String::from_utf8(got[0].body.clone()).unwrap();
    let expected_tail = format!(r#","data":{payload}}}"#);
    assert!(
        text.ends_with(&expected_tail),
        "payload changed in flight:\n sent {payload}\n got {text}"
    );
    assert!(text.starts_with(r#"{"type":"order.paid","timestamp":""#), "{text}");
}
