//! [`Verifier`]: raw body + headers + secrets -> verified message, or a typed error.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use subtle::ConstantTimeEq;

use crate::scheme::{self, Mac256};
use crate::{Headers, VerifyError};

/// Default tolerance between the signed timestamp and the receiver's clock, in
/// either direction: 5 minutes.
pub const DEFAULT_TOLERANCE_SECS: u64 = 300;

/// Which scheme a delivery was verified with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// `webhook-id` / `webhook-timestamp` / `webhook-signature`.
    StandardWebhooks,
    /// `X-Webhook-ID` / `X-Webhook-Timestamp` / `X-Webhook-Signature: t=..,v1=..`.
    StripeCompatible,
}

/// What a successful verification established.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub scheme: Scheme,
    /// The message id the sender named (`webhook-id`, or `X-Webhook-ID`).
    pub message_id: Option<String>,
    /// Whether the signature covers `message_id`: true for Standard Webhooks
    /// (`{id}.{timestamp}.{body}` is signed), false for the Stripe-compatible
    /// scheme (only `{t}.{body}` is signed, so `X-Webhook-ID` can be swapped
    /// by whoever replays a captured request). Never deduplicate on an
    /// unsigned id.
    pub id_signed: bool,
    /// The signed unix timestamp.
    pub timestamp: i64,
}

struct SecretKeys {
    /// Key of the Standard Webhooks scheme (`None` if the secret is not base64).
    standard: Option<Vec<u8>>,
    /// Key of the Stripe-compatible scheme: the secret string itself.
    raw: String,
}

/// Verifies deliveries against one or more secrets (several during a rotation).
///
/// `Debug` never prints the secrets.
pub struct Verifier {
    secrets: Vec<SecretKeys>,
    tolerance: Duration,
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verifier")
            .field(
                "secrets",
                &format_args!("[{} redacted]", self.secrets.len()),
            )
            .field("tolerance", &self.tolerance)
            .finish()
    }
}

impl Verifier {
    /// A verifier for one secret (`whsec_...`).
    pub fn new(secret: &str) -> Result<Self, VerifyError> {
        Self::with_secrets([secret])
    }

