//! [`AwsJson`]: an AWS service's JSON API (`application/x-amz-json-1.0`)
//! spoken directly — SigV4 on the functions' HTTP client
//! ([`crate::transport::AwsHttp`]) — for the
//! requests every delivery makes: DynamoDB's ([`crate::dynamo_http`]) and
//! SQS's sends ([`crate::sqs_http`]), and KMS's data keys of the endpoints'
//! sealed secrets ([`crate::kms_http`]).
//!
//! Why: the AWS SDK's orchestrator runs, per request, a config-bag merge,
//! endpoint rules, a dozen interceptors and its retry state machine; on a
//! loopback stub that was 0.16 CPU-ms per request against 0.07 for a plain
//! signed POST on the same HTTP client, and a delivery makes five (the
//! benchmark's CPU split, BENCHMARKS.md); building the SDK's clients is a
//! part of every cold start. This client does only what those operations
//! need, the way the SDK does it:
//!
//! - **signing**: AWS Signature Version 4, the signing key derived once a
//!   day (tested against the SDK's own signer, `aws-sigv4`);
//! - **retries**: the SDK's standard mode — up to [`MAX_ATTEMPTS`] attempts
//!   with full-jitter exponential backoff from 50 ms (at most 2 s) on a
//!   failed or timed-out exchange, a 5xx answer or a throttling error;
//!   nothing else is retried (a failed condition is an answer);
//! - **timeouts**: each attempt [`ATTEMPT_TIMEOUT`], the whole call
//!   [`OPERATION_TIMEOUT`] (the SDK configuration's figures);
//! - **errors**: [`AwsJsonError`] keeps the service's error code, status
//!   and message, or the transport failure as its source.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_credential_types::Credentials;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use rand::Rng;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Attempts per call, the first included (the SDK configuration's figure).
pub const MAX_ATTEMPTS: u32 = 4;
/// The first retry waits up to this long, each next one twice as long.
const INITIAL_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// One attempt, connection included.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// A whole call, retries included.
pub const OPERATION_TIMEOUT: Duration = Duration::from_secs(30);

/// Error codes the SDK's standard retry mode treats as throttling or
/// transient (retried, with backoff).
const RETRIED_CODES: &[&str] = &[
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottledException",
    "TooManyRequestsException",
    "ProvisionedThroughputExceededException",
    "TransactionInProgressException",
    "RequestLimitExceeded",
    "BandwidthLimitExceeded",
    "LimitExceededException",
    "RequestThrottled",
    "SlowDown",
    "PriorRequestNotComplete",
    "RequestTimeout",
    "RequestTimeoutException",
    "InternalError",
    "InternalServerError",
];

/// Sees every attempt's operation and request body before it is sent
/// (the benchmark's request counter).
pub type RequestObserver = Arc<dyn Fn(Operation, &[u8]) + Send + Sync>;

/// A service spoken to: how it is named in messages and in its signatures
/// and endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Service {
    /// As AWS writes it, e.g. `DynamoDB`.
    pub name: &'static str,
    /// Its signing name and endpoint prefix, e.g. `dynamodb`.
    pub signing_name: &'static str,
    /// Its JSON protocol's content type: [`JSON_1_0`] or [`JSON_1_1`].
    pub content_type: &'static str,
}

/// The content type of the JSON 1.0 protocol (DynamoDB, SQS).
pub const JSON_1_0: &str = "application/x-amz-json-1.0";
/// The content type of the JSON 1.1 protocol (KMS).
pub const JSON_1_1: &str = "application/x-amz-json-1.1";

/// One operation of a [`Service`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operation {
    /// Referenced: an error carries its operation, and stays small.
    pub service: &'static Service,
    /// E.g. `GetItem`.
    pub name: &'static str,
    /// Its `x-amz-target` header, e.g. `DynamoDB_20120810.GetItem`.
    pub target: &'static str,
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.service.name, self.name)
    }
}

