//! [`KmsHttp`]: KMS's JSON API (1.1) spoken directly ([`crate::aws_json`])
//! for the two operations the endpoints' sealed secrets need
//! ([`crate::sealing`]): `GenerateDataKey` when a process first seals a
//! secret, `Decrypt` when it first opens one sealed by another. Deliver's
//! first attempt in a fresh container opens its endpoint's secret, so this
//! is on every cold start's path: on the direct client it builds no SDK
//! configuration or client (and the functions link no KMS SDK).

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde::{Deserialize, Serialize};

pub use crate::aws_json::AwsJsonError;
use crate::aws_json::{Operation, Service};

/// KMS, as signed and addressed.
pub const KMS: Service = Service {
    name: "KMS",
    signing_name: "kms",
    content_type: crate::aws_json::JSON_1_1,
};

const GENERATE_DATA_KEY: Operation = Operation {
    service: &KMS,
    name: "GenerateDataKey",
    target: "TrentService.GenerateDataKey",
};

const DECRYPT: Operation = Operation {
    service: &KMS,
    name: "Decrypt",
    target: "TrentService.Decrypt",
};

crate::aws_json::service_client!(
    /// KMS's JSON API on one HTTP client. Cheap to clone.
    KmsHttp,
    KMS
);

/// A data key KMS made: its plaintext and its encrypted form (what is
/// stored; only KMS turns it back into the plaintext).
#[derive(Clone, PartialEq, Eq)]
pub struct GeneratedKey {
    pub plaintext: Vec<u8>,
    pub encrypted: Vec<u8>,
}

impl std::fmt::Debug for GeneratedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GeneratedKey")
            .field("plaintext", &"<redacted>")
            .field("encrypted_len", &self.encrypted.len())
            .finish()
    }
}

/// Binary values travel as base64 strings in KMS's JSON.
mod blob {
    use super::{Engine, STANDARD};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        STANDARD
            .decode(text.as_bytes())
            .map_err(serde::de::Error::custom)
    }
}

/// The encryption context of a request: one pair, as a JSON object.
type Context<'a> = std::collections::BTreeMap<&'a str, &'a str>;

impl KmsHttp {
    /// A new AES-256 data key under `key_id`, bound to the encryption
    /// context `context` (a name and its value).
    pub async fn generate_data_key(
        &self,
        key_id: &str,
        context: (&str, &str),
    ) -> Result<GeneratedKey, AwsJsonError> {
        #[derive(Serialize)]
        #[serde(rename_all = "PascalCase")]
        struct Request<'a> {
            key_id: &'a str,
            key_spec: &'a str,
            encryption_context: Context<'a>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Response {
            #[serde(with = "blob")]
            plaintext: Vec<u8>,
            #[serde(with = "blob")]
            ciphertext_blob: Vec<u8>,
        }
        let request = Request {
            key_id,
            key_spec: "AES_256",
            encryption_context: Context::from([context]),
        };
        let response: Response = self.json.call(GENERATE_DATA_KEY, &request).await?;
        Ok(GeneratedKey {
            plaintext: response.plaintext,
            encrypted: response.ciphertext_blob,
        })
    }

    /// The plaintext of `encrypted` (a data key made under `key_id` with
    /// the encryption context `context`).
    pub async fn decrypt(
        &self,
        key_id: &str,
        encrypted: &[u8],
        context: (&str, &str),
    ) -> Result<Vec<u8>, AwsJsonError> {
        #[derive(Serialize)]
        #[serde(rename_all = "PascalCase")]
        struct Request<'a> {
            #[serde(with = "blob")]
            ciphertext_blob: &'a [u8],
            key_id: &'a str,
            encryption_context: Context<'a>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Response {
            #[serde(with = "blob")]
            plaintext: Vec<u8>,
        }
        let request = Request {
            ciphertext_blob: encrypted,
            key_id,
            encryption_context: Context::from([context]),
        };
        let response: Response = self.json.call(DECRYPT, &request).await?;
        Ok(response.plaintext)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_server::{answer, credentials, serve};

    fn client(url: &str) -> KmsHttp {
        KmsHttp::new(
            crate::clients::aws_http(None),
            "us-east-1",
            credentials(),
            Some(url),
        )
        .expect("valid url")
    }

    fn body_of(request: &str) -> serde_json::Value {
        serde_json::from_str(&request[request.find("\r\n\r\n").expect("a body") + 4..])
            .expect("JSON")
    }

    #[tokio::test]
    async fn a_data_key_is_asked_for_in_kms_json_and_its_blobs_decoded() {
        let (url, server) = serve(vec![answer(
            "200 OK",
            r#"{"KeyId":"arn:aws:kms:us-east-1:1:key/k","Plaintext":"AAECAw==","CiphertextBlob":"BAUG"}"#,
        )]);
        let key = client(&url)
            .generate_data_key("alias/k", ("purpose", "p"))
            .await
            .expect("answered");
        assert_eq!(key.plaintext, [0, 1, 2, 3]);
        assert_eq!(key.encrypted, [4, 5, 6]);
        assert!(!format!("{key:?}").contains("[0, 1"), "plaintext redacted");
        let requests = server.join().expect("server");
        let head = requests[0].to_ascii_lowercase();
        assert!(
            head.contains("x-amz-target: trentservice.generatedatakey"),
            "{head}"
        );
        assert!(
            head.contains("content-type: application/x-amz-json-1.1"),
            "{head}"
        );
        assert!(head.contains("/us-east-1/kms/aws4_request"), "{head}");
        assert_eq!(
            body_of(&requests[0]),
            serde_json::json!({"KeyId": "alias/k", "KeySpec": "AES_256",
                "EncryptionContext": {"purpose": "p"}})
        );
    }

    #[tokio::test]
    async fn decrypt_sends_the_blob_in_base64_and_a_refusal_keeps_its_code() {
        let (url, server) = serve(vec![
            answer("200 OK", r#"{"KeyId":"k","Plaintext":"CQg="}"#),
            answer(
                "400 Bad Request",
                r#"{"__type":"InvalidCiphertextException","message":"no"}"#,
            ),
        ]);
        let kms = client(&url);
        let plain = kms
            .decrypt("alias/k", &[1, 2, 3], ("purpose", "p"))
            .await
            .expect("answered");
        assert_eq!(plain, [9, 8]);
        let refused = kms
            .decrypt("alias/k", &[7], ("purpose", "p"))
            .await
            .expect_err("refused");
        assert_eq!(refused.code(), Some("InvalidCiphertextException"));
        assert!(!refused.is_retryable());
        let requests = server.join().expect("server");
        assert_eq!(
            body_of(&requests[0]),
            serde_json::json!({"CiphertextBlob": "AQID", "KeyId": "alias/k",
                "EncryptionContext": {"purpose": "p"}})
        );
    }
}
