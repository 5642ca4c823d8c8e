use lambda_runtime::{service_fn, Error, LambdaEvent};
use tokio::sync::OnceCell;

#[tokio::main]
async fn main() -> Result<(), Error> {
    hookline_aws::clients::init_tracing();
    // Settings checked at init; AWS clients built on the first invocation.
    let settings = hookline_aws::clients::settings_from_env()?;
    let deps = OnceCell::new();
    lambda_runtime::run(service_fn(|event: LambdaEvent<serde_json::Value>| {
        let (deps, settings) = (&deps, &settings);
        async move {
            let (store, queue) = deps
                .get_or_init(|| hookline_aws::clients::store_and_queue(settings))
                .await;
            Ok::<_, Error>(
                hookline_reconcile::handle(
                    store,
                    queue,
                    settings,
                    event.payload,
                    chrono::Utc::now(),
                )
                .await?,
            )
        }
    }))
    .await
}
