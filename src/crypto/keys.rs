//! The keys: a generation's [`DataKey`], and the two kinds of key-encryption key (KEK) that
//! wrap it: a symmetric [`KeyFileKey`] read from a key file, and age X25519 keys
//! ([`AgeRecipient`] to wrap, [`AgeIdentity`] to unwrap).
//!
//! **Key file** (one line, an optional final newline, nothing else):
//! `mushroom-backup-key-v1:<64 lowercase hex digits>`. Parsing is strict: another prefix, a
//! short or long key, upper-case or non-hex digits, blank lines or trailing spaces are refused
//! with the reason. A key file is at most [`KEY_FILE_MAX`] bytes; the file itself is read as
//! [`super::secret_file`] says (no FIFO, no directory, a warning when group or others may
//! read it).
//!
//! **Age identity file**: age-keygen's format: lines of `AGE-SECRET-KEY-1…`, `#` comments and
//! blank lines; at least one identity; at most [`IDENTITY_FILE_MAX`] bytes. A recipient is an
//! `age1…` string (X25519; no plugins, no SSH keys).
//!
//! **Key ids** ([`KekId`]): 16 hex digits, the first 8 bytes of SHA-256 over a label and the
//! key (a key file's 32 bytes) or the recipient string (an identity's id is its recipient's,
//! so a backup wrapped to `age1…` is opened by that identity under the same id). An id names a
//! key in messages and object keys; knowing it helps no one recover the key: the key file's
//! key is 256 random bits, and a recipient is public anyway. A data key's id
//! ([`DataKey::id`]) is made the same way.
//!
//! Secrets are zeroized when dropped (`zeroize`), and no `Debug` prints one.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use age::secrecy::ExposeSecret;
use chacha20poly1305::aead::rand_core::RngCore;
use sha2::{Digest, Sha256};
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

use super::secret_file::{self, SecretFileError};

/// The key file's prefix, with its format version.
pub const KEY_FILE_PREFIX: &str = "mushroom-backup-key-v1:";
/// The largest key file read.
pub const KEY_FILE_MAX: u64 = 4096;
/// The largest age identity file read.
pub const IDENTITY_FILE_MAX: u64 = 64 * 1024;

/// Why a key could not be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error(transparent)]
    File(#[from] SecretFileError),
    #[error("{source_name}: not a key file: {detail}")]
    KeyFile { source_name: String, detail: String },
    #[error("{recipient:?}: not an age X25519 recipient (age1…): {detail}")]
    Recipient { recipient: String, detail: String },
    #[error("{source_name}: line {line}: not an age identity (AGE-SECRET-KEY-1…): {detail}")]
    Identity {
        source_name: String,
        line: usize,
        detail: String,
    },
    #[error("{source_name}: no age identity (AGE-SECRET-KEY-1…) in it")]
    NoIdentity { source_name: String },
}

/// A key-encryption key's id; see the module docs.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct KekId(String);

impl KekId {
    fn derive(label: &str, material: &[u8]) -> KekId {
        KekId(hex::encode(short_hash(label, material)))
    }

