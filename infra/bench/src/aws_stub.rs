//! A fast, keep-alive AWS stand-in on loopback for cold-start and CPU
//! measurements: it answers the DynamoDB, SQS and KMS JSON-protocol calls the
//! functions make (by `X-Amz-Target`) with minimal valid answers at once, so
//! what is measured is our process, not moto's (slow, single-threaded)
//! request handling. It keeps no state: reads find nothing, writes succeed.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};

/// Requests answered, by nobody in particular (a sanity figure).
#[derive(Debug, Clone, Default)]
pub struct AwsStub {
    pub requests: Arc<AtomicU64>,
}

/// 32 zero bytes, base64: a data key (the stub is no KMS).
const KEY_B64: &str = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";

fn answer(target: &str, request: &Value) -> Value {
    let op = target.rsplit('.').next().unwrap_or_default();
    match op {
        "Query" | "Scan" => json!({"Items": [], "Count": 0, "ScannedCount": 0}),
        "BatchGetItem" => json!({"Responses": {}, "UnprocessedKeys": {}}),
        "SendMessageBatch" => {
            let ids: Vec<Value> = request["Entries"]
                .as_array()
                .map(|entries| {
                    entries
                        .iter()
                        .enumerate()
                        .map(|(i, e)| {
                            json!({"Id": e["Id"], "MessageId": format!("stub-{i}"),
                                   "MD5OfMessageBody": "00000000000000000000000000000000"})
                        })
                        .collect()
                })
                .unwrap_or_default();
            json!({"Successful": ids, "Failed": []})
        }
        "SendMessage" => {
            json!({"MessageId": "stub", "MD5OfMessageBody": "00000000000000000000000000000000"})
        }
        "ReceiveMessage" => json!({"Messages": []}),
        "GetQueueAttributes" => json!({"Attributes": {
            "ApproximateNumberOfMessages": "0",
            "ApproximateNumberOfMessagesNotVisible": "0"}}),
        "GenerateDataKey" => {
            json!({"KeyId": "stub", "Plaintext": KEY_B64, "CiphertextBlob": KEY_B64})
        }
        "Decrypt" => json!({"KeyId": "stub", "Plaintext": KEY_B64}),
        // GetItem (nothing found), PutItem, UpdateItem, DeleteItem,
        // TransactWriteItems, DeleteMessageBatch...: success, no attributes.
        _ => json!({}),
    }
}

async fn handle(State(stub): State<AwsStub>, headers: HeaderMap, body: Bytes) -> Response {
    stub.requests.fetch_add(1, Ordering::Relaxed);
    let target = headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut response = (StatusCode::OK, answer(target, &request).to_string()).into_response();
    response.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("application/x-amz-json-1.0"),
    );
    response
}

impl AwsStub {
    /// Serves on an ephemeral loopback port; returns its URL.
    pub async fn start() -> std::io::Result<(Self, String)> {
        let stub = Self::default();
        let app = Router::new()
            .route("/", post(handle))
            .with_state(stub.clone());
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr: SocketAddr = listener.local_addr()?;
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok((stub, format!("http://{addr}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_send_succeeds_entry_by_entry() {
        let a = answer(
            "AmazonSQS.SendMessageBatch",
            &json!({"Entries": [{"Id": "0"}, {"Id": "1"}]}),
        );
        assert_eq!(a["Successful"].as_array().map(Vec::len), Some(2));
        assert_eq!(a["Successful"][1]["Id"], "1");
        assert_eq!(answer("DynamoDB_20120810.GetItem", &Value::Null), json!({}));
    }
}
