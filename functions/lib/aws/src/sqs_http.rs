//! [`SqsHttp`]: SQS's JSON API spoken directly ([`crate::aws_json`]) for
//! the send every delivery's message makes (SendMessageBatch: dispatch's
//! first attempts, deliver's retries and re-queues). The rest (the DLQ's
//! receive, delete and release, its depth) stays on the SDK client: it
//! runs on an operator's demand, and a long poll outlasts this client's
//! attempt timeout.

use serde::{Deserialize, Serialize};

pub use crate::aws_json::AwsJsonError;
use crate::aws_json::{Operation, Service};

/// SQS, as signed and addressed.
pub const SQS: Service = Service {
    name: "SQS",
    signing_name: "sqs",
};

const SEND_MESSAGE_BATCH: Operation = Operation {
    service: SQS,
    name: "SendMessageBatch",
    target: "AmazonSQS.SendMessageBatch",
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

impl SqsHttp {
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
    use crate::test_server::serve;
    use aws_credential_types::provider::SharedCredentialsProvider;
    use aws_credential_types::Credentials;

    fn client(url: &str) -> SqsHttp {
        SqsHttp::new(
            reqwest::Client::new(),
            "us-east-1",
            SharedCredentialsProvider::new(Credentials::new("AKIDEXAMPLE", "s", None, None, "t")),
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
}
