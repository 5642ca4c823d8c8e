//! `/v1/apps/{app_id}/deliveries`: the delivery log, one delivery with its
//! attempts, and a manual retry.

use chrono::{DateTime, Utc};
use hookline_core::ids::{DeliveryId, EndpointId};
use hookline_core::model::{Delivery, DeliveryStatus};
use hookline_pipeline::ports::{DeliveryQuery, Store};
use hookline_pipeline::recover::{retry_or_resend, RetryOutcome};
use hookline_pipeline::PipelineError;
use lambda_http::http::StatusCode;

use crate::call::{Answer, Call};
use crate::error::ApiError;
use crate::respond::json;
use crate::views::{AppPath, DeliveryFilters, DeliveryList, DeliveryOut, DeliveryPath, ErrorBody};
use crate::Api;

pub(crate) fn parse_time(
    field: &str,
    value: Option<&String>,
) -> Result<Option<DateTime<Utc>>, ApiError> {
    value
        .map(|v| {
            DateTime::parse_from_rfc3339(v)
                .map(|t| t.with_timezone(&Utc))
                .map_err(|_| {
                    ApiError::bad_request("invalid_query", format!("{field}: not an RFC 3339 time"))
                })
        })
        .transpose()
}

fn delivery_query(filters: &DeliveryFilters) -> Result<DeliveryQuery, ApiError> {
    let query = DeliveryQuery {
        status: filters
            .status
            .as_deref()
            .map(DeliveryStatus::parse)
            .transpose()?,
        endpoint_id: filters
            .endpoint_id
            .as_deref()
            .map(EndpointId::parse)
            .transpose()?,
        event_type: filters.event_type.clone(),
        before: filters
            .cursor
            .as_deref()
            .map(DeliveryId::parse)
            .transpose()
            .map_err(|_| {
                ApiError::bad_request("invalid_query", "cursor: not a next_cursor value")
            })?,
        created_after: parse_time("created_after", filters.created_after.as_ref())?,
        created_before: parse_time("created_before", filters.created_before.as_ref())?,
        limit: match &filters.limit {
            Some(l) => l
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=500).contains(n))
                .ok_or_else(|| ApiError::bad_request("invalid_query", "limit: 1..=500"))?,
            None => 50,
        },
    };
    if let (Some(a), Some(b)) = (query.created_after, query.created_before) {
        if a >= b {
            return Err(ApiError::bad_request(
                "invalid_query",
                "created_after must be before created_before",
            ));
        }
    }
    Ok(query)
}

/// Deliveries, newest first, from the app's partitions and the by-status
/// index (never a scan).
#[utoipa::path(get, path = "/v1/apps/{app_id}/deliveries", tag = "deliveries",
    params(AppPath, DeliveryFilters),
    responses((status = 200, body = DeliveryList), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "no such endpoint")))]
pub async fn list_deliveries<S: Store, Q>(api: &Api<S, Q>, call: Call<'_>) -> Answer {
    let path: AppPath = call.path()?;
    let filters: DeliveryFilters = call.query()?;
    let query = delivery_query(&filters)?;
    if let Some(ep) = &query.endpoint_id {
        api.store
            .get_endpoint(&path.app_id, ep)
            .await?
            .ok_or(PipelineError::NotFound("endpoint"))?;
    }
    let page = api.store.list_deliveries(&path.app_id, &query).await?;
    Ok(json(
        StatusCode::OK,
        &DeliveryList {
            items: page
                .items
                .iter()
                .map(|d| DeliveryOut::new(d, false))
                .collect(),
            next_cursor: page.next_cursor.map(|c| c.to_string()),
        },
    ))
}

async fn delivery_of<S: Store, Q>(
    api: &Api<S, Q>,
    path: &DeliveryPath,
) -> Result<Delivery, ApiError> {
    Ok(api
        .store
        .get_delivery(&path.app_id, &path.delivery_id)
        .await?
        .ok_or(PipelineError::NotFound("delivery"))?)
}

/// A delivery with its attempt log.
#[utoipa::path(get, path = "/v1/apps/{app_id}/deliveries/{delivery_id}", tag = "deliveries",
    params(DeliveryPath),
    responses((status = 200, body = DeliveryOut), (status = 404, body = ErrorBody)))]
pub async fn get_delivery<S: Store, Q>(api: &Api<S, Q>, call: Call<'_>) -> Answer {
    let delivery = delivery_of(api, &call.path()?).await?;
    Ok(json(StatusCode::OK, &DeliveryOut::new(&delivery, true)))
}

/// A failed delivery starts again with a fresh attempt budget; a delivered
/// one is resent (the same `webhook-id`, so a receiver that deduplicates
/// sees a duplicate). 409 while it is pending.
#[utoipa::path(post, path = "/v1/apps/{app_id}/deliveries/{delivery_id}/retry",
    tag = "deliveries", params(DeliveryPath),
    responses((status = 202, body = DeliveryOut),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "still pending (`pending`) or changed meanwhile")))]
pub async fn retry_delivery<S: Store, Q>(api: &Api<S, Q>, call: Call<'_>) -> Answer {
    let delivery = delivery_of(api, &call.path()?).await?;
    match retry_or_resend(&api.store, delivery, call.now).await? {
        RetryOutcome::Retried(d) => Ok(json(StatusCode::ACCEPTED, &DeliveryOut::new(&d, false))),
        RetryOutcome::NotFailed(status) => Err(ApiError::conflict(
            "pending",
            format!("delivery is {status}: it is retried or resent once it is delivered or failed"),
        )),
        RetryOutcome::Changed => Err(ApiError::conflict(
            "conflict",
            "the delivery changed meanwhile; reload and retry",
        )),
    }
}
