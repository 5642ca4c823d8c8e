//! A fast, keep-alive AWS stand-in on loopback for cold-start and CPU
//! measurements: it answers the DynamoDB, SQS and KMS JSON-protocol calls the
//! functions make (by `X-Amz-Target`) with minimal valid answers at once, so
//! what is measured is our process, not moto's (slow, single-threaded)
//! request handling. What it keeps no state for, it answers as an empty
//! table would: reads find nothing, writes succeed. It keeps just enough for one pass
//! of the pipeline (the CPU-per-delivery probe): puts (also inside
//! transactions) are stored by key and logged as stream records, `GetItem`,
//! `BatchGetItem` and `Query` (partition key, optional `begins_with` on the sort key) read
//! them back, updates succeed without applying, and sent SQS messages are
//! logged. `GET /_stream?from=N` and `GET /_messages?from=N` hand the logs to
//! the probe (it plays Lambda's event sources). A stateful stub seeded and
//! then [frozen](AwsStub::freeze) is a table in steady state for cold
//! starts: each process finds the items seeded (an endpoint), none of
//! what an earlier process wrote.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};

/// Requests answered, by nobody in particular (a sanity figure).
#[derive(Debug, Clone, Default)]
pub struct AwsStub {
    pub requests: Arc<AtomicU64>,
    /// Each request's operation (`X-Amz-Target`'s last part, with the key's
    /// partition prefix for item reads), in order of arrival.
    pub operations: Arc<Mutex<Vec<String>>>,
    state: Option<Arc<Mutex<Tables>>>,
}

/// The stateful stub's memory.
#[derive(Debug, Default)]
struct Tables {
    /// Items by (PK, SK) as DynamoDB JSON.
    items: BTreeMap<(String, String), Value>,
    /// Every put, in order (the table's stream, new images).
    stream: Vec<Value>,
    /// Every SQS message body sent, in order.
    messages: Vec<String>,
    /// Seeded and frozen ([`AwsStub::freeze`]): reads find what was put
    /// before, writes succeed without being kept.
    frozen: bool,
}

fn key_of(item: &Value) -> (String, String) {
    let text = |name: &str| item[name]["S"].as_str().unwrap_or_default().to_owned();
    (text("PK"), text("SK"))
}

/// DynamoDB's limit of item bytes read per query page (before any filter
/// or projection).
const PAGE_BYTES: usize = 1 << 20;

/// `item` with only the attributes of `request`'s `ProjectionExpression`
/// (`#names` resolved), or whole.
fn project(item: &Value, request: &Value) -> Value {
    let Some(projection) = request["ProjectionExpression"].as_str() else {
        return item.clone();
    };
    let names = &request["ExpressionAttributeNames"];
    let mut out = serde_json::Map::new();
    for attr in projection.split(',').map(str::trim) {
        let name = names[attr].as_str().unwrap_or(attr);
        if let Some(value) = item.get(name) {
            out.insert(name.to_owned(), value.clone());
        }
    }
    Value::Object(out)
}

impl Tables {
    /// A query of the table (not an index): the partition key, then the
    /// sort key's `begins_with` or `BETWEEN` (with `<` for a bound below),
    /// from `ExclusiveStartKey`, a page of at most [`PAGE_BYTES`] read,
    /// `attribute_exists` filters and the projection applied.
    fn query(&self, request: &Value) -> Value {
        let values = &request["ExpressionAttributeValues"];
        let condition = request["KeyConditionExpression"]
            .as_str()
            .unwrap_or_default();
        let text = |name: &str| values[name]["S"].as_str().unwrap_or_default().to_owned();
        let pk = text(":pk");
        let prefix = if condition.contains("begins_with") {
            values
                .as_object()
                .and_then(|m| m.iter().find(|(k, _)| *k != ":pk"))
                .and_then(|(_, v)| v["S"].as_str())
                .unwrap_or_default()
                .to_owned()
        } else {
            String::new()
        };
        let (low, high) = if condition.contains("BETWEEN") {
            let mut bound = condition
                .split("BETWEEN")
                .nth(1)
                .unwrap_or_default()
                .split("AND")
                .map(|name| text(name.trim()));
            (bound.next(), bound.next())
        } else {
            (None, None)
        };
        let start = request
            .get("ExclusiveStartKey")
            .filter(|k| k.is_object())
            .map(key_of);
        let filter = request["FilterExpression"]
            .as_str()
            .and_then(|f| f.strip_prefix("attribute_exists("))
            .and_then(|f| f.strip_suffix(')'));
        let limit = request["Limit"].as_u64().map_or(usize::MAX, |l| l as usize);
        let mut items = Vec::new();
        let (mut read, mut count) = (0usize, 0usize);
        let (mut last, mut truncated) = (None, false);
        for ((p, sk), item) in self.items.range((pk.clone(), String::new())..) {
            if *p != pk {
                break;
            }
            if start.as_ref().is_some_and(|(_, after)| sk <= after)
                || !sk.starts_with(&prefix)
                || low.as_ref().is_some_and(|l| sk < l)
                || high.as_ref().is_some_and(|h| sk > h)
            {
                continue;
            }
            if read >= PAGE_BYTES || count >= limit {
                truncated = true;
                break;
            }
            read += item.to_string().len();
            count += 1;
            last = Some((p.clone(), sk.clone()));
            if filter.is_none_or(|attr| item.get(attr).is_some()) {
                items.push(project(item, request));
            }
        }
        let mut answer = json!({"Items": items, "Count": items.len(), "ScannedCount": count});
        if let (true, Some((p, sk))) = (truncated, last) {
            answer["LastEvaluatedKey"] = json!({"PK": {"S": p}, "SK": {"S": sk}});
        }
        answer
    }

