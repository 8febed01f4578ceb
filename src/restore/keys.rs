//! The keys a restore (or verify) opens encrypted generations with: [`RestoreKeys`].
//!
//! A restore point may name objects of several generations (reused archives, snapshots and
//! side files keep the generation that uploaded them); each sealed object is opened with its
//! generation's data key, unwrapped from `gen/<g>/keys/<kek-id>.key` by the first key given
//! that it is wrapped for (`crypto::key_objects::open_generation_key`). [`RestoreKeys::open_all`]
//! opens every key a plan needs before anything is staged, so a missing or wrong key is an
//! error naming the generation and the key ids it is wrapped for, and no target (nor
//! temporary directory) is left.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use uuid::Uuid;

use super::RestoreError;
use crate::at_rest::seal::GenerationKey;
use crate::bucket::{Bucket, BucketError};
use crate::crypto::key_objects::{self, KeyObjectError};
use crate::crypto::{KekId, UnwrapKek};
use crate::manifest::{Manifest, ObjectEntry};

/// The unwrapping keys given, and the generation keys opened with them so far.
#[derive(Clone, Default)]
pub struct RestoreKeys {
    unwrap: Vec<UnwrapKek>,
    opened: Arc<Mutex<HashMap<u64, GenerationKey>>>,
    /// Generations found plaintext ([`RestoreKeys::of_generation`]).
    plain: Arc<Mutex<BTreeSet<u64>>>,
}

impl std::fmt::Debug for RestoreKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RestoreKeys({:?})", self.ids())
    }
}

/// Equal when the same key ids are given.
impl PartialEq for RestoreKeys {
    fn eq(&self, other: &Self) -> bool {
        self.ids() == other.ids()
    }
}

impl Eq for RestoreKeys {}

impl RestoreKeys {
    pub fn new(unwrap: Vec<UnwrapKek>) -> RestoreKeys {
        RestoreKeys {
            unwrap,
            opened: Arc::default(),
            plain: Arc::default(),
        }
    }

    /// The ids of the keys given.
    pub fn ids(&self) -> Vec<KekId> {
        self.unwrap.iter().map(|k| k.id().clone()).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.unwrap.is_empty()
    }

    /// A key opened already ([`RestoreKeys::open`]).
    pub fn get(&self, generation: u64) -> Option<GenerationKey> {
        self.lock().get(&generation).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, GenerationKey>> {
        self.opened.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Generation `generation`'s key (of `lineage`, which its wrappers are bound to).
    pub async fn open(
        &self,
        bucket: &dyn Bucket,
        lineage: Uuid,
        generation: u64,
    ) -> Result<GenerationKey, RestoreError> {
        if let Some(k) = self.get(generation) {
            return Ok(k);
        }
        let opened = key_objects::open_generation_key(bucket, lineage, generation, &self.unwrap)
            .await
            .map_err(key_error)?;
        let k = GenerationKey::new(opened.data_key);
        self.lock().insert(generation, k.clone());
        Ok(k)
    }

    /// Whether generation `generation` (of `lineage`) is encrypted, with its key when it is:
    /// `Ok(None)` for a plaintext generation. Called once data objects of the generation are
    /// listed: a writer puts a generation's wrappers before any data object of it
    /// (`worker::keys`), so the generation is encrypted exactly when it has a wrapper then,
    /// and the answer never changes (each is kept: one LIST per generation at most). An
    /// encrypted generation without a key given that opens it is an error, as for the
    /// manifest's own objects.
    ///
    /// A segment no manifest describes is recognised by its bytes alone: in an encrypted
    /// generation it must be sealed (authenticated with the generation's key), or anyone able
    /// to write to the bucket could append commits of their choosing to a restore.
    pub async fn of_generation(
        &self,
        bucket: &dyn Bucket,
        lineage: Uuid,
        generation: u64,
    ) -> Result<Option<GenerationKey>, RestoreError> {
        if let Some(k) = self.get(generation) {
            return Ok(Some(k));
        }
        if self
            .plain
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&generation)
        {
            return Ok(None);
        }
        if key_objects::list_wrappers(bucket, generation)
            .await?
            .is_empty()
        {
            self.plain
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(generation);
            return Ok(None);
        }
        self.open(bucket, lineage, generation).await.map(Some)
    }

    /// Opens the key of every generation the encrypted entries name.
    pub async fn open_all<'e>(
        &self,
        bucket: &dyn Bucket,
        entries: impl IntoIterator<Item = &'e ObjectEntry>,
    ) -> Result<(), RestoreError> {
        for (g, lineage) in key_objects::generations_to_open(entries) {
            self.open(bucket, lineage, g).await?;
        }
        Ok(())
    }
}

