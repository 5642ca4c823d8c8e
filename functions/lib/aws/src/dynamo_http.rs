//! [`DynamoHttp`]: DynamoDB's JSON API spoken directly ([`crate::aws_json`])
//! for the operations every delivery makes (GetItem, BatchGetItem, PutItem,
//! UpdateItem, Query). Everything else (transactions, the operator's
//! queries) stays on the SDK client.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_dynamo::{AttributeValue, Item};

pub use crate::aws_json::{AwsJsonError, RequestObserver};
use crate::aws_json::{Operation, Service};

/// DynamoDB, as signed and addressed.
pub const DYNAMODB: Service = Service {
    name: "DynamoDB",
    signing_name: "dynamodb",
    content_type: crate::aws_json::JSON_1_0,
};

const fn operation(name: &'static str, target: &'static str) -> Operation {
    Operation {
        service: &DYNAMODB,
        name,
        target,
    }
}

const GET_ITEM: Operation = operation("GetItem", "DynamoDB_20120810.GetItem");
const PUT_ITEM: Operation = operation("PutItem", "DynamoDB_20120810.PutItem");
const UPDATE_ITEM: Operation = operation("UpdateItem", "DynamoDB_20120810.UpdateItem");
const QUERY: Operation = operation("Query", "DynamoDB_20120810.Query");
const BATCH_GET_ITEM: Operation = operation("BatchGetItem", "DynamoDB_20120810.BatchGetItem");

/// Keys per BatchGetItem (DynamoDB's limit).
pub const BATCH_GET_MAX: usize = 100;

/// What one BatchGetItem read: the items found (in no particular order),
/// and the keys DynamoDB left unprocessed (throttling, or the answer's 16 MB
/// limit): to ask for again.
#[derive(Debug, Clone, Default)]
pub struct BatchGetPage {
    pub items: Vec<Item>,
    pub unprocessed: Vec<(String, String)>,
}

crate::aws_json::service_client!(
    /// DynamoDB's JSON API on one HTTP client. Cheap to clone.
    DynamoHttp,
    DYNAMODB
);

impl DynamoHttp {
    /// The item at (`pk`, `sk`) of `table`, read consistently.
    pub async fn get_item(
        &self,
        table: &str,
        pk: &str,
        sk: &str,
    ) -> Result<Option<Item>, AwsJsonError> {
        self.read_item(table, pk, sk, true).await
    }

    /// The item at (`pk`, `sk`) of `table`, read eventually consistently
    /// (half the read units; a write of about the last second may not show).
    pub async fn get_item_eventually(
        &self,
        table: &str,
        pk: &str,
        sk: &str,
    ) -> Result<Option<Item>, AwsJsonError> {
        self.read_item(table, pk, sk, false).await
    }

