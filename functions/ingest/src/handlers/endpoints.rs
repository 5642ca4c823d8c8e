//! `/v1/apps/{app_id}/endpoints`: receivers, their secrets and bulk recovery.

use std::collections::BTreeMap;

use rand::RngCore;

use hookline_core::ids::{AppId, EndpointId};
use hookline_core::model::{Endpoint, EventType};
use hookline_core::signing::Secret;
use hookline_core::stats::{summarize, EndpointStats};
use hookline_pipeline::operational::{self, Operational};
use hookline_pipeline::ports::Store;
use hookline_pipeline::recover::{recover_endpoint, RecoverReport, RecoverRequest};
use hookline_pipeline::replay::{start_replay, ReplayRequest};
use hookline_pipeline::sender::{check_endpoint_url, check_resolved_host};
use hookline_pipeline::PipelineError;
use lambda_http::http::StatusCode;

use crate::call::{Answer, Call};
use crate::error::ApiError;
use crate::respond::{json, no_content};
use crate::views::{
    is_sensitive_header, AppPath, CreateEndpoint, EndpointList, EndpointOut, EndpointPath,
    ErrorBody, ReplayOut, ReplayPath, RotateSecret, StatsQuery, UpdateEndpoint,
    MASKED_HEADER_VALUE,
};
use crate::Api;

fn validate_event_types(types: &[String]) -> Result<(), ApiError> {
    if types.len() > 100 {
        return Err(ApiError::bad_request(
            "invalid_event_types",
            "at most 100 event types",
        ));
    }
    for t in types {
        let name = t.strip_suffix(".*").unwrap_or(t);
        if t != "*" && EventType::parse(name).is_err() {
            return Err(ApiError::bad_request(
                "invalid_event_types",
                format!("`{t}` is not an event type or `prefix.*`"),
            ));
        }
    }
    Ok(())
}

/// Subscriptions against the catalog, once it has types: an unknown name is
/// a 400 naming the closest ones. The operational app's types are ours.
async fn check_against_catalog<S: Store, Q>(
    api: &Api<S, Q>,
    app: &AppId,
    types: &[String],
) -> Result<(), ApiError> {
    if types.is_empty() || hookline_pipeline::operational::is_operational(app) {
        return Ok(());
    }
    let names = api.store.event_type_names().await?;
    hookline_core::catalog::check_subscriptions(types, names.iter().map(String::as_str))
        .map_err(|unknown| ApiError::bad_request("unknown_event_type", unknown.to_string()))
}

fn validate_rate_limit(rate_limit: Option<u32>) -> Result<(), ApiError> {
    match rate_limit {
        Some(per_second) => hookline_core::rate::check_rate_limit(per_second)
            .map_err(|e| ApiError::bad_request("invalid_rate_limit", e.to_string())),
        None => Ok(()),
    }
}

fn validate_headers(headers: &BTreeMap<String, String>) -> Result<(), ApiError> {
    hookline_core::model::check_custom_headers(headers)
        .map_err(|e| ApiError::bad_request("invalid_headers", e.to_string()))
}

/// A PATCH's headers: a masked value (as answers show credential-like ones)
/// keeps the stored value of that header.
fn merge_masked(
    stored: &BTreeMap<String, String>,
    given: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    given
        .iter()
        .map(|(name, value)| {
            let kept = (value == MASKED_HEADER_VALUE)
                .then(|| stored.get(name))
                .flatten();
            (name.clone(), kept.unwrap_or(value).clone())
        })
        .collect()
}

