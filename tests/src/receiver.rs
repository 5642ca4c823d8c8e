//! Real HTTP receivers on loopback with scripted answers.

use hookline_core::sync::lock;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use hookline_verify::{Scheme, Verifier};

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Reply {
    Status(u16),
    /// A status with a `Retry-After` header value.
    RetryAfter(u16, String),
    /// Wait this long, then answer 200 (for timeouts).
    Slow(Duration),
    /// A redirect to `location`.
    Redirect {
        status: u16,
        location: String,
    },
    /// A status with exactly these body bytes (e.g. invalid UTF-8).
    Body(u16, Vec<u8>),
    /// A status with a streamed body of this many bytes.
    Huge(u16, usize),
    /// 200, then the body trickles one byte per interval, without end.
    Trickle(Duration),
}

/// A request the receiver got.
#[derive(Debug, Clone)]
pub struct Received {
    pub at: Instant,
    pub webhook_id: String,
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
    pub standard_ok: bool,
    pub stripe_ok: bool,
    pub answered: u16,
}

#[derive(Debug, Default)]
struct ReceiverState {
    script: Mutex<VecDeque<Reply>>,
    fallback: Mutex<Option<Reply>>,
    secret: Mutex<Option<String>>,
    received: Mutex<Vec<Received>>,
    flaky: Mutex<Option<Flaky>>,
}

/// Random failures ([`Receiver::flaky`]): a 500 for a share of requests
/// (at most `max_per_id` per webhook id), and always for a body holding
/// `dead` (a message that never gets through).
#[derive(Debug)]
struct Flaky {
    rng: rand::rngs::StdRng,
    share: f64,
    max_per_id: u32,
    failures: HashMap<String, u32>,
    dead: String,
}

impl Flaky {
    fn reply(&mut self, webhook_id: &str, body: &[u8]) -> Reply {
        use rand::Rng;
        if String::from_utf8_lossy(body).contains(&self.dead) {
            return Reply::Status(500);
        }
        let failed = self.failures.entry(webhook_id.to_owned()).or_default();
        if *failed < self.max_per_id && self.rng.gen_bool(self.share) {
            *failed += 1;
            return Reply::Status(500);
        }
        Reply::Status(200)
    }
}

/// A running receiver; stops when dropped.
#[derive(Debug)]
pub struct Receiver {
    pub url: String,
    state: Arc<ReceiverState>,
    task: tokio::task::JoinHandle<()>,
}

