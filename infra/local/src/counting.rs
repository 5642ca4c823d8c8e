//! Counting every AWS request by operation: an SDK interceptor that the
//! benchmark (and anyone curious) attaches to the clients, and the same
//! count as an observer of the direct DynamoDB client. Each HTTP attempt
//! is counted (retries too: AWS bills them), with an estimate of the
//! DynamoDB capacity the request consumes, from its body:
//!
//! - item size = attribute names + values (DynamoDB's rule); a write costs
//!   one WRU per started KB, twice inside a transaction; each GSI copy of a
//!   written item costs as much again for the two that project ALL (GSI1,
//!   GSI2), one WRU for the KEYS_ONLY overdue index (GSI3); a GSI key
//!   change costs a delete and a put in that index, a removed key a delete;
//! - `UpdateItem` does not carry the whole item: its size is the update's
//!   values plus `UPDATED_ITEM_BASE_BYTES`;
//! - a consistent `GetItem` is 1 RRU per 4 KB, a `Query` at least 0.5 RRU.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;
use serde::Serialize;
use serde_json::Value;

/// Bytes assumed for the unchanged part of an item an `UpdateItem` rewrites
/// (a delivery item with a short attempt log).
pub const UPDATED_ITEM_BASE_BYTES: usize = 700;

/// What one operation cost over a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct OperationCount {
    pub requests: u64,
    /// Estimated DynamoDB write / read request units.
    pub wru: f64,
    pub rru: f64,
}

/// Shared counter: clone it into every client's config.
#[derive(Debug, Clone, Default)]
pub struct CallCounter {
    counts: Arc<Mutex<BTreeMap<String, OperationCount>>>,
}

impl CallCounter {
    /// Counts so far, by `Service.Operation`.
    pub fn snapshot(&self) -> BTreeMap<String, OperationCount> {
        self.counts.lock().map(|c| c.clone()).unwrap_or_default()
    }

    pub fn reset(&self) {
        if let Ok(mut c) = self.counts.lock() {
            c.clear();
        }
    }

    /// The same count for the direct clients (`hookline_aws::aws_json`):
    /// each attempt's operation and body.
    pub fn direct_observer(&self) -> hookline_aws::aws_json::RequestObserver {
        let counter = self.clone();
        std::sync::Arc::new(
            move |operation: hookline_aws::aws_json::Operation, body: &[u8]| {
                let (wru, rru) = if operation.service == hookline_aws::dynamo_http::DYNAMODB {
                    serde_json::from_slice::<Value>(body)
                        .map_or((0.0, 0.0), |body| dynamodb_capacity(operation.name, &body))
                } else {
                    (0.0, 0.0)
                };
                counter.record(
                    format!("{}.{}", operation.service.name, operation.name),
                    wru,
                    rru,
                );
            },
        )
    }

    fn record(&self, op: String, wru: f64, rru: f64) {
        if let Ok(mut c) = self.counts.lock() {
            let entry = c.entry(op).or_default();
            entry.requests += 1;
            entry.wru += wru;
            entry.rru += rru;
        }
    }
}

/// DynamoDB's size of an attribute value (JSON wire form `{"S": ..}` etc.).
fn value_size(v: &Value) -> usize {
    let Some(obj) = v.as_object() else { return 0 };
    let Some((ty, inner)) = obj.iter().next() else {
        return 0;
    };
    match (ty.as_str(), inner) {
        ("S", Value::String(s)) => s.len(),
        // Binary travels as base64; DynamoDB counts the raw bytes.
        ("B", Value::String(s)) => base64_len(s),
        ("N", Value::String(n)) => n.len() / 2 + 1,
        ("BOOL", _) | ("NULL", _) => 1,
        ("L", Value::Array(items)) => 3 + items.iter().map(|i| value_size(i) + 1).sum::<usize>(),
        ("M", Value::Object(map)) => {
            3 + map
                .iter()
                .map(|(k, v)| k.len() + value_size(v) + 1)
                .sum::<usize>()
        }
        ("SS", Value::Array(items)) | ("NS", Value::Array(items)) => {
            items.iter().map(|i| i.as_str().map_or(0, str::len)).sum()
        }
        ("BS", Value::Array(items)) => items.iter().map(|i| i.as_str().map_or(0, base64_len)).sum(),
        _ => 0,
    }
}