    async fn read_item(
        &self,
        table: &str,
        pk: &str,
        sk: &str,
        consistent: bool,
    ) -> Result<Option<Item>, AwsJsonError> {
        #[derive(Serialize)]
        #[serde(rename_all = "PascalCase")]
        struct Request<'a> {
            table_name: &'a str,
            key: TableKey<'a>,
            consistent_read: bool,
        }
        #[derive(Deserialize)]
        struct Response {
            #[serde(rename = "Item")]
            item: Option<Item>,
        }
        let request = Request {
            table_name: table,
            key: TableKey::new(pk, sk),
            consistent_read: consistent,
        };
        let response: Response = self.json.call(GET_ITEM, &request).await?;
        Ok(response.item)
    }

    /// The items of `table` at `keys` (`PK`, `SK`; at most
    /// [`BATCH_GET_MAX`]), read consistently or not, each reduced to
    /// `projection` when given (attribute names that are not reserved
    /// words), in one BatchGetItem.
    pub async fn batch_get_item(
        &self,
        table: &str,
        keys: &[(String, String)],
        consistent: bool,
        projection: Option<&str>,
    ) -> Result<BatchGetPage, AwsJsonError> {
        #[derive(Serialize)]
        #[serde(rename_all = "PascalCase")]
        struct Wanted<'a> {
            keys: Vec<TableKey<'a>>,
            consistent_read: bool,
            #[serde(skip_serializing_if = "Option::is_none")]
            projection_expression: Option<&'a str>,
        }
        #[derive(Serialize)]
        #[serde(rename_all = "PascalCase")]
        struct Request<'a> {
            request_items: HashMap<&'a str, Wanted<'a>>,
        }
        #[derive(Deserialize)]
        struct Unprocessed {
            #[serde(rename = "Keys", default)]
            keys: Vec<Item>,
        }
        #[derive(Deserialize)]
        struct Response {
            #[serde(rename = "Responses", default)]
            responses: HashMap<String, Vec<Item>>,
            #[serde(rename = "UnprocessedKeys", default)]
            unprocessed: HashMap<String, Unprocessed>,
        }
        let wanted = Wanted {
            keys: keys.iter().map(|(pk, sk)| TableKey::new(pk, sk)).collect(),
            consistent_read: consistent,
            projection_expression: projection,
        };
        let request = Request {
            request_items: HashMap::from([(table, wanted)]),
        };
        let mut response: Response = self.json.call(BATCH_GET_ITEM, &request).await?;
        let text = |item: &Item, name: &str| match item.get(name) {
            Some(AttributeValue::S(value)) => Some(value.clone()),
            _ => None,
        };
        // A table absent from `Responses` had none of the keys; absent
        // from `UnprocessedKeys`, all of them were processed.
        Ok(BatchGetPage {
            items: response.responses.remove(table).unwrap_or_default(),
            unprocessed: response
                .unprocessed
                .remove(table)
                .map(|u| u.keys)
                .unwrap_or_default()
                .iter()
                .filter_map(|key| Some((text(key, "PK")?, text(key, "SK")?)))
                .collect(),
        })
    }

    /// Writes `put.item`; a failed condition is
    /// [`AwsJsonError::is_condition_failure`].
    pub async fn put_item(&self, put: &Put<'_>) -> Result<(), AwsJsonError> {
        #[derive(Deserialize)]
        struct Response {}
        let _: Response = self.json.call(PUT_ITEM, put).await?;
        Ok(())
    }

    /// Applies `update`; a failed condition is
    /// [`AwsJsonError::is_condition_failure`].
    pub async fn update_item(&self, update: &Update<'_>) -> Result<(), AwsJsonError> {
        #[derive(Deserialize)]
        struct Response {}
        let _: Response = self.json.call(UPDATE_ITEM, update).await?;
        Ok(())
    }

    /// One page of `query`.
    pub async fn query(&self, query: &Query<'_>) -> Result<QueryPage, AwsJsonError> {
        self.json.call(QUERY, query).await
    }

    /// Every item `query` finds, page after page.
    pub async fn query_all(&self, query: &Query<'_>) -> Result<Vec<Item>, AwsJsonError> {
        let mut query = query.clone();
        let mut out = Vec::new();
        loop {
            let page = self.query(&query).await?;
            out.extend(page.items);
            match page.last_evaluated_key {
                Some(key) if !key.is_empty() => query.exclusive_start_key = Some(key),
                _ => return Ok(out),
            }
        }
    }
}

/// A table key (`PK`, `SK`) on the wire.
#[derive(Debug, Clone, Serialize)]
struct TableKey<'a> {
    #[serde(rename = "PK")]
    pk: Text<'a>,
    #[serde(rename = "SK")]
    sk: Text<'a>,
}

impl<'a> TableKey<'a> {
    fn new(pk: &'a str, sk: &'a str) -> Self {
        Self {
            pk: Text { s: pk },
            sk: Text { s: sk },
        }
    }
}

/// A string attribute value on the wire, borrowed.
#[derive(Debug, Clone, Serialize)]
struct Text<'a> {
    #[serde(rename = "S")]
    s: &'a str,
}

/// A PutItem request.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Put<'a> {
    pub table_name: &'a str,
    pub item: &'a Item,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub condition_expression: Option<&'a str>,
    #[serde(skip_serializing_if = "HashMap::is_empty")]
    pub expression_attribute_values: HashMap<&'a str, AttributeValue>,
}

impl<'a> Put<'a> {
    /// `item` into `table`, unconditionally.
    pub fn new(table: &'a str, item: &'a Item) -> Self {
        Self {
            table_name: table,
            item,
            condition_expression: None,
            expression_attribute_values: HashMap::new(),
        }
    }

