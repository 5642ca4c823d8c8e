//! The four functions' handlers on moto, driven step by step: API requests go
//! through the ingest handler as API Gateway events; [`Stack::pump`] runs the
//! local event-source poller once (stream -> dispatch, queue -> deliver).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hookline_aws::clients::{local_sdk_config, Clients};
use hookline_aws::local::{LocalResources, PollStats, QueueSource, StreamSource, Template};
use hookline_aws::{DynamoStore, SqsQueue};
use hookline_core::ids::DeliveryId;
use hookline_core::model::Delivery;
use hookline_ingest::{apigw, Api, ApiKeys};
use hookline_pipeline::deliver::Deliverer;
use hookline_pipeline::ports::{Queue, Store};
use hookline_pipeline::sender::HttpSender;
use hookline_pipeline::Settings;
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::Value;
use tokio::sync::Mutex;

use crate::moto::Moto;
use crate::workspace_root;

pub const ADMIN_KEY: &str = "test-admin-key";

/// Installs a JSON log subscriber once (visible with `--nocapture`).
pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

/// Everything a pipeline test needs.
#[allow(missing_debug_implementations)]
pub struct Stack {
    pub moto: Moto,
    pub clients: Clients,
    pub resources: LocalResources,
    pub settings: Settings,
    pub store: DynamoStore,
    pub queue: SqsQueue,
    pub api: Api<DynamoStore, SqsQueue>,
    pub deliverer: Deliverer<DynamoStore, SqsQueue, HttpSender>,
    stream: Mutex<StreamSource>,
    queue_source: QueueSource,
}

impl Stack {
    /// Starts moto, creates the template's resources, builds the handlers with
    /// `env` (`WEBHOOKS_*` overrides; private endpoints allowed by default).
    pub async fn start(env: &[(&str, &str)]) -> Self {
        init_logs();
        let moto = Moto::start();
        let config = local_sdk_config(&moto.url).await;
        let clients = Clients::from_config(&config);
        let template =
            Template::load(&workspace_root().join("template.yaml")).expect("template.yaml");
        let resources = LocalResources::create(&template, &clients, "hookline-")
            .await
            .expect("create resources");
        let mut vars: HashMap<String, String> = HashMap::from([
            ("WEBHOOKS_TABLE".into(), resources.tables["Table"].clone()),
            (
                "WEBHOOKS_QUEUE_URL".into(),
                resources.queue_urls["DeliveryQueue"].clone(),
            ),
            (
                "WEBHOOKS_DLQ_URL".into(),
                resources.queue_urls["DeadLetterQueue"].clone(),
            ),
            ("WEBHOOKS_ALLOW_PRIVATE_ENDPOINTS".into(), "true".into()),
            ("WEBHOOKS_RETRY_SCHEDULE".into(), "1s,1s,1s".into()),
            ("WEBHOOKS_DELIVERY_TIMEOUT".into(), "2s".into()),
        ]);
        for (k, v) in env {
            vars.insert((*k).into(), (*v).into());
        }
        let settings = Settings::from_lookup(|k| vars.get(k).cloned()).expect("settings");
        let serial = Arc::new(Mutex::new(()));
        let store = DynamoStore::new(
            clients.dynamodb.clone(),
            settings.table.clone(),
            settings.retention,
        )
        .serialized(serial.clone());
        let queue = SqsQueue::new(
            clients.sqs.clone(),
            settings.queue_url.clone(),
            settings.dlq_url.clone(),
        );
        let dispatch_source = template
            .event_source("DispatchFunction")
            .expect("dispatch event source");
        let deliver_source = template
            .event_source("DeliverFunction")
            .expect("deliver event source");
        let stream = StreamSource::new(
            clients.streams.clone(),
            resources.stream_arns["Table"].clone(),
            &dispatch_source,
            Some(serial),
        );
        let queue_source = QueueSource::new(
            clients.sqs.clone(),
            resources.queue_urls["DeliveryQueue"].clone(),
            resources.queue_arns["DeliveryQueue"].clone(),
            &deliver_source,
        );
        let sender = HttpSender::new(settings.allow_private_endpoints).expect("http client");
        let api = Api {
            store: store.clone(),
            queue: queue.clone(),
            settings: settings.clone(),
            keys: ApiKeys::admin(ADMIN_KEY),
        };
        let deliverer = Deliverer::new(store.clone(), queue.clone(), sender, settings.clone());
        Self {
            moto,
            clients,
            resources,
            settings,
            store,
            queue,
            api,
            deliverer,
            stream: Mutex::new(stream),
            queue_source,
        }
    }

    /// One API request through the ingest handler; returns status, headers, JSON body.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        extra: &[(&str, &str)],
    ) -> (u16, HashMap<String, String>, Value) {
        let mut headers = vec![
            ("authorization".to_owned(), format!("Bearer {ADMIN_KEY}")),
            ("content-type".to_owned(), "application/json".to_owned()),
        ];
        headers.extend(
            extra
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        let body = body.map(|b| b.to_string());
        let request = apigw::http_request(method, path, &headers, body.as_deref())
            .expect("API Gateway event");
        let response = hookline_ingest::handle(
            &self.api,
            request,
            chrono::Utc::now(),
            &mut StdRng::from_entropy(),
        )
        .await;
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
            .collect();
        let body: &[u8] = response.body().as_ref();
        let json = serde_json::from_slice(body).unwrap_or(Value::Null);
        (status, headers, json)
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

    /// One round of the local event sources: the stream into dispatch, then
    /// one receive from the queue into deliver.
    pub async fn pump(&self) -> (PollStats, PollStats) {
        let (store, queue) = (&self.store, &self.queue);
        let stream = self
            .stream
            .lock()
            .await
            .poll(|event| async move {
                hookline_dispatch::handle(store, queue, event, chrono::Utc::now()).await
            })
            .await
            .expect("stream poll");
        let deliverer = &self.deliverer;
        let queued = self
            .queue_source
            .poll(0, |event| async move {
                hookline_deliver::handle(deliverer, event).await
            })
            .await
            .expect("queue poll");
        (stream, queued)
    }

    /// Pumps until `done` holds or `timeout` passes; returns whether it held.
    pub async fn pump_until<F, Fut>(&self, timeout: Duration, mut done: F) -> bool
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            let (s, q) = self.pump().await;
            if done().await {
                return true;
            }
            if s.records == 0 && q.records == 0 {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        done().await
    }

    pub async fn delivery(&self, id: &str) -> Delivery {
        let id = DeliveryId::parse(id).expect("delivery id");
        self.store
            .get_delivery(&id)
            .await
            .expect("get delivery")
            .expect("delivery exists")
    }

    pub async fn dlq_depth(&self) -> u64 {
        self.queue.dlq_depth().await.expect("dlq depth")
    }
}