/// The headers an endpoint keeps when its URL changes: a credential-like
/// one only if the same PATCH gives its value again (a mask is not a
/// value), so the new host never receives the old host's credentials.
fn headers_for_a_new_host(
    stored: &BTreeMap<String, String>,
    given: Option<&BTreeMap<String, String>>,
) -> BTreeMap<String, String> {
    let given_again = |name: &str| {
        given
            .and_then(|g| g.get(name))
            .is_some_and(|v| v != MASKED_HEADER_VALUE)
    };
    stored
        .iter()
        .filter(|(name, _)| !is_sensitive_header(name) || given_again(name))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn validate_description(description: Option<&String>) -> Result<(), ApiError> {
    if description.is_some_and(|d| d.len() > 1024) {
        return Err(ApiError::bad_request(
            "invalid_description",
            "at most 1024 bytes",
        ));
    }
    Ok(())
}

async fn check_url<S, Q>(api: &Api<S, Q>, url: &str) -> Result<(), ApiError> {
    let parsed = check_endpoint_url(url, api.settings.allow_private_endpoints)
        .map_err(|reason| ApiError::bad_request("invalid_url", reason))?;
    if !api.settings.allow_private_endpoints {
        check_resolved_host(&parsed, &api.lookup)
            .await
            .map_err(|reason| ApiError::bad_request("invalid_url", reason))?;
    }
    Ok(())
}

async fn endpoint_of<S: Store, Q>(
    api: &Api<S, Q>,
    app: &AppId,
    id: &EndpointId,
) -> Result<Endpoint, ApiError> {
    Ok(api
        .store
        .get_endpoint(app, id)
        .await?
        .ok_or(PipelineError::NotFound("endpoint"))?)
}

/// Creates an endpoint; the answer carries its signing secret (only here
/// and on rotate-secret).
#[utoipa::path(post, path = "/v1/apps/{app_id}/endpoints", tag = "endpoints",
    params(AppPath), request_body = CreateEndpoint,
    responses((status = 201, body = EndpointOut), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 409, body = ErrorBody)))]
pub async fn create_endpoint<S: Store, Q>(api: &Api<S, Q>, call: Call<'_>) -> Answer {
    let path: AppPath = call.path()?;
    let req: CreateEndpoint = call.json()?;
    check_url(api, &req.url).await?;
    validate_event_types(&req.event_types)?;
    check_against_catalog(api, &path.app_id, &req.event_types).await?;
    validate_description(req.description.as_ref())?;
    validate_headers(&req.headers)?;
    validate_rate_limit(req.rate_limit)?;
    let secret = match req.secret {
        Some(s) => Secret::parse(&s).map_err(PipelineError::from)?,
        None => Secret::generate(call.rng),
    };
    let endpoint = Endpoint {
        description: req.description,
        event_types: req.event_types,
        headers: req.headers,
        rate_limit: req.rate_limit,
        ..Endpoint::new(
            EndpointId::new(call.now, call.rng),
            path.app_id,
            req.url,
            secret,
            call.now,
        )
    };
    let limit = api.settings.max_endpoints_per_app;
    if !api.store.put_endpoint(&endpoint, limit).await? {
        return Err(ApiError::conflict(
            "too_many_endpoints",
            format!(
                "the app has {limit} endpoints, its limit (WEBHOOKS_MAX_ENDPOINTS_PER_APP): delete one first"
            ),
        ));
    }
    tracing::info!(endpoint_id = %endpoint.id, app_id = %endpoint.app_id, "endpoint created");
    Ok(json(
        StatusCode::CREATED,
        &EndpointOut::new(&endpoint, true),
    ))
}

/// Every endpoint of the app (secrets never listed).
#[utoipa::path(get, path = "/v1/apps/{app_id}/endpoints", tag = "endpoints",
    params(AppPath), responses((status = 200, body = EndpointList)))]
pub async fn list_endpoints<S: Store, Q>(api: &Api<S, Q>, call: Call<'_>) -> Answer {
    let path: AppPath = call.path()?;
    let endpoints = api.store.list_endpoints(&path.app_id).await?;
    Ok(json(
        StatusCode::OK,
        &EndpointList {
            items: endpoints
                .iter()
                .map(|e| EndpointOut::new(e, false))
                .collect(),
        },
    ))
}

#[utoipa::path(get, path = "/v1/apps/{app_id}/endpoints/{endpoint_id}", tag = "endpoints",
    params(EndpointPath),
    responses((status = 200, body = EndpointOut), (status = 404, body = ErrorBody)))]
pub async fn get_endpoint<S: Store, Q>(api: &Api<S, Q>, call: Call<'_>) -> Answer {
    let path: EndpointPath = call.path()?;
    let endpoint = endpoint_of(api, &path.app_id, &path.endpoint_id).await?;
    Ok(json(StatusCode::OK, &EndpointOut::new(&endpoint, false)))
}

