// The handler's future (the redrive loop over the direct clients' calls) is
// deeper than rustc's default layout query limit.
#![recursion_limit = "256"]

use hookline_aws::clients::{init_tracing, Deps};
use lambda_runtime::{service_fn, Error, LambdaEvent};

// One thread: the work is waiting on I/O, and not starting worker threads
// takes ~0.6 ms off every cold start (BENCHMARKS.md).
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    init_tracing();
    let deps = Deps::from_env()?;
    lambda_runtime::run(service_fn(|event: LambdaEvent<serde_json::Value>| {
        let deps = &deps;
        async move {
            let (store, queue) = deps.adapters().await?;
            let now = chrono::Utc::now();
            let budget = hookline_retry::budget(event.context.deadline, now);
            Ok::<_, Error>(hookline_retry::handle(store, queue, event.payload, now, budget).await?)
        }
    }))
    .await
}
