//! Property tests: verification never panics, whatever the headers and body.

use hookline_verify::{scheme, Verifier, VerifyError};
use proptest::prelude::*;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn header_name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("webhook-id".to_string()),
        Just("webhook-timestamp".to_string()),
        Just("webhook-signature".to_string()),
        Just("X-Webhook-ID".to_string()),
        Just("X-Webhook-Timestamp".to_string()),
        Just("X-Webhook-Signature".to_string()),
        "[A-Za-z-]{1,20}",
    ]
}

fn header_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[0-9-]{0,25}",
        "(v[0-9],[A-Za-z0-9+/=]{0,50} ?){0,4}",
        "(t=[0-9+-]{0,12},?)?(v[0-9]=[0-9a-f]{0,70},?){0,4}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn verify_never_panics(
        headers in proptest::collection::vec((header_name(), header_value()), 0..8),
        body in proptest::collection::vec(any::<u8>(), 0..256),
        now in any::<i64>(),
        secret in prop_oneof![Just(SECRET.to_string()), any::<String>()],
    ) {
        if let Ok(v) = Verifier::new(&secret) {
            let _ = v.verify_at(&headers, &body, now);
            let _ = v.verify_stripe_at(&headers, &body, now);
            let _ = v.verify_standard_at(&headers, &body, now);
        }
        let _ = scheme::standard::decode_secret(&secret);
    }

    #[test]
    fn valid_signatures_always_verify(
        body in proptest::collection::vec(any::<u8>(), 0..512),
        id in "[a-zA-Z0-9_]{1,40}",
        ts in 0i64..4_000_000_000,
        skew in -300i64..=300,
    ) {
        let key = scheme::standard::decode_secret(SECRET).unwrap();
        let sig = scheme::standard::signature(&key, &id, ts, &body);
        let headers = vec![
            ("webhook-id".to_string(), id.clone()),
            ("webhook-timestamp".to_string(), ts.to_string()),
            ("webhook-signature".to_string(), scheme::standard::header_value(&[sig])),
        ];
        let v = Verifier::new(SECRET).unwrap();
        prop_assert!(v.verify_at(&headers, &body, ts + skew).is_ok());
        let sig = scheme::stripe::signature(SECRET, ts, &body);
        let headers = vec![("X-Webhook-Signature".to_string(), scheme::stripe::header_value(ts, &[sig]))];
        prop_assert!(v.verify_at(&headers, &body, ts + skew).is_ok());
    }

    #[test]
    fn any_single_bit_flip_of_the_body_is_rejected(
        body in proptest::collection::vec(any::<u8>(), 1..256),
        idx in any::<prop::sample::Index>(),
        bit in 0u8..8,
    ) {
        let key = scheme::standard::decode_secret(SECRET).unwrap();
        let sig = scheme::standard::signature(&key, "msg_x", 100, &body);
        let headers = vec![
            ("webhook-id".to_string(), "msg_x".to_string()),
            ("webhook-timestamp".to_string(), "100".to_string()),
            ("webhook-signature".to_string(), scheme::standard::header_value(&[sig])),
        ];
        let mut tampered = body.clone();
        tampered[idx.index(body.len())] ^= 1 << bit;
        let v = Verifier::new(SECRET).unwrap();
        prop_assert_eq!(v.verify_at(&headers, &tampered, 100), Err(VerifyError::SignatureMismatch));
    }
}
