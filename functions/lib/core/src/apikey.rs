//! App-scoped API keys. A key is `<key id>.<secret>` (`key_...` then 43
//! characters of base64url, 256 random bits); only its SHA-256 is stored.
//! The id part lets the API find the one record to compare against, in
//! constant time, without a table scan or a per-key index.
//!
//! A **portal session** is such a key with an end (`portal_until`): handed
//! to the app's own customers through the consumer portal, it may touch
//! only the app's endpoints, deliveries and replays and read the catalog,
//! and stops working at its end or when revoked (its record deleted).

use base64::Engine;
use chrono::{DateTime, Utc};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::ids::{ApiKeyId, AppId};

/// An API key record as stored: never the key itself.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiKey {
    pub id: ApiKeyId,
    pub app_id: AppId,
    pub name: String,
    /// Hex SHA-256 of the whole key text.
    pub key_sha256: String,
    pub created_at: DateTime<Utc>,
    /// A portal session's end; `None` for an API key (no end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub portal_until: Option<DateTime<Utc>>,
    /// The app key that opened this portal session (`None`: the admin
    /// key): the session ends when that key is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opened_by: Option<ApiKeyId>,
}

/// Shortest, default and longest portal session.
pub const PORTAL_SESSION_MIN_SECONDS: u32 = 60;
pub const PORTAL_SESSION_DEFAULT_SECONDS: u32 = 3600;
pub const PORTAL_SESSION_MAX_SECONDS: u32 = 86_400;

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKey")
            .field("id", &self.id)
            .field("app_id", &self.app_id)
            .field("name", &self.name)
            .field("portal_until", &self.portal_until)
            .finish_non_exhaustive()
    }
}

/// Hex SHA-256 of a key's text.
pub fn key_sha256(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

impl ApiKey {
    /// A fresh key for `app`: the record to store and the key text, which
    /// is shown once and never again.
    pub fn generate(
        app_id: AppId,
        name: impl Into<String>,
        now: DateTime<Utc>,
        rng: &mut dyn RngCore,
    ) -> (Self, String) {
        let id = ApiKeyId::new(now, rng);
        let mut secret = [0u8; 32];
        rng.fill_bytes(&mut secret);
        let key = format!(
            "{id}.{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret)
        );
        let record = Self {
            id,
            app_id,
            name: name.into(),
            key_sha256: key_sha256(&key),
            created_at: now,
            portal_until: None,
            opened_by: None,
        };
        (record, key)
    }

    /// A fresh portal session for `app`, valid for `seconds` (checked by
    /// the caller against the `PORTAL_SESSION_*` bounds).
    /// A portal session of `app_id` for `seconds`, opened with the app key
    /// `opened_by` (`None`: the admin key).
    pub fn generate_portal_session(
        app_id: AppId,
        seconds: u32,
        opened_by: Option<ApiKeyId>,
        now: DateTime<Utc>,
        rng: &mut dyn RngCore,
    ) -> (Self, String) {
        let (mut record, token) = Self::generate(app_id, "portal session", now, rng);
        record.portal_until = Some(now + chrono::Duration::seconds(i64::from(seconds)));
        record.opened_by = opened_by;
        (record, token)
    }

    /// Whether this is a portal session (limited routes, an end).
    pub fn is_portal_session(&self) -> bool {
        self.portal_until.is_some()
    }

    /// Whether it has stopped working at `now` (a portal session past its
    /// end; an API key never expires).
    pub fn expired(&self, now: DateTime<Utc>) -> bool {
        self.portal_until.is_some_and(|until| now >= until)
    }

    /// The id part of a presented key, if it has the shape of one.
    pub fn id_of(presented: &str) -> Option<ApiKeyId> {
        let (id, secret) = presented.split_once('.')?;
        if secret.len() != 43 {
            return None;
        }
        ApiKeyId::parse(id).ok()
    }

    /// Whether `presented` is this key (constant time in the key's content).
    pub fn matches(&self, presented: &str) -> bool {
        bool::from(
            key_sha256(presented)
                .as_bytes()
                .ct_eq(self.key_sha256.as_bytes()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    /// Stored key hashes (and the admin key's, from the settings) are this
    /// encoding: lowercase hex of SHA-256 (FIPS 180-2's "abc" vector).
    #[test]
    fn a_key_hash_is_lowercase_hex_sha256() {
        assert_eq!(
            key_sha256("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn generated_keys_match_only_themselves() {
        let mut rng = StdRng::seed_from_u64(7);
        let app = AppId::parse("acme").unwrap();
        let (record, key) = ApiKey::generate(app, "ci", Utc::now(), &mut rng);
        assert_eq!(ApiKey::id_of(&key), Some(record.id.clone()));
        assert!(record.matches(&key));
        assert!(!record.key_sha256.contains(&key));
        let mut other = key.clone();
        other.pop();
        other.push('A');
        assert!(!record.matches(&other) || other == key);
        assert!(!record.matches(""));
        assert!(!format!("{record:?}").contains(&record.key_sha256));
        for bad in ["", "key_", "key_x.y", "nodot", &key[..key.len() - 1]] {
            assert_eq!(ApiKey::id_of(bad), None, "{bad}");
        }
        assert!(
            !record.is_portal_session()
                && !record.expired(Utc::now() + chrono::Duration::days(9999))
        );
    }

    #[test]
    fn portal_sessions_end() {
        let mut rng = StdRng::seed_from_u64(8);
        let now = Utc::now();
        let app = AppId::parse("acme").unwrap();
        let (record, token) = ApiKey::generate_portal_session(app, 60, None, now, &mut rng);
        assert!(record.is_portal_session() && record.matches(&token));
        assert_eq!(ApiKey::id_of(&token), Some(record.id.clone()));
        assert!(!record.expired(now + chrono::Duration::seconds(59)));
        assert!(record.expired(now + chrono::Duration::seconds(60)));
    }
}
