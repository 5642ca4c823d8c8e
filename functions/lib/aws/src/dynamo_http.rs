//! [`DynamoHttp`]: DynamoDB's JSON API spoken directly — SigV4 and the
//! `application/x-amz-json-1.0` protocol on the functions' `reqwest` client —
//! for the operations every delivery makes (GetItem, PutItem, UpdateItem,
//! Query).
//!
//! Why: the AWS SDK's orchestrator runs, per request, a config-bag merge,
//! endpoint rules, a dozen interceptors and its retry state machine; on a
//! loopback stub that was 0.16 CPU-ms per request against 0.07 for a plain
//! signed POST on the same HTTP client, and a delivery makes five (the
//! benchmark's CPU split, BENCHMARKS.md). This client does only what those
//! operations need, the way the SDK does it:
//!
//! - **signing**: AWS Signature Version 4, the signing key derived once a
//!   day (tested against the SDK's own signer, `aws-sigv4`);
//! - **retries**: the SDK's standard mode — up to [`MAX_ATTEMPTS`] attempts
//!   with full-jitter exponential backoff from 50 ms (at most 2 s) on a
//!   failed or timed-out exchange, a 5xx answer or a throttling error;
//!   nothing else is retried (a failed condition is an answer);
//! - **timeouts**: each attempt [`ATTEMPT_TIMEOUT`], the whole call
//!   [`OPERATION_TIMEOUT`] (the SDK configuration's figures);
//! - **errors**: [`DynamoHttpError`] keeps the service's error code, status
//!   and message, or the transport failure as its source.
//!
//! Everything else (transactions, batch reads, updates, the operator's
//! queries) stays on the SDK client.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_credential_types::Credentials;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use rand::Rng;
use serde::{Deserialize, Serialize};
use serde_dynamo::{AttributeValue, Item};
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

const SERVICE: &str = "dynamodb";
const CONTENT_TYPE: &str = "application/x-amz-json-1.0";

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

/// Sees every attempt's operation name and request body before it is sent
/// (the benchmark's request counter).
pub type RequestObserver = Arc<dyn Fn(&str, &[u8]) + Send + Sync>;

