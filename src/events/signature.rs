//! Signed webhook deliveries, as the Standard Webhooks specification
//! (<https://www.standardwebhooks.com/>) has them, so a receiver can check that a POST comes
//! from whoever holds the secret and was not changed on the way:
//!
//! - `webhook-id`: the event's id (a UUID, the CloudEvents `id`), the same on every retry;
//! - `webhook-timestamp`: the attempt's time, integer seconds since the Unix epoch (a receiver
//!   refuses one too far from its clock, which bounds replays);
//! - `webhook-signature`: `v1,` and the standard base64 of HMAC-SHA256 over
//!   `"{webhook-id}.{webhook-timestamp}.{body}"`, keyed with the secret's bytes.
//!
//! The secret ([`WebhookSecret`], `serve --webhook-secret-file`) is, by the specification's
//! convention, `whsec_` and the standard base64 of 24 to 64 random bytes; without the prefix,
//! the base64 alone is taken the same way. Make one with
//! `echo "whsec_$(head -c 32 /dev/urandom | base64)"`. The bytes are zeroized when dropped, and
//! neither `Debug` nor any error shows them.

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use zeroize::Zeroizing;

/// The prefix of a secret by the specification's convention.
pub const SECRET_PREFIX: &str = "whsec_";
/// Fewest bytes a secret holds (the specification's lower bound).
pub const MIN_SECRET_BYTES: usize = 24;
/// Most bytes a secret holds (the specification's upper bound).
pub const MAX_SECRET_BYTES: usize = 64;
/// The signature's version tag.
const VERSION: &str = "v1";

/// The headers of a signed delivery.
pub const ID_HEADER: &str = "webhook-id";
pub const TIMESTAMP_HEADER: &str = "webhook-timestamp";
pub const SIGNATURE_HEADER: &str = "webhook-signature";

/// A webhook signing secret: shared, cheap to clone, compared by content.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookSecret(Arc<Zeroizing<Vec<u8>>>);

impl std::fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WebhookSecret(..)")
    }
}

impl WebhookSecret {
    /// A secret file's content: one line, `whsec_` (optional) and base64 of 24 to 64 bytes.
    /// The error says what is wrong, never what the file holds.
    pub fn parse(content: &[u8]) -> Result<WebhookSecret, String> {
        let text = std::str::from_utf8(content).map_err(|_| "not UTF-8 text".to_string())?;
        let text = text.trim();
        if text.is_empty() {
            return Err("blank".into());
        }
        let encoded = text.strip_prefix(SECRET_PREFIX).unwrap_or(text);
        let bytes = Zeroizing::new(STANDARD.decode(encoded).map_err(|_| {
            format!(
                "not a webhook secret: {SECRET_PREFIX} and standard base64 expected, e.g. \
                 the output of: echo \"whsec_$(head -c 32 /dev/urandom | base64)\""
            )
        })?);
        if !(MIN_SECRET_BYTES..=MAX_SECRET_BYTES).contains(&bytes.len()) {
            return Err(format!(
                "the secret decodes to {} bytes; it must hold {MIN_SECRET_BYTES} to \
                 {MAX_SECRET_BYTES}",
                bytes.len()
            ));
        }
        Ok(WebhookSecret(Arc::new(bytes)))
    }

    /// The `webhook-signature` value of the delivery `id` at `timestamp` (Unix seconds) with
    /// `body`: `v1,<base64 HMAC-SHA256 of "id.timestamp.body">`.
    pub fn sign(&self, id: &str, timestamp: u64, body: &[u8]) -> String {
        let mut mac =
            <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("{VERSION},{}", STANDARD.encode(mac.finalize().into_bytes()))
    }

    /// The three headers of a signed delivery of `body` as the event `id`, at `timestamp`.
    pub fn headers(&self, id: &str, timestamp: u64, body: &[u8]) -> Vec<(&'static str, String)> {
        vec![
            (ID_HEADER, id.to_string()),
            (TIMESTAMP_HEADER, timestamp.to_string()),
            (SIGNATURE_HEADER, self.sign(id, timestamp, body)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the specification's reference libraries (standard-webhooks, the
    /// JavaScript and Python test suites): this secret, id, timestamp and payload sign to this.
    #[test]
    fn the_specifications_example_signs_as_its_libraries_do() {
        let secret = WebhookSecret::parse(b"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n").unwrap();
        let sig = secret.sign(
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn bad_secrets_are_refused_without_showing_them() {
        for (bad, says) in [
            (&b""[..], "blank"),
            (b"  \n", "blank"),
            (b"whsec_not base64!", "not a webhook secret"),
            (b"whsec_c2hvcnQ=", "decodes to 5 bytes"),
            (&[0xff, 0xfe], "not UTF-8"),
        ] {
            let e = WebhookSecret::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
            assert!(!e.contains("c2hvcnQ"), "{e}");
        }
        let s = WebhookSecret::parse(b"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(format!("{s:?}"), "WebhookSecret(..)");
    }
}
