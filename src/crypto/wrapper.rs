//! A wrapped data key: one generation's [`DataKey`] encrypted to one key-encryption key, and
//! the small JSON object that holds it.
//!
//! ```json
//! {"format":1,"kind":"key-file","kek_id":"…","lineage":"…","generation":3,
//!  "data_key_id":"…","wrapped":"<hex>"}
//! ```
//!
//! - `kind` `key-file`: `wrapped` is a random 24-byte nonce and the XChaCha20-Poly1305
//!   ciphertext and tag of the 32-byte key. Its associated data is a label, the KEK id, the
//!   lineage (16 bytes) and the generation (u64 LE), so a wrapper copied to another generation,
//!   lineage or id fails to authenticate.
//! - `kind` `age-x25519`: `wrapped` is an age file (binary, X25519 recipient stanza) whose
//!   plaintext is the same label, lineage and generation followed by the key. age has no
//!   associated data, so the binding is inside the authenticated plaintext and is compared
//!   after opening. Anyone holding the recipient can make a wrapper (that is public-key
//!   mode's point: the service writes what it cannot read), so the binding proves which
//!   generation a wrapper was made for, not who made it.
//!
//! The clear fields (lineage, generation, ids) are for messages and listings; every one that
//! matters is checked against what the wrapped bytes authenticate, and `data_key_id` against
//! the key that comes out. Nothing here reveals the key.

use std::fmt;
use std::sync::Arc;

use chacha20poly1305::aead::rand_core::RngCore;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{Key, XChaCha20Poly1305, XNonce};
use serde::{Deserialize, Serialize};
use uuid::Uuid;
use zeroize::Zeroizing;

use super::keys::{AgeIdentity, AgeRecipient, DataKey, KekId, KeyFileKey};

/// The wrapper format this code writes and reads.
pub const FORMAT: u32 = 1;
const LABEL: &[u8] = b"mushroom-backup wrapped data key v1\0";
/// A wrapper larger than this is refused before parsing.
pub const MAX_WRAPPER: usize = 16 * 1024;

/// What a wrapper is bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binding {
    pub lineage: Uuid,
    pub generation: u64,
}

impl Binding {
    fn bytes(&self) -> Vec<u8> {
        let mut v = LABEL.to_vec();
        v.extend_from_slice(self.lineage.as_bytes());
        v.extend_from_slice(&self.generation.to_le_bytes());
        v
    }
}

/// The kind of key-encryption key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum KekKind {
    #[serde(rename = "key-file")]
    KeyFile,
    #[serde(rename = "age-x25519")]
    AgeX25519,
}

impl fmt::Display for KekKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KekKind::KeyFile => "key file",
            KekKind::AgeX25519 => "age recipient",
        })
    }
}

/// A key that can wrap: a key file's key, or an age recipient.
#[derive(Debug, Clone)]
pub enum WrapKek {
    KeyFile(Arc<KeyFileKey>),
    Recipient(AgeRecipient),
}

/// A key that can unwrap: a key file's key, or an age identity.
#[derive(Debug, Clone)]
pub enum UnwrapKek {
    KeyFile(Arc<KeyFileKey>),
    Identity(AgeIdentity),
}

impl WrapKek {
    pub fn id(&self) -> &KekId {
        match self {
            WrapKek::KeyFile(k) => k.id(),
            WrapKek::Recipient(r) => r.id(),
        }
    }

    pub fn kind(&self) -> KekKind {
        match self {
            WrapKek::KeyFile(_) => KekKind::KeyFile,
            WrapKek::Recipient(_) => KekKind::AgeX25519,
        }
    }