    /// An id read back from an object key or a wrapper: exactly 16 lowercase hex digits.
    pub fn parse(s: &str) -> Option<KekId> {
        (s.len() == 16 && s.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')))
            .then(|| KekId(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for KekId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Ids as `a, b` for messages.
pub fn list_ids<'a>(ids: impl IntoIterator<Item = &'a KekId>) -> String {
    let v: Vec<&str> = ids.into_iter().map(KekId::as_str).collect();
    if v.is_empty() {
        "none".to_string()
    } else {
        v.join(", ")
    }
}

fn short_hash(label: &str, material: &[u8]) -> [u8; 8] {
    let mut h = Sha256::new();
    h.update(b"mushroom-backup ");
    h.update(label.as_bytes());
    h.update([0u8]);
    h.update(material);
    let d = h.finalize();
    let mut out = [0u8; 8];
    out.copy_from_slice(&d[..8]);
    out
}

fn random_32() -> [u8; 32] {
    let mut b = [0u8; 32];
    chacha20poly1305::aead::OsRng.fill_bytes(&mut b);
    b
}

/// A generation's data key: 32 random bytes that seal every object of the generation.
#[derive(Clone, Zeroize, ZeroizeOnDrop, PartialEq, Eq)]
pub struct DataKey([u8; 32]);

impl DataKey {
    /// A fresh random key.
    pub fn generate() -> DataKey {
        DataKey(random_32())
    }

    pub fn from_bytes(bytes: [u8; 32]) -> DataKey {
        DataKey(bytes)
    }

    pub fn bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The id in a sealed object's header and a wrapper ([`DataKey::id`] as bytes).
    pub fn id_bytes(&self) -> [u8; 8] {
        short_hash("data key id v1", &self.0)
    }

    /// 16 hex digits naming this key without revealing it.
    pub fn id(&self) -> String {
        hex::encode(self.id_bytes())
    }
}

impl fmt::Debug for DataKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DataKey(id {})", self.id())
    }
}

/// A symmetric key-encryption key, from a key file.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct KeyFileKey {
    bytes: [u8; 32],
    #[zeroize(skip)]
    id: KekId,
}

impl KeyFileKey {
    /// A fresh random key (what `mushroom-backup key new` prints).
    pub fn generate() -> KeyFileKey {
        KeyFileKey::from_bytes(random_32())
    }

    fn from_bytes(bytes: [u8; 32]) -> KeyFileKey {
        let id = KekId::derive("key file kek id v1", &bytes);
        KeyFileKey { bytes, id }
    }

    /// Reads and parses a key file.
    pub fn load(path: &Path) -> Result<(KeyFileKey, Vec<String>), KeyError> {
        let file = secret_file::read(path, KEY_FILE_MAX)?;
        let key = KeyFileKey::parse(&file.bytes, &path.display().to_string())?;
        Ok((key, file.warnings))
    }

    /// Parses a key file's content; `source_name` names it in errors.
    pub fn parse(content: &[u8], source_name: &str) -> Result<KeyFileKey, KeyError> {
        let bad = |detail: &str| KeyError::KeyFile {
            source_name: source_name.to_string(),
            detail: detail.to_string(),
        };
        let text = std::str::from_utf8(content).map_err(|_| bad("not UTF-8 text"))?;
        let line = text.strip_suffix('\n').unwrap_or(text);
        if line.trim().is_empty() {
            return Err(bad("blank"));
        }
        if line.contains('\n') {
            return Err(bad("more than one line"));
        }
        let Some(digits) = line.strip_prefix(KEY_FILE_PREFIX) else {
            return Err(bad(&format!("does not start with {KEY_FILE_PREFIX}")));
        };
        if digits.len() != 64 {
            return Err(bad(&format!(
                "the key is {} characters after the prefix; it must be 64 hex digits",
                digits.len()
            )));
        }
        if !digits
            .bytes()
            .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
        {
            return Err(bad("the key must be 64 lowercase hex digits"));
        }
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(digits, &mut bytes).map_err(|_| bad("bad hex"))?;
        Ok(KeyFileKey::from_bytes(bytes))
    }

    /// The key file's content: one line, with its newline.
    pub fn file_content(&self) -> Zeroizing<String> {
        Zeroizing::new(format!("{KEY_FILE_PREFIX}{}\n", hex::encode(self.bytes)))
    }

    pub fn id(&self) -> &KekId {
        &self.id
    }

    pub(super) fn bytes(&self) -> &[u8; 32] {
        &self.bytes
    }
}

impl fmt::Debug for KeyFileKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyFileKey(id {})", self.id)
    }
}

/// An age X25519 recipient: wraps data keys that only its identity opens.
#[derive(Clone)]
pub struct AgeRecipient {
    recipient: age::x25519::Recipient,
    text: String,
    id: KekId,
}

fn recipient_id(text: &str) -> KekId {
    KekId::derive("age x25519 kek id v1", text.as_bytes())
}

