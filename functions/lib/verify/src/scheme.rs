//! The two signature schemes, as pure functions of their inputs.
//!
//! Both are HMAC-SHA256; they differ in key, signed content and header format:
//!
//! | scheme | key | signed content | header |
//! |---|---|---|---|
//! | [`standard`] (standardwebhooks.com) | base64-decoded part of `whsec_...` | `{id}.{timestamp}.{body}` | `webhook-signature: v1,<base64> [v1,<base64> ...]` |
//! | [`stripe`] (seed / Stripe-compatible) | the whole secret string's bytes | `{timestamp}.{body}` | `X-Webhook-Signature: t=<ts>,v1=<hex>[,v1=<hex> ...]` |

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// An HMAC-SHA256 output.
pub type Mac256 = [u8; 32];

/// Standard Webhooks header names.
pub const WEBHOOK_ID: &str = "webhook-id";
pub const WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
pub const WEBHOOK_SIGNATURE: &str = "webhook-signature";
/// Seed / Stripe-compatible header names.
pub const X_WEBHOOK_ID: &str = "X-Webhook-ID";
pub const X_WEBHOOK_TIMESTAMP: &str = "X-Webhook-Timestamp";
pub const X_WEBHOOK_SIGNATURE: &str = "X-Webhook-Signature";

/// Prefix of every secret this project issues.
pub const SECRET_PREFIX: &str = "whsec_";

fn hmac_parts(key: &[u8], parts: &[&[u8]]) -> Mac256 {
    // HMAC accepts keys of any length; `new_from_slice` cannot fail for HMAC.
    let mut mac = match Hmac::<Sha256>::new_from_slice(key) {
        Ok(mac) => mac,
        Err(_) => unreachable_invalid_length(),
    };
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

#[cold]
fn unreachable_invalid_length() -> ! {
    // hmac::digest::InvalidLength is never returned for HMAC (any key length is valid).
    panic!("HMAC rejected a key length, which the hmac crate documents as impossible")
}

/// Standard Webhooks (<https://www.standardwebhooks.com/>).
pub mod standard {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
    use base64::Engine;

    use super::{hmac_parts, Mac256, SECRET_PREFIX};
    use crate::VerifyError;

    /// The HMAC key of a secret: base64 decoding of what follows `whsec_`
    /// (the prefix is optional, padding too, as in the official libraries).
    pub fn decode_secret(secret: &str) -> Result<Vec<u8>, VerifyError> {
        let b64 = secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret);
        let key = STANDARD
            .decode(b64)
            .or_else(|_| STANDARD_NO_PAD.decode(b64))
            .map_err(|_| VerifyError::InvalidSecret("not base64 after the `whsec_` prefix"))?;
        if key.is_empty() {
            return Err(VerifyError::InvalidSecret("empty key"));
        }
        Ok(key)
    }

    /// HMAC-SHA256 over `{msg_id}.{timestamp}.{body}`.
    pub fn signature(key: &[u8], msg_id: &str, timestamp: i64, body: &[u8]) -> Mac256 {
        let ts = timestamp.to_string();
        hmac_parts(key, &[msg_id.as_bytes(), b".", ts.as_bytes(), b".", body])
    }

    /// `v1,<base64> v1,<base64> ...` for the `webhook-signature` header.
    pub fn header_value(signatures: &[Mac256]) -> String {
        signatures
            .iter()
            .map(|s| format!("v1,{}", STANDARD.encode(s)))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The `v1` signatures of a `webhook-signature` header, decoded. Entries of
    /// other versions and undecodable entries are skipped (never an error), so
    /// the result may be empty.
    pub fn parse_header(value: &str) -> Vec<Vec<u8>> {
        value
            .split(' ')
            .filter_map(|entry| entry.split_once(','))
            .filter(|(version, _)| *version == "v1")
            .filter_map(|(_, sig)| STANDARD.decode(sig).ok())
            .collect()
    }
}

/// The seed's scheme, made Stripe-compatible (`t=` equals `X-Webhook-Timestamp`).
pub mod stripe {
    use super::{hmac_parts, Mac256};

    /// HMAC-SHA256 over `{timestamp}.{body}`, keyed with the secret string's bytes.
    pub fn signature(secret: &str, timestamp: i64, body: &[u8]) -> Mac256 {
        let ts = timestamp.to_string();
        hmac_parts(secret.as_bytes(), &[ts.as_bytes(), b".", body])
    }

    /// `t=<ts>,v1=<hex>[,v1=<hex>...]` for the `X-Webhook-Signature` header.
    pub fn header_value(timestamp: i64, signatures: &[Mac256]) -> String {
        let mut out = format!("t={timestamp}");
        for sig in signatures {
            out.push_str(",v1=");
            out.push_str(&hex::encode(sig));
        }
        out
    }

    /// A parsed `X-Webhook-Signature` header.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct ParsedHeader {
        /// The `t=` value, if present and a valid integer (`None` also when repeated).
        pub timestamp: Option<i64>,
        /// The `v1=` signatures that decoded as hex; other schemes are skipped.
        pub signatures: Vec<Vec<u8>>,
    }

    /// Parses `t=...,v1=...`; never fails, never panics.
    pub fn parse_header(value: &str) -> ParsedHeader {
        let mut timestamp = None;
        let mut timestamps_seen = 0;
        let mut signatures = Vec::new();
        for item in value.split(',') {
            let Some((k, v)) = item.trim().split_once('=') else {
                continue;
            };
            match k {
                "t" => {
                    timestamps_seen += 1;
                    timestamp = super::parse_unix_seconds(v);
                }
                "v1" => {
                    if let Ok(sig) = hex::decode(v) {
                        signatures.push(sig);
                    }
                }
                _ => {}
            }
        }
        if timestamps_seen != 1 {
            timestamp = None;
        }
        ParsedHeader {
            timestamp,
            signatures,
        }
    }
}

