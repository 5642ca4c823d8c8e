//! `/v1/dlq`: the dead-letter queue's depth and its redrive (admin key only).

use hookline_pipeline::ports::{Queue, Store};
use hookline_pipeline::redrive::{redrive, RedriveReport, RedriveRequest};
use lambda_http::http::StatusCode;

use crate::call::{Answer, Call};
use crate::respond::json;
use crate::views::{DlqStatus, ErrorBody};
use crate::Api;

/// How many messages wait in the dead-letter queue (admin key only).
#[utoipa::path(get, path = "/v1/dlq", tag = "dlq",
    responses((status = 200, body = DlqStatus), (status = 403, body = ErrorBody)))]
pub async fn dlq_status<S, Q: Queue>(api: &Api<S, Q>, _call: Call<'_>) -> Answer {
    let depth = api.queue.dlq_depth().await?;
    Ok(json(StatusCode::OK, &DlqStatus { depth }))
}

/// A redrive through the API answers within API Gateway's 30 s limit; it
/// reports `complete: false` when there is more to do (call again, or run
/// the retry function, which has minutes).
const REDRIVE_BUDGET: std::time::Duration = std::time::Duration::from_secs(20);

/// Drains the DLQ: failed deliveries start again (the retry function's
/// logic; admin key only).
#[utoipa::path(post, path = "/v1/dlq/redrive", tag = "dlq",
    request_body(content = RedriveRequest, description = "optional"),
    responses((status = 200, body = RedriveReport), (status = 400, body = ErrorBody),
        (status = 403, body = ErrorBody)))]
pub async fn dlq_redrive<S: Store, Q: Queue>(api: &Api<S, Q>, call: Call<'_>) -> Answer {
    let req: RedriveRequest = call.json_or_default()?;
    let report = redrive(&api.store, &api.queue, &req, call.now, REDRIVE_BUDGET).await?;
    Ok(json(StatusCode::OK, &report))
}