    fn put(&mut self, item: &Value) {
        self.items.insert(key_of(item), item.clone());
        self.stream.push(item.clone());
    }

    /// An `UpdateItem` made only of `SET name = :value` and `SET name =
    /// if_not_exists(name, :value)` clauses (an app's registration and its
    /// sweep marks), conditions not checked; `None` for any other (the
    /// stateless answer: success, nothing kept).
    fn update(&mut self, request: &Value) -> Option<Value> {
        let expression = request["UpdateExpression"].as_str()?.strip_prefix("SET ")?;
        let values = &request["ExpressionAttributeValues"];
        let key = key_of(&request["Key"]);
        let mut item = self
            .items
            .get(&key)
            .cloned()
            .unwrap_or_else(|| request["Key"].clone());
        let mut depth = 0;
        let clauses = expression.split(|c| {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ => {}
            }
            c == ',' && depth == 0
        });
        for clause in clauses {
            let (name, value) = clause.split_once(" = ")?;
            let (name, value) = (name.trim(), value.trim());
            if name.starts_with('#') {
                return None;
            }
            if let Some(inner) = value
                .strip_prefix("if_not_exists(")
                .and_then(|v| v.strip_suffix(')'))
            {
                let (_, given) = inner.split_once(',')?;
                if item.get(name).is_none() {
                    item[name] = values[given.trim()].clone();
                }
            } else if value.starts_with(':') {
                item[name] = values[value].clone();
            } else {
                return None;
            }
        }
        self.put(&item);
        Some(json!({}))
    }

    /// The stateful answer, or `None` to fall back to the stateless one.
    fn answer(&mut self, op: &str, request: &Value) -> Option<Value> {
        if self.frozen && !matches!(op, "GetItem" | "BatchGetItem" | "Query") {
            return None;
        }
        match op {
            "PutItem" => {
                self.put(&request["Item"]);
                Some(json!({}))
            }
            "TransactWriteItems" => {
                for entry in request["TransactItems"].as_array().into_iter().flatten() {
                    if entry.get("Put").is_some() {
                        self.put(&entry["Put"]["Item"]);
                    }
                }
                Some(json!({}))
            }
            "GetItem" => match self.items.get(&key_of(&request["Key"])) {
                Some(item) => Some(json!({"Item": item})),
                // A deployed table's format item and sweep mark (the
                // stateless answers).
                None if is_format_item(&request["Key"]) || is_sweep_mark(&request["Key"]) => None,
                None => Some(json!({})),
            },
            "BatchGetItem" => {
                let mut responses = serde_json::Map::new();
                for (table, asked) in request["RequestItems"].as_object().into_iter().flatten() {
                    let found: Vec<&Value> = asked["Keys"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|key| self.items.get(&key_of(key)))
                        .collect();
                    let found: Vec<Value> =
                        found.into_iter().map(|item| project(item, asked)).collect();
                    responses.insert(table.clone(), json!(found));
                }
                Some(json!({"Responses": responses, "UnprocessedKeys": {}}))
            }
            "Query" if request.get("IndexName").is_none() => Some(self.query(request)),
            "UpdateItem" => self.update(request),
            "SendMessageBatch" => {
                for entry in request["Entries"].as_array().into_iter().flatten() {
                    self.messages
                        .push(entry["MessageBody"].as_str().unwrap_or_default().to_owned());
                }
                None
            }
            "SendMessage" => {
                self.messages.push(
                    request["MessageBody"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                );
                None
            }
            _ => None,
        }
    }
}