/// Strict unix-seconds parsing: ASCII digits only (an optional leading `-` for
/// completeness), at most 19 of them; no `+`, spaces or exponents.
pub fn parse_unix_seconds(s: &str) -> Option<i64> {
    let digits = s.strip_prefix('-').unwrap_or(s);
    if digits.is_empty() || digits.len() > 18 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Standard Webhooks specification's published test vector.
    #[test]
    fn standard_webhooks_published_vector() {
        let key = standard::decode_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let sig = standard::signature(
            &key,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(
            standard::header_value(&[sig]),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn secret_prefix_and_padding_are_optional() {
        let a = standard::decode_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let b = standard::decode_secret("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(a, b);
        let unpadded = standard::decode_secret("whsec_YWJjZA").unwrap();
        assert_eq!(unpadded, b"abcd");
        assert!(standard::decode_secret("whsec_").is_err());
        assert!(standard::decode_secret("whsec_***").is_err());
    }

    #[test]
    fn stripe_header_round_trip_with_rotation() {
        let s1 = stripe::signature("whsec_a", 10, b"{}");
        let s2 = stripe::signature("whsec_b", 10, b"{}");
        let header = stripe::header_value(10, &[s1, s2]);
        assert!(header.starts_with("t=10,v1="));
        let parsed = stripe::parse_header(&header);
        assert_eq!(parsed.timestamp, Some(10));
        assert_eq!(parsed.signatures, vec![s1.to_vec(), s2.to_vec()]);
    }

    #[test]
    fn stripe_header_rejects_repeated_or_bad_timestamps() {
        assert_eq!(stripe::parse_header("t=1,t=2,v1=00").timestamp, None);
        assert_eq!(stripe::parse_header("t=+1,v1=00").timestamp, None);
        assert_eq!(stripe::parse_header("t=1e3").timestamp, None);
        assert_eq!(stripe::parse_header("v1=zz").signatures.len(), 0);
    }

    #[test]
    fn standard_header_skips_unknown_versions() {
        let parsed = standard::parse_header("v2,AAAA v1,AAAA v1a,AAAA garbage v1,***");
        assert_eq!(parsed, vec![vec![0, 0, 0]]);
    }

    #[test]
    fn unix_seconds_parsing_is_strict() {
        assert_eq!(parse_unix_seconds("1614265330"), Some(1_614_265_330));
        assert_eq!(parse_unix_seconds("-5"), Some(-5));
        for bad in [
            "",
            "-",
            "+5",
            " 5",
            "5 ",
            "1.5",
            "99999999999999999999",
            "0x10",
        ] {
            assert_eq!(parse_unix_seconds(bad), None, "{bad:?}");
        }
    }
}
