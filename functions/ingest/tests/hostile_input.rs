//! Hostile input to the HTTP API: random methods, paths (every route's
//! template with hostile segments), query strings, headers and bodies
//! (unknown fields, deep JSON, huge strings, invalid UTF-8) through the real
//! router and handlers on in-memory ports. Never a panic, never a 5xx, every
//! error a JSON `{"error": {code, message}}`.

use chrono::Utc;
use hookline_ingest::router::routes;
use hookline_ingest::{apigw, handle, Api, ApiKeys};
use hookline_pipeline::fakes::{MemoryQueue, MemoryStore};
use hookline_pipeline::Settings;
use proptest::prelude::*;
use rand::SeedableRng;
use std::sync::atomic::{AtomicUsize, Ordering};

static CASES: AtomicUsize = AtomicUsize::new(0);
static ERRORS_4XX: AtomicUsize = AtomicUsize::new(0);
static ERRORS_5XX: AtomicUsize = AtomicUsize::new(0);
static MISSING_ERROR_BODY: AtomicUsize = AtomicUsize::new(0);
/// Generated requests that are not representable HTTP (API Gateway would
/// refuse them before the function): counted, not sent.
static NOT_HTTP: AtomicUsize = AtomicUsize::new(0);

/// Appends the running totals to the suite's figures (last line wins).
fn record() {
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"))
        .join("test-figures");
    let _ = std::fs::create_dir_all(&dir);
    // Every number is counted by the test (a panic fails the test before
    // its case is counted; a 5xx is counted, then fails the test).
    let line = format!(
        "API fuzz (proptest, real router and handlers): {} random requests over every route (hostile path segments, query strings, headers up to 8 KB, bodies: random text, JSON nested 3000 deep, unknown fields, 300 KB payloads): {} answered 4xx ({} without a JSON error body), {} answered 5xx, 0 panics; {} generated requests were not representable HTTP and not sent\n",
        CASES.load(Ordering::SeqCst),
        ERRORS_4XX.load(Ordering::SeqCst),
        MISSING_ERROR_BODY.load(Ordering::SeqCst),
        ERRORS_5XX.load(Ordering::SeqCst),
        NOT_HTTP.load(Ordering::SeqCst),
    );
    let _ = std::fs::write(dir.join("hostile.txt"), line);
}

fn api() -> Api<MemoryStore, MemoryQueue> {
    Api::new(
        MemoryStore::default(),
        MemoryQueue::default(),
        Settings::for_tests(&[]).expect("settings"),
        ApiKeys::admin("fuzz-admin"),
    )
}

fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("acme".to_owned()),
        Just("ep_01m8vgw5r0fdnvqj6sdwzakm9j".to_owned()),
        Just("dlv_01m8vgw5r0fdnvqj6sdwzakm9j".to_owned()),
        Just("key_01m8vgw5r0fdnvqj6sdwzakm9j".to_owned()),
        Just("%00".to_owned()),
        Just("..".to_owned()),
        "[a-zA-Z0-9_.%-]{0,80}",
        "[^/?#]{0,20}",
    ]
}