impl AgeRecipient {
    pub fn parse(text: &str) -> Result<AgeRecipient, KeyError> {
        let bad = |detail: &str| KeyError::Recipient {
            recipient: text.chars().take(100).collect(),
            detail: detail.to_string(),
        };
        if text.is_empty() {
            return Err(bad("empty"));
        }
        if text.trim() != text {
            return Err(bad("leading or trailing whitespace"));
        }
        if !text.starts_with("age1") {
            return Err(bad(
                "does not start with age1 (plugin and SSH recipients are not supported)",
            ));
        }
        let recipient = age::x25519::Recipient::from_str(text).map_err(bad)?;
        // The canonical form, so one key has one id.
        let text = recipient.to_string();
        Ok(AgeRecipient {
            id: recipient_id(&text),
            recipient,
            text,
        })
    }

    pub fn id(&self) -> &KekId {
        &self.id
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub(super) fn recipient(&self) -> &age::x25519::Recipient {
        &self.recipient
    }
}

impl fmt::Debug for AgeRecipient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AgeRecipient({} id {})", self.text, self.id)
    }
}

/// An age X25519 identity: opens what was wrapped to its recipient. (The age crate keeps the
/// secret in a type that zeroizes itself.)
#[derive(Clone)]
pub struct AgeIdentity {
    identity: age::x25519::Identity,
    recipient: AgeRecipient,
}

impl AgeIdentity {
    /// A fresh identity (what `mushroom-backup key new --age` prints).
    pub fn generate() -> AgeIdentity {
        AgeIdentity::from_identity(age::x25519::Identity::generate())
    }

    fn from_identity(identity: age::x25519::Identity) -> AgeIdentity {
        let r = identity.to_public();
        let text = r.to_string();
        AgeIdentity {
            recipient: AgeRecipient {
                id: recipient_id(&text),
                recipient: r,
                text,
            },
            identity,
        }
    }

    /// Reads every identity of an age identity file.
    pub fn load(path: &Path) -> Result<(Vec<AgeIdentity>, Vec<String>), KeyError> {
        let file = secret_file::read(path, IDENTITY_FILE_MAX)?;
        let ids = AgeIdentity::parse_file(&file.bytes, &path.display().to_string())?;
        Ok((ids, file.warnings))
    }

    /// Parses an identity file's content; `source_name` names it in errors.
    pub fn parse_file(content: &[u8], source_name: &str) -> Result<Vec<AgeIdentity>, KeyError> {
        let bad = |line: usize, detail: &str| KeyError::Identity {
            source_name: source_name.to_string(),
            line,
            detail: detail.to_string(),
        };
        let text = std::str::from_utf8(content).map_err(|_| bad(1, "not UTF-8 text"))?;
        let mut out = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() || line.starts_with('#') {
                continue;
            }
            if !line.starts_with("AGE-SECRET-KEY-1") {
                return Err(bad(n + 1, "does not start with AGE-SECRET-KEY-1"));
            }
            let identity = age::x25519::Identity::from_str(line).map_err(|e| bad(n + 1, e))?;
            out.push(AgeIdentity::from_identity(identity));
        }
        if out.is_empty() {
            return Err(KeyError::NoIdentity {
                source_name: source_name.to_string(),
            });
        }
        Ok(out)
    }

    /// The identity file's content, as age-keygen writes it (its recipient in a comment).
    pub fn file_content(&self) -> Zeroizing<String> {
        Zeroizing::new(format!(
            "# created: {}\n# public key: {}\n{}\n",
            crate::manifest::now_rfc3339(),
            self.recipient.text,
            self.identity.to_string().expose_secret()
        ))
    }

    /// Its recipient (same id).
    pub fn recipient(&self) -> &AgeRecipient {
        &self.recipient
    }

    pub fn id(&self) -> &KekId {
        &self.recipient.id
    }

    pub(super) fn identity(&self) -> &age::x25519::Identity {
        &self.identity
    }
}

impl fmt::Debug for AgeIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "AgeIdentity(for {} id {})",
            self.recipient.text,
            self.id()
        )
    }
}
