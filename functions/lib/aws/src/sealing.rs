//! Endpoint signing secrets at rest: envelope encryption under a KMS key.
//!
//! A table export, a backup, a stream consumer or anyone with `GetItem` sees
//! `sealed:v2:{encrypted data key}:{nonce}:{ciphertext}` instead of a
//! `whsec_...` secret. The data key is a KMS `GenerateDataKey` AES-256 key,
//! reused for the secrets one process writes for [`DATA_KEY_LIFETIME`] (so
//! reading many endpoints costs one KMS `Decrypt` per data key, not per
//! endpoint); the plaintext data keys a process has seen are cached for its
//! life (decrypt once per container). AES-256-GCM with a random 96-bit
//! nonce; the associated data is the value's place ([`Place`]: the item's
//! table key and the field), so a sealed value moved to another field (a
//! header's value under another name, a previous secret as the current
//! one) or copied onto another item (another endpoint, another app's) does
//! not open. A value without the sealed prefix where a sealed one is
//! expected is refused as corrupt: nothing is read as plaintext. KMS
//! requests carry an encryption context (`purpose`), so the key policy can
//! limit what the data keys are for.

use hookline_core::sync::lock;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hookline_pipeline::PipelineError;
use rand::RngCore;

use crate::error::direct_error;
use crate::kms_http::KmsHttp;

/// How long one data key seals new secrets before a fresh one is asked for.
pub const DATA_KEY_LIFETIME: Duration = Duration::from_secs(15 * 60);
const PREFIX: &str = "sealed:v2:";

/// Where a sealed value lives: its item's table key and its field (`secret`,
/// `previous_secrets`, `headers.{name}`), bound as associated data.
#[derive(Debug, Clone, Copy)]
pub struct Place<'a> {
    pub pk: &'a str,
    pub sk: &'a str,
    pub field: &'a str,
}

impl Place<'_> {
    /// The associated data: the parts joined by NUL (none holds one).
    fn associated_data(&self) -> Vec<u8> {
        [self.pk, self.sk, self.field].join("\0").into_bytes()
    }
}
const CONTEXT_KEY: &str = "purpose";
const CONTEXT_VALUE: &str = "hookline-endpoint-secret";

/// A data key: its plaintext (for AES) and its KMS-encrypted form (stored).
#[derive(Clone)]
struct DataKey {
    plaintext: [u8; 32],
    encrypted: Vec<u8>,
}

/// Seals and opens endpoint secrets. Cheap to share (`Arc`).
pub struct SecretSealer {
    /// KMS on the functions' HTTP client ([`crate::kms_http`]).
    kms: KmsHttp,
    key_id: String,
    /// The data key new secrets are sealed with, and when it was made.
    current: Mutex<Option<(Instant, DataKey)>>,
    /// Plaintext data keys by their encrypted form.
    opened: Mutex<HashMap<Vec<u8>, [u8; 32]>>,
}

impl std::fmt::Debug for SecretSealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretSealer")
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

fn corrupt(reason: impl std::fmt::Display) -> PipelineError {
    PipelineError::Corrupt(format!("sealed secret: {reason}"))
}

/// A 256-bit data key from a KMS answer.
fn key_bytes(plaintext: &[u8]) -> Result<[u8; 32], PipelineError> {
    plaintext
        .try_into()
        .map_err(|_| corrupt("KMS returned no 256-bit data key"))
}

/// Whether `text` is a sealed value (a plaintext one is corrupt).
pub fn is_sealed(text: &str) -> bool {
    text.starts_with(PREFIX)
}

impl SecretSealer {
    pub fn new(kms: KmsHttp, key_id: impl Into<String>) -> Self {
        Self {
            kms,
            key_id: key_id.into(),
            current: Mutex::new(None),
            opened: Mutex::new(HashMap::new()),
        }
    }

