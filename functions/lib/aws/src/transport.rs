//! The SDK's HTTP transport: `reqwest` over rustls (aws-lc-rs), HTTP/1.1 —
//! the stack the deliver function already POSTs webhooks with — instead of
//! aws-smithy-http-client's hyper client, which links an HTTP/2 stack every
//! bootstrap loads and never uses (DynamoDB, SQS and KMS answer HTTP/1.1).
//! One HTTP stack per function: a smaller bootstrap, less to load before
//! the first answer.
//!
//! Errors are classified the way the SDK's retry strategy expects: a
//! timeout is a timeout, a failed connection or a broken exchange is an I/O
//! error (retried), a request we could not build is a user error (not).

use std::time::Duration;

use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient,
    SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::body::SdkBody;

/// How long a connection may take to open (the SDK's `connect_timeout`
/// is applied here, when the client is built).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// An [`HttpClient`] for the AWS SDK on one pooled `reqwest` client.
#[derive(Debug, Clone)]
pub struct ReqwestHttpClient {
    client: reqwest::Client,
}

/// A `reqwest` client for AWS on `tls` (its roots only: no system store,
/// nothing loaded from the disk), HTTP/1.1, no proxy from the environment.
pub fn reqwest_client(tls: rustls::ClientConfig) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .connect_timeout(CONNECT_TIMEOUT)
        .pool_idle_timeout(Duration::from_secs(60))
        .build()
}

impl ReqwestHttpClient {
    /// The SDK's transport on `client` (sharing its connection pool).
    pub fn on(client: reqwest::Client) -> Self {
        Self { client }
    }

    pub fn shared(self) -> SharedHttpClient {
        SharedHttpClient::new(self)
    }
}

impl HttpClient for ReqwestHttpClient {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        _components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        SharedHttpConnector::new(ReqwestConnector {
            client: self.client.clone(),
            read_timeout: settings.read_timeout(),
        })
    }
}

#[derive(Debug)]
struct ReqwestConnector {
    client: reqwest::Client,
    /// Bounds the whole exchange when the SDK asks for one (the operation
    /// attempt timeout bounds it anyway).
    read_timeout: Option<Duration>,
}

impl HttpConnector for ReqwestConnector {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let client = self.client.clone();
        let read_timeout = self.read_timeout;
        HttpConnectorFuture::new(async move {
            let request = request
                .try_into_http1x()
                .map_err(|e| ConnectorError::user(e.into()))?;
            let (parts, body) = request.into_parts();
            // Every operation we call sends its body in memory (JSON).
            let body = body
                .bytes()
                .map(bytes::Bytes::copy_from_slice)
                .ok_or_else(|| {
                    ConnectorError::user("a streaming request body is not supported".into())
                })?;
            let mut builder = client
                .request(parts.method, parts.uri.to_string())
                .headers(parts.headers)
                .body(body);
            if let Some(timeout) = read_timeout {
                builder = builder.timeout(timeout);
            }
            let response = builder.send().await.map_err(classify)?;
            let status = response.status();
            let headers = response.headers().clone();
            let bytes = response.bytes().await.map_err(classify)?;
            let mut answer = http::Response::new(SdkBody::from(bytes));
            *answer.status_mut() = status;
            *answer.headers_mut() = headers;
            HttpResponse::try_from(answer).map_err(|e| ConnectorError::other(e.into(), None))
        })
    }
}

/// The SDK's view of a transport failure (decides whether it retries).
fn classify(err: reqwest::Error) -> ConnectorError {
    if err.is_timeout() {
        ConnectorError::timeout(err.into())
    } else if err.is_connect() {
        ConnectorError::io(err.into()).never_connected()
    } else if err.is_builder() {
        ConnectorError::user(err.into())
    } else {
        ConnectorError::io(err.into())
    }
}

#[cfg(test)]
mod tests {
    use crate::test_server::serve;

    use aws_sdk_dynamodb::error::SdkError;

    use crate::clients::{sdk_config, AwsEnvironment};

    fn aws() -> AwsEnvironment {
        AwsEnvironment::from_lookup(|var| match var {
            "AWS_REGION" => Some("us-east-1".into()),
            "AWS_ACCESS_KEY_ID" | "AWS_SECRET_ACCESS_KEY" => Some("test".into()),
            _ => None,
        })
        .expect("complete")
    }

    #[tokio::test]
    async fn the_sdk_talks_through_reqwest_signed_and_parsed() {
        let body = r#"{"TableNames":["hookline-Table"]}"#;
        let answer: &'static str = Box::leak(
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/x-amz-json-1.0\r\nx-amzn-requestid: r1\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .into_boxed_str(),
        );
        let (url, server) = serve(vec![answer.to_owned()]);
        let client = aws_sdk_dynamodb::Client::new(&sdk_config(&aws(), Some(&url)));
        let out = client.list_tables().send().await.expect("answered");
        assert_eq!(out.table_names(), ["hookline-Table"]);
        let requests = server.join().unwrap();
        let request = requests[0].to_ascii_lowercase();
        assert!(request.starts_with("post / http/1.1"), "{request}");
        assert!(
            request.contains("x-amz-target: dynamodb_20120810.listtables"),
            "{request}"
        );
        assert!(
            request.contains("authorization: aws4-hmac-sha256 credential=test/"),
            "{request}"
        );
        assert_eq!(request.matches("content-length:").count(), 1, "{request}");
    }

    #[tokio::test]
    async fn a_refused_connection_is_an_io_failure_the_sdk_retries() {
        // Bound then dropped: nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let client = aws_sdk_dynamodb::Client::new(&sdk_config(
            &aws(),
            Some(&format!("http://127.0.0.1:{port}")),
        ));
        let err = client
            .list_tables()
            .send()
            .await
            .expect_err("nobody listens");
        match err {
            SdkError::DispatchFailure(failure) => assert!(failure.is_io(), "{failure:?}"),
            other => panic!("not a dispatch failure: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_5xx_answer_reaches_the_sdk_as_a_service_error() {
        let body =
            r#"{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"boom"}"#;
        let answer: &'static str = Box::leak(
            format!(
                "HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/x-amz-json-1.0\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .into_boxed_str(),
        );
        // The SDK retries a 500 (4 attempts in all), each on a connection.
        let (url, server) = serve(vec![answer.to_owned(); 4]);
        let client = aws_sdk_dynamodb::Client::new(&sdk_config(&aws(), Some(&url)));
        let err = client.list_tables().send().await.expect_err("a 500");
        assert_eq!(server.join().unwrap().len(), 4, "retried by the SDK");
        let service = err.into_service_error();
        assert!(service.is_internal_server_error(), "{service:?}");
    }
}
