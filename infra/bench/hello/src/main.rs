//! The cold-start baseline: a hello-world `lambda_runtime` function, built
//! with the same release profile as hookline's functions.

use lambda_runtime::{service_fn, Error, LambdaEvent};
use serde_json::Value;

// The same runtime flavour as the functions it is the baseline of.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    lambda_runtime::run(service_fn(|event: LambdaEvent<Value>| async move {
        Ok::<Value, Error>(event.payload)
    }))
    .await
}