    async fn data_key(&self) -> Result<DataKey, PipelineError> {
        if let Some((made, key)) = lock(&self.current).as_ref() {
            if made.elapsed() < DATA_KEY_LIFETIME {
                return Ok(key.clone());
            }
        }
        let out = self
            .kms
            .generate_data_key(&self.key_id, (CONTEXT_KEY, CONTEXT_VALUE))
            .await
            .map_err(direct_error)?;
        if out.encrypted.is_empty() {
            return Err(corrupt("KMS returned no encrypted data key"));
        }
        let key = DataKey {
            plaintext: key_bytes(&out.plaintext)?,
            encrypted: out.encrypted,
        };
        lock(&self.opened).insert(key.encrypted.clone(), key.plaintext);
        *lock(&self.current) = Some((Instant::now(), key.clone()));
        Ok(key)
    }

    async fn open_data_key(&self, encrypted: &[u8]) -> Result<[u8; 32], PipelineError> {
        if let Some(key) = lock(&self.opened).get(encrypted) {
            return Ok(*key);
        }
        let out = self
            .kms
            .decrypt(&self.key_id, encrypted, (CONTEXT_KEY, CONTEXT_VALUE))
            .await
            .map_err(direct_error)?;
        let plaintext = key_bytes(&out)?;
        lock(&self.opened).insert(encrypted.to_vec(), plaintext);
        Ok(plaintext)
    }

    /// Opens, concurrently, the data keys of these stored secrets that this
    /// process has not opened yet: reading many endpoints sealed by many
    /// containers costs one round trip to KMS, not one per data key.
    pub async fn prefetch<'a>(
        &self,
        stored: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), PipelineError> {
        let mut wanted: Vec<Vec<u8>> = Vec::new();
        for text in stored {
            let Some(edk) = text
                .strip_prefix(PREFIX)
                .and_then(|rest| rest.split(':').next())
                .and_then(|b64| STANDARD.decode(b64).ok())
            else {
                continue;
            };
            if !wanted.contains(&edk) && !lock(&self.opened).contains_key(&edk) {
                wanted.push(edk);
            }
        }
        futures::future::try_join_all(wanted.iter().map(|edk| self.open_data_key(edk))).await?;
        Ok(())
    }

    /// Seals `secret` for its `place` (bound as associated data).
    pub async fn seal(&self, secret: &str, place: Place<'_>) -> Result<String, PipelineError> {
        let key = self.data_key().await?;
        let mut nonce = [0u8; 12];
        rand::thread_rng().fill_bytes(&mut nonce);
        let cipher = Aes256Gcm::new(&key.plaintext.into());
        let sealed = cipher
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: secret.as_bytes(),
                    aad: &place.associated_data(),
                },
            )
            .map_err(|_| corrupt("encryption failed"))?;
        Ok(format!(
            "{PREFIX}{}:{}:{}",
            STANDARD.encode(&key.encrypted),
            STANDARD.encode(nonce),
            STANDARD.encode(sealed)
        ))
    }

    /// Opens a value sealed for `place`; anything else (a plaintext value,
    /// a value sealed for another place, tampered bytes) is corrupt.
    pub async fn open(&self, stored: &str, place: Place<'_>) -> Result<String, PipelineError> {
        let Some(rest) = stored.strip_prefix(PREFIX) else {
            return Err(corrupt(format!(
                "the {} field holds a value that is not sealed",
                place.field
            )));
        };
        let parts: Vec<&str> = rest.split(':').collect();
        let [edk, nonce, sealed] = parts.as_slice() else {
            return Err(corrupt("expected 3 parts"));
        };
        let decode = |part: &str| STANDARD.decode(part).map_err(|_| corrupt("not base64"));
        let (edk, nonce, sealed) = (decode(edk)?, decode(nonce)?, decode(sealed)?);
        if nonce.len() != 12 {
            return Err(corrupt("nonce is not 96 bits"));
        }
        let key = self.open_data_key(&edk).await?;
        let plain = Aes256Gcm::new(&key.into())
            .decrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: &sealed,
                    aad: &place.associated_data(),
                },
            )
            .map_err(|_| {
                corrupt(format!(
                    "the {} field does not open (tampered, or sealed for another field or item)",
                    place.field
                ))
            })?;
        String::from_utf8(plain).map_err(|_| corrupt("not UTF-8"))
    }

    /// How many data keys this process holds open (tests, diagnostics;
    /// the KMS requests themselves are seen by the client's observer).
    pub fn open_data_keys(&self) -> usize {
        lock(&self.opened).len()
    }
}
