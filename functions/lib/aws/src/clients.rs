//! SDK clients, built once per process with explicit retry and timeout
//! settings, from Lambda's environment (see [`AwsEnvironment`]).

use std::time::Duration;

use aws_credential_types::provider::SharedCredentialsProvider;
use aws_credential_types::Credentials;
use aws_smithy_async::rt::sleep::default_async_sleep;
use aws_smithy_async::time::{SharedTimeSource, SystemTimeSource};
use aws_smithy_runtime_api::client::behavior_version::BehaviorVersion;
use aws_smithy_types::retry::RetryConfig;
use aws_smithy_types::timeout::TimeoutConfig;
use aws_types::region::Region;
use hookline_pipeline::settings::ConfigError;

/// The DynamoDB client type (re-exported for binaries that need only it).
pub use aws_sdk_dynamodb::Client as DynamoDbClient;
pub use aws_types::SdkConfig;

use crate::dynamo_http::DynamoHttp;
use crate::kms_http::KmsHttp;
use crate::lazy::Lazy;
use crate::sqs_http::SqsHttp;
use crate::transport::AwsHttp;

/// The AWS clients the functions use. The SDK's are built on their first
/// use ([`Lazy`]): most invocations make only direct DynamoDB requests.
#[derive(Debug, Clone)]
pub struct Clients {
    pub dynamodb: Lazy<aws_sdk_dynamodb::Client>,
    /// DynamoDB's JSON API spoken directly, for the operations every
    /// delivery makes ([`crate::dynamo_http`]).
    pub dynamodb_http: DynamoHttp,
    pub sqs: Lazy<aws_sdk_sqs::Client>,
    /// SQS's JSON API spoken directly, for the message sends
    /// ([`crate::sqs_http`]).
    pub sqs_http: SqsHttp,
    /// KMS's JSON API spoken directly: the sealed secrets' data keys
    /// ([`crate::kms_http`]).
    pub kms: KmsHttp,
}

/// Where a function's AWS access comes from: the variables Lambda sets in
/// every execution environment — `AWS_REGION` and the execution role's
/// credentials (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
/// `AWS_SESSION_TOKEN`), valid for the environment's lifetime. Read
/// directly instead of through aws-config's credential chain (profiles,
/// SSO, STS web identity, IMDS, ECS...), none of which applies in Lambda:
/// about 0.3 MB less in every bootstrap and less work before the first
/// answer. `sam local invoke` sets the same variables.
#[derive(Debug, Clone)]
pub struct AwsEnvironment {
    region: String,
    /// Its `Debug` hides the secret parts.
    credentials: Credentials,
}

impl AwsEnvironment {
    /// Reads the process environment; a missing variable is an error
    /// naming it (the cold start fails with it).
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|var| std::env::var(var).ok())
    }

    /// Reads the variables through `get` (tests pass a map).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let var = |name: &str| get(name).filter(|v| !v.trim().is_empty());
        let required = |name: &'static str| var(name).ok_or(ConfigError::Missing { var: name });
        let region = var("AWS_REGION")
            .or_else(|| var("AWS_DEFAULT_REGION"))
            .ok_or(ConfigError::Missing { var: "AWS_REGION" })?;
        let credentials = Credentials::new(
            required("AWS_ACCESS_KEY_ID")?,
            required("AWS_SECRET_ACCESS_KEY")?,
            var("AWS_SESSION_TOKEN"),
            None,
            "lambda-environment",
        );
        Ok(Self {
            region,
            credentials,
        })
    }
}

/// Shared SDK configuration: region and credentials from `aws`, standard
/// retry mode with 4 attempts and exponential backoff, bounded timeouts;
/// `endpoint_url` (moto, for `sam local invoke`:
/// `Settings::aws_endpoint_url`) instead of AWS when given.
pub fn sdk_config(aws: &AwsEnvironment, endpoint_url: Option<&str>) -> SdkConfig {
    sdk_config_on(aws, endpoint_url, aws_http(endpoint_url))
}