/// The endpoint every `events/` fixture delivers to.
pub const FIXTURE_ENDPOINT: &str = "ep_01m8vgw5r0fdnvqj6sdwzakm9j";
/// The table and KMS key of the functions' environment (`init::lambda_env`).
pub const FIXTURE_TABLE: &str = "hookline-Table";
pub const FIXTURE_KMS_KEY: &str = "alias/hookline-SecretsKey";

/// 32 zero bytes, base64: a data key (the stub is no KMS).
const KEY_B64: &str = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";

fn answer(target: &str, request: &Value) -> Value {
    let op = target.rsplit('.').next().unwrap_or_default();
    match op {
        "Query" if is_swept_apps_query(request) => swept_apps(chrono::Utc::now()),
        "Query" | "Scan" => json!({"Items": [], "Count": 0, "ScannedCount": 0}),
        "BatchGetItem" => json!({"Responses": {}, "UnprocessedKeys": {}}),
        "SendMessageBatch" => {
            let ids: Vec<Value> = request["Entries"]
                .as_array()
                .map(|entries| {
                    entries
                        .iter()
                        .enumerate()
                        .map(|(i, e)| {
                            json!({"Id": e["Id"], "MessageId": format!("stub-{i}"),
                                   "MD5OfMessageBody": "00000000000000000000000000000000"})
                        })
                        .collect()
                })
                .unwrap_or_default();
            json!({"Successful": ids, "Failed": []})
        }
        "SendMessage" => {
            json!({"MessageId": "stub", "MD5OfMessageBody": "00000000000000000000000000000000"})
        }
        "ReceiveMessage" => json!({"Messages": []}),
        "GetQueueAttributes" => json!({"Attributes": {
            "ApproximateNumberOfMessages": "0",
            "ApproximateNumberOfMessagesNotVisible": "0"}}),
        "GenerateDataKey" => {
            json!({"KeyId": "stub", "Plaintext": KEY_B64, "CiphertextBlob": KEY_B64})
        }
        "Decrypt" => json!({"KeyId": "stub", "Plaintext": KEY_B64}),
        "GetItem" if is_sweep_mark(&request["Key"]) => sweep_mark(chrono::Utc::now()),
        "GetItem" if is_format_item(&request["Key"]) => format_item(),
        // GetItem (nothing found), PutItem, UpdateItem, DeleteItem,
        // TransactWriteItems, DeleteMessageBatch...: success, no attributes.
        _ => json!({}),
    }
}

/// `op`, with what it reads for a GetItem or BatchGetItem (the key's
/// partition prefix: `GetItem(EVT)`), so a report can say what a first
/// invocation asked for.
fn operation_name(op: &str, request: &Value) -> String {
    let prefix = |key: &Value| {
        let pk = key["PK"]["S"].as_str().unwrap_or("?");
        pk.split('#').next().unwrap_or(pk).to_owned()
    };
    match op {
        "GetItem" => format!("GetItem({})", prefix(&request["Key"])),
        "BatchGetItem" => {
            let mut parts: Vec<String> = request["RequestItems"]
                .as_object()
                .into_iter()
                .flat_map(|tables| tables.values())
                .flat_map(|t| t["Keys"].as_array().into_iter().flatten())
                .map(prefix)
                .collect();
            parts.sort();
            format!("BatchGetItem({})", parts.join("+"))
        }
        other => other.to_owned(),
    }
}

/// Whether `key` is the reconciler's sweep mark item.
fn is_sweep_mark(key: &Value) -> bool {
    key["PK"]["S"] == "RECONCILER" && key["SK"]["S"] == "SWEEP"
}

/// Whether `key` is the table's format item.
fn is_format_item(key: &Value) -> bool {
    key["PK"]["S"] == hookline_aws::schema::FORMAT_PK
        && key["SK"]["S"] == hookline_aws::schema::FORMAT_SK
}