/// The length of the bytes a base64 text (with padding) encodes.
fn base64_len(text: &str) -> usize {
    let padding = text.bytes().rev().take_while(|&b| b == b'=').count();
    (text.len() / 4 * 3).saturating_sub(padding)
}

/// DynamoDB's size of an item: attribute names plus values.
pub fn item_size(item: &Value) -> usize {
    item.as_object()
        .map_or(0, |m| m.iter().map(|(k, v)| k.len() + value_size(v)).sum())
}

fn kb_units(bytes: usize, unit: usize) -> f64 {
    bytes.div_ceil(unit).max(1) as f64
}

/// WRU of writing `item` (a put): the table plus each GSI whose key it has.
fn put_wru(item: &Value, factor: f64) -> f64 {
    let units = kb_units(item_size(item), 1024);
    let gsis = ["GSI1PK", "GSI2PK"]
        .iter()
        .filter(|k| item.get(**k).is_some())
        .count() as f64;
    let overdue = if item.get("GSI3PK").is_some() {
        1.0
    } else {
        0.0
    };
    units * factor + units * gsis + overdue
}

fn update_wru(update: &Value, factor: f64) -> f64 {
    let values = update
        .get("ExpressionAttributeValues")
        .and_then(Value::as_object)
        .map_or(0, |m| m.values().map(value_size).sum::<usize>());
    let units = kb_units(values + UPDATED_ITEM_BASE_BYTES, 1024);
    let expression = update
        .get("UpdateExpression")
        .and_then(Value::as_str)
        .unwrap_or("");
    let (set_part, remove_part) = expression
        .split_once(" REMOVE ")
        .unwrap_or((expression, ""));
    let pk = update
        .get("Key")
        .and_then(|k| k.get("PK"))
        .and_then(|pk| pk.get("S"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let gsi = if pk.starts_with("DLV#") {
        // An earlier-shape delivery carries both GSI keys: each update
        // rewrites both GSI copies; a status change (GSI2PK set) also
        // deletes the old GSI2 entry.
        2.0 * units
            + if expression.contains("GSI2PK") {
                1.0
            } else {
                0.0
            }
    } else if pk.starts_with("DLA#") {
        // A delivery in its app's partition is in the by-status index
        // (ALL) only while not delivered: an entry set is written (a move's
        // delete is not known here), one removed is deleted.
        if set_part.contains("GSI2PK") {
            units
        } else if remove_part.contains("GSI2PK") {
            1.0
        } else {
            0.0
        }
    } else {
        0.0
    };
    // The KEYS_ONLY overdue index: an entry set (added or moved: counted as
    // one put, a move's delete is not known here) or removed (one delete).
    let overdue = if set_part.contains("GSI3PK") {
        1.0
    } else {
        0.0
    } + if remove_part.contains("GSI3PK") {
        1.0
    } else {
        0.0
    };
    units * factor + gsi + overdue
}

/// Estimated (WRU, RRU) of one DynamoDB request body.
pub fn dynamodb_capacity(operation: &str, body: &Value) -> (f64, f64) {
    match operation {
        "PutItem" => (body.get("Item").map_or(1.0, |i| put_wru(i, 1.0)), 0.0),
        "UpdateItem" => (update_wru(body, 1.0), 0.0),
        "DeleteItem" => (1.0, 0.0),
        "GetItem" => {
            let consistent = body.get("ConsistentRead").and_then(Value::as_bool) == Some(true);
            (0.0, if consistent { 1.0 } else { 0.5 })
        }
        "Query" => (0.0, 0.5),
        "BatchGetItem" => {
            let rru = body
                .get("RequestItems")
                .and_then(Value::as_object)
                .map_or(0.0, |tables| {
                    tables
                        .values()
                        .map(|t| {
                            let keys = t.get("Keys").and_then(Value::as_array).map_or(0, Vec::len);
                            let consistent =
                                t.get("ConsistentRead").and_then(Value::as_bool) == Some(true);
                            keys as f64 * if consistent { 1.0 } else { 0.5 }
                        })
                        .sum()
                });
            (0.0, rru)
        }
        "TransactWriteItems" => {
            let wru = body
                .get("TransactItems")
                .and_then(Value::as_array)
                .map_or(0.0, |items| {
                    items
                        .iter()
                        .map(|t| {
                            if let Some(put) = t.get("Put") {
                                put.get("Item").map_or(2.0, |i| put_wru(i, 2.0))
                            } else if let Some(update) = t.get("Update") {
                                update_wru(update, 2.0)
                            } else {
                                2.0 // ConditionCheck, Delete
                            }
                        })
                        .sum()
                });
            (wru, 0.0)
        }
        _ => (0.0, 0.0),
    }
}

impl Intercept for CallCounter {
    fn name(&self) -> &'static str {
        "CallCounter"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let (service, operation) = cfg
            .load::<Metadata>()
            .map(|m| (m.service().to_owned(), m.name().to_owned()))
            .unwrap_or_else(|| ("unknown".into(), "unknown".into()));
        let (wru, rru) = if service.eq_ignore_ascii_case("dynamodb") {
            context
                .request()
                .body()
                .bytes()
                .and_then(|b| serde_json::from_slice::<Value>(b).ok())
                .map_or((0.0, 0.0), |body| dynamodb_capacity(&operation, &body))
        } else {
            (0.0, 0.0)
        };
        self.record(format!("{service}.{operation}"), wru, rru);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn capacity_estimates() {
        let item = json!({"PK": {"S": "DLV#x"}, "SK": {"S": "DLV"}, "GSI1PK": {"S": "a"}, "GSI2PK": {"S": "b"}});
        assert_eq!(item_size(&item), 2 + 5 + 2 + 3 + 6 + 1 + 6 + 1);
        assert_eq!(dynamodb_capacity("PutItem", &json!({"Item": item})).0, 3.0);
        let tx = json!({"TransactItems": [{"Put": {"Item": item}}, {"ConditionCheck": {}}]});
        assert_eq!(
            dynamodb_capacity("TransactWriteItems", &tx).0,
            2.0 + 2.0 + 2.0
        );
        let update = json!({"Key": {"PK": {"S": "DLV#x"}}, "UpdateExpression": "SET GSI2PK = :s", "ExpressionAttributeValues": {":s": {"S": "x"}}});
        assert_eq!(dynamodb_capacity("UpdateItem", &update).0, 1.0 + 2.0 + 1.0);
        // A delivery in its app's partition: its by-status copy only while
        // not delivered.
        let delivered = json!({"PK": {"S": "DLA#a#1"}, "SK": {"S": "x"}});
        assert_eq!(
            dynamodb_capacity("PutItem", &json!({"Item": delivered})).0,
            1.0
        );
        let failing = json!({"Key": {"PK": {"S": "DLA#a#1"}}, "UpdateExpression": "SET GSI2PK = :s, GSI2SK = :t", "ExpressionAttributeValues": {":s": {"S": "x"}, ":t": {"S": "y"}}});
        assert_eq!(dynamodb_capacity("UpdateItem", &failing).0, 1.0 + 1.0);
        let done = json!({"Key": {"PK": {"S": "DLA#a#1"}}, "UpdateExpression": "SET a = :s REMOVE GSI2PK, GSI2SK", "ExpressionAttributeValues": {":s": {"S": "x"}}});
        assert_eq!(dynamodb_capacity("UpdateItem", &done).0, 1.0 + 1.0);
        assert_eq!(
            dynamodb_capacity("GetItem", &json!({"ConsistentRead": true})).1,
            1.0
        );
        // Binary counts its raw bytes, not its base64 text.
        let blob = json!({"b": {"B": "AAECAwQ="}, "s": {"BS": ["AAE=", "AA=="]}});
        assert_eq!(item_size(&blob), 1 + 5 + 1 + 2 + 1);
        let big = json!({"PK": {"S": "x".repeat(3000)}});
        assert_eq!(dynamodb_capacity("PutItem", &json!({"Item": big})).0, 3.0);
        // The KEYS_ONLY overdue index: one WRU per entry written or removed.
        let pending = json!({"PK": {"S": "DLV#x"}, "GSI3PK": {"S": "DUE#1"}});
        assert_eq!(
            dynamodb_capacity("PutItem", &json!({"Item": pending})).0,
            2.0
        );
        let finish = json!({"Key": {"PK": {"S": "EVT#x"}}, "UpdateExpression": "SET a = :a REMOVE GSI3PK, GSI3SK", "ExpressionAttributeValues": {":a": {"S": "x"}}});
        assert_eq!(dynamodb_capacity("UpdateItem", &finish).0, 2.0);
        let batch = json!({"RequestItems": {"t": {"Keys": [{}, {}, {}], "ConsistentRead": true}}});
        assert_eq!(dynamodb_capacity("BatchGetItem", &batch).1, 3.0);
    }
}
