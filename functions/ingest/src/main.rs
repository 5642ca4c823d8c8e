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
                    // The table's storage format is checked by the first
                    // read (the catalog's, which carries the format item)
                    // or else before the first write: a table of another
                    // format fails the first request, naming both.
                    let (store, queue) = hookline_aws::clients::store_and_queue(settings).await?;
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