/// Changes an endpoint's URL, filters, description or enabled state.
#[utoipa::path(patch, path = "/v1/apps/{app_id}/endpoints/{endpoint_id}", tag = "endpoints",
    params(EndpointPath), request_body = UpdateEndpoint,
    responses((status = 200, body = EndpointOut), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
pub async fn update_endpoint<S: Store, Q>(api: &Api<S, Q>, call: Call<'_>) -> Answer {
    let path: EndpointPath = call.path()?;
    let req: UpdateEndpoint = call.json()?;
    if let Some(url) = &req.url {
        check_url(api, url).await?;
    }
    if let Some(types) = &req.event_types {
        validate_event_types(types)?;
        check_against_catalog(api, &path.app_id, types).await?;
    }
    validate_description(req.description.as_ref())?;
    validate_rate_limit(req.rate_limit.flatten())?;
    if let Some(headers) = &req.headers {
        // Masked values stand for stored ones: checked once merged below,
        // and here without them (a name alone is checked the same way).
        let unmasked: BTreeMap<String, String> = headers
            .iter()
            .map(|(k, v)| {
                let v = if v == MASKED_HEADER_VALUE {
                    ""
                } else {
                    v.as_str()
                };
                (k.clone(), v.to_owned())
            })
            .collect();
        validate_headers(&unmasked)?;
    }
    let endpoint = change_endpoint(api, &path, call.now, call.rng, |endpoint| {
        if let Some(headers) = &req.headers {
            endpoint.headers = merge_masked(&endpoint.headers, headers);
        }
        if let Some(url) = req.url.as_ref().filter(|url| **url != endpoint.url) {
            let dropped = endpoint.headers.len();
            endpoint.headers = headers_for_a_new_host(&endpoint.headers, req.headers.as_ref());
            if endpoint.headers.len() < dropped {
                tracing::info!(endpoint_id = %endpoint.id, dropped = dropped - endpoint.headers.len(), "URL changed: credential headers not given again are dropped");
            }
            endpoint.url.clone_from(url);
            // Another host: judged afresh.
            endpoint.close_circuit();
        }
        if let Some(rate_limit) = req.rate_limit {
            endpoint.rate_limit = rate_limit;
        }
        if let Some(types) = &req.event_types {
            endpoint.event_types.clone_from(types);
        }
        if let Some(description) = &req.description {
            // An empty description clears it.
            endpoint.description = Some(description.clone()).filter(|d| !d.is_empty());
        }
        if let Some(disabled) = req.disabled {
            endpoint.disabled = disabled;
            endpoint.disabled_reason = disabled.then(|| "disabled by an operator".to_owned());
            if !disabled {
                // Re-enabled: its failure streak starts over, its
                // circuit closed.
                endpoint.failing_since = None;
                endpoint.close_circuit();
            }
        }
        Ok(())
    })
    .await?;
    tracing::info!(endpoint_id = %endpoint.id, disabled = endpoint.disabled, "endpoint updated");
    Ok(json(StatusCode::OK, &EndpointOut::new(&endpoint, false)))
}

/// Times a change is re-applied to a freshly read endpoint when a concurrent
/// write (a rotation, a PATCH, an auto-disable) moved its version meanwhile.
const ENDPOINT_WRITE_ROUNDS: usize = 5;

/// Read, change, write conditionally on the version read; on a conflict
/// read again and re-apply `change` (so two concurrent PATCHes of different
/// fields both land, a PATCH never writes back a rotated-away secret, and a
/// deleted endpoint is not resurrected: 404). A change that disables or
/// enables the endpoint is announced (`endpoint.disabled` /
/// `endpoint.enabled`, [`hookline_pipeline::operational`]) before it is
/// written, keyed by the version it is made from: a request retried after
/// a failure announces it once.
async fn change_endpoint<S: Store, Q>(
    api: &Api<S, Q>,
    path: &EndpointPath,
    now: chrono::DateTime<chrono::Utc>,
    rng: &mut (dyn RngCore + Send),
    mut change: impl FnMut(&mut Endpoint) -> Result<(), ApiError>,
) -> Result<Endpoint, ApiError> {
    for _ in 0..ENDPOINT_WRITE_ROUNDS {
        let mut endpoint = endpoint_of(api, &path.app_id, &path.endpoint_id).await?;
        let expected = endpoint.version;
        let was_disabled = endpoint.disabled;
        change(&mut endpoint)?;
        if endpoint.disabled != was_disabled {
            let event = if endpoint.disabled {
                Operational::EndpointDisabled {
                    app_id: endpoint.app_id.clone(),
                    endpoint_id: endpoint.id.clone(),
                    reason: endpoint
                        .disabled_reason
                        .clone()
                        .expect("every change that disables an endpoint gives its reason"),
                }
            } else {
                Operational::EndpointEnabled {
                    app_id: endpoint.app_id.clone(),
                    endpoint_id: endpoint.id.clone(),
                }
            };
            operational::announce(&api.store, &api.settings, &event, expected, now, rng).await?;
        }
        endpoint.version = expected + 1;
        endpoint.updated_at = now;
        if api.store.update_endpoint(&endpoint, expected).await? {
            return Ok(endpoint);
        }
        tracing::info!(endpoint_id = %endpoint.id, "endpoint changed meanwhile; applying again");
    }
    Err(ApiError::conflict(
        "conflict",
        "the endpoint kept changing meanwhile; retry",
    ))
}

/// Deletes an endpoint; its pending deliveries fail ("endpoint deleted").
#[utoipa::path(delete, path = "/v1/apps/{app_id}/endpoints/{endpoint_id}", tag = "endpoints",
    params(EndpointPath),
    responses((status = 204), (status = 404, body = ErrorBody)))]
