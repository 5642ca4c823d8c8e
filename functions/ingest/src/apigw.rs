//! API Gateway HTTP API (payload v2) events: what the local stack's HTTP
//! server and the tests feed the same [`crate::handle`] that Lambda calls.

use chrono::Utc;
use serde_json::{json, Value};

/// The API Gateway v2 event for one HTTP request. `path_and_query` is the
/// request target (`/v1/apps/a/events?x=1`); header names are lowercased as
/// API Gateway does.
pub fn http_event(
    method: &str,
    path_and_query: &str,
    headers: &[(String, String)],
    body: Option<&str>,
) -> Value {
    let (path, query) = path_and_query
        .split_once('?')
        .unwrap_or((path_and_query, ""));
    let mut header_map = serde_json::Map::new();
    for (k, v) in headers {
        let k = k.to_ascii_lowercase();
        match header_map.get_mut(&k) {
            Some(Value::String(existing)) => {
                existing.push(',');
                existing.push_str(v);
            }
            _ => {
                header_map.insert(k, Value::String(v.clone()));
            }
        }
    }
    let now = Utc::now();
    json!({
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": path,
        "rawQueryString": query,
        "headers": header_map,
        "requestContext": {
            "accountId": "000000000000",
            "apiId": "local",
            "domainName": "localhost",
            "domainPrefix": "localhost",
            "http": {
                "method": method,
                "path": path,
                "protocol": "HTTP/1.1",
                "sourceIp": "127.0.0.1",
                "userAgent": headers.iter().find(|(k, _)| k.eq_ignore_ascii_case("user-agent")).map(|(_, v)| v.as_str()).unwrap_or("")
            },
            "requestId": format!("local-{}", now.timestamp_nanos_opt().unwrap_or_default()),
            "routeKey": "$default",
            "stage": "$default",
            "time": now.format("%d/%b/%Y:%H:%M:%S %z").to_string(),
            "timeEpoch": now.timestamp_millis()
        },
        "body": body,
        "isBase64Encoded": false
    })
}

/// The same, parsed into a `lambda_http::Request` exactly as the runtime does.
pub fn http_request(
    method: &str,
    path_and_query: &str,
    headers: &[(String, String)],
    body: Option<&str>,
) -> Result<lambda_http::Request, String> {
    lambda_http::request::from_str(&http_event(method, path_and_query, headers, body).to_string())
        .map_err(|e| e.to_string())
}
