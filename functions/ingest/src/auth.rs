//! Bearer API keys. Keys are never stored or compared in clear: the API holds
//! SHA-256 hashes and compares in constant time. The admin key (all apps)
//! comes from the deployment's configuration; app-scoped keys are created
//! through the API and stored in the table, hashed.

use subtle::ConstantTimeEq;

use hookline_core::apikey::ApiKey;
use hookline_core::ids::{ApiKeyId, AppId};
use hookline_pipeline::operational::{self, OPERATIONAL_APP};
use hookline_pipeline::ports::Store;
use hookline_pipeline::settings::{KeyHash, Settings};

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
    /// The admin key: every app, and the DLQ.
    Admin,
    /// An app-scoped key: that app's endpoints, events, deliveries only.
    App(AppId),
    /// A portal session of an app: the routes open to the app's customers
    /// ([`crate::router::Access::Portal`]) for that app only.
    Portal(AppId),
}

impl Scope {
    /// 403 unless the scope covers `app`.
    pub fn allows(&self, app: &AppId) -> Result<(), ApiError> {
        match self {
            Scope::Admin => Ok(()),
            // The operational app is the operator's own (admin key only).
            Scope::App(_) | Scope::Portal(_) if operational::is_operational(app) => Err(
                ApiError::forbidden(format!("the app {OPERATIONAL_APP} takes the admin API key")),
            ),
            Scope::App(own) | Scope::Portal(own) if own == app => Ok(()),
            Scope::App(_) => Err(ApiError::forbidden("this API key is scoped to another app")),
            Scope::Portal(_) => Err(ApiError::forbidden(
                "this portal session is scoped to another app",
            )),
        }
    }

    /// 403 unless this is the admin key.
    pub fn require_admin(&self) -> Result<(), ApiError> {
        match self {
            Scope::Admin => Ok(()),
            Scope::App(_) | Scope::Portal(_) => {
                Err(ApiError::forbidden("this route needs the admin API key"))
            }
        }
    }

    /// 403 for a portal session: this route is not open to the app's customers.
    pub fn require_key(&self) -> Result<(), ApiError> {
        match self {
            Scope::Portal(_) => Err(ApiError::forbidden(
                "a portal session may manage the app's endpoints, deliveries and replays and read the event-type catalog, nothing else",
            )),
            Scope::Admin | Scope::App(_) => Ok(()),
        }
    }
}

fn sha256(text: &str) -> [u8; 32] {
    KeyHash::of(text).0
}

impl ApiKeys {
    /// The admin key of the settings (`WEBHOOKS_ADMIN_KEY[_SHA256]`).
    pub fn from_settings(settings: &Settings) -> Self {
        Self {
            admin_hash: settings.admin_key_sha256.map(|h| h.0),
        }
    }

    /// Accepts exactly this admin key.
    pub fn admin(key: &str) -> Self {
        Self {
            admin_hash: Some(sha256(key)),
        }
    }