/// A failed call.
#[derive(Debug, thiserror::Error)]
pub enum AwsJsonError {
    /// The service answered with an error (after the retries it deserved).
    #[error("{operation} answered {status} {code}: {message}")]
    Service {
        operation: Operation,
        status: u16,
        /// The error's short name, e.g. `ConditionalCheckFailedException`.
        code: String,
        message: String,
    },
    /// No answer: the connection or the exchange failed on every attempt.
    #[error("{operation}: no answer")]
    Transport {
        operation: Operation,
        #[source]
        source: crate::transport::AwsHttpError,
    },
    /// The call took longer than [`OPERATION_TIMEOUT`] (plus the wait the
    /// request asked the service for, for a long poll).
    #[error("{operation}: no answer within {OPERATION_TIMEOUT:?} (plus its long poll's wait)")]
    Timeout { operation: Operation },
    /// A success answer that does not parse.
    #[error("{operation}: unreadable answer")]
    Decode {
        operation: Operation,
        #[source]
        source: serde_json::Error,
    },
    /// The credentials provider failed (never for Lambda's static ones).
    #[error("{operation}: no credentials")]
    Credentials {
        operation: Operation,
        #[source]
        source: aws_credential_types::provider::error::CredentialsError,
    },
    /// A request that cannot be built (an item that does not encode).
    #[error("{operation}: the request does not encode")]
    Encode {
        operation: Operation,
        #[source]
        source: serde_json::Error,
    },
}

impl AwsJsonError {
    /// The service's error code, when it answered with one.
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Service { code, .. } => Some(code),
            _ => None,
        }
    }

    /// Whether calling again later may succeed (no answer, a garbled
    /// answer, a server error, throttling, a transaction holding the item).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Transport { .. } | Self::Timeout { .. } | Self::Decode { .. } => true,
            Self::Service { status, code, .. } => {
                *status >= 500
                    || RETRIED_CODES.contains(&code.as_str())
                    || code == "TransactionConflictException"
            }
            Self::Encode { .. } | Self::Credentials { .. } => false,
        }
    }

    /// The operation that failed.
    pub fn operation(&self) -> Operation {
        match self {
            Self::Service { operation, .. }
            | Self::Transport { operation, .. }
            | Self::Timeout { operation }
            | Self::Decode { operation, .. }
            | Self::Encode { operation, .. }
            | Self::Credentials { operation, .. } => *operation,
        }
    }

    /// Whether a conditional write's condition did not hold.
    pub fn is_condition_failure(&self) -> bool {
        self.code() == Some("ConditionalCheckFailedException")
    }

    /// Whether a write met a transaction in progress on its item.
    pub fn is_transaction_conflict(&self) -> bool {
        self.code() == Some("TransactionConflictException")
    }
}