async fn handle(
    State(state): State<Arc<ReceiverState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let pairs: Vec<(String, String)> = headers
        .iter()
        .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
        .collect();
    let webhook_id = pairs
        .iter()
        .find(|(k, _)| k == "webhook-id")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    let flaky = lock(&state.flaky)
        .as_mut()
        .map(|f| f.reply(&webhook_id, &body));
    let reply = flaky
        .or_else(|| lock(&state.script).pop_front())
        .or_else(|| lock(&state.fallback).clone())
        .unwrap_or(Reply::Status(200));
    let secret = lock(&state.secret).clone();
    let (standard_ok, stripe_ok) = match secret.as_deref().map(Verifier::new) {
        Some(Ok(v)) => {
            let std_ok = v
                .verify_standard_at(&pairs, &body, chrono::Utc::now().timestamp())
                .map(|r| r.scheme == Scheme::StandardWebhooks)
                .unwrap_or(false);
            let stripe_ok = v
                .verify_stripe_at(&pairs, &body, chrono::Utc::now().timestamp())
                .is_ok();
            (std_ok, stripe_ok)
        }
        _ => (false, false),
    };
    let answered = match &reply {
        Reply::Status(s)
        | Reply::RetryAfter(s, _)
        | Reply::Redirect { status: s, .. }
        | Reply::Body(s, _)
        | Reply::Huge(s, _) => *s,
        Reply::Slow(_) | Reply::Trickle(_) => 200,
    };
    lock(&state.received).push(Received {
        at: Instant::now(),
        webhook_id,
        headers: pairs.into_iter().collect(),
        body: body.to_vec(),
        standard_ok,
        stripe_ok,
        answered,
    });
    match reply {
        Reply::Status(s) => {
            (StatusCode::from_u16(s).unwrap_or(StatusCode::OK), "ok").into_response()
        }
        Reply::RetryAfter(s, value) => (
            StatusCode::from_u16(s).unwrap_or(StatusCode::OK),
            [("retry-after", value)],
            "later",
        )
            .into_response(),
        Reply::Slow(d) => {
            tokio::time::sleep(d).await;
            (StatusCode::OK, "slow ok").into_response()
        }
        Reply::Redirect { status, location } => (
            StatusCode::from_u16(status).unwrap_or(StatusCode::FOUND),
            [("location", location)],
            "moved",
        )
            .into_response(),
        Reply::Body(s, bytes) => {
            (StatusCode::from_u16(s).unwrap_or(StatusCode::OK), bytes).into_response()
        }
        Reply::Huge(s, len) => {
            let chunk = bytes::Bytes::from(vec![b'x'; 64 * 1024]);
            let chunks = len.div_ceil(chunk.len());
            let stream = futures::stream::iter(
                (0..chunks).map(move |_| Ok::<_, std::io::Error>(chunk.clone())),
            );
            (
                StatusCode::from_u16(s).unwrap_or(StatusCode::OK),
                axum::body::Body::from_stream(stream),
            )
                .into_response()
        }
        Reply::Trickle(every) => {
            let stream = futures::stream::unfold((), move |()| async move {
                tokio::time::sleep(every).await;
                Some((Ok::<_, std::io::Error>(bytes::Bytes::from_static(b".")), ()))
            });
            (StatusCode::OK, axum::body::Body::from_stream(stream)).into_response()
        }
    }
}

impl Receiver {
    /// Starts a receiver answering `fallback` once the script is used up.
    pub async fn start(script: Vec<Reply>, fallback: Reply) -> Self {
        let state = Arc::new(ReceiverState::default());
        *lock(&state.script) = script.into();
        *lock(&state.fallback) = Some(fallback);
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("local addr");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            url: format!("http://{addr}/hook"),
            state,
            task,
        }
    }

    /// Answers 500 to a random `share` of requests (seeded; at most
    /// `max_per_id` times for one webhook id, so no delivery exhausts a
    /// schedule longer than that) and to every request whose body holds
    /// `dead`; 200 otherwise.
    pub async fn flaky(seed: u64, share: f64, max_per_id: u32, dead: &str) -> Self {
        use rand::SeedableRng;
        let receiver = Self::healthy().await;
        *lock(&receiver.state.flaky) = Some(Flaky {
            rng: rand::rngs::StdRng::seed_from_u64(seed),
            share,
            max_per_id,
            failures: HashMap::new(),
            dead: dead.to_owned(),
        });
        receiver
    }

    /// Always answers 200.
    pub async fn healthy() -> Self {
        Self::start(vec![], Reply::Status(200)).await
    }

    /// The secret to verify with (set after the endpoint is created).
    pub fn set_secret(&self, secret: &str) {
        *lock(&self.state.secret) = Some(secret.to_owned());
    }

    /// Changes the answer once the script is used up.
    pub fn set_fallback(&self, reply: Reply) {
        *lock(&self.state.fallback) = Some(reply);
    }

    pub fn received(&self) -> Vec<Received> {
        lock(&self.state.received).clone()
    }

    /// Requests answered 2xx.
    pub fn accepted(&self) -> Vec<Received> {
        self.received()
            .into_iter()
            .filter(|r| (200..300).contains(&r.answered))
            .collect()
    }

    /// Distinct webhook ids answered 2xx.
    pub fn unique_accepted(&self) -> usize {
        let mut ids: Vec<String> = self.accepted().into_iter().map(|r| r.webhook_id).collect();
        ids.sort();
        ids.dedup();
        ids.len()
    }

    /// 2xx answers beyond the first per webhook id (at-least-once duplicates).
    pub fn duplicates(&self) -> usize {
        self.accepted().len() - self.unique_accepted()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}