fn body() -> impl Strategy<Value = Option<String>> {
    let deep = (1usize..3000).prop_map(|n| format!("{}{}", "[".repeat(n), "]".repeat(n)));
    let deep_obj = (1usize..600).prop_map(|n| {
        format!(
            "{{\"event_type\":\"a.b\",\"payload\":{}1{}}}",
            "{\"x\":".repeat(n),
            "}".repeat(n)
        )
    });
    prop_oneof![
        Just(None),
        any::<String>().prop_map(Some),
        deep.prop_map(Some),
        deep_obj.prop_map(Some),
        Just(Some(
            r#"{"url":"https://example.com/h","unknown":1}"#.to_owned()
        )),
        Just(Some(
            r#"{"event_type":"order.paid","payload":{},"extra":true}"#.to_owned()
        )),
        Just(Some(format!(
            r#"{{"event_type":"{}","payload":{{}}}}"#,
            "a".repeat(10_000)
        ))),
        Just(Some(format!(
            r#"{{"event_type":"x.y","payload":"{}"}}"#,
            "p".repeat(300 * 1024)
        ))),
        Just(Some(r#"{"since":"yesterday"}"#.to_owned())),
        Just(Some(
            r#"{"schema":{"$ref":"file:///etc/passwd"}}"#.to_owned()
        )),
        Just(Some(
            r##"{"schema":{"$ref":"#"},"example":{"a":[1]}}"##.to_owned()
        )),
        Just(Some(r#"{"schema":{"pattern":"(?<=a)b"}}"#.to_owned())),
        Just(Some(format!(
            r#"{{"schema":{}true{}}}"#,
            r#"{"items":"#.repeat(100),
            "}".repeat(100)
        ))),
        Just(Some(r#"{"url":"javascript:alert(1)"}"#.to_owned())),
        Just(Some(
            r#"{"max_messages":4294967295,"dry_run":"yes"}"#.to_owned()
        )),
    ]
}

fn header() -> impl Strategy<Value = (String, String)> {
    (
        prop_oneof![
            Just("authorization".to_owned()),
            Just("idempotency-key".to_owned()),
            Just("content-type".to_owned()),
            "[a-z-]{1,20}",
        ],
        prop_oneof![
            Just("Bearer fuzz-admin".to_owned()),
            Just(
                "Bearer key_01m8vgw5r0fdnvqj6sdwzakm9j.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
                    .to_owned()
            ),
            "[ -~]{0,64}",
            "x{8000}",
        ],
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1500))]

    #[test]
    fn no_panic_no_5xx(
        route in 0..routes().len(),
        method in prop_oneof![Just("GET"), Just("POST"), Just("PATCH"), Just("DELETE"), Just("PUT"), Just("OPTIONS")],
        segs in proptest::collection::vec(segment(), 4),
        query in "[a-z_=&%0-9:.-]{0,60}",
        headers in proptest::collection::vec(header(), 0..4),
        body in body(),
        auth in any::<bool>(),
    ) {
        let template = routes()[route].path.as_str();
        let mut path = String::new();
        let mut i = 0;
        for part in template.split('/').filter(|p| !p.is_empty()) {
            path.push('/');
            if part.starts_with('{') {
                path.push_str(&segs[i % segs.len()]);
                i += 1;
            } else {
                path.push_str(part);
            }
        }
        if !query.is_empty() {
            path.push('?');
            path.push_str(&query);
        }
        let mut hs: Vec<(String, String)> = headers;
        if auth {
            hs.push(("authorization".into(), "Bearer fuzz-admin".into()));
        }
        let Ok(request) = apigw::http_request(method, &path, &hs, body.as_deref()) else {
            // Not a representable HTTP request (API Gateway would refuse it):
            // counted and reported, not silently passed.
            NOT_HTTP.fetch_add(1, Ordering::SeqCst);
            record();
            return Ok(());
        };
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
        let api = api();
        let response = rt.block_on(handle(&api, request, Utc::now(), &mut rand::rngs::StdRng::seed_from_u64(1)));
        let status = response.status().as_u16();
        CASES.fetch_add(1, Ordering::SeqCst);
        let body: serde_json::Value = serde_json::from_slice(response.body().as_ref()).unwrap_or_default();
        let error_body = body["error"]["code"].is_string() && body["error"]["message"].is_string();
        match status {
            500.. => ERRORS_5XX.fetch_add(1, Ordering::SeqCst),
            400.. => ERRORS_4XX.fetch_add(1, Ordering::SeqCst),
            _ => 0,
        };
        if status >= 400 && !error_body {
            MISSING_ERROR_BODY.fetch_add(1, Ordering::SeqCst);
        }
        record();
        prop_assert!(status < 500, "{method} {path} -> {status}");
        if status >= 400 {
            prop_assert!(error_body, "{method} {path}: {body}");
        }
    }
}
