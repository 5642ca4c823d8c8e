use hookline_aws::seen::DynamoSeenStore;
use hookline_receiver_example::ReceiverSettings;
use hookline_verify::{Receiver, Verifier};
use lambda_http::{service_fn, Error, Request};

#[tokio::main]
async fn main() -> Result<(), Error> {
    hookline_aws::clients::init_tracing();
    let settings = ReceiverSettings::from_lookup(|k| std::env::var(k).ok())?;
    let verifier = Verifier::with_secrets(settings.secrets.iter().map(String::as_str))?;
    let aws = hookline_aws::clients::AwsEnvironment::from_env()?;
    let config = hookline_aws::clients::sdk_config(&aws, settings.aws_endpoint_url.as_deref());
    let mut store = DynamoSeenStore::new(
        hookline_aws::clients::DynamoDbClient::new(&config),
        settings.table,
    );
    if settings.serialize_dynamodb {
        store = store.serialized(hookline_aws::serial::Serial::one_at_a_time());
    }
    let receiver = Receiver::new(verifier, store);
    lambda_http::run(service_fn(|request: Request| {
        let receiver = &receiver;
        async move { Ok::<_, Error>(hookline_receiver_example::handle(receiver, request).await) }
    }))
    .await
}
