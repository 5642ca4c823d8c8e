//! [`SqsHttp`]: SQS's JSON API spoken directly ([`crate::aws_json`]) for
//! the send every delivery's message makes (SendMessageBatch: dispatch's
//! first attempts, deliver's retries and re-queues) and the retry
//! function's drain of the DLQ (ReceiveMessage, a long poll whose wait
//! lengthens its attempt's timeout; DeleteMessageBatch and
//! ChangeMessageVisibilityBatch), so that function builds no SDK client on
//! its way. The rare rest (a single message to the DLQ, its depth) stays
//! on the SDK client.

use serde::{Deserialize, Serialize};

pub use crate::aws_json::AwsJsonError;
use crate::aws_json::{Operation, Service};

/// SQS, as signed and addressed.
pub const SQS: Service = Service {
    name: "SQS",
    signing_name: "sqs",
    content_type: crate::aws_json::JSON_1_0,
};

const SEND_MESSAGE_BATCH: Operation = Operation {
    service: &SQS,
    name: "SendMessageBatch",
    target: "AmazonSQS.SendMessageBatch",
};

const RECEIVE_MESSAGE: Operation = Operation {
    service: &SQS,
    name: "ReceiveMessage",
    target: "AmazonSQS.ReceiveMessage",
};

const DELETE_MESSAGE_BATCH: Operation = Operation {
    service: &SQS,
    name: "DeleteMessageBatch",
    target: "AmazonSQS.DeleteMessageBatch",
};

const CHANGE_MESSAGE_VISIBILITY_BATCH: Operation = Operation {
    service: &SQS,
    name: "ChangeMessageVisibilityBatch",
    target: "AmazonSQS.ChangeMessageVisibilityBatch",
};

/// At most this many messages per SendMessageBatch (SQS's limit).
pub const BATCH_MAX: usize = 10;

crate::aws_json::service_client!(
    /// SQS's JSON API on one HTTP client. Cheap to clone.
    SqsHttp,
    SQS
);

/// One message of a batch.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct BatchEntry<'a> {
    /// Unique within its batch; names the entry in the answer.
    pub id: String,
    pub message_body: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_seconds: Option<i32>,
    /// On a standard queue, the tenant of SQS fair queues.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_group_id: Option<&'a str>,
}

/// An entry SQS refused.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct FailedEntry {
    pub id: String,
    #[serde(default)]
    pub sender_fault: bool,
    #[serde(default)]
    pub code: String,
    #[serde(default)]
    pub message: Option<String>,
}

/// A message received: its receipt handle and body.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct ReceivedMessage {
    pub receipt_handle: String,
    #[serde(default)]
    pub body: String,
}

/// An entry of a DeleteMessageBatch or ChangeMessageVisibilityBatch: a
/// received message's receipt handle (and, for the latter, its new
/// visibility timeout in seconds).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct HandleEntry<'a> {
    /// Unique within its batch; names the entry in the answer.
    pub id: String,
    pub receipt_handle: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub visibility_timeout: Option<i32>,
}

/// The refused entries of a batch answer (the others succeeded).
#[derive(Deserialize)]
struct BatchAnswer {
    #[serde(rename = "Failed", default)]
    failed: Vec<FailedEntry>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct HandleBatch<'a> {
    queue_url: &'a str,
    entries: &'a [HandleEntry<'a>],
}

