//! The encryption settings of a command, loaded and checked before it touches a bucket.
//!
//! [`EncryptionSettings`] is what the flags say (`--encryption-key-file`,
//! `--encryption-recipient` (repeatable), `--encryption-identity-file`; `rekey`'s new keys
//! use the same with a `new-` prefix). [`EncryptionSettings::load`] reads every file and
//! parses every recipient, and fails on the first problem with an error naming the flag, the
//! file and what is wrong: a configured key that cannot be had never turns into "no
//! encryption". Nothing configured loads as `None`.
//!
//! What each setting gives: a key file wraps and unwraps; a recipient only wraps (a service
//! configured with recipients alone can write backups it cannot read); an identity file only
//! unwraps (each identity in it). Any combination is accepted: a generation is wrapped for
//! every wrapping key given, and opened by any unwrapping key it is wrapped for.

use std::path::PathBuf;
use std::sync::Arc;

use super::keys::{AgeIdentity, AgeRecipient, KekId, KeyError, KeyFileKey};
use super::wrapper::{UnwrapKek, WrapKek};

/// What the flags say; see the module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EncryptionSettings {
    pub key_file: Option<PathBuf>,
    pub recipients: Vec<String>,
    pub identity_file: Option<PathBuf>,
}

/// The keys a command was given, loaded.
#[derive(Debug, Clone)]
pub struct Encryption {
    /// The keys a writer wraps each generation's data key for.
    pub wrap: Vec<WrapKek>,
    /// The keys a reader may open a generation's data key with.
    pub unwrap: Vec<UnwrapKek>,
    /// Things the operator should fix that do not stop the command (a key file others may
    /// read); also logged at `warn`.
    pub warnings: Vec<String>,
}

impl Encryption {
    /// The ids of the wrapping keys.
    pub fn wrap_ids(&self) -> Vec<KekId> {
        self.wrap.iter().map(|k| k.id().clone()).collect()
    }

    /// The ids of the unwrapping keys.
    pub fn unwrap_ids(&self) -> Vec<KekId> {
        self.unwrap.iter().map(|k| k.id().clone()).collect()
    }
}

/// What a writer (backup, serve) encrypts with: the keys (`None`: plaintext), and whether it
/// may write into a prefix holding generations of the other kind (`--allow-mixed-encryption`).
#[derive(Debug, Clone, Default)]
pub struct WriterEncryption {
    pub keys: Option<Encryption>,
    pub allow_mixed: bool,
}

/// A setting that cannot be loaded: the flag it came from, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--{flag}: {problem}")]
pub struct ConfigError {
    pub flag: String,
    pub problem: KeyError,
}

impl EncryptionSettings {
    pub fn is_empty(&self) -> bool {
        self.key_file.is_none() && self.recipients.is_empty() && self.identity_file.is_none()
    }

    /// Loads the keys; flags in errors are named `--encryption-…`.
    pub fn load(&self) -> Result<Option<Encryption>, ConfigError> {
        self.load_as("")
    }

    /// Loads the keys; flags in errors are named `--{prefix}encryption-…` (`rekey`'s new
    /// keys: prefix `new-`).
    pub fn load_as(&self, prefix: &str) -> Result<Option<Encryption>, ConfigError> {
        if self.is_empty() {
            return Ok(None);
        }
        let err = |flag: &str, problem: KeyError| ConfigError {
            flag: format!("{prefix}encryption-{flag}"),
            problem,
        };
        let mut out = Encryption {
            wrap: Vec::new(),
            unwrap: Vec::new(),
            warnings: Vec::new(),
        };
        if let Some(path) = &self.key_file {
            let (key, warnings) = KeyFileKey::load(path).map_err(|e| err("key-file", e))?;
            let key = Arc::new(key);
            out.wrap.push(WrapKek::KeyFile(key.clone()));
            out.unwrap.push(UnwrapKek::KeyFile(key));
            out.warnings.extend(warnings);
        }
        for r in &self.recipients {
            let r = AgeRecipient::parse(r).map_err(|e| err("recipient", e))?;
            if !out.wrap.iter().any(|k| k.id() == r.id()) {
                out.wrap.push(WrapKek::Recipient(r));
            }
        }
        if let Some(path) = &self.identity_file {
            let (ids, warnings) = AgeIdentity::load(path).map_err(|e| err("identity-file", e))?;
            for i in ids {
                if !out.unwrap.iter().any(|k| k.id() == i.id()) {
                    out.unwrap.push(UnwrapKek::Identity(i));
                }
            }
            out.warnings.extend(warnings);
        }
        for w in &out.warnings {
            tracing::warn!("{w}");
        }
        Ok(Some(out))
    }
}
