//! The pipeline on one machine: moto as AWS, the four functions' handlers
//! in-process, fed exactly as Lambda would feed them.
//!
//! - [`template`]: reads `template.yaml` (tables, queues, keys, event sources).
//! - [`resources`]: creates them on moto (idempotent).
//! - [`sources`]: Lambda's event source mappings offline (stream -> dispatch,
//!   queue -> deliver), with batch sizes, filters, partial batches, retry limit.
//! - [`clients`]: SDK clients for a local endpoint; [`counting`]: an SDK
//!   interceptor counting every request by operation with estimated DynamoDB
//!   capacity units (the benchmark's cost model).
//! - [`moto`]: a moto server on a free loopback port, stopped by PID.
//! - [`server`]: the local API Gateway (HTTP on loopback -> API Gateway v2
//!   events -> the ingest handler).
//! - [`demo`]: healthy / flaky / dead receivers built on the receiver kit, a
//!   scripted run with live progress, DLQ redrive and a summary.
//! - [`LocalStack`]: creates the template's resources on an endpoint (moto),
//!   builds the handlers from `WEBHOOKS_*` settings, and runs the local event
//!   sources: [`LocalStack::pump`] once, or [`LocalStack::run_pollers`] until
//!   told to stop (with the reconciler on its schedule,
//!   [`LocalStack::reconcile`]). [`LocalStack::call`] sends an API request through the
//!   ingest handler as an API Gateway v2 event.

pub mod clients;
pub mod counting;
pub mod demo;
pub mod moto;
pub mod resources;
pub mod server;
pub mod sources;
pub mod template;

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hookline_aws::clients::Clients;

use crate::clients::{function_clients, local_sdk_config, SourceClients};
pub use crate::resources::LocalResources;
pub use crate::sources::{PollStats, QueueSource, StreamSource};
pub use crate::template::Template;
use aws_sdk_dynamodb::types::AttributeValue;
use hookline_aws::{DynamoStore, SqsQueue};
use hookline_core::ids::{AppId, DeliveryId};
use hookline_core::model::Delivery;
use hookline_ingest::{apigw, Api, ApiKeys};
use hookline_pipeline::deliver::Deliverer;
use hookline_pipeline::ports::{Queue, Store};
use hookline_pipeline::sender::HttpSender;
use hookline_pipeline::Settings;
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::Value;
use tokio::sync::{watch, Mutex};

