//! The cold-start floor of a function that calls AWS: the hello-world
//! function plus, on each invocation, `HELLO_AWS_REQUESTS` plain HTTP
//! round trips (a DynamoDB `GetItem`'s JSON, unsigned) to
//! `WEBHOOKS_AWS_ENDPOINT_URL` on one keep-alive connection of a `reqwest`
//! client built on the first invocation (as the functions build theirs),
//! trusting no roots (plain HTTP on loopback: nothing to load). What any
//! function making that many requests pays, with none of hookline's code.

use lambda_runtime::{service_fn, Error, LambdaEvent};
use serde_json::{json, Value};
use tokio::sync::OnceCell;

const BODY: &str =
    r#"{"TableName":"hookline-Table","Key":{"PK":{"S":"APP#demo"},"SK":{"S":"EP#x"}}}"#;

/// A client as the functions build theirs (a preconfigured rustls
/// configuration, no proxies), trusting no roots.
fn bare_client() -> Result<reqwest::Client, reqwest::Error> {
    let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("aws-lc-rs supports TLS 1.2 and 1.3")
    .with_root_certificates(rustls::RootCertStore::empty())
    .with_no_client_auth();
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .no_proxy()
        .build()
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let url = std::env::var("WEBHOOKS_AWS_ENDPOINT_URL")?;
    let requests: usize = std::env::var("HELLO_AWS_REQUESTS")
        .unwrap_or_else(|_| "1".into())
        .parse()?;
    let client: OnceCell<reqwest::Client> = OnceCell::new();
    let (url, client) = (&url, &client);
    lambda_runtime::run(service_fn(|_: LambdaEvent<Value>| async move {
        let http = client.get_or_try_init(|| async { bare_client() }).await?;
        for _ in 0..requests {
            let answer = http
                .post(url.as_str())
                .header("x-amz-target", "DynamoDB_20120810.GetItem")
                .header("content-type", "application/x-amz-json-1.0")
                .body(BODY)
                .send()
                .await?
                .error_for_status()?
                .bytes()
                .await?;
            std::hint::black_box(answer);
        }
        Ok::<Value, Error>(json!({ "requests": requests }))
    }))
    .await
}
