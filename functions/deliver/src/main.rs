use aws_lambda_events::event::sqs::SqsEvent;
use hookline_pipeline::deliver::Deliverer;
use hookline_pipeline::sender::HttpSender;
use lambda_runtime::{service_fn, Error, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), Error> {
    hookline_aws::clients::init_tracing();
    let (settings, store, queue) = hookline_aws::clients::deps_from_env().await?;
    let sender = HttpSender::new(settings.allow_private_endpoints)?;
    let deliverer = Deliverer::new(store, queue, sender, settings);
    lambda_runtime::run(service_fn(|event: LambdaEvent<SqsEvent>| {
        let deliverer = &deliverer;
        async move { Ok::<_, Error>(hookline_deliver::handle(deliverer, event.payload).await) }
    }))
    .await
}