/// An endpoint URL no client can be built on.
#[derive(Debug, thiserror::Error)]
pub enum EndpointUrlError {
    #[error("the endpoint URL does not parse")]
    Url(#[from] url::ParseError),
    #[error("the endpoint URL has no host")]
    NoHost,
    #[error("the endpoint URL's host cannot be an HTTP header")]
    Host(#[from] http::header::InvalidHeaderValue),
    #[error("the endpoint URL is not an HTTP URI")]
    Uri(#[from] http::uri::InvalidUri),
}

/// Declares `$client`, one service's client on [`AwsJson`] (a struct with
/// its `json` core), with its constructor and observer: each service's
/// module then adds only its operations.
macro_rules! service_client {
    ($(#[$doc:meta])* $client:ident, $service:expr) => {
        $(#[$doc])*
        #[derive(Clone, Debug)]
        pub struct $client {
            json: $crate::aws_json::AwsJson,
        }

        impl $client {
            /// A client of `region`'s service (or of `endpoint_url`, e.g.
            /// moto) signing with `credentials`, on `http`.
            pub fn new(
                http: $crate::transport::AwsHttp,
                region: &str,
                credentials: aws_credential_types::provider::SharedCredentialsProvider,
                endpoint_url: Option<&str>,
            ) -> Result<Self, $crate::aws_json::EndpointUrlError> {
                $crate::aws_json::AwsJson::new($service, http, region, credentials, endpoint_url)
                    .map(|json| Self { json })
            }

            /// Every attempt shown to `observer` before it is sent.
            pub fn observed_by(self, observer: $crate::aws_json::RequestObserver) -> Self {
                Self {
                    json: self.json.observed_by(observer),
                }
            }
        }
    };
}
pub(crate) use service_client;

/// One service's JSON API on one HTTP client. Cheap to clone.
#[derive(Clone)]
pub struct AwsJson {
    service: Service,
    http: crate::transport::AwsHttp,
    /// `https://<service>.<region>.amazonaws.com/`, or the local endpoint
    /// (parsed once).
    uri: http::Uri,
    /// The `host` header signed (and sent): the URL's authority.
    host: String,
    host_header: http::HeaderValue,
    region: String,
    /// Lambda's: the execution role's, from the environment (static).
    credentials: SharedCredentialsProvider,
    /// The signing key, with the day and secret it was derived from.
    signing_key: Arc<Mutex<Option<SigningKey>>>,
    observer: Option<RequestObserver>,
}

impl std::fmt::Debug for AwsJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsJson")
            .field("service", &self.service.name)
            .field("uri", &self.uri)
            .field("region", &self.region)
            .field("observed", &self.observer.is_some())
            .finish_non_exhaustive()
    }
}

impl AwsJson {
    /// A client of `region`'s `service` (or of `endpoint_url`, e.g. moto)
    /// signing with `credentials`, on `http`.
    pub fn new(
        service: Service,
        http: crate::transport::AwsHttp,
        region: &str,
        credentials: SharedCredentialsProvider,
        endpoint_url: Option<&str>,
    ) -> Result<Self, EndpointUrlError> {
        let url = match endpoint_url {
            Some(url) => url::Url::parse(url)?,
            None => url::Url::parse(&format!(
                "https://{}.{region}.amazonaws.com/",
                service.signing_name
            ))?,
        };
        let host = match (url.host_str(), url.port()) {
            (Some(host), Some(port)) => format!("{host}:{port}"),
            (Some(host), None) => host.to_owned(),
            (None, _) => return Err(EndpointUrlError::NoHost),
        };
        let host_header = http::HeaderValue::from_str(&host)?;
        let uri = http::Uri::try_from(url.as_str())?;
        Ok(Self {
            service,
            http,
            uri,
            host,
            host_header,
            region: region.to_owned(),
            credentials,
            signing_key: Arc::default(),
            observer: None,
        })
    }

    /// Every attempt shown to `observer` before it is sent.
    pub fn observed_by(mut self, observer: RequestObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    /// `operation` with `request` as its body, retried as the module says.
    pub async fn call<Q: Serialize + ?Sized, A: serde::de::DeserializeOwned>(
        &self,
        op: Operation,
        request: &Q,
    ) -> Result<A, AwsJsonError> {
        self.call_waiting(op, request, Duration::ZERO).await
    }

    /// [`Self::call`] for a request that asks the service to hold its
    /// answer up to `wait` (a long poll): each attempt's timeout and the
    /// call's are that much longer.
    pub async fn call_waiting<Q: Serialize + ?Sized, A: serde::de::DeserializeOwned>(
        &self,
        op: Operation,
        request: &Q,
        wait: Duration,
    ) -> Result<A, AwsJsonError> {
        let operation = op;
        let body = serde_json::to_vec(request)
            .map_err(|source| AwsJsonError::Encode { operation, source })?;
        let body = bytes::Bytes::from(body);
        let answer = tokio::time::timeout(
            OPERATION_TIMEOUT + wait,
            self.with_retries(op, body, ATTEMPT_TIMEOUT + wait),
        )
        .await
        .map_err(|_| AwsJsonError::Timeout { operation })??;
        serde_json::from_slice(&answer).map_err(|source| AwsJsonError::Decode { operation, source })
    }

    async fn with_retries(
        &self,
        op: Operation,
        body: bytes::Bytes,
        attempt_timeout: Duration,
    ) -> Result<bytes::Bytes, AwsJsonError> {
        let mut attempt = 1;
        loop {
            let outcome = self.attempt(op, body.clone(), attempt_timeout).await;
            let retry = match &outcome {
                Ok(_) => false,
                Err(err) => attempt < MAX_ATTEMPTS && err.deserves_retry(),
            };
            if !retry {
                return outcome;
            }
            let jitter = rand::thread_rng().gen();
            tokio::time::sleep(backoff(attempt, jitter)).await;
            attempt += 1;
        }
    }

    async fn attempt(
        &self,
        op: Operation,
        body: bytes::Bytes,
        timeout: Duration,
    ) -> Result<bytes::Bytes, AwsJsonError> {
        let operation = op;
        if let Some(observe) = &self.observer {
            observe(operation, &body);
        }
        let credentials = self
            .credentials
            .provide_credentials()
            .await
            .map_err(|source| AwsJsonError::Credentials { operation, source })?;
        let target = op.target;
        let signed = self.sign(&credentials, target, &body, Utc::now());
        // Names and constant values built once, not parsed per request.
        let mut headers = http::HeaderMap::with_capacity(8);
        headers.insert(http::header::HOST, self.host_header.clone());
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(self.service.content_type),
        );
        headers.insert(X_AMZ_TARGET, http::HeaderValue::from_static(target));
        let signed_value = |value: String| {
            http::HeaderValue::try_from(value).map_err(|_| AwsJsonError::Credentials {
                operation,
                source:
                    aws_credential_types::provider::error::CredentialsError::invalid_configuration(
                        "the credentials hold characters no HTTP header can carry",
                    ),
            })
        };
        headers.insert(X_AMZ_DATE, signed_value(signed.amz_date)?);
        headers.insert(
            http::header::AUTHORIZATION,
            signed_value(signed.authorization)?,
        );
        if let Some(token) = credentials.session_token() {
            headers.insert(X_AMZ_SECURITY_TOKEN, signed_value(token.trim().to_owned())?);
        }
        let mut request = http::Request::new(body);
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = self.uri.clone();
        *request.headers_mut() = headers;
        let response = self
            .http
            .send(request, timeout)
            .await
            .map_err(|source| AwsJsonError::Transport { operation, source })?;
        let status = response.status();
        if status.is_success() {
            return Ok(response.into_body());
        }
        let header_code = response
            .headers()
            .get("x-amzn-errortype")
            .and_then(|v| v.to_str().ok());
        Err(service_error(
            operation,
            status.as_u16(),
            header_code,
            response.body(),
        ))
    }

    /// The SigV4 `authorization` header of a POST of `body` to `/` with
    /// `target`, at `now`.
    fn sign(
        &self,
        credentials: &Credentials,
        target: &str,
        body: &[u8],
        now: DateTime<Utc>,
    ) -> Signed {
        use chrono::{Datelike, Timelike};
        use std::fmt::Write;
        let mut amz_date = String::with_capacity(16);
        let _ = write!(
            amz_date,
            "{:04}{:02}{:02}T{:02}{:02}{:02}Z",
            now.year(),
            now.month(),
            now.day(),
            now.hour(),
            now.minute(),
            now.second()
        );
        let date = &amz_date[..8];
        let token = credentials.session_token();
        let signed_headers = if token.is_some() {
            "content-type;host;x-amz-date;x-amz-security-token;x-amz-target"
        } else {
            "content-type;host;x-amz-date;x-amz-target"
        };
        let mut hex = [0u8; 64];
        let mut canonical = String::with_capacity(384);
        for part in [
            "POST\n/\n\ncontent-type:",
            self.service.content_type,
            "\nhost:",
            &self.host,
            "\nx-amz-date:",
            &amz_date,
            "\n",
        ] {
            canonical.push_str(part);
        }
        if let Some(token) = token {
            canonical.push_str("x-amz-security-token:");
            canonical.push_str(token.trim());
            canonical.push('\n');
        }
        for part in [
            "x-amz-target:",
            target,
            "\n\n",
            signed_headers,
            "\n",
            hex_of(&Sha256::digest(body).into(), &mut hex),
        ] {
            canonical.push_str(part);
        }
        let mut scope = String::with_capacity(48);
        for part in [
            date,
            "/",
            &self.region,
            "/",
            self.service.signing_name,
            "/aws4_request",
        ] {
            scope.push_str(part);
        }
        let mut mac = self.signing_mac_for(credentials, date);
        for part in [
            "AWS4-HMAC-SHA256\n",
            &amz_date,
            "\n",
            &scope,
            "\n",
            hex_of(&Sha256::digest(canonical.as_bytes()).into(), &mut hex),
        ] {
            mac.update(part.as_bytes());
        }
        let signature: [u8; 32] = mac.finalize().into_bytes().into();
        let mut authorization = String::with_capacity(256);
        for part in [
            "AWS4-HMAC-SHA256 Credential=",
            credentials.access_key_id(),
            "/",
            &scope,
            ", SignedHeaders=",
            signed_headers,
            ", Signature=",
            hex_of(&signature, &mut hex),
        ] {
            authorization.push_str(part);
        }
        Signed {
            authorization,
            amz_date,
        }
    }

    /// An HMAC keyed with the signing key of `date` (`YYYYMMDD`), derived
    /// once per day (and again when the credentials change).
    fn signing_mac_for(&self, credentials: &Credentials, date: &str) -> Hmac<Sha256> {
        let mut cached = self
            .signing_key
            .lock()
            .expect("the signing key lock is never held across a panic");
        if let Some(known) = cached.as_ref() {
            if known.date == date && known.secret == credentials.secret_access_key() {
                return known.mac.clone();
            }
        }
        let secret = format!("AWS4{}", credentials.secret_access_key());
        let key = [
            self.region.as_bytes(),
            self.service.signing_name.as_bytes(),
            b"aws4_request",
        ]
        .iter()
        .fold(hmac(secret.as_bytes(), date.as_bytes()), |key, part| {
            hmac(&key, part)
        });
        let mac = Hmac::<Sha256>::new_from_slice(&key).expect("HMAC takes a key of any length");
        *cached = Some(SigningKey {
            date: date.to_owned(),
            secret: credentials.secret_access_key().to_owned(),
            mac: mac.clone(),
        });
        mac
    }
}

/// A derived signing key (its secret kept to notice new credentials).
struct SigningKey {
    date: String,
    secret: String,
    /// Keyed, nothing hashed yet: each signature clones it.
    mac: Hmac<Sha256>,
}

/// `bytes` as lowercase hex, in `out`.
fn hex_of<'a>(bytes: &[u8; 32], out: &'a mut [u8; 64]) -> &'a str {
    hex::encode_to_slice(bytes, out).expect("64 hex digits fit 32 bytes");
    std::str::from_utf8(out).expect("hex digits are ASCII")
}

const X_AMZ_TARGET: http::HeaderName = http::HeaderName::from_static("x-amz-target");
const X_AMZ_DATE: http::HeaderName = http::HeaderName::from_static("x-amz-date");
const X_AMZ_SECURITY_TOKEN: http::HeaderName =
    http::HeaderName::from_static("x-amz-security-token");

struct Signed {
    authorization: String,
    amz_date: String,
}

fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(data);
    mac.finalize().into_bytes().into()
}

