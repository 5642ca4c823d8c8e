//! Endpoint secrets and the signed header set of one message.

use std::fmt;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use rand::RngCore;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use hookline_verify::scheme::{self, standard, stripe, Mac256};

use crate::CoreError;

/// `User-Agent` of every delivery.
pub const USER_AGENT: &str = concat!("hookline/", env!("CARGO_PKG_VERSION"), " (+webhooks)");

/// Random bytes in a generated secret (the minimum accepted is 24).
pub const SECRET_BYTES: usize = 32;
const MIN_SECRET_BYTES: usize = 24;
const MAX_SECRET_BYTES: usize = 64;

/// An endpoint's signing secret: `whsec_` + base64 of 24..=64 bytes.
///
/// `Debug` and `Display` print `whsec_***`; read it with [`Secret::expose`].
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// A new secret of [`SECRET_BYTES`] random bytes.
    pub fn generate(rng: &mut dyn RngCore) -> Self {
        let mut bytes = [0u8; SECRET_BYTES];
        rng.fill_bytes(&mut bytes);
        Self(format!(
            "{}{}",
            scheme::SECRET_PREFIX,
            STANDARD.encode(bytes)
        ))
    }

    /// Validates a user-supplied secret.
    pub fn parse(text: &str) -> Result<Self, CoreError> {
        let b64 = text
            .strip_prefix(scheme::SECRET_PREFIX)
            .ok_or(CoreError::InvalidSecret("must start with `whsec_`"))?;
        let key = STANDARD.decode(b64).map_err(|_| {
            CoreError::InvalidSecret("the part after `whsec_` must be standard base64")
        })?;
        if !(MIN_SECRET_BYTES..=MAX_SECRET_BYTES).contains(&key.len()) {
            return Err(CoreError::InvalidSecret("must encode 24 to 64 bytes"));
        }
        Ok(Self(text.to_owned()))
    }

    /// The secret text. Handle with care: never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    fn standard_key(&self) -> Vec<u8> {
        // `parse`/`generate` guarantee valid base64 after the prefix.
        standard::decode_secret(&self.0).unwrap_or_default()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(whsec_***)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("whsec_***")
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// Which signature schemes to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schemes {
    pub standard_webhooks: bool,
    pub stripe_compatible: bool,
}

impl Default for Schemes {
    /// Both, as the design asks.
    fn default() -> Self {
        Self {
            standard_webhooks: true,
            stripe_compatible: true,
        }
    }
}

/// The headers of one signed delivery, in sending order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedHeaders(pub Vec<(&'static str, String)>);

impl SignedHeaders {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &str)> {
        self.0.iter().map(|(k, v)| (*k, v.as_str()))
    }
}