/// The format item of a table of this build's format (a deployed table:
/// its first process wrote it).
fn format_item() -> Value {
    json!({"Item": {"PK": {"S": hookline_aws::schema::FORMAT_PK},
        "SK": {"S": hookline_aws::schema::FORMAT_SK}, "kind": {"S": "format"},
        "format": {"N": hookline_aws::schema::TABLE_FORMAT.to_string()}}})
}

/// Whether `request` reads the apps registered for the sweep.
fn is_swept_apps_query(request: &Value) -> bool {
    request["ExpressionAttributeValues"][":pk"]["S"] == hookline_aws::schema::SWEPT_APPS_PK
}

/// A sweep mark `{position, reached}` of `at`.
fn mark_at(position: String, at: chrono::DateTime<chrono::Utc>) -> Value {
    json!({"M": {"position": {"S": position}, "reached": {"S": at.to_rfc3339()}}})
}

/// The apps registered for the sweep in a deployed table: the fixtures'
/// app, registered a day before `now`, its partitions swept up to a few
/// minutes before (as every run but the very first finds them).
fn swept_apps(now: chrono::DateTime<chrono::Utc>) -> Value {
    let at = now - chrono::TimeDelta::minutes(20);
    let position = hookline_core::ids::EventId::time_floor(at)
        .as_str()
        .to_owned();
    let marks: serde_json::Map<String, Value> = (0..hookline_aws::schema::EVENT_SHARDS)
        .map(|shard| (shard.to_string(), mark_at(position.clone(), at)))
        .collect();
    let item = json!({"PK": {"S": hookline_aws::schema::SWEPT_APPS_PK}, "SK": {"S": "demo"},
        "kind": {"S": hookline_aws::schema::KIND_SWEPT_APP},
        "registered_at": {"S": (now - chrono::TimeDelta::days(1)).to_rfc3339()},
        "marks": {"M": marks}});
    json!({"Items": [item], "Count": 1, "ScannedCount": 1})
}

/// The late-write index's marks of a deployed table whose reconciler ran
/// a few minutes before `now` (every run but the very first finds them).
fn sweep_mark(now: chrono::DateTime<chrono::Utc>) -> Value {
    let at = now - chrono::TimeDelta::minutes(20);
    let mark = |position: String| mark_at(position, at);
    let mut marks = serde_json::Map::new();
    for shard in 0..hookline_aws::schema::DUE_SHARDS {
        marks.insert(
            format!("late/{shard}"),
            mark(hookline_aws::schema::due_time(at)),
        );
    }
    json!({"Item": {"PK": {"S": "RECONCILER"}, "SK": {"S": "SWEEP"}, "kind": {"S": "sweep_mark"},
        "marks": {"M": marks}}})
}

async fn handle(State(stub): State<AwsStub>, headers: HeaderMap, body: Bytes) -> Response {
    stub.requests.fetch_add(1, Ordering::Relaxed);
    let target = headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let op = target.rsplit('.').next().unwrap_or_default();
    if let Ok(mut log) = stub.operations.lock() {
        log.push(operation_name(op, &request));
    }
    let stateful = stub
        .state
        .as_ref()
        .and_then(|state| state.lock().ok()?.answer(op, &request));
    let answer = stateful.unwrap_or_else(|| answer(target, &request));
    let mut response = (StatusCode::OK, answer.to_string()).into_response();
    response.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("application/x-amz-json-1.0"),
    );
    response
}

#[derive(serde::Deserialize)]
struct From {
    #[serde(default)]
    from: usize,
}

async fn stream_log(State(stub): State<AwsStub>, Query(q): Query<From>) -> Response {
    log_page(&stub, |t| t.stream.iter().skip(q.from).cloned().collect())
}

async fn message_log(State(stub): State<AwsStub>, Query(q): Query<From>) -> Response {
    log_page(&stub, |t| {
        t.messages
            .iter()
            .skip(q.from)
            .map(|m| Value::String(m.clone()))
            .collect()
    })
}

