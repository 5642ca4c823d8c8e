//! Counting every AWS request by operation: an SDK interceptor that the
//! benchmark (and anyone curious) attaches to the clients, and the same
//! count as an observer of the direct DynamoDB client. Each HTTP attempt
//! is counted (retries too: AWS bills them), with an estimate of the
//! DynamoDB capacity the request consumes, from its body:
//!
//! - item size = attribute names + values (DynamoDB's rule); a write costs
//!   one WRU per started KB, twice inside a transaction;
//! - index writes follow each item's entries as the counter saw them
//!   written ([`TableState`]): an entry added or rewritten costs as much
//!   again for the two indexes that project ALL (GSI1, GSI2), one WRU for
//!   the KEYS_ONLY overdue index (GSI3, nothing when its entry is
//!   unchanged); a moved entry a delete and a put, a removed one a delete,
//!   an absent one removed nothing;
//! - `UpdateItem` does not carry the whole item: its size is the update's
//!   values plus `UPDATED_ITEM_BASE_BYTES`;
//! - reads are charged by the size of what they read, per started 4 KB (at
//!   least one unit), one RRU per unit when consistent and half that when
//!   eventually consistent: a `GetItem` or `BatchGetItem` key the item's
//!   size, a `Query` the items its key condition selects ([`TableState`]
//!   evaluates it over the items it saw written: after `ExclusiveStartKey`,
//!   up to `Limit`, whatever the projection or filter, as DynamoDB
//!   charges; an index query the entries it reads, the whole item for an
//!   ALL index, the keys for KEYS_ONLY). An item the counter never saw
//!   written reads as one unit.

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
    /// Items the `Query` requests read (their key conditions over the items
    /// the counter saw written): what a read costs in proportion to.
    pub items_read: u64,
}

/// Shared counter: clone it into every client's config.
#[derive(Debug, Clone, Default)]
pub struct CallCounter {
    counts: Arc<Mutex<BTreeMap<String, OperationCount>>>,
    /// The index entries of the items written through this counter (kept
    /// across [`CallCounter::reset`]: the table outlives a count).
    table: Arc<Mutex<TableState>>,
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

    /// Estimated (WRU, RRU, items a query read) of one DynamoDB request
    /// body.
    fn dynamodb_capacity(&self, operation: &str, body: &Value) -> (f64, f64, u64) {
        let mut table = hookline_core::sync::lock(&self.table);
        let items = if operation == "Query" {
            table.query_hits(body).map_or(0, |hits| hits.len() as u64)
        } else {
            0
        };
        let (wru, rru) = table.capacity(operation, body);
        (wru, rru, items)
    }

    /// The same count for the direct clients (`hookline_aws::aws_json`):
    /// each attempt's operation and body.
    pub fn direct_observer(&self) -> hookline_aws::aws_json::RequestObserver {
        let counter = self.clone();
        std::sync::Arc::new(
            move |operation: hookline_aws::aws_json::Operation, body: &[u8]| {
                let capacity = if *operation.service == hookline_aws::dynamo_http::DYNAMODB {
                    serde_json::from_slice::<Value>(body).map_or((0.0, 0.0, 0), |body| {
                        counter.dynamodb_capacity(operation.name, &body)
                    })
                } else {
                    (0.0, 0.0, 0)
                };
                counter.record(
                    format!("{}.{}", operation.service.name, operation.name),
                    capacity,
                );
            },
        )
    }