impl SqsHttp {
    /// Up to `max` (1-10) messages of `queue_url`, hidden from other
    /// receivers for `visibility`, waiting up to `wait` (at most 20 s) for
    /// the first (a long poll: an empty answer means the queue was empty).
    pub async fn receive_message(
        &self,
        queue_url: &str,
        max: i32,
        visibility: std::time::Duration,
        wait: std::time::Duration,
    ) -> Result<Vec<ReceivedMessage>, AwsJsonError> {
        #[derive(Serialize)]
        #[serde(rename_all = "PascalCase")]
        struct Request<'a> {
            queue_url: &'a str,
            max_number_of_messages: i32,
            visibility_timeout: i32,
            wait_time_seconds: i32,
        }
        #[derive(Deserialize)]
        struct Response {
            #[serde(rename = "Messages", default)]
            messages: Vec<ReceivedMessage>,
        }
        let wait = wait.min(std::time::Duration::from_secs(20));
        let request = Request {
            queue_url,
            max_number_of_messages: max.clamp(1, 10),
            // SQS's most: 12 hours.
            visibility_timeout: i32::try_from(visibility.as_secs().min(43_200))
                .expect("at most 43200"),
            wait_time_seconds: i32::try_from(wait.as_secs()).expect("at most 20"),
        };
        let response: Response = self
            .json
            .call_waiting(RECEIVE_MESSAGE, &request, wait)
            .await?;
        Ok(response.messages)
    }

    /// Deletes the received messages of `entries` (at most [`BATCH_MAX`]);
    /// the entries SQS refused.
    pub async fn delete_message_batch(
        &self,
        queue_url: &str,
        entries: &[HandleEntry<'_>],
    ) -> Result<Vec<FailedEntry>, AwsJsonError> {
        self.handle_batch(DELETE_MESSAGE_BATCH, queue_url, entries)
            .await
    }

    /// Sets the visibility timeout of the received messages of `entries`
    /// (at most [`BATCH_MAX`]); the entries SQS refused.
    pub async fn change_message_visibility_batch(
        &self,
        queue_url: &str,
        entries: &[HandleEntry<'_>],
    ) -> Result<Vec<FailedEntry>, AwsJsonError> {
        self.handle_batch(CHANGE_MESSAGE_VISIBILITY_BATCH, queue_url, entries)
            .await
    }

    /// `op` on received messages by their receipt handles.
    async fn handle_batch(
        &self,
        op: Operation,
        queue_url: &str,
        entries: &[HandleEntry<'_>],
    ) -> Result<Vec<FailedEntry>, AwsJsonError> {
        let answer: BatchAnswer = self
            .json
            .call(op, &HandleBatch { queue_url, entries })
            .await?;
        Ok(answer.failed)
    }

    /// Sends `entries` (at most [`BATCH_MAX`]) to `queue_url`; the entries
    /// SQS refused (the others are queued).
    pub async fn send_message_batch(
        &self,
        queue_url: &str,
        entries: &[BatchEntry<'_>],
    ) -> Result<Vec<FailedEntry>, AwsJsonError> {
        #[derive(Serialize)]
        #[serde(rename_all = "PascalCase")]
        struct Request<'a> {
            queue_url: &'a str,
            entries: &'a [BatchEntry<'a>],
        }
        #[derive(Deserialize)]
        struct Response {
            #[serde(rename = "Failed", default)]
            failed: Vec<FailedEntry>,
        }
        let response: Response = self
            .json
            .call(SEND_MESSAGE_BATCH, &Request { queue_url, entries })
            .await?;
        Ok(response.failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_server::{answer, credentials, serve};

    fn client(url: &str) -> SqsHttp {
        SqsHttp::new(
            crate::clients::aws_http(None),
            "us-east-1",
            credentials(),
            Some(url),
        )
        .expect("valid url")
    }

    #[tokio::test]
    async fn a_batch_is_sent_signed_for_sqs_and_its_refused_entries_returned() {
        let (url, server) = serve(vec![
            answer(
                "400 Bad Request",
                r#"{"__type":"com.amazonaws.sqs#RequestThrottled","message":"slow down"}"#,
            ),
            answer(
                "200 OK",
                r#"{"Successful":[{"Id":"0","MessageId":"m0","MD5OfMessageBody":"x"}],"Failed":[{"Id":"1","SenderFault":false,"Code":"InternalError","Message":"try again"}]}"#,
            ),
        ]);
        let entries = [
            BatchEntry {
                id: "0".into(),
                message_body: r#"{"delivery_id":"d0"}"#.into(),
                delay_seconds: Some(30),
                message_group_id: Some("ep_1"),
            },
            BatchEntry {
                id: "1".into(),
                message_body: "second".into(),
                delay_seconds: None,
                message_group_id: None,
            },
        ];
        let failed = client(&url)
            .send_message_batch("http://127.0.0.1:1/123/q", &entries)
            .await
            .expect("answered after a throttled attempt");
        assert_eq!(
            failed,
            vec![FailedEntry {
                id: "1".into(),
                sender_fault: false,
                code: "InternalError".into(),
                message: Some("try again".into()),
            }]
        );
        let requests = server.join().expect("server");
        assert_eq!(requests.len(), 2, "the throttled attempt was retried");
        let first = requests[0].to_ascii_lowercase();
        assert!(
            first.contains("x-amz-target: amazonsqs.sendmessagebatch"),
            "{first}"
        );
        assert!(first.contains("/us-east-1/sqs/aws4_request"), "{first}");
        let body: serde_json::Value =
            serde_json::from_str(&requests[1][requests[1].find("\r\n\r\n").expect("a body") + 4..])
                .expect("JSON");
        assert_eq!(
            body,
            serde_json::json!({
                "QueueUrl": "http://127.0.0.1:1/123/q",
                "Entries": [
                    {"Id": "0", "MessageBody": "{\"delivery_id\":\"d0\"}", "DelaySeconds": 30, "MessageGroupId": "ep_1"},
                    {"Id": "1", "MessageBody": "second"}
                ]
            })
        );
    }

    #[tokio::test]
    async fn a_refused_request_is_an_error_naming_sqs_and_its_code() {
        let (url, server) = serve(vec![answer(
            "400 Bad Request",
            r#"{"__type":"com.amazonaws.sqs#QueueDoesNotExist","message":"The specified queue does not exist."}"#,
        )]);
        let err = client(&url)
            .send_message_batch("q", &[])
            .await
            .expect_err("no such queue");
        assert_eq!(err.code(), Some("QueueDoesNotExist"));
        assert!(!err.is_retryable());
        assert_eq!(err.operation(), SEND_MESSAGE_BATCH);
        assert!(
            err.to_string()
                .starts_with("SQS SendMessageBatch answered 400"),
            "{err}"
        );
        assert_eq!(server.join().expect("server").len(), 1);
    }

    fn body_of(request: &str) -> serde_json::Value {
        serde_json::from_str(&request[request.find("\r\n\r\n").expect("a body") + 4..])
            .expect("JSON")
    }

    #[tokio::test]
    async fn a_long_poll_receives_and_its_messages_are_deleted_or_released_by_handle() {
        let (url, server) = serve(vec![
            answer(
                "200 OK",
                r#"{"Messages":[{"MessageId":"m1","ReceiptHandle":"rh-1","MD5OfBody":"x","Body":"{\"a\":1}"},{"MessageId":"m2","ReceiptHandle":"rh-2","MD5OfBody":"y","Body":"two"}]}"#,
            ),
            answer(
                "200 OK",
                r#"{"Successful":[{"Id":"0"}],"Failed":[{"Id":"1","SenderFault":true,"Code":"ReceiptHandleIsInvalid"}]}"#,
            ),
            answer("200 OK", r#"{"Successful":[{"Id":"0"}]}"#),
            answer("200 OK", r#"{}"#),
        ]);
        let sqs = client(&url);
        let dlq = "http://127.0.0.1:1/123/dlq";
        let got = sqs
            .receive_message(
                dlq,
                25,
                std::time::Duration::from_secs(100_000),
                std::time::Duration::from_secs(60),
            )
            .await
            .expect("received");
        assert_eq!(
            got,
            vec![
                ReceivedMessage {
                    receipt_handle: "rh-1".into(),
                    body: r#"{"a":1}"#.into()
                },
                ReceivedMessage {
                    receipt_handle: "rh-2".into(),
                    body: "two".into()
                },
            ]
        );
        let handles = |visibility| {
            ["rh-1", "rh-2"]
                .iter()
                .enumerate()
                .map(|(i, h)| HandleEntry {
                    id: i.to_string(),
                    receipt_handle: h,
                    visibility_timeout: visibility,
                })
                .collect::<Vec<_>>()
        };
        let refused = sqs
            .delete_message_batch(dlq, &handles(None))
            .await
            .expect("answered");
        assert_eq!(refused.len(), 1);
        assert_eq!(
            (refused[0].id.as_str(), refused[0].code.as_str()),
            ("1", "ReceiptHandleIsInvalid")
        );
        let refused = sqs
            .change_message_visibility_batch(dlq, &handles(Some(0))[..1])
            .await
            .expect("answered");
        assert!(refused.is_empty());
        // An empty long poll: no messages.
        assert!(sqs
            .receive_message(dlq, 1, std::time::Duration::ZERO, std::time::Duration::ZERO)
            .await
            .expect("answered")
            .is_empty());
        let requests = server.join().expect("server");
        assert!(requests[0]
            .to_ascii_lowercase()
            .contains("x-amz-target: amazonsqs.receivemessage"));
        // Clamped to SQS's limits: 10 messages, 12 h hidden, a 20 s wait.
        assert_eq!(
            body_of(&requests[0]),
            serde_json::json!({"QueueUrl": dlq, "MaxNumberOfMessages": 10,
                "VisibilityTimeout": 43200, "WaitTimeSeconds": 20})
        );
        assert!(requests[1]
            .to_ascii_lowercase()
            .contains("x-amz-target: amazonsqs.deletemessagebatch"));
        assert_eq!(
            body_of(&requests[1]),
            serde_json::json!({"QueueUrl": dlq, "Entries": [
                {"Id": "0", "ReceiptHandle": "rh-1"}, {"Id": "1", "ReceiptHandle": "rh-2"}]})
        );
        assert!(requests[2]
            .to_ascii_lowercase()
            .contains("x-amz-target: amazonsqs.changemessagevisibilitybatch"));
        assert_eq!(
            body_of(&requests[2]),
            serde_json::json!({"QueueUrl": dlq, "Entries": [
                {"Id": "0", "ReceiptHandle": "rh-1", "VisibilityTimeout": 0}]})
        );
    }
}
