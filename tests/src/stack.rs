//! A [`LocalStack`] on its own moto server, for one test.

use std::collections::HashMap;
use std::ops::Deref;

use hookline_core::model::Delivery;
use hookline_local::{LocalConfig, LocalStack};
use serde_json::Value;

use crate::moto::Moto;
use crate::workspace_root;

pub const ADMIN_KEY: &str = "test-admin-key";

/// Installs a log subscriber once (`RUST_LOG`, shown with `--nocapture`).
pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

/// Moto plus the local pipeline on it. Derefs to [`LocalStack`].
#[allow(missing_debug_implementations)]
pub struct Stack {
    pub local: LocalStack,
    pub moto: Moto,
}

impl Deref for Stack {
    type Target = LocalStack;
    fn deref(&self) -> &LocalStack {
        &self.local
    }
}

/// Test defaults: loopback receivers allowed, a compressed schedule.
pub fn test_env(overrides: &[(&str, &str)]) -> HashMap<String, String> {
    let mut vars: HashMap<String, String> = HashMap::from([
        ("WEBHOOKS_ALLOW_PRIVATE_ENDPOINTS".into(), "true".into()),
        ("WEBHOOKS_RETRY_SCHEDULE".into(), "1s,1s,1s".into()),
        ("WEBHOOKS_DELIVERY_TIMEOUT".into(), "2s".into()),
    ]);
    for (k, v) in overrides {
        vars.insert((*k).into(), (*v).into());
    }
    vars
}

impl Stack {
    /// The store of a new Lambda container on `clients` (the stack's, or
    /// ones observed by a test): its own sealer, with its own data keys.
    pub fn container_store(
        &self,
        clients: &hookline_aws::clients::Clients,
    ) -> (
        hookline_aws::DynamoStore,
        std::sync::Arc<hookline_aws::sealing::SecretSealer>,
    ) {
        let sealer = std::sync::Arc::new(hookline_aws::sealing::SecretSealer::new(
            clients.kms.clone(),
            self.settings
                .kms_key_id
                .clone()
                .expect("the stack has a KMS key"),
        ));
        let store = hookline_aws::DynamoStore::new(
            clients,
            self.settings.table.clone(),
            self.settings.retention,
        )
        .sealed_with(sealer.clone());
        (store, sealer)
    }

    /// Starts moto and the local pipeline with `env` overrides.
    pub async fn start(env: &[(&str, &str)]) -> Self {
        Self::start_with(env, None).await
    }

    /// [`Self::start`], counting every AWS request the functions (and the
    /// test, through `stack.store`) make.
    pub async fn start_counted(
        env: &[(&str, &str)],
    ) -> (Self, hookline_local::counting::CallCounter) {
        let counters = hookline_local::LocalCounters::default();
        let functions = counters.functions.clone();
        (Self::start_with(env, Some(counters)).await, functions)
    }

    async fn start_with(
        env: &[(&str, &str)],
        counters: Option<hookline_local::LocalCounters>,
    ) -> Self {
        init_logs();
        let moto = crate::moto::start();
        let local = LocalStack::start(LocalConfig {
            endpoint_url: moto.url.clone(),
            template: workspace_root().join("template.yaml"),
            prefix: "hookline-".into(),
            env: test_env(env),
            admin_key: ADMIN_KEY.into(),
            checkpoint_file: None,
            counters,
        })
        .await
        .expect("local stack on moto");
        Self { local, moto }
    }

    /// One request with `key` as the bearer token: status and body.
    pub async fn call_as(
        &self,
        key: &str,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let headers = vec![
            ("authorization".to_owned(), format!("Bearer {key}")),
            ("content-type".to_owned(), "application/json".to_owned()),
        ];
        let body = body.map(|b| b.to_string());
        let (status, _, value) = self.raw_call(method, path, &headers, body.as_deref()).await;
        (status, value)
    }

    /// A new API key scoped to `app` (made with the admin key): (id, key).
    pub async fn new_key(&self, app: &str) -> (String, String) {
        let (status, _, body) = self
            .call(
                "POST",
                &format!("/v1/apps/{app}/api-keys"),
                Some(serde_json::json!({"name": format!("{app} service")})),
                &[],
            )
            .await;
        assert_eq!(status, 201, "{body}");
        let created: hookline_ingest::views::ApiKeyOut = crate::view(&body);
        (created.id, created.key.expect("the key, once"))
    }

    /// Creates an endpoint; returns (id, secret).
    pub async fn create_endpoint(
        &self,
        app: &str,
        url: &str,
        event_types: &[&str],
    ) -> (String, String) {
        let (status, _, body) = self
            .call(
                "POST",
                &format!("/v1/apps/{app}/endpoints"),
                Some(serde_json::json!({"url": url, "event_types": event_types})),
                &[],
            )
            .await;
        assert_eq!(status, 201, "{body}");
        (
            body["id"].as_str().unwrap_or_default().to_owned(),
            body["secret"].as_str().unwrap_or_default().to_owned(),
        )
    }

