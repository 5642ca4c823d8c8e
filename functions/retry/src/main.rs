use lambda_runtime::{service_fn, Error, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), Error> {
    hookline_aws::clients::init_tracing();
    let (_settings, store, queue) = hookline_aws::clients::deps_from_env().await?;
    lambda_runtime::run(service_fn(|event: LambdaEvent<serde_json::Value>| {
        let (store, queue) = (&store, &queue);
        async move {
            Ok::<_, Error>(
                hookline_retry::handle(store, queue, event.payload, chrono::Utc::now()).await?,
            )
        }
    }))
    .await
}