/// A failed DynamoDB call.
#[derive(Debug, thiserror::Error)]
pub enum DynamoHttpError {
    /// DynamoDB answered with an error (after the retries it deserved).
    #[error("DynamoDB {operation} answered {status} {code}: {message}")]
    Service {
        operation: &'static str,
        status: u16,
        /// The error's short name, e.g. `ConditionalCheckFailedException`.
        code: String,
        message: String,
    },
    /// No answer: the connection or the exchange failed on every attempt.
    #[error("DynamoDB {operation}: no answer")]
    Transport {
        operation: &'static str,
        #[source]
        source: reqwest::Error,
    },
    /// The call took longer than [`OPERATION_TIMEOUT`].
    #[error("DynamoDB {operation}: no answer within {OPERATION_TIMEOUT:?}")]
    Timeout { operation: &'static str },
    /// A success answer that does not parse.
    #[error("DynamoDB {operation}: unreadable answer")]
    Decode {
        operation: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// The credentials provider failed (never for Lambda's static ones).
    #[error("DynamoDB {operation}: no credentials")]
    Credentials {
        operation: &'static str,
        #[source]
        source: aws_credential_types::provider::error::CredentialsError,
    },
    /// A request that cannot be built (an item that does not encode).
    #[error("DynamoDB {operation}: the request does not encode")]
    Encode {
        operation: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

impl DynamoHttpError {
    /// The service's error code, when DynamoDB answered with one.
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
    pub fn operation(&self) -> &'static str {
        match self {
            Self::Service { operation, .. }
            | Self::Transport { operation, .. }
            | Self::Timeout { operation }
            | Self::Decode { operation, .. }
            | Self::Encode { operation, .. }
            | Self::Credentials { operation, .. } => operation,
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

/// DynamoDB's JSON API on one HTTP client. Cheap to clone.
#[derive(Clone)]
pub struct DynamoHttp {
    http: reqwest::Client,
    /// `https://dynamodb.<region>.amazonaws.com/`, or the local endpoint
    /// (parsed once: reqwest would parse a string on every request).
    url: url::Url,
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

impl std::fmt::Debug for DynamoHttp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynamoHttp")
            .field("url", &self.url.as_str())
            .field("region", &self.region)
            .field("observed", &self.observer.is_some())
            .finish_non_exhaustive()
    }
}

impl DynamoHttp {
    /// A client of `region`'s DynamoDB (or of `endpoint_url`, e.g. moto)
    /// signing with `credentials`, on `http`.
    pub fn new(
        http: reqwest::Client,
        region: &str,
        credentials: SharedCredentialsProvider,
        endpoint_url: Option<&str>,
    ) -> Result<Self, url::ParseError> {
        let url = match endpoint_url {
            Some(url) => url::Url::parse(url)?,
            None => url::Url::parse(&format!("https://{SERVICE}.{region}.amazonaws.com/"))?,
        };
        let host = match (url.host_str(), url.port()) {
            (Some(host), Some(port)) => format!("{host}:{port}"),
            (Some(host), None) => host.to_owned(),
            (None, _) => return Err(url::ParseError::EmptyHost),
        };
        let host_header = http::HeaderValue::from_str(&host)
            .map_err(|_| url::ParseError::InvalidDomainCharacter)?;
        Ok(Self {
            http,
            url,
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

    /// The item at (`pk`, `sk`) of `table`, read consistently.
    pub async fn get_item(
        &self,
        table: &str,
        pk: &str,
        sk: &str,
    ) -> Result<Option<Item>, DynamoHttpError> {
        #[derive(Serialize)]
        #[serde(rename_all = "PascalCase")]
        struct Request<'a> {
            table_name: &'a str,
            key: TableKey<'a>,
            consistent_read: bool,
        }
        #[derive(Deserialize)]
        struct Response {
            #[serde(rename = "Item")]
            item: Option<Item>,
        }
        let request = Request {
            table_name: table,
            key: TableKey::new(pk, sk),
            consistent_read: true,
        };
        let response: Response = self.call(Operation::GetItem, &request).await?;
        Ok(response.item)
    }

    /// Writes `put.item`; a failed condition is
    /// [`DynamoHttpError::is_condition_failure`].
    pub async fn put_item(&self, put: &Put<'_>) -> Result<(), DynamoHttpError> {
        #[derive(Deserialize)]
        struct Response {}
        let _: Response = self.call(Operation::PutItem, put).await?;
        Ok(())
    }

    /// Applies `update`; a failed condition is
    /// [`DynamoHttpError::is_condition_failure`].
    pub async fn update_item(&self, update: &Update<'_>) -> Result<(), DynamoHttpError> {
        #[derive(Deserialize)]
        struct Response {}
        let _: Response = self.call(Operation::UpdateItem, update).await?;
        Ok(())
    }

    /// One page of `query`.
    pub async fn query(&self, query: &Query<'_>) -> Result<QueryPage, DynamoHttpError> {
        self.call(Operation::Query, query).await
    }

    /// Every item `query` finds, page after page.
    pub async fn query_all(&self, query: &Query<'_>) -> Result<Vec<Item>, DynamoHttpError> {
        let mut query = query.clone();
        let mut out = Vec::new();
        loop {
            let page = self.query(&query).await?;
            out.extend(page.items);
            match page.last_evaluated_key {
                Some(key) if !key.is_empty() => query.exclusive_start_key = Some(key),
                _ => return Ok(out),
            }
        }
    }

    /// `operation` with `request` as its body, retried as the module says.
    async fn call<Q: Serialize + ?Sized, A: serde::de::DeserializeOwned>(
        &self,
        op: Operation,
        request: &Q,
    ) -> Result<A, DynamoHttpError> {
        let operation = op.name();
        let body = serde_json::to_vec(request)
            .map_err(|source| DynamoHttpError::Encode { operation, source })?;
        let body = bytes::Bytes::from(body);
        let answer = tokio::time::timeout(OPERATION_TIMEOUT, self.with_retries(op, body))
            .await
            .map_err(|_| DynamoHttpError::Timeout { operation })??;
        serde_json::from_slice(&answer)
            .map_err(|source| DynamoHttpError::Decode { operation, source })
    }

    async fn with_retries(
        &self,
        op: Operation,
        body: bytes::Bytes,
    ) -> Result<bytes::Bytes, DynamoHttpError> {
        let mut attempt = 1;
        loop {
            let outcome = self.attempt(op, body.clone()).await;
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
    ) -> Result<bytes::Bytes, DynamoHttpError> {
        let operation = op.name();
        if let Some(observe) = &self.observer {
            observe(operation, &body);
        }
        let credentials = self
            .credentials
            .provide_credentials()
            .await
            .map_err(|source| DynamoHttpError::Credentials { operation, source })?;
        let target = op.target();
        let signed = self.sign(&credentials, target, &body, Utc::now());
        // Names and constant values built once, not parsed per request.
        let mut headers = http::HeaderMap::with_capacity(8);
        headers.insert(http::header::HOST, self.host_header.clone());
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(CONTENT_TYPE),
        );
        headers.insert(X_AMZ_TARGET, http::HeaderValue::from_static(target));
        let signed_value = |value: String| {
            http::HeaderValue::try_from(value).map_err(|_| DynamoHttpError::Credentials {
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
        let transport = |source| DynamoHttpError::Transport { operation, source };
        let response = self
            .http
            .post(self.url.clone())
            .timeout(ATTEMPT_TIMEOUT)
            .headers(headers)
            .body(body)
            .send()
            .await
            .map_err(transport)?;
        let status = response.status();
        let header_code = response
            .headers()
            .get("x-amzn-errortype")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let answer = response.bytes().await.map_err(transport)?;
        if status.is_success() {
            return Ok(answer);
        }
        Err(service_error(
            operation,
            status.as_u16(),
            header_code.as_deref(),
            &answer,
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
            CONTENT_TYPE,
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
        for part in [date, "/", &self.region, "/", SERVICE, "/aws4_request"] {
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
        let key = [self.region.as_bytes(), SERVICE.as_bytes(), b"aws4_request"]
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

/// The operations this client speaks.
#[derive(Debug, Clone, Copy)]
enum Operation {
    GetItem,
    PutItem,
    UpdateItem,
    Query,
}

impl Operation {
    fn name(self) -> &'static str {
        match self {
            Self::GetItem => "GetItem",
            Self::PutItem => "PutItem",
            Self::UpdateItem => "UpdateItem",
            Self::Query => "Query",
        }
    }

    /// Its `x-amz-target` header.
    fn target(self) -> &'static str {
        match self {
            Self::GetItem => "DynamoDB_20120810.GetItem",
            Self::PutItem => "DynamoDB_20120810.PutItem",
            Self::UpdateItem => "DynamoDB_20120810.UpdateItem",
            Self::Query => "DynamoDB_20120810.Query",
        }
    }
}

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

impl DynamoHttpError {
    /// Whether this client tries again itself (the SDK standard mode's
    /// rule): no answer, a 5xx, throttling.
    fn deserves_retry(&self) -> bool {
        match self {
            Self::Transport { source, .. } => !source.is_builder(),
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

/// The error DynamoDB answered: its code from the body's `__type` (or the
/// `x-amzn-errortype` header), without the namespace.
fn service_error(
    operation: &'static str,
    status: u16,
    header_code: Option<&str>,
    body: &[u8],
) -> DynamoHttpError {
    #[derive(Deserialize, Default)]
    struct ErrorBody {
        #[serde(rename = "__type")]
        kind: Option<String>,
        #[serde(alias = "Message")]
        message: Option<String>,
    }
    // A body that is not DynamoDB's JSON (a proxy's or load balancer's
    // page) still says an error: its code then comes from the header, else
    // "Unknown", and its status decides whether it is retried.
    let parsed: ErrorBody = serde_json::from_slice(body).unwrap_or_default();
    let raw = parsed.kind.as_deref().or(header_code).unwrap_or("Unknown");
    let code = raw.rsplit('#').next().unwrap_or(raw);
    let code = code.split(':').next().unwrap_or(code);
    DynamoHttpError::Service {
        operation,
        status,
        code: code.to_owned(),
        // Some errors carry no message; the code says what happened.
        message: parsed.message.unwrap_or_default(),
    }
}

/// A table key (`PK`, `SK`) on the wire.
#[derive(Debug, Clone, Serialize)]
struct TableKey<'a> {
    #[serde(rename = "PK")]
    pk: Text<'a>,
    #[serde(rename = "SK")]
    sk: Text<'a>,
}

impl<'a> TableKey<'a> {
    fn new(pk: &'a str, sk: &'a str) -> Self {
        Self {
            pk: Text { s: pk },
            sk: Text { s: sk },
        }
    }
}

/// A string attribute value on the wire, borrowed.
#[derive(Debug, Clone, Serialize)]
struct Text<'a> {
    #[serde(rename = "S")]
    s: &'a str,
}

/// A PutItem request.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Put<'a> {
    pub table_name: &'a str,
    pub item: &'a Item,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub condition_expression: Option<&'a str>,
    #[serde(skip_serializing_if = "HashMap::is_empty")]
    pub expression_attribute_values: HashMap<&'a str, AttributeValue>,
}

impl<'a> Put<'a> {
    /// `item` into `table`, unconditionally.
    pub fn new(table: &'a str, item: &'a Item) -> Self {
        Self {
            table_name: table,
            item,
            condition_expression: None,
            expression_attribute_values: HashMap::new(),
        }
    }

    /// Only if `condition` holds.
    pub fn condition(mut self, condition: &'a str) -> Self {
        self.condition_expression = Some(condition);
        self
    }

    /// Binds `name` (`:name`) in the condition.
    pub fn value(mut self, name: &'a str, value: AttributeValue) -> Self {
        self.expression_attribute_values.insert(name, value);
        self
    }
}

/// An UpdateItem request.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Update<'a> {
    pub table_name: &'a str,
    key: TableKey<'a>,
    pub update_expression: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub condition_expression: Option<&'a str>,
    #[serde(skip_serializing_if = "HashMap::is_empty")]
    pub expression_attribute_names: HashMap<String, String>,
    #[serde(skip_serializing_if = "HashMap::is_empty")]
    pub expression_attribute_values: HashMap<String, AttributeValue>,
}

impl<'a> Update<'a> {
    /// `expression` on the item at (`pk`, `sk`) of `table`.
    pub fn new(table: &'a str, pk: &'a str, sk: &'a str, expression: String) -> Self {
        Self {
            table_name: table,
            key: TableKey::new(pk, sk),
            update_expression: expression,
            condition_expression: None,
            expression_attribute_names: HashMap::new(),
            expression_attribute_values: HashMap::new(),
        }
    }

    /// Only if `condition` holds.
    pub fn condition(mut self, condition: &'a str) -> Self {
        self.condition_expression = Some(condition);
        self
    }

    /// Binds `name` (`:name`).
    pub fn value(mut self, name: impl Into<String>, value: AttributeValue) -> Self {
        self.expression_attribute_values.insert(name.into(), value);
        self
    }

    /// Binds `placeholder` (`#name`) to attribute `name`.
    pub fn name(mut self, placeholder: impl Into<String>, name: impl Into<String>) -> Self {
        self.expression_attribute_names
            .insert(placeholder.into(), name.into());
        self
    }
}

/// A Query request.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Query<'a> {
    pub table_name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index_name: Option<&'a str>,
    pub key_condition_expression: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub projection_expression: Option<&'a str>,
    #[serde(skip_serializing_if = "HashMap::is_empty")]
    pub expression_attribute_names: HashMap<&'a str, &'a str>,
    pub expression_attribute_values: HashMap<&'a str, AttributeValue>,
    pub consistent_read: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exclusive_start_key: Option<Item>,
}

impl<'a> Query<'a> {
    /// The items of `table` matching `key_condition`, read consistently.
    pub fn new(table: &'a str, key_condition: &'a str) -> Self {
        Self {
            table_name: table,
            index_name: None,
            key_condition_expression: key_condition,
            projection_expression: None,
            expression_attribute_names: HashMap::new(),
            expression_attribute_values: HashMap::new(),
            consistent_read: true,
            limit: None,
            exclusive_start_key: None,
        }
    }

    /// On global secondary index `index` (read eventually consistently:
    /// the only way an index is read).
    pub fn index(mut self, index: &'a str) -> Self {
        self.index_name = Some(index);
        self.consistent_read = false;
        self
    }

    /// Read eventually consistently (half the read units).
    pub fn eventually_consistent(mut self) -> Self {
        self.consistent_read = false;
        self
    }

    /// Binds `name` (`:name`) in the key condition.
    pub fn value(mut self, name: &'a str, value: AttributeValue) -> Self {
        self.expression_attribute_values.insert(name, value);
        self
    }

    /// Only these attributes (`#name`s bound with [`Self::name`]).
    pub fn projection(mut self, projection: &'a str) -> Self {
        self.projection_expression = Some(projection);
        self
    }

    /// Binds `placeholder` (`#name`) to attribute `name`.
    pub fn name(mut self, placeholder: &'a str, name: &'a str) -> Self {
        self.expression_attribute_names.insert(placeholder, name);
        self
    }
}

/// One page of a query's answer.
#[derive(Debug, Deserialize)]
pub struct QueryPage {
    #[serde(rename = "Items", default)]
    pub items: Vec<Item>,
    #[serde(rename = "LastEvaluatedKey")]
    pub last_evaluated_key: Option<Item>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_server::serve;

    fn credentials(token: Option<&str>) -> Credentials {
        Credentials::new(
            "AKIDEXAMPLE",
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            token.map(str::to_owned),
            None,
            "test",
        )
    }

    fn client(url: &str, token: Option<&str>) -> DynamoHttp {
        DynamoHttp::new(
            reqwest::Client::new(),
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
            ("content-type", CONTENT_TYPE),
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
        let aws = DynamoHttp::new(
            reqwest::Client::new(),
            "sa-east-1",
            SharedCredentialsProvider::new(credentials(Some("tok"))),
            None,
        )
        .expect("valid");
        assert_eq!(
            aws.url.as_str(),
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
            "PutItem",
            400,
            None,
            br#"{"__type":"com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException","message":"The conditional request failed"}"#,
        );
        assert!(err.is_condition_failure() && !err.is_retryable() && !err.deserves_retry());
        assert!(err.to_string().contains("The conditional request failed"));
        let err = service_error(
            "PutItem",
            400,
            Some("ThrottlingException:http://internal.amazon.com/"),
            b"not json",
        );
        assert_eq!(err.code(), Some("ThrottlingException"));
        assert!(err.is_retryable() && err.deserves_retry());
        let err = service_error(
            "PutItem",
            400,
            None,
            br#"{"__type":"com.amazonaws.dynamodb.v20120810#TransactionConflictException","Message":"busy"}"#,
        );
        assert!(err.is_transaction_conflict() && err.is_retryable() && !err.deserves_retry());
        let err = service_error("GetItem", 503, None, b"");
        assert_eq!(err.code(), Some("Unknown"));
        assert!(err.deserves_retry());
    }

    fn answer(status: &str, body: &str) -> String {
        format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/x-amz-json-1.0\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
    }

    #[tokio::test]
    async fn a_get_item_is_signed_parsed_and_retried_after_throttling() {
        let (url, server) = serve(vec![
            answer(
                "400 Bad Request",
                r#"{"__type":"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException","message":"slow down"}"#,
            ),
            answer("500 Internal Server Error", r#"{}"#),
            answer(
                "200 OK",
                r#"{"Item":{"PK":{"S":"a"},"SK":{"S":"b"},"n":{"N":"7"},"on":{"BOOL":true}}}"#,
            ),
        ]);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let ours = client(&url, Some("tok")).observed_by(Arc::new(move |op, body| {
            log.lock()
                .expect("log")
                .push(format!("{op} {}", String::from_utf8_lossy(body)))
        }));
        let item = ours
            .get_item("hookline-Table", "a", "b")
            .await
            .expect("answered on the third attempt")
            .expect("an item");
        let item: HashMap<String, AttributeValue> = item.into();
        assert_eq!(item.get("n"), Some(&AttributeValue::N("7".into())));
        assert_eq!(item.get("on"), Some(&AttributeValue::Bool(true)));
        let requests = server.join().expect("server");
        assert_eq!(requests.len(), 3);
        let first = requests[0].to_ascii_lowercase();
        assert!(first.starts_with("post / http/1.1"), "{first}");
        assert!(
            first.contains("x-amz-target: dynamodb_20120810.getitem"),
            "{first}"
        );
        assert!(first.contains("x-amz-security-token: tok"), "{first}");
        assert!(
            first.contains("authorization: aws4-hmac-sha256 credential=akidexample/"),
            "{first}"
        );
        assert!(
            requests[0].ends_with(
                r#"{"TableName":"hookline-Table","Key":{"PK":{"S":"a"},"SK":{"S":"b"}},"ConsistentRead":true}"#
            ),
            "{}",
            requests[0]
        );
        assert_eq!(seen.lock().expect("log").len(), 3, "every attempt observed");
    }

    #[tokio::test]
    async fn a_failed_condition_is_answered_at_once_and_absent_items_are_none() {
        let (url, server) = serve(vec![
            answer(
                "400 Bad Request",
                r#"{"__type":"com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException","message":"The conditional request failed"}"#,
            ),
            answer("200 OK", "{}"),
        ]);
        let ours = client(&url, None);
        let item: Item = HashMap::from([
            ("PK".to_owned(), AttributeValue::S("a".into())),
            ("SK".to_owned(), AttributeValue::S("b".into())),
        ])
        .into();
        let err = ours
            .put_item(
                &Put::new("t", &item)
                    .condition("attribute_not_exists(PK) OR expires_at <= :now")
                    .value(":now", AttributeValue::N("5".into())),
            )
            .await
            .expect_err("the condition failed");
        assert!(err.is_condition_failure(), "{err}");
        assert_eq!(ours.get_item("t", "a", "b").await.expect("answered"), None);
        let requests = server.join().expect("server");
        assert!(
            requests[0].contains(r#""ConditionExpression":"attribute_not_exists(PK) OR expires_at <= :now","ExpressionAttributeValues":{":now":{"N":"5"}}"#),
            "{}",
            requests[0]
        );
        assert!(!requests[0]
            .to_ascii_lowercase()
            .contains("x-amz-security-token"));
    }

    #[tokio::test]
    async fn an_update_names_its_key_expression_and_bindings() {
        let (url, server) = serve(vec![answer("200 OK", "{}")]);
        client(&url, None)
            .update_item(
                &Update::new("t", "a", "b", "SET #s = :s ADD n :one".into())
                    .condition("version = :v")
                    .name("#s", "status")
                    .value(":s", AttributeValue::S("ok".into()))
                    .value(":one", AttributeValue::N("1".into()))
                    .value(":v", AttributeValue::N("3".into())),
            )
            .await
            .expect("updated");
        let request = server.join().expect("server").remove(0);
        let body: serde_json::Value =
            serde_json::from_str(&request[request.find("\r\n\r\n").expect("a body") + 4..])
                .expect("JSON");
        assert_eq!(
            body,
            serde_json::json!({
                "TableName": "t",
                "Key": {"PK": {"S": "a"}, "SK": {"S": "b"}},
                "UpdateExpression": "SET #s = :s ADD n :one",
                "ConditionExpression": "version = :v",
                "ExpressionAttributeNames": {"#s": "status"},
                "ExpressionAttributeValues": {":s": {"S": "ok"}, ":one": {"N": "1"}, ":v": {"N": "3"}}
            })
        );
        assert!(request
            .to_ascii_lowercase()
            .contains("x-amz-target: dynamodb_20120810.updateitem"));
    }

    #[tokio::test]
    async fn a_garbled_success_is_answered_once_as_a_retryable_decode_failure() {
        let (url, server) = serve(vec![answer("200 OK", "{not json")]);
        let err = client(&url, None)
            .get_item("t", "a", "b")
            .await
            .expect_err("unreadable");
        assert!(matches!(err, DynamoHttpError::Decode { .. }), "{err:?}");
        assert!(err.is_retryable() && !err.deserves_retry());
        assert_eq!(server.join().expect("server").len(), 1, "not sent again");
    }

    #[tokio::test]
    async fn no_answer_is_a_retryable_transport_failure_after_every_attempt() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("bind")
            .local_addr()
            .expect("addr")
            .port();
        let ours = client(&format!("http://127.0.0.1:{port}/"), None);
        let err = ours
            .get_item("t", "a", "b")
            .await
            .expect_err("nobody listens");
        assert!(matches!(err, DynamoHttpError::Transport { .. }), "{err:?}");
        assert!(err.is_retryable());
        assert!(std::error::Error::source(&err).is_some(), "keeps its cause");
    }
}