/// [`sdk_config`] on `http` (a client [`aws_http`] built).
fn sdk_config_on(aws: &AwsEnvironment, endpoint_url: Option<&str>, http: AwsHttp) -> SdkConfig {
    let mut config = SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(aws.region.clone()))
        .credentials_provider(SharedCredentialsProvider::new(aws.credentials.clone()))
        .http_client(crate::transport::AwsHttpClient::on(http).shared())
        .time_source(SharedTimeSource::new(SystemTimeSource::new()))
        .retry_config(
            RetryConfig::standard()
                .with_max_attempts(4)
                .with_initial_backoff(Duration::from_millis(50))
                .with_max_backoff(Duration::from_secs(2)),
        )
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(crate::transport::CONNECT_TIMEOUT)
                .operation_attempt_timeout(Duration::from_secs(10))
                .operation_timeout(Duration::from_secs(30))
                .build(),
        );
    config.set_sleep_impl(default_async_sleep());
    if let Some(url) = endpoint_url {
        config = config.endpoint_url(url);
    }
    config.build()
}

/// The roots every AWS service endpoint's certificate chains to (Amazon
/// Trust Services).
pub const AMAZON_TRUST_SERVICES_PEM: &str = include_str!("../certs/amazon-trust-services.pem");

/// The HTTPS client every AWS request goes through, the SDK's
/// ([`crate::transport`]) and the direct clients': one connection pool. Talking
/// to AWS (or to a plain-HTTP local endpoint) it trusts the five Amazon
/// Trust Services roots only: loading and parsing the system store's ~140
/// roots was a third of a cold start, on every function. A custom HTTPS
/// endpoint (a proxy, LocalStack) gets Mozilla's root program
/// (`webpki-roots`, compiled in).
pub fn aws_http(endpoint_url: Option<&str>) -> AwsHttp {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let custom_https = endpoint_url.is_some_and(|url| url.starts_with("https://"));
    let tls = if custom_https {
        hookline_pipeline::sender::tls_config()
    } else {
        let mut roots = rustls::RootCertStore::empty();
        let certs = CertificateDer::pem_slice_iter(AMAZON_TRUST_SERVICES_PEM.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("the compiled-in Amazon Trust Services roots are valid PEM (tested)");
        roots.add_parsable_certificates(certs);
        hookline_pipeline::sender::tls_config_trusting(roots)
    };
    AwsHttp::new(tls)
}

impl Clients {
    /// The functions' clients, from Lambda's environment: every request on
    /// one HTTP client (one connection pool).
    /// The SDK configuration and its clients are built when first used.
    pub fn new(aws: &AwsEnvironment, endpoint_url: Option<&str>) -> Self {
        let http = aws_http(endpoint_url);
        let credentials = SharedCredentialsProvider::new(aws.credentials.clone());
        let checked = "the endpoint URL was checked with the settings";
        let direct = DirectClients {
            dynamodb: DynamoHttp::new(http.clone(), &aws.region, credentials.clone(), endpoint_url)
                .expect(checked),
            sqs: SqsHttp::new(http.clone(), &aws.region, credentials.clone(), endpoint_url)
                .expect(checked),
            kms: KmsHttp::new(http.clone(), &aws.region, credentials, endpoint_url).expect(checked),
        };
        let (aws, endpoint_url) = (aws.clone(), endpoint_url.map(str::to_owned));
        let config = Lazy::new(move || sdk_config_on(&aws, endpoint_url.as_deref(), http.clone()));
        Self::on_lazy(config, direct)
    }

    /// Clients on `config` (the local stack, tests); the direct DynamoDB
    /// client on an HTTP client of its own, with `config`'s region,
    /// credentials and endpoint.
    pub fn from_config(config: &SdkConfig) -> Self {
        Self::with(config, DirectClients::of(config))
    }

    /// The SDK clients on `config` (each built on first use), and `direct`.
    pub fn with(config: &SdkConfig, direct: DirectClients) -> Self {
        Self::on_lazy(Lazy::ready(config.clone()), direct)
    }

    fn on_lazy(config: Lazy<SdkConfig>, direct: DirectClients) -> Self {
        let on = |config: &Lazy<SdkConfig>| config.clone();
        let (for_dynamodb, for_sqs) = (on(&config), on(&config));
        Self {
            dynamodb: Lazy::new(move || aws_sdk_dynamodb::Client::new(for_dynamodb.get())),
            dynamodb_http: direct.dynamodb,
            sqs: Lazy::new(move || aws_sdk_sqs::Client::new(for_sqs.get())),
            sqs_http: direct.sqs,
            kms: direct.kms,
        }
    }
}

/// The clients that speak AWS's JSON APIs directly ([`crate::aws_json`]).
#[derive(Debug, Clone)]
pub struct DirectClients {
    pub dynamodb: DynamoHttp,
    pub sqs: SqsHttp,
    pub kms: KmsHttp,
}

impl DirectClients {
    /// With `config`'s region, credentials and endpoint, on one HTTP client
    /// of their own.
    ///
    /// # Panics
    /// When `config` has no region or credentials provider, or a bad
    /// endpoint URL: a configuration the SDK clients could not use either.
    pub fn of(config: &SdkConfig) -> Self {
        let endpoint_url = config.endpoint_url();
        let http = aws_http(endpoint_url);
        let region = config
            .region()
            .expect("an SDK configuration for AWS services has a region");
        let credentials = config
            .credentials_provider()
            .expect("an SDK configuration for AWS services has credentials");
        let parses = "the SDK configuration's endpoint URL parses";
        Self {
            dynamodb: DynamoHttp::new(
                http.clone(),
                region.as_ref(),
                credentials.clone(),
                endpoint_url,
            )
            .expect(parses),
            sqs: SqsHttp::new(
                http.clone(),
                region.as_ref(),
                credentials.clone(),
                endpoint_url,
            )
            .expect(parses),
            kms: KmsHttp::new(http, region.as_ref(), credentials, endpoint_url).expect(parses),
        }
    }
}

/// JSON logs (CloudWatch-friendly) filtered by `RUST_LOG` (default `info`).
/// Safe to call more than once.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_current_span(false)
        .with_span_list(true)
        .with_target(false)
        .without_time()
        .try_init();
}