    /// Subscribes `receiver` to every event of `app` and gives it the
    /// endpoint's secret (so it verifies signatures); returns (id, secret).
    pub async fn subscribe(
        &self,
        app: &str,
        receiver: &crate::receiver::Receiver,
    ) -> (String, String) {
        let (id, secret) = self.create_endpoint(app, &receiver.url, &[]).await;
        receiver.set_secret(&secret);
        (id, secret)
    }

    /// A call on endpoint `ep` of `app` (`suffix` after its path, e.g.
    /// `/rotate-secret`, or empty): status and body.
    pub async fn endpoint_call(
        &self,
        method: &str,
        app: &str,
        ep: &dyn std::fmt::Display,
        suffix: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let path = format!("/v1/apps/{app}/endpoints/{ep}{suffix}");
        let (status, _, body) = self.call(method, &path, body, &[]).await;
        (status, body)
    }

    /// Sends an event; returns (status, body).
    pub async fn send_event(
        &self,
        app: &str,
        event_type: &str,
        payload: Value,
        idempotency_key: Option<&str>,
    ) -> (u16, Value) {
        let extra: Vec<(&str, &str)> = idempotency_key
            .map(|k| ("idempotency-key", k))
            .into_iter()
            .collect();
        let (status, _, body) = self
            .call(
                "POST",
                &format!("/v1/apps/{app}/events"),
                Some(serde_json::json!({"event_type": event_type, "payload": payload})),
                &extra,
            )
            .await;
        (status, body)
    }

    /// Pumps the event sources until every delivery in `ids` has `status`
    /// (or `timeout` passes); whether they all did.
    pub async fn pump_until_all(
        &self,
        ids: &[String],
        status: hookline_core::model::DeliveryStatus,
        timeout: std::time::Duration,
    ) -> bool {
        self.local
            .pump_until(timeout, || async {
                for id in ids {
                    if self.delivery(id).await.status != status {
                        return false;
                    }
                }
                true
            })
            .await
    }

    /// Pumps the event sources until delivery `id` has `status` (or
    /// `timeout` passes); whether it did.
    pub async fn reaches(
        &self,
        id: &str,
        status: hookline_core::model::DeliveryStatus,
        timeout: std::time::Duration,
    ) -> bool {
        self.pump_until_all(&[id.to_owned()], status, timeout).await
    }

    /// Sends an event that must be accepted (202); its first delivery id.
    pub async fn send_one(&self, app: &str, event_type: &str, payload: Value) -> String {
        let (status, body) = self.send_event(app, event_type, payload, None).await;
        assert_eq!(status, 202, "{body}");
        crate::first_delivery(&body)
    }

    /// `POST /v1/apps/{app}/deliveries/{id}/retry`: its status and body.
    pub async fn retry_delivery(&self, app: &str, id: &str) -> (u16, Value) {
        let path = format!("/v1/apps/{app}/deliveries/{id}/retry");
        let (status, _, body) = self.call("POST", &path, None, &[]).await;
        (status, body)
    }

    /// Every item of the table (a scan stands for an export; tests only).
    pub async fn scan(
        &self,
    ) -> Vec<std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>> {
        self.local
            .clients
            .dynamodb
            .scan()
            .table_name(&self.local.settings.table)
            .send()
            .await
            .expect("Scan on moto")
            .items
            .unwrap_or_default()
    }

    /// The table key (`PK`, `SK`) of an event's item.
    pub fn event_key(app: &str, event_id: &str) -> (String, String) {
        hookline_aws::schema::event_key(
            &hookline_core::ids::AppId::parse(app).expect("an app id"),
            &hookline_core::ids::EventId::parse(event_id).expect("an event id"),
        )
    }

    /// The table key (`PK`, `SK`) of a delivery's item.
    pub fn delivery_key(app: &str, delivery_id: &str) -> (String, String) {
        hookline_aws::schema::delivery_key(
            &hookline_core::ids::AppId::parse(app).expect("an app id"),
            &hookline_core::ids::DeliveryId::parse(delivery_id).expect("a delivery id"),
        )
    }

    /// Empties the delivery queue (every message in it is lost).
    pub async fn purge_delivery_queue(&self) {
        self.clients
            .sqs
            .purge_queue()
            .queue_url(&self.settings.queue_url)
            .send()
            .await
            .expect("purge the delivery queue");
    }

    /// Sets an attribute of a raw item (tests that move clocks or tamper).
    pub async fn set_attribute(
        &self,
        pk: &str,
        sk: &str,
        attribute: &str,
        value: aws_sdk_dynamodb::types::AttributeValue,
    ) {
        use aws_sdk_dynamodb::types::AttributeValue;
        self.local
            .clients
            .dynamodb
            .update_item()
            .table_name(&self.local.settings.table)
            .key("PK", AttributeValue::S(pk.into()))
            .key("SK", AttributeValue::S(sk.into()))
            .update_expression("SET #a = :v")
            .expression_attribute_names("#a", attribute)
            .expression_attribute_values(":v", value)
            .send()
            .await
            .expect("UpdateItem on moto");
    }

    /// The delivery (panics if missing).
    pub async fn delivery(&self, id: &str) -> Delivery {
        self.local
            .delivery(id)
            .await
            .unwrap_or_else(|| panic!("delivery {id} not found"))
    }
}