    /// Wraps `key` for the generation `binding` names.
    pub fn wrap(&self, key: &DataKey, binding: Binding) -> Result<WrappedKey, WrapError> {
        let wrapped = match self {
            WrapKek::KeyFile(k) => {
                let mut nonce = [0u8; 24];
                chacha20poly1305::aead::OsRng.fill_bytes(&mut nonce);
                let aad = key_file_aad(k.id(), binding);
                let ct = XChaCha20Poly1305::new(Key::from_slice(k.bytes()))
                    .encrypt(
                        XNonce::from_slice(&nonce),
                        Payload {
                            msg: key.bytes(),
                            aad: &aad,
                        },
                    )
                    .map_err(|_| WrapError::Seal)?;
                let mut out = nonce.to_vec();
                out.extend_from_slice(&ct);
                out
            }
            WrapKek::Recipient(r) => {
                let mut plain = Zeroizing::new(binding.bytes());
                plain.extend_from_slice(key.bytes());
                age::encrypt(r.recipient(), &plain).map_err(|_| WrapError::Seal)?
            }
        };
        Ok(WrappedKey {
            format: FORMAT,
            kind: self.kind(),
            kek_id: self.id().clone(),
            lineage: binding.lineage,
            generation: binding.generation,
            data_key_id: key.id(),
            wrapped: hex::encode(wrapped),
        })
    }
}

impl UnwrapKek {
    pub fn id(&self) -> &KekId {
        match self {
            UnwrapKek::KeyFile(k) => k.id(),
            UnwrapKek::Identity(i) => i.id(),
        }
    }

    pub fn kind(&self) -> KekKind {
        match self {
            UnwrapKek::KeyFile(_) => KekKind::KeyFile,
            UnwrapKek::Identity(_) => KekKind::AgeX25519,
        }
    }

    /// The same key as a [`WrapKek`] (an identity wraps to its own recipient).
    pub fn to_wrap(&self) -> WrapKek {
        match self {
            UnwrapKek::KeyFile(k) => WrapKek::KeyFile(k.clone()),
            UnwrapKek::Identity(i) => WrapKek::Recipient(i.recipient().clone()),
        }
    }
}

fn key_file_aad(id: &KekId, binding: Binding) -> Vec<u8> {
    let mut aad = binding.bytes();
    aad.extend_from_slice(id.as_str().as_bytes());
    aad
}

/// Why a data key could not be wrapped or unwrapped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WrapError {
    #[error("cannot wrap the data key")]
    Seal,
    #[error("wrapper {key}: not a wrapped data key: {detail}")]
    Parse { key: String, detail: String },
    #[error("wrapper {key}: format {format}, this build reads only {FORMAT}")]
    UnknownFormat { key: String, format: u32 },
    #[error("wrapper {key}: for key id {found}, not {wanted}")]
    OtherKek {
        key: String,
        found: KekId,
        wanted: KekId,
    },
    #[error("wrapper {key}: a {found} wrapper, and the key given (id {id}) is a {given}")]
    OtherKind {
        key: String,
        id: KekId,
        found: KekKind,
        given: KekKind,
    },
    #[error("wrapper {key} does not authenticate: wrong key or damaged")]
    NotAuthentic { key: String },
    #[error(
        "wrapper {key} is bound to lineage {found_lineage} generation {found_generation}, not lineage {lineage} generation {generation}: it was copied from elsewhere"
    )]
    OtherBinding {
        key: String,
        found_lineage: Uuid,
        found_generation: u64,
        lineage: Uuid,
        generation: u64,
    },
    #[error("wrapper {key}: the key inside has id {found}, the wrapper says {stated}")]
    OtherDataKey {
        key: String,
        found: String,
        stated: String,
    },
}

/// A wrapped data key, as stored; see the module docs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WrappedKey {
    pub format: u32,
    pub kind: KekKind,
    pub kek_id: KekId,
    pub lineage: Uuid,
    pub generation: u64,
    pub data_key_id: String,
    pub wrapped: String,
}