/// The settings from the process environment, read once at init. A
/// missing or bad variable is logged (naming it) and returned, so the cold
/// start fails with it instead of running on a silent default.
pub fn settings_from_env() -> Result<hookline_pipeline::Settings, ConfigError> {
    hookline_pipeline::Settings::from_env()
        .and_then(|settings| AwsEnvironment::from_env().map(|_| settings))
        .inspect_err(|err| {
            tracing::error!(error = %err, "invalid configuration; the function cannot start");
        })
}

/// What every function needs: its settings, read and checked at init, and
/// the store and queue, built on the first invocation (building the SDK
/// configuration — credential chain, TLS roots — is most of a cold start, so
/// init stays as fast as a hello-world function's).
#[derive(Debug)]
pub struct Deps {
    pub settings: hookline_pipeline::Settings,
    adapters: tokio::sync::OnceCell<(crate::DynamoStore, crate::SqsQueue)>,
}

impl Deps {
    /// Reads the settings from the environment; an error fails the cold start.
    pub fn from_env() -> Result<Self, ConfigError> {
        Ok(Self {
            settings: settings_from_env()?,
            adapters: tokio::sync::OnceCell::new(),
        })
    }

    /// The store and queue (built once, on first use), the table's storage
    /// format check started beside the function's first reads
    /// ([`crate::DynamoStore::check_format_in_background`]): no write is
    /// made before it answers, and a table of another format fails the
    /// function's first invocation, naming both.
    pub async fn adapters(
        &self,
    ) -> Result<&(crate::DynamoStore, crate::SqsQueue), hookline_pipeline::error::BoxError> {
        let adapters = self.adapters_unchecked().await?;
        adapters.0.check_format_in_background();
        Ok(adapters)
    }

    /// The store and queue, no check started: for dispatch, whose everyday
    /// path writes nothing and whose reads carry the format item
    /// ([`crate::DynamoStore::check_format`]); a check beside them would be
    /// its first invocation's one extra request. A stream image of another
    /// format does not decode: its batch fails, naming the record.
    pub async fn adapters_unchecked(
        &self,
    ) -> Result<&(crate::DynamoStore, crate::SqsQueue), hookline_pipeline::error::BoxError> {
        Ok(self
            .adapters
            .get_or_try_init(|| store_and_queue(&self.settings))
            .await?)
    }
}

