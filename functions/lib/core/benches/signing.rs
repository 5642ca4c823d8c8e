//! Sign and verify, 1 KB and 64 KB bodies: hookline versus the published
//! `standardwebhooks` crate on the same message (Standard Webhooks scheme).
//! `infra/bench/run` reads the medians into BENCHMARKS.md.

#![allow(clippy::unwrap_used)]

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion};
use hookline_core::signing::{sign, Schemes, Secret};
use hookline_verify::Verifier;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn body(size: usize) -> Vec<u8> {
    let mut b =
        br#"{"type":"order.paid","timestamp":"2026-12-02T10:00:00Z","data":{"pad":""#.to_vec();
    b.resize(size - 3, b'x');
    b.extend_from_slice(br#""}}"#);
    b
}

fn benches(c: &mut Criterion) {
    let secret = Secret::parse(SECRET).unwrap();
    let theirs = standardwebhooks::Webhook::new(SECRET).unwrap();
    let standard_only = Schemes {
        standard_webhooks: true,
        stripe_compatible: false,
    };
    let msg_id = "msg_01m8vvjvh8fad9c25sy9py2k17";
    for (label, size) in [("1KB", 1024), ("64KB", 64 * 1024)] {
        let payload = body(size);
        let ts = chrono::Utc::now().timestamp();
        let mut group = c.benchmark_group("sign");
        group.bench_with_input(BenchmarkId::new("hookline", label), &payload, |b, p| {
            b.iter(|| {
                sign(
                    black_box(msg_id),
                    ts,
                    black_box(p),
                    &[&secret],
                    standard_only,
                )
                .unwrap()
            })
        });
        group.bench_with_input(
            BenchmarkId::new("standardwebhooks", label),
            &payload,
            |b, p| b.iter(|| theirs.sign(black_box(msg_id), ts, black_box(p)).unwrap()),
        );
        group.finish();

        let signed = sign(msg_id, ts, &payload, &[&secret], standard_only).unwrap();
        let pairs: Vec<(&str, String)> = signed.iter().map(|(k, v)| (k, v.to_owned())).collect();
        let verifier = Verifier::new(SECRET).unwrap();
        let mut map = http::HeaderMap::new();
        for (k, v) in &pairs {
            map.insert(*k, v.parse().unwrap());
        }
        let mut group = c.benchmark_group("verify");
        group.bench_with_input(BenchmarkId::new("hookline", label), &payload, |b, p| {
            b.iter(|| verifier.verify_at(&pairs[..], black_box(p), ts).unwrap())
        });
        group.bench_with_input(
            BenchmarkId::new("standardwebhooks", label),
            &payload,
            |b, p| b.iter(|| theirs.verify(black_box(p), &map).unwrap()),
        );
        group.finish();
    }
}

criterion_group!(signing, benches);
criterion_main!(signing);