    /// Only if `condition` holds.
    pub fn condition(mut self, condition: &'a str) -> Self {
        self.condition_expression = Some(condition);
        self
    }

    /// Binds `name` (`:name`) in the condition.
    pub fn value(mut self, name: &'a str, value: AttributeValue) -> Self {
        self.expression_attribute_values.insert(name, value);
        self
    }
}

/// An UpdateItem request.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Update<'a> {
    pub table_name: &'a str,
    key: TableKey<'a>,
    pub update_expression: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub condition_expression: Option<&'a str>,
    #[serde(skip_serializing_if = "HashMap::is_empty")]
    pub expression_attribute_names: HashMap<String, String>,
    #[serde(skip_serializing_if = "HashMap::is_empty")]
    pub expression_attribute_values: HashMap<String, AttributeValue>,
}

impl<'a> Update<'a> {
    /// `expression` on the item at (`pk`, `sk`) of `table`.
    pub fn new(table: &'a str, pk: &'a str, sk: &'a str, expression: String) -> Self {
        Self {
            table_name: table,
            key: TableKey::new(pk, sk),
            update_expression: expression,
            condition_expression: None,
            expression_attribute_names: HashMap::new(),
            expression_attribute_values: HashMap::new(),
        }
    }

    /// Only if `condition` holds.
    pub fn condition(mut self, condition: &'a str) -> Self {
        self.condition_expression = Some(condition);
        self
    }

    /// Binds `name` (`:name`).
    pub fn value(mut self, name: impl Into<String>, value: AttributeValue) -> Self {
        self.expression_attribute_values.insert(name.into(), value);
        self
    }

    /// Binds `placeholder` (`#name`) to attribute `name`.
    pub fn name(mut self, placeholder: impl Into<String>, name: impl Into<String>) -> Self {
        self.expression_attribute_names
            .insert(placeholder.into(), name.into());
        self
    }
}

/// A Query request.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Query<'a> {
    pub table_name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index_name: Option<&'a str>,
    pub key_condition_expression: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub projection_expression: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filter_expression: Option<&'a str>,
    #[serde(skip_serializing_if = "HashMap::is_empty")]
    pub expression_attribute_names: HashMap<&'a str, &'a str>,
    pub expression_attribute_values: HashMap<&'a str, AttributeValue>,
    pub consistent_read: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exclusive_start_key: Option<Item>,
}

impl<'a> Query<'a> {
    /// The items of `table` matching `key_condition`, read consistently.
    pub fn new(table: &'a str, key_condition: &'a str) -> Self {
        Self {
            table_name: table,
            index_name: None,
            key_condition_expression: key_condition,
            projection_expression: None,
            filter_expression: None,
            expression_attribute_names: HashMap::new(),
            expression_attribute_values: HashMap::new(),
            consistent_read: true,
            limit: None,
            exclusive_start_key: None,
        }
    }

    /// On global secondary index `index` (read eventually consistently:
    /// the only way an index is read).
    pub fn index(mut self, index: &'a str) -> Self {
        self.index_name = Some(index);
        self.consistent_read = false;
        self
    }

    /// Read eventually consistently (half the read units).
    pub fn eventually_consistent(mut self) -> Self {
        self.consistent_read = false;
        self
    }

    /// Binds `name` (`:name`) in the key condition.
    pub fn value(mut self, name: &'a str, value: AttributeValue) -> Self {
        self.expression_attribute_values.insert(name, value);
        self
    }

    /// Only these attributes (`#name`s bound with [`Self::name`]).
    pub fn projection(mut self, projection: &'a str) -> Self {
        self.projection_expression = Some(projection);
        self
    }

    /// Binds `placeholder` (`#name`) to attribute `name`.
    pub fn name(mut self, placeholder: &'a str, name: &'a str) -> Self {
        self.expression_attribute_names.insert(placeholder, name);
        self
    }

    /// Only the items matching `filter` are answered (all are read and
    /// billed: a filter saves the answer's size, not read units).
    pub fn filter(mut self, filter: &'a str) -> Self {
        self.filter_expression = Some(filter);
        self
    }
}

