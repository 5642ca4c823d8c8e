//! The functions' HTTP client for AWS, [`AwsHttp`]: hyper-util's pooled
//! HTTP/1.1 client over rustls (aws-lc-rs), the stack reqwest runs on,
//! without reqwest's per-request work. reqwest 0.13 turns each request's
//! `Url` into a `Uri` and, for its redirect layer, parses the URI back into
//! a `Url` twice per exchange even with redirects off. Without it a bare
//! request costs about 15 % less CPU and a delivery about 6 % (interleaved
//! runs of the benchmark's CPU probe, five AWS requests a delivery). Every
//! AWS request goes through it: the direct clients' ([`crate::aws_json`])
//! and the SDK's ([`AwsHttpClient`]), one connection pool.
//!
//! The SDK's transport is not aws-smithy-http-client's hyper client, which
//! links an HTTP/2 stack every bootstrap would load and never use
//! (DynamoDB, SQS and KMS answer HTTP/1.1).
//!
//! Errors are classified the way the SDK's retry strategy expects: a
//! timeout is a timeout, a failed connection or a broken exchange is an I/O
//! error (retried).

use std::time::Duration;

use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient,
    SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::body::SdkBody;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector as TcpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

/// How long a connection may take to open (the SDK's `connect_timeout`
/// is applied here, when the client is built).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long an idle pooled connection is kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The pooled HTTP/1.1 client every AWS request goes through. Cheap to
/// clone (clones share the pool).
#[derive(Clone, Debug)]
pub struct AwsHttp {
    client: Client<hyper_rustls::HttpsConnector<TcpConnector>, Full<Bytes>>,
}

/// A failed exchange: no answer.
#[derive(Debug, thiserror::Error)]
pub enum AwsHttpError {
    /// The connection could not be opened, or the request not sent.
    #[error("the request was not answered")]
    Exchange(#[source] hyper_util::client::legacy::Error),
    /// The answer's body broke off.
    #[error("the answer's body broke off")]
    Body(#[source] hyper::Error),
    /// No whole answer within the exchange's timeout.
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
}

impl AwsHttpError {
    /// Whether the connection was never opened (nothing reached the service).
    pub fn is_connect(&self) -> bool {
        matches!(self, Self::Exchange(err) if err.is_connect())
    }
}

impl AwsHttp {
    /// A client on `tls` (its roots only: no system store, nothing loaded
    /// from the disk), HTTP/1.1, plain HTTP allowed (a local endpoint),
    /// no proxy.
    pub fn new(mut tls: rustls::ClientConfig) -> Self {
        // No ALPN: HTTP/1.1 is what a server assumes without it (the
        // connector refuses a configuration that names protocols itself).
        tls.alpn_protocols.clear();
        let mut tcp = TcpConnector::new();
        tcp.enforce_http(false);
        tcp.set_nodelay(true);
        tcp.set_connect_timeout(Some(CONNECT_TIMEOUT));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(tcp);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .pool_timer(TokioTimer::new())
            .build(connector);
        Self { client }
    }

    /// `request` sent, its whole answer read within `timeout`.
    pub async fn send(
        &self,
        request: http::Request<Bytes>,
        timeout: Duration,
    ) -> Result<http::Response<Bytes>, AwsHttpError> {
        let exchange = async {
            let response = self
                .client
                .request(request.map(Full::new))
                .await
                .map_err(AwsHttpError::Exchange)?;
            let (parts, body) = response.into_parts();
            let body = body.collect().await.map_err(AwsHttpError::Body)?;
            Ok(http::Response::from_parts(parts, body.to_bytes()))
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| AwsHttpError::TimedOut(timeout))?
    }
}

/// An [`HttpClient`] for the AWS SDK on an [`AwsHttp`] (sharing its pool).
#[derive(Debug, Clone)]
pub struct AwsHttpClient {
    http: AwsHttp,
}

impl AwsHttpClient {
    /// The SDK's transport on `http`.
    pub fn on(http: AwsHttp) -> Self {
        Self { http }
    }

    pub fn shared(self) -> SharedHttpClient {
        SharedHttpClient::new(self)
    }
}

impl HttpClient for AwsHttpClient {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        _components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        SharedHttpConnector::new(AwsHttpConnector {
            http: self.http.clone(),
            read_timeout: settings.read_timeout(),
        })
    }
}

#[derive(Debug)]
struct AwsHttpConnector {
    http: AwsHttp,
    /// Bounds the whole exchange when the SDK asks for one (the operation
    /// attempt timeout bounds it anyway).
    read_timeout: Option<Duration>,
}

/// The exchange's bound when the SDK sets none: its operation timeout
/// (`clients::sdk_config`) ends the attempt before.
const NO_READ_TIMEOUT: Duration = Duration::from_secs(300);

impl HttpConnector for AwsHttpConnector {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let http = self.http.clone();
        let timeout = self.read_timeout.unwrap_or(NO_READ_TIMEOUT);
        HttpConnectorFuture::new(async move {
            let request = request
                .try_into_http1x()
                .map_err(|e| ConnectorError::user(e.into()))?;
            let (parts, body) = request.into_parts();
            // Every operation we call sends its body in memory (JSON).
            let body = body.bytes().map(Bytes::copy_from_slice).ok_or_else(|| {
                ConnectorError::user("a streaming request body is not supported".into())
            })?;
            let request = http::Request::from_parts(parts, body);
            let answer = http.send(request, timeout).await.map_err(classify)?;
            HttpResponse::try_from(answer.map(SdkBody::from))
                .map_err(|e| ConnectorError::other(e.into(), None))
        })
    }
}

/// The SDK's view of a transport failure (decides whether it retries).
fn classify(err: AwsHttpError) -> ConnectorError {
    match err {
        AwsHttpError::TimedOut(_) => ConnectorError::timeout(err.into()),
        err if err.is_connect() => ConnectorError::io(err.into()).never_connected(),
        err => ConnectorError::io(err.into()),
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
    async fn the_sdk_talks_through_aws_http_signed_and_parsed() {
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

    fn post(url: &str) -> http::Request<bytes::Bytes> {
        let mut request = http::Request::new(bytes::Bytes::from_static(b"{}"));
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = url.parse().expect("a loopback URI");
        request
    }

    #[tokio::test]
    async fn an_answer_cut_short_is_a_body_failure_and_a_silent_server_a_timeout() {
        let http = crate::clients::aws_http(None);
        let short = "HTTP/1.1 200 OK\r\ncontent-length: 100\r\nconnection: close\r\n\r\n{\"Item\":";
        let (url, server) = serve(vec![short.to_owned()]);
        let err = http
            .send(post(&url), std::time::Duration::from_secs(5))
            .await
            .expect_err("the body broke off");
        assert!(matches!(err, super::AwsHttpError::Body(_)), "{err:?}");
        assert!(!err.is_connect());
        let request = server.join().expect("served").remove(0);
        assert!(request.starts_with("POST / HTTP/1.1"), "{request}");
        assert!(request.ends_with("\r\n\r\n{}"), "{request}");

        // Listening, never answering: the kernel completes the handshake.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}/", silent.local_addr().expect("addr"));
        let timeout = std::time::Duration::from_millis(200);
        let err = http
            .send(post(&url), timeout)
            .await
            .expect_err("nobody answers");
        assert!(
            matches!(err, super::AwsHttpError::TimedOut(t) if t == timeout),
            "{err:?}"
        );
        drop(silent);
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
