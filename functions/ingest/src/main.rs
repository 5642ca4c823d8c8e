use hookline_ingest::{Api, ApiKeys};
use lambda_http::{service_fn, Error, Request};
use rand::rngs::StdRng;
use rand::SeedableRng;

#[tokio::main]
async fn main() -> Result<(), Error> {
    hookline_aws::clients::init_tracing();
    let (settings, store, queue) = hookline_aws::clients::deps_from_env().await?;
    let keys = ApiKeys::from_env()?;
    let api = Api {
        store,
        queue,
        settings,
        keys,
    };
    lambda_http::run(service_fn(|request: Request| {
        let api = &api;
        async move {
            let mut rng = StdRng::from_entropy();
            Ok::<_, Error>(
                hookline_ingest::handle(api, request, chrono::Utc::now(), &mut rng).await,
            )
        }
    }))
    .await
}