/// Signs `body` as message `message_id` at unix time `timestamp` with every
/// secret in `secrets` (several during a rotation), returning the full header
/// set: `Content-Type`, `User-Agent`, and each enabled scheme's id, timestamp
/// and signature headers.
pub fn sign(
    message_id: &str,
    timestamp: i64,
    body: &[u8],
    secrets: &[&Secret],
    schemes: Schemes,
) -> Result<SignedHeaders, CoreError> {
    if secrets.is_empty() {
        return Err(CoreError::InvalidSecret("no secret to sign with"));
    }
    if !schemes.standard_webhooks && !schemes.stripe_compatible {
        return Err(CoreError::InvalidInput {
            field: "schemes",
            reason: "at least one signature scheme must be enabled".into(),
        });
    }
    let mut headers = vec![
        ("Content-Type", "application/json".to_owned()),
        ("User-Agent", USER_AGENT.to_owned()),
    ];
    if schemes.standard_webhooks {
        let sigs: Vec<Mac256> = secrets
            .iter()
            .map(|s| standard::signature(&s.standard_key(), message_id, timestamp, body))
            .collect();
        headers.push((scheme::WEBHOOK_ID, message_id.to_owned()));
        headers.push((scheme::WEBHOOK_TIMESTAMP, timestamp.to_string()));
        headers.push((scheme::WEBHOOK_SIGNATURE, standard::header_value(&sigs)));
    }
    if schemes.stripe_compatible {
        let sigs: Vec<Mac256> = secrets
            .iter()
            .map(|s| stripe::signature(s.expose(), timestamp, body))
            .collect();
        headers.push((scheme::X_WEBHOOK_ID, message_id.to_owned()));
        headers.push((scheme::X_WEBHOOK_TIMESTAMP, timestamp.to_string()));
        headers.push((
            scheme::X_WEBHOOK_SIGNATURE,
            stripe::header_value(timestamp, &sigs),
        ));
    }
    Ok(SignedHeaders(headers))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hookline_verify::{Scheme, Verifier};
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn generated_secrets_are_valid_and_distinct() {
        let mut rng = StdRng::seed_from_u64(7);
        let a = Secret::generate(&mut rng);
        let b = Secret::generate(&mut rng);
        assert_ne!(a, b);
        assert!(a.expose().starts_with("whsec_"));
        assert_eq!(Secret::parse(a.expose()).unwrap(), a);
        assert_eq!(a.standard_key().len(), SECRET_BYTES);
    }

    #[test]
    fn secret_validation() {
        assert!(Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_ok()); // 24 bytes
        assert!(Secret::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_err());
        assert!(Secret::parse("whsec_c2hvcnQ=").is_err());
        assert!(Secret::parse("whsec_not base64!!").is_err());
        assert!(Secret::parse(&format!("whsec_{}", STANDARD.encode([1u8; 65]))).is_err());
    }

    #[test]
    fn secrets_never_print() {
        let s = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(format!("{s}"), "whsec_***");
        assert!(!format!("{s:?}").contains("MfKQ"));
    }

    #[test]
    fn full_header_set_verifies_with_both_schemes_and_rotation() {
        let old = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let new = Secret::generate(&mut StdRng::seed_from_u64(3));
        let body = br#"{"type":"a","timestamp":"2024-01-01T00:00:00Z","data":{}}"#;
        let h = sign(
            "msg_abc",
            1_700_000_000,
            body,
            &[&new, &old],
            Schemes::default(),
        )
        .unwrap();
        let names: Vec<&str> = h.iter().map(|(k, _)| k).collect();
        assert_eq!(
            names,
            [
                "Content-Type",
                "User-Agent",
                "webhook-id",
                "webhook-timestamp",
                "webhook-signature",
                "X-Webhook-ID",
                "X-Webhook-Timestamp",
                "X-Webhook-Signature"
            ]
        );
        assert_eq!(h.get("webhook-signature").unwrap().split(' ').count(), 2);
        assert_eq!(
            h.get("x-webhook-signature").unwrap().matches("v1=").count(),
            2
        );
        assert_eq!(h.get("X-Webhook-Timestamp"), h.get("webhook-timestamp"));
        assert!(h
            .get("X-Webhook-Signature")
            .unwrap()
            .starts_with("t=1700000000,"));
        for secret in [&old, &new] {
            let v = Verifier::new(secret.expose()).unwrap();
            assert_eq!(
                v.verify_standard_at(&h.0, body, 1_700_000_000)
                    .unwrap()
                    .scheme,
                Scheme::StandardWebhooks
            );
            assert_eq!(
                v.verify_stripe_at(&h.0, body, 1_700_000_000)
                    .unwrap()
                    .scheme,
                Scheme::StripeCompatible
            );
        }
    }

    #[test]
    fn scheme_selection_and_errors() {
        let s = Secret::generate(&mut StdRng::seed_from_u64(4));
        let only_std = Schemes {
            standard_webhooks: true,
            stripe_compatible: false,
        };
        let h = sign("msg_1", 1, b"{}", &[&s], only_std).unwrap();
        assert!(h.get("X-Webhook-Signature").is_none() && h.get("webhook-signature").is_some());
        assert!(sign("msg_1", 1, b"{}", &[], Schemes::default()).is_err());
        let none = Schemes {
            standard_webhooks: false,
            stripe_compatible: false,
        };
        assert!(sign("msg_1", 1, b"{}", &[&s], none).is_err());
    }
}