    /// A verifier accepting a signature made with any of `secrets`.
    pub fn with_secrets<I, S>(secrets: I) -> Result<Self, VerifyError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut keys = Vec::new();
        for secret in secrets {
            let raw = secret.as_ref();
            if raw.is_empty() {
                return Err(VerifyError::InvalidSecret("empty secret"));
            }
            keys.push(SecretKeys {
                standard: scheme::standard::decode_secret(raw).ok(),
                raw: raw.to_owned(),
            });
        }
        if keys.is_empty() {
            return Err(VerifyError::InvalidSecret("no secret given"));
        }
        Ok(Self {
            secrets: keys,
            tolerance: Duration::from_secs(DEFAULT_TOLERANCE_SECS),
        })
    }

    /// Changes the accepted clock difference (both directions).
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// Verifies against the system clock.
    pub fn verify<H: Headers + ?Sized>(
        &self,
        headers: &H,
        body: &[u8],
    ) -> Result<Verified, VerifyError> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        self.verify_at(headers, body, now)
    }

    /// Verifies with `now` (unix seconds) as the receiver's clock.
    ///
    /// Standard Webhooks headers are used when any of them is present,
    /// otherwise the Stripe-compatible `X-Webhook-Signature`.
    pub fn verify_at<H: Headers + ?Sized>(
        &self,
        headers: &H,
        body: &[u8],
        now: i64,
    ) -> Result<Verified, VerifyError> {
        let has_standard = [
            scheme::WEBHOOK_ID,
            scheme::WEBHOOK_TIMESTAMP,
            scheme::WEBHOOK_SIGNATURE,
        ]
        .iter()
        .any(|h| headers.header(h).is_some());
        if has_standard || headers.header(scheme::X_WEBHOOK_SIGNATURE).is_none() {
            self.verify_standard_at(headers, body, now)
        } else {
            self.verify_stripe_at(headers, body, now)
        }
    }

    /// Verifies the Standard Webhooks headers only.
    pub fn verify_standard_at<H: Headers + ?Sized>(
        &self,
        headers: &H,
        body: &[u8],
        now: i64,
    ) -> Result<Verified, VerifyError> {
        let id = headers
            .header(scheme::WEBHOOK_ID)
            .ok_or(VerifyError::MissingHeader(scheme::WEBHOOK_ID))?;
        let ts_raw = headers
            .header(scheme::WEBHOOK_TIMESTAMP)
            .ok_or(VerifyError::MissingHeader(scheme::WEBHOOK_TIMESTAMP))?;
        let sig_raw = headers
            .header(scheme::WEBHOOK_SIGNATURE)
            .ok_or(VerifyError::MissingHeader(scheme::WEBHOOK_SIGNATURE))?;
        if id.is_empty() {
            return Err(VerifyError::MalformedHeader {
                header: scheme::WEBHOOK_ID,
                reason: "empty",
            });
        }
        let timestamp = scheme::parse_unix_seconds(ts_raw).ok_or(VerifyError::MalformedHeader {
            header: scheme::WEBHOOK_TIMESTAMP,
            reason: "not an integer number of unix seconds",
        })?;
        self.check_timestamp(timestamp, now)?;
        let candidates = scheme::standard::parse_header(sig_raw);
        if candidates.is_empty() {
            return Err(VerifyError::NoSupportedSignature(scheme::WEBHOOK_SIGNATURE));
        }
        let expected: Vec<Mac256> = self
            .secrets
            .iter()
            .filter_map(|s| s.standard.as_deref())
            .map(|key| scheme::standard::signature(key, id, timestamp, body))
            .collect();
        if any_match(&expected, &candidates) {
            Ok(Verified {
                scheme: Scheme::StandardWebhooks,
                message_id: Some(id.to_owned()),
                id_signed: true,
                timestamp,
            })
        } else {
            Err(VerifyError::SignatureMismatch)
        }
    }

    /// Verifies the Stripe-compatible `X-Webhook-Signature` header only.
    pub fn verify_stripe_at<H: Headers + ?Sized>(
        &self,
        headers: &H,
        body: &[u8],
        now: i64,
    ) -> Result<Verified, VerifyError> {
        let sig_raw = headers
            .header(scheme::X_WEBHOOK_SIGNATURE)
            .ok_or(VerifyError::MissingHeader(scheme::X_WEBHOOK_SIGNATURE))?;
        let parsed = scheme::stripe::parse_header(sig_raw);
        let timestamp = parsed.timestamp.ok_or(VerifyError::MalformedHeader {
            header: scheme::X_WEBHOOK_SIGNATURE,
            reason: "needs exactly one integer `t=` item",
        })?;
        if let Some(ts_header) = headers.header(scheme::X_WEBHOOK_TIMESTAMP) {
            if scheme::parse_unix_seconds(ts_header) != Some(timestamp) {
                return Err(VerifyError::MalformedHeader {
                    header: scheme::X_WEBHOOK_TIMESTAMP,
                    reason: "differs from the signature's `t=`",
                });
            }
        }
        self.check_timestamp(timestamp, now)?;
        if parsed.signatures.is_empty() {
            return Err(VerifyError::NoSupportedSignature(
                scheme::X_WEBHOOK_SIGNATURE,
            ));
        }
        let expected: Vec<Mac256> = self
            .secrets
            .iter()
            .map(|s| scheme::stripe::signature(&s.raw, timestamp, body))
            .collect();
        if any_match(&expected, &parsed.signatures) {
            Ok(Verified {
                scheme: Scheme::StripeCompatible,
                message_id: headers.header(scheme::X_WEBHOOK_ID).map(str::to_owned),
                id_signed: false,
                timestamp,
            })
        } else {
            Err(VerifyError::SignatureMismatch)
        }
    }

    fn check_timestamp(&self, timestamp: i64, now: i64) -> Result<(), VerifyError> {
        let tolerance_secs = self.tolerance.as_secs();
        let diff = i128::from(now) - i128::from(timestamp);
        if diff > i128::from(tolerance_secs) {
            Err(VerifyError::TimestampTooOld {
                age_secs: diff,
                tolerance_secs,
            })
        } else if -diff > i128::from(tolerance_secs) {
            Err(VerifyError::TimestampInFuture {
                ahead_secs: -diff,
                tolerance_secs,
            })
        } else {
            Ok(())
        }
    }
}