pub async fn delete_endpoint<S: Store, Q>(api: &Api<S, Q>, call: Call<'_>) -> Answer {
    let path: EndpointPath = call.path()?;
    if !api
        .store
        .delete_endpoint(&path.app_id, &path.endpoint_id)
        .await?
    {
        return Err(PipelineError::NotFound("endpoint").into());
    }
    tracing::info!(endpoint_id = %path.endpoint_id, "endpoint deleted");
    Ok(no_content())
}

/// Starts signing with a new secret; earlier ones keep signing alongside it
/// for the rotation overlap.
#[utoipa::path(post, path = "/v1/apps/{app_id}/endpoints/{endpoint_id}/rotate-secret",
    tag = "endpoints", params(EndpointPath), request_body(content = RotateSecret, description = "optional"),
    responses((status = 200, body = EndpointOut), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn rotate_secret<S: Store, Q>(api: &Api<S, Q>, call: Call<'_>) -> Answer {
    let path: EndpointPath = call.path()?;
    let req: RotateSecret = call.json_or_default()?;
    let secret = match req.secret {
        Some(s) => Secret::parse(&s).map_err(PipelineError::from)?,
        None => Secret::generate(call.rng),
    };
    let (now, overlap) = (call.now, api.settings.rotation_overlap);
    let endpoint = change_endpoint(api, &path, now, call.rng, |endpoint| {
        endpoint
            .rotate_secret(secret.clone(), now, overlap)
            .map_err(|e| ApiError::conflict("too_many_secrets", e.to_string()))
    })
    .await?;
    tracing::info!(endpoint_id = %endpoint.id, "secret rotated");
    Ok(json(StatusCode::OK, &EndpointOut::new(&endpoint, true)))
}

/// Sends a test event of a type to this endpoint only: a real event of the
/// app, validated against its type's schema, signed and delivered with an
/// attempt log like any other, but listing this endpoint alone and never
/// replayed to others. Without `payload`, the type's catalog example.
#[utoipa::path(post, path = "/v1/apps/{app_id}/endpoints/{endpoint_id}/test",
    tag = "endpoints", params(EndpointPath), request_body = hookline_pipeline::ingest::TestEventRequest,
    responses((status = 202, body = hookline_pipeline::ingest::IngestResponse),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody)))]
pub async fn send_test_event<S: Store, Q>(api: &Api<S, Q>, call: Call<'_>) -> Answer {
    let path: EndpointPath = call.path()?;
    let endpoint = endpoint_of(api, &path.app_id, &path.endpoint_id).await?;
    let accepted = hookline_pipeline::ingest::send_test_event(
        &api.store,
        &api.settings,
        &api.catalog,
        &endpoint,
        call.body(),
        call.now,
        call.rng,
    )
    .await?;
    Ok(json(StatusCode::ACCEPTED, &accepted))
}

/// Bulk recover: every failed delivery of the endpoint created in
/// `[since, until)` starts again with a fresh attempt budget.
#[utoipa::path(post, path = "/v1/apps/{app_id}/endpoints/{endpoint_id}/recover",
    tag = "deliveries", params(EndpointPath), request_body = RecoverRequest,
    responses((status = 202, body = RecoverReport), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
pub async fn recover<S: Store, Q>(api: &Api<S, Q>, call: Call<'_>) -> Answer {
    let path: EndpointPath = call.path()?;
    let req: RecoverRequest = call.json()?;
    let endpoint = endpoint_of(api, &path.app_id, &path.endpoint_id).await?;
    let report =
        recover_endpoint(&api.store, &endpoint.app_id, &endpoint.id, &req, call.now).await?;
    Ok(json(StatusCode::ACCEPTED, &report))
}

/// Replay missing: one new delivery for every event of the app created in
/// `[since, until)` that the endpoint subscribes to and never had a delivery
/// for (sent while it was disabled, before it existed, or filtered out
/// then). Idempotent: a second replay of the window replays 0. The call
/// works for a few seconds; a larger window continues in the background
/// (`complete: false`): follow it at `status_url`.
#[utoipa::path(post, path = "/v1/apps/{app_id}/endpoints/{endpoint_id}/replay",
    tag = "endpoints", params(EndpointPath), request_body = ReplayRequest,
    responses((status = 202, body = ReplayOut), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody,
        description = "the endpoint is disabled")))]
