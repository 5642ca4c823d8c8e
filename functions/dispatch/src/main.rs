// The instrumented stream handler nests deeply enough for the layout query.
#![recursion_limit = "256"]

use aws_lambda_events::event::dynamodb::Event;
use hookline_aws::clients::{init_tracing, Deps};
use lambda_runtime::{service_fn, Error, LambdaEvent};

// One thread: the work is waiting on I/O, and not starting worker threads
// takes ~0.6 ms off every cold start (BENCHMARKS.md).
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    init_tracing();
    let deps = Deps::from_env()?;
    lambda_runtime::run(service_fn(|event: LambdaEvent<Event>| {
        let deps = &deps;
        async move {
            let (store, queue) = deps.adapters_unchecked().await?;
            let now = chrono::Utc::now();
            let late_after = hookline_pipeline::dispatch::late_after(deps.settings.reconcile_after);
            Ok::<_, Error>(
                hookline_dispatch::handle(store, queue, event.payload, late_after, now).await,
            )
        }
    }))
    .await
}
