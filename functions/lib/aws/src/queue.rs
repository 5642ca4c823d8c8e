//! [`SqsQueue`]: the pipeline's [`Queue`] on the delivery queue and its DLQ.

use std::time::Duration;

use aws_sdk_sqs::types::QueueAttributeName;
use aws_sdk_sqs::Client;
use hookline_pipeline::messages::DeliveryMessage;
use hookline_pipeline::ports::{DlqEntry, Queue, Result};

use crate::error::{corrupt, direct_error, queue_error};
use crate::sqs_http::{BatchEntry, HandleEntry, SqsHttp, BATCH_MAX};

/// Logs an entry SQS refused in a batch `operation` (its code, never the
/// message).
fn warn_refused(operation: &str, entry: &crate::sqs_http::FailedEntry) {
    tracing::warn!(
        operation,
        code = %entry.code,
        sender_fault = entry.sender_fault,
        "batch entry refused"
    );
}

/// The delivery queue and DLQ. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SqsQueue {
    /// For the DLQ's operations; built on first use (a function that does
    /// not touch the DLQ never builds it).
    client: crate::lazy::Lazy<Client>,
    /// The sends.
    http: SqsHttp,
    queue_url: String,
    dlq_url: String,
}

impl SqsQueue {
    /// The queue at `queue_url` and its DLQ at `dlq_url`, on `clients`.
    pub fn new(
        clients: &crate::clients::Clients,
        queue_url: impl Into<String>,
        dlq_url: impl Into<String>,
    ) -> Self {
        Self {
            client: clients.sqs.clone(),
            http: clients.sqs_http.clone(),
            queue_url: queue_url.into(),
            dlq_url: dlq_url.into(),
        }
    }

    pub fn client(&self) -> &Client {
        self.client.get()
    }

    pub fn queue_url(&self) -> &str {
        &self.queue_url
    }

    pub fn dlq_url(&self) -> &str {
        &self.dlq_url
    }

    /// Deletes the DLQ messages of `receipt_handles` (`visibility: None`)
    /// or makes them visible again after `visibility` seconds, by batches
    /// of 10. A refused entry leaves its message in the DLQ, where the
    /// next drain finds it again (a message redriven twice is delivered
    /// at most once more: deliver judges it by the delivery's version);
    /// it is logged with SQS's code, never dropped in silence.
    async fn on_dlq_handles(
        &self,
        receipt_handles: &[String],
        visibility: Option<i32>,
    ) -> Result<()> {
        for chunk in receipt_handles.chunks(BATCH_MAX) {
            let entries: Vec<HandleEntry<'_>> = chunk
                .iter()
                .enumerate()
                .map(|(i, handle)| HandleEntry {
                    id: i.to_string(),
                    receipt_handle: handle,
                    visibility_timeout: visibility,
                })
                .collect();
            let refused = match visibility {
                None => {
                    self.http
                        .delete_message_batch(&self.dlq_url, &entries)
                        .await
                }
                Some(_) => {
                    self.http
                        .change_message_visibility_batch(&self.dlq_url, &entries)
                        .await
                }
            }
            .map_err(direct_error)?;
            let operation = match visibility {
                None => "DeleteMessageBatch",
                Some(_) => "ChangeMessageVisibilityBatch",
            };
            for f in refused {
                // The message stays in the DLQ.
                warn_refused(operation, &f);
            }
        }
        Ok(())
    }
}

impl Queue for SqsQueue {
    async fn send_deliveries(&self, messages: &[(DeliveryMessage, i32)]) -> Result<Vec<usize>> {
        let mut failed = Vec::new();
        for (chunk_index, chunk) in messages.chunks(BATCH_MAX).enumerate() {
            let base = chunk_index * BATCH_MAX;
            let entries: Vec<BatchEntry<'_>> = chunk
                .iter()
                .enumerate()
                .map(|(i, (message, delay))| BatchEntry {
                    id: (base + i).to_string(),
                    message_body: message.to_json(),
                    delay_seconds: Some(*delay),
                    // SQS fair queues: on a standard queue the group is
                    // the tenant, so one endpoint's backlog does not
                    // hold up the others' messages.
                    message_group_id: Some(message.endpoint_id.as_str()),
                })
                .collect();
            let refused = self
                .http
                .send_message_batch(&self.queue_url, &entries)
                .await
                .map_err(direct_error)?;
            for f in refused {
                warn_refused("SendMessageBatch", &f);
                // An id naming no entry of this request would leave a
                // message counted as queued that SQS may not hold: the
                // whole batch is an error (retried), never a silent success.
                match f.id.parse::<usize>() {
                    Ok(i) if (base..base + chunk.len()).contains(&i) => failed.push(i),
                    _ => {
                        return Err(corrupt(
                            "SendMessageBatch answer",
                            format!("a refused entry names no entry sent: {:?}", f.id),
                        ))
                    }
                }
            }
        }
        Ok(failed)
    }