pub async fn replay<S: Store, Q>(api: &Api<S, Q>, call: Call<'_>) -> Answer {
    let path: EndpointPath = call.path()?;
    let req: ReplayRequest = call.json()?;
    let endpoint = endpoint_of(api, &path.app_id, &path.endpoint_id).await?;
    let (now, started) = (call.now, std::time::Instant::now());
    let clock = move || now + started.elapsed();
    let replay = start_replay(
        &api.store,
        &endpoint,
        &req,
        clock,
        api.settings.replay_inline_budget,
        api.settings.retention,
        call.rng,
    )
    .await?;
    Ok(json(StatusCode::ACCEPTED, &ReplayOut::new(&replay)))
}

/// A replay's progress.
#[utoipa::path(get, path = "/v1/apps/{app_id}/endpoints/{endpoint_id}/replays/{replay_id}",
    tag = "endpoints", params(ReplayPath),
    responses((status = 200, body = ReplayOut), (status = 404, body = ErrorBody)))]
pub async fn get_replay<S: Store, Q>(api: &Api<S, Q>, call: Call<'_>) -> Answer {
    let path: ReplayPath = call.path()?;
    let replay = api
        .store
        .get_replay(&path.replay_id)
        .await?
        .filter(|r| r.app_id == path.app_id && r.endpoint_id == path.endpoint_id)
        .ok_or(PipelineError::NotFound("replay"))?;
    Ok(json(StatusCode::OK, &ReplayOut::new(&replay)))
}

/// Longest window of a stats request (one counter item per hour).
const STATS_WINDOW_MAX_DAYS: i64 = 31;

/// The endpoint's health since `since`: deliveries ended delivered and
/// failed, deliveries waiting for a retry now, success rate, and latency
/// percentiles of the requests sent, from counters deliver keeps per hour
/// (one item per hour read; never a scan).
#[utoipa::path(get, path = "/v1/apps/{app_id}/endpoints/{endpoint_id}/stats", tag = "endpoints",
    params(EndpointPath, StatsQuery),
    responses((status = 200, body = EndpointStats), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
pub async fn endpoint_stats<S: Store, Q>(api: &Api<S, Q>, call: Call<'_>) -> Answer {
    let path: EndpointPath = call.path()?;
    let query: StatsQuery = call.query()?;
    let since = crate::handlers::deliveries::parse_time("since", query.since.as_ref())?
        .unwrap_or(call.now - chrono::TimeDelta::hours(24));
    if since < call.now - chrono::TimeDelta::days(STATS_WINDOW_MAX_DAYS) || since > call.now {
        return Err(ApiError::bad_request(
            "invalid_query",
            format!("since: within the last {STATS_WINDOW_MAX_DAYS} days"),
        ));
    }
    let endpoint = endpoint_of(api, &path.app_id, &path.endpoint_id).await?;
    let (hours, waiting) = api
        .store
        .endpoint_stats(&endpoint.app_id, &endpoint.id, since)
        .await?;
    Ok(json(StatusCode::OK, &summarize(since, &hours, waiting)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::views::is_sensitive_header;

    #[test]
    fn credential_like_headers_are_masked_and_a_masked_patch_keeps_them() {
        for name in [
            "Authorization",
            "cookie",
            "X-Api-Key",
            "X-Auth-Token",
            "Client-Secret",
        ] {
            assert!(is_sensitive_header(name), "{name}");
        }
        for name in ["X-Tenant", "Accept-Language"] {
            assert!(!is_sensitive_header(name), "{name}");
        }
        let stored: BTreeMap<String, String> =
            [("Authorization".to_owned(), "Bearer t".to_owned())].into();
        let given: BTreeMap<String, String> = [
            ("Authorization".to_owned(), MASKED_HEADER_VALUE.to_owned()),
            ("X-New".to_owned(), "1".to_owned()),
        ]
        .into();
        let merged = merge_masked(&stored, &given);
        assert_eq!(merged["Authorization"], "Bearer t");
        assert_eq!(merged["X-New"], "1");
    }
}
