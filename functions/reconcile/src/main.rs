// The reconciler's concurrent shard reads nest deeply enough for the layout query.
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
            let budget = hookline_reconcile::budget_until(event.context.deadline, now);
            let report = hookline_reconcile::handle(
                store,
                queue,
                &deps.settings,
                event.payload,
                now,
                budget,
            )
            .await?;
            Ok::<_, Error>(report)
        }
    }))
    .await
}