    async fn send_to_dlq(&self, message: &DeliveryMessage) -> Result<()> {
        self.client()
            .send_message()
            .queue_url(&self.dlq_url)
            .message_body(message.to_json())
            .send()
            .await
            .map_err(|e| queue_error("SendMessage", e))?;
        Ok(())
    }

    async fn receive_dlq(
        &self,
        max: i32,
        visibility: Duration,
        wait: Duration,
    ) -> Result<Vec<DlqEntry>> {
        let messages = self
            .http
            .receive_message(&self.dlq_url, max, visibility, wait)
            .await
            .map_err(direct_error)?;
        Ok(messages
            .into_iter()
            .map(|m| DlqEntry {
                receipt_handle: m.receipt_handle,
                body: m.body,
            })
            .collect())
    }

    async fn delete_dlq(&self, receipt_handles: &[String]) -> Result<()> {
        self.on_dlq_handles(receipt_handles, None).await
    }

    async fn release_dlq(&self, receipt_handles: &[String]) -> Result<()> {
        self.on_dlq_handles(receipt_handles, Some(0)).await
    }

    async fn dlq_depth(&self) -> Result<u64> {
        let out = self
            .client()
            .get_queue_attributes()
            .queue_url(&self.dlq_url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .map_err(|e| queue_error("GetQueueAttributes", e))?;
        let attrs = out.attributes.unwrap_or_default();
        let get = |k: QueueAttributeName| {
            attrs
                .get(&k)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        Ok(get(QueueAttributeName::ApproximateNumberOfMessages)
            + get(QueueAttributeName::ApproximateNumberOfMessagesNotVisible))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clients::{AwsEnvironment, Clients};
    use crate::test_server::serve;

    fn queue(url: &str) -> SqsQueue {
        let aws = AwsEnvironment::from_lookup(|var| match var {
            "AWS_REGION" => Some("us-east-1".into()),
            "AWS_ACCESS_KEY_ID" => Some("AKIDEXAMPLE".into()),
            "AWS_SECRET_ACCESS_KEY" => Some("s".into()),
            _ => None,
        })
        .expect("a complete environment");
        SqsQueue::new(
            &Clients::new(&aws, Some(url)),
            format!("{url}/123/q"),
            "dlq",
        )
    }

    /// The message of `events/sqs-deliver.json` (the same one each time:
    /// only the entries' positions matter here).
    fn message(_: usize) -> (DeliveryMessage, i32) {
        let fixture: serde_json::Value =
            serde_json::from_str(include_str!("../../../../events/sqs-deliver.json"))
                .expect("the fixture is JSON");
        let body = fixture["Records"][0]["body"].as_str().expect("a body");
        (serde_json::from_str(body).expect("a delivery message"), 0)
    }

    fn answer(failed: &str) -> String {
        let body = format!(r#"{{"Successful":[],"Failed":[{failed}]}}"#);
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/x-amz-json-1.0\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
    }

    #[tokio::test]
    async fn refused_entries_are_returned_by_their_index_across_chunks() {
        let messages: Vec<_> = (0..12).map(message).collect();
        let (url, server) = serve(vec![
            answer(r#"{"Id":"3","SenderFault":false,"Code":"InternalError"}"#),
            answer(r#"{"Id":"11","SenderFault":false,"Code":"InternalError"}"#),
        ]);
        let failed = queue(&url)
            .send_deliveries(&messages)
            .await
            .expect("answered");
        assert_eq!(failed, vec![3, 11]);
        assert_eq!(server.join().expect("server").len(), 2, "two chunks");
    }

    #[tokio::test]
    async fn a_refused_entry_naming_no_entry_sent_is_an_error() {
        // Not a number, and a number of the other chunk: neither may pass
        // for a refusal of one of this request's entries, nor be ignored.
        for id in ["x", "10"] {
            let (url, server) = serve(vec![answer(&format!(
                r#"{{"Id":"{id}","SenderFault":false,"Code":"InternalError"}}"#
            ))]);
            let err = queue(&url)
                .send_deliveries(&(0..3).map(message).collect::<Vec<_>>())
                .await
                .expect_err("an answer naming an entry never sent");
            assert!(
                err.to_string().contains("names no entry sent"),
                "{id}: {err}"
            );
            server.join().expect("server");
        }
    }
}
