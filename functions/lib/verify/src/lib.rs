//! Receiver-side toolkit for hookline webhooks (and any Standard Webhooks or
//! Stripe-style sender).
//!
//! - [`scheme`]: the two signature schemes as pure functions (MAC input, header
//!   formats). The sender (`hookline-core`) signs with these same functions.
//! - [`headers`]: the [`Headers`] lookup trait, implemented for slices, maps and
//!   (feature `http`) `http::HeaderMap`.
//! - [`verifier`]: [`Verifier`] checks a raw body + headers against one or more
//!   secrets, in constant time, with a timestamp tolerance in both directions.
//! - [`seen`]: receiver idempotency: a [`SeenStore`] trait (claim / mark / release
//!   with TTLs), an in-memory store, and [`process_once`] which ties them to
//!   your processing function.
//! - [`receiver`]: [`Receiver`] ties verification, a seen store and your
//!   processing function together (401 / 200 / 409 / 500 semantics), with
//!   `axum` and `lambda_http` adapters behind features.
//! - [`error`]: [`VerifyError`], one typed error per way a delivery can be rejected.
//!
//! ```
//! use hookline_verify::{scheme, Verifier};
//! let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
//! let body = br#"{"type":"order.paid","timestamp":"2021-02-25T15:02:10Z","data":{}}"#;
//! let key = scheme::standard::decode_secret(secret).unwrap();
//! let sig = scheme::standard::signature(&key, "msg_1", 1_614_265_330, body);
//! let headers = [
//!     ("webhook-id", "msg_1".to_string()),
//!     ("webhook-timestamp", "1614265330".to_string()),
//!     ("webhook-signature", scheme::standard::header_value(&[sig])),
//! ];
//! let verified = Verifier::new(secret).unwrap().verify_at(&headers[..], body, 1_614_265_400).unwrap();
//! assert_eq!(verified.message_id.as_deref(), Some("msg_1"));
//! ```

pub mod error;
pub mod headers;
pub mod receiver;
pub mod scheme;
pub mod seen;
pub mod verifier;

pub use error::VerifyError;
pub use headers::Headers;
pub use receiver::{Receiver, Reply};
pub use seen::{
    process_once, Claim, MemorySeenStore, ProcessError, Processed, SeenStore, SeenStoreError,
    DEFAULT_CLAIM_LEASE, DEFAULT_PROCESSED_TTL,
};
pub use verifier::{Scheme, Verified, Verifier, DEFAULT_TOLERANCE_SECS};