/// The wait before attempt `attempt + 1`: full jitter (`jitter` in 0..1)
/// over an exponential ceiling.
fn backoff(attempt: u32, jitter: f64) -> Duration {
    let ceiling = INITIAL_BACKOFF
        .saturating_mul(1 << (attempt - 1).min(16))
        .min(MAX_BACKOFF);
    ceiling.mul_f64(jitter.clamp(0.0, 1.0))
}

impl AwsJsonError {
    /// Whether this client tries again itself (the SDK standard mode's
    /// rule): no answer, a 5xx, throttling.
    pub(crate) fn deserves_retry(&self) -> bool {
        match self {
            Self::Transport { .. } => true,
            Self::Service { status, code, .. } => {
                *status >= 500 || RETRIED_CODES.contains(&code.as_str())
            }
            Self::Timeout { .. }
            | Self::Decode { .. }
            | Self::Encode { .. }
            | Self::Credentials { .. } => false,
        }
    }
}

/// The error the service answered: its code from the body's `__type` (or the
/// `x-amzn-errortype` header), without the namespace.
fn service_error(
    operation: Operation,
    status: u16,
    header_code: Option<&str>,
    body: &[u8],
) -> AwsJsonError {
    #[derive(Deserialize, Default)]
    struct ErrorBody {
        #[serde(rename = "__type")]
        kind: Option<String>,
        #[serde(alias = "Message")]
        message: Option<String>,
    }
    // A body that is not the service's JSON (a proxy's or load balancer's
    // page) still says an error: its code then comes from the header, else
    // "Unknown", and its status decides whether it is retried.
    let parsed: ErrorBody = serde_json::from_slice(body).unwrap_or_default();
    let raw = parsed.kind.as_deref().or(header_code).unwrap_or("Unknown");
    let code = raw.rsplit('#').next().unwrap_or(raw);
    let code = code.split(':').next().unwrap_or(code);
    AwsJsonError::Service {
        operation,
        status,
        code: code.to_owned(),
        // Some errors carry no message; the code says what happened.
        message: parsed.message.unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dynamo_http::DYNAMODB;

    const PUT: Operation = Operation {
        service: &DYNAMODB,
        name: "PutItem",
        target: "DynamoDB_20120810.PutItem",
    };

    fn credentials(token: Option<&str>) -> Credentials {
        Credentials::new(
            "AKIDEXAMPLE",
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            token.map(str::to_owned),
            None,
            "test",
        )
    }

    fn client(url: &str, token: Option<&str>) -> AwsJson {
        AwsJson::new(
            DYNAMODB,
            crate::clients::aws_http(None),
            "us-east-1",
            SharedCredentialsProvider::new(credentials(token)),
            Some(url),
        )
        .expect("valid url")
    }

    /// The same request signed by the AWS SDK's own signer (`aws-sigv4`).
    fn sdk_signature(
        url: &str,
        host: &str,
        target: &str,
        body: &[u8],
        now: DateTime<Utc>,
        token: Option<&str>,
    ) -> (String, String) {
        use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
        use aws_sigv4::sign::v4;
        let identity = credentials(token).into();
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region("us-east-1")
            .name("dynamodb")
            .time(now.into())
            .settings(SigningSettings::default())
            .build()
            .expect("params")
            .into();
        let headers = [
            ("content-type", JSON_1_0),
            ("host", host),
            ("x-amz-target", target),
        ];
        let signable = SignableRequest::new(
            "POST",
            url,
            headers.iter().copied(),
            SignableBody::Bytes(body),
        )
        .expect("signable");
        let (instructions, _) = sign(signable, &params).expect("signs").into_parts();
        let mut request = http::Request::builder()
            .method("POST")
            .uri(url)
            .body(())
            .expect("request");
        instructions.apply_to_request_http1x(&mut request);
        let header = |name: &str| {
            request
                .headers()
                .get(name)
                .expect("signed header")
                .to_str()
                .expect("ascii")
                .to_owned()
        };
        (header("authorization"), header("x-amz-date"))
    }

    #[test]
    fn signatures_are_the_sdk_signers_with_and_without_a_session_token() {
        let now = DateTime::parse_from_rfc3339("2026-12-05T10:40:07Z")
            .expect("time")
            .with_timezone(&Utc);
        let body = br#"{"TableName":"t","Key":{"PK":{"S":"a"},"SK":{"S":"b"}}}"#;
        for (url, host) in [
            (
                "https://dynamodb.us-east-1.amazonaws.com/",
                "dynamodb.us-east-1.amazonaws.com",
            ),
            ("http://127.0.0.1:5000/", "127.0.0.1:5000"),
        ] {
            for token in [None, Some("session/token+value=")] {
                let ours = client(url, token);
                assert_eq!(ours.host, host);
                let keys = credentials(token);
                let signed = ours.sign(&keys, "DynamoDB_20120810.GetItem", body, now);
                let (authorization, amz_date) =
                    sdk_signature(url, host, "DynamoDB_20120810.GetItem", body, now, token);
                assert_eq!(signed.amz_date, amz_date);
                assert_eq!(signed.authorization, authorization, "{url} {token:?}");
                // The cached key serves the same day; a new day derives anew.
                let again = ours.sign(&keys, "DynamoDB_20120810.GetItem", body, now);
                assert_eq!(again.authorization, authorization);
                // New credentials the same day: a key of their own.
                let rotated = Credentials::new("AKIDEXAMPLE", "another-secret", None, None, "t");
                let other = ours.sign(&rotated, "DynamoDB_20120810.GetItem", body, now);
                assert_ne!(other.authorization, authorization);
                assert_eq!(
                    ours.sign(&keys, "DynamoDB_20120810.GetItem", body, now)
                        .authorization,
                    authorization
                );
                let tomorrow = now + chrono::TimeDelta::days(1);
                let (next_day, _) = sdk_signature(
                    url,
                    host,
                    "DynamoDB_20120810.GetItem",
                    body,
                    tomorrow,
                    token,
                );
                assert_eq!(
                    ours.sign(&keys, "DynamoDB_20120810.GetItem", body, tomorrow)
                        .authorization,
                    next_day
                );
            }
        }
    }

    #[test]
    fn the_default_url_is_the_regions_endpoint_and_debug_hides_the_secret() {
        let aws = AwsJson::new(
            DYNAMODB,
            crate::clients::aws_http(None),
            "sa-east-1",
            SharedCredentialsProvider::new(credentials(Some("tok"))),
            None,
        )
        .expect("valid");
        assert_eq!(
            aws.uri.to_string(),
            "https://dynamodb.sa-east-1.amazonaws.com/"
        );
        assert_eq!(aws.host, "dynamodb.sa-east-1.amazonaws.com");
        let shown = format!("{aws:?}");
        assert!(
            !shown.contains("wJalrXUtnFEMI") && !shown.contains("tok\""),
            "{shown}"
        );
    }

    #[test]
    fn backoff_is_full_jitter_under_a_doubling_ceiling() {
        assert_eq!(backoff(1, 1.0), Duration::from_millis(50));
        assert_eq!(backoff(2, 1.0), Duration::from_millis(100));
        assert_eq!(backoff(3, 0.5), Duration::from_millis(100));
        assert_eq!(backoff(30, 1.0), MAX_BACKOFF);
        assert_eq!(backoff(3, 0.0), Duration::ZERO);
    }

    #[test]
    fn error_codes_lose_their_namespace_and_say_what_is_retried() {
        let err = service_error(
            PUT,
            400,
            None,
            br#"{"__type":"com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException","message":"The conditional request failed"}"#,
        );
        assert!(err.is_condition_failure() && !err.is_retryable() && !err.deserves_retry());
        assert!(err.to_string().contains("The conditional request failed"));
        let err = service_error(
            PUT,
            400,
            Some("ThrottlingException:http://internal.amazon.com/"),
            b"not json",
        );
        assert_eq!(err.code(), Some("ThrottlingException"));
        assert!(err.is_retryable() && err.deserves_retry());
        let err = service_error(
            PUT,
            400,
            None,
            br#"{"__type":"com.amazonaws.dynamodb.v20120810#TransactionConflictException","Message":"busy"}"#,
        );
        assert!(err.is_transaction_conflict() && err.is_retryable() && !err.deserves_retry());
        let err = service_error(PUT, 503, None, b"");
        assert_eq!(err.code(), Some("Unknown"));
        assert!(err.deserves_retry());
    }

    #[test]
    fn each_service_signs_with_its_own_name_and_endpoint() {
        let sqs = AwsJson::new(
            crate::sqs_http::SQS,
            crate::clients::aws_http(None),
            "eu-west-1",
            SharedCredentialsProvider::new(credentials(None)),
            None,
        )
        .expect("valid");
        assert_eq!(sqs.uri.to_string(), "https://sqs.eu-west-1.amazonaws.com/");
        let now = Utc::now();
        let signed = sqs.sign(&credentials(None), "AmazonSQS.SendMessageBatch", b"{}", now);
        assert!(
            signed.authorization.contains("/eu-west-1/sqs/aws4_request"),
            "{}",
            signed.authorization
        );
    }
}
