//! The one error type of this crate: why a delivery was rejected.

use thiserror::Error;

/// Why a webhook failed verification. Messages never contain secrets or
/// signature material, so they are safe to log and to return to the sender.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum VerifyError {
    /// A secret handed to the verifier is not usable (empty, or not base64 after `whsec_`).
    #[error("invalid secret: {0}")]
    InvalidSecret(&'static str),
    /// A required header is absent.
    #[error("missing header `{0}`")]
    MissingHeader(&'static str),
    /// A header is present but cannot be parsed.
    #[error("malformed header `{header}`: {reason}")]
    MalformedHeader {
        header: &'static str,
        reason: &'static str,
    },
    /// The signed timestamp is older than the tolerance allows (possible replay).
    #[error("timestamp too old: {age_secs} s in the past, tolerance {tolerance_secs} s")]
    TimestampTooOld { age_secs: i128, tolerance_secs: u64 },
    /// The signed timestamp is further in the future than the tolerance allows.
    #[error("timestamp in the future: {ahead_secs} s ahead, tolerance {tolerance_secs} s")]
    TimestampInFuture {
        ahead_secs: i128,
        tolerance_secs: u64,
    },
    /// The signature header holds no signature of a version this crate knows (`v1`).
    #[error("no supported (v1) signature in `{0}`")]
    NoSupportedSignature(&'static str),
    /// Well-formed, fresh, but no signature matches any of the secrets.
    #[error("signature mismatch")]
    SignatureMismatch,
}
