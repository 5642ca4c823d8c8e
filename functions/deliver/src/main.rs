use aws_lambda_events::event::sqs::SqsEvent;
use hookline_pipeline::deliver::Deliverer;
use hookline_pipeline::sender::HttpSender;
use lambda_runtime::{service_fn, Error, LambdaEvent};
use tokio::sync::OnceCell;

// One thread: the work is waiting on I/O, and not starting worker threads
// takes ~0.6 ms off every cold start (BENCHMARKS.md).
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    hookline_aws::clients::init_tracing();
    // Settings checked at init; AWS clients and the HTTP client (TLS roots)
    // built on the first batch, so init stays fast.
    let settings = hookline_aws::clients::settings_from_env()?;
    let deliverer = OnceCell::new();
    lambda_runtime::run(service_fn(|event: LambdaEvent<SqsEvent>| {
        let (deliverer, settings) = (&deliverer, &settings);
        async move {
            let deliverer = deliverer
                .get_or_try_init(|| async {
                    let (store, queue) = hookline_aws::clients::store_and_queue(settings).await?;
                    let sender = HttpSender::new(settings.allow_private_endpoints)?;
                    Ok::<_, Error>(Deliverer::new(store, queue, sender, settings.clone()))
                })
                .await?;
            Ok::<_, Error>(hookline_deliver::handle(deliverer, event.payload).await)
        }
    }))
    .await
}
