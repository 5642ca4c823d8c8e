//! `cpu-probe <aws stub url> <receiver url> <events>`: the CPU time our code
//! spends per delivered webhook. One release process runs the three hot
//! functions' handlers as Lambda would call them (API Gateway request JSON
//! -> ingest; stream records JSON -> dispatch; SQS messages JSON -> deliver,
//! which signs and POSTs to the receiver), with the real SDK clients talking
//! to the bench's stateful AWS stub and the receiver in the bench's process.
//! The probe plays the event sources (it fetches the stub's stream and
//! message logs); that harness work is timed apart and left out.
//!
//! Baselines, same process and run: a bare POST of the same signed body with
//! a plain `reqwest` client (what any webhook sender pays at least), and one
//! bare `GetItem` to the same stub through the functions' direct DynamoDB
//! client and through their AWS SDK configuration: what each of the
//! pipeline's AWS requests costs before any of our code runs.
//!
//! CPU time is the process's main thread from the scheduler
//! (`/proc/thread-self/schedstat`, ns): a current-thread runtime runs every
//! task there. Prints one JSON object.

use std::error::Error;
use std::time::Duration;

use aws_lambda_events::event::dynamodb::Event as StreamEvent;
use aws_lambda_events::event::sqs::SqsEvent;
use aws_sdk_dynamodb::types::AttributeValue;
use chrono::Utc;
use hookline_core::ids::{AppId, EndpointId};
use hookline_core::model::Endpoint;
use hookline_core::signing::{self, Schemes, Secret};
use hookline_ingest::{Api, ApiKeys};
use hookline_pipeline::deliver::Deliverer;
use hookline_pipeline::ports::Store;
use hookline_pipeline::sender::HttpSender;
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::{json, Value};

type BoxError = Box<dyn Error>;

const FIXTURE: &str = include_str!("../../../../events/api-post-event.json");
/// Events per round: one stream batch of up to 100 records per dispatch.
const ROUND: usize = 100;
/// A typical payload (~0.5 KB).
const PAYLOAD: &str = r#"{"order_id":"ord_1042","customer":{"id":"cus_77","email":"ana@example.com"},"items":[{"sku":"SKU-1","qty":2,"price_cents":1990},{"sku":"SKU-2","qty":1,"price_cents":1010}],"amount_cents":4990,"currency":"BRL","paid_at":"2026-12-02T13:20:00Z","metadata":{"channel":"web","campaign":"black-friday"}}"#;

/// CPU-ms per item of `spent` over `n` items.
fn per(spent: Duration, n: usize) -> f64 {
    spent.as_secs_f64() * 1000.0 / n.max(1) as f64
}

/// The median of `values` (robust to a round slowed by another process).
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

fn thread_cpu() -> Duration {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(Duration::ZERO, Duration::from_nanos)
}

/// The API Gateway request for event `n`, as Lambda hands it over (JSON).
fn ingest_request_json(n: usize) -> Result<String, BoxError> {
    let mut request: Value = serde_json::from_str(FIXTURE)?;
    request["rawPath"] = json!("/v1/apps/bench/events");
    request["requestContext"]["http"]["path"] = json!("/v1/apps/bench/events");
    request["headers"]["idempotency-key"] = json!(format!("bench-{}-{n}", std::process::id()));
    request["body"] = json!(format!(
        r#"{{"event_type": "order.paid", "payload": {PAYLOAD}}}"#
    ));
    Ok(request.to_string())
}

/// Stream records (the table's new images) as Lambda hands them over.
fn stream_event_json(images: &[Value], first_seq: usize) -> String {
    let records: Vec<Value> = images
        .iter()
        .enumerate()
        .map(|(i, image)| {
            json!({
                "eventID": format!("{}", first_seq + i),
                "eventName": "INSERT",
                "eventVersion": "1.1",
                "eventSource": "aws:dynamodb",
                "awsRegion": "us-east-1",
                "dynamodb": {
                    "Keys": {"PK": image["PK"], "SK": image["SK"]},
                    "NewImage": image,
                    "SequenceNumber": format!("{:021}", first_seq + i),
                    "SizeBytes": 1000,
                    "StreamViewType": "NEW_AND_OLD_IMAGES"
                }
            })
        })
        .collect();
    json!({ "Records": records }).to_string()
}

