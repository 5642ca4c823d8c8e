//! An example receiver Lambda (behind a function URL or API Gateway) built on
//! the receiver kit: a few lines in [`handle`]. What it "processes" is a log
//! line; replace [`process`] with your business logic.

use hookline_pipeline::settings::{ConfigError, Vars};
use hookline_verify::{Receiver, SeenStore, Verified};
use lambda_http::{Body, Request, Response};

/// The receiver's settings, read once at init (a missing one fails the
/// cold start, naming it).
#[derive(Debug, Clone)]
pub struct ReceiverSettings {
    /// `WEBHOOKS_RECEIVER_SECRETS` (required): the endpoint's signing
    /// secret(s), comma-separated during a rotation.
    pub secrets: Vec<String>,
    /// `WEBHOOKS_RECEIVER_TABLE` (required): the seen-store table.
    pub table: String,
    /// `WEBHOOKS_AWS_ENDPOINT_URL`: moto instead of AWS (local runs).
    pub aws_endpoint_url: Option<String>,
    /// `WEBHOOKS_SERIALIZE_DYNAMODB`: one DynamoDB call at a time (moto).
    pub serialize_dynamodb: bool,
}

impl ReceiverSettings {
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let vars = Vars::new(lookup);
        Ok(Self {
            secrets: vars
                .required("WEBHOOKS_RECEIVER_SECRETS")?
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
            table: vars.required("WEBHOOKS_RECEIVER_TABLE")?,
            aws_endpoint_url: vars.get("WEBHOOKS_AWS_ENDPOINT_URL"),
            serialize_dynamodb: vars.flag("WEBHOOKS_SERIALIZE_DYNAMODB")?,
        })
    }
}

/// Your business logic. An error answers 500 and the sender retries.
pub async fn process(verified: Verified, body: &[u8]) -> Result<(), String> {
    let event: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("body is not JSON: {e}"))?;
    tracing::info!(
        message_id = verified.message_id.as_deref().unwrap_or(""),
        event_type = event["type"].as_str().unwrap_or(""),
        "webhook processed"
    );
    Ok(())
}

/// Verify, deduplicate, process.
pub async fn handle<S: SeenStore>(receiver: &Receiver<S>, request: Request) -> Response<Body> {
    let body: Vec<u8> = request.body().as_ref().to_vec();
    receiver
        .handle_lambda(&request, |verified| process(verified, &body))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use hookline_verify::{MemorySeenStore, Verifier};

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    #[test]
    fn settings_name_what_is_missing() {
        let env = [
            ("WEBHOOKS_RECEIVER_SECRETS", " whsec_a, whsec_b ,"),
            ("WEBHOOKS_RECEIVER_TABLE", "seen"),
        ];
        let lookup = |skip: &'static str| {
            move |k: &str| {
                env.iter()
                    .find(|(name, _)| *name == k && *name != skip)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let settings = ReceiverSettings::from_lookup(lookup("")).unwrap();
        assert_eq!(settings.secrets, ["whsec_a", "whsec_b"]);
        assert_eq!(settings.table, "seen");
        for (var, _) in env {
            let err = ReceiverSettings::from_lookup(lookup(var)).unwrap_err();
            assert_eq!(err.to_string(), format!("{var} is required and not set"));
        }
    }

    /// The fixture, re-signed now (its own timestamp is long past the tolerance).
    fn fixture_signed_now() -> String {
        let mut event: serde_json::Value =
            serde_json::from_str(include_str!("../../../events/receiver-webhook.json")).unwrap();
        let body = event["body"].as_str().unwrap().to_owned();
        let id = event["headers"]["webhook-id"].as_str().unwrap().to_owned();
        let secret = hookline_core::signing::Secret::parse(SECRET).unwrap();
        let headers = hookline_core::signing::sign(
            &id,
            chrono::Utc::now().timestamp(),
            body.as_bytes(),
            &[&secret],
            Default::default(),
        )
        .unwrap();
        for (k, v) in headers.iter() {
            event["headers"][k.to_ascii_lowercase()] = serde_json::json!(v);
        }
        event.to_string()
    }

    #[tokio::test]
    async fn fixture_is_processed_once_and_tampering_is_refused() {
        let receiver = Receiver::new(Verifier::new(SECRET).unwrap(), MemorySeenStore::new());
        let signed = fixture_signed_now();
        let response = handle(&receiver, lambda_http::request::from_str(&signed).unwrap()).await;
        assert_eq!(response.status().as_u16(), 200);
        let response = handle(&receiver, lambda_http::request::from_str(&signed).unwrap()).await;
        assert_eq!(response.status().as_u16(), 200);
        assert_eq!(response.body().as_ref(), b"already processed");
        let stale = include_str!("../../../events/receiver-webhook.json");
        let response = handle(&receiver, lambda_http::request::from_str(stale).unwrap()).await;
        assert_eq!(
            response.status().as_u16(),
            401,
            "the fixture's own timestamp is stale"
        );
    }
}