/// Constant-time comparison of every expected MAC with every candidate; the
/// loop never exits early, so timing does not reveal which one matched.
fn any_match(expected: &[Mac256], candidates: &[Vec<u8>]) -> bool {
    let mut matched = subtle::Choice::from(0);
    for exp in expected {
        for cand in candidates {
            // Length is public (always 32 for a real signature); ct_eq of unequal
            // lengths returns false without comparing contents.
            matched |= exp.as_slice().ct_eq(cand.as_slice());
        }
    }
    matched.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheme::{standard, stripe};

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const OTHER: &str = "whsec_dGhpcyBpcyBhbm90aGVyIHNlY3JldCBrZXkhIQ==";
    const TS: i64 = 1_700_000_000;
    const BODY: &[u8] =
        br#"{"type":"order.paid","timestamp":"2023-11-14T22:13:20Z","data":{"id":1}}"#;

    fn standard_headers(secrets: &[&str], ts: i64, body: &[u8]) -> Vec<(String, String)> {
        let sigs: Vec<Mac256> = secrets
            .iter()
            .map(|s| standard::signature(&standard::decode_secret(s).unwrap(), "msg_1", ts, body))
            .collect();
        vec![
            ("webhook-id".into(), "msg_1".into()),
            ("webhook-timestamp".into(), ts.to_string()),
            ("webhook-signature".into(), standard::header_value(&sigs)),
        ]
    }

    fn stripe_headers(secrets: &[&str], ts: i64, body: &[u8]) -> Vec<(String, String)> {
        let sigs: Vec<Mac256> = secrets
            .iter()
            .map(|s| stripe::signature(s, ts, body))
            .collect();
        vec![
            ("X-Webhook-ID".into(), "msg_1".into()),
            ("X-Webhook-Timestamp".into(), ts.to_string()),
            (
                "X-Webhook-Signature".into(),
                stripe::header_value(ts, &sigs),
            ),
        ]
    }

    #[test]
    fn both_schemes_round_trip() {
        let v = Verifier::new(SECRET).unwrap();
        let ok = v
            .verify_at(&standard_headers(&[SECRET], TS, BODY), BODY, TS)
            .unwrap();
        assert_eq!(ok.scheme, Scheme::StandardWebhooks);
        assert_eq!(ok.message_id.as_deref(), Some("msg_1"));
        let ok = v
            .verify_at(&stripe_headers(&[SECRET], TS, BODY), BODY, TS)
            .unwrap();
        assert_eq!(ok.scheme, Scheme::StripeCompatible);
        assert_eq!(ok.timestamp, TS);
    }

    #[test]
    fn tolerance_applies_in_both_directions() {
        let v = Verifier::new(SECRET).unwrap();
        for headers in [
            standard_headers(&[SECRET], TS, BODY),
            stripe_headers(&[SECRET], TS, BODY),
        ] {
            assert!(v.verify_at(&headers, BODY, TS + 300).is_ok());
            assert!(v.verify_at(&headers, BODY, TS - 300).is_ok());
            assert!(matches!(
                v.verify_at(&headers, BODY, TS + 301),
                Err(VerifyError::TimestampTooOld { age_secs: 301, .. })
            ));
            assert!(matches!(
                v.verify_at(&headers, BODY, TS - 301),
                Err(VerifyError::TimestampInFuture {
                    ahead_secs: 301,
                    ..
                })
            ));
        }
        let strict = Verifier::new(SECRET)
            .unwrap()
            .tolerance(Duration::from_secs(10));
        assert!(strict
            .verify_at(&standard_headers(&[SECRET], TS, BODY), BODY, TS + 11)
            .is_err());
    }

    #[test]
    fn rotation_any_signature_any_secret() {
        // Sender signs with old + new secret; a receiver holding either accepts.
        let headers = standard_headers(&[OTHER, SECRET], TS, BODY);
        assert!(Verifier::new(SECRET)
            .unwrap()
            .verify_at(&headers, BODY, TS)
            .is_ok());
        assert!(Verifier::new(OTHER)
            .unwrap()
            .verify_at(&headers, BODY, TS)
            .is_ok());
        let headers = stripe_headers(&[OTHER, SECRET], TS, BODY);
        assert!(Verifier::new(OTHER)
            .unwrap()
            .verify_at(&headers, BODY, TS)
            .is_ok());
        // A receiver holding both secrets accepts a signature by either.
        let both = Verifier::with_secrets([SECRET, OTHER]).unwrap();
        assert!(both
            .verify_at(&standard_headers(&[OTHER], TS, BODY), BODY, TS)
            .is_ok());
        assert!(both
            .verify_at(&stripe_headers(&[SECRET], TS, BODY), BODY, TS)
            .is_ok());
        // Neither secret -> mismatch.
        let third = Verifier::new("whsec_YW5vdGhlciBvbmUgZW50aXJlbHkgZGlmZmVyZW50").unwrap();
        assert_eq!(
            third.verify_at(&headers, BODY, TS),
            Err(VerifyError::SignatureMismatch)
        );
    }

    #[test]
    fn tampering_any_byte_of_body_id_or_timestamp_fails() {
        let v = Verifier::new(SECRET).unwrap();
        let headers = standard_headers(&[SECRET], TS, BODY);
        for i in 0..BODY.len() {
            let mut body = BODY.to_vec();
            body[i] ^= 0x01;
            assert_eq!(
                v.verify_at(&headers, &body, TS),
                Err(VerifyError::SignatureMismatch),
                "byte {i}"
            );
        }
        // Truncated / extended body, whitespace change.
        assert!(v.verify_at(&headers, &BODY[..BODY.len() - 1], TS).is_err());
        assert!(v.verify_at(&headers, &[BODY, b" "].concat(), TS).is_err());
        // Changed id.
        let mut h = headers.clone();
        h[0].1 = "msg_2".into();
        assert_eq!(
            v.verify_at(&h, BODY, TS),
            Err(VerifyError::SignatureMismatch)
        );
        // Changed timestamp (still within tolerance).
        let mut h = headers.clone();
        h[1].1 = (TS + 1).to_string();
        assert_eq!(
            v.verify_at(&h, BODY, TS),
            Err(VerifyError::SignatureMismatch)
        );
        // Flipped signature bit.
        let mut h = headers.clone();
        let mut raw = standard::parse_header(&h[2].1).remove(0);
        raw[31] ^= 0x80;
        use base64::Engine;
        h[2].1 = format!(
            "v1,{}",
            base64::engine::general_purpose::STANDARD.encode(raw)
        );
        assert_eq!(
            v.verify_at(&h, BODY, TS),
            Err(VerifyError::SignatureMismatch)
        );

        let headers = stripe_headers(&[SECRET], TS, BODY);
        for i in 0..BODY.len() {
            let mut body = BODY.to_vec();
            body[i] = body[i].wrapping_add(1);
            assert_eq!(
                v.verify_at(&headers, &body, TS),
                Err(VerifyError::SignatureMismatch)
            );
        }
        // Stripe scheme: t= and X-Webhook-Timestamp must agree.
        let mut h = headers.clone();
        h[1].1 = (TS + 1).to_string();
        assert!(matches!(
            v.verify_at(&h, BODY, TS),
            Err(VerifyError::MalformedHeader { .. })
        ));
    }

    #[test]
    fn typed_errors_for_missing_and_malformed_headers() {
        let v = Verifier::new(SECRET).unwrap();
        let none: [(&str, &str); 0] = [];
        assert_eq!(
            v.verify_at(&none[..], BODY, TS),
            Err(VerifyError::MissingHeader("webhook-id"))
        );
        let h = [
            ("webhook-id", "msg_1"),
            ("webhook-timestamp", "x"),
            ("webhook-signature", "v1,AA=="),
        ];
        assert!(matches!(
            v.verify_at(&h[..], BODY, TS),
            Err(VerifyError::MalformedHeader {
                header: "webhook-timestamp",
                ..
            })
        ));
        let h = [
            ("webhook-id", "msg_1"),
            ("webhook-timestamp", "1700000000"),
            ("webhook-signature", "v2,AA=="),
        ];
        assert_eq!(
            v.verify_at(&h[..], BODY, TS),
            Err(VerifyError::NoSupportedSignature("webhook-signature"))
        );
        let h = [("webhook-id", "msg_1"), ("webhook-timestamp", "1700000000")];
        assert_eq!(
            v.verify_at(&h[..], BODY, TS),
            Err(VerifyError::MissingHeader("webhook-signature"))
        );
        let h = [("X-Webhook-Signature", "v1=00")];
        assert!(matches!(
            v.verify_at(&h[..], BODY, TS),
            Err(VerifyError::MalformedHeader { .. })
        ));
        let h = [("X-Webhook-Signature", "t=1700000000,v0=00")];
        assert_eq!(
            v.verify_at(&h[..], BODY, TS),
            Err(VerifyError::NoSupportedSignature("X-Webhook-Signature"))
        );
        // Wrong-length signature (the seed's sample throws here): a plain mismatch.
        let h = [("X-Webhook-Signature", "t=1700000000,v1=abcd")];
        assert_eq!(
            v.verify_at(&h[..], BODY, TS),
            Err(VerifyError::SignatureMismatch)
        );
        assert!(Verifier::new("").is_err());
        assert!(Verifier::with_secrets(Vec::<String>::new()).is_err());
    }

    #[test]
    fn debug_never_shows_secrets() {
        let v = Verifier::new(SECRET).unwrap();
        let dbg = format!("{v:?}");
        assert!(!dbg.contains("MfKQ9r8"), "{dbg}");
    }

    #[test]
    fn extreme_timestamps_do_not_overflow() {
        let v = Verifier::new(SECRET).unwrap();
        let h = standard_headers(&[SECRET], -999_999_999_999_999_999, BODY);
        assert!(matches!(
            v.verify_at(&h, BODY, i64::MAX),
            Err(VerifyError::TimestampTooOld { .. })
        ));
        let h = standard_headers(&[SECRET], 999_999_999_999_999_999, BODY);
        assert!(matches!(
            v.verify_at(&h, BODY, i64::MIN),
            Err(VerifyError::TimestampInFuture { .. })
        ));
    }
}
