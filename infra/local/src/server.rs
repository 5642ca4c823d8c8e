//! The local API Gateway: an HTTP server on loopback that turns each request
//! into the same API Gateway v2 event Lambda would get and calls the same
//! ingest handler.

use hookline_ingest::views::ErrorBody;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::{to_bytes, Body};
use axum::extract::State;
use axum::http::{HeaderValue, Request, Response, StatusCode};
use hookline_ingest::apigw;
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::sync::watch;

use crate::LocalStack;

/// Largest request body accepted (API Gateway's own limit is 10 MB; the API
/// rejects payloads above `WEBHOOKS_MAX_PAYLOAD_BYTES` with a 413 anyway).
const MAX_BODY: usize = 10 * 1024 * 1024;

fn error(status: StatusCode, code: &str, message: &str) -> Response<Body> {
    let mut r = Response::new(Body::from(
        serde_json::to_string(&ErrorBody::new(code, message)).expect("an error body serialises"),
    ));
    *r.status_mut() = status;
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    r
}

async fn gateway(State(stack): State<Arc<LocalStack>>, request: Request<Body>) -> Response<Body> {
    let method = request.method().as_str().to_owned();
    let target = request
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "/".into());
    let headers: Vec<(String, String)> = request
        .headers()
        .iter()
        .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
        .collect();
    let Ok(bytes) = to_bytes(request.into_body(), MAX_BODY).await else {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            "request body too large",
        );
    };
    let body = if bytes.is_empty() {
        None
    } else {
        match std::str::from_utf8(&bytes) {
            Ok(text) => Some(text.to_owned()),
            Err(_) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "invalid_body",
                    "request body is not UTF-8 JSON",
                )
            }
        }
    };
    let lambda_request = match apigw::http_request(&method, &target, &headers, body.as_deref()) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, "bad_request", &e),
    };
    let response = hookline_ingest::handle(
        &stack.api,
        lambda_request,
        chrono::Utc::now(),
        &mut StdRng::from_entropy(),
    )
    .await;
    let (parts, body) = response.into_parts();
    let bytes: Vec<u8> = body.as_ref().to_vec();
    Response::from_parts(parts, Body::from(bytes))
}

/// Serves the API on `addr` until `stop` turns true. Returns the bound address.
pub async fn serve(
    stack: Arc<LocalStack>,
    addr: SocketAddr,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = axum::Router::new().fallback(gateway).with_state(stack);
    let task = tokio::spawn(async move {
        let shutdown = async move {
            while !*stop.borrow() {
                if stop.changed().await.is_err() {
                    break;
                }
            }
        };
        if let Err(err) = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::error!(error = %err, "local API server failed");
        }
    });
    Ok((bound, task))
}