/// One page of a query's answer.
#[derive(Debug, Deserialize)]
pub struct QueryPage {
    #[serde(rename = "Items", default)]
    pub items: Vec<Item>,
    #[serde(rename = "LastEvaluatedKey")]
    pub last_evaluated_key: Option<Item>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_server::serve;
    use aws_credential_types::provider::SharedCredentialsProvider;
    use aws_credential_types::Credentials;
    use std::sync::{Arc, Mutex};

    fn client(url: &str, token: Option<&str>) -> DynamoHttp {
        DynamoHttp::new(
            crate::clients::aws_http(None),
            "us-east-1",
            SharedCredentialsProvider::new(Credentials::new(
                "AKIDEXAMPLE",
                "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
                token.map(str::to_owned),
                None,
                "test",
            )),
            Some(url),
        )
        .expect("valid url")
    }

    fn answer(status: &str, body: &str) -> String {
        format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/x-amz-json-1.0\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
    }

    #[tokio::test]
    async fn a_batch_read_names_its_keys_and_returns_what_was_left_unprocessed() {
        let (url, server) = serve(vec![answer(
            "200 OK",
            r#"{"Responses":{"T":[{"PK":{"S":"a"},"SK":{"S":"1"},"n":{"N":"7"}}]},
                "UnprocessedKeys":{"T":{"Keys":[{"PK":{"S":"b"},"SK":{"S":"2"}}],"ConsistentRead":true}}}"#,
        )]);
        let keys = [
            ("a".to_owned(), "1".to_owned()),
            ("b".to_owned(), "2".to_owned()),
        ];
        let page = client(&url, None)
            .batch_get_item("T", &keys, true, Some("PK, SK, n"))
            .await
            .expect("answered");
        assert_eq!(page.items.len(), 1);
        let item: HashMap<String, AttributeValue> = page.items[0].clone().into();
        assert_eq!(item.get("n"), Some(&AttributeValue::N("7".into())));
        assert_eq!(page.unprocessed, [("b".to_owned(), "2".to_owned())]);
        let requests = server.join().expect("server");
        let request = &requests[0];
        assert!(
            request
                .to_ascii_lowercase()
                .contains("x-amz-target: dynamodb_20120810.batchgetitem"),
            "{request}"
        );
        let body: serde_json::Value =
            serde_json::from_str(&request[request.find("\r\n\r\n").expect("a body") + 4..])
                .expect("JSON");
        assert_eq!(
            body,
            serde_json::json!({"RequestItems": {"T": {
                "Keys": [{"PK": {"S": "a"}, "SK": {"S": "1"}}, {"PK": {"S": "b"}, "SK": {"S": "2"}}],
                "ConsistentRead": true, "ProjectionExpression": "PK, SK, n"}}})
        );
    }

    #[tokio::test]
    async fn a_get_item_is_signed_parsed_and_retried_after_throttling() {
        let (url, server) = serve(vec![
            answer(
                "400 Bad Request",
                r#"{"__type":"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException","message":"slow down"}"#,
            ),
            answer("500 Internal Server Error", r#"{}"#),
            answer(
                "200 OK",
                r#"{"Item":{"PK":{"S":"a"},"SK":{"S":"b"},"n":{"N":"7"},"on":{"BOOL":true}}}"#,
            ),
        ]);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let ours = client(&url, Some("tok")).observed_by(Arc::new(move |op, body| {
            log.lock()
                .expect("log")
                .push(format!("{op} {}", String::from_utf8_lossy(body)))
        }));
        let item = ours
            .get_item("hookline-Table", "a", "b")
            .await
            .expect("answered on the third attempt")
            .expect("an item");
        let item: HashMap<String, AttributeValue> = item.into();
        assert_eq!(item.get("n"), Some(&AttributeValue::N("7".into())));
        assert_eq!(item.get("on"), Some(&AttributeValue::Bool(true)));
        let requests = server.join().expect("server");
        assert_eq!(requests.len(), 3);
        let first = requests[0].to_ascii_lowercase();
        assert!(first.starts_with("post / http/1.1"), "{first}");
        assert!(
            first.contains("x-amz-target: dynamodb_20120810.getitem"),
            "{first}"
        );
        assert!(first.contains("x-amz-security-token: tok"), "{first}");
        assert!(
            first.contains("authorization: aws4-hmac-sha256 credential=akidexample/"),
            "{first}"
        );
        assert!(
            requests[0].ends_with(
                r#"{"TableName":"hookline-Table","Key":{"PK":{"S":"a"},"SK":{"S":"b"}},"ConsistentRead":true}"#
            ),
            "{}",
            requests[0]
        );
        assert_eq!(seen.lock().expect("log").len(), 3, "every attempt observed");
    }

    #[tokio::test]
    async fn a_failed_condition_is_answered_at_once_and_absent_items_are_none() {
        let (url, server) = serve(vec![
            answer(
                "400 Bad Request",
                r#"{"__type":"com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException","message":"The conditional request failed"}"#,
            ),
            answer("200 OK", "{}"),
        ]);
        let ours = client(&url, None);
        let item: Item = HashMap::from([
            ("PK".to_owned(), AttributeValue::S("a".into())),
            ("SK".to_owned(), AttributeValue::S("b".into())),
        ])
        .into();
        let err = ours
            .put_item(
                &Put::new("t", &item)
                    .condition("attribute_not_exists(PK) OR expires_at <= :now")
                    .value(":now", AttributeValue::N("5".into())),
            )
            .await
            .expect_err("the condition failed");
        assert!(err.is_condition_failure(), "{err}");
        assert_eq!(ours.get_item("t", "a", "b").await.expect("answered"), None);
        let requests = server.join().expect("server");
        assert!(
            requests[0].contains(r#""ConditionExpression":"attribute_not_exists(PK) OR expires_at <= :now","ExpressionAttributeValues":{":now":{"N":"5"}}"#),
            "{}",
            requests[0]
        );
        assert!(!requests[0]
            .to_ascii_lowercase()
            .contains("x-amz-security-token"));
    }

    #[tokio::test]
    async fn an_update_names_its_key_expression_and_bindings() {
        let (url, server) = serve(vec![answer("200 OK", "{}")]);
        client(&url, None)
            .update_item(
                &Update::new("t", "a", "b", "SET #s = :s ADD n :one".into())
                    .condition("version = :v")
                    .name("#s", "status")
                    .value(":s", AttributeValue::S("ok".into()))
                    .value(":one", AttributeValue::N("1".into()))
                    .value(":v", AttributeValue::N("3".into())),
            )
            .await
            .expect("updated");
        let request = server.join().expect("server").remove(0);
        let body: serde_json::Value =
            serde_json::from_str(&request[request.find("\r\n\r\n").expect("a body") + 4..])
                .expect("JSON");
        assert_eq!(
            body,
            serde_json::json!({
                "TableName": "t",
                "Key": {"PK": {"S": "a"}, "SK": {"S": "b"}},
                "UpdateExpression": "SET #s = :s ADD n :one",
                "ConditionExpression": "version = :v",
                "ExpressionAttributeNames": {"#s": "status"},
                "ExpressionAttributeValues": {":s": {"S": "ok"}, ":one": {"N": "1"}, ":v": {"N": "3"}}
            })
        );
        assert!(request
            .to_ascii_lowercase()
            .contains("x-amz-target: dynamodb_20120810.updateitem"));
    }

    #[tokio::test]
    async fn a_garbled_success_is_answered_once_as_a_retryable_decode_failure() {
        let (url, server) = serve(vec![answer("200 OK", "{not json")]);
        let err = client(&url, None)
            .get_item("t", "a", "b")
            .await
            .expect_err("unreadable");
        assert!(matches!(err, AwsJsonError::Decode { .. }), "{err:?}");
        assert!(err.is_retryable() && !err.deserves_retry());
        assert_eq!(server.join().expect("server").len(), 1, "not sent again");
    }

    #[tokio::test]
    async fn no_answer_is_a_retryable_transport_failure_after_every_attempt() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("bind")
            .local_addr()
            .expect("addr")
            .port();
        let ours = client(&format!("http://127.0.0.1:{port}/"), None);
        let err = ours
            .get_item("t", "a", "b")
            .await
            .expect_err("nobody listens");
        assert!(matches!(err, AwsJsonError::Transport { .. }), "{err:?}");
        assert!(err.is_retryable());
        assert!(std::error::Error::source(&err).is_some(), "keeps its cause");
    }
}
