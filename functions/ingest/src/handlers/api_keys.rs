//! `/v1/apps/{app_id}/api-keys`: app-scoped keys (the router lets only the
//! admin key in).

use hookline_core::apikey::ApiKey;
use hookline_pipeline::ports::Store;
use hookline_pipeline::PipelineError;
use lambda_http::http::StatusCode;

use crate::call::{Answer, Call};
use crate::error::ApiError;
use crate::respond::{json, no_content};
use crate::views::{ApiKeyList, ApiKeyOut, ApiKeyPath, AppPath, CreateApiKey, ErrorBody};
use crate::Api;

/// Creates an app-scoped API key (admin key only). The key is in this
/// answer only; the table keeps its SHA-256.
#[utoipa::path(post, path = "/v1/apps/{app_id}/api-keys", tag = "api keys",
    params(AppPath), request_body(content = CreateApiKey, description = "optional"),
    responses((status = 201, body = ApiKeyOut), (status = 403, body = ErrorBody)))]
pub async fn create_api_key<S: Store, Q>(api: &Api<S, Q>, call: Call<'_>) -> Answer {
    let path: AppPath = call.path()?;
    let req: CreateApiKey = call.json_or_default()?;
    if hookline_pipeline::operational::is_operational(&path.app_id) {
        return Err(ApiError::bad_request(
            "reserved_app",
            "the operational app takes the admin API key; it has no keys of its own",
        ));
    }
    let name = req.name.unwrap_or_default();
    if name.len() > 200 {
        return Err(ApiError::bad_request("invalid_name", "at most 200 bytes"));
    }
    let (record, key) = ApiKey::generate(path.app_id, name, call.now, call.rng);
    api.store.put_api_key(&record).await?;
    tracing::info!(key_id = %record.id, app_id = %record.app_id, "API key created");
    Ok(json(
        StatusCode::CREATED,
        &ApiKeyOut::new(&record, Some(key)),
    ))
}

/// The app's API keys (never the keys themselves; admin key only).
#[utoipa::path(get, path = "/v1/apps/{app_id}/api-keys", tag = "api keys",
    params(AppPath),
    responses((status = 200, body = ApiKeyList), (status = 403, body = ErrorBody)))]
pub async fn list_api_keys<S: Store, Q>(api: &Api<S, Q>, call: Call<'_>) -> Answer {
    let path: AppPath = call.path()?;
    let keys = api.store.list_api_keys(&path.app_id).await?;
    Ok(json(
        StatusCode::OK,
        &ApiKeyList {
            items: keys.iter().map(|k| ApiKeyOut::new(k, None)).collect(),
        },
    ))
}

/// Revokes an API key at once (admin key only).
#[utoipa::path(delete, path = "/v1/apps/{app_id}/api-keys/{key_id}", tag = "api keys",
    params(ApiKeyPath),
    responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn delete_api_key<S: Store, Q>(api: &Api<S, Q>, call: Call<'_>) -> Answer {
    let path: ApiKeyPath = call.path()?;
    if !api.store.delete_api_key(&path.app_id, &path.key_id).await? {
        return Err(PipelineError::NotFound("API key").into());
    }
    tracing::info!(key_id = %path.key_id, app_id = %path.app_id, "API key revoked");
    Ok(no_content())
}
