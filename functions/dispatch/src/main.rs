// The instrumented stream handler nests deeply enough for the layout query.
#![recursion_limit = "256"]

use aws_lambda_events::event::dynamodb::Event;
use lambda_runtime::{service_fn, Error, LambdaEvent};
use tokio::sync::OnceCell;

#[tokio::main]
async fn main() -> Result<(), Error> {
    hookline_aws::clients::init_tracing();
    // Settings checked at init; AWS clients built on the first batch.
    let settings = hookline_aws::clients::settings_from_env()?;
    let deps = OnceCell::new();
    lambda_runtime::run(service_fn(|event: LambdaEvent<Event>| {
        let (deps, settings) = (&deps, &settings);
        async move {
            let (store, queue) = deps
                .get_or_init(|| hookline_aws::clients::store_and_queue(settings))
                .await;
            Ok::<_, Error>(
                hookline_dispatch::handle(store, queue, event.payload, chrono::Utc::now()).await,
            )
        }
    }))
    .await
}