    /// Checks an `Authorization` header value: the admin key, or an
    /// app-scoped key or portal session (`key_....<secret>`) looked up by its
    /// id in `store` and compared by hash in constant time; a portal session
    /// past its end at `now` is refused (401).
    pub async fn authenticate<S: Store>(
        &self,
        header: Option<&str>,
        store: &S,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Scope, ApiError> {
        Ok(self.authenticate_key(header, store, now).await?.0)
    }

    /// [`Self::authenticate`], with the id of the key presented (`None`:
    /// the admin key). A portal session opened with an app key ends when
    /// that key is deleted.
    pub async fn authenticate_key<S: Store>(
        &self,
        header: Option<&str>,
        store: &S,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<(Scope, Option<ApiKeyId>), ApiError> {
        let unauthorized = |m: &str| ApiError::unauthorized(m);
        let header =
            header.ok_or_else(|| unauthorized("missing `Authorization: Bearer <api key>`"))?;
        let token = header
            .strip_prefix("Bearer ")
            .or_else(|| header.strip_prefix("bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| unauthorized("expected `Authorization: Bearer <api key>`"))?;
        if let Some(id) = ApiKey::id_of(token) {
            let record = store.get_api_key(&id).await.map_err(ApiError::from)?;
            return match record {
                Some(record) if record.matches(token) => {
                    if record.expired(now) {
                        Err(unauthorized("this portal session has expired"))
                    } else if record.is_portal_session() {
                        if let Some(opener) = &record.opened_by {
                            let alive = store
                                .get_api_key(opener)
                                .await
                                .map_err(ApiError::from)?
                                .is_some_and(|k| {
                                    k.app_id == record.app_id && !k.is_portal_session()
                                });
                            if !alive {
                                return Err(unauthorized(
                                    "the API key that opened this portal session was deleted",
                                ));
                            }
                        }
                        Ok((Scope::Portal(record.app_id), Some(id)))
                    } else {
                        Ok((Scope::App(record.app_id), Some(id)))
                    }
                }
                _ => Err(unauthorized("invalid API key")),
            };
        }
        let presented = sha256(token);
        match &self.admin_hash {
            Some(hash) if bool::from(hash.ct_eq(&presented)) => Ok((Scope::Admin, None)),
            _ => Err(unauthorized("invalid API key")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use hookline_pipeline::fakes::MemoryStore;
    use lambda_http::http::StatusCode;
    use rand::SeedableRng;

    #[tokio::test]
    async fn admin_and_app_keys() {
        let store = MemoryStore::default();
        let keys = ApiKeys::admin("s3cret");
        assert_eq!(
            keys.authenticate(Some("Bearer s3cret"), &store, Utc::now())
                .await
                .unwrap(),
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
            let err = keys
                .authenticate(bad, &store, Utc::now())
                .await
                .unwrap_err();
            assert_eq!(err.status, StatusCode::UNAUTHORIZED);
            assert!(!err.message.contains("s3cret"));
        }
        let acme = AppId::parse("acme").unwrap();
        let (record, key) = ApiKey::generate(
            acme.clone(),
            "ci",
            Utc::now(),
            &mut rand::rngs::StdRng::seed_from_u64(1),
        );
        let header = format!("Bearer {key}");
        assert!(
            keys.authenticate(Some(&header), &store, Utc::now())
                .await
                .is_err(),
            "not stored yet"
        );
        store.put_api_key(&record).await.unwrap();
        let scope = keys
            .authenticate(Some(&header), &store, Utc::now())
            .await
            .unwrap();
        assert_eq!(scope, Scope::App(acme.clone()));
        assert!(scope.allows(&acme).is_ok());
        let other = AppId::parse("globex").unwrap();
        assert_eq!(
            scope.allows(&other).unwrap_err().status,
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            scope.require_admin().unwrap_err().status,
            StatusCode::FORBIDDEN
        );
        // The operational app takes the admin key, even a key made for it.
        let operational = AppId::parse(OPERATIONAL_APP).unwrap();
        assert!(Scope::Admin.allows(&operational).is_ok());
        let err = Scope::App(operational.clone())
            .allows(&operational)
            .unwrap_err();
        assert_eq!(err.status, StatusCode::FORBIDDEN);
        assert!(err.message.contains("admin"), "{}", err.message);
        let mut forged = key.clone();
        forged.replace_range(key.len() - 4.., "AAAA");
        let err = keys
            .authenticate(Some(&format!("Bearer {forged}")), &store, Utc::now())
            .await
            .unwrap_err();
        assert_eq!(err.status, StatusCode::UNAUTHORIZED);
        store.delete_api_key(&acme, &record.id).await.unwrap();
        assert!(
            keys.authenticate(Some(&header), &store, Utc::now())
                .await
                .is_err(),
            "revoked"
        );

        let settings = |vars: &[(&str, &str)]| Settings::for_tests(vars);
        let none = ApiKeys::from_settings(&settings(&[]).unwrap());
        assert!(none
            .authenticate(Some("Bearer anything"), &store, Utc::now())
            .await
            .is_err());
        let hash = hex::encode(sha256("k1"));
        let hashed =
            ApiKeys::from_settings(&settings(&[("WEBHOOKS_ADMIN_KEY_SHA256", &hash)]).unwrap());
        assert!(hashed
            .authenticate(Some("Bearer k1"), &store, Utc::now())
            .await
            .is_ok());
        let plain = ApiKeys::from_settings(&settings(&[("WEBHOOKS_ADMIN_KEY", " k2 ")]).unwrap());
        assert!(plain
            .authenticate(Some("Bearer k2"), &store, Utc::now())
            .await
            .is_ok());
        assert!(settings(&[("WEBHOOKS_ADMIN_KEY_SHA256", "zz")]).is_err());
        assert!(!format!("{keys:?}").contains("s3cret"));
    }
}