impl WrappedKey {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self).expect("a wrapper serializes");
        v.push(b'\n');
        v
    }

    /// Parses the wrapper stored under `key`.
    pub fn decode(key: &str, bytes: &[u8]) -> Result<WrappedKey, WrapError> {
        let parse = |detail: String| WrapError::Parse {
            key: key.to_string(),
            detail,
        };
        if bytes.len() > MAX_WRAPPER {
            return Err(parse(format!(
                "{} bytes, more than any wrapper",
                bytes.len()
            )));
        }
        let v: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| parse(e.to_string()))?;
        let format = v.get("format").and_then(serde_json::Value::as_u64);
        if format != Some(u64::from(FORMAT)) {
            return Err(match format.and_then(|f| u32::try_from(f).ok()) {
                Some(format) => WrapError::UnknownFormat {
                    key: key.to_string(),
                    format,
                },
                None => parse("no format".to_string()),
            });
        }
        let w: WrappedKey = serde_json::from_value(v).map_err(|e| parse(e.to_string()))?;
        if KekId::parse(w.kek_id.as_str()).is_none() {
            return Err(parse("kek_id is not 16 hex digits".to_string()));
        }
        Ok(w)
    }

    /// Opens the wrapper stored under `key` with `kek`, checking it is bound to `binding`.
    pub fn unwrap(
        &self,
        key: &str,
        kek: &UnwrapKek,
        binding: Binding,
    ) -> Result<DataKey, WrapError> {
        if &self.kek_id != kek.id() {
            return Err(WrapError::OtherKek {
                key: key.to_string(),
                found: self.kek_id.clone(),
                wanted: kek.id().clone(),
            });
        }
        if self.kind != kek.kind() {
            return Err(WrapError::OtherKind {
                key: key.to_string(),
                id: kek.id().clone(),
                found: self.kind,
                given: kek.kind(),
            });
        }
        let not_authentic = || WrapError::NotAuthentic {
            key: key.to_string(),
        };
        let wrapped = hex::decode(&self.wrapped).map_err(|_| WrapError::Parse {
            key: key.to_string(),
            detail: "wrapped is not hex".to_string(),
        })?;
        let data_key = match kek {
            UnwrapKek::KeyFile(k) => {
                if wrapped.len() != 24 + 32 + 16 {
                    return Err(not_authentic());
                }
                let (nonce, ct) = wrapped.split_at(24);
                let aad = key_file_aad(k.id(), binding);
                let plain = Zeroizing::new(
                    XChaCha20Poly1305::new(Key::from_slice(k.bytes()))
                        .decrypt(XNonce::from_slice(nonce), Payload { msg: ct, aad: &aad })
                        .map_err(|_| not_authentic())?,
                );
                let mut bytes = Zeroizing::new([0u8; 32]);
                bytes.copy_from_slice(&plain);
                DataKey::from_bytes(*bytes)
            }
            UnwrapKek::Identity(i) => {
                let plain = Zeroizing::new(
                    age::decrypt(i.identity(), &wrapped).map_err(|_| not_authentic())?,
                );
                let label_len = LABEL.len();
                if plain.len() != label_len + 16 + 8 + 32 || &plain[..label_len] != LABEL {
                    return Err(not_authentic());
                }
                let lineage = Uuid::from_slice(&plain[label_len..label_len + 16])
                    .map_err(|_| not_authentic())?;
                let mut g = [0u8; 8];
                g.copy_from_slice(&plain[label_len + 16..label_len + 24]);
                let generation = u64::from_le_bytes(g);
                if lineage != binding.lineage || generation != binding.generation {
                    return Err(WrapError::OtherBinding {
                        key: key.to_string(),
                        found_lineage: lineage,
                        found_generation: generation,
                        lineage: binding.lineage,
                        generation: binding.generation,
                    });
                }
                let mut bytes = Zeroizing::new([0u8; 32]);
                bytes.copy_from_slice(&plain[label_len + 24..]);
                DataKey::from_bytes(*bytes)
            }
        };
        if data_key.id() != self.data_key_id {
            return Err(WrapError::OtherDataKey {
                key: key.to_string(),
                found: data_key.id(),
                stated: self.data_key_id.clone(),
            });
        }
        Ok(data_key)
    }
}
