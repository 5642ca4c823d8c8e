//! Bearer API keys. Keys are never stored or compared in clear: the API holds
//! SHA-256 hashes and compares in constant time.

use lambda_http::http::StatusCode;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::ApiError;

/// The keys the API accepts.
#[derive(Clone)]
pub struct ApiKeys {
    /// SHA-256 of the admin key (all apps), if configured.
    admin_hash: Option<[u8; 32]>,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKeys")
            .field("admin", &self.admin_hash.is_some())
            .finish()
    }
}

/// What a request is allowed to touch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    Admin,
}

impl Scope {
    pub fn allows(&self, _app: &str) -> Result<(), ApiError> {
        match self {
            Scope::Admin => Ok(()),
        }
    }

    pub fn require_admin(&self) -> Result<(), ApiError> {
        match self {
            Scope::Admin => Ok(()),
        }
    }
}

fn sha256(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

impl ApiKeys {
    /// From `WEBHOOKS_ADMIN_KEY_SHA256` (hex; what a deployment stores) or
    /// `WEBHOOKS_ADMIN_KEY` (the key itself; local runs).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        if let Some(hex_hash) = lookup("WEBHOOKS_ADMIN_KEY_SHA256").filter(|v| !v.trim().is_empty())
        {
            let bytes = hex::decode(hex_hash.trim())
                .map_err(|_| "WEBHOOKS_ADMIN_KEY_SHA256 is not hex".to_owned())?;
            let hash: [u8; 32] = bytes
                .try_into()
                .map_err(|_| "WEBHOOKS_ADMIN_KEY_SHA256 is not 32 bytes".to_owned())?;
            return Ok(Self {
                admin_hash: Some(hash),
            });
        }
        Ok(Self {
            admin_hash: lookup("WEBHOOKS_ADMIN_KEY")
                .filter(|v| !v.trim().is_empty())
                .map(|k| sha256(k.trim())),
        })
    }

    pub fn from_env() -> Result<Self, String> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Accepts exactly this admin key.
    pub fn admin(key: &str) -> Self {
        Self {
            admin_hash: Some(sha256(key)),
        }
    }

    /// Checks an `Authorization` header value.
    pub fn authenticate(&self, header: Option<&str>) -> Result<Scope, ApiError> {
        let unauthorized = |m: &str| ApiError {
            status: StatusCode::UNAUTHORIZED,
            code: "unauthorized",
            message: m.to_owned(),
        };
        let header =
            header.ok_or_else(|| unauthorized("missing `Authorization: Bearer <api key>`"))?;
        let token = header
            .strip_prefix("Bearer ")
            .or_else(|| header.strip_prefix("bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| unauthorized("expected `Authorization: Bearer <api key>`"))?;
        let presented = sha256(token);
        match &self.admin_hash {
            Some(hash) if bool::from(hash.ct_eq(&presented)) => Ok(Scope::Admin),
            _ => Err(unauthorized("invalid API key")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_keys() {
        let keys = ApiKeys::admin("s3cret");
        assert_eq!(
            keys.authenticate(Some("Bearer s3cret")).unwrap(),
            Scope::Admin
        );
        for bad in [
            None,
            Some(""),
            Some("Bearer "),
            Some("Basic s3cret"),
            Some("Bearer s3cre"),
            Some("Bearer s3crett"),
        ] {
            let err = keys.authenticate(bad).unwrap_err();
            assert_eq!(err.status, StatusCode::UNAUTHORIZED);
            assert!(!err.message.contains("s3cret"));
        }
        let none = ApiKeys::from_lookup(|_| None).unwrap();
        assert!(none.authenticate(Some("Bearer anything")).is_err());
        let hashed = ApiKeys::from_lookup(|k| {
            (k == "WEBHOOKS_ADMIN_KEY_SHA256").then(|| hex::encode(sha256("k1")))
        })
        .unwrap();
        assert!(hashed.authenticate(Some("Bearer k1")).is_ok());
        assert!(ApiKeys::from_lookup(
            |k| (k == "WEBHOOKS_ADMIN_KEY_SHA256").then(|| "zz".to_owned())
        )
        .is_err());
        assert!(!format!("{keys:?}").contains("s3cret"));
    }
}