    fn record(&self, op: String, (wru, rru, items): (f64, f64, u64)) {
        if let Ok(mut c) = self.counts.lock() {
            let entry = c.entry(op).or_default();
            entry.requests += 1;
            entry.wru += wru;
            entry.rru += rru;
            entry.items_read += items;
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

/// The table's indexes: the key attributes of each, and whether it
/// projects ALL (a copy the item's size) or KEYS_ONLY (one unit).
const INDEXES: [(&str, &str, bool); 3] = [
    ("GSI1PK", "GSI1SK", true),
    ("GSI2PK", "GSI2SK", true),
    ("GSI3PK", "GSI3SK", false),
];

/// An item's entries in [`INDEXES`] (each its index key, `None`: absent).
type Entries = [Option<String>; 3];

/// The entries of an item in no index.
const NO_ENTRIES: Entries = [None, None, None];

/// What the counter knows of the table: the index entries of every item
/// written through it, so a write is charged for what it changes in each
/// index (DynamoDB writes an index only when the item's entry in it is
/// added, moved, removed or, projecting ALL, rewritten). A conditional
/// write is assumed to succeed.
#[derive(Debug, Default)]
pub struct TableState {
    items: std::collections::HashMap<String, Entries>,
    /// Each item's size by (PK, SK), in key order (for queries): a put's
    /// own, an update's the larger of the item's known size and the
    /// update's estimate.
    sizes: BTreeMap<(String, String), usize>,
}

/// A `Query`'s sort-key condition.
#[derive(Debug, Clone, PartialEq)]
enum SortCondition {
    Any,
    Between(String, String),
    BeginsWith(String),
    Compare(&'static str, String),
}

impl SortCondition {
    fn holds(&self, sk: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Between(low, high) => low.as_str() <= sk && sk <= high.as_str(),
            Self::BeginsWith(prefix) => sk.starts_with(prefix.as_str()),
            Self::Compare(op, v) => match *op {
                "<" => sk < v.as_str(),
                "<=" => sk <= v.as_str(),
                ">" => sk > v.as_str(),
                ">=" => sk >= v.as_str(),
                _ => sk == v.as_str(),
            },
        }
    }
}

/// A `Query` request's key condition: (partition attribute, its value,
/// sort attribute, its condition). `None` for a form this counter does not
/// read (such a query is charged its minimum).
fn key_condition(body: &Value) -> Option<(String, String, String, SortCondition)> {
    let expression = body.get("KeyConditionExpression")?.as_str()?;
    let values = body.get("ExpressionAttributeValues")?;
    let names = body.get("ExpressionAttributeNames");
    let name = |n: &str| -> String {
        let n = n.trim();
        names
            .and_then(|m| m.get(n))
            .and_then(Value::as_str)
            .unwrap_or(n)
            .to_owned()
    };
    let value = |v: &str| text(values.get(v.trim())).map(str::to_owned);
    let (partition, rest) = match expression.split_once(" AND ") {
        Some((p, r)) => (p, Some(r.trim())),
        None => (expression, None),
    };
    let (pk_name, pk_value) = partition.split_once('=')?;
    let (pk_name, pk_value) = (name(pk_name), value(pk_value)?);
    let Some(rest) = rest else {
        return Some((pk_name, pk_value, String::new(), SortCondition::Any));
    };
    if let Some(inner) = rest
        .strip_prefix("begins_with(")
        .and_then(|r| r.strip_suffix(')'))
    {
        let (sk, prefix) = inner.split_once(',')?;
        return Some((
            pk_name,
            pk_value,
            name(sk),
            SortCondition::BeginsWith(value(prefix)?),
        ));
    }
    if let Some((sk, range)) = rest.split_once(" BETWEEN ") {
        let (low, high) = range.split_once(" AND ")?;
        return Some((
            pk_name,
            pk_value,
            name(sk),
            SortCondition::Between(value(low)?, value(high)?),
        ));
    }
    for op in ["<=", ">=", "<", ">", "="] {
        if let Some((sk, v)) = rest.split_once(op) {
            return Some((
                pk_name,
                pk_value,
                name(sk),
                SortCondition::Compare(op, value(v)?),
            ));
        }
    }
    None
}

fn text(v: Option<&Value>) -> Option<&str> {
    v.and_then(|v| v.get("S")).and_then(Value::as_str)
}

/// The table key of an `Item` or `Key`, as one string.
fn table_key(key: &Value) -> String {
    format!(
        "{}\u{0}{}",
        text(key.get("PK")).unwrap_or(""),
        text(key.get("SK")).unwrap_or("")
    )
}

/// The table key of an `Item` or `Key`, as (PK, SK).
fn key_pair(key: &Value) -> (String, String) {
    (
        text(key.get("PK")).unwrap_or("").to_owned(),
        text(key.get("SK")).unwrap_or("").to_owned(),
    )
}

/// An item's index entries.
fn entries_of(item: &Value) -> Entries {
    INDEXES.map(|(pk, sk, _)| {
        text(item.get(pk)).map(|p| format!("{p}\u{0}{}", text(item.get(sk)).unwrap_or("")))
    })
}

/// WRU an index write costs, from the item's entry `before` to `after`:
/// `units` for an entry of an ALL index written, one for a KEYS_ONLY
/// entry written or any entry deleted (a key change is both).
fn index_wru(before: Option<&str>, after: Option<&str>, all: bool, units: f64) -> f64 {
    let put = if all { units } else { 1.0 };
    match (before, after) {
        (None, None) => 0.0,
        (None, Some(_)) => put,
        (Some(_), None) => 1.0,
        // The same entry: an ALL copy carries the changed attributes.
        (Some(a), Some(b)) if a == b => {
            if all {
                units
            } else {
                0.0
            }
        }
        (Some(_), Some(_)) => 1.0 + put,
    }
}

fn indexes_wru(before: &Entries, after: &Entries, units: f64) -> f64 {
    INDEXES
        .iter()
        .enumerate()
        .map(|(i, (_, _, all))| index_wru(before[i].as_deref(), after[i].as_deref(), *all, units))
        .sum()
}

impl TableState {
    /// WRU of writing `item` (a put): the table, `factor` times (two in a
    /// transaction), plus each index entry it adds, moves or rewrites.
    fn put_wru(&mut self, item: &Value, factor: f64) -> f64 {
        let units = kb_units(item_size(item), 1024);
        let after = entries_of(item);
        // An item the counter never saw written is a new one: no entries.
        let before = self
            .items
            .insert(table_key(item), after.clone())
            .unwrap_or(NO_ENTRIES);
        self.sizes.insert(key_pair(item), item_size(item));
        units * factor + indexes_wru(&before, &after, units)
    }

    fn update_wru(&mut self, update: &Value, factor: f64) -> f64 {
        let values = update
            .get("ExpressionAttributeValues")
            .and_then(Value::as_object);
        let size = values.map_or(0, |m| m.values().map(value_size).sum::<usize>());
        let units = kb_units(size + UPDATED_ITEM_BASE_BYTES, 1024);
        let expression = update
            .get("UpdateExpression")
            .and_then(Value::as_str)
            .unwrap_or("");
        let (set_part, remove_part) = expression
            .split_once(" REMOVE ")
            .unwrap_or((expression, ""));
        let set_part = set_part
            .trim_start()
            .strip_prefix("SET ")
            .unwrap_or(set_part);
        // `NAME = :value` assignments of plain attribute names.
        let assigned = |name: &str| {
            set_part.split(',').find_map(|a| {
                let (left, right) = a.split_once('=')?;
                (left.trim() == name)
                    .then(|| values.and_then(|m| m.get(right.trim())))
                    .flatten()
            })
        };
        let removed = |name: &str| remove_part.split(',').any(|a| a.trim() == name);
        // DynamoDB refuses an update without a key: nothing to follow,
        // the table's write alone.
        let Some(key) = update.get("Key").map(table_key) else {
            return units * factor;
        };
        let before = match self.items.get(&key) {
            Some(known) => known.clone(),
            // Not written through this counter: an entry is assumed only
            // where the update removes or moves one.
            None => INDEXES.map(|(pk, _, _)| {
                (removed(pk) || assigned(pk).is_some()).then(|| "unknown".to_owned())
            }),
        };
        let mut after = before.clone();
        for (i, (pk, sk, _)) in INDEXES.iter().enumerate() {
            if removed(pk) {
                after[i] = None;
            } else if let Some(p) = assigned(pk) {
                let sk = assigned(sk)
                    .and_then(|v| v.get("S"))
                    .and_then(Value::as_str);
                after[i] = Some(format!(
                    "{}\u{0}{}",
                    p.get("S").and_then(Value::as_str).unwrap_or(""),
                    sk.unwrap_or("")
                ));
            }
        }
        self.items.insert(key, after.clone());
        if let Some(pair) = update.get("Key").map(key_pair) {
            let estimate = size + UPDATED_ITEM_BASE_BYTES;
            let size = self
                .sizes
                .get(&pair)
                .map_or(estimate, |&known| known.max(estimate));
            self.sizes.insert(pair, size);
        }
        units * factor + indexes_wru(&before, &after, units)
    }

    fn delete_wru(&mut self, key: Option<&Value>, factor: f64) -> f64 {
        if let Some(pair) = key.map(key_pair) {
            self.sizes.remove(&pair);
        }
        // An item the counter never saw written: no entries known.
        let before = key
            .and_then(|k| self.items.remove(&table_key(k)))
            .unwrap_or(NO_ENTRIES);
        factor + before.iter().flatten().count() as f64
    }

    /// Read units of one item read by `key`: its size per started 4 KB.
    fn item_read_units(&self, key: &Value) -> f64 {
        self.sizes
            .get(&key_pair(key))
            .map_or(1.0, |&size| kb_units(size, 4096))
    }

    /// The bytes a `Query` reads ([`key_condition`] over the items seen),
    /// `None` for a form not understood.
    fn query_bytes(&self, body: &Value) -> Option<usize> {
        Some(self.query_hits(body)?.iter().sum())
    }

    /// The size of each item a query reads, in order.
    pub fn query_hits(&self, body: &Value) -> Option<Vec<usize>> {
        let (pk_name, pk, sk_name, condition) = key_condition(body)?;
        let index = body.get("IndexName").and_then(Value::as_str);
        // (sort key, bytes read) of each item the condition selects.
        let mut hits: Vec<(String, usize)> = match index {
            None => {
                if pk_name != "PK" || !(sk_name.is_empty() || sk_name == "SK") {
                    return None;
                }
                self.sizes
                    .range((pk.clone(), String::new())..)
                    .take_while(|((p, _), _)| *p == pk)
                    .filter(|((_, sk), _)| condition.holds(sk))
                    .map(|((_, sk), &size)| (sk.clone(), size))
                    .collect()
            }
            Some(_) => {
                let i = INDEXES.iter().position(|(p, _, _)| *p == pk_name)?;
                let all = INDEXES[i].2;
                self.items
                    .iter()
                    .filter_map(|(key, entries)| {
                        let (p, sk) = entries[i].as_deref()?.split_once('\u{0}')?;
                        (p == pk && condition.holds(sk)).then(|| {
                            let (table_pk, table_sk) = key.split_once('\u{0}').unwrap_or((key, ""));
                            let pair = (table_pk.to_owned(), table_sk.to_owned());
                            let keys = ["PK", "SK"].iter().map(|n| n.len()).sum::<usize>()
                                + INDEXES[i].0.len()
                                + INDEXES[i].1.len()
                                + table_pk.len()
                                + table_sk.len()
                                + p.len()
                                + sk.len();
                            let bytes = if all {
                                self.sizes.get(&pair).copied().unwrap_or(keys)
                            } else {
                                keys
                            };
                            (sk.to_owned(), bytes)
                        })
                    })
                    .collect()
            }
        };
        hits.sort();
        let forward = body.get("ScanIndexForward").and_then(Value::as_bool) != Some(false);
        if !forward {
            hits.reverse();
        }
        let sk_attr = if index.is_some() {
            INDEXES
                .iter()
                .find(|(p, _, _)| *p == pk_name)
                .map_or("SK", |(_, s, _)| *s)
        } else {
            "SK"
        };
        if let Some(start) = text(body.get("ExclusiveStartKey").and_then(|k| k.get(sk_attr))) {
            hits.retain(|(sk, _)| {
                if forward {
                    sk.as_str() > start
                } else {
                    sk.as_str() < start
                }
            });
        }
        let limit = body
            .get("Limit")
            .and_then(Value::as_u64)
            .map_or(usize::MAX, |l| l as usize);
        Some(hits.iter().take(limit).map(|(_, bytes)| *bytes).collect())
    }

    /// Estimated (WRU, RRU) of one DynamoDB request body.
    pub fn capacity(&mut self, operation: &str, body: &Value) -> (f64, f64) {
        match operation {
            "PutItem" => (body.get("Item").map_or(1.0, |i| self.put_wru(i, 1.0)), 0.0),
            "UpdateItem" => (self.update_wru(body, 1.0), 0.0),
            "DeleteItem" => (self.delete_wru(body.get("Key"), 1.0), 0.0),
            "GetItem" => {
                let consistent = body.get("ConsistentRead").and_then(Value::as_bool) == Some(true);
                let units = body.get("Key").map_or(1.0, |k| self.item_read_units(k));
                (0.0, units * if consistent { 1.0 } else { 0.5 })
            }
            "Query" => {
                let consistent = body.get("ConsistentRead").and_then(Value::as_bool) == Some(true);
                let units = kb_units(self.query_bytes(body).unwrap_or(0), 4096);
                (0.0, units * if consistent { 1.0 } else { 0.5 })
            }
            "BatchGetItem" => {
                let rru =
                    body.get("RequestItems")
                        .and_then(Value::as_object)
                        .map_or(0.0, |tables| {
                            tables
                                .values()
                                .map(|t| {
                                    let units: f64 = t
                                        .get("Keys")
                                        .and_then(Value::as_array)
                                        .map_or(0.0, |keys| {
                                            keys.iter().map(|k| self.item_read_units(k)).sum()
                                        });
                                    let consistent =
                                        t.get("ConsistentRead").and_then(Value::as_bool)
                                            == Some(true);
                                    units * if consistent { 1.0 } else { 0.5 }
                                })
                                .sum()
                        });
                (0.0, rru)
            }
            "BatchWriteItem" => {
                let requests: Vec<Value> = body
                    .get("RequestItems")
                    .and_then(Value::as_object)
                    .map(|tables| {
                        tables
                            .values()
                            .filter_map(Value::as_array)
                            .flatten()
                            .cloned()
                            .collect()
                    })
                    .unwrap_or_default();
                let wru = requests
                    .iter()
                    .map(|r| {
                        if let Some(item) = r.get("PutRequest").and_then(|p| p.get("Item")) {
                            self.put_wru(item, 1.0)
                        } else {
                            self.delete_wru(r.get("DeleteRequest").and_then(|d| d.get("Key")), 1.0)
                        }
                    })
                    .sum();
                (wru, 0.0)
            }
            "TransactWriteItems" => {
                let wru =
                    body.get("TransactItems")
                        .and_then(Value::as_array)
                        .map_or(0.0, |items| {
                            items
                                .iter()
                                .map(|t| {
                                    if let Some(put) = t.get("Put") {
                                        put.get("Item").map_or(2.0, |i| self.put_wru(i, 2.0))
                                    } else if let Some(update) = t.get("Update") {
                                        self.update_wru(update, 2.0)
                                    } else if let Some(delete) = t.get("Delete") {
                                        self.delete_wru(delete.get("Key"), 2.0)
                                    } else {
                                        2.0 // ConditionCheck
                                    }
                                })
                                .sum()
                        });
                (wru, 0.0)
            }
            _ => (0.0, 0.0),
        }
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
        let capacity = if service.eq_ignore_ascii_case("dynamodb") {
            context
                .request()
                .body()
                .bytes()
                .and_then(|b| serde_json::from_slice::<Value>(b).ok())
                .map_or((0.0, 0.0, 0), |body| {
                    self.dynamodb_capacity(&operation, &body)
                })
        } else {
            (0.0, 0.0, 0)
        };
        self.record(format!("{service}.{operation}"), capacity);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn capacity_estimates() {
        let mut table = TableState::default();
        let mut wru = |op: &str, body: Value| table.capacity(op, &body).0;
        let item = json!({"PK": {"S": "DLV#x"}, "SK": {"S": "DLV"}, "GSI1PK": {"S": "a"}, "GSI2PK": {"S": "b"}});
        assert_eq!(item_size(&item), 2 + 5 + 2 + 3 + 6 + 1 + 6 + 1);
        assert_eq!(wru("PutItem", json!({"Item": item})), 3.0);
        // The same item again in a transaction: both ALL copies rewritten.
        let tx = json!({"TransactItems": [{"Put": {"Item": item}}, {"ConditionCheck": {}}]});
        assert_eq!(wru("TransactWriteItems", tx), 2.0 + 2.0 + 2.0);
        // Its by-status key moved (a delete and a put), its by-endpoint
        // copy rewritten.
        let key = json!({"PK": {"S": "DLV#x"}, "SK": {"S": "DLV"}});
        let update = json!({"Key": key, "UpdateExpression": "SET GSI2PK = :s", "ExpressionAttributeValues": {":s": {"S": "x"}}});
        assert_eq!(wru("UpdateItem", update), 1.0 + 2.0 + 1.0);
        // An item not seen before, its update touching no index: the
        // table's write alone.
        let unseen = json!({"Key": {"PK": {"S": "DLA#y#1"}, "SK": {"S": "d"}}, "UpdateExpression": "SET a = :a", "ExpressionAttributeValues": {":a": {"S": "x"}}});
        assert_eq!(wru("UpdateItem", unseen), 1.0);
        assert_eq!(
            table
                .capacity("GetItem", &json!({"ConsistentRead": true}))
                .1,
            1.0
        );
        // Binary counts its raw bytes, not its base64 text.
        let blob = json!({"b": {"B": "AAECAwQ="}, "s": {"BS": ["AAE=", "AA=="]}});
        assert_eq!(item_size(&blob), 1 + 5 + 1 + 2 + 1);
        let big = json!({"PK": {"S": "x".repeat(3000)}});
        assert_eq!(table.capacity("PutItem", &json!({"Item": big})).0, 3.0);
        let batch = json!({"RequestItems": {"t": {"Keys": [{}, {}, {}], "ConsistentRead": true}}});
        assert_eq!(table.capacity("BatchGetItem", &batch).1, 3.0);
    }

    /// A delivery that needs retries, then one that fails, in its app's
    /// partition: each write is charged for what it changes in each index.
    #[test]
    fn index_writes_follow_each_items_entries() {
        let mut table = TableState::default();
        let mut wru = |op: &str, body: Value| table.capacity(op, &body).0;
        let key = json!({"PK": {"S": "DLA#a#1"}, "SK": {"S": "d1"}});
        // Delivered on its first attempt: the item alone.
        let delivered = json!({"PK": {"S": "DLA#a#1"}, "SK": {"S": "d0"}});
        assert_eq!(wru("PutItem", json!({"Item": delivered})), 1.0);
        // A first attempt failed: pending, in the overdue index (KEYS_ONLY).
        let pending = json!({"PK": {"S": "DLA#a#1"}, "SK": {"S": "d1"}, "GSI3PK": {"S": "DUE#1"}, "GSI3SK": {"S": "t1#d1"}});
        assert_eq!(wru("PutItem", json!({"Item": pending})), 1.0 + 1.0);
        // The second failed too: its overdue entry moves (a delete, a put);
        // removing a by-status entry it never had costs nothing.
        let again = json!({"Key": key, "UpdateExpression": "SET #status = :s, GSI3PK = :p, GSI3SK = :q REMOVE GSI2PK, GSI2SK", "ExpressionAttributeValues": {":s": {"S": "pending"}, ":p": {"S": "DUE#1"}, ":q": {"S": "t2#d1"}}});
        assert_eq!(wru("UpdateItem", again), 1.0 + 2.0);
        // A rewrite keeping the same overdue entry: KEYS_ONLY, unchanged.
        let same = json!({"Key": key, "UpdateExpression": "SET a = :a, GSI3PK = :p, GSI3SK = :q", "ExpressionAttributeValues": {":a": {"S": "x"}, ":p": {"S": "DUE#1"}, ":q": {"S": "t2#d1"}}});
        assert_eq!(wru("UpdateItem", same), 1.0);
        // Delivered: the overdue entry deleted.
        let done = json!({"Key": key, "UpdateExpression": "SET #status = :s REMOVE GSI2PK, GSI2SK, next_attempt_at, GSI3PK, GSI3SK", "ExpressionAttributeValues": {":s": {"S": "delivered"}}});
        assert_eq!(wru("UpdateItem", done.clone()), 1.0 + 1.0);
        assert_eq!(wru("UpdateItem", done), 1.0, "nothing left to remove");
        // Failed: a by-status copy (ALL) written; deleting the item then
        // deletes it too.
        let failed = json!({"Key": key, "UpdateExpression": "SET #status = :s, GSI2PK = :g, GSI2SK = :h", "ExpressionAttributeValues": {":s": {"S": "failed"}, ":g": {"S": "ST#a#failed#1"}, ":h": {"S": "d1"}}});
        assert_eq!(wru("UpdateItem", failed), 1.0 + 1.0);
        assert_eq!(wru("DeleteItem", json!({"Key": key})), 1.0 + 1.0);
        // An item not written through the counter: a removed entry is
        // assumed present.
        let unknown = json!({"Key": {"PK": {"S": "EVT#x"}, "SK": {"S": "EVT"}}, "UpdateExpression": "SET a = :a REMOVE GSI3PK, GSI3SK", "ExpressionAttributeValues": {":a": {"S": "x"}}});
        assert_eq!(wru("UpdateItem", unknown), 2.0);
    }

    /// Reads are charged by what they read: a query by the items its key
    /// condition selects (after its start key, up to its limit), an index
    /// query by its entries, a read by key by the item's size.
    #[test]
    fn reads_are_charged_by_what_they_read() {
        let mut table = TableState::default();
        let item = |sk: &str, due: Option<&str>| {
            let mut item = json!({"PK": {"S": "EVD#20261205#1"}, "SK": {"S": sk}, "body": {"S": "x".repeat(1500)}});
            if let Some(due) = due {
                item["GSI3PK"] = json!({"S": "DUE#1"});
                item["GSI3SK"] = json!({"S": due});
            }
            item
        };
        for (sk, due) in [("a", Some("t1")), ("b", None), ("c", Some("t3"))] {
            table.capacity("PutItem", &json!({"Item": item(sk, due)}));
        }
        table.capacity("PutItem", &json!({"Item": {"PK": {"S": "EVD#20261205#2"}, "SK": {"S": "a"}, "body": {"S": "x".repeat(9000)}}}));
        let mut rru = |body: Value| table.capacity("Query", &body).1;
        let range = |low: &str, high: &str| {
            json!({"KeyConditionExpression": "PK = :pk AND SK BETWEEN :low AND :below",
                "ExpressionAttributeValues": {":pk": {"S": "EVD#20261205#1"}, ":low": {"S": low}, ":below": {"S": high}}})
        };
        // Two items of ~1.5 KB: one 4 KB unit, half of it eventually.
        assert_eq!(rru(range("a", "b")), 0.5);
        // Three: two units (the other partition's item is not read).
        assert_eq!(rru(range("a", "z")), 1.0);
        let mut consistent = range("a", "z");
        consistent["ConsistentRead"] = json!(true);
        assert_eq!(rru(consistent), 2.0);
        let mut limited = range("a", "z");
        limited["Limit"] = json!(1);
        assert_eq!(rru(limited), 0.5);
        let mut after = range("a", "z");
        after["ExclusiveStartKey"] = json!({"PK": {"S": "EVD#20261205#1"}, "SK": {"S": "a"}});
        assert_eq!(rru(after), 0.5);
        let prefix = json!({"KeyConditionExpression": "PK = :pk AND begins_with(SK, :p)", "ConsistentRead": true,
            "ExpressionAttributeValues": {":pk": {"S": "EVD#20261205#2"}, ":p": {"S": "a"}}});
        assert_eq!(rru(prefix), 3.0);
        // The overdue index (KEYS_ONLY): two small entries.
        let overdue = json!({"IndexName": "GSI3", "KeyConditionExpression": "GSI3PK = :pk AND GSI3SK < :below",
            "ExpressionAttributeValues": {":pk": {"S": "DUE#1"}, ":below": {"S": "t9"}}});
        assert_eq!(rru(overdue), 0.5);
        // A form the counter does not read: its minimum.
        assert_eq!(rru(json!({"KeyConditionExpression": "whatever"})), 0.5);
        // By key: the item's size (9 KB: three units), an unseen one one.
        let key = json!({"PK": {"S": "EVD#20261205#2"}, "SK": {"S": "a"}});
        assert_eq!(
            table
                .capacity("GetItem", &json!({"Key": key, "ConsistentRead": true}))
                .1,
            3.0
        );
        let batch = json!({"RequestItems": {"t": {"Keys": [key, {"PK": {"S": "nope"}, "SK": {"S": "x"}}]}}});
        assert_eq!(table.capacity("BatchGetItem", &batch).1, 2.0);
        // A deleted item is no longer read.
        table.capacity(
            "DeleteItem",
            &json!({"Key": {"PK": {"S": "EVD#20261205#1"}, "SK": {"S": "c"}}}),
        );
        assert_eq!(table.capacity("Query", &range("a", "z")).1, 0.5);
    }
}
