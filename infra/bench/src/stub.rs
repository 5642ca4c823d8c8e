//! A minimal Lambda Runtime API on loopback: serves queued invocation events
//! on `GET /2018-06-01/runtime/invocation/next`, records responses, and holds
//! the `next` call open when nothing is queued (as Lambda does between
//! invocations), noting when the function first asked. A connection
//! accepted before the last [`RuntimeStub::reset`] (a process stopped since)
//! is never handed an event: a `next` it sent just before it was killed
//! would otherwise take the next process's first event.

use hookline_core::sync::lock;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::connect_info::{ConnectInfo, Connected};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::IncomingStream;
use axum::Router;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::Notify;

#[derive(Default)]
struct Inner {
    first_next: Option<Instant>,
    /// When the first invocation's answer (response or error) was posted.
    first_answer: Option<Instant>,
    /// Events still to serve.
    events: VecDeque<String>,
    /// Responses (or errors) received, in order.
    responses: Vec<(String, String)>,
    /// `next` calls that found nothing queued.
    idle_nexts: usize,
    counter: u64,
}

/// The stub's shared state.
#[derive(Clone, Default)]
pub struct RuntimeStub {
    inner: Arc<Mutex<Inner>>,
    changed: Arc<Notify>,
}

/// Resets so far (of any stub in this process: the benchmark runs one at a
/// time).
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// The [`GENERATION`] a connection was accepted in.
#[derive(Clone, Copy, Debug)]
struct Accepted(u64);

impl Connected<IncomingStream<'_, tokio::net::TcpListener>> for Accepted {
    fn connect_info(_: IncomingStream<'_, tokio::net::TcpListener>) -> Self {
        Self(GENERATION.load(Ordering::SeqCst))
    }
}

async fn next(
    State(stub): State<RuntimeStub>,
    ConnectInfo(accepted): ConnectInfo<Accepted>,
) -> Response {
    if accepted.0 != GENERATION.load(Ordering::SeqCst) {
        // A stopped process's connection: it gets nothing.
        return std::future::pending::<Response>().await;
    }
    let event = {
        let mut inner = lock(&stub.inner);
        if inner.first_next.is_none() {
            inner.first_next = Some(Instant::now());
        }
        let event = inner.events.pop_front();
        if event.is_none() {
            inner.idle_nexts += 1;
        } else {
            inner.counter += 1;
        }
        event.map(|e| (e, inner.counter))
    };
    stub.changed.notify_waiters();
    match event {
        Some((body, n)) => {
            let mut headers = HeaderMap::new();
            let id = format!("bench-{n}");
            let deadline = (chrono::Utc::now().timestamp_millis() + 300_000).to_string();
            for (k, v) in [
                ("lambda-runtime-aws-request-id", id.as_str()),
                ("lambda-runtime-deadline-ms", deadline.as_str()),
                (
                    "lambda-runtime-invoked-function-arn",
                    "arn:aws:lambda:us-east-1:123456789012:function:bench",
                ),
                (
                    "lambda-runtime-trace-id",
                    "Root=1-5759e988-bd862e3fe1be46a994272793",
                ),
                ("content-type", "application/json"),
            ] {
                if let Ok(v) = HeaderValue::from_str(v) {
                    headers.insert(k, v);
                }
            }
            (StatusCode::OK, headers, body).into_response()
        }
        None => std::future::pending::<Response>().await,
    }
}

async fn respond(
    State(stub): State<RuntimeStub>,
    Path((id, kind)): Path<(String, String)>,
    body: Bytes,
) -> StatusCode {
    let mut inner = lock(&stub.inner);
    if inner.first_answer.is_none() {
        inner.first_answer = Some(Instant::now());
    }
    inner.responses.push((
        format!("{id}/{kind}"),
        String::from_utf8_lossy(&body).into_owned(),
    ));
    drop(inner);
    stub.changed.notify_waiters();
    StatusCode::ACCEPTED
}

async fn init_error(State(stub): State<RuntimeStub>, body: Bytes) -> StatusCode {
    lock(&stub.inner).responses.push((
        "init/error".into(),
        String::from_utf8_lossy(&body).into_owned(),
    ));
    stub.changed.notify_waiters();
    StatusCode::ACCEPTED
}

impl RuntimeStub {
    /// Serves on an ephemeral loopback port; returns the `host:port`.
    pub async fn start() -> std::io::Result<(Self, SocketAddr)> {
        let stub = Self::default();
        let app = Router::new()
            .route("/2018-06-01/runtime/invocation/next", get(next))
            .route("/2018-06-01/runtime/invocation/{id}/{kind}", post(respond))
            .route("/2018-06-01/runtime/init/error", post(init_error))
            .with_state(stub.clone());
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            let _ = axum::serve(
                listener,
                app.into_make_service_with_connect_info::<Accepted>(),
            )
            .await;
        });
        Ok((stub, addr))
    }

    /// Forgets everything; queues `events` for the next process.
    pub fn reset(&self, events: Vec<String>) {
        let mut inner = lock(&self.inner);
        GENERATION.fetch_add(1, Ordering::SeqCst);
        *inner = Inner {
            events: events.into(),
            ..Inner::default()
        };
    }

    /// Waits (bounded) until `done` holds of the state.
    async fn wait_for(&self, timeout: std::time::Duration, done: impl Fn(&Inner) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            if done(&lock(&self.inner)) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let _ = tokio::time::timeout(left.min(std::time::Duration::from_millis(50)), notified)
                .await;
        }
    }

    /// When the function first called `next` (waits up to `timeout`).
    pub async fn first_next(&self, timeout: std::time::Duration) -> Option<Instant> {
        self.wait_for(timeout, |i| i.first_next.is_some()).await;
        lock(&self.inner).first_next
    }

    /// When the first invocation was answered, and how (`<id>/response` or
    /// `<id>/error` and the body); waits up to `timeout`.
    pub async fn first_answer(
        &self,
        timeout: std::time::Duration,
    ) -> Option<(Instant, (String, String))> {
        self.wait_for(timeout, |i| i.first_answer.is_some()).await;
        let inner = lock(&self.inner);
        Some((inner.first_answer?, inner.responses.first()?.clone()))
    }

    /// Waits until every queued event was answered and the function asked
    /// for the next one; returns the responses.
    pub async fn all_answered(
        &self,
        timeout: std::time::Duration,
    ) -> Option<Vec<(String, String)>> {
        let ok = self
            .wait_for(timeout, |i| {
                i.events.is_empty() && i.idle_nexts > 0 && i.responses.len() as u64 >= i.counter
            })
            .await;
        ok.then(|| lock(&self.inner).responses.clone())
    }
}
