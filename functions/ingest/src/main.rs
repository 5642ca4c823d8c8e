use hookline_ingest::{Api, ApiKeys};
use lambda_http::{service_fn, Error, Request};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::sync::OnceCell;

// One thread: the work is waiting on I/O, and not starting worker threads
// takes ~0.6 ms off every cold start (BENCHMARKS.md).
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    hookline_aws::clients::init_tracing();
    // Configuration is checked at init (a bad value fails the cold start);
    // the AWS clients are built on the first request (fast init).
    let settings = hookline_aws::clients::settings_from_env()?;
    let keys = ApiKeys::from_settings(&settings);
    let api = OnceCell::new();
    lambda_http::run(service_fn(|request: Request| {
        let (api, settings, keys) = (&api, &settings, &keys);
        async move {
            let api = api
                .get_or_try_init(|| async {
                    let (store, queue) = hookline_aws::clients::store_and_queue(settings).await?;
                    // A table of another storage format fails the cold start.
                    store.check_format().await?;
                    Ok::<_, Error>(Api::new(store, queue, settings.clone(), keys.clone()))
                })
                .await?;
            let mut rng = StdRng::from_entropy();
            Ok::<_, Error>(
                hookline_ingest::handle(api, request, chrono::Utc::now(), &mut rng).await,
            )
        }
    }))
    .await
}