/// Errors of the local tooling (setup problems, not pipeline errors).
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("template: {0}")]
    Template(String),
    /// An AWS call (to moto) failed.
    #[error("{op} failed")]
    Aws {
        op: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// Something the local stack needs is missing or malformed.
    #[error("{0}")]
    Setup(String),
    #[error("settings")]
    Settings(#[from] hookline_pipeline::settings::ConfigError),
    #[error("building the HTTP client")]
    Http(#[from] reqwest::Error),
}

pub(crate) fn aws_err(op: &str, err: impl std::error::Error + Send + Sync + 'static) -> LocalError {
    LocalError::Aws {
        op: op.to_owned(),
        source: Box::new(err),
    }
}

/// An HTTP answer of the API: status, headers, JSON body (`Null` if not JSON).
pub type ApiAnswer = (u16, HashMap<String, String>, Value);

/// The local pipeline.
#[allow(missing_debug_implementations)]
pub struct LocalStack {
    pub clients: Clients,
    pub resources: LocalResources,
    pub settings: Settings,
    pub store: DynamoStore,
    pub queue: SqsQueue,
    pub api: Api<DynamoStore, SqsQueue>,
    pub deliverer: Deliverer<DynamoStore, SqsQueue, HttpSender>,
    pub admin_key: String,
    /// The deliver mapping's execution environments in
    /// [`Self::run_pollers`]: one per `MaximumConcurrency`, each with its
    /// own process state (caches, limiter slots, reachability) and one
    /// batch at a time, as Lambda runs them.
    environments: Vec<Deliverer<DynamoStore, SqsQueue, HttpSender>>,
    stream: Mutex<StreamSource>,
    /// The dispatch mapping's on-failure destination (metadata of dropped batches).
    pub stream_failure_queue: Option<String>,
    queue_source: QueueSource,
    checkpoint_file: Option<PathBuf>,
}

/// How to build a [`LocalStack`].
#[derive(Debug, Clone)]
pub struct LocalConfig {
    /// The AWS endpoint (moto), e.g. `http://127.0.0.1:5000`.
    pub endpoint_url: String,
    pub template: PathBuf,
    /// Resource names are `{prefix}{LogicalId}`.
    pub prefix: String,
    /// `WEBHOOKS_*` values; the table and queue variables are filled in.
    pub env: HashMap<String, String>,
    pub admin_key: String,
    /// Where the stream checkpoints survive a restart (a crashed worker
    /// resumes after the last handled record, like Lambda's mapping).
    pub checkpoint_file: Option<PathBuf>,
    /// Count every AWS request (the benchmark): the functions' requests and
    /// the event-source pollers' (Lambda's mappings when deployed) apart.
    pub counters: Option<LocalCounters>,
}

/// Request counters of a [`LocalStack`].
#[derive(Debug, Clone, Default)]
pub struct LocalCounters {
    /// Requests the four functions' code makes (and resource setup).
    pub functions: crate::counting::CallCounter,
    /// Requests of the stream and queue pollers (event source mappings).
    pub event_sources: crate::counting::CallCounter,
}

impl LocalStack {
    pub async fn start(config: LocalConfig) -> Result<Self, LocalError> {
        let sdk = local_sdk_config(&config.endpoint_url).await;
        let counters = config.counters.as_ref();
        let clients = function_clients(&sdk, counters.map(|c| &c.functions));
        let source_clients = SourceClients::new(&sdk, counters.map(|c| &c.event_sources));
        let template = Template::load(&config.template)?;
        let kms = aws_sdk_kms::Client::new(&sdk);
        let resources = LocalResources::create(&template, &clients, &kms, &config.prefix).await?;
        let mut vars = config.env.clone();
        let pick = |map: &HashMap<String, String>, k: &str| {
            map.get(k)
                .cloned()
                .ok_or_else(|| LocalError::Template(format!("template has no `{k}`")))
        };
        vars.insert("WEBHOOKS_TABLE".into(), pick(&resources.tables, "Table")?);
        vars.insert(
            "WEBHOOKS_QUEUE_URL".into(),
            pick(&resources.queue_urls, "DeliveryQueue")?,
        );
        vars.insert(
            "WEBHOOKS_DLQ_URL".into(),
            pick(&resources.queue_urls, "DeadLetterQueue")?,
        );
        vars.insert(
            "WEBHOOKS_KMS_KEY_ID".into(),
            pick(&resources.kms_keys, "SecretsKey")?,
        );
        let settings = Settings::from_lookup(|k| vars.get(k).cloned())?;
        // moto loses writes under concurrent transactions: one DynamoDB call at a time.
        let serial = hookline_aws::serial::Serial::one_at_a_time();
        let store = DynamoStore::new(&clients, settings.table.clone(), settings.retention)
            .serialized(serial.clone())
            .sealed_with(Arc::new(hookline_aws::sealing::SecretSealer::new(
                clients.kms.clone(),
                pick(&resources.kms_keys, "SecretsKey")?,
            )));
        let queue = SqsQueue::new(
            &clients,
            settings.queue_url.clone(),
            settings.dlq_url.clone(),
        );
        let dispatch_source = template
            .event_source("DispatchFunction")
            .ok_or_else(|| LocalError::Template("DispatchFunction has no stream event".into()))?;
        let deliver_source = template
            .event_source("DeliverFunction")
            .ok_or_else(|| LocalError::Template("DeliverFunction has no queue event".into()))?;
        let stream_failure_queue = dispatch_source
            .on_failure
            .as_ref()
            .and_then(|logical| resources.queue_urls.get(logical).cloned());
        let mut stream = StreamSource::new(
            source_clients.streams.clone(),
            pick(&resources.stream_arns, "Table")?,
            &dispatch_source,
            serial,
        );
        if let Some(path) = &config.checkpoint_file {
            if let Ok(text) = std::fs::read_to_string(path) {
                stream.restore_checkpoints(&text);
            }
        }
        let queue_source = QueueSource::new(
            source_clients.sqs.clone(),
            pick(&resources.queue_urls, "DeliveryQueue")?,
            pick(&resources.queue_arns, "DeliveryQueue")?,
            &deliver_source,
        );
        // Lambda's default for an SQS mapping without a cap is far above
        // what a laptop runs; the template sets one.
        let environments = (0..deliver_source.maximum_concurrency.unwrap_or(10).max(1))
            .map(|_| {
                Ok(Deliverer::new(
                    store.clone(),
                    queue.clone(),
                    HttpSender::new(settings.allow_private_endpoints)?,
                    settings.clone(),
                ))
            })
            .collect::<Result<Vec<_>, LocalError>>()?;
        let sender = HttpSender::new(settings.allow_private_endpoints)?;
        let api = Api::new(
            store.clone(),
            queue.clone(),
            settings.clone(),
            ApiKeys::admin(&config.admin_key),
        );
        let deliverer = Deliverer::new(store.clone(), queue.clone(), sender, settings.clone());
        Ok(Self {
            clients,
            resources,
            settings,
            store,
            queue,
            api,
            deliverer,
            environments,
            admin_key: config.admin_key,
            stream: Mutex::new(stream),
            stream_failure_queue,
            queue_source,
            checkpoint_file: config.checkpoint_file,
        })
    }

    /// One API request through the ingest handler, authenticated with the admin key.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        extra: &[(&str, &str)],
    ) -> ApiAnswer {
        let mut headers = vec![
            (
                "authorization".to_owned(),
                format!("Bearer {}", self.admin_key),
            ),
            ("content-type".to_owned(), "application/json".to_owned()),
        ];
        headers.extend(
            extra
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        let body = body.map(|b| b.to_string());
        self.raw_call(method, path, &headers, body.as_deref()).await
    }

    /// One API request with exactly these headers.
    pub async fn raw_call(
        &self,
        method: &str,
        path: &str,
        headers: &[(String, String)],
        body: Option<&str>,
    ) -> ApiAnswer {
        let request = match apigw::http_request(method, path, headers, body) {
            Ok(r) => r,
            Err(e) => {
                return (
                    400,
                    HashMap::new(),
                    serde_json::to_value(hookline_ingest::views::ErrorBody::new("bad_request", e))
                        .expect("an error body serialises"),
                )
            }
        };
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
        let bytes: &[u8] = response.body().as_ref();
        (
            status,
            headers,
            serde_json::from_slice(bytes).unwrap_or(Value::Null),
        )
    }

    /// One round of the event sources: the stream into dispatch, then one
    /// receive (waiting up to `wait_secs`) from the queue into deliver.
    pub async fn pump_with_wait(
        &self,
        wait_secs: i32,
    ) -> Result<(PollStats, PollStats), LocalError> {
        let stream = self.pump_stream().await?;
        let queued = self.pump_queue(&self.deliverer, wait_secs).await?;
        Ok((stream, queued))
    }

    /// One poll of the table's stream into dispatch.
    async fn pump_stream(&self) -> Result<PollStats, LocalError> {
        let (store, queue) = (&self.store, &self.queue);
        let late_after = hookline_pipeline::dispatch::late_after(self.settings.reconcile_after);
        let stream = {
            let mut source = self.stream.lock().await;
            let stats = source
                .poll(|event| async move {
                    hookline_dispatch::handle(store, queue, event, late_after, chrono::Utc::now())
                        .await
                })
                .await?;
            if let Some(path) = &self.checkpoint_file {
                let _ = std::fs::write(path, source.checkpoints_json());
            }
            for metadata in source.take_dropped() {
                tracing::warn!(%metadata, "stream batch given up on after MaximumRetryAttempts");
                if let Some(url) = &self.stream_failure_queue {
                    self.clients
                        .sqs
                        .send_message()
                        .queue_url(url)
                        .message_body(metadata.to_string())
                        .send()
                        .await
                        .map_err(|e| aws_err("SendMessage (on-failure destination)", e))?;
                }
            }
            stats
        };
        Ok(stream)
    }

    /// One receive (waiting up to `wait_secs`) from the queue into
    /// `deliverer`: one batch, one invocation.
    async fn pump_queue(
        &self,
        deliverer: &Deliverer<DynamoStore, SqsQueue, HttpSender>,
        wait_secs: i32,
    ) -> Result<PollStats, LocalError> {
        self.queue_source
            .poll(wait_secs, |event| async move {
                hookline_deliver::handle(deliverer, event).await
            })
            .await
    }

    /// [`Self::pump_with_wait`] without waiting on an empty queue.
    pub async fn pump(&self) -> (PollStats, PollStats) {
        match self.pump_with_wait(0).await {
            Ok(stats) => stats,
            Err(err) => {
                tracing::warn!(error = %err, "poll failed");
                (PollStats::default(), PollStats::default())
            }
        }
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

    /// One run of the reconcile function (the template's schedule when
    /// deployed; [`Self::run_pollers`] runs it every
    /// `WEBHOOKS_RECONCILE_INTERVAL`).
    pub async fn reconcile(
        &self,
    ) -> Result<hookline_pipeline::reconcile::ReconcileReport, hookline_pipeline::PipelineError>
    {
        self.reconcile_at(chrono::Utc::now()).await
    }

    /// One run of the reconcile function as if the time were `now` (the
    /// bench runs it past every event's cutoff to count a whole sweep).
    pub async fn reconcile_at(
        &self,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<hookline_pipeline::reconcile::ReconcileReport, hookline_pipeline::PipelineError>
    {
        hookline_reconcile::handle(
            &self.store,
            &self.queue,
            &self.settings,
            Value::Null,
            now,
            hookline_reconcile::DEFAULT_BUDGET,
        )
        .await
    }

    /// Runs the event sources, and the reconciler on its interval, until
    /// `stop` turns true: the stream into dispatch, and the queue into as
    /// many deliver environments at once as the mapping's
    /// `MaximumConcurrency` (each one batch at a time: a batch with a slow
    /// request holds its environment, as it holds a Lambda invocation).
    pub async fn run_pollers(&self, stop: watch::Receiver<bool>) {
        let dispatch = {
            let mut stop = stop.clone();
            async move {
                let mut next_reconcile = Instant::now() + self.settings.reconcile_interval;
                while !*stop.borrow() {
                    if Instant::now() >= next_reconcile {
                        next_reconcile = Instant::now() + self.settings.reconcile_interval;
                        if let Err(err) = self.reconcile().await {
                            tracing::warn!(error = %err, "reconciler run failed; next run retries");
                        }
                    }
                    let idle = match self.pump_stream().await {
                        Ok(stats) => stats.records == 0,
                        Err(err) => {
                            tracing::warn!(error = %err, "stream poll failed; retrying");
                            true
                        }
                    };
                    if idle {
                        tokio::select! {
                            () = tokio::time::sleep(Duration::from_millis(200)) => {}
                            _ = stop.changed() => {}
                        }
                    }
                }
            }
        };
        let deliver = self.environments.iter().map(|deliverer| {
            let mut stop = stop.clone();
            async move {
                while !*stop.borrow() {
                    tokio::select! {
                        result = self.pump_queue(deliverer, 1) => {
                            if let Err(err) = result {
                                tracing::warn!(error = %err, "queue poll failed; retrying");
                                tokio::time::sleep(Duration::from_millis(500)).await;
                            }
                        }
                        _ = stop.changed() => {}
                    }
                }
            }
        });
        futures::future::join(dispatch, futures::future::join_all(deliver)).await;
    }

    /// The dispatch function's next input: new stream records matching its
    /// filters, as one Lambda DynamoDB event (JSON). Advances (and persists)
    /// the checkpoint. For `sam local invoke` of the real function.
    pub async fn next_stream_event(&self) -> Result<Value, LocalError> {
        let captured = std::sync::Mutex::new(Vec::<Value>::new());
        {
            let mut source = self.stream.lock().await;
            source
                .poll(|event| {
                    let records = serde_json::to_value(&event)
                        .ok()
                        .and_then(|v| v.get("Records").cloned());
                    if let Some(Value::Array(records)) = records {
                        captured
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .extend(records);
                    }
                    async { Default::default() }
                })
                .await?;
            if let Some(path) = &self.checkpoint_file {
                let _ = std::fs::write(path, source.checkpoints_json());
            }
        }
        let records = captured.into_inner().unwrap_or_else(|p| p.into_inner());
        Ok(serde_json::json!({"Records": records}))
    }

    /// The deliver function's next input: one receive from the queue as a
    /// Lambda SQS event (JSON). The messages stay hidden for the visibility
    /// timeout; nothing deletes them (the invoked function's result decides).
    pub async fn next_queue_event(&self, wait_secs: i32) -> Result<Value, LocalError> {
        let messages = self.queue_source.receive(wait_secs).await?;
        Ok(self.queue_source.event_json(&messages))
    }

    /// A delivery by id alone (tests): its app is its event's (a listed
    /// delivery's id names its event), or that of its item, found by a
    /// scan of the local table.
    pub async fn delivery(&self, id: &str) -> Option<Delivery> {
        let id = DeliveryId::parse(id).ok()?;
        // An id that does not name its event may still look as if it did.
        let by_event = match id.fanout_origin() {
            Some((event, _)) => self.app_of_item(event.as_str()).await,
            None => None,
        };
        let app = match by_event {
            Some(app) => app,
            None => self.app_of_item(id.as_str()).await?,
        };
        self.store.get_delivery(&app, &id).await.ok().flatten()
    }

    /// The app of the item whose sort key is `sk` (an event or delivery id).
    async fn app_of_item(&self, sk: &str) -> Option<AppId> {
        let mut start = None;
        loop {
            let page = self
                .store
                .client()
                .scan()
                .table_name(self.store.table())
                .filter_expression("SK = :id")
                .expression_attribute_values(":id", AttributeValue::S(sk.to_owned()))
                .set_exclusive_start_key(start)
                .send()
                .await
                .ok()?;
            if let Some(item) = page.items.unwrap_or_default().into_iter().next() {
                return AppId::parse(item.get("app_id")?.as_s().ok()?).ok();
            }
            start = Some(page.last_evaluated_key.filter(|k| !k.is_empty())?);
        }
    }

    pub async fn dlq_depth(&self) -> u64 {
        self.queue.dlq_depth().await.unwrap_or(0)
    }

    /// Shortens the delivery queue's visibility timeout (tests of crashes:
    /// messages a killed worker held come back sooner).
    pub async fn set_queue_visibility(&self, seconds: u32) -> Result<(), LocalError> {
        self.clients
            .sqs
            .set_queue_attributes()
            .queue_url(&self.settings.queue_url)
            .attributes(
                aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout,
                seconds.to_string(),
            )
            .send()
            .await
            .map_err(|e| aws_err("SetQueueAttributes", e))?;
        Ok(())
    }
}

/// The workspace's `template.yaml`, found from the current directory upwards.
pub fn find_template() -> Option<PathBuf> {
    let mut dir = std::env::current_dir().ok()?;
    loop {
        let candidate = dir.join("template.yaml");
        if candidate.exists() {
            return Some(candidate);
        }
        if !dir.pop() {
            return None;
        }
    }
}

/// `WEBHOOKS_*` variables of the process environment.
pub fn webhooks_env() -> HashMap<String, String> {
    std::env::vars()
        .filter(|(k, _)| k.starts_with("WEBHOOKS_"))
        .collect()
}