fn log_page(stub: &AwsStub, page: impl Fn(&Tables) -> Vec<Value>) -> Response {
    match stub
        .state
        .as_ref()
        .and_then(|s| s.lock().ok().map(|t| page(&t)))
    {
        Some(entries) => axum::Json(entries).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

impl AwsStub {
    /// Serves on an ephemeral loopback port, with state (see the module
    /// documentation); returns its URL.
    pub async fn start_stateful() -> std::io::Result<(Self, String)> {
        Self::serve(Self {
            state: Some(Arc::default()),
            ..Self::default()
        })
        .await
    }

    /// A frozen stateful stub ([`Self::freeze`]) whose table holds the
    /// table's format item and the endpoint the `events/` fixtures name
    /// (`demo`'s [`FIXTURE_ENDPOINT`], all event types, its URL `receiver_url`), put
    /// by the functions' own store code, its secret sealed by their KMS
    /// path (the stub's data key): a deployed table in steady state. Ingest's
    /// fixture event fans out to it; deliver's first attempt opens its
    /// secret and POSTs to `receiver_url`.
    pub async fn start_steady(receiver_url: &str) -> Result<(Self, String), String> {
        use hookline_core::ids::{AppId, EndpointId};
        use hookline_core::model::Endpoint;
        use hookline_core::signing::Secret;
        use hookline_pipeline::ports::Store as _;
        let (stub, url, store, clients) = Self::start_with_store().await?;
        let store = store.sealed_with(std::sync::Arc::new(
            hookline_aws::sealing::SecretSealer::new(clients.kms.clone(), FIXTURE_KMS_KEY),
        ));
        let endpoint = Endpoint::new(
            EndpointId::parse(FIXTURE_ENDPOINT).map_err(|e| e.to_string())?,
            AppId::parse("demo").map_err(|e| e.to_string())?,
            receiver_url,
            Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").map_err(|e| e.to_string())?,
            chrono::Utc::now(),
        );
        store
            .put_endpoint(
                &endpoint,
                hookline_pipeline::settings::MAX_ENDPOINTS_PER_APP_CEILING,
            )
            .await
            .map_err(|e| format!("seeding the stub's endpoint: {e}"))?;
        // The table's format item as an item too (a batch read finds it).
        if let Some(state) = &stub.state {
            hookline_core::sync::lock(state).put(&format_item()["Item"]);
        }
        stub.freeze();
        Ok((stub, url))
    }

    /// A stateful stub's table from now on: what was put so far is read
    /// back, nothing more is kept (every writer finds the table as it was:
    /// repeated cold starts each see the same one).
    /// A stateful stub, and the functions' own store (30 days' retention)
    /// on its URL, with the clients it is built on: for seeding it.
    pub async fn start_with_store() -> Result<
        (
            Self,
            String,
            hookline_aws::DynamoStore,
            hookline_aws::clients::Clients,
        ),
        String,
    > {
        let (stub, url) = Self::start_stateful()
            .await
            .map_err(|e| format!("AWS stub: {e}"))?;
        let config = hookline_local::clients::local_sdk_config(&url).await;
        let clients = hookline_aws::clients::Clients::from_config(&config);
        let store = hookline_aws::DynamoStore::new(
            &clients,
            FIXTURE_TABLE,
            std::time::Duration::from_secs(30 * 86_400),
        );
        Ok((stub, url, store, clients))
    }

    pub fn freeze(&self) {
        if let Some(state) = &self.state {
            hookline_core::sync::lock(state).frozen = true;
        }
    }

    async fn serve(stub: Self) -> std::io::Result<(Self, String)> {
        let app = Router::new()
            .route("/", post(handle))
            .route("/_stream", get(stream_log))
            .route("/_messages", get(message_log))
            .with_state(stub.clone());
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr: SocketAddr = listener.local_addr()?;
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok((stub, format!("http://{addr}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_send_succeeds_entry_by_entry() {
        let a = answer(
            "AmazonSQS.SendMessageBatch",
            &json!({"Entries": [{"Id": "0"}, {"Id": "1"}]}),
        );
        assert_eq!(a["Successful"].as_array().map(Vec::len), Some(2));
        assert_eq!(a["Successful"][1]["Id"], "1");
        assert_eq!(answer("DynamoDB_20120810.GetItem", &Value::Null), json!({}));
    }

    /// The reconciler's marks read as a deployed table's: its sweep of the
    /// fixtures' app's day partitions and of the late-write index starts
    /// minutes back, not a retention back.
    #[test]
    fn the_sweep_marks_are_recent_ones() {
        let key = json!({"Key": {"PK": {"S": "RECONCILER"}, "SK": {"S": "SWEEP"}}});
        let item = answer("DynamoDB_20120810.GetItem", &key)["Item"].clone();
        let late = hookline_aws::schema::late_marks_from_item(
            serde_json::from_value::<serde_dynamo::Item>(item.clone()).unwrap(),
        )
        .unwrap();
        assert_eq!(late.len(), hookline_aws::schema::DUE_SHARDS as usize);
        let query = json!({"KeyConditionExpression": "PK = :pk",
            "ExpressionAttributeValues": {":pk": {"S": hookline_aws::schema::SWEPT_APPS_PK}}});
        let apps = answer("DynamoDB_20120810.Query", &query);
        let app = hookline_aws::schema::swept_app_from_item(
            serde_json::from_value::<serde_dynamo::Item>(apps["Items"][0].clone()).unwrap(),
        )
        .unwrap();
        assert_eq!(app.app_id.as_str(), "demo");
        assert_eq!(app.marks.len(), hookline_aws::schema::EVENT_SHARDS as usize);
        let apps_marks = apps["Items"][0]["marks"]["M"].as_object().unwrap();
        let days = &apps_marks["0"]["M"];
        let at = hookline_core::ids::EventId::parse(days["position"]["S"].as_str().unwrap())
            .unwrap()
            .created_at();
        let reached: chrono::DateTime<chrono::Utc> =
            days["reached"]["S"].as_str().unwrap().parse().unwrap();
        assert!((reached - at).abs() < chrono::TimeDelta::milliseconds(1));
        let age = chrono::Utc::now() - at;
        assert!(age > chrono::TimeDelta::minutes(19) && age < chrono::TimeDelta::minutes(21));
    }

    /// The format item reads as this build's format (what the functions
    /// check on their first read), stateless or stateful.
    #[test]
    fn the_format_item_is_this_builds() {
        let key = json!({"Key": {"PK": {"S": hookline_aws::schema::FORMAT_PK}, "SK": {"S": hookline_aws::schema::FORMAT_SK}}});
        let item = answer("DynamoDB_20120810.GetItem", &key);
        assert_eq!(Tables::default().answer("GetItem", &key), None);
        assert_eq!(
            item["Item"]["format"]["N"],
            hookline_aws::schema::TABLE_FORMAT.to_string()
        );
    }

    #[test]
    fn the_stateful_stub_reads_back_what_was_put() {
        let mut t = Tables::default();
        let ep = json!({"PK": {"S": "APP#a"}, "SK": {"S": "EP#1"}, "id": {"S": "ep_1"}});
        let other = json!({"PK": {"S": "APP#a"}, "SK": {"S": "KEY#1"}});
        t.answer("PutItem", &json!({"Item": ep}));
        t.answer(
            "TransactWriteItems",
            &json!({"TransactItems": [{"Put": {"Item": other}}, {"ConditionCheck": {}}]}),
        );
        let got = t
            .answer(
                "GetItem",
                &json!({"Key": {"PK": {"S": "APP#a"}, "SK": {"S": "EP#1"}}}),
            )
            .unwrap();
        assert_eq!(got["Item"], ep);
        let q = json!({"KeyConditionExpression": "PK = :pk AND begins_with(SK, :ep)",
            "ExpressionAttributeValues": {":pk": {"S": "APP#a"}, ":ep": {"S": "EP#"}}});
        assert_eq!(t.answer("Query", &q).unwrap()["Count"], 1);
        let batch = json!({"RequestItems": {"T": {"Keys": [
            {"PK": {"S": "APP#a"}, "SK": {"S": "EP#1"}},
            {"PK": {"S": "APP#b"}, "SK": {"S": "EP#9"}}]}}});
        assert_eq!(
            t.answer("BatchGetItem", &batch).unwrap()["Responses"]["T"],
            json!([ep])
        );
        assert_eq!(t.stream.len(), 2);
        assert!(t
            .answer(
                "SendMessageBatch",
                &json!({"Entries": [{"MessageBody": "m"}]})
            )
            .is_none());
        assert_eq!(t.messages, ["m"]);

        // Frozen: reads still find it, a write is answered but not kept.
        t.frozen = true;
        let later = json!({"PK": {"S": "APP#a"}, "SK": {"S": "EP#2"}});
        assert_eq!(t.answer("PutItem", &json!({"Item": later})), None);
        assert_eq!(t.answer("Query", &q).expect("an answer")["Count"], 1);
        assert_eq!(t.stream.len(), 2);
        let mark = json!({"Key": {"PK": {"S": "RECONCILER"}, "SK": {"S": "SWEEP"}}});
        assert_eq!(t.answer("GetItem", &mark), None, "the stateless sweep mark");
    }
}
