//! SDK clients for a local endpoint (moto): fixed dummy credentials,
//! `us-east-1`, the deployed retry and timeout settings, and optionally every
//! request counted ([`crate::counting`], the benchmark's cost model).

use std::time::Duration;

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region, SdkConfig};
use hookline_aws::clients::Clients;

use crate::counting::CallCounter;

/// SDK configuration for `endpoint_url`.
pub async fn local_sdk_config(endpoint_url: &str) -> SdkConfig {
    let credentials =
        aws_sdk_dynamodb::config::Credentials::new("local", "local", None, None, "hookline-local");
    aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint_url)
        .credentials_provider(credentials)
        .retry_config(
            RetryConfig::standard()
                .with_max_attempts(4)
                .with_initial_backoff(Duration::from_millis(50)),
        )
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(3))
                .operation_timeout(Duration::from_secs(30))
                .build(),
        )
        .load()
        .await
}

/// A client of SDK crate `$sdk` whose every request `$counter` counts.
macro_rules! counted {
    ($sdk:ident, $config:expr, $counter:expr) => {
        $sdk::Client::from_conf(
            $sdk::config::Builder::from($config)
                .interceptor($counter.clone())
                .build(),
        )
    };
}

/// The functions' clients, every request counted by `counter` when given.
pub fn function_clients(config: &SdkConfig, counter: Option<&CallCounter>) -> Clients {
    let Some(counter) = counter else {
        return Clients::from_config(config);
    };
    let direct = hookline_aws::clients::DirectClients::of(config);
    Clients {
        dynamodb: counted!(aws_sdk_dynamodb, config, counter).into(),
        dynamodb_http: direct.dynamodb.observed_by(counter.direct_observer()),
        sqs: counted!(aws_sdk_sqs, config, counter).into(),
        sqs_http: direct.sqs.observed_by(counter.direct_observer()),
        kms: direct.kms.observed_by(counter.direct_observer()),
    }
}

/// The event-source pollers' clients (Lambda's mappings when deployed): the
/// table's stream and the queue.
#[derive(Debug, Clone)]
pub struct SourceClients {
    pub streams: aws_sdk_dynamodbstreams::Client,
    pub sqs: aws_sdk_sqs::Client,
}

impl SourceClients {
    pub fn new(config: &SdkConfig, counter: Option<&CallCounter>) -> Self {
        match counter {
            None => Self {
                streams: aws_sdk_dynamodbstreams::Client::new(config),
                sqs: aws_sdk_sqs::Client::new(config),
            },
            Some(counter) => Self {
                streams: counted!(aws_sdk_dynamodbstreams, config, counter),
                sqs: counted!(aws_sdk_sqs, config, counter),
            },
        }
    }
}
