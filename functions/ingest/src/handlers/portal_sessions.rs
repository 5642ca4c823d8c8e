//! `/v1/apps/{app_id}/portal-sessions`: short-lived tokens for an app's
//! own customers (the consumer portal). A session is an app-scoped key with
//! an end, stored hashed like any key; the router lets it call only the
//! routes declared `Portal` (the app's endpoints, deliveries, replays,
//! stats and the catalog), for its app only.

use hookline_core::apikey::{
    ApiKey, PORTAL_SESSION_DEFAULT_SECONDS, PORTAL_SESSION_MAX_SECONDS, PORTAL_SESSION_MIN_SECONDS,
};
use hookline_pipeline::ports::Store;
use hookline_pipeline::PipelineError;
use lambda_http::http::StatusCode;

use crate::call::{Answer, Call};
use crate::error::ApiError;
use crate::respond::{json, no_content};
use crate::views::{
    AppPath, CreatePortalSession, ErrorBody, PortalSessionList, PortalSessionOut,
    PortalSessionPath, PortalSessionSummary,
};
use crate::Api;

/// Opens a portal session for the app's customers (admin key or the app's
/// key): a bearer token that works for the app's portal routes only, until
/// `expires_at`, and the portal `url` that signs in with it.
#[utoipa::path(post, path = "/v1/apps/{app_id}/portal-sessions", tag = "portal",
    params(AppPath), request_body(content = CreatePortalSession, description = "optional"),
    responses((status = 201, body = PortalSessionOut), (status = 400, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn create_portal_session<S: Store, Q>(api: &Api<S, Q>, call: Call<'_>) -> Answer {
    let path: AppPath = call.path()?;
    let req: CreatePortalSession = call.json_or_default()?;
    if hookline_pipeline::operational::is_operational(&path.app_id) {
        return Err(ApiError::bad_request(
            "reserved_app",
            "the operational app is the operator's own; it has no portal",
        ));
    }
    let seconds = req
        .expires_in_seconds
        .unwrap_or(PORTAL_SESSION_DEFAULT_SECONDS);
    if !(PORTAL_SESSION_MIN_SECONDS..=PORTAL_SESSION_MAX_SECONDS).contains(&seconds) {
        return Err(ApiError::bad_request(
            "invalid_expires_in_seconds",
            format!(
                "expires_in_seconds must be {PORTAL_SESSION_MIN_SECONDS} to {PORTAL_SESSION_MAX_SECONDS}"
            ),
        ));
    }
    let live = live_sessions(api, &path.app_id, call.now).await?;
    if live.len() >= MAX_LIVE_SESSIONS {
        return Err(ApiError::conflict(
            "too_many_sessions",
            format!(
                "the app has {MAX_LIVE_SESSIONS} live portal sessions: revoke one, or let one end"
            ),
        ));
    }
    // An app key's session ends with that key (the admin's with its end).
    let (record, token) = ApiKey::generate_portal_session(
        path.app_id,
        seconds,
        call.caller.clone(),
        call.now,
        call.rng,
    );
    let expires_at = record.portal_until.expect("a portal session has an end");
    api.store.put_api_key(&record).await?;
    tracing::info!(session_id = %record.id, app_id = %record.app_id, %expires_at, "portal session opened");
    // The fragment never reaches a server (nor a Referer): the page reads
    // it, keeps the token in the tab and takes it out of the address bar.
    let url = format!(
        "{}#app={}&token={token}",
        portal_page(api, &call),
        record.app_id
    );
    Ok(json(
        StatusCode::CREATED,
        &PortalSessionOut {
            id: record.id.to_string(),
            app_id: record.app_id.to_string(),
            token,
            url,
            expires_at,
        },
    ))
}

/// Live portal sessions an app may have at once: each is a bearer token
/// to the app's portal routes, and an app key cannot mint them without end.
pub const MAX_LIVE_SESSIONS: usize = 100;

/// The app's portal sessions that work now: not past their end, and their
/// opening key (if an app key) not deleted. Oldest first.
async fn live_sessions<S: Store, Q>(
    api: &Api<S, Q>,
    app: &hookline_core::ids::AppId,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Vec<ApiKey>, ApiError> {
    let keys = api.store.list_api_keys(app).await?;
    let app_keys: std::collections::HashSet<_> = keys
        .iter()
        .filter(|k| !k.is_portal_session())
        .map(|k| k.id.clone())
        .collect();
    let mut live: Vec<ApiKey> = keys
        .into_iter()
        .filter(|k| k.is_portal_session() && !k.expired(now))
        .filter(|k| k.opened_by.as_ref().is_none_or(|o| app_keys.contains(o)))
        .collect();
    live.sort_by_key(|k| k.created_at);
    Ok(live)
}

/// The app's live portal sessions (admin key or the app's key), never
/// their tokens: what can reach the app's portal routes now.
#[utoipa::path(get, path = "/v1/apps/{app_id}/portal-sessions", tag = "portal",
    params(AppPath),
    responses((status = 200, body = PortalSessionList), (status = 403, body = ErrorBody)))]
pub async fn list_portal_sessions<S: Store, Q>(api: &Api<S, Q>, call: Call<'_>) -> Answer {
    let path: AppPath = call.path()?;
    let live = live_sessions(api, &path.app_id, call.now).await?;
    Ok(json(
        StatusCode::OK,
        &PortalSessionList {
            items: live
                .iter()
                .map(|k| PortalSessionSummary {
                    id: k.id.to_string(),
                    expires_at: k.portal_until.expect("a portal session has an end"),
                    created_at: k.created_at,
                })
                .collect(),
        },
    ))
}

/// Ends a portal session at once (admin key or the app's key).
#[utoipa::path(delete, path = "/v1/apps/{app_id}/portal-sessions/{session_id}", tag = "portal",
    params(PortalSessionPath),
    responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn delete_portal_session<S: Store, Q>(api: &Api<S, Q>, call: Call<'_>) -> Answer {
    let path: PortalSessionPath = call.path()?;
    // Only a session: an app key cannot revoke the app's API keys here.
    let is_session = api
        .store
        .get_api_key(&path.session_id)
        .await?
        .is_some_and(|k| k.app_id == path.app_id && k.is_portal_session());
    if !is_session
        || !api
            .store
            .delete_api_key(&path.app_id, &path.session_id)
            .await?
    {
        return Err(PipelineError::NotFound("portal session").into());
    }
    tracing::info!(session_id = %path.session_id, app_id = %path.app_id, "portal session revoked");
    Ok(no_content())
}

/// Where the portal page is: `WEBHOOKS_PORTAL_URL`, else this API's
/// `/portal` as the request reached it (API Gateway's host and scheme).
fn portal_page<S, Q>(api: &Api<S, Q>, call: &Call<'_>) -> String {
    if let Some(url) = &api.settings.portal_url {
        return url.clone();
    }
    let header = |name: &str| {
        call.request
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    // A host name with an optional port, nothing that could bend the URL.
    let host = header("host")
        .filter(|h| {
            h.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'))
        })
        .unwrap_or("localhost");
    let local = host.starts_with("127.0.0.1") || host.starts_with("localhost");
    let scheme = match header("x-forwarded-proto") {
        Some("http") => "http",
        Some(_) => "https",
        None if local => "http",
        None => "https",
    };
    format!("{scheme}://{host}/portal")
}