/// The store and queue for `settings`, on clients from the environment.
/// Functions call this lazily, on their first invocation: building the SDK
/// configuration (credential chain, TLS roots) is most of a cold start, and
/// init stays as fast as a hello-world function.
pub async fn store_and_queue(
    settings: &hookline_pipeline::Settings,
) -> Result<(crate::DynamoStore, crate::SqsQueue), ConfigError> {
    let aws = AwsEnvironment::from_env()?;
    let clients = Clients::new(&aws, settings.aws_endpoint_url.as_deref());
    let mut store = crate::DynamoStore::new(&clients, settings.table.clone(), settings.retention);
    if settings.serialize_dynamodb {
        store = store.serialized(crate::serial::Serial::one_at_a_time());
    }
    if let Some(key) = &settings.kms_key_id {
        store = store.sealed_with(std::sync::Arc::new(crate::sealing::SecretSealer::new(
            clients.kms.clone(),
            key.clone(),
        )));
    }
    let queue = crate::SqsQueue::new(
        &clients,
        settings.queue_url.clone(),
        settings.dlq_url.clone(),
    );
    Ok((store, queue))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;

    #[test]
    fn the_aws_environment_is_what_lambda_sets_and_nothing_is_guessed() {
        fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
            move |var: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == var)
                    .map(|(_, v)| (*v).to_owned())
            }
        }
        let full = [
            ("AWS_REGION", "sa-east-1"),
            ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"),
            ("AWS_SECRET_ACCESS_KEY", "very-secret-value"),
            ("AWS_SESSION_TOKEN", "session-token-value"),
        ];
        let aws = AwsEnvironment::from_lookup(env(&full)).unwrap();
        assert_eq!(aws.region, "sa-east-1");
        assert_eq!(aws.credentials.session_token(), Some("session-token-value"));
        let shown = format!("{aws:?}");
        assert!(
            !shown.contains("very-secret-value") && !shown.contains("session-token-value"),
            "{shown}"
        );
        let config = sdk_config(&aws, Some("http://127.0.0.1:1"));
        assert_eq!(config.region().map(|r| r.as_ref()), Some("sa-east-1"));
        assert!(config.sleep_impl().is_some() && config.http_client().is_some());

        // The older name of the region variable; no session token (a user's keys).
        let aws = AwsEnvironment::from_lookup(env(&[
            ("AWS_DEFAULT_REGION", "eu-west-1"),
            ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"),
            ("AWS_SECRET_ACCESS_KEY", "s"),
        ]))
        .unwrap();
        assert_eq!(
            (aws.region.as_str(), aws.credentials.session_token()),
            ("eu-west-1", None)
        );

        for (missing, pairs) in [
            ("AWS_REGION", &full[1..]),
            ("AWS_ACCESS_KEY_ID", &[full[0], full[2]][..]),
            (
                "AWS_SECRET_ACCESS_KEY",
                &[full[0], full[1], ("AWS_SECRET_ACCESS_KEY", " ")][..],
            ),
        ] {
            let err = AwsEnvironment::from_lookup(env(pairs)).unwrap_err();
            assert!(
                matches!(err, ConfigError::Missing { var } if var == missing),
                "{missing}: {err}"
            );
        }
    }

    #[test]
    fn sdk_clients_are_built_by_their_first_use_only() {
        let aws = AwsEnvironment::from_lookup(|var| match var {
            "AWS_REGION" => Some("eu-west-1".into()),
            "AWS_ACCESS_KEY_ID" => Some("AKIDEXAMPLE".into()),
            "AWS_SECRET_ACCESS_KEY" => Some("s".into()),
            _ => None,
        })
        .unwrap();
        let clients = Clients::new(&aws, Some("http://127.0.0.1:1"));
        let built = |c: &Clients| (c.dynamodb.is_built(), c.sqs.is_built());
        assert_eq!(built(&clients), (false, false));
        // The store and queue hold them unbuilt; the direct client needs none.
        let store = crate::DynamoStore::new(&clients, "t", std::time::Duration::from_secs(3600));
        let queue = crate::SqsQueue::new(&clients, "q", "dlq");
        assert_eq!(built(&clients), (false, false));
        // A first use builds that one, for every holder, on the shared config.
        assert_eq!(
            queue.client().config().region().map(|r| r.as_ref()),
            Some("eu-west-1")
        );
        assert_eq!(built(&clients), (false, true));
        let _ = store.client();
        assert_eq!(built(&clients), (true, true));
    }

    #[test]
    fn amazon_trust_services_roots_are_five_parsable_anchors() {
        let certs: Vec<CertificateDer<'_>> =
            CertificateDer::pem_slice_iter(AMAZON_TRUST_SERVICES_PEM.as_bytes())
                .collect::<Result<_, _>>()
                .expect("valid PEM");
        assert_eq!(certs.len(), 5);
        let mut store = rustls::RootCertStore::empty();
        let (valid, invalid) = store.add_parsable_certificates(certs);
        assert_eq!((valid, invalid), (5, 0));
        // Both kinds of client build (the roots are parsed on first use).
        let _ = aws_http(None);
        let _ = aws_http(Some("https://localhost.localstack.cloud:4566"));
    }
}
