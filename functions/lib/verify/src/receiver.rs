//! [`Receiver`]: verification + process-once + your processing function, with
//! the source article's semantics:
//!
//! | situation | answer | processed? |
//! |---|---|---|
//! | bad / missing / stale signature | 401 | no |
//! | only the Stripe-compatible signature (its id is unsigned) | 401, unless [`Receiver::dedup_unsigned_by_body`] | no |
//! | already processed (`webhook-id` seen) | 200 | not again |
//! | another copy is being processed right now | 409 (sender retries) | not twice |
//! | processing failed | 500 (sender retries); the id is **not** marked | attempted |
//! | processing succeeded | 200, after the id is marked for the TTL (7 days) | once |
//!
//! Adapters: with feature `axum`, [`Reply`] is an `IntoResponse`; with feature
//! `lambda`, [`Receiver::handle_lambda`] takes a `lambda_http::Request`.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use crate::seen::{
    process_once, ProcessError, Processed, SeenStore, DEFAULT_CLAIM_LEASE, DEFAULT_PROCESSED_TTL,
};
use crate::{Headers, Verified, Verifier};

/// What to answer the sender.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub message: String,
}

impl Reply {
    fn new(status: u16, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    /// Whether the sender will consider the delivery done.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// Verifies, deduplicates and processes webhooks.
///
/// Deduplication keys must be covered by the signature. Standard Webhooks
/// signs `webhook-id`; the Stripe-compatible scheme does not sign
/// `X-Webhook-ID`, so a captured request replayed within the timestamp
/// tolerance with the `webhook-*` headers stripped and a fresh `X-Webhook-ID`
/// would be processed again. By default such a request is refused (401); a
/// receiver whose sender sends only the Stripe-compatible scheme opts in to
/// [`Receiver::dedup_unsigned_by_body`].
#[derive(Debug)]
pub struct Receiver<S> {
    verifier: Verifier,
    store: S,
    lease: Duration,
    ttl: Duration,
    dedup_by_body: bool,
}

impl<S: SeenStore> Receiver<S> {
    pub fn new(verifier: Verifier, store: S) -> Self {
        Self {
            verifier,
            store,
            lease: DEFAULT_CLAIM_LEASE,
            ttl: DEFAULT_PROCESSED_TTL,
            dedup_by_body: false,
        }
    }

    /// Accepts Stripe-compatible-only requests, deduplicating them on the
    /// SHA-256 of the body (signed, and byte-identical on every retry of a
    /// message) instead of the unsigned `X-Webhook-ID`. Caveat: two distinct
    /// messages with byte-identical bodies (same type, same creation
    /// millisecond, same data) count as one.
    pub fn dedup_unsigned_by_body(mut self) -> Self {
        self.dedup_by_body = true;
        self
    }

    /// How long processed ids are remembered (default 7 days).
    pub fn processed_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long an in-progress claim blocks copies (default 60 s).
    pub fn claim_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    /// Handles one delivery: `process` runs at most once per message id
    /// (successfully), and only for correctly signed requests.
    pub async fn handle<H, F, Fut, E>(&self, headers: &H, body: &[u8], process: F) -> Reply
    where
        H: Headers + ?Sized,
        F: FnOnce(Verified) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: Display,
    {
        let verified = match self.verifier.verify(headers, body) {
            Ok(v) => v,
            Err(err) => return Reply::new(401, err.to_string()),
        };
        let id = if verified.id_signed {
            match verified.message_id.clone().filter(|id| !id.is_empty()) {
                Some(id) => id,
                None => return Reply::new(400, "no message id (webhook-id) to deduplicate on"),
            }
        } else if self.dedup_by_body {
            use sha2::Digest;
            format!("sha256:{}", hex::encode(sha2::Sha256::digest(body)))
        } else {
            return Reply::new(
                401,
                "the Standard Webhooks headers are required: X-Webhook-ID is not covered by the \
                 Stripe-compatible signature, so it cannot be trusted to deduplicate",
            );
        };
        match process_once(&self.store, &id, self.lease, self.ttl, || process(verified)).await {
            Ok(Processed::Done(())) => Reply::new(200, "processed"),
            Ok(Processed::Duplicate) => Reply::new(200, "already processed"),
            Ok(Processed::InProgress) => Reply::new(409, "being processed; retry later"),
            Err(ProcessError::Handler(err)) => Reply::new(500, format!("processing failed: {err}")),
            Err(ProcessError::Store(err)) => Reply::new(503, format!("{err}")),
        }
    }

    /// The `lambda_http` adapter: handles a request, answers a response.
    #[cfg(feature = "lambda")]
    pub async fn handle_lambda<F, Fut, E>(
        &self,
        request: &lambda_http::Request,
        process: F,
    ) -> lambda_http::Response<lambda_http::Body>
    where
        F: FnOnce(Verified) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: Display,
    {
        let body: &[u8] = request.body().as_ref();
        self.handle(request.headers(), body, process).await.into()
    }
}

#[cfg(feature = "lambda")]
impl From<Reply> for lambda_http::Response<lambda_http::Body> {
    fn from(reply: Reply) -> Self {
        let mut response = lambda_http::Response::new(lambda_http::Body::Text(reply.message));
        *response.status_mut() = lambda_http::http::StatusCode::from_u16(reply.status)
            .unwrap_or(lambda_http::http::StatusCode::INTERNAL_SERVER_ERROR);
        response
    }
}

#[cfg(feature = "axum")]
impl axum::response::IntoResponse for Reply {
    fn into_response(self) -> axum::response::Response {
        let status = axum::http::StatusCode::from_u16(self.status)
            .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
        (status, self.message).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheme::standard;
    use crate::MemorySeenStore;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn signed(id: &str, body: &[u8]) -> Vec<(String, String)> {
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let sig = standard::signature(&standard::decode_secret(SECRET).unwrap(), id, ts, body);
        vec![
            ("webhook-id".into(), id.into()),
            ("webhook-timestamp".into(), ts.to_string()),
            ("webhook-signature".into(), standard::header_value(&[sig])),
        ]
    }

    fn receiver() -> Receiver<MemorySeenStore> {
        Receiver::new(Verifier::new(SECRET).unwrap(), MemorySeenStore::new())
    }

    /// Sends `h` `times` times to a succeeding processor (each answered 200);
    /// how many times it ran.
    async fn successes<S: SeenStore>(
        r: &Receiver<S>,
        h: &[(String, String)],
        times: usize,
    ) -> usize {
        let runs = AtomicUsize::new(0);
        for _ in 0..times {
            let reply = r
                .handle(h, b"{}", |_| async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, String>(())
                })
                .await;
            assert_eq!(reply.status, 200);
        }
        runs.load(Ordering::SeqCst)
    }

    #[tokio::test]
    async fn duplicates_are_processed_once() {
        let r = receiver();
        let h = signed("msg_1", b"{}");
        assert_eq!(successes(&r, &h, 3).await, 1);
    }

    #[tokio::test]
    async fn concurrent_duplicates_do_not_both_process() {
        let r = Arc::new(receiver());
        let runs = Arc::new(AtomicUsize::new(0));
        let h = Arc::new(signed("msg_c", b"{}"));
        let mut tasks = Vec::new();
        for _ in 0..16 {
            let (r, runs, h) = (r.clone(), runs.clone(), h.clone());
            tasks.push(tokio::spawn(async move {
                r.handle(&*h, b"{}", |_| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Ok::<_, String>(())
                })
                .await
            }));
        }
        let mut statuses = Vec::new();
        for t in tasks {
            statuses.push(t.await.unwrap().status);
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert!(
            statuses.iter().all(|s| *s == 200 || *s == 409),
            "{statuses:?}"
        );
    }

    #[tokio::test]
    async fn failing_processor_gets_retried_then_succeeds_once() {
        let r = receiver();
        let h = signed("msg_f", b"{}");
        let reply = r
            .handle(&h, b"{}", |_| async { Err::<(), _>("database down") })
            .await;
        assert_eq!(reply.status, 500);
        assert_eq!(successes(&r, &h, 2).await, 1);
    }

    #[tokio::test]
    async fn bad_signatures_get_401_and_nothing_is_processed() {
        let r = receiver();
        let runs = AtomicUsize::new(0);
        let mut h = signed("msg_b", b"{}");
        h[2].1 = "v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=".into();
        let none: Vec<(String, String)> = vec![];
        for (headers, body) in [
            (&h, &b"{}"[..]),
            (&signed("msg_b", b"{}"), &b"{ }"[..]),
            (&none, &b"{}"[..]),
        ] {
            let reply = r
                .handle(headers, body, |_| async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, String>(())
                })
                .await;
            assert_eq!(reply.status, 401, "{reply:?}");
        }
        assert_eq!(runs.load(Ordering::SeqCst), 0);
        assert!(r.store().is_empty());
    }

    /// A captured request carrying both schemes, replayed within the
    /// tolerance with the `webhook-*` headers stripped and a new
    /// `X-Webhook-ID`: before the fix it was processed a second time.
    #[tokio::test]
    async fn a_replay_with_a_swapped_unsigned_id_is_not_processed_again() {
        use crate::scheme::stripe;
        let body = br#"{"type":"order.paid"}"#;
        let mut headers = signed("msg_r", body);
        let ts: i64 = headers[1].1.parse().unwrap();
        let sig = stripe::signature(SECRET, ts, body);
        headers.push(("x-webhook-id".into(), "msg_r".into()));
        headers.push(("x-webhook-timestamp".into(), ts.to_string()));
        headers.push((
            "x-webhook-signature".into(),
            stripe::header_value(ts, &[sig]),
        ));
        let runs = AtomicUsize::new(0);
        let process = |_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(())
        };
        assert_eq!(r_handle(&receiver(), &headers, body, &runs).await, 200);
        // The attacker's replay on the same receiver.
        let r = receiver();
        assert_eq!(r.handle(&headers, body, process).await.status, 200);
        let replay: Vec<(String, String)> = headers
            .iter()
            .filter(|(k, _)| !k.starts_with("webhook-"))
            .map(|(k, v)| {
                if k == "x-webhook-id" {
                    (k.clone(), "msg_forged".into())
                } else {
                    (k.clone(), v.clone())
                }
            })
            .collect();
        let reply = r.handle(&replay, body, process).await;
        assert_eq!(reply.status, 401, "{reply:?}");
        assert_eq!(
            runs.load(Ordering::SeqCst),
            2,
            "one run per receiver, none for the replay"
        );

        // Opted in to Stripe-only: deduplicated on the signed body instead.
        let r = receiver().dedup_unsigned_by_body();
        assert_eq!(r.handle(&replay, body, process).await.status, 200);
        let mut again = replay.clone();
        again.retain(|(k, _)| k != "x-webhook-id");
        again.push(("x-webhook-id".into(), "msg_forged_2".into()));
        let reply = r.handle(&again, body, process).await;
        assert_eq!(
            (reply.status, reply.message.as_str()),
            (200, "already processed")
        );
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    }

    async fn r_handle(
        r: &Receiver<MemorySeenStore>,
        headers: &[(String, String)],
        body: &[u8],
        runs: &AtomicUsize,
    ) -> u16 {
        r.handle(headers, body, |_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(())
        })
        .await
        .status
    }
}