fn key_error(e: KeyObjectError) -> RestoreError {
    match e {
        KeyObjectError::Bucket(BucketError::NotFound { key }) => RestoreError::Key {
            detail: format!("{key} is missing"),
        },
        KeyObjectError::Bucket(b) => RestoreError::Bucket(b),
        other => RestoreError::Key {
            detail: other.to_string(),
        },
    }
}

/// What verify learns of one encrypted generation: the key ids it is wrapped for, and its key
/// when one given opens it (or why not; `Ok(None)` when no key was given).
#[derive(Debug, Clone)]
pub struct GenerationKeys {
    pub wrapped_for: Vec<KekId>,
    pub key: Result<Option<GenerationKey>, String>,
}

impl GenerationKeys {
    /// The key, when one given opened it.
    pub fn opened(&self) -> Option<GenerationKey> {
        self.key.clone().ok().flatten()
    }
}

impl RestoreKeys {
    /// [`GenerationKeys`] of every generation the encrypted entries name. Only a bucket that
    /// cannot be read is an error; a key that does not open is reported in the result.
    pub async fn survey<'e>(
        &self,
        bucket: &dyn Bucket,
        entries: impl IntoIterator<Item = &'e ObjectEntry>,
    ) -> Result<HashMap<u64, GenerationKeys>, BucketError> {
        let mut out = HashMap::new();
        for (g, lineage) in key_objects::generations_to_open(entries) {
            let wrapped_for = key_objects::list_wrappers(bucket, g).await?;
            let key = if self.is_empty() || wrapped_for.is_empty() {
                Ok(None)
            } else {
                match self.open(bucket, lineage, g).await {
                    Ok(k) => Ok(Some(k)),
                    Err(RestoreError::Bucket(b)) => return Err(b),
                    Err(e) => Err(e.to_string()),
                }
            };
            out.insert(g, GenerationKeys { wrapped_for, key });
        }
        Ok(out)
    }
}

/// A restore point's encryption, as verify reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct EncryptionCheck {
    /// The key ids its encrypted generations are wrapped for.
    pub key_ids: Vec<String>,
    /// Every encrypted object was opened with a key given and authenticated.
    pub authenticated: bool,
}

impl std::fmt::Display for EncryptionCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "encrypted (key ids {})", self.key_ids.join(", "))?;
        if self.authenticated {
            write!(f, ", authenticated")?;
        }
        Ok(())
    }
}

/// Whether `m` names encrypted objects, the key ids their generations are wrapped for, and
/// whether a key given opened every one; a generation without a wrapper, or that a key given
/// does not open, is a problem.
pub fn encryption_of(
    m: &Manifest,
    keys: &HashMap<u64, GenerationKeys>,
    problems: &mut Vec<String>,
) -> Option<EncryptionCheck> {
    let generations: BTreeSet<u64> = m
        .objects()
        .filter(|e| e.encrypted)
        .map(|e| e.generation)
        .collect();
    let mut ids = BTreeSet::new();
    let mut authenticated = !generations.is_empty();
    for g in &generations {
        let Some(k) = keys.get(g) else { continue };
        if k.wrapped_for.is_empty() {
            problems.push(format!(
                "generation {g} holds encrypted objects and has no wrapped data key"
            ));
        }
        ids.extend(k.wrapped_for.iter().map(|i| i.to_string()));
        match &k.key {
            Ok(Some(_)) => {}
            Ok(None) => authenticated = false,
            Err(why) => {
                authenticated = false;
                problems.push(why.clone());
            }
        }
    }
    (!generations.is_empty()).then(|| EncryptionCheck {
        key_ids: ids.into_iter().collect(),
        authenticated,
    })
}
