use std::sync::Arc;

use hookline_aws::seen::DynamoSeenStore;
use hookline_verify::{Receiver, Verifier};
use lambda_http::{service_fn, Error, Request};

#[tokio::main]
async fn main() -> Result<(), Error> {
    hookline_aws::clients::init_tracing();
    // Several secrets (comma-separated) during a rotation.
    let secrets = std::env::var("WEBHOOKS_RECEIVER_SECRETS")
        .map_err(|_| "WEBHOOKS_RECEIVER_SECRETS is not set")?;
    let table = std::env::var("WEBHOOKS_RECEIVER_TABLE")
        .map_err(|_| "WEBHOOKS_RECEIVER_TABLE is not set")?;
    let verifier =
        Verifier::with_secrets(secrets.split(',').map(str::trim).filter(|s| !s.is_empty()))?;
    let config = hookline_aws::clients::sdk_config().await;
    let mut store =
        DynamoSeenStore::new(hookline_aws::clients::DynamoDbClient::new(&config), table);
    if hookline_aws::clients::serialize_dynamodb_from_env() {
        store = store.serialized(Arc::new(tokio::sync::Mutex::new(())));
    }
    let receiver = Receiver::new(verifier, store);
    lambda_http::run(service_fn(|request: Request| {
        let receiver = &receiver;
        async move { Ok::<_, Error>(hookline_receiver_example::handle(receiver, request).await) }
    }))
    .await
}