/// SQS messages as Lambda hands them over.
fn sqs_event_json(bodies: &[String], first: usize) -> String {
    let records: Vec<Value> = bodies
        .iter()
        .enumerate()
        .map(|(i, body)| {
            json!({
                "messageId": format!("m-{}", first + i),
                "receiptHandle": format!("r-{}", first + i),
                "body": body,
                "attributes": {"ApproximateReceiveCount": "1"},
                "messageAttributes": {},
                "eventSource": "aws:sqs",
                "awsRegion": "us-east-1"
            })
        })
        .collect();
    json!({ "Records": records }).to_string()
}

async fn fetch_log(http: &reqwest::Client, url: &str) -> Result<Vec<Value>, BoxError> {
    Ok(http
        .get(url)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    let [_, aws_url, receiver, events] = args.as_slice() else {
        return Err("usage: cpu-probe <aws stub url> <receiver url> <events>".into());
    };
    let events: usize = events.parse()?;
    let settings = hookline_aws::clients::settings_from_env()?;
    let (store, queue) = hookline_aws::clients::store_and_queue(&settings).await?;
    let mut rng = StdRng::from_entropy();
    let app = AppId::parse("bench")?;
    let endpoint = Endpoint::new(
        EndpointId::generate(),
        app,
        receiver.as_str(),
        Secret::generate(&mut rng),
        Utc::now(),
    );
    store
        .put_endpoint(
            &endpoint,
            hookline_pipeline::settings::MAX_ENDPOINTS_PER_APP_CEILING,
        )
        .await?;
    let api = Api::new(
        store.clone(),
        queue.clone(),
        settings.clone(),
        ApiKeys::from_settings(&settings),
    );
    let sender = HttpSender::new(settings.allow_private_endpoints)?;
    let deliverer = Deliverer::new(store.clone(), queue.clone(), sender, settings.clone());
    let harness = reqwest::Client::new();
    let (mut stream_at, mut messages_at) = (0usize, 0usize);

    // Rounds of ROUND events; the first (warm-up: connections, data key,
    // caches) is not counted.
    // Per counted round: CPU per delivery of [ingest, dispatch, deliver].
    let mut per_round: Vec<[f64; 3]> = Vec::new();
    let mut delivered = 0usize;
    let rounds = events.div_ceil(ROUND) + 1;
    for round in 0..rounds {
        let mut ours = [Duration::ZERO; 3];
        // The requests' JSON made before the clock starts, as the other
        // functions' events are: Lambda hands it over; parsing it is ours.
        let requests = (0..ROUND)
            .map(|n| ingest_request_json(round * ROUND + n))
            .collect::<Result<Vec<_>, _>>()?;
        let mut start = thread_cpu();
        for text in &requests {
            let request = lambda_http::request::from_str(text)?;
            let response = hookline_ingest::handle(&api, request, Utc::now(), &mut rng).await;
            if response.status().as_u16() != 202 {
                return Err(format!("ingest answered {}", response.status()).into());
            }
        }
        ours[0] += thread_cpu().saturating_sub(start);

        let written = fetch_log(&harness, &format!("{aws_url}/_stream?from={stream_at}")).await?;
        stream_at += written.len();
        // The mapping's filters (template.yaml): pending delivery items and
        // new events with a listed fan-out (every write here is an insert).
        let images: Vec<Value> = written
            .into_iter()
            .filter(|image| {
                (image["kind"]["S"] == "delivery" && image["status"]["S"] == "pending")
                    || (image["kind"]["S"] == "event" && image["listed"]["BOOL"] == true)
            })
            .collect();
        let stream_json = stream_event_json(&images, stream_at);
        start = thread_cpu();
        let event: StreamEvent = serde_json::from_str(&stream_json)?;
        // The default WEBHOOKS_RECONCILE_AFTER's: a fresh event is not late.
        let late_after =
            hookline_pipeline::dispatch::late_after(std::time::Duration::from_secs(900));
        let response =
            hookline_dispatch::handle(&store, &queue, event, late_after, Utc::now()).await;
        if !response.batch_item_failures.is_empty() {
            return Err("dispatch reported failures".into());
        }
        ours[1] += thread_cpu().saturating_sub(start);

        let bodies: Vec<String> =
            fetch_log(&harness, &format!("{aws_url}/_messages?from={messages_at}"))
                .await?
                .into_iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect();
        let batches: Vec<String> = bodies
            .chunks(10)
            .enumerate()
            .map(|(i, chunk)| sqs_event_json(chunk, messages_at + i * 10))
            .collect();
        messages_at += bodies.len();
        start = thread_cpu();
        for batch in &batches {
            let event: SqsEvent = serde_json::from_str(batch)?;
            let response = hookline_deliver::handle(&deliverer, event).await;
            if !response.batch_item_failures.is_empty() {
                return Err("deliver reported failures".into());
            }
        }
        ours[2] += thread_cpu().saturating_sub(start);
        if round > 0 {
            per_round.push(ours.map(|spent| per(spent, bodies.len())));
            delivered += bodies.len();
        }
    }

    // Baseline: bare signed POSTs of the same body to the same receiver.
    let bare = reqwest::Client::new();
    let body =
        format!(r#"{{"type":"order.paid","timestamp":"2026-12-02T13:20:00Z","data":{PAYLOAD}}}"#);
    let secrets = [&endpoint.secret];
    let post = |n: usize| {
        let headers = signing::sign(
            &format!("msg_{n}"),
            Utc::now().timestamp(),
            body.as_bytes(),
            &secrets,
            Schemes::default(),
        );
        let mut request = bare.post(receiver.as_str()).body(body.clone());
        if let Ok(headers) = headers {
            for (name, value) in headers.0 {
                request = request.header(name, value);
            }
        }
        request.send()
    };
    for n in 0..ROUND {
        post(n).await?.error_for_status()?;
    }
    let mut bare_rounds = Vec::new();
    for round in 0..per_round.len() {
        let start = thread_cpu();
        for n in 0..ROUND {
            post(round * ROUND + n).await?.error_for_status()?;
        }
        bare_rounds.push(per(thread_cpu().saturating_sub(start), ROUND));
    }

    // Baseline: bare SDK requests, the functions' SDK configuration and
    // HTTP client, to the same stub (an absent item's GetItem).
    let aws = hookline_aws::clients::AwsEnvironment::from_env()?;
    let dynamodb = hookline_aws::clients::DynamoDbClient::new(&hookline_aws::clients::sdk_config(
        &aws,
        Some(aws_url.as_str()),
    ));
    let get = || {
        dynamodb
            .get_item()
            .table_name(&settings.table)
            .key("PK", AttributeValue::S("bench#probe".into()))
            .key("SK", AttributeValue::S("absent".into()))
            .consistent_read(true)
            .send()
    };
    for _ in 0..ROUND {
        get().await?;
    }
    let mut sdk_rounds = Vec::new();
    for _ in 0..per_round.len() {
        let start = thread_cpu();
        for _ in 0..ROUND {
            get().await?;
        }
        sdk_rounds.push(per(thread_cpu().saturating_sub(start), ROUND));
    }

    // Baseline: the same GetItem on the functions' direct DynamoDB client
    // (what the pipeline's DynamoDB requests go through).
    let direct = hookline_aws::clients::Clients::new(&aws, Some(aws_url.as_str())).dynamodb_http;
    for _ in 0..ROUND {
        direct
            .get_item(&settings.table, "bench#probe", "absent")
            .await?;
    }
    let mut direct_rounds = Vec::new();
    for _ in 0..per_round.len() {
        let start = thread_cpu();
        for _ in 0..ROUND {
            direct
                .get_item(&settings.table, "bench#probe", "absent")
                .await?;
        }
        direct_rounds.push(per(thread_cpu().saturating_sub(start), ROUND));
    }

    let function = |i: usize| median(per_round.iter().map(|r| r[i]).collect());
    use std::io::Write;
    writeln!(
        std::io::stdout(),
        "{}",
        json!({
            "deliveries": delivered,
            "rounds": per_round.len(),
            "ours_cpu_ms_per_delivery": median(per_round.iter().map(|r| r.iter().sum()).collect()),
            "ingest_cpu_ms_per_delivery": function(0),
            "dispatch_cpu_ms_per_delivery": function(1),
            "deliver_cpu_ms_per_delivery": function(2),
            "bare_post_cpu_ms_per_delivery": median(bare_rounds),
            "sdk_request_cpu_ms": median(sdk_rounds),
            "direct_request_cpu_ms": median(direct_rounds),
            // The stub counts these too; the bench leaves them out of the
            // pipeline's requests per delivery.
            "baseline_requests": 2 * ROUND * (per_round.len() + 1),
        })
    )?;
    Ok(())
}
